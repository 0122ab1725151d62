"""LoRA on the language model (vision tower excluded) via peft.

The engine never sees adapters: ``workers.weights.engine_weights`` pushes the merged weight ``W + scaling * B @ A``
of every LoRA-wrapped linear under the base layer's name, so vLLM runs the merged model with no LoRA support needed.
"""

from __future__ import annotations

from typing import Any

import torch

from vlmrl.models import qwen_vl

_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

VISION_EXCLUDES = (".*visual.*", ".*vision.*", "visual", ".*visual\\..*")
"""``exclude_modules`` patterns that mean "leave the vision tower out" (verl's Qwen2.5-VL LoRA script passes the
first): LoRA targets only the language model's layers here, so they change nothing."""


def lora_target_regex(target_modules: Any, text_model: str = "language_model") -> str:
    """A peft ``target_modules`` regex matching the chosen linears inside the language model only (``text_model``:
    the family's decoder module, ``Family.text_model``)."""
    if target_modules in (None, "all-linear"):
        names = _LINEARS
    elif isinstance(target_modules, str):
        names = tuple(t.strip() for t in target_modules.split(",") if t.strip())
    else:
        names = tuple(target_modules)
    return rf".*{text_model}\.layers\.\d+\..*\.(" + "|".join(names) + r")$"


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
        target_modules=lora_target_regex(
            model_cfg.target_modules, qwen_vl.family_of(qwen_vl.inner_model(model).config).text_model
        ),
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
