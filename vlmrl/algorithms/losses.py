"""Policy losses, in verl's calling convention (so a loss written for verl's ``@register_policy_loss`` runs as is).

Every loss is ``fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights)
-> (loss, metrics)``: [B, T] tensors (``advantages`` per token), ``config`` a :class:`LossConfig` (the actor's
settings under verl's attribute names, ``config.policy_loss.*`` and ``config.global_batch_info``), metrics a dict of
floats. ``config.global_batch_info`` holds the token and sequence counts of the whole mini-batch across micro-batches
and ranks and the number of ranks (``dp_size``): :func:`agg_loss` divides by the global counts and multiplies by the
ranks (FSDP averages gradients over them), so summing the micro-batch losses' gradients gives one big batch's.

The built-ins are verl 0.9.1's ``core_algos`` losses, to the same tensors (tests/test_losses.py runs verl's own
functions beside these): ``vanilla`` (PPO clip, dual clip; vlmrl's older name ``ppo``), ``gspo``, ``sapo``, ``gpg``,
``clip_cov``, ``kl_cov``, ``geo_mean``, ``dro``, ``cispo``, ``dppo_tv``, ``dppo_kl``, ``bypass_mode`` (rollout
correction's bypass mode, which the trainer selects itself). One difference, named where it
is: ``geo_mean`` divides by the mini-batch's sequence count (verl: the micro-batch's mean), so micro-batching does
not change it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from vlmrl.algorithms.core import masked_mean, masked_sum
from vlmrl.algorithms.loss_settings import AGG_MODES, PolicyLossConfig
from vlmrl.algorithms.rollout_correction import correct
from vlmrl.userfiles import registered_or_file

PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, Any]]]
POLICY_LOSSES: dict[str, PolicyLossFn] = {}
ALIASES = {"ppo": "vanilla"}
"""vlmrl's older names of built-in losses."""


