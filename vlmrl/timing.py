"""Wall-clock timing of named stages: one helper instead of ``t0 = perf_counter()`` pairs.

    timer = Timer()
    with timer("rollout"):
        ...
    timer.metrics()            # {"timing/rollout_s": 0.12}
    timer["rollout"]           # 0.12

Entering the same name again adds to it (the rollouts of a step with dynamic sampling). ``Timer.start()`` gives a
stopwatch for one elapsed time (``sw.elapsed``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class Timer:
    """Seconds spent per named stage, summed over every time it was entered."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._t0 = time.perf_counter()

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        """Time the block as stage ``name`` (added to what it already holds, even when the block raises)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t0)

    def add(self, name: str, seconds: float) -> None:
        """Count ``seconds`` towards stage ``name`` (a time measured elsewhere, e.g. in a worker)."""
        self.seconds[name] = self.seconds.get(name, 0.0) + float(seconds)

    def __getitem__(self, name: str) -> float:
        return self.seconds.get(name, 0.0)

    def metrics(self, prefix: str = "timing/") -> dict[str, float]:
        """``{prefix}{name}_s`` per stage (verl's ``timing_s/...`` are spelt ``timing/..._s`` here)."""
        return {f"{prefix}{name}_s": s for name, s in self.seconds.items()}

    @classmethod
    def start(cls) -> Timer:
        """A stopwatch: ``sw = Timer.start(); ...; sw.elapsed``."""
        return cls()

    @property
    def elapsed(self) -> float:
        """Seconds since this timer was made."""
        return time.perf_counter() - self._t0
