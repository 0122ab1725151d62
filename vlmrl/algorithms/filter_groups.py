"""DAPO's dynamic sampling (``algorithm.filter_groups``): which prompt groups a step trains on.

A group whose samples all score the same (on the chosen metric) has zero advantage everywhere and teaches nothing.
The trainer rolls out batches until ``batch_size`` groups vary (or ``max_num_gen_batches`` were tried); the step then
trains on the varying groups in the order they came, topped up with non-varying ones so every step has a full batch.
Pure functions: the trainer does the rolling out.
"""

from __future__ import annotations

import math


def varying_groups(values: list[float], n: int) -> list[bool]:
    """Per group of ``n`` consecutive values: whether they are not all equal (NaN counts as a value)."""
    if n < 1 or len(values) % n:
        raise ValueError(f"{len(values)} values do not split into groups of {n}")
    out = []
    for g in range(len(values) // n):
        vals = values[g * n : (g + 1) * n]
        first = vals[0]
        out.append(any(not (v == first or (math.isnan(v) and math.isnan(first))) for v in vals))
    return out


def enough(varies: list[list[bool]], batch_size: int) -> bool:
    """Whether the batches rolled out so far hold ``batch_size`` varying groups."""
    return sum(sum(v) for v in varies) >= batch_size


def choose_groups(varies: list[list[bool]], batch_size: int) -> list[tuple[int, int]]:
    """The step's groups as (batch, group) pairs: every varying group in order of arrival, then non-varying ones in
    order of arrival, cut at ``batch_size``. ValueError when all batches together hold fewer groups."""
    kept = [(b, g) for b, flags in enumerate(varies) for g, v in enumerate(flags) if v]
    dropped = [(b, g) for b, flags in enumerate(varies) for g, v in enumerate(flags) if not v]
    if len(kept) + len(dropped) < batch_size:
        raise ValueError(f"{len(kept) + len(dropped)} groups rolled out for a batch of {batch_size}")
    return (kept + dropped)[:batch_size]
