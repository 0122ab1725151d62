"""Advantage estimators, KL estimators and vlmrl's loss aggregation (the policy losses: ``vlmrl.algos.losses``).

Estimators live in a registry; users add their own from a file the way they add rewards:
``algorithm.adv_estimator=path/to/my_algo.py:my_estimator`` (same signature as the built-ins).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from vlmrl.userfiles import load_callable

# ------------------------------------------------------------------------------------------------- advantages

AdvantageFn = Callable[..., torch.Tensor]
ADVANTAGE_ESTIMATORS: dict[str, AdvantageFn] = {}
TOKEN_ESTIMATORS = ("gae",)
"""Estimators that work on token-level rewards and need the critic's values (``vlmrl.algos.ppo``), not a function of
sequence scores."""


def register_advantage(name: str) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator: add an advantage estimator ``fn(scores, group, *, eps, norm_by_std, response_mask)``."""

    def deco(fn: AdvantageFn) -> AdvantageFn:
        ADVANTAGE_ESTIMATORS[name] = fn
        return fn

    return deco


def _group_stats(scores: torch.Tensor, group: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample group mean, unbiased std and size (samples sharing a ``group`` id form a group)."""
    _, inv, counts = torch.unique(group, return_inverse=True, return_counts=True)
    sums = torch.zeros(len(counts), dtype=scores.dtype).index_add_(0, inv, scores)
    mean = sums / counts
    sq = torch.zeros(len(counts), dtype=scores.dtype).index_add_(0, inv, (scores - mean[inv]) ** 2)
    std = torch.where(counts > 1, (sq / (counts - 1).clamp(min=1)).sqrt(), torch.zeros_like(sq))
    return mean[inv], std[inv], counts[inv].to(scores.dtype)


@register_advantage("grpo")
def grpo_advantage(
    scores: torch.Tensor, group: torch.Tensor, *, eps: float = 1e-6, norm_by_std: bool = True, **_: object
) -> torch.Tensor:
    """GRPO: (r - mean_group) / (std_group + eps); without the std when ``norm_by_std`` is False."""
    mean, std, _n = _group_stats(scores, group)
    adv = scores - mean
    return adv / (std + eps) if norm_by_std else adv


@register_advantage("dr_grpo")
def dr_grpo_advantage(scores: torch.Tensor, group: torch.Tensor, **_: object) -> torch.Tensor:
    """Dr. GRPO: r - mean_group (no std normalisation; pair with loss_agg_mode=seq-mean-token-sum-norm)."""
    mean, _std, _n = _group_stats(scores, group)
    return scores - mean


@register_advantage("rloo")
def rloo_advantage(scores: torch.Tensor, group: torch.Tensor, **_: object) -> torch.Tensor:
    """RLOO: r_i - mean of the other samples of the group = n/(n-1) * (r_i - mean)."""
    mean, _std, n = _group_stats(scores, group)
    if bool((n < 2).any()):
        raise ValueError("rloo needs at least 2 samples per prompt (actor_rollout_ref.rollout.n >= 2)")
    return (scores - mean) * n / (n - 1)


@register_advantage("reinforce_plus_plus")
def reinforce_pp_advantage(
    scores: torch.Tensor, group: torch.Tensor, *, eps: float = 1e-6, **_: object
) -> torch.Tensor:
    """REINFORCE++ over sequence scores (outcome reward, gamma 1): whiten the scores over the whole batch. The
    trainer uses the token-level form (``algos.ppo.token_advantages``: discounted returns whitened over the batch's
    generated tokens, verl's), which weighs each sample by its length; this one is for callers with scores only."""
    return (scores - scores.mean()) / (scores.std(unbiased=False) + eps)


def get_advantage_fn(name: str) -> AdvantageFn:
    """A registered estimator, or ``path.py:fn`` loaded from a file."""
    if name in ADVANTAGE_ESTIMATORS:
        return ADVANTAGE_ESTIMATORS[name]
    if ":" in name:
        return load_callable(name, what="algorithm.adv_estimator")
    raise ValueError(
        f"algorithm.adv_estimator={name!r}: unknown; choose one of "
        f"{sorted([*ADVANTAGE_ESTIMATORS, *TOKEN_ESTIMATORS])} or path/file.py:fn"
    )


def compute_advantages(
    name: str,
    scores: torch.Tensor,
    group: torch.Tensor,
    *,
    norm_by_std: bool = True,
    response_lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """Sequence-level advantages [B]; raises if any is NaN/inf (a training step never sees one)."""
    fn = get_advantage_fn(name)
    adv = fn(scores.double(), group, norm_by_std=norm_by_std, response_lengths=response_lengths).float()
    if adv.shape != scores.shape:
        raise ValueError(
            f"advantage estimator {name!r} returned shape {tuple(adv.shape)}, expected {tuple(scores.shape)}"
        )
    if not torch.isfinite(adv).all():
        raise FloatingPointError(f"advantage estimator {name!r} produced NaN/inf from scores {scores.tolist()[:16]}")
    return adv


# ----------------------------------------------------------------------------------------------------- losses


def aggregate(
    loss: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    global_tokens: float | None = None,
    global_seqs: float | None = None,
    max_len: int | None = None,
) -> torch.Tensor:
    """Reduce a [B, T] per-token loss to a scalar.

    token-mean: over all tokens; seq-mean-token-mean: per sequence, then over sequences; seq-mean-token-sum-norm:
    per-sequence token sums divided by a constant ``max_len`` (Dr. GRPO), then over sequences.
    ``global_tokens`` / ``global_seqs`` replace the local counts (the counts of the whole mini-batch across
    micro-batches and ranks), so accumulating micro-batch losses gives exactly the loss of one big batch.
    """
    mask = mask.to(loss.dtype)
    if mode == "token-mean":
        denom = global_tokens if global_tokens is not None else mask.sum().clamp(min=1.0)
        return (loss * mask).sum() / denom
    n_seqs = global_seqs if global_seqs is not None else float(loss.shape[0])
    if mode == "seq-mean-token-mean":
        return ((loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).sum() / n_seqs
    if mode == "seq-mean-token-sum-norm":
        return ((loss * mask).sum(-1) / float(max_len or loss.shape[-1])).sum() / n_seqs
    raise ValueError(f"actor.loss_agg_mode={mode!r}: use token-mean | seq-mean-token-mean | seq-mean-token-sum-norm")


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL(pi || ref) estimate. k1 / kl: logp - ref; k2 / mse: 0.5 (logp - ref)^2; abs: |logp - ref|;
    low_var_kl / k3: exp(ref - logp) - (ref - logp) - 1, clamped to [-10, 10] as verl does."""
    d = logp - ref_logp
    if kind in ("k1", "kl"):
        return d
    if kind == "abs":
        return d.abs()
    if kind in ("k2", "mse"):
        return 0.5 * d.square()
    if kind in ("low_var_kl", "k3"):
        r = (-d).clamp(-20.0, 20.0)
        return (r.exp() - r - 1.0).clamp(-10.0, 10.0)
    raise ValueError(f"actor.kl_loss_type={kind!r}: use k1 (kl) | k2 (mse) | low_var_kl (k3) | abs")
