"""Run report: one self-contained HTML page (and a PNG per panel) of one or several runs' ``metrics.jsonl``.

    python -m vlmrl.report RUN_DIR [RUN_DIR ...] --output report.html [--smooth 0.6] [--labels a,b]

Panels (reward by component and source, response length, entropy, KL and clipping, gradient norm, log-prob drift,
groups without variance, the step's time by stage, throughput, memory), health checks, and each run's latest
validation gallery. Several runs overlay on the same axes. It reads ``metrics.jsonl`` as it is written (a running job;
a partial last line is skipped) and needs no network to open: images are inlined, there is no script.

It reads only regular files inside each run folder, up to a size cap (see :mod:`vlmrl.report.data`); what it leaves
out is listed under "Notices". It never writes over a file it reads (``--output run/metrics.jsonl`` is refused).
"""

from __future__ import annotations

import base64
import datetime
import os
from html import escape
from pathlib import Path

from vlmrl.report import data
from vlmrl.report.data import ReportError, RunData, load_run, read_input
from vlmrl.report.gallery import write_atomically
from vlmrl.report.health import Finding, check_health, health_summary
from vlmrl.report.panels import PANELS, has_data, matching, render, stage_medians

__all__ = [
    "RunData",
    "Finding",
    "ReportError",
    "build_report",
    "check_health",
    "check_output",
    "health_summary",
    "load_run",
]

