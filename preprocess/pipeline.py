"""The preprocess scripts' run: the parallel validate-and-build pipeline (rejects with reasons, ``--strict``),
deterministic parquet output, the closing report and the shared command line.

A row that cannot become a valid record is rejected with one of ``common.REJECT_REASONS``, written to
``rejects.jsonl`` beside the output and counted in the report; nothing is dropped silently.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from vlmrl.preprocess.common import (
    DEFAULT_ROW_GROUP_SIZE,
    MAX_IMAGE_BYTES,
    ImageRules,
    PreprocessError,
    RecordError,
)


@dataclass
class Reject:
    """A source row that was not written."""

    split: str
    source: str
    """Where the row came from (file and row/line), for a human to find it."""
    reason: str
    detail: str

    def to_json(self) -> dict[str, str]:
        """The line written to ``rejects.jsonl``."""
        return {"split": self.split, "source": self.source, "reason": self.reason, "detail": self.detail}


@dataclass
class SplitResult:
    """What one output split got: records written, rows rejected."""

    split: str
    path: Path
    written: int = 0
    rejects: list[Reject] = field(default_factory=list)

    @property
    def rows_read(self) -> int:
        """Source rows seen."""
        return self.written + len(self.rejects)


@dataclass(frozen=True)
class Item:
    """One unit of work: a picklable payload and the human-readable source it came from."""

    source: str
    payload: Any


_WORKER_FN: Callable[[Any], dict[str, Any]] | None = None


def _init_worker(fn: Callable[[Any], dict[str, Any]]) -> None:
    global _WORKER_FN
    _WORKER_FN = fn


def _run_one(item: Item, fn: Callable[[Any], dict[str, Any]] | None = None) -> tuple[str, Any]:
    fn = fn or _WORKER_FN
    assert fn is not None
    try:
        return "ok", fn(item.payload)
    except RecordError as e:
        return "reject", (item.source, e.reason, e.detail)


def _pool_run_one(item: Item) -> tuple[str, Any]:
    return _run_one(item)


def _windows(items: Iterable[Item], size: int) -> Iterable[list[Item]]:
    buf: list[Item] = []
    for it in items:
        buf.append(it)
        if len(buf) >= size:
            yield buf
            buf = []
    if buf:
        yield buf


def run_split(
    split: str,
    items: Iterable[Item],
    build: Callable[[Any], dict[str, Any]],
    output_path: str | os.PathLike,
    features: Any,
    *,
    total: int | None = None,
    num_proc: int = 1,
    strict: bool = False,
    progress: bool = True,
    row_group_size: int = DEFAULT_ROW_GROUP_SIZE,
) -> SplitResult:
    """Build the records of one split with ``build(payload) -> record`` (which raises ``RecordError`` for a bad row)
    on ``num_proc`` processes and stream them to ``output_path`` (written atomically), with a progress bar.

    Output order equals input order and the file's bytes are the same whatever ``num_proc`` is. Memory stays bounded:
    items are handed to the workers a window at a time and records are written a row group at a time. ``strict``
    raises ``PreprocessError`` naming the first bad row in input order (and writes nothing)."""
    from tqdm.auto import tqdm

    path = Path(output_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    schema = features.arrow_schema
    result = SplitResult(split, path)
    rows: list[dict[str, Any]] = []
    writer = pq.ParquetWriter(tmp, schema, compression="snappy")
    bar = tqdm(total=total, desc=split, unit="rec", disable=not progress, file=sys.stderr, mininterval=0.5)

    def flush() -> None:
        if rows:
            writer.write_table(pa.Table.from_pylist(rows, schema=schema), row_group_size=row_group_size)
            rows.clear()

    def consume(outcomes: Iterable[tuple[str, Any]]) -> None:
        for kind, value in outcomes:
            bar.update(1)
            if kind == "ok":
                rows.append(value)
                result.written += 1
                if len(rows) >= row_group_size:
                    flush()
                continue
            source, reason, detail = value
            if strict:
                raise PreprocessError(f"--strict: {source}: rejected ({reason}): {detail}")
            result.rejects.append(Reject(split, source, reason, detail))

    ok = False
    try:
        if num_proc <= 1:
            consume(_run_one(it, build) for it in items)
        else:  # concurrent.futures: a worker that dies (OOM kill, segfault) fails the run instead of hanging it
            from concurrent.futures import ProcessPoolExecutor
            from concurrent.futures.process import BrokenProcessPool

            ctx = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
            with ProcessPoolExecutor(num_proc, mp_context=ctx, initializer=_init_worker, initargs=(build,)) as pool:
                try:
                    for window in _windows(items, 64 * num_proc):
                        consume(pool.map(_pool_run_one, window, chunksize=8))
                except BrokenProcessPool as e:
                    raise PreprocessError(
                        f"{split}: a preprocessing worker process died ({e}); nothing was written. A worker killed "
                        "by the system usually ran out of memory: try a smaller --num-proc"
                    ) from None
        flush()
        ok = True
    finally:
        bar.close()
        writer.close()
        if ok and result.written == 0:  # never replace a good file with an empty one
            tmp.unlink(missing_ok=True)
            why = Counter(r.reason for r in result.rejects)
            detail = f"all {result.rows_read} rows were rejected ({dict(why)})" if result.rows_read else "no rows"
            kept = f"{path} was left as it was" if path.exists() else f"{path} was not written"
            raise PreprocessError(f"{split}: {detail}; {kept} (the rejects are listed in the report)")
        if ok:
            os.replace(tmp, path)
        else:
            tmp.unlink(missing_ok=True)
    return result


def write_report(
    output_dir: str | os.PathLike,
    results: Sequence[SplitResult],
    *,
    name: str,
    config: dict[str, Any] | None = None,
    started: float | None = None,
    quiet: bool = False,
) -> dict[str, Any]:
    """Write ``rejects.jsonl`` (always, maybe empty) and ``report.json`` into ``output_dir``, print the closing
    report, and return the report dict."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"script": name, "output_dir": str(out), "splits": {}, "config": config or {}}
    # runs writing other splits into the same folder (jsonl.py --split test after --split train) keep their entries
    now = {res.split for res in results}
    kept: list[str] = []
    if (out / "rejects.jsonl").exists():
        for line in (out / "rejects.jsonl").read_text(encoding="utf-8").splitlines():
            try:
                if json.loads(line).get("split") not in now:
                    kept.append(line)
            except (json.JSONDecodeError, AttributeError):
                continue
    if (out / "report.json").exists():
        try:
            old = json.loads((out / "report.json").read_text(encoding="utf-8"))
            report["splits"].update({k: v for k, v in old.get("splits", {}).items() if k not in now})
        except (json.JSONDecodeError, AttributeError):
            pass
    with open(out / "rejects.jsonl", "w", encoding="utf-8") as f:
        for line in kept:
            f.write(line + "\n")
        for res in results:
            for rej in res.rejects:
                f.write(json.dumps(rej.to_json(), ensure_ascii=False) + "\n")
    for res in results:
        report["splits"][res.split] = {
            "file": str(res.path),
            "rows_read": res.rows_read,
            "written": res.written,
            "rejected": len(res.rejects),
            "rejected_by_reason": dict(sorted(Counter(r.reason for r in res.rejects).items())),
        }
    report["seconds"] = round(time.perf_counter() - started, 3) if started is not None else None
    with open(out / "report.json", "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2, sort_keys=True)
    if not quiet:
        print(format_report(report))
    return report


def format_report(report: dict[str, Any]) -> str:
    """The closing report as text: records written per split, rejects per reason."""
    lines = [f"[{report['script']}] output: {report['output_dir']}"]
    width = max((len(s) for s in report["splits"]), default=5)
    for split, s in report["splits"].items():
        why = ", ".join(f"{k}: {v}" for k, v in s["rejected_by_reason"].items())
        lines.append(
            f"  {split:<{width}}  {s['written']:>7} written  {s['rejected']:>5} rejected"
            + (f" ({why})" if why else "")
            + f"  -> {s['file']}"
        )
    total_rej = sum(s["rejected"] for s in report["splits"].values())
    lines.append(f"  rejects: {total_rej} -> {Path(report['output_dir']) / 'rejects.jsonl'}")
    if report.get("seconds") is not None:
        lines.append(f"  time: {report['seconds']:.2f} s")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------------- cli


def add_common_args(parser: argparse.ArgumentParser) -> None:
    """Flags every preprocess script takes."""
    parser.add_argument("--output-dir", required=True, help="folder for <split>.parquet, rejects.jsonl, report.json")
    parser.add_argument("--num-proc", type=int, default=1, help="worker processes (output is the same for any value)")
    parser.add_argument("--strict", action="store_true", help="stop at the first bad row, naming it")
    parser.add_argument(
        "--store-paths",
        action="store_true",
        help="store image paths (relative to the output folder) instead of encoded bytes",
    )
    parser.add_argument("--row-group-size", type=int, default=DEFAULT_ROW_GROUP_SIZE, help="rows per row group")
    parser.add_argument("--max-image-bytes", type=int, default=MAX_IMAGE_BYTES, help="largest image file read")
    parser.add_argument(
        "--min-pixels", type=int, default=3136, help="training's data.min_pixels (images are checked against it)"
    )
    parser.add_argument(
        "--max-pixels", type=int, default=12845056, help="training's data.max_pixels (images are checked against it)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def image_rules(args: argparse.Namespace, root: str | os.PathLike | None) -> ImageRules:
    """The ``ImageRules`` of a script's command line, with ``root`` the folder image paths must stay inside."""
    return ImageRules(
        root=str(Path(root).resolve()) if root is not None else None,
        max_bytes=int(args.max_image_bytes),
        min_pixels=int(args.min_pixels),
        max_pixels=int(args.max_pixels),
    )


def cli_main(main: Callable[[list[str] | None], Any], argv: list[str] | None = None) -> int:
    """Run a script's ``main``; a ``PreprocessError`` becomes a one-line message and exit status 2."""
    try:
        main(argv)
    except PreprocessError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