def register_policy_loss(name: str) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator: add a policy loss under ``name`` (verl's ``register_policy_loss``, drop-in)."""

    def deco(fn: PolicyLossFn) -> PolicyLossFn:
        POLICY_LOSSES[name] = fn
        return fn

    return deco


def get_policy_loss(name: str) -> PolicyLossFn:
    """A registered loss (or its older vlmrl name), or ``path/to/file.py:fn`` loaded from a file."""
    return registered_or_file(POLICY_LOSSES, ALIASES.get(name, name), "actor.policy_loss.loss_mode", [*POLICY_LOSSES])


# ------------------------------------------------------------------------------------------------- the config


class _Attrs:
    """Attribute access plus verl's ``config.get(name, default)``."""

    def get(self, name: str, default: Any = None) -> Any:
        value = getattr(self, name, default)
        return default if value is None and default is not None else value

    def __getitem__(self, name: str) -> Any:
        return getattr(self, name)

    def __contains__(self, name: str) -> bool:
        return hasattr(self, name)


@dataclass
class PolicyLossSettings(PolicyLossConfig, _Attrs):
    """``config.policy_loss`` as verl's losses read it: the schema's ``actor.policy_loss`` plus bypass mode's
    rollout-correction settings."""

    rollout_correction: Any = None


@dataclass
class LossConfig(_Attrs):
    """What a policy loss reads from ``config``: verl's ``ActorConfig`` attribute names."""

    clip_ratio: float = 0.2
    clip_ratio_low: float | None = None
    clip_ratio_high: float | None = None
    clip_ratio_c: float = 3.0
    tau_pos: float = 1.0
    tau_neg: float = 1.05
    loss_agg_mode: str = "token-mean"
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    policy_loss: PolicyLossSettings = field(default_factory=PolicyLossSettings)
    global_batch_info: dict[str, Any] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Other ``actor`` settings, read through ``get`` (a user's loss may read its own keys)."""

    def get(self, name: str, default: Any = None) -> Any:
        if hasattr(self, name):
            return super().get(name, default)
        return self.extra.get(name, default)

    @classmethod
    def from_actor(cls, actor: Any) -> LossConfig:
        """From vlmrl's ``ActorConfig`` (``actor_rollout_ref.actor``)."""
        pl = actor.policy_loss
        return cls(
            clip_ratio=actor.clip_ratio,
            clip_ratio_low=actor.clip_ratio_low,
            clip_ratio_high=actor.clip_ratio_high,
            clip_ratio_c=actor.clip_ratio_c,
            tau_pos=actor.tau_pos,
            tau_neg=actor.tau_neg,
            loss_agg_mode=actor.loss_agg_mode,
            entropy_coeff=actor.entropy_coeff,
            use_kl_loss=actor.use_kl_loss,
            kl_loss_coef=actor.kl_loss_coef,
            kl_loss_type=actor.kl_loss_type,
            policy_loss=PolicyLossSettings(**asdict(pl)),
        )

    def clip_bounds(self) -> tuple[float, float]:
        """(low, high): clip_ratio_low / clip_ratio_high, each clip_ratio when unset."""
        low = self.clip_ratio_low if self.clip_ratio_low is not None else self.clip_ratio
        high = self.clip_ratio_high if self.clip_ratio_high is not None else self.clip_ratio
        return low, high


# -------------------------------------------------------------------------------------------- aggregation


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    dp_size: int = 1,
    batch_num_tokens: float | None = None,
    global_batch_size: float | None = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """A [B, T] loss to a scalar, verl's ``agg_loss``: token-mean (over the mini-batch's tokens), token-sum,
    seq-mean-token-sum, seq-mean-token-mean (per sequence, then over sequences) or seq-mean-token-sum-norm (token
    sums over a constant ``loss_scale_factor``, Dr. GRPO). With global counts the result is this micro-batch's share
    times ``dp_size``."""
    if loss_agg_mode == "token-mean":
        if batch_num_tokens is None:
            if dp_size > 1:
                raise ValueError("agg_loss: batch_num_tokens is required when dp_size > 1")
            batch_num_tokens = loss_mask.sum()
        return masked_sum(loss_mat, loss_mask) / batch_num_tokens * dp_size
    if loss_agg_mode == "token-sum":
        return masked_sum(loss_mat, loss_mask) * dp_size
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean"):
        tokens = loss_mask.sum(dim=-1)
        seq = torch.sum(loss_mat * loss_mask, dim=-1)
        if loss_agg_mode == "seq-mean-token-mean":
            seq = seq / (tokens + 1e-8)
        seq_mask = (tokens > 0).float()
        if global_batch_size is None:
            if dp_size > 1:
                raise ValueError("agg_loss: global_batch_size is required when dp_size > 1")
            global_batch_size = seq_mask.sum()
        loss = masked_sum(seq, seq_mask) / global_batch_size * dp_size
        if loss_agg_mode == "seq-mean-token-sum-norm":
            loss = loss / (loss_scale_factor if loss_scale_factor is not None else loss_mask.shape[-1])
        return loss
    raise ValueError(f"actor.loss_agg_mode={loss_agg_mode!r}: use one of {' | '.join(AGG_MODES)}")


def _agg(losses: torch.Tensor, mask: torch.Tensor, mode: str, config: LossConfig, w: torch.Tensor | None):
    """``agg_loss`` of ``losses`` (times the rollout-correction weights ``w`` when given)."""
    if w is not None:
        losses = losses * w
    return agg_loss(losses, mask, mode, **config.global_batch_info)


def _ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor, clamp: bool = True):
    """(log ratio, ratio); the log ratio clamped to [-20, 20] as verl does."""
    neg_kl = log_prob - old_log_prob
    if clamp:
        neg_kl = neg_kl.clamp(-20.0, 20.0)
    return neg_kl, neg_kl.exp()


def _f(x: torch.Tensor | float) -> float:
    return float(x.detach()) if isinstance(x, torch.Tensor) else float(x)


def _metrics(clipfrac: torch.Tensor, ppo_kl: torch.Tensor, lower: torch.Tensor | float = 0.0) -> dict[str, float]:
    return {"actor/pg_clipfrac": _f(clipfrac), "actor/ppo_kl": _f(ppo_kl), "actor/pg_clipfrac_lower": _f(lower)}


# ----------------------------------------------------------------------------------------------- the losses


@register_policy_loss("vanilla")
def vanilla(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None, rollout_is_weights=None
):
    """PPO's clipped surrogate with asymmetric bounds (DAPO's clip-higher: clip_ratio_low/high) and the dual clip
    (``clip_ratio_c``; 0 turns it off, which verl does not offer) for negative advantages."""
    low, high = config.clip_bounds()
    c = config.get("clip_ratio_c", 3.0)
    if c and not c > 1.0:
        raise ValueError(f"actor.clip_ratio_c must be > 1 (the dual clip's bound) or 0 (none), got {c}")
    neg_kl, ratio = _ratio(log_prob, old_log_prob)
    l1 = -advantages * ratio
    l2 = -advantages * ratio.clamp(1 - low, 1 + high)
    clipped = torch.maximum(l1, l2)
    if c:
        l3 = -advantages * c
        losses = torch.where(advantages < 0, torch.min(l3, clipped), clipped)
        lower = masked_mean(torch.gt(clipped, l3) * (advantages < 0).float(), response_mask)
    else:  # vlmrl: clip_ratio_c=0 turns the dual clip off
        losses, lower = clipped, torch.tensor(0.0)
    loss = _agg(losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    return loss, _metrics(
        masked_mean(torch.gt(l2, l1).float(), response_mask), masked_mean(-neg_kl, response_mask), lower
    )


def _dppo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights, valid_fn):
    """DPPO's binary-divergence trust region: tokens whose probability moved too far (by ``valid_fn``) drop out."""
    low, high = config.clip_bounds()
    neg_kl, ratio = _ratio(log_prob, old_log_prob)
    c = config.get("clip_ratio_c", 20.0)
    truncated = ratio.clamp(max=c).detach()
    prob, old_prob = log_prob.exp(), old_log_prob.exp()
    pos, neg = valid_fn(prob, old_prob, log_prob, old_log_prob, low, high)
    valid = torch.where(advantages > 0, pos, neg).detach().float()
    losses = -advantages * truncated * log_prob * valid
    loss = _agg(losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    lower = masked_mean((ratio > c).float() * valid, response_mask)
    return loss, _metrics(masked_mean(1.0 - valid, response_mask), masked_mean(-neg_kl, response_mask), lower)


@register_policy_loss("dppo_tv")
def dppo_tv(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None, rollout_is_weights=None
):
    """DPPO with the total-variation bound: |p - p_old| within clip_ratio_high (A > 0) / clip_ratio_low (A <= 0)."""

    def valid(p, p_old, _lp, _lp_old, low, high):
        return (p - p_old) <= high, (p - p_old) >= -low

    return _dppo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights, valid)


@register_policy_loss("dppo_kl")
def dppo_kl(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None, rollout_is_weights=None
):
    """DPPO with the binary-KL bound between the old and new token probabilities."""

    def valid(p, p_old, lp, lp_old, low, high):
        bkl = p_old * (lp_old - lp) + (1 - p_old) * torch.log((1.0 - p_old + 1e-8) / (1.0 - p + 1e-8))
        return (bkl <= high) | (p <= p_old), (bkl <= low) | (p >= p_old)

    return _dppo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights, valid)


