"""A run's metrics as the report reads them: ``metrics.jsonl`` while it is being written, one row per step.

The report reads only regular files inside the run folder (a symlink out of it, a FIFO, a device or a folder is
refused before it is opened, so nothing blocks, leaks or fills memory), each up to a size cap; a line that is not a
JSON object with a step, and a value that is not a number, is skipped and counted.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

MAX_METRICS_BYTES = 512 * 1024**2
"""``metrics.jsonl`` is read up to this many bytes (a notice says when there is more)."""
MAX_LINE_BYTES = 1024**2
"""A longer line of ``metrics.jsonl`` is skipped (a step's metrics take a few kB)."""
MAX_GALLERY_BYTES = 64 * 1024**2
"""A larger validation gallery page is not shown (a notice names it)."""
MAX_STEP = 2**53
"""Steps beyond this (in absolute value) are not steps: the line is skipped."""


class ReportError(ValueError):
    """An input the report will not read, or an output that would replace one; the message names the file."""


def as_number(v: Any) -> float | None:
    """``v`` as a float when it is a real number (not a bool) that fits a float, NaN and inf included; else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        return float(v)
    except OverflowError:  # an integer beyond the float range
        return None


def finite(v: Any) -> float | None:
    """``v`` as a float when it is a finite real number (not a bool); else None."""
    x = as_number(v)
    return x if x is not None and math.isfinite(x) else None


def input_problem(path: str | os.PathLike, root: str | os.PathLike, cap: int | None = None) -> str | None:
    """Why the report will not read ``path`` (None: it may): it leads outside ``root`` (the run folder, resolved),
    is not a regular file, or is larger than ``cap`` bytes. Only ``stat`` is called: nothing is opened."""
    base = Path(root).resolve()
    try:
        real = Path(path).resolve()
    except (OSError, RuntimeError) as e:  # a symlink loop
        return f"cannot be resolved ({e})"
    if not real.is_relative_to(base):
        return f"leads outside the run folder {base} (a symlink out of it): not read"
    try:
        st = os.stat(real)
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file (a FIFO, a device or a folder): not read"
    if cap is not None and st.st_size > cap:
        return f"is {st.st_size} bytes, over the report's cap of {cap} bytes: not read"
    return None


def open_input(path: str | os.PathLike, root: str | os.PathLike) -> BinaryIO:
    """``path`` opened for reading in binary after :func:`input_problem` found nothing against it; opened without
    blocking and without following a last symlink, and checked again once open (a file swapped in between is
    refused). Raises ``ReportError`` naming the file."""
    problem = input_problem(path, root)
    if problem:
        raise ReportError(f"{path} {problem}")
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(Path(path).resolve(), flags)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ReportError(f"{path} is not a regular file (a FIFO, a device or a folder): not read")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_input(path: str | os.PathLike, root: str | os.PathLike, cap: int) -> bytes:
    """The bytes of a regular file inside ``root`` of at most ``cap`` bytes, or ``ReportError`` naming it."""
    problem = input_problem(path, root, cap)
    if problem:
        raise ReportError(f"{path} {problem}")
    with open_input(path, root) as f:
        data = f.read(cap + 1)
    if len(data) > cap:  # it grew since it was checked
        raise ReportError(f"{path} is over the report's cap of {cap} bytes: not read")
    return data


@dataclass
class RunData:
    """One run folder: its name (the legend label), its rows (one per step, sorted; the last row written for a step
    wins, as after a resume) and where they came from."""

    name: str
    folder: Path
    rows: list[dict[str, Any]]
    skipped_lines: int = 0
    """Lines that are not JSON objects with a step (a partial last line of a running job, a crash mid-write, a line
    over ``MAX_LINE_BYTES`` or nested too deep to parse)."""
    galleries: list[Path] = field(default_factory=list)
    """Validation galleries the report may read, oldest first."""
    metrics: Path | None = None
    """The metrics file (default: ``folder / "metrics.jsonl"``)."""
    root: Path | None = None
    """The resolved run folder: every file the report reads is inside it."""
    bad_values: int = 0
    """Values skipped: not numbers (strings, lists, null, booleans), or ``timing/*`` values that are not finite."""
    notices: list[str] = field(default_factory=list)
    """What the report left out and why (files refused, values skipped), one line each."""

    def __post_init__(self) -> None:
        if self.metrics is None:
            self.metrics = self.folder / "metrics.jsonl"
        if self.root is None:
            self.root = self.folder.resolve()

    def keys(self) -> set[str]:
        """Every metric this run logged."""
        return set().union(*self.rows) - {"step"} if self.rows else set()

    def inputs(self) -> list[Path]:
        """The files the report reads for this run (resolved): the metrics file and the gallery pages."""
        return [p.resolve() for p in [self.metrics, *self.galleries] if p is not None]

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """Steps and finite values of ``key``."""
        xs, ys = [], []
        for r in self.rows:
            v = finite(r.get(key))
            if v is not None:
                xs.append(int(r["step"]))
                ys.append(v)
        return xs, ys


def _row(raw: bytes) -> dict[str, Any] | None:
    """A JSON object with an integer step, or None (not JSON, nested too deep, a number too long, no step)."""
    try:
        row = json.loads(raw.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError):  # JSONDecodeError, int digits over the limit; 100,000 nested brackets
        return None
    if not isinstance(row, dict):
        return None
    step = row.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or abs(step) > MAX_STEP:
        return None
    return row


def _clean(row: dict[str, Any]) -> int:
    """Drop the values of ``row`` that are not numbers (and ``timing/*`` values that are not finite); how many."""
    bad = [
        k
        for k, v in row.items()
        if k != "step" and (as_number(v) is None or (k.startswith("timing/") and finite(v) is None))
    ]
    for k in bad:
        del row[k]
    return len(bad)


def read_metrics(path: str | os.PathLike, root: str | os.PathLike | None = None) -> tuple[list[dict], int, int, str]:
    """Rows of a metrics file inside ``root`` (default: its folder), one per step (the last written wins) sorted by
    step; how many lines were skipped (not JSON objects with a step, over ``MAX_LINE_BYTES``); how many values were
    skipped (see :func:`_clean`); and a notice when the file is over ``MAX_METRICS_BYTES`` (only that much is read)."""
    root = Path(path).parent if root is None else root
    by_step: dict[int, dict[str, Any]] = {}
    skipped = bad = consumed = 0
    cap, notice = MAX_METRICS_BYTES, ""
    with open_input(path, root) as f:
        size = os.fstat(f.fileno()).st_size
        while True:
            if consumed >= cap:
                if f.read(1):  # there is more
                    notice = (
                        f"{path} is {max(size, consumed + 1)} bytes, over the report's cap of {cap} bytes: "
                        f"only the first {consumed} bytes read"
                    )
                break
            line = f.readline(MAX_LINE_BYTES + 1)
            if not line:
                break
            consumed += len(line)
            if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                while line and not line.endswith(b"\n") and consumed < cap:  # the rest of the long line
                    line = f.readline(MAX_LINE_BYTES + 1)
                    consumed += len(line)
                skipped += 1
                continue
            if not line.strip():
                continue
            row = _row(line)
            if row is None:
                skipped += 1
                continue
            bad += _clean(row)
            by_step[row["step"]] = row
    return [by_step[s] for s in sorted(by_step)], skipped, bad, notice


_STEP_PAGE = re.compile(r"step_(\d+)\.html")


def _galleries(folder: Path, root: Path, notices: list[str]) -> list[Path]:
    """The gallery pages the report may read, oldest step first; the others are named in ``notices``."""
    d = folder / "val_gallery"
    if not os.path.lexists(d):
        return []
    if not d.resolve().is_relative_to(root) or not d.is_dir():
        notices.append(f"{d} leads outside the run folder {root} or is not a folder: no gallery read")
        return []

    def order(p: Path) -> tuple[int, str]:
        m = _STEP_PAGE.fullmatch(p.name)
        return (int(m.group(1)) if m else -1, p.name)

    out = []
    for g in sorted(d.glob("step_*.html"), key=order):
        problem = input_problem(g, root, MAX_GALLERY_BYTES)
        if problem:
            notices.append(f"{g} {problem}")
        else:
            out.append(g)
    return out


def load_run(target: str | os.PathLike, name: str | None = None) -> RunData:
    """A run folder (``metrics.jsonl`` inside) or a metrics file; raises ``FileNotFoundError`` naming the path, or
    ``ReportError`` when the metrics file leads outside its folder or is not a regular file."""
    p = Path(target)
    metrics = p / "metrics.jsonl" if p.is_dir() else p
    if not os.path.lexists(metrics):
        raise FileNotFoundError(f"{p}: no metrics.jsonl (a run folder is trainer.default_local_dir)")
    folder = metrics.parent
    root = folder.resolve()
    rows, skipped, bad, notice = read_metrics(metrics, root)
    notices = [notice] if notice else []
    if bad:
        notices.append(f"{metrics}: {bad} value(s) skipped (not numbers, or timing/* values that are not finite)")
    if skipped:
        notices.append(
            f"{metrics}: {skipped} line(s) skipped (not JSON objects with a step: a running job's partial "
            "last line, a line over the length cap or nested too deep)"
        )
    galleries = _galleries(folder, root, notices)
    return RunData(name or root.name, folder, rows, skipped, galleries, metrics, root, bad, notices)


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
