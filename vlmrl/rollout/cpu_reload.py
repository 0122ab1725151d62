"""The weight push into a CPU vLLM engine without vLLM's layer-by-layer reload machinery.

vLLM's CPU backend packs every linear layer's weight into a oneDNN (or sgl-kernel) handle once loaded and drops the
weight itself, so ``reload_weights`` cannot copy into place: it restores each layer's checkpoint-format parameters
from meta records, wraps every weight loader to count the elements each copy fills (a ``TorchDispatchMode`` around
every copy), and packs a layer when its count is complete. On a small model that bookkeeping is most of the push.

:func:`direct_reload` does what an engine start does instead, on the running model: the checkpoint-format weight of
each packed linear layer comes back (one tensor per layer, made from vLLM's own record of it), the model's
``load_weights`` fills every parameter (the same name mapping, merging and sharding as at start), and vLLM's
``process_weights_after_loading`` packs the layers again. Same result as ``reload_weights``, bit for bit (tested);
about half its time on the tiny model, 0.86-0.91x at 23-104 M parameters (benchmarks/bench_push.py). The unpacked
weights of the packed layers exist only during the push (one copy of those layers' weights, freed when they are
packed again). A weight that the trainer did not send is an error: the layer would otherwise be packed from
uninitialised memory.

Runs inside vLLM's worker through ``LLM.collective_rpc``; used only where :func:`unsupported_reason` returns None
(CPU, unquantized, no vLLM LoRA, the vLLM internals it relies on present).

Mixture-of-experts layers (Qwen3-VL-MoE): vLLM's CPU MoE kernel prepacks the expert weights into its grouped-gemm
layout once, at load; a reload (vLLM's own too, in 0.32) copies the new weights in and skips that step, leaving
plain weights that the kernel reads as packed ones (wrong outputs, no error). :func:`direct_reload` prepacks them
again (:func:`_repack_cpu_experts`), and after vLLM's own reload the engine runs :func:`repack_cpu_experts`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


def unsupported_reason(llm: Any) -> str | None:
    """Why :func:`direct_reload` cannot serve this engine (None when it can)."""
    try:
        from vllm.model_executor.layers.linear import UnquantizedLinearMethod  # noqa: F401
        from vllm.model_executor.model_loader.reload.layerwise import _get_original_loader, get_layerwise_info  # noqa: F401
        from vllm.model_executor.model_loader.reload.meta import materialize_meta_tensor  # noqa: F401
        from vllm.model_executor.model_loader.reload.sanitize import restore_layer_refs  # noqa: F401
        from vllm.model_executor.model_loader.utils import process_weights_after_loading  # noqa: F401
    except ImportError as e:
        return f"this vLLM lacks what the direct reload uses ({e})"
    config = llm.llm_engine.vllm_config
    if config.model_config.quantization is not None:
        return f"quantized model ({config.model_config.quantization})"
    if config.lora_config is not None:
        return "vLLM LoRA is enabled"
    return None


def _packed_linear_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Unquantized linear layers whose weight the CPU backend packed and dropped (an empty ``weight`` left)."""
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    out = []
    for module in model.modules():
        if not isinstance(getattr(module, "quant_method", None), UnquantizedLinearMethod):
            continue
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.Tensor) and weight.numel() == 0 and hasattr(module, "cpu_linear"):
            out.append(module)
    return out


def _checkpoint_weight(layer: torch.nn.Module) -> torch.nn.Parameter:
    """A fresh checkpoint-format ``weight`` for a packed layer: the class, shape and weight loader vLLM recorded
    when it built the model (uninitialised: the push fills it)."""
    from vllm.model_executor.model_loader.reload.layerwise import _get_original_loader, get_layerwise_info
    from vllm.model_executor.model_loader.reload.meta import materialize_meta_tensor
    from vllm.model_executor.model_loader.reload.sanitize import restore_layer_refs

    record = get_layerwise_info(layer).restore_metadata[0].get("weight")
    if record is None:
        raise RuntimeError(f"{type(layer).__name__}: vLLM kept no record of its weight; cannot reload it directly")
    weight = restore_layer_refs(materialize_meta_tensor(record), layer)
    if hasattr(weight, "weight_loader"):  # a reload may have left its counting wrapper on the record
        weight.weight_loader = _get_original_loader(weight)
    return weight


def direct_reload(worker: Any, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Load ``weights`` (checkpoint names and layout, full tensors) into the running engine of ``worker`` (vLLM's
    worker object, given by ``collective_rpc``) and repack them; returns how many parameters were loaded."""
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    runner = worker.model_runner
    model = runner.get_model()
    for layer in _packed_linear_layers(model):
        layer.weight = _checkpoint_weight(layer)
    expected = {name for name, _ in model.named_parameters()}
    loaded = model.load_weights(weights)
    missing = expected - set(loaded or ())
    if missing:
        raise RuntimeError(
            f"weight push: {len(missing)} engine parameter(s) got no weights from the trainer, e.g. "
            f"{sorted(missing)[:4]}; the engine was not updated consistently"
        )
    process_weights_after_loading(model, runner.model_config, torch.device("cpu"))
    _repack_cpu_experts(model)
    if hasattr(runner, "reset_mm_cache"):
        runner.reset_mm_cache()
    return len(loaded)


def repack_cpu_experts(worker: Any) -> int:
    """After vLLM's ``reload_weights`` on CPU: prepack the MoE experts it left plain (:func:`_repack_cpu_experts`);
    runs inside vLLM's worker through ``LLM.collective_rpc``."""
    return _repack_cpu_experts(worker.model_runner.get_model())


def _repack_cpu_experts(model: torch.nn.Module) -> int:
    """Prepack the expert weights of every MoE layer served by vLLM's CPU grouped-gemm kernel, which a reload left
    plain (vLLM runs the kernel's own ``process_weights_after_loading`` on the first load only); returns how many
    layers. Expert widths that vLLM pads (not a multiple of the kernel's alignment) are refused: the loader's rows
    in a padded weight are not what a fresh load lays out."""
    from vllm import _custom_ops as ops
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

    n = 0
    for name, layer in model.named_modules():
        kernel = getattr(getattr(layer, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if not isinstance(experts, CPUUnquantizedExperts) or getattr(experts, "_use_zentorch", False):
            continue
        width = experts.moe_config.intermediate_size_per_partition
        if experts._padded_intermediate_size(experts.moe_config) != width:
            raise RuntimeError(
                f"{name}: expert width {width} is padded by vLLM's CPU MoE kernel; the weight push cannot refill it "
                f"(use a width that is a multiple of {experts._intermediate_alignment()})"
            )
        with torch.no_grad():
            for attr in ("w13_weight", "w2_weight"):
                weight = getattr(layer, attr)
                weight.copy_(ops.cpu_prepack_moe_weight(weight.contiguous(), experts.isa))
        n += 1
    return n