@register_policy_loss("gspo")
def gspo(
    old_log_prob,
    log_prob,
    advantages,
    response_mask,
    loss_agg_mode="seq-mean-token-mean",
    config=None,
    rollout_is_weights=None,
):
    """GSPO: the sequence's geometric-mean ratio (its per-token gradient kept), clipped (typically with small
    bounds: 3e-4 / 4e-4); verl recommends ``loss_agg_mode=seq-mean-token-mean``."""
    low, high = config.clip_bounds()
    neg_kl = log_prob - old_log_prob
    lengths = response_mask.sum(dim=-1).clamp(min=1)
    seq_neg_kl = (neg_kl * response_mask).sum(dim=-1) / lengths
    log_seq_ratio = (log_prob - log_prob.detach() + seq_neg_kl.detach().unsqueeze(-1)).clamp(max=10.0)
    ratio = log_seq_ratio.exp()
    l1 = -advantages * ratio
    l2 = -advantages * ratio.clamp(1 - low, 1 + high)
    loss = _agg(torch.maximum(l1, l2), response_mask, loss_agg_mode, config, rollout_is_weights)
    return loss, _metrics(masked_mean(torch.gt(l2, l1).float(), response_mask), masked_mean(-neg_kl, response_mask))


@register_policy_loss("sapo")
def sapo(
    old_log_prob,
    log_prob,
    advantages,
    response_mask,
    loss_agg_mode="seq-mean-token-mean",
    config=None,
    rollout_is_weights=None,
):
    """SAPO: a soft sigmoid gate on the ratio instead of a hard clip (``actor.tau_pos`` / ``tau_neg``); always
    aggregated seq-mean-token-mean, as verl does."""
    tau_pos = torch.as_tensor(config.tau_pos, dtype=advantages.dtype, device=advantages.device)
    tau_neg = torch.as_tensor(config.tau_neg, dtype=advantages.dtype, device=advantages.device)
    neg_kl, ratio = _ratio(log_prob, old_log_prob)
    taus = torch.where(advantages > 0, tau_pos, tau_neg)
    gates = torch.sigmoid(taus * (ratio - 1.0)) * (4.0 / taus)
    loss = _agg(-gates * advantages, response_mask, "seq-mean-token-mean", config, rollout_is_weights)
    return loss, _metrics(torch.tensor(0.0), masked_mean(-neg_kl, response_mask))


