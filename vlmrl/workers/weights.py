"""The policy's weights as the rollout engine takes them: full tensors under the engine's names, streamed.

Every step pushes them into the running engine (``HybridWorker.push_weights``); peft adapters are merged, never sent.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.distributed.fsdp import FSDPModule

from vlmrl.models import qwen_vl


def _full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach()


def _fsdp_groups(model: torch.nn.Module) -> list[tuple[torch.nn.Module | None, list[str]]]:
    """Parameter names grouped by the FSDP2 unit that owns them (the deepest ``fully_shard``-ed module above each),
    in module order. Without FSDP: one group, no unit."""
    units = {name: m for name, m in model.named_modules() if isinstance(m, FSDPModule)}
    if not units:
        return [(None, [n for n, _ in model.named_parameters()])]
    groups: dict[str, list[str]] = {name: [] for name in units}
    for pname, _ in model.named_parameters():
        owner = max((u for u in units if u == "" or pname.startswith(u + ".")), key=len)
        groups[owner].append(pname)
    return [(units[u], names) for u, names in groups.items() if names]


def engine_weights(model: torch.nn.Module, keep_gathered: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """(engine name, full tensor) for every parameter, LoRA adapters merged into their base weights, one FSDP unit
    materialised at a time, in the checkpoint's layout (``Family.checkpoint_tensor``).

    Under FSDP2 each unit (a decoder layer, a vision block, the tower, the root) is all-gathered once with
    ``unshard()`` and freed again with ``reshard()`` after its tensors were consumed: a single collective per unit
    instead of one per tensor. The tensors yielded are copies that outlive the unit's ``reshard()``: vLLM's reload
    keeps some until the end of the push (a vocabulary it pads, e.g. 861 rows padded to 896, is loaded when the
    reload finishes) and read freed memory otherwise. Every rank must run this generator to the end, in order.

    ``keep_gathered``: the units stay gathered afterwards. They hold exactly the weights the next forward needs (no
    optimizer step comes between a push and the next update, and every backward reshards), so that forward gathers
    nothing: one collective per unit per step saved, for a full copy of the weights held through the rollout. All
    units' gathers are then started at once, and the tensors yielded are the gathered weights themselves (valid
    until the next backward), not copies.
    """
    lora_modules = {}
    for mname, module in model.named_modules():
        if hasattr(module, "lora_A") and hasattr(module, "base_layer") and len(getattr(module, "lora_A", {})) > 0:
            lora_modules[mname] = module
    family = qwen_vl.family_of(qwen_vl.inner_model(model).config)
    groups = _fsdp_groups(model)
    # kept gathered anyway: every unit's gather starts at once (their latencies overlap), each waited for in turn
    pending = {id(u): u.unshard(async_op=True) for u, _ in groups if u is not None} if keep_gathered else {}
    for unit, names in groups:
        if unit is not None:
            handle = pending.pop(id(unit), None) if keep_gathered else unit.unshard()
            if handle is not None:
                handle.wait()
        try:
            for name in names:
                if qwen_vl.is_lora_param(name):
                    continue
                full = _full(model.get_parameter(name))
                owner = name.rsplit(".base_layer.", 1)[0] if ".base_layer." in name else None
                if owner is not None and owner in lora_modules and name.endswith("weight"):
                    m = lora_modules[owner]
                    for adapter in m.active_adapters:
                        a = _full(m.lora_A[adapter].weight).to(full.dtype)
                        b = _full(m.lora_B[adapter].weight).to(full.dtype)
                        full = full + m.scaling[adapter] * (b @ a)
                engine_name = qwen_vl.engine_weight_name(name, family)
                yield (
                    engine_name,
                    family.checkpoint_tensor(
                        engine_name, full.clone() if unit is not None and not keep_gathered else full
                    ),  # the layout the engine's loader takes (Qwen3-VL-MoE's fused experts transposed)
                )
        finally:
            if unit is not None and not keep_gathered:
                unit.reshard()
