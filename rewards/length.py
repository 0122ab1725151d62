"""Overlong penalty, DAPO style (Yu et al., 2025, "soft overlong punishment").

With ``L`` the response length in tokens, ``L_max`` the limit and ``B`` the buffer: no penalty while
``L <= L_max - B``, then a linear ramp down to ``-penalty_factor`` at ``L = L_max`` (and beyond). Add it as a
component (weight 1) next to the task reward:
``reward.components=[{function: accuracy, weight: 1.0}, {function: length_penalty, weight: 1.0}]``.

Registry name ``length_penalty``.
"""

from __future__ import annotations

from typing import Any


def overlong_penalty(length: int, max_length: int, buffer_len: int, penalty_factor: float = 1.0) -> float:
    """``min(0, -(length - (max_length - buffer_len)) / buffer_len * penalty_factor)``, floored at -penalty_factor."""
    if max_length <= 0:
        raise ValueError("length_penalty needs the response length limit (max_response_length or max_length > 0)")
    if not 0 < buffer_len <= max_length:
        raise ValueError(f"buffer_len must be in (0, max_length={max_length}], got {buffer_len}")
    expected = max_length - buffer_len
    exceed = length - expected
    return max(-penalty_factor, min(0.0, -exceed / buffer_len * penalty_factor))


def length_penalty(
    sample: Any, *, buffer_len: int | None = None, max_length: int | None = None, penalty_factor: float = 1.0
) -> float:
    """DAPO overlong penalty in [-penalty_factor, 0] from ``sample.response_length``.

    ``max_length`` defaults to the run's ``data.max_response_length`` (``sample.max_response_length``);
    ``buffer_len`` defaults to a fifth of it (DAPO used 4096 of 20480).
    """
    limit = int(max_length or getattr(sample, "max_response_length", 0) or 0)
    buffer = int(buffer_len) if buffer_len else max(1, limit // 5)
    return overlong_penalty(int(sample.response_length), limit, buffer, penalty_factor)


length_penalty.needs_images = False  # type: ignore[attr-defined]
