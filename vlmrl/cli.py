"""``vlmrl`` on the command line (installed by pip next to the ``python -m`` forms):

    vlmrl train [--config-name NAME] key=value ...        # python -m vlmrl.train
    vlmrl report RUN [RUN ...] -o report.html              # python -m vlmrl.report
    vlmrl export --checkpoint RUN --output DIR             # python -m vlmrl.export
    vlmrl analyze --log-dir RUN [--metric reward/mean,response_length/mean] [--every 10] [--json] [--plot F.png]

``analyze`` reads a run's ``metrics.jsonl`` through the report's loader (the same validation: nothing outside the
run folder is read) and prints the chosen metrics per step with a summary (first, last, min, max, mean); without
``--metric`` it lists the metrics the run logged. A metric may be named in full, as one name once ``/`` and ``_``
are read alike (``reward_mean`` is ``reward/mean``, not ``val/reward/mean``), or by a unique ending (``length_mean``
finds ``response_length/mean``; an ending that also matches the metric's validation twin, ``val/...``, means the
training metric). ``--plot F.png`` also draws the chosen metrics over the steps, one panel each.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import sys
from typing import Any

COMMANDS = ("train", "report", "export", "analyze")


def main(argv: list[str] | None = None) -> int:
    """Dispatch to the subcommand; returns its exit status."""
    if argv is None:  # the command line's process
        from vlmrl.procs import lean_exit

        lean_exit()
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help") or args[0] not in COMMANDS:
        print(__doc__.strip().split("\n\n")[0] + "\n" + __doc__.split("\n\n")[1], file=sys.stderr)
        if args and args[0] not in ("-h", "--help"):
            print(f"vlmrl: unknown command {args[0]!r}; choose one of {', '.join(COMMANDS)}", file=sys.stderr)
            return 2
        return 0 if args else 2
    cmd, rest = args[0], args[1:]
    if cmd == "train":
        from vlmrl.train import main as train

        return int(train(rest) or 0)
    if cmd == "report":
        from vlmrl.report.__main__ import main as report

        return report(rest)
    if cmd == "export":
        from vlmrl.export import main as export

        return export(rest)
    return analyze(rest)


def _resolve(name: str, available: list[str]) -> str:
    """A metric by its full name, the one name equal to it with ``/`` and ``_`` read alike, or a unique ending
    (after a '/' or '_' boundary; the training metric over its ``val/`` twin); ValueError naming the candidates."""
    if name in available:
        return name
    norm = name.replace("/", "_")
    exact = [k for k in available if k.replace("/", "_") == norm]
    if len(exact) == 1:
        return exact[0]
    hits = exact or [k for k in available if k.replace("/", "_").endswith("_" + norm)]
    training = [k for k in hits if not k.startswith("val/")]
    if len(hits) > 1 and len(training) == 1:  # the training metric over its validation twin (val/... names it)
        return training[0]
    if len(hits) == 1:
        return hits[0]
    if len(hits) > 1:
        raise ValueError(f"metric {name!r} is ambiguous: {', '.join(sorted(hits))}")
    near = difflib.get_close_matches(name, available, n=5, cutoff=0.5)
    raise ValueError(
        f"metric {name!r} was not logged by this run"
        + (f"; did you mean {', '.join(near)}?" if near else "; --metric omitted lists them")
    )


def analyze(argv: list[str]) -> int:
    """``vlmrl analyze``: a run's metrics per step, or the list of what it logged."""
    from vlmrl.report import ReportError, load_run

    ap = argparse.ArgumentParser(prog="vlmrl analyze", description="A run's logged metrics per step, with a summary.")
    ap.add_argument("--log-dir", required=True, help="the run folder (trainer.default_local_dir) or its metrics.jsonl")
    ap.add_argument("--metric", help="comma-separated metric names (full, or a unique ending); omit to list them")
    ap.add_argument("--every", type=int, default=1, help="print every k-th step (the summary uses all; default 1)")
    ap.add_argument("--json", action="store_true", help="print JSON (the rows and the summary) instead of a table")
    ap.add_argument("--plot", metavar="FILE.png", help="also draw the metrics over the steps (one panel each) into it")
    a = ap.parse_args(argv)
    if a.every < 1:
        ap.error(f"--every must be >= 1, got {a.every}")
    try:
        run = load_run(a.log_dir)
    except (FileNotFoundError, ReportError) as e:
        print(f"vlmrl analyze: {e}", file=sys.stderr)
        return 2
    available = sorted({k for r in run.rows for k in r if k != "step"})
    if not a.metric:
        counts = {k: sum(1 for r in run.rows if k in r) for k in available}
        print(f"{run.name}: {len(run.rows)} logged step(s); metrics (steps logged):")
        for k in available:
            print(f"  {k} ({counts[k]})")
        return 0
    try:
        names = [_resolve(m.strip(), available) for m in a.metric.split(",") if m.strip()]
        if not names:
            raise ValueError(f"--metric {a.metric!r} names no metric (comma-separated names; omit it to list them)")
    except ValueError as e:
        print(f"vlmrl analyze: {e}", file=sys.stderr)
        return 2
    rows = [r for r in run.rows if any(n in r for n in names)]
    summary = {n: _summary([float(r[n]) for r in rows if n in r and math.isfinite(float(r[n]))]) for n in names}
    shown = [r for i, r in enumerate(rows) if i % a.every == 0 or i == len(rows) - 1]
    if a.plot:
        print(f"vlmrl analyze: wrote {plot_metrics(rows, names, a.plot, run.name)}", file=sys.stderr)
    if a.json:
        table = [{"step": r["step"], **{n: r.get(n) for n in names}} for r in shown]
        # strict JSON: a value that is not finite (NaN, an overflow) is null, as JSON has no spelling for it
        print(json.dumps(_finite({"run": run.name, "rows": table, "summary": summary}), allow_nan=False))
    else:
        _print_table(shown, names, summary)
    return 0


