"""LoRA on the language model (vision tower excluded) via peft, and the full weights the engine receives.

The engine never sees adapters: for every LoRA-wrapped linear the merged weight ``W + scaling * B @ A`` is pushed
under the base layer's name, so vLLM runs the merged model with no LoRA support needed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from vlmrl.models import qwen_vl

_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def lora_target_regex(target_modules: Any) -> str:
    """A peft ``target_modules`` regex matching the chosen linears inside the language model only."""
    if target_modules in (None, "all-linear"):
        names = _LINEARS
    elif isinstance(target_modules, str):
        names = tuple(t.strip() for t in target_modules.split(",") if t.strip())
    else:
        names = tuple(target_modules)
    return r".*language_model\.layers\.\d+\..*\.(" + "|".join(names) + r")$"


def apply_lora(model: torch.nn.Module, model_cfg: Any) -> torch.nn.Module:
    """Wrap ``model`` with LoRA adapters (rank/alpha/targets from ``actor_rollout_ref.model``)."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as e:  # pragma: no cover - peft is in the CPU stack
        raise ImportError("actor_rollout_ref.model.lora_rank > 0 needs peft: pip install peft") from e
    cfg = LoraConfig(
        r=int(model_cfg.lora_rank),
        lora_alpha=int(model_cfg.lora_alpha),
        target_modules=lora_target_regex(model_cfg.target_modules),
        lora_dropout=0.0,
        bias="none",
    )
    return get_peft_model(model, cfg)


def _full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach()


def merged_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(engine name, full tensor) for every parameter, LoRA merged, one tensor materialised at a time.

    Under FSDP2 each ``full_tensor()`` is an all-gather: every rank must run this generator to the end, in order.
    """
    lora_modules = {}
    for mname, module in model.named_modules():
        if hasattr(module, "lora_A") and hasattr(module, "base_layer") and len(getattr(module, "lora_A", {})) > 0:
            lora_modules[mname] = module
    for name, param in model.named_parameters():
        if qwen_vl.is_lora_param(name):
            continue
        full = _full(param)
        owner = name.rsplit(".base_layer.", 1)[0] if ".base_layer." in name else None
        if owner is not None and owner in lora_modules and name.endswith("weight"):
            m = lora_modules[owner]
            for adapter in m.active_adapters:
                a = _full(m.lora_A[adapter].weight).to(full.dtype)
                b = _full(m.lora_B[adapter].weight).to(full.dtype)
                full = full + m.scaling[adapter] * (b @ a)
        yield qwen_vl.engine_weight_name(name), full
