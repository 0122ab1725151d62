"""Rollout correction (verl's ``algorithm.rollout_correction.*``): the engine samples from a policy a little
different from the trainer's (bf16 kernels, a stale push, an older step when generation runs ahead), so the loss is
corrected with the ratio of the trainer's old log-probs to the engine's own: importance weights (token or sequence
level; truncated at an upper bound, TIS, or zeroed outside [lower, upper], IcePop; optionally normalised to mean 1)
and rejection (tokens or whole sequences whose divergence statistic is out of bounds leave the loss's mask).

The weights and the mask equal verl 0.9.1's ``rollout_corr_helper`` on the same tensors (tests/test_rollout_correction
.py runs verl's helper beside these), and so do the metrics computed here (a subset of verl's, same names under
``rollout_corr/``). vlmrl applies the correction in the workers' update, per shard (batch normalisation over all
workers' tokens): the advantages are computed from the uncorrected responses.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from vlmrl.algorithms.core import masked_mean, masked_sum

SAFETY_BOUND = 20.0
RS_OPTIONS = (
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
)
IS_LEVELS = ("token", "sequence")


def parse_is_threshold(spec: Any) -> tuple[float, float | None]:
    """``rollout_is_threshold``: a float (TIS: truncate at it) or ``"lower_upper"`` (IcePop: zero outside)."""
    if isinstance(spec, bool):
        raise TypeError("algorithm.rollout_correction.rollout_is_threshold: a number or 'lower_upper', not a bool")
    if isinstance(spec, int | float):
        upper, lower = float(spec), None
    elif isinstance(spec, str) and spec.strip():
        s = spec.strip()
        try:
            lower, upper = (float(s.split("_", 1)[0]), float(s.split("_", 1)[1])) if "_" in s else (None, float(s))
        except ValueError as e:
            raise ValueError(
                f"algorithm.rollout_correction.rollout_is_threshold={spec!r}: not a number or 'lower_upper'"
            ) from e
    else:
        raise TypeError(f"algorithm.rollout_correction.rollout_is_threshold={spec!r}: a number or 'lower_upper'")
    if not (math.isfinite(upper) and upper >= 1) or (lower is not None and not 0 < lower <= 1):
        raise ValueError(
            f"algorithm.rollout_correction.rollout_is_threshold={spec!r}: the upper bound must be finite and >= 1, a "
            "lower bound in (0, 1] (a weight is 1 where engine and trainer agree: bounds that exclude 1 would cut or "
            "zero every token's weight; verl checks only that they are positive)"
        )
    return upper, lower


def parse_rs(rollout_rs: str, threshold: Any) -> dict[str, tuple[float | None, float]]:
    """``rollout_rs`` (comma-separated options, duplicates dropped) and ``rollout_rs_threshold`` (one spec, or one per
    option) to {option: (lower, upper)}: k1 options take ratio bounds ``lower_upper`` (one value: upper, its
    reciprocal the lower), k2/k3 an upper bound only."""
    options: list[str] = []
    for opt in (o.strip() for o in str(rollout_rs).split(",")):
        if not opt:
            continue
        if opt not in RS_OPTIONS:
            raise ValueError(f"algorithm.rollout_correction.rollout_rs: {opt!r} is not one of {', '.join(RS_OPTIONS)}")
        if opt not in options:
            options.append(opt)
    if not options:
        raise ValueError("algorithm.rollout_correction.rollout_rs: give at least one option")
    if threshold is None:
        raise ValueError("algorithm.rollout_correction.rollout_rs_threshold must be set when rollout_rs is")
    specs = (
        [str(threshold)]
        if isinstance(threshold, int | float)
        else [p.strip() for p in str(threshold).split(",") if p.strip()]
    )
    if len(specs) not in (1, len(options)):
        raise ValueError(
            f"algorithm.rollout_correction.rollout_rs_threshold: one threshold, or one per option "
            f"({len(options)}), got {len(specs)}"
        )
    specs = specs * len(options) if len(specs) == 1 else specs
    out: dict[str, tuple[float | None, float]] = {}
    for opt, spec in zip(options, specs):
        try:
            if opt.endswith("k1"):
                lo, hi = spec.split("_", 1) if "_" in spec else (str(1.0 / float(spec)), spec)
                lower, upper = float(lo), float(hi)
                if lower <= 0 or upper <= 0 or lower > upper:
                    raise ValueError
                out[opt] = (lower, upper)
            else:
                if "_" in spec or float(spec) <= 0:
                    raise ValueError
                out[opt] = (None, float(spec))
        except ValueError as e:
            raise ValueError(
                f"algorithm.rollout_correction.rollout_rs_threshold: {spec!r} does not fit {opt} (k1: "
                "positive 'lower_upper' ratio bounds or one upper; k2/k3: one positive upper)"
            ) from e
    return out


def rejection_mask(log_ratio: torch.Tensor, mask: torch.Tensor, rollout_rs: str, threshold: Any):
    """The response mask with rejected tokens / sequences removed, and the masked fractions."""
    options = parse_rs(rollout_rs, threshold)
    lr = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    stats = {"k1": -lr, "k2": 0.5 * lr**2, "k3": torch.exp(lr) - 1.0 - lr}
    keep_all = torch.ones_like(mask, dtype=log_ratio.dtype)
    valid_seq = mask.sum(dim=-1) > 0
    mask_bool = mask.bool()
    metrics: dict[str, float] = {}
    for opt, (lower, upper) in options.items():
        level, _, kind = opt.rpartition("_")
        value = stats[kind]
        if level != "token":
            if level == "seq_sum":
                value = masked_sum(value, mask, axis=-1)
            elif level == "seq_mean":
                value = masked_mean(value, mask, axis=-1)
            else:  # seq_max
                m = value.masked_fill(~mask_bool, float("-inf")).max(dim=-1).values
                value = torch.where(m == float("-inf"), torch.zeros_like(m), m)
        if kind == "k1":
            keep = (value >= math.log(lower)) & (value <= math.log(upper))
        else:
            keep = value <= upper
        if level != "token":
            keep = keep.unsqueeze(-1).expand_as(mask_bool)
        keep_f = keep.to(log_ratio.dtype)
        keep_all = keep_all * keep_f
        seq_kept = (~(~keep & mask_bool)).all(dim=-1).to(log_ratio.dtype)
        metrics[f"rollout_rs_{opt}_masked_fraction"] = float(masked_mean(1 - keep_f, mask))
        n_valid = valid_seq.float().sum()
        metrics[f"rollout_rs_{opt}_seq_masked_fraction"] = (
            float(((1.0 - seq_kept) * valid_seq.float()).sum() / n_valid) if n_valid > 0 else 0.0
        )
    metrics["rollout_rs_masked_fraction"] = float(masked_mean(1 - keep_all, mask))
    final_keep = (keep_all > 0.5) & mask_bool
    metrics["rollout_rs_seq_masked_fraction"] = float((~final_keep & mask_bool).any(dim=-1).float().mean())
    return (mask * keep_all).to(mask.dtype), metrics


def is_weights(
    log_ratio: torch.Tensor,
    mask: torch.Tensor,
    level: str,
    threshold: Any,
    batch_normalize: bool = False,
    global_mean: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
):
    """Importance weights pi_old / pi_rollout per token (``token``) or per sequence (``sequence``, the product over
    its tokens), truncated (TIS) or zeroed outside the bounds (IcePop), detached; optionally divided by their mean
    (``global_mean(values, mask)``: over every worker's tokens or sequences)."""
    if level not in IS_LEVELS:
        raise ValueError(f"algorithm.rollout_correction.rollout_is={level!r}: use token | sequence")
    upper, lower = parse_is_threshold(threshold)
    if level == "token":
        raw = torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND))
    else:
        total = masked_sum(log_ratio, mask, axis=-1).unsqueeze(-1)
        raw = torch.exp(total.clamp(-SAFETY_BOUND, SAFETY_BOUND)).expand_as(log_ratio)
    raw = raw * mask
    if lower is None:
        w = raw.clamp(max=upper)
    else:
        w = torch.where((raw >= lower) & (raw <= upper), raw, torch.zeros_like(raw))
    low = lower if lower is not None else 1.0 / upper  # the metrics' lower bound
    if level == "token":
        mb = mask.bool()
        metrics = {
            "rollout_is_mean": float(masked_mean(w, mask)),
            "rollout_is_ratio_fraction_high": float(masked_mean((raw > upper).float(), mask)),
            "rollout_is_ratio_fraction_low": float(masked_mean((raw < low).float(), mask)),
            "rollout_is_max": float(w.masked_fill(~mb, float("-inf")).max()),
            "rollout_is_min": float(w.masked_fill(~mb, float("inf")).min()),
        }
    else:  # from the sequences' log ratios, unclamped
        metrics = {
            "rollout_is_max": float(torch.exp(total.max().clamp(max=SAFETY_BOUND))),
            "rollout_is_min": float(torch.exp(total.min())),
            "rollout_is_mean": float(masked_mean(w, mask)),
            "rollout_is_ratio_fraction_high": float((total > math.log(upper)).float().mean()),
            "rollout_is_ratio_fraction_low": float((total < math.log(low)).float().mean()),
        }
    if lower is not None:
        metrics["rollout_is_oob_ratio"] = float(masked_mean(((raw < lower) | (raw > upper)).float(), mask))
    w = w.detach()
    if batch_normalize:
        mean_of = global_mean or (lambda v, m: masked_sum(v, m) / m.sum().clamp_min(1e-8))
        if level == "token":
            mean = mean_of(w, mask.to(w.dtype))
        else:
            seq_w = masked_mean(w, mask, axis=-1)
            mean = mean_of(seq_w, (mask.sum(dim=-1) > 0).to(w.dtype))
        if mean > 1e-8:
            w = w / mean
            metrics["rollout_is_batch_norm_factor"] = float(mean)
        else:
            metrics["rollout_is_batch_norm_factor"] = 1.0
    return w, metrics


