"""The schema of actor-critic PPO: the critic (value model, ``critic.*``) and the in-reward KL controller
(``algorithm.kl_ctrl``). Keys and defaults are verl 0.9.1's; ``None`` means "the actor's value" where verl
interpolates the actor's key (``critic.ppo_mini_batch_size: ${actor_rollout_ref.actor.ppo_mini_batch_size}``), read
through ``vlmrl.config.plan.critic_plan``."""

from __future__ import annotations

from dataclasses import dataclass, field

from vlmrl.config.schema_parts import FSDPConfig, OptimConfig


@dataclass
class CriticModelConfig:
    path: str | None = None
    """HF folder or hub id the critic starts from: a Qwen2.5-VL checkpoint (a value head is added) or a critic
    checkpoint with its value head (``score.weight``, as verl's token-classification critic, or TRL's
    ``v_head.summary.weight``). None = actor_rollout_ref.model.path."""
    trust_remote_code: bool = False
    """Passed to transformers' loader (only ever from the launch command)."""
    enable_gradient_checkpointing: bool = True
    """Recompute activations in the backward pass (verl's default)."""
    use_remove_padding: bool = False
    """Padding-free forwards for the critic (``actor_rollout_ref.model.use_remove_padding``'s, verl's key)."""


@dataclass
class CriticConfig:
    enable: bool | None = None
    """Build and train the critic. None (verl's default): when algorithm.adv_estimator=gae, the estimator that
    needs it."""
    strategy: str = "fsdp2"
    """fsdp | fsdp2 (both mean PyTorch FSDP2); megatron is refused."""
    model: CriticModelConfig = field(default_factory=CriticModelConfig)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))
    """The critic's AdamW and schedule (verl's default lr 1e-5)."""
    ppo_mini_batch_size: int | None = None
    """Prompts per critic optimizer step (x rollout.n samples); None = the actor's."""
    ppo_micro_batch_size_per_gpu: int | None = None
    """Samples per critic forward/backward on one worker; None = the actor's."""
    forward_micro_batch_size_per_gpu: int | None = None
    """Samples per value forward (no gradient); None = ppo_micro_batch_size_per_gpu."""
    use_dynamic_bsz: bool | None = None
    """Token-budget micro-batches for the critic; None = the actor's use_dynamic_bsz."""
    ppo_max_token_len_per_gpu: int = 32768
    """Token budget per critic update micro-batch with use_dynamic_bsz."""
    forward_max_token_len_per_gpu: int | None = None
    """Token budget per value forward micro-batch; None = ppo_max_token_len_per_gpu."""
    ppo_epochs: int | None = None
    """Passes of the critic over each batch; None = the actor's."""
    shuffle: bool | None = None
    """Shuffle samples before splitting into critic mini-batches; None = the actor's."""
    cliprange_value: float = 0.5
    """Clip of the value prediction around the rollout-time value in the value loss."""
    loss_agg_mode: str | None = None
    """How the value loss is reduced (token-mean | seq-mean-token-mean | seq-mean-token-sum-norm); None = the
    actor's."""
    grad_clip: float = 1.0
    """Max gradient norm of the critic."""
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    """FSDP2 settings of the critic (verl's ``critic.fsdp``; ``critic.model.fsdp_config.*`` is an alias)."""


@dataclass
class KLCtrlConfig:
    type: str = "fixed"
    """fixed | adaptive (the coefficient follows target_kl over horizon samples)."""
    kl_coef: float = 0.001
    """The in-reward KL coefficient (the adaptive controller's initial value)."""
    horizon: int = 10000
    """Adaptive controller: samples over which a 20 % KL error moves the coefficient by 20 %."""
    target_kl: float = 0.1
    """Adaptive controller: the KL per token it steers to."""
