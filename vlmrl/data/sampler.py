"""An epoch-aware batch sampler whose position is part of a checkpoint: resume continues the exact same order."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np


class BatchSampler:
    """Yield lists of dataset indices, ``batch_size`` at a time, epoch after epoch.

    The order of epoch ``e`` is a permutation drawn from ``(seed, e)`` alone (or ``range(n)`` without ``shuffle``), so
    it does not depend on what ran before. Iterating yields the rest of the current epoch, then moves to the next
    epoch (the next ``iter()`` starts it). ``state_dict()`` taken after a batch was handed out resumes right after that
    batch: save it with the checkpoint of the step that trained on the batch.

        sampler = BatchSampler(len(ds), 16, shuffle=True, seed=1)
        for epoch in range(total_epochs):
            for indices in sampler:
                batch = [ds[i] for i in indices]
    """

    def __init__(
        self, num_samples: int, batch_size: int, shuffle: bool = True, seed: int = 1, drop_last: bool = True
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if num_samples < 0:
            raise ValueError(f"num_samples must be >= 0, got {num_samples}")
        if drop_last and num_samples < batch_size:
            raise ValueError(
                f"the dataset has {num_samples} prompts, fewer than one batch of {batch_size}: "
                "lower data.train_batch_size or add data"
            )
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        self.offset = 0
        """Batches of the current epoch already handed out."""

    def __len__(self) -> int:
        """Batches per epoch."""
        if self.drop_last:
            return self.num_samples // self.batch_size
        return -(-self.num_samples // self.batch_size)

    def order(self, epoch: int) -> np.ndarray:
        """The sample order of ``epoch``."""
        if not self.shuffle:
            return np.arange(self.num_samples)
        return np.random.default_rng([self.seed, epoch]).permutation(self.num_samples)

    def batches(self, epoch: int) -> list[list[int]]:
        """All batches of ``epoch`` (the whole schedule, for inspection and tests)."""
        order = self.order(epoch)
        return [order[b * self.batch_size : (b + 1) * self.batch_size].tolist() for b in range(len(self))]

    def __iter__(self) -> Iterator[list[int]]:
        n = len(self)
        if n and self.offset >= n:  # resumed from a state taken after the epoch's last batch
            self.epoch, self.offset = self.epoch + 1, 0
        order = self.order(self.epoch)
        while self.offset < n:
            b = self.offset
            self.offset += 1
            yield order[b * self.batch_size : (b + 1) * self.batch_size].tolist()
        self.epoch += 1
        self.offset = 0

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its first batch."""
        self.epoch, self.offset = int(epoch), 0

    def state_dict(self) -> dict[str, Any]:
        """The position (and what decides the order, to detect a changed setup on resume)."""
        return {
            "epoch": self.epoch,
            "offset": self.offset,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "num_samples": self.num_samples,
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at a saved position. A checkpoint taken with a different dataset size, batch size, seed or shuffle
        would continue a different order: that is an error, not a silent change."""
        for key in ("num_samples", "batch_size", "seed", "shuffle", "drop_last"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(
                    f"sampler state was saved with {key}={state[key]!r} but this run has {key}={getattr(self, key)!r}; "
                    "resume would not continue the same order (check data.train_files, data.train_batch_size, "
                    "data.seed, data.shuffle and the prompt filters)"
                )
        epoch, offset = int(state["epoch"]), int(state["offset"])
        if not 0 <= offset <= len(self):
            raise ValueError(f"sampler offset {offset} outside 0..{len(self)}")
        self.epoch, self.offset = epoch, offset
