"""The supervised warm start's teacher for the real-images pipeline (examples/real_images_cpu.sh): it writes each
labelled record's answer, the digit, as the whole assistant turn (``python -m vlmrl.testing.warm_start --teacher
examples/real_images/teacher.py:write_turn``)."""

from __future__ import annotations

import random
from typing import Any


def write_turn(turn: int, conversation: str, sample: Any, rng: random.Random) -> str:
    """The record's ground truth (``reward_model.ground_truth``: the digit)."""
    return str(sample.ground_truth)
