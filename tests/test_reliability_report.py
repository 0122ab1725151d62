"""Reliability and security of the run report and the Prometheus exporter (issue 32, round three): idle and slow
connections, token files, run folders holding symlinks out, FIFOs, /dev/zero and oversized files, labels that
matplotlib would read as mathtext, values that are not numbers, JSON nested too deep, and an output that would
replace an input. Everything is real: sockets on 127.0.0.1, files in tmp_path, the CLI in a subprocess."""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from vlmrl.report import build_report, check_health, load_run
from vlmrl.trainer.prometheus import PrometheusExporter

pytestmark = pytest.mark.serial  # runs alone in a parallel suite: the exporter's 1 s request timeout

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "t0ken-" + "x" * 26  # 32 characters


# -------------------------------------------------------------------------------------------------------- helpers


def _token_file(tmp_path: Path, text: str = TOKEN, mode: int = 0o600, name: str = "token") -> Path:
    p = tmp_path / name
    p.write_text(text + "\n")
    p.chmod(mode)
    return p


def _get(url: str, token: str | None = None, timeout: float = 10.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _get_eventually(url: str, token: str | None = None, within: float = 5.0) -> tuple[int, bytes]:
    """A request retried while the server is still freeing connection slots (closed at once until then)."""
    deadline = time.monotonic() + within
    while True:
        try:
            return _get(url, token)
        except (urllib.error.URLError, ConnectionError, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _closed_by_server(socks: list[socket.socket], wait: float, want: int) -> set[socket.socket]:
    """The sockets the server closed (EOF or reset) within ``wait`` s; returns early once ``want`` are."""
    closed: set[socket.socket] = set()
    deadline = time.monotonic() + wait
    while len(closed) < want and time.monotonic() < deadline:
        readable, _, _ = select.select([s for s in socks if s not in closed], [], [], 0.1)
        for s in readable:
            try:
                if s.recv(1) == b"":
                    closed.add(s)
            except OSError:
                closed.add(s)
    return closed


def _without_blocking(fn: Callable[[], Any], fifo: Path, timeout: float = 20.0) -> Any:
    """``fn()``; fails the test (instead of hanging it) when ``fn`` is still blocked in opening ``fifo`` after
    ``timeout`` s: a writer is then opened and closed so that the reader sees end-of-file and the thread ends."""
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            out["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # the blocked reader gets EOF
        t.join(10)
        pytest.fail(f"blocked for {timeout} s reading the FIFO {fifo}")
    if "error" in out:
        raise out["error"]
    return out["value"]


def _run(tmp_path: Path, rows: list[dict] | None = None, name: str = "run", lines: list[str] | None = None) -> Path:
    """A run folder with a metrics.jsonl of these rows (default: three steps of a reward) and/or raw lines."""
    run = tmp_path / name
    run.mkdir()
    rows = [{"step": s, "reward/mean": 0.1 * s} for s in (1, 2, 3)] if rows is None else rows
    text = "".join(json.dumps(r) + "\n" for r in rows) + "".join(line + "\n" for line in lines or [])
    (run / "metrics.jsonl").write_text(text)
    return run


def _gallery(run: Path, step: int, body: str = "<p>real gallery</p>") -> Path:
    d = run / "val_gallery"
    d.mkdir(exist_ok=True)
    page = d / f"step_{step:06d}.html"
    page.write_text(f"<!DOCTYPE html><html><body>Validation gallery {body}</body></html>")
    return page


def _cli(*args: str, timeout: float = 120, preexec: Callable[[], None] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "vlmrl.report", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=timeout,
        preexec_fn=preexec,
    )


# ---------------------------------------------------------------- 1. exporter: idle connections, timeouts, a cap


def test_prometheus_idle_connections_are_capped_closed_at_once_and_a_scrape_still_answers(tmp_path: Path) -> None:
    """1020 idle connections used to hold 1020 threads and files of the driver: now at most ``max_connections``
    (default 16) are served at once, the others are closed at once, and the endpoint answers once they go."""
    exp = PrometheusExporter("127.0.0.1", 0, "p", "e", str(_token_file(tmp_path)))  # the defaults
    flood: list[socket.socket] = []
    try:
        exp.publish({"reward/mean": 0.5}, step=3)
        url = f"http://127.0.0.1:{exp.port}/metrics"
        before = threading.active_count()
        for _ in range(100):
            flood.append(socket.create_connection(("127.0.0.1", exp.port), timeout=5))
        closed = _closed_by_server(flood, wait=3.0, want=100 - 16)
        threads = threading.active_count() - before
        assert len(closed) >= 100 - 16 and threads <= 16, (
            f"{len(closed)} of 100 idle connections closed, {threads} more threads: at most 16 should be served"
        )
        # the token is checked before anything else: a request without it is answered at once, even while a step
        # is being published (the metrics lock held)
        for s in flood:
            s.close()
        with exp._lock:
            t0 = time.monotonic()
            assert _get_eventually(url)[0] == 401
            assert time.monotonic() - t0 < 5
        status, body = _get_eventually(url, TOKEN)
        assert status == 200 and b"vlmrl_reward_mean" in body
    finally:
        for s in flood:
            s.close()
        exp.close()


def test_prometheus_a_silent_or_slow_connection_is_closed_after_the_timeout(tmp_path: Path) -> None:
    exp = PrometheusExporter("127.0.0.1", 0, "p", "e", request_timeout_s=1.0, max_connections=4)
    try:
        t0 = time.monotonic()
        idle = socket.create_connection(("127.0.0.1", exp.port), timeout=5)
        assert _closed_by_server([idle], wait=5.0, want=1), "an idle connection was not closed"
        assert 0.8 < time.monotonic() - t0 < 3.0, time.monotonic() - t0
        idle.close()
        # a client that trickles its headers (each read within the timeout) is closed at the deadline too
        slow = socket.create_connection(("127.0.0.1", exp.port), timeout=5)
        t0, gone = time.monotonic(), False
        try:
            slow.sendall(b"GET /metrics HTTP/1.1\r\n")
            while time.monotonic() - t0 < 5 and not gone:
                slow.sendall(b"X-Slow: 1\r\n")
                gone = bool(_closed_by_server([slow], wait=0.2, want=1))
        except OSError:  # reset or broken pipe: closed by the server
            gone = True
        assert gone and time.monotonic() - t0 < 3.0, time.monotonic() - t0
        slow.close()
        exp.publish({"reward/mean": 1.0, "huge": 10**400}, step=1)  # an integer beyond float: skipped, no crash
        status, body = _get_eventually(f"http://127.0.0.1:{exp.port}/metrics")
        assert status == 200 and b"vlmrl_reward_mean" in body and b"vlmrl_huge" not in body
    finally:
        exp.close()


# ------------------------------------------------------------------------------------------- 2. the token file


def test_prometheus_token_file_writable_by_others_or_too_short_is_refused(tmp_path: Path) -> None:
    for mode in (0o666, 0o620, 0o602):
        f = _token_file(tmp_path, mode=mode, name=f"token_{mode:o}")
        with pytest.raises(ValueError, match=r"can be written by other users .*chmod 600") as e:
            PrometheusExporter("0.0.0.0", 0, "p", "e", str(f))
        assert str(f) in str(e.value)
    for short in ("x", "s3cret", "y" * 15):
        f = _token_file(tmp_path, text=short, name=f"short_{len(short)}")
        with pytest.raises(ValueError, match=r"too short.*at least 16 characters") as e:
            PrometheusExporter("0.0.0.0", 0, "p", "e", str(f))
        assert str(f) in str(e.value)
    f = _token_file(tmp_path, text="two\nlines-of-a-secret", name="two_lines")
    with pytest.raises(ValueError, match="one line"):
        PrometheusExporter("0.0.0.0", 0, "p", "e", str(f))
    f = _token_file(tmp_path, text="z" * 16, mode=0o644, name="ok")  # readable by others, writable by its owner only
    exp = PrometheusExporter("127.0.0.1", 0, "p", "e", str(f))
    try:
        assert _get(f"http://127.0.0.1:{exp.port}/metrics", "z" * 16)[0] == 200
        assert _get(f"http://127.0.0.1:{exp.port}/metrics", "z" * 15)[0] == 401
    finally:
        exp.close()


def test_prometheus_token_file_that_is_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "token_fifo"
    os.mkfifo(fifo, 0o600)

    def start() -> None:
        PrometheusExporter("0.0.0.0", 0, "p", "e", str(fifo)).close()

    with pytest.raises(ValueError, match="not a regular file"):
        _without_blocking(start, fifo, timeout=10)


# --------------------------------------------------------------------------------- 3. what the report reads


def test_report_does_not_embed_a_gallery_page_symlinked_outside_the_run(tmp_path: Path) -> None:
    run = _run(tmp_path)
    _gallery(run, 1)
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET-1234")
    (run / "val_gallery" / "step_000099.html").symlink_to(secret)
    text = build_report([run], tmp_path / "out" / "report.html").read_text()
    assert "TOPSECRET" not in text
    assert "step_000099.html" in text and "outside the run folder" in text  # a notice names it
    assert "real gallery" in text  # the newest page that may be read is shown instead


def test_report_refuses_a_metrics_file_that_leads_outside_the_run_or_is_not_a_file(tmp_path: Path) -> None:
    outside = _run(tmp_path, name="elsewhere") / "metrics.jsonl"
    for i, target in enumerate([outside, Path("/dev/zero")]):
        run = tmp_path / f"run{i}"
        run.mkdir()
        (run / "metrics.jsonl").symlink_to(target)
        with pytest.raises(ValueError, match=r"metrics\.jsonl leads outside the run folder"):
            load_run(run)
    run = tmp_path / "fifo_run"
    run.mkdir()
    os.mkfifo(run / "metrics.jsonl")
    with pytest.raises(ValueError, match=r"metrics\.jsonl is not a regular file"):
        _without_blocking(lambda: load_run(run), run / "metrics.jsonl", timeout=10)
    # the CLI: exit 2 and one line
    proc = _cli(str(tmp_path / "run0"), "-o", str(tmp_path / "r.html"))
    assert proc.returncode == 2 and "leads outside the run folder" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "r.html").exists()


def test_report_does_not_block_on_a_gallery_page_that_is_a_fifo(tmp_path: Path) -> None:
    run = _run(tmp_path)
    _gallery(run, 1)
    fifo = run / "val_gallery" / "step_000099.html"
    os.mkfifo(fifo)
    out = _without_blocking(lambda: build_report([run], tmp_path / "report.html"), fifo)
    text = out.read_text()
    assert "step_000099.html is not a regular file" in text and "real gallery" in text


def test_report_skips_files_over_the_size_cap_with_a_notice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("vlmrl.report.data.MAX_GALLERY_BYTES", 2000)
    monkeypatch.setattr("vlmrl.report.data.MAX_METRICS_BYTES", 300)
    run = _run(tmp_path, rows=[{"step": s, "reward/mean": 0.5} for s in range(40)])  # ~1.3 kB
    _gallery(run, 1)
    _gallery(run, 2, "HUGE" + "x" * 5000)
    text = build_report([run], tmp_path / "report.html").read_text()
    assert "HUGE" not in text and "step_000002.html is 5" in text and "real gallery" in text
    data = load_run(run)
    assert 0 < len(data.rows) < 40 and any("over the report's cap" in n for n in data.notices), data.notices


def test_report_cli_gallery_symlinked_to_dev_zero_is_not_read(tmp_path: Path) -> None:
    """Run under a 1 GiB address-space limit, so that reading /dev/zero ends in MemoryError rather than in a
    machine out of memory."""
    import resource

    run = _run(tmp_path, rows=[{"step": 1}])  # no panel data: nothing is drawn
    (run / "val_gallery").mkdir()
    (run / "val_gallery" / "step_000099.html").symlink_to("/dev/zero")

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    proc = _cli(str(run), "-o", str(tmp_path / "r.html"), timeout=120, preexec=limit)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "step_000099.html leads outside the run folder" in proc.stderr
    assert "step_000099.html" in (tmp_path / "r.html").read_text()


# -------------------------------------------------------------------- 4. text, values and lines that crashed it


def test_report_draws_data_sources_and_run_names_with_dollar_signs(tmp_path: Path) -> None:
    keys = ["reward/source/cost $\\notacommand{x}$/mean", "reward/source/$^$/mean"]
    run = _run(tmp_path, rows=[{"step": s, "reward/mean": 0.5, keys[0]: 0.1 * s, keys[1]: 0.2} for s in (1, 2, 3)])
    other = _run(tmp_path, name="other")
    out = build_report([run, other], tmp_path / "report.html", labels=["a $x^$ run", "b"])
    text = out.read_text()
    assert "cost $\\notacommand{x}$" in text and "a $x^$ run" in text  # the page shows the names as they are
    import matplotlib.pyplot as plt

    from vlmrl.report.panels import PANELS, draw

    reward = next(p for p in PANELS if p.name == "reward")
    fig = draw(reward, [load_run(run)])
    try:
        fig.canvas.draw()  # mathtext would fail here
        labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    finally:
        plt.close(fig)
    assert "reward/source/cost \\$\\notacommand{x}\\$/mean" in labels, labels  # escaped: shown literally


def test_report_skips_and_counts_values_that_are_not_numbers(tmp_path: Path) -> None:
    bad = ["fast", [1.0], None, True, {"s": 1}, "NaN"]
    rows = [{"step": 0, "timing/step_s": 2.0, "timing/rollout_s": 1.0}]
    rows += [{"step": i + 1, "timing/step_s": v, "timing/rollout_s": v, "reward/mean": 0.5} for i, v in enumerate(bad)]
    rows += [
        {"step": 10 + s, "timing/step_s": 2.0, "timing/rollout_s": 1.5, "timing/update_s": "slow"} for s in range(6)
    ]
    run = _run(
        tmp_path,
        rows=rows,
        lines=[
            '{"step": 20, "timing/step_s": NaN, "timing/push_s": Infinity}',
            '{"step": 21, "reward/mean": ' + "9" * 400 + "}",
        ],
    )
    # straight from the rows (the end-of-run health check, a caller's own rows): no crash
    check_health(rows)
    data = load_run(run)
    expected = 2 * len(bad) + 6 + 2 + 1  # the bad pairs, six "slow", NaN and Infinity timings, a 400-digit integer
    assert data.bad_values == expected, data.bad_values
    assert any(f"{expected} value(s) skipped" in n for n in data.notices), data.notices
    text = build_report([run], tmp_path / "report.html").read_text()
    assert "panel-step_time" in text and f"{expected} value(s) skipped" in text
    assert "no data: no run logged timing/step_s" not in text
    proc = _cli(str(run), "-o", str(tmp_path / "cli.html"))
    assert proc.returncode == 0 and f"{expected} value(s) skipped" in proc.stderr, proc.stderr[-2000:]


def test_report_skips_and_counts_json_lines_nested_too_deep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    run = _run(
        tmp_path,
        lines=[deep, '{"step": 7, "x": ' + deep + "}", "1" * 5000, '{"step": true}', '{"step": 4, "reward/mean": 0.4}'],
    )
    data = load_run(run)
    assert [r["step"] for r in data.rows] == [1, 2, 3, 4] and data.skipped_lines == 4
    text = build_report([run], tmp_path / "report.html").read_text()
    assert "<td>1\u20134</td><td>4</td>" in text and "4 line(s) skipped" in text
    # a line over the length cap is skipped without being parsed; the lines after it are read
    monkeypatch.setattr("vlmrl.report.data.MAX_LINE_BYTES", 1000)
    with open(run / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 5, "pad": "x" * 5000}) + "\n" + json.dumps({"step": 6}) + "\n")
    data = load_run(run)
    assert [r["step"] for r in data.rows] == [1, 2, 3, 4, 6] and data.skipped_lines == 5


