"""Length-aware reward shaping as an algorithm class (``vlmrl.algorithms.RLAlgorithm``), as users write one.

    python -m vlmrl.train --config-name tiny_cpu ... \
        algorithm.name=examples/algorithms/length_aware.py:LengthAware \
        +algorithm.min_length=4 +algorithm.max_length=6 +algorithm.penalty=0.5

Each response whose length (generated tokens) falls outside [min_length, max_length] loses ``penalty`` from its
reward before the advantages are computed, so the policy learns to answer inside the window; the share of responses
inside it is logged as ``algorithm/in_window``. After ``patience`` steps in a row with most responses too long, the
window's upper end grows by one token (state that the checkpoint keeps, and that the workers see in the same step:
their ``compute_loss`` logs it as ``actor/max_length``).
"""

from __future__ import annotations

from typing import Any

import torch

from vlmrl.algorithms import RLAlgorithm


class LengthAware(RLAlgorithm):
    """Reward minus ``penalty`` outside [min_length, max_length] generated tokens."""

    def __init__(self, min_length: int = 4, max_length: int = 6, penalty: float = 0.5, patience: int = 3) -> None:
        super().__init__()
        if not 0 < min_length <= max_length:
            raise ValueError(f"need 0 < min_length <= max_length, got {min_length}, {max_length}")
        self.min_length, self.max_length, self.penalty, self.patience = min_length, max_length, penalty, patience
        self.too_long_steps = 0
        self.in_window = 0.0
        self.length_mean = 0.0

    def before_train_step(self, step: int, data: dict[str, Any]) -> None:
        lengths = data["response_lengths"].float()
        outside = (lengths < self.min_length) | (lengths > self.max_length)
        data["rewards"] -= self.penalty * outside.float()
        self.in_window = float((~outside).float().mean())
        self.length_mean = float(lengths.mean())
        too_long = float((lengths > self.max_length).float().mean()) > 0.5
        self.too_long_steps = self.too_long_steps + 1 if too_long else 0
        if self.too_long_steps >= self.patience:  # the window follows a policy that keeps needing more room
            self.max_length += 1
            self.too_long_steps = 0

    def compute_loss(self, data: dict[str, Any]) -> dict[str, Any]:
        out = super().compute_loss(data)  # the configured policy loss, entropy bonus and KL loss
        out["max_length"] = torch.tensor(float(self.max_length))  # what this worker sees this step
        return out

    def get_metrics(self) -> dict[str, float]:
        return {"in_window": self.in_window, "length_mean": self.length_mean, "max_length": float(self.max_length)}
