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
    total_rollout_steps: int | None = None
    """``async_training.mode=fully_async``: prompts to generate in all (verl's; the run trains ``total_rollout_steps //
    data.train_batch_size`` steps, fewer when ``trainer.total_epochs`` of the data are fewer). None: the epochs'."""
    test_freq: int | None = None
    """``async_training.mode=fully_async``: validate every ``test_freq`` weight syncs (verl's; sets
    ``trainer.test_freq`` to ``test_freq * async_training.trigger_parameter_sync_step`` steps). None:
    ``trainer.test_freq``."""


@dataclass
class AsyncTrainingConfig:
    """``async_training`` (``async.*`` too): the trainers of ``actor_rollout_ref.hybrid_engine=False``. ``mode``
    ``one_step_off_policy`` (verl's ``one_step_off_policy``): the batch of step t+1 is generated while step t trains,
    with the weights of step t-1. ``fully_async`` (verl's ``fully_async_policy``): the rollout pool streams prompt
    groups without batches; a step trains on the first ``require_batches * ppo_mini_batch_size`` groups that finish;
    the weights are synced every ``trigger_parameter_sync_step`` steps (``vlmrl.trainer.fully_async``)."""

    mode: str = "one_step_off_policy"
    """``one_step_off_policy`` | ``fully_async`` (``--config-name fully_async_ppo_trainer`` sets it, as verl's
    ``fully_async_main`` does)."""
    staleness_threshold: float | None = None
    """fully_async: between two syncs the rollout pool starts at most ``(1 + staleness_threshold) *
    trigger_parameter_sync_step * require_batches * ppo_mini_batch_size`` groups, counting the groups still queued or
    generating from older weights (verl's rule; 0: every group trained between two syncs was started after the
    earlier one). Beyond it the pool waits for the next sync: nothing generated is dropped. None: verl's 0.1."""
    trigger_parameter_sync_step: int | None = None
    """fully_async: the trainer's steps between two weight syncs. None: verl's 4."""
    require_batches: int | None = None
    """fully_async: a step trains on this many ``ppo_mini_batch_size`` groups (so ``data.train_batch_size`` is
    ``require_batches * ppo_mini_batch_size``). None: verl's 1."""
    partial_rollout: bool | None = None
    """fully_async: at a sync the generations in flight are interrupted and continued with the new weights (each
    token keeping the log-prob of the weights that produced it); False: the pool stops starting groups and finishes
    the ones in flight first. None: verl's True."""

    fallback_kl: float | None = None
    """When a step's measured KL between the behaviour policy (the engine's log-probs) and the trainer's old
    log-probs exceeds this, the next step does not use the batch generated in the meantime: the weights are synced
    and the same prompts generated again, on-policy (one synchronous round, counted in ``async/fallback``). None:
    never."""
    tis_by_default: bool = True
    """With no ``algorithm.rollout_correction`` set, correct the one step of staleness with token-level truncated
    importance sampling at 2.0 (verl's ``rollout_is=token``, ``rollout_is_threshold=2.0``). False: the PPO ratio
    against the recomputed old log-probs only."""