@register_policy_loss("gpg")
def gpg(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None, rollout_is_weights=None
):
    """GPG: plain policy gradient, -log p * A (no ratio, no clip)."""
    return _agg(-log_prob * advantages, response_mask, loss_agg_mode, config, rollout_is_weights), {}


@register_policy_loss("clip_cov")
def clip_cov(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None, rollout_is_weights=None
):
    """Clip-Cov: PPO clip, plus the gradient of a random ``clip_cov_ratio`` share of the tokens whose advantage x
    log-prob covariance lies in (clip_cov_lb, clip_cov_ub) cut (entropy-collapse control)."""
    pl = config.policy_loss
    ratio_k = pl.clip_cov_ratio if pl.clip_cov_ratio is not None else 0.0002
    ub = pl.clip_cov_ub if pl.clip_cov_ub is not None else 5.0
    lb = pl.clip_cov_lb if pl.clip_cov_lb is not None else 1.0
    if not ratio_k > 0:
        raise ValueError(f"actor.policy_loss.clip_cov_ratio must be > 0, got {ratio_k}")
    low, high = config.clip_bounds()
    neg_kl = log_prob - old_log_prob
    ratio = neg_kl.exp()
    l1 = -advantages * ratio
    l2 = -advantages * ratio.clamp(1 - low, 1 + high)
    clipped_by_ratio = (l2 > l1) & (response_mask > 0)
    cov = (advantages - masked_mean(advantages, response_mask)) * (
        log_prob - masked_mean(log_prob.detach(), response_mask)
    )
    cov[response_mask == 0] = -torch.inf
    cov[clipped_by_ratio] = -torch.inf
    n_clip = max(int(ratio_k * response_mask.sum().item()), 1)
    idx = torch.nonzero((cov < ub) & (cov > lb) & (response_mask > 0))
    if len(idx) > 0:
        idx = idx[torch.randperm(len(idx))[: min(n_clip, len(idx))]]
    corr = torch.ones_like(advantages)
    corr[idx[:, 0], idx[:, 1]] = 0
    loss = _agg(torch.maximum(l1, l2) * corr, response_mask, loss_agg_mode, config, rollout_is_weights)
    return loss, {
        "actor/pg_clipfrac": _f(masked_mean((corr == 0).float(), response_mask)),
        "actor/ppo_kl": _f(masked_mean(-neg_kl, response_mask)),
    }