def _finite(x: Any) -> Any:
    """``x`` with every float that is not finite replaced by None (recursively)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x


def _summary(vals: list[float]) -> dict[str, float]:
    """first, last, min, max, mean and the number of steps of one metric's finite values."""
    if not vals:
        return {"steps": 0}
    return {
        "first": vals[0],
        "last": vals[-1],
        "min": min(vals),
        "max": max(vals),
        "mean": sum(vals) / len(vals),
        "steps": len(vals),
    }


def _print_table(shown: list[dict], names: list[str], summary: dict[str, dict[str, float]]) -> None:
    """The rows as a table, then each metric's summary line."""
    width = max(12, *(len(n) for n in names))
    print("step".rjust(6) + "".join(n.rjust(width + 2) for n in names))
    for r in shown:
        print(str(r["step"]).rjust(6) + "".join(_fmt(r.get(n)).rjust(width + 2) for n in names))
    print()
    for n in names:
        s = summary[n]
        parts = ", ".join(f"{k} {_fmt(v) if k != 'steps' else v}" for k, v in s.items())
        print(f"{n}: " + (parts if s["steps"] else "never logged in these steps"))


def plot_metrics(rows: list[dict], names: list[str], path: str, title: str) -> str:
    """``names`` over the steps of ``rows``, one panel each (a PNG at ``path``, matplotlib); returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(names), 1, figsize=(7, 2.4 * len(names)), sharex=True, squeeze=False)
    for ax, n in zip(axes[:, 0], names):
        pts = [(r["step"], float(r[n])) for r in rows if n in r and math.isfinite(float(r[n]))]
        if pts:
            ax.plot(*zip(*pts), marker="o" if len(pts) < 30 else None, markersize=3)
        ax.set_ylabel(n, fontsize=8)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("step")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _fmt(v: object) -> str:
    if v is None:
        return "-"
    f = float(v)  # type: ignore[arg-type]
    return f"{f:.4g}" if abs(f) < 1e5 else f"{f:.3e}"


if __name__ == "__main__":
    sys.exit(main())
