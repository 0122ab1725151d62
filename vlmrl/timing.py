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
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

T = TypeVar("T")


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


class TimedIterator(Generic[T]):
    """An iterator that counts the seconds spent producing its items (``seconds``), not those its consumer spends
    between them: what a lazily gathered stream of weights costs on the producer's side."""

    def __init__(self, items: Iterable[T]) -> None:
        self.items = iter(items)
        self.seconds = 0.0

    def __iter__(self) -> TimedIterator[T]:
        return self

    def __next__(self) -> T:
        t0 = time.perf_counter()
        try:
            return next(self.items)
        finally:
            self.seconds += time.perf_counter() - t0


class StartupClock:
    """The start-up's stages, from the process's start (or the clock's) to the first training step: each ``mark``
    closes the stage since the previous one. ``python -m vlmrl.train`` prints them once the first step begins
    (``[vlmrl] start-up: ...``) and logs the total as ``timing/startup_s`` with the first step."""

    def __init__(self, from_process_start: bool = False) -> None:
        """``from_process_start``: count the interpreter's own start and imports (the command line's entry point)."""
        now = time.time()
        self.t0 = _process_start() if from_process_start else now
        self.last = now
        self.parts: dict[str, float] = {"interpreter": now - self.t0} if from_process_start else {}

    def mark(self, name: str) -> None:
        """The stage ``name`` ends now (it began at the previous mark)."""
        now = time.time()
        self.parts[name] = self.parts.get(name, 0.0) + now - self.last
        self.last = now

    @property
    def total(self) -> float:
        """Seconds since the clock's start."""
        return time.time() - self.t0

    def line(self, detail: dict[str, str] | None = None) -> str:
        """``start-up: T s to the first step (stage s, ...)``; ``detail`` adds words after a stage's seconds."""
        parts = ", ".join(
            f"{k} {v:.1f}{' (' + detail[k] + ')' if detail and k in detail else ''}"
            for k, v in self.parts.items()
            if v >= 0.05 or (detail and k in detail)
        )
        return f"start-up: {self.total:.1f} s to the first step ({parts})"


def _process_start() -> float:
    """This process's start (wall clock); now where it cannot be read."""
    try:
        import psutil

        return float(psutil.Process().create_time())
    except Exception:  # noqa: BLE001 - a clock, never a failure
        return time.time()