@register_policy_loss("kl_cov")
def kl_cov(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None, rollout_is_weights=None
):
    """KL-Cov: the unclipped surrogate, with a |log ratio| penalty (``ppo_kl_coef``) on the ``kl_cov_ratio`` share of
    tokens with the largest advantage x log-prob covariance."""
    pl = config.policy_loss
    ratio_k = pl.kl_cov_ratio if pl.kl_cov_ratio is not None else 0.0002
    coef = pl.ppo_kl_coef if pl.ppo_kl_coef is not None else 1.0
    if not ratio_k > 0:
        raise ValueError(f"actor.policy_loss.kl_cov_ratio must be > 0, got {ratio_k}")
    neg_kl = log_prob - old_log_prob
    ratio = neg_kl.exp()
    losses = -advantages * ratio
    with_kl = -advantages * ratio + coef * neg_kl.abs()
    valid = response_mask > 0
    valid_idx = torch.nonzero(valid.reshape(-1), as_tuple=True)[0]
    adv = advantages[valid].detach().reshape(-1).cpu()
    lp = log_prob[valid].detach().reshape(-1).cpu()
    if len(adv) > 0:
        cov = (adv - adv.mean()) * (lp - lp.mean())
        top = valid_idx[torch.topk(cov, max(1, int(len(cov) * ratio_k)), largest=True).indices.to(valid_idx.device)]
        rows, cols = top // advantages.shape[1], top % advantages.shape[1]
        losses[rows, cols] = with_kl[rows, cols]
    loss = _agg(losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    return loss, {"actor/ppo_kl": _f(masked_mean(neg_kl.abs(), response_mask))}


@register_policy_loss("geo_mean")
def geo_mean(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None, rollout_is_weights=None
):
    """GMPO: the geometric mean of the per-token clipped ratios of a sequence times its mean advantage. Averaged over
    the mini-batch's sequences (``global_batch_size``; verl: over the micro-batch's)."""
    low, high = config.clip_bounds()
    neg_kl = log_prob - old_log_prob
    sgn = torch.sign(advantages)
    neg_kl_clamped = neg_kl.clamp(-low, high)
    neg_kl_min = sgn * torch.min(sgn * neg_kl, sgn * neg_kl_clamped)
    n = response_mask.sum(dim=-1)
    ratio = torch.exp((neg_kl_min * response_mask).sum(dim=-1) / (n + 1e-8))
    adv = (advantages * response_mask).sum(dim=-1) / (n + 1e-8)
    losses = -adv * ratio
    if rollout_is_weights is not None:
        losses = losses * torch.exp((torch.log(rollout_is_weights + 1e-10) * response_mask).sum(dim=-1) / (n + 1e-8))
    info = config.global_batch_info
    if info.get("global_batch_size") is not None:
        loss = losses.sum() / info["global_batch_size"] * info.get("dp_size", 1)
    else:
        loss = losses.mean()
    clipped = torch.ne(neg_kl, neg_kl_clamped)
    return loss, _metrics(
        masked_mean((clipped * (advantages > 0)).float(), response_mask),
        masked_mean(-neg_kl, response_mask),
        masked_mean((clipped * (advantages < 0)).float(), response_mask),
    )


@register_policy_loss("dro")
def dro(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None, rollout_is_weights=None
):
    """DRO: -(log p * A - beta/2 * (log ratio)^2), ``actor.policy_loss.dro_beta`` > 0 required."""
    beta = config.policy_loss.dro_beta
    if beta is None or beta <= 0:
        raise ValueError("actor.policy_loss.dro_beta must be a positive value when using DRO")
    log_ratio = log_prob - old_log_prob
    losses = -(log_prob * advantages - 0.5 * beta * log_ratio.square())
    loss = _agg(losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    return loss, {"actor/ppo_kl": _f(masked_mean(-log_ratio, response_mask))}


@register_policy_loss("cispo")
def cispo(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None, rollout_is_weights=None
):
    """CISPO: REINFORCE weighted by the clipped, stop-gradient ratio (no token loses its gradient)."""
    low, high = config.clip_bounds()
    neg_kl, ratio = _ratio(log_prob, old_log_prob)
    clipped = ratio.clamp(1 - low, 1 + high)
    losses = -clipped.detach() * advantages * log_prob
    loss = _agg(losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    return loss, _metrics(masked_mean((ratio != clipped).float(), response_mask), masked_mean(-neg_kl, response_mask))


def reinforce(
    rollout_log_prob,
    log_prob,
    advantages,
    response_mask,
    loss_agg_mode="seq-mean-token-sum",
    config=None,
    rollout_is_weights=None,
):
    """REINFORCE, -A log p (times the importance weights): bypass mode's ``loss_type=reinforce``."""
    losses = -advantages * log_prob
    if rollout_is_weights is not None:
        losses = losses * rollout_is_weights
    loss = agg_loss(losses, response_mask, loss_agg_mode, **config.global_batch_info)
    return loss, {"actor/ppo_kl": _f(masked_mean(-(log_prob - rollout_log_prob), response_mask))}


@register_policy_loss("bypass_mode")
def bypass_mode(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None, rollout_is_weights=None
):
    """Rollout correction's bypass mode: the old log-probs are the engine's; the importance weights and the rejection
    mask are computed against the current policy (``config.policy_loss.rollout_correction``), then PPO clip on the
    kept tokens (``loss_type=ppo_clip``, no weights) or REINFORCE with the weights (``loss_type=reinforce``)."""
    rc = config.policy_loss.rollout_correction if config is not None else None
    if rc is None:
        raise ValueError(
            "actor.policy_loss.loss_mode=bypass_mode: set algorithm.rollout_correction.bypass_mode=True "
            "(the trainer then uses the engine's log-probs as the old ones and this loss)"
        )
    loss_type = getattr(rc, "loss_type", "ppo_clip")
    with torch.no_grad():
        weights, mask, corr = correct(log_prob, old_log_prob, response_mask, rc)
    if loss_type == "reinforce":
        loss, metrics = reinforce(old_log_prob, log_prob, advantages, mask, loss_agg_mode, config, weights)
    elif loss_type == "ppo_clip":
        loss, metrics = vanilla(old_log_prob, log_prob, advantages, mask, loss_agg_mode, config, None)
    else:
        raise ValueError(f"algorithm.rollout_correction.loss_type={loss_type!r}: use ppo_clip | reinforce")
    return loss, {**metrics, **corr}
