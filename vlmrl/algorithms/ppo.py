"""Token-level PPO math: GAE, the clipped value loss, KL in the reward with verl's controllers, token-level
advantages for every estimator.

Shapes: ``[B, R]`` tensors are aligned with the responses (R = the longest response of the batch, right-padded);
``mask`` is 1 on the tokens the policy generated (0 on padding and on tool-response tokens of multi-turn rollouts).
Each function computes what verl 0.9.1's ``verl.trainer.ppo.core_algos`` function of the same name computes, on the
same tensors (tests/test_ppo.py runs both).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from vlmrl.algorithms.core import aggregate, kl_penalty
from vlmrl.algorithms.estimators import (
    OWN_CONVENTION,
    EstimatorConfig,
    checked,
    estimator_needs,
    extra_inputs,
    get_adv_estimator_fn,
)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over the positions where ``mask`` is 1."""
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp(min=1e-8)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """(x - mean) / sqrt(var + 1e-8) over the masked positions, the variance unbiased (Bessel's correction), as verl
    whitens advantages; ``shift_mean=False`` adds the mean back."""
    n = mask.to(x.dtype).sum()
    if float(n) < 2:
        raise ValueError(f"whitening needs at least 2 response tokens, got {int(n)}")
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask) * n / (n - 1)
    out = (x - mean) * torch.rsqrt(var + 1e-8)
    return out if shift_mean else out + mean


