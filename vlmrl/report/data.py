"""A run's metrics as the report reads them: ``metrics.jsonl`` while it is being written, one row per step."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class RunData:
    """One run folder: its name (the legend label), its rows (one per step, sorted; the last row written for a step
    wins, as after a resume) and where they came from."""

    name: str
    folder: Path
    rows: list[dict[str, Any]]
    skipped_lines: int = 0
    """Lines that are not JSON (a partial last line of a running job, a crash mid-write)."""
    galleries: list[Path] = field(default_factory=list)
    """Validation galleries, oldest first."""

    def keys(self) -> set[str]:
        """Every metric this run logged."""
        return set().union(*self.rows) - {"step"} if self.rows else set()

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """Steps and finite values of ``key``."""
        xs, ys = [], []
        for r in self.rows:
            v = r.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                xs.append(int(r["step"]))
                ys.append(float(v))
        return xs, ys


def read_rows(path: str | os.PathLike) -> tuple[list[dict[str, Any]], int]:
    """Rows of a metrics file, one per step (the last written wins) sorted by step, and how many lines were skipped
    (not JSON objects with a step)."""
    by_step: dict[int, dict[str, Any]] = {}
    skipped = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                skipped += 1
                continue
            if not isinstance(row, dict) or not isinstance(row.get("step"), int):
                skipped += 1
                continue
            by_step[row["step"]] = row
    return [by_step[s] for s in sorted(by_step)], skipped


def load_run(target: str | os.PathLike, name: str | None = None) -> RunData:
    """A run folder (``metrics.jsonl`` inside) or a metrics file; raises ``FileNotFoundError`` naming the path."""
    p = Path(target)
    metrics = p if p.is_file() else p / "metrics.jsonl"
    if not metrics.is_file():
        raise FileNotFoundError(f"{p}: no metrics.jsonl (a run folder is trainer.default_local_dir)")
    rows, skipped = read_rows(metrics)
    folder = metrics.parent
    galleries = sorted((folder / "val_gallery").glob("step_*.html")) if (folder / "val_gallery").is_dir() else []
    return RunData(name or folder.resolve().name, folder, rows, skipped, galleries)


def ema(values: list[float], weight: float) -> list[float]:
    """TensorBoard's smoothing: an exponential moving average with this weight (0 = none, 0.99 = heavy), debiased so
    the first points are not pulled towards 0."""
    if not 0.0 <= weight < 1.0:
        raise ValueError(f"smoothing weight must be in [0, 1), got {weight}")
    if weight == 0.0:
        return list(values)
    out, acc, norm = [], 0.0, 0.0
    for v in values:
        acc = acc * weight + (1 - weight) * v
        norm = norm * weight + (1 - weight)
        out.append(acc / norm)
    return out