# -------------------------------------------------------------------------- 5. never write over an input


def test_report_refuses_to_write_over_a_file_it_reads(tmp_path: Path) -> None:
    run = _run(tmp_path)
    page = _gallery(run, 1)
    metrics = (run / "metrics.jsonl").read_bytes()
    proc = _cli(str(run), "--output", str(run / "metrics.jsonl"))
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert len(proc.stderr.strip().splitlines()) == 1 and "metrics.jsonl" in proc.stderr, proc.stderr
    assert (run / "metrics.jsonl").read_bytes() == metrics
    link = tmp_path / "link.html"
    link.symlink_to(run / "metrics.jsonl")
    for target in (page, link, run / "sub" / ".." / "metrics.jsonl"):
        with pytest.raises(ValueError, match="which the report reads"):
            build_report([run], target)
    with pytest.raises(ValueError, match="is a folder"):
        build_report([run], run)
    assert (run / "metrics.jsonl").read_bytes() == metrics and "real gallery" in page.read_text()


def test_the_end_of_run_curve_skips_lines_it_cannot_read(tmp_path: Path) -> None:
    """The reward curve drawn at the end of every run (vlmrl.trainer.tracking) reads the metrics file as the report
    does: a line nested too deep, a number too long, a row without a step or a list are skipped, not a crash."""
    from vlmrl.trainer.tracking import ascii_curve, plot_curve, read_metrics

    path = tmp_path / "metrics.jsonl"
    lines = [
        json.dumps({"step": 1, "reward/mean": 0.5}),
        "[" * 100000,
        '{"step": 2, "reward/mean": ' + "9" * 5000 + "}",
        json.dumps({"reward/mean": 0.7}),
        json.dumps([1, 2]),
        json.dumps({"step": 3, "reward/mean": 0.9}),
    ]
    path.write_text("\n".join(lines) + "\n")
    assert [r["step"] for r in read_metrics(path) if "step" in r] == [1, 3]
    assert plot_curve(path, tmp_path / "curve.png").exists()
    assert "0.9" in ascii_curve(path)
