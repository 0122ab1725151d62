"""The policy loss's settings as the config holds them (``actor_rollout_ref.actor.policy_loss`` and the loss
aggregation modes): plain data, no torch, so the config's schema takes them from here (``vlmrl.config.schema``)."""

from __future__ import annotations

from dataclasses import dataclass

AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
"""verl's loss aggregation modes (``actor.loss_agg_mode``; ``vlmrl.algorithms.losses.agg_loss``)."""


@dataclass
class PolicyLossConfig:
    """``actor_rollout_ref.actor.policy_loss``: which policy loss, and the settings of the ones that have any (verl's
    keys and defaults)."""

    loss_mode: str = "vanilla"
    """vanilla (PPO clip + dual clip; also spelled ppo) | gspo | sapo | gpg | clip_cov | kl_cov | geo_mean | dro |
    cispo | dppo_tv | dppo_kl (``vlmrl.algorithms.losses``), a name a user's file registers, or
    ``path/to/file.py:fn``."""
    clip_cov_ratio: float = 0.0002
    """clip_cov: share of the tokens whose gradient is cut."""
    clip_cov_lb: float = 1.0
    """clip_cov: lower bound of the covariance of the tokens it may cut."""
    clip_cov_ub: float = 5.0
    """clip_cov: upper bound of that covariance."""
    kl_cov_ratio: float = 0.0002
    """kl_cov: share of the tokens that get the KL penalty."""
    ppo_kl_coef: float = 0.1
    """kl_cov: coefficient of that penalty."""
    dro_beta: float | None = None
    """dro: the quadratic log-ratio penalty (required, > 0)."""