def correct(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    mask: torch.Tensor,
    settings: Any,
    global_mean: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """(importance weights or None, the corrected response mask, ``rollout_corr/*`` metrics) for
    ``algorithm.rollout_correction`` ``settings``: verl's ``compute_rollout_correction_and_rejection_mask``."""
    if not mask.any():
        raise ValueError("rollout correction: no response token in the batch")
    if old_log_prob.shape != rollout_log_prob.shape or old_log_prob.shape != mask.shape:
        raise ValueError(
            f"rollout correction: shapes differ: old {tuple(old_log_prob.shape)}, engine "
            f"{tuple(rollout_log_prob.shape)}, mask {tuple(mask.shape)}"
        )
    log_ratio = old_log_prob - rollout_log_prob
    metrics: dict[str, float] = {}
    weights = None
    if settings.rollout_is is not None and settings.rollout_is_threshold is not None:
        weights, m = is_weights(
            log_ratio,
            mask,
            settings.rollout_is,
            settings.rollout_is_threshold,
            settings.rollout_is_batch_normalize,
            global_mean,
        )
        metrics.update(m)
    new_mask = mask.clone()
    if settings.rollout_rs is not None:
        new_mask, m = rejection_mask(log_ratio, mask, settings.rollout_rs, settings.rollout_rs_threshold)
        metrics.update(m)
    metrics["kl"] = float(masked_mean(rollout_log_prob - old_log_prob, mask))
    metrics["k3_kl"] = float(masked_mean(torch.exp(log_ratio) - log_ratio - 1, mask))
    return weights, new_mask, {f"rollout_corr/{k}": v for k, v in metrics.items()}
