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

VISION_EXCLUDES = (".*visual.*", ".*vision.*", "visual", ".*visual\\..*")
"""``exclude_modules`` patterns that mean "leave the vision tower out" (verl's Qwen2.5-VL LoRA script passes the
first): LoRA targets only the language model's layers here, so they change nothing."""


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
    extra: dict[str, Any] = {}
    exclude = getattr(model_cfg, "exclude_modules", None)
    if exclude and exclude not in VISION_EXCLUDES:  # the vision tower is outside the targets already
        extra["exclude_modules"] = exclude
    cfg = LoraConfig(
        r=int(model_cfg.lora_rank),
        lora_alpha=int(model_cfg.lora_alpha),
        target_modules=lora_target_regex(model_cfg.target_modules),
        lora_dropout=0.0,
        bias="none",
        **extra,
    )
    try:
        return get_peft_model(model, cfg)
    except ValueError as e:  # e.g. an exclude pattern that leaves no target module
        raise ValueError(
            f"LoRA (actor_rollout_ref.model.lora_rank={model_cfg.lora_rank}, "
            f"target_modules={model_cfg.target_modules!r}, exclude_modules={exclude!r}): {e}"
        ) from None


def _full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach()


def _fsdp_groups(model: torch.nn.Module) -> list[tuple[torch.nn.Module | None, list[str]]]:
    """Parameter names grouped by the FSDP2 unit that owns them (the deepest ``fully_shard``-ed module above each),
    in module order. Without FSDP: one group, no unit."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - FSDP2 ships with torch >= 2.6
        FSDPModule = ()  # type: ignore[assignment]  # noqa: N806
    units = {name: m for name, m in model.named_modules() if isinstance(m, FSDPModule)}
    if not units:
        return [(None, [n for n, _ in model.named_parameters()])]
    groups: dict[str, list[str]] = {name: [] for name in units}
    for pname, _ in model.named_parameters():
        owner = max((u for u in units if u == "" or pname.startswith(u + ".")), key=len)
        groups[owner].append(pname)
    return [(units[u], names) for u, names in groups.items() if names]


def merged_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(engine name, full tensor) for every parameter, LoRA merged, one FSDP unit materialised at a time.

    Under FSDP2 each unit (a decoder layer, a vision block, the tower, the root) is all-gathered once with
    ``unshard()`` and freed again with ``reshard()`` after its tensors were consumed: a single collective per unit
    instead of one per tensor, and never more than one unit's full weights in memory. Every rank must run this
    generator to the end, in order.
    """
    lora_modules = {}
    for mname, module in model.named_modules():
        if hasattr(module, "lora_A") and hasattr(module, "base_layer") and len(getattr(module, "lora_A", {})) > 0:
            lora_modules[mname] = module
    for unit, names in _fsdp_groups(model):
        if unit is not None:
            unit.unshard()
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
                yield qwen_vl.engine_weight_name(name), full
        finally:
            if unit is not None:
                unit.reshard()
