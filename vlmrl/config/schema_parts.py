"""Schema parts shared by the actor, reference and critic: the optimizer and FSDP2 settings (``vlmrl.config.schema``
re-exports them)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class OptimConfig:
    lr: float = 1e-6
    """AdamW learning rate."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas."""
    lr_warmup_steps: int = -1
    """Linear warm-up steps; -1 = use lr_warmup_steps_ratio."""
    lr_warmup_steps_ratio: float = 0.0
    """Warm-up as a fraction of the total training steps."""
    warmup_style: str = "constant"
    """Schedule after warm-up: constant | cosine."""
    min_lr_ratio: float = 0.0
    """Floor of the cosine schedule as a fraction of lr."""


@dataclass
class WrapPolicyConfig:
    min_num_params: int = 0
    """A decoder layer or vision block is its own FSDP unit (gathered and freed on its own) only when it has at least
    this many parameters; smaller ones are gathered with the vision tower or the whole model (0: every one is a unit,
    verl's default). For tiny models a large value means fewer collectives per step; for large ones it costs memory."""


@dataclass
class FSDPConfig:
    param_offload: bool = False
    """Keep parameters on CPU between uses (FSDP2 CPUOffloadPolicy; GPU only)."""
    optimizer_offload: bool = False
    """Keep optimizer state on CPU (implied by param_offload in FSDP2)."""
    reshard_after_forward: bool = True
    """Free gathered parameters after each forward (ZeRO-3 style)."""
    dtype: str = "auto"
    """Mixed-precision compute dtype (FSDP2 MixedPrecisionPolicy: parameters gathered in it, gradients reduced in
    fp32, fp32 master weights): auto (bfloat16 on GPU, float32 on CPU) | bfloat16 | float16 | float32."""
    wrap_policy: WrapPolicyConfig = field(default_factory=WrapPolicyConfig)
    """Which layers are FSDP units of their own."""