_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1100px;background:#fafafa;color:#222}
section{background:#fff;border:1px solid #ddd;border-radius:6px;padding:.8em 1em;margin:1em 0}
section img{max-width:100%}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:.2em .6em;text-align:left}
.about,.meta{color:#555}.warning{color:#a40}.info{color:#246}
iframe{width:100%;height:640px;border:1px solid #ccc}
"""


def _png_tag(png: bytes, alt: str) -> str:
    return f'<img src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}" alt="{escape(alt)}">'


def _runs_table(runs: list[RunData]) -> str:
    rows = []
    for r in runs:
        steps = f"{r.rows[0]['step']}\u2013{r.rows[-1]['step']}" if r.rows else "none yet"
        written = datetime.datetime.fromtimestamp(os.stat(r.metrics).st_mtime)
        mtime = written.strftime("%Y-%m-%d %H:%M:%S")
        rows.append(
            f"<tr><td>{escape(r.name)}</td><td>{escape(str(r.folder))}</td><td>{steps}</td><td>{len(r.rows)}</td>"
            f"<td>{mtime}</td><td>{r.skipped_lines}</td><td>{r.bad_values}</td></tr>"
        )
    return (
        "<table><tr><th>run</th><th>folder</th><th>steps</th><th>rows</th><th>metrics last written</th>"
        "<th>lines skipped (partial/not JSON)</th><th>values skipped (not numbers)</th></tr>"
        + "".join(rows)
        + "</table>"
    )


def _notices_html(runs: list[RunData]) -> str:
    items = [f"<li><b>{escape(r.name)}</b>: {escape(n)}</li>" for r in runs for n in r.notices]
    if not items:
        return ""
    return "<section id='notices'><h2>Notices</h2><ul class='warning'>" + "".join(items) + "</ul></section>"


def _health_html(runs: list[RunData], findings: dict[str, list[Finding]]) -> str:
    parts = ["<section id='health'><h2>Health checks</h2>"]
    for r in runs:
        found = findings[r.name]
        if not found:
            parts.append(f"<p><b>{escape(r.name)}</b>: no problems found in {len(r.rows)} step(s).</p>")
            continue
        parts.append(
            f"<p><b>{escape(r.name)}</b></p><table><tr><th>check</th><th>metric</th><th>from step</th>"
            "<th>what</th><th>usual fix</th></tr>"
        )
        for f in found:
            parts.append(
                f"<tr class='{escape(f.severity)}'><td>{escape(f.severity)}: {escape(f.check)}</td>"
                f"<td>{escape(f.metric)}</td><td>{f.step}</td><td>{escape(f.message)}</td><td>{escape(f.fix)}</td></tr>"
            )
        parts.append("</table>")
    parts.append("</section>")
    return "".join(parts)


def _stage_table(runs: list[RunData]) -> str:
    meds = {r.name: stage_medians(r) for r in runs}
    names = next((list(m) for m in meds.values() if m), [])
    if not names:
        return ""
    head = "".join(f"<th>{escape(n)} s</th>" for n in names)
    body = "".join(
        f"<tr><td>{escape(run)}</td>"
        + "".join(f"<td>{m.get(n, 0.0):.3f}</td>" for n in names)
        + f"<td><b>{sum(m.values()):.3f}</b></td></tr>"
        for run, m in meds.items()
        if m
    )
    return f"<table><tr><th>run</th>{head}<th>step s</th></tr>{body}</table>"


def _gallery_html(runs: list[RunData]) -> str:
    parts = ["<section id='validation'><h2>Latest validation samples</h2>"]
    for r in runs:
        if not r.galleries:
            parts.append(
                f"<p><b>{escape(r.name)}</b>: no validation gallery yet (one is written at each validation, "
                "with trainer.log_val_generations samples).</p>"
            )
            continue
        for g in reversed(r.galleries):  # the newest one that can still be read
            try:
                doc = read_input(g, r.root, data.MAX_GALLERY_BYTES).decode("utf-8", errors="replace")
            except (ReportError, OSError) as e:
                parts.append(f"<p class='warning'><b>{escape(r.name)}</b>: {escape(str(e))}</p>")
                continue
            # the gallery is itself one self-contained page (images inlined, text escaped): shown in a sandbox
            parts.append(
                f'<p><b>{escape(r.name)}</b>: {escape(g.name)}</p><iframe sandbox srcdoc="{escape(doc)}" '
                f'title="validation {escape(r.name)}"></iframe>'
            )
            break
    parts.append("</section>")
    return "".join(parts)


def check_output(runs: list[RunData], output: str | os.PathLike, png_dir: str | os.PathLike | None = None) -> None:
    """Raise ``ReportError`` when the page (``output``) or a panel PNG (in ``png_dir``, default ``<output
    stem>_panels``) would be written over a file the report reads (a metrics file, a gallery page), comparing resolved
    paths (and files: a hard link), or when ``output`` is a folder."""
    out = Path(output)
    pngs = Path(png_dir) if png_dir else out.with_name(f"{out.stem}_panels")
    if out.is_dir():
        raise ReportError(f"--output {out} is a folder: name the HTML file to write")
    inputs = {p: r for r in runs for p in r.inputs()}
    for target in [out] + [pngs / f"{panel.name}.png" for panel in PANELS]:
        real = target.resolve()
        hit = next((p for p in inputs if p == real or _same_file(p, real)), None)
        if hit is not None:
            raise ReportError(
                f"refusing to write {target}: it is {hit}, which the report reads (run "
                f"{inputs[hit].name}); write the report elsewhere (--output, --png-dir)"
            )


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return False


def build_report(
    run_dirs: list[str | os.PathLike],
    output: str | os.PathLike,
    labels: list[str] | None = None,
    smooth: float = 0.0,
    png_dir: str | os.PathLike | None = None,
    drift_threshold: float = 0.05,
) -> Path:
    """Write the HTML report of these runs to ``output`` (atomically) and a PNG per drawn panel to ``png_dir``
    (default: ``<output stem>_panels`` beside it); returns the HTML path. Raises ``ReportError`` (a ``ValueError``)
    when a metrics file is refused or ``output`` would replace a file the report reads (nothing is written then)."""
    if labels is not None and len(labels) != len(run_dirs):
        raise ValueError(f"{len(labels)} labels for {len(run_dirs)} runs")
    runs = [load_run(d, labels[i] if labels else None) for i, d in enumerate(run_dirs)]
    seen: dict[str, int] = {}
    for r in runs:  # two folders with the same name (a/run, b/run): tell them apart in legends
        seen[r.name] = seen.get(r.name, 0) + 1
        if seen[r.name] > 1:
            r.name = f"{r.name} ({seen[r.name]})"
    check_output(runs, output, png_dir)
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    pngs = Path(png_dir) if png_dir else out.with_name(f"{out.stem}_panels")
    pngs.mkdir(parents=True, exist_ok=True)
    findings = {r.name: check_health(r.rows, drift_threshold=drift_threshold) for r in runs}
    title = "vlmrl report: " + ", ".join(r.name for r in runs)
    parts = [
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{escape(title)}</title><style>{_CSS}</style>"
        "</head><body>",
        f"<h1>{escape(title)}</h1>",
        f"<p class='meta'>written {datetime.datetime.now().strftime('%Y-%m-%d %H:%M:%S')}"
        + (f"; smoothing {smooth} (raw values faint)" if smooth else "")
        + "</p>",
        _runs_table(runs),
        _notices_html(runs),
        _health_html(runs, findings),
    ]
    for panel in PANELS:
        if not has_data(panel, runs):
            wanted = ", ".join(panel.keys + panel.twin) if panel.kind == "lines" else "timing/step_s"
            parts.append(
                f"<section class='panel empty' id='panel-{panel.name}'><h2>{escape(panel.title)}</h2>"
                f"<p class='meta'>no data: no run logged {escape(wanted)}</p></section>"
            )
            continue
        png = render(panel, runs, smooth)
        (pngs / f"{panel.name}.png").write_bytes(png)
        drawn = sorted({k for r in runs for k in matching(panel.keys + panel.twin, r.keys())})
        extra = _stage_table(runs) if panel.kind == "stages" else ""
        parts.append(
            f"<section class='panel' id='panel-{panel.name}'><h2>{escape(panel.title)}</h2>"
            f"<p class='about'>{escape(panel.about)}</p>{_png_tag(png, panel.title)}{extra}"
            f"<p class='meta'>metrics: {escape(', '.join(drawn) or 'timing/*')}</p></section>"
        )
    parts.append(_gallery_html(runs))
    parts.append("</body></html>\n")
    return write_atomically(out, "".join(parts))
