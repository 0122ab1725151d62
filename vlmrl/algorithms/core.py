"""Masked sums and means, KL estimators and the critic's loss aggregation (advantage estimators:
``vlmrl.algorithms.estimators``; policy losses and their aggregation: ``vlmrl.algorithms.losses``)."""

from __future__ import annotations

import torch

# ----------------------------------------------------------------------------------------------------- losses


def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is set (NaNs outside the mask do not leak in)."""
    return (torch.where(mask.bool(), values, 0.0) * mask).sum(dim=axis)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Mean of ``values`` where ``mask`` is set."""
    return masked_sum(values, mask, axis) / (mask.sum(dim=axis) + 1e-8)


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