def gae(
    token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation over each response, right to left: advantages (whitened over the batch's
    masked tokens) and returns (advantages + values before whitening: the value targets). Masked-out tokens (tool
    responses, padding) carry the next generated token's value and advantage through unchanged."""
    with torch.no_grad():
        m = mask.to(values.dtype)
        next_value = torch.zeros_like(values[:, 0])
        last = torch.zeros_like(values[:, 0])
        out = torch.zeros_like(values)
        for t in reversed(range(values.shape[1])):
            delta = token_rewards[:, t] + gamma * next_value - values[:, t]
            here = delta + gamma * lam * last
            next_value = values[:, t] * m[:, t] + (1 - m[:, t]) * next_value
            last = here * m[:, t] + (1 - m[:, t]) * last
            out[:, t] = last
        returns = out + values
        return masked_whiten(out, mask), returns


def discounted_returns(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Per token, the discounted sum of the rewards from it to the end of its response (0 on masked tokens, which
    pass the running return through): REINFORCE++'s returns."""
    m = mask.to(token_rewards.dtype)
    out = torch.zeros_like(token_rewards)
    running = torch.zeros_like(token_rewards[:, 0])
    for t in reversed(range(token_rewards.shape[1])):
        new = token_rewards[:, t] + gamma * running
        out[:, t] = new * m[:, t]
        running = new * m[:, t] + running * (1 - m[:, t])
    return out


def value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    old_values: torch.Tensor,
    mask: torch.Tensor,
    cliprange_value: float,
    agg: str = "token-mean",
    **agg_kwargs: float | int | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped value loss: 0.5 * aggregate(max((v - R)^2, (clip(v, v_old +- c) - R)^2)) and the fraction of
    tokens where the clipped term is the larger (``critic/vf_clipfrac``)."""
    clipped = torch.clamp(vpreds, old_values - cliprange_value, old_values + cliprange_value)
    l1 = (vpreds - returns) ** 2
    l2 = (clipped - returns) ** 2
    loss = 0.5 * aggregate(torch.max(l1, l2), mask, agg, **agg_kwargs)
    with torch.no_grad():
        clipfrac = masked_mean(torch.gt(l2, l1).to(vpreds.dtype), mask)
    return loss, clipfrac


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(returns - values) / Var(returns) over the masked tokens (``critic/vf_explained_var``: 1 = the critic
    predicts the returns, <= 0 = no better than their mean)."""
    var_r = masked_mean((returns - masked_mean(returns, mask)) ** 2, mask)
    diff = returns - values
    var_d = masked_mean((diff - masked_mean(diff, mask)) ** 2, mask)
    return float(1.0 - var_d / (var_r + 1e-5))


# ---------------------------------------------------------------------------------------------- KL in the reward


@dataclass
class KLController:
    """The in-reward KL coefficient: fixed, or adaptive (Ziegler et al. 2019, as verl's ``AdaptiveKLController``):
    after each step ``value *= 1 + clip(kl / target - 1, -0.2, 0.2) * n_samples / horizon``. Its state is saved with
    the checkpoint (``state_dict``)."""

    kind: str
    value: float
    target: float = 0.1
    horizon: int = 10000
    history: list[float] = field(default_factory=list)

    def update(self, current_kl: float, n_samples: int) -> None:
        """Adapt the coefficient to this step's measured KL (no-op when fixed)."""
        if self.kind == "adaptive":
            error = float(np.clip(current_kl / self.target - 1, -0.2, 0.2))
            self.value *= 1 + error * n_samples / self.horizon

    def state_dict(self) -> dict[str, float]:
        """What a resumed run needs (the coefficient)."""
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Restore ``state_dict``."""
        self.value = float(state["value"])


def make_kl_controller(kind: str, kl_coef: float, target_kl: float, horizon: int) -> KLController:
    """``algorithm.kl_ctrl`` as a controller."""
    if kind not in ("fixed", "adaptive"):
        raise ValueError(f"algorithm.kl_ctrl.type={kind!r}: use fixed | adaptive")
    if kind == "adaptive" and horizon <= 0:
        raise ValueError(f"algorithm.kl_ctrl.horizon must be > 0 for the adaptive controller, got {horizon}")
    return KLController(kind, float(kl_coef), float(target_kl), int(horizon))


def kl_in_reward(
    token_scores: torch.Tensor,
    old_logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    ctrl: KLController,
    kind: str,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-level rewards = scores - beta * KL(pi_old || ref) per generated token, with beta the controller's value
    before this step's update; then the controller adapts to this step's KL (the mean over samples of each sample's
    mean token KL). Returns the rewards and ``reward/kl_penalty`` / ``reward/kl_coef``."""
    kld = kl_penalty(old_logprobs, ref_logprobs, kind) * mask.to(old_logprobs.dtype)
    beta = ctrl.value
    rewards = token_scores - beta * kld
    m = mask.to(kld.dtype)
    per_sample = (kld * m).sum(-1) / m.sum(-1).clamp(min=1e-8)
    current = float(per_sample.mean())
    ctrl.update(current, token_scores.shape[0])
    return rewards, {"reward/kl_penalty": current, "reward/kl_coef": beta}


# ------------------------------------------------------------------------------------------ token-level advantages


def token_scores(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, R] rewards with each sample's score on its last response token (the last position of its response,
    tool turns included: where verl places it) and 0 elsewhere."""
    out = torch.zeros(mask.shape, dtype=scores.dtype)
    generated = mask != 0
    present = generated.any(dim=1)
    last = mask.shape[1] - 1 - torch.flip(generated.to(torch.int64), dims=[1]).argmax(dim=1)
    rows = torch.arange(mask.shape[0])
    out[rows[present], last[present]] = scores[present]
    return out


def token_advantages(
    estimator: str,
    token_rewards: torch.Tensor,
    mask: torch.Tensor,
    group: torch.Tensor,
    *,
    values: torch.Tensor | None = None,
    config: EstimatorConfig | None = None,
    components: dict[str, list[float]] | None = None,
    baselines: list[float] | None = None,
    old_logprobs: torch.Tensor | None = None,
    sum_pi_squared: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns [B, R] for ``estimator``: GAE (needs the critic's ``values``; ``config.gamma`` and
    ``lam``), or any estimator of ``vlmrl.algorithms.estimators`` (built-in, registered or from a file), called as verl
    calls it (``index``: each sample's prompt; GDPO also gets the reward ``components``, ReMax the ``baselines``)."""
    config = config or EstimatorConfig(adv_estimator=estimator)
    if estimator_needs(estimator).critic and values is None:
        raise ValueError(f"algorithm.adv_estimator={estimator} needs the critic's values")
    if estimator in OWN_CONVENTION:  # GAE: its own calling convention (as verl's trainer calls it)
        return gae(token_rewards, values, mask, config.gamma, config.lam)
    fn = get_adv_estimator_fn(estimator)
    kwargs = extra_inputs(estimator, token_rewards.dtype, components, baselines, old_logprobs, sum_pi_squared, values)
    m = mask.to(token_rewards.dtype)
    out = fn(
        token_level_rewards=token_rewards,
        response_mask=m,
        index=group.cpu().numpy(),
        epsilon=1e-6,
        norm_adv_by_std_in_grpo=config.norm_adv_by_std_in_grpo,
        config=config,
        **kwargs,
    )
    return checked(estimator, out, tuple(token_rewards.shape))
