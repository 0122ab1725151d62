"""``python -m vlmrl.report RUN_DIR [RUN_DIR ...] --output report.html``: see :mod:`vlmrl.report`."""

from __future__ import annotations

import argparse
import sys

from vlmrl.report import ReportError, build_report, check_output, health_summary, load_run


def main(argv: list[str] | None = None) -> int:
    """Build the report; print each run's health checks and where the page and the panels went."""
    ap = argparse.ArgumentParser(
        prog="python -m vlmrl.report",
        description="One self-contained HTML report (and a PNG per panel) of one or more runs' metrics.jsonl; several "
        "runs overlay on the same axes.",
    )
    ap.add_argument("runs", nargs="+", help="run folders (trainer.default_local_dir) or metrics.jsonl files")
    ap.add_argument("--output", "-o", default="report.html", help="HTML file to write (default: report.html)")
    ap.add_argument("--labels", help="comma-separated legend names, one per run (default: the folder names)")
    ap.add_argument(
        "--smooth",
        type=float,
        default=0.0,
        help="TensorBoard-style smoothing weight in [0, 1) (default 0: none; raw values stay faint)",
    )
    ap.add_argument("--png-dir", help="where the PNG per panel goes (default: <output stem>_panels/)")
    ap.add_argument(
        "--drift-threshold",
        type=float,
        default=0.05,
        help="health check: largest acceptable rollout/logprob_diff (default 0.05)",
    )
    a = ap.parse_args(argv)
    if not 0.0 <= a.smooth < 1.0:
        ap.error(f"--smooth must be in [0, 1), got {a.smooth}")
    labels = a.labels.split(",") if a.labels else None
    if labels is not None and len(labels) != len(a.runs):
        ap.error(f"--labels names {len(labels)} runs, {len(a.runs)} given")
    try:
        runs = [load_run(run, labels[i] if labels else None) for i, run in enumerate(a.runs)]
        check_output(runs, a.output, a.png_dir)  # before anything is printed or written
        for data in runs:
            health = health_summary(data.rows, drift_threshold=a.drift_threshold)
            print(f"[{data.name}] " + health.replace("\n", "\n  "))
            for notice in data.notices:
                print(f"vlmrl.report: [{data.name}] {notice}", file=sys.stderr)
        out = build_report(a.runs, a.output, labels, a.smooth, a.png_dir, a.drift_threshold)
    except (FileNotFoundError, ReportError) as e:
        print(f"vlmrl.report: {e}", file=sys.stderr)
        return 2
    print(f"report written to {out}")
    return 0


if __name__ == "__main__":
    from vlmrl.procs import lean_exit

    lean_exit()
    sys.exit(main())
