"""The warm start of ``bench_async.py``'s long-tailed workload (``python -m vlmrl.testing.warm_start --teacher
benchmarks/long_tail_teacher.py:write_turn``): the answer is a colour drawn at random (the policy starts near chance,
as the quick start's does), then a filler word repeated a number of times drawn from a log-normal distribution
(median ``MEDIAN``, capped at 16x it), then the end of the turn. The warm-started model stops with the hazard it
learned: its responses' lengths are long-tailed, as reasoning models' are, and decided by what it samples."""

from __future__ import annotations

import math
import random
from typing import Any

COLOURS = ("red", "green", "blue")
MEDIAN = 6
"""Median number of filler words."""
SIGMA = 1.3
"""Spread of the log-normal (its log's standard deviation)."""
CAP = 16 * MEDIAN
"""Most filler words: 16x the median."""


def filler_words(rng: random.Random) -> int:
    """A heavy-tailed count: log-normal with median ``MEDIAN``, at most ``CAP``."""
    return min(CAP, max(0, round(math.exp(math.log(MEDIAN) + SIGMA * rng.gauss(0.0, 1.0)))))


def write_turn(turn: int, conversation: str, sample: Any, rng: random.Random) -> str:
    """The teacher's answer: a random colour, then the filler."""
    return rng.choice(COLOURS) + " so" * filler_words(rng)
