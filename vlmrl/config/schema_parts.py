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
    fsdp_size: int = -1
    """Workers each parameter is sharded over (verl's key): -1 = all of them; a divisor of the workers = hybrid
    sharding (HSDP: shards within groups of this size, the groups replicas of each other, gradients all-reduced
    across them); 1 = every worker holds the whole model and its optimizer state (no gathers: each forward, backward
    and weight push reads its own copy; gradients all-reduced), which makes the CPU weight push several times faster
    for a model that fits each worker's memory (benchmarks/README.md, "Stages against the machine's limits")."""
    dtype: str = "auto"
    """Mixed-precision compute dtype (FSDP2 MixedPrecisionPolicy: parameters gathered in it, gradients reduced in
    fp32, fp32 master weights): auto (bfloat16 on GPU, float32 on CPU) | bfloat16 | float16 | float32."""
    wrap_policy: WrapPolicyConfig = field(default_factory=WrapPolicyConfig)
    """Which layers are FSDP units of their own."""


@dataclass
class RolloutPoolConfig:
    """``rollout``: the rollout pool of a run with ``actor_rollout_ref.hybrid_engine=False`` (verl's one-step
    off-policy keys): its workers hold only rollout engines, beside the training pool (``trainer.nnodes`` x
    ``trainer.n_gpus_per_node`` / ``trainer.cpu_workers``). Unused by the hybrid engine."""

    nnodes: int = 1
    """Machines of the rollout pool (more than 1: a Ray cluster)."""
    n_gpus_per_node: int = 1
    """GPUs per machine of the rollout pool (one rollout worker each)."""
    cpu_workers: int = 1
    """Rollout workers per machine when the run is on CPU."""


@dataclass
class AsyncTrainingConfig:
    """``async_training`` (``async.*`` too): the one-step off-policy trainer of ``actor_rollout_ref.hybrid_engine=
    False``. The batch of step t+1 is generated while step t trains, with the weights of step t-1."""

    fallback_kl: float | None = None
    """When a step's measured KL between the behaviour policy (the engine's log-probs) and the trainer's old
    log-probs exceeds this, the next step does not use the batch generated in the meantime: the weights are synced
    and the same prompts generated again, on-policy (one synchronous round, counted in ``async/fallback``). None:
    never."""
    tis_by_default: bool = True
    """With no ``algorithm.rollout_correction`` set, correct the one step of staleness with token-level truncated
    importance sampling at 2.0 (verl's ``rollout_is=token``, ``rollout_is_threshold=2.0``). False: the PPO ratio
    against the recomputed old log-probs only."""
