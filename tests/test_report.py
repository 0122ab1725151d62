"""Observability on real runs: the HTML report (one run, two overlaid, a running job's partial file), its health
checks, the end-of-run health lines, and the live Prometheus exporter scraped during training."""

from __future__ import annotations

import base64
import io
import ipaddress
import json
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

import psutil
import pytest
from PIL import Image

from runs import ENV, Run, base_args, train_here_to_end, wait_for_step
from vlmrl.report import build_report, check_health, load_run
from vlmrl.report.data import ema
from vlmrl.report.panels import PANELS, draw
from vlmrl.trainer.prometheus import PrometheusExporter

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4", "data.max_response_length=8"]
PPO = [
    "algorithm.adv_estimator=gae",
    "algorithm.use_kl_in_reward=True",
    "algorithm.kl_ctrl.type=adaptive",
    "critic.optim.lr=1e-3",
]
PANEL_EXTRAS = [
    f"algorithm.name={ROOT / 'examples/algorithms/length_aware.py'}:LengthAware",
    "+algorithm.min_length=1",
    "+algorithm.max_length=100",
    "+algorithm.penalty=0.0",
    "algorithm.rollout_correction.rollout_is=token",
    "algorithm.rollout_correction.rollout_is_threshold=100.0",
]
"""Run A also logs the panels of an algorithm class (one that changes nothing: no penalty) and rollout correction
(weights near 1, never truncated)."""


def _scrape(url: str, token: str | None = None) -> dict[str, tuple[dict[str, str], float]]:
    from prometheus_client.parser import text_string_to_metric_families

    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    text = urllib.request.urlopen(req, timeout=10).read().decode()
    return {s.name: (s.labels, s.value) for fam in text_string_to_metric_families(text) for s in fam.samples}


@pytest.fixture(scope="module")
def runs(tiny_model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Two real runs: A (12 steps of PPO with a critic and the adaptive in-reward KL, KL loss on, an algorithm class
    and rollout correction, validation every 4, the Prometheus exporter on a free port, scraped while it trains)
    and B (3 steps of GRPO, another learning rate; one worker in this process with the HF rollout)."""
    base = tmp_path_factory.mktemp("report")
    data = base / "data"
    subprocess.run(
        [
            sys.executable,
            "preprocess/synthetic.py",
            "--output-dir",
            str(data),
            "--families",
            "colour",
            "--image-size",
            "56",
            "--train-size",
            "64",
            "--test-size",
            "8",
            "--seed",
            "0",
            "--no-progress",
        ],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )
    a, b = base / "lr_default", base / "lr_small"
    run = Run(
        base_args(
            tiny_model_dir,
            data,
            a,
            *SMALL,
            "trainer.total_training_steps=12",
            "trainer.test_freq=4",
            "trainer.logger=[console,jsonl,prometheus]",
            "trainer.prometheus.port=0",
            "trainer.project_name=obs",
            "trainer.experiment_name=lr_default",
            "actor_rollout_ref.actor.use_kl_loss=True",
            *PPO,
            *PANEL_EXTRAS,
        ),
        ENV,
    )
    try:
        url = None
        deadline = time.monotonic() + 300
        while url is None and time.monotonic() < deadline:
            m = re.search(r"Prometheus metrics at (http://127\.0\.0\.1:\d+/metrics)", run.output())
            url = m.group(1) if m else None
            assert run.proc.poll() is None, run.output()[-3000:]
            time.sleep(0.05)
        assert url, run.output()[-3000:]
        wait_for_step(run, a, 3, timeout=300)
        scraped = _scrape(url)
        sockets = [
            c
            for p in [psutil.Process(run.proc.pid)]
            for c in p.net_connections("tcp")
            if c.status == psutil.CONN_LISTEN
        ]
        rc, family, listened = run.wait_watching_listeners(timeout=300)
    finally:
        run.cleanup()
    assert rc == 0, run.output()[-3000:]
    with pytest.raises(urllib.error.URLError):  # the exporter stopped with the run
        urllib.request.urlopen(url, timeout=5)
    train_here_to_end(
        base_args(
            tiny_model_dir,
            data,
            b,
            *SMALL,
            "trainer.total_training_steps=3",
            "actor_rollout_ref.actor.optim.lr=1e-4",
            "trainer.launcher=inline",
            "actor_rollout_ref.rollout.name=hf",
        )
    )
    return {
        "a": a,
        "b": b,
        "log": run.output(),
        "scraped": scraped,
        "sockets": sockets,
        "family": family,
        "listened": listened,
    }


@pytest.mark.slow  # uses the two training runs of the ``runs`` fixture
def test_prometheus_publishes_the_step_metrics_live_on_loopback(runs: dict) -> None:
    scraped, rows = runs["scraped"], {r["step"]: r for r in load_run(runs["a"]).rows}
    labels, step = scraped["vlmrl_step"]
    assert labels == {"project": "obs", "experiment": "lr_default"}
    assert step >= 1 and int(step) in rows
    row = rows[int(step)]
    for key in (
        "reward/mean",
        "actor/entropy",
        "actor/kl_loss",
        "timing/step_s",
        "response_length/mean",
        "advantages/zero_variance_share",
        "perf/cpu_memory_rss_gb",
        "critic/vf_loss",
        "critic/vf_explained_var",
        "critic/lr",
        "reward/kl_penalty",
        "reward/kl_coef",
    ):
        name = "vlmrl_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)
        assert scraped[name][1] == pytest.approx(row[key], rel=1e-9, abs=1e-12), (key, scraped[name], row[key])
    last_val = [r for s, r in rows.items() if s <= step and "val/reward/mean" in r][-1]
    assert scraped["vlmrl_val_reward_mean"][1] == last_val["val/reward/mean"]  # kept between validations
    # the driver's listening sockets: loopback only (the exporter among them)
    assert runs["sockets"] and all(c.laddr.ip in ("127.0.0.1", "::1") for c in runs["sockets"]), runs["sockets"]
    # README, Security: a local run listens on loopback only: every process it started (the workers and their vLLM
    # engines, the process group, the reward pool, the exporter), read every 0.2 s while it trained
    assert len(runs["family"]) >= 3, "the driver and its two worker processes"
    exposed = {s for s in runs["listened"] if not ipaddress.ip_address(s[0]).is_loopback}
    assert runs["listened"] and not exposed, f"listening on a network interface: {sorted(exposed)}"


@pytest.mark.slow  # uses the two training runs of the ``runs`` fixture
def test_the_grafana_dashboard_queries_metrics_the_exporter_publishes(runs: dict) -> None:
    dash = json.loads((ROOT / "examples" / "grafana_dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    names = {re.match(r"(vlmrl_\w+)\{", e).group(1) for e in exprs}
    gpu_only = {"vlmrl_perf_max_memory_allocated_gb"}  # published by CUDA workers (vlmrl/workers/hybrid.py)
    assert gpu_only <= names and "perf/max_memory_allocated_gb" in (ROOT / "vlmrl/workers/hybrid.py").read_text()
    assert names - gpu_only <= set(runs["scraped"]), sorted(names - gpu_only - set(runs["scraped"]))
    assert all('experiment=~"$experiment"' in e for e in exprs)


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []
        self.srcs: list[str] = []
        self.links: list[str] = []
        self.tags: list[str] = []
        self.iframes: list[dict] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = dict(attrs)
        self.tags.append(tag)
        if "id" in a:
            self.ids.append(a["id"])
        for k in ("src", "href", "action", "data"):
            if k in a:
                (self.srcs if k == "src" else self.links).append(a[k])
        if tag == "iframe":
            self.iframes.append(a)


def _page(path: Path) -> _Page:
    p = _Page()
    p.feed(path.read_text())
    return p


@pytest.mark.slow  # uses the two training runs of the ``runs`` fixture
def test_a_report_of_one_run_has_every_panel_inline_and_opens_without_network(runs: dict, tmp_path: Path) -> None:
    out = build_report([runs["a"]], tmp_path / "report.html")
    page = _page(out)
    for panel in PANELS:  # run A logged every panel's metrics (memory: the workers' resident memory)
        assert f"panel-{panel.name}" in page.ids
        assert (tmp_path / "report_panels" / f"{panel.name}.png").is_file(), panel.name
    assert "no data" not in out.read_text()
    images = [s for s in page.srcs if s.startswith("data:image/png;base64,")]
    assert len(images) == len(PANELS) and len(page.srcs) == len(PANELS)  # nothing but inline images
    for s in images:
        Image.open(io.BytesIO(base64.b64decode(s.split(",", 1)[1]))).verify()
    assert not page.links and not {"script", "link", "object", "embed"} & set(page.tags)
    # the latest validation gallery, sandboxed, with its images inline
    (frame,) = page.iframes
    assert "sandbox" in frame and "Validation gallery" in frame["srcdoc"]
    assert "data:image/jpeg;base64," in frame["srcdoc"]
    assert "step 12" in frame["srcdoc"]
    assert "health" in page.ids


@pytest.mark.slow  # uses the two training runs of the ``runs`` fixture
def test_the_report_renders_in_a_headless_browser_without_network(runs: dict, tmp_path: Path) -> None:
    """Chromium (scripts/test.sh installs it where apt can) renders the page with every host unresolvable: the
    panels' pixels are on screen, so nothing the page shows comes from the network."""
    from vlmrl.report.browser import find_browser, screenshot

    if find_browser() is None:
        pytest.skip("no Chromium here (scripts/install_browser.sh installs it with root apt): parsing checks only")
    out = build_report([runs["a"]], tmp_path / "report.html")
    img = Image.open(screenshot(out, tmp_path / "shot.png", 1100, 2400)).convert("RGB")
    assert img.size == (1100, 2400)
    # matplotlib's first line colour (C0, #1f77b4: the reward curve, the entropy curve) drawn on the page
    import numpy as np

    px = np.asarray(img).astype(int)
    c0 = int((np.abs(px - np.array([31, 119, 180])) < 12).all(axis=-1).sum())
    assert c0 > 300, c0


@pytest.mark.slow  # uses the two training runs of the ``runs`` fixture
def test_two_runs_overlay_on_the_same_axes_with_a_legend(runs: dict, tmp_path: Path) -> None:
    out = build_report([runs["a"], runs["b"]], tmp_path / "both.html", labels=["lr 2e-3", "lr 1e-4"], smooth=0.6)
    text = out.read_text()
    assert "vlmrl report: lr 2e-3, lr 1e-4" in text and "smoothing 0.6" in text
    a, b = load_run(runs["a"], "lr 2e-3"), load_run(runs["b"], "lr 1e-4")
    reward = next(p for p in PANELS if p.name == "reward")
    import matplotlib.pyplot as plt

    fig = draw(reward, [a, b], smooth=0.6)
    plt.close(fig)
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert {"lr 2e-3: reward/mean", "lr 1e-4: reward/mean", "lr 2e-3: val/reward/mean"} <= set(labels), labels
    lines = {ln.get_label(): ln for ln in fig.axes[0].get_lines()}
    xs, ys = b.series("reward/mean")
    assert list(lines["lr 1e-4: reward/mean"].get_xdata()) == xs
    assert list(lines["lr 1e-4: reward/mean"].get_ydata()) == pytest.approx(ema(ys, 0.6))
    stages = next(p for p in PANELS if p.name == "step_time")
    fig = draw(stages, [a, b])
    plt.close(fig)
    bars = fig.axes[0]
    assert [t.get_text() for t in bars.get_xticklabels()] == ["lr 2e-3", "lr 1e-4"]  # one stacked bar per run
    assert "<td>lr 1e-4</td>" in text and len(_page(out).iframes) == 2


@pytest.mark.slow  # uses the two training runs of the ``runs`` fixture
def test_a_running_jobs_partial_last_line_and_a_resumed_step(runs: dict, tmp_path: Path) -> None:
    live = tmp_path / "live"
    live.mkdir()
    lines = (runs["a"] / "metrics.jsonl").read_text().splitlines()
    resumed = json.loads(lines[2])
    resumed["reward/mean"] = 0.123
    (live / "metrics.jsonl").write_text("\n".join(lines[:5] + [json.dumps(resumed), '{"step": 5, "reward/me']))
    run = load_run(live)
    assert [r["step"] for r in run.rows] == [0, 1, 2, 3, 4] and run.skipped_lines == 1
    assert run.rows[2]["reward/mean"] == 0.123  # the last line written for a step wins
    out = build_report([live], tmp_path / "r.html")
    assert "<td>0\u20134</td><td>5</td>" in out.read_text()


@pytest.mark.slow  # uses the two training runs of the ``runs`` fixture
def test_the_cli_writes_the_report_and_names_a_missing_run(runs: dict, tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "vlmrl.report",
        str(runs["a"]),
        str(runs["b"]),
        "-o",
        str(tmp_path / "x.html"),
        "--smooth",
        "0.5",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert f"report written to {tmp_path / 'x.html'}" in proc.stdout and "[lr_small] health:" in proc.stdout
    proc = subprocess.run(
        [sys.executable, "-m", "vlmrl.report", str(tmp_path / "nope")], capture_output=True, text=True, cwd=ROOT
    )
    assert proc.returncode == 2 and f"{tmp_path / 'nope'}: no metrics.jsonl" in proc.stderr


@pytest.mark.slow  # uses the two training runs of the ``runs`` fixture
def test_a_finished_run_prints_its_health(runs: dict) -> None:
    assert "[vlmrl] health:" in runs["log"]


# ------------------------------------------------------------------------------------------ health checks, unit


def _rows(n: int, **series: object) -> list[dict]:
    rows = []
    for i in range(n):
        r = {"step": i + 1, "timing/step_s": 1.0, "timing/rollout_s": 0.4, "timing/update_s": 0.4}
        for k, f in series.items():
            r[k] = f(i + 1) if callable(f) else f
        rows.append(r)
    return rows


def test_a_healthy_run_has_no_findings() -> None:
    rows = _rows(
        20,
        **{
            "actor/entropy": lambda s: 2.0 - s * 0.05,
            "reward/mean": lambda s: s / 25,
            "advantages/zero_variance_share": 0.2,
            "rollout/logprob_diff": 0.01,
        },
    )
    assert check_health(rows) == []


def test_each_health_check_names_its_metric_and_the_step_it_started() -> None:
    def at(found: list, check: str) -> tuple[str, int]:
        (f,) = [x for x in found if x.check == check]
        return f.metric, f.step

    rows = _rows(20, **{"actor/entropy": lambda s: 2.0 if s < 8 else 0.05, "reward/mean": lambda s: 0.5})
    assert at(check_health(rows), "entropy collapse") == ("actor/entropy", 8)
    rows = _rows(20, **{"reward/mean": lambda s: 0.0 if s >= 4 else 0.3})
    assert at(check_health(rows), "reward flat at 0") == ("reward/mean", 4)
    rows = _rows(20, **{"reward/mean": lambda s: 1.0 if s >= 12 else 0.5})
    found = check_health(rows)
    assert at(found, "reward flat at 1") == ("reward/mean", 12) and found[0].severity == "info"
    rows = _rows(20, **{"reward/mean": lambda s: 1.0 if s in (3, 4, 5, 6) else 0.5})  # 4 steps < the window of 5
    assert check_health(rows) == []
    # a zero gradient while the advantages were not zero: the loss reached no weight (issue 44 item 5); a zero
    # gradient on steps without advantages (every group scored alike) is not this finding
    rows = _rows(20, **{"actor/grad_norm": lambda s: 0.0 if s >= 3 else 0.4, "advantages/abs_mean": 0.3})
    assert at(check_health(rows), "no gradient") == ("actor/grad_norm", 3)
    rows = _rows(20, **{"actor/grad_norm": 0.0, "advantages/abs_mean": 0.0, "reward/mean": 0.5})
    assert "no gradient" not in [f.check for f in check_health(rows)]
    rows = _rows(20, **{"advantages/zero_variance_share": lambda s: 0.75 if s >= 6 else 0.1})
    assert at(check_health(rows), "groups without reward variance") == ("advantages/zero_variance_share", 6)
    # a spell at the start of a run that then learns (the quick start's first steps) is not a finding
    rows = _rows(
        20,
        **{
            "advantages/zero_variance_share": lambda s: 0.9 if s <= 8 else 0.1,
            "reward/mean": lambda s: 0.0 if s <= 8 else 0.5,
        },
    )
    assert check_health(rows) == []
    # ... nor is one at the end of a run that learned the task (every sample of most groups right)
    rows = _rows(
        20,
        **{
            "advantages/zero_variance_share": lambda s: 0.9 if s >= 14 else 0.1,
            "reward/mean": lambda s: 0.95 if s >= 14 else 0.5,
        },
    )
    assert check_health(rows) == []
    rows = _rows(20, **{"reward/mean": lambda s: 0.0 if s <= 10 else 0.5})  # half the run: a finding
    assert at(check_health(rows), "reward flat at 0") == ("reward/mean", 1)
    # PPO: a critic whose values explain nothing while the task is unlearned; none once it is learned (the returns
    # barely vary), and no zero-variance finding with a critic (GAE's advantages of equal rewards differ)
    rows = _rows(
        20,
        **{
            "critic/vf_explained_var": lambda s: -0.2 if s >= 7 else 0.3,
            "reward/mean": 0.4,
            "advantages/zero_variance_share": 0.9,
        },
    )
    assert at(check_health(rows), "critic explains nothing") == ("critic/vf_explained_var", 7)
    assert not [f for f in check_health(rows) if f.check == "groups without reward variance"]
    rows = _rows(
        20,
        **{
            "critic/vf_explained_var": lambda s: -0.2 if s >= 7 else 0.3,
            "reward/mean": lambda s: 0.95 if s >= 7 else 0.4,
        },
    )
    assert not [f for f in check_health(rows) if f.check == "critic explains nothing"]
    rows = _rows(20, **{"rollout/logprob_diff": lambda s: 0.3 if s >= 9 else 0.001})
    assert at(check_health(rows), "log-prob drift") == ("rollout/logprob_diff", 9)
    assert check_health(rows, drift_threshold=0.5) == []
    rows = _rows(
        20, **{"timing/push_s": lambda s: 0.0 if s < 5 else 0.7, "timing/rollout_s": 0.1, "timing/update_s": 0.1}
    )
    found = check_health(rows)
    assert at(found, "one stage dominates the step") == ("timing/push_s", 5) and "push" in found[0].message


def test_smoothing_is_debiased_and_bounded() -> None:
    assert ema([1.0, 2.0, 3.0], 0.0) == [1.0, 2.0, 3.0]
    assert ema([5.0, 5.0, 5.0], 0.9) == pytest.approx([5.0, 5.0, 5.0])  # no pull towards 0 at the start
    assert ema([0.0, 1.0], 0.5) == pytest.approx([0.0, 2 / 3])
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        ema([1.0], 1.0)


# ------------------------------------------------------------------------------------------- exporter, unit


def test_the_exporter_off_loopback_needs_a_token_and_checks_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="token_file"):
        PrometheusExporter("0.0.0.0", 0, "p", "e")
    token = tmp_path / "token"
    token.write_text("s3cret-s3cret-s3cret\n")
    exp = PrometheusExporter("0.0.0.0", 0, "p", "e", str(token))
    try:
        exp.publish({"reward/mean": 0.5, "bad": float("nan"), "text": "x"}, step=7)
        url = f"http://127.0.0.1:{exp.port}/metrics"
        for bad in (None, "wrong"):
            with pytest.raises(urllib.error.HTTPError) as e:
                _scrape(url, bad)
            assert e.value.code == 401
        got = _scrape(url, "s3cret-s3cret-s3cret")
        assert got["vlmrl_reward_mean"] == ({"project": "p", "experiment": "e"}, 0.5) and got["vlmrl_step"][1] == 7
        assert "vlmrl_bad" not in got and "vlmrl_text" not in got  # only finite numbers
        with pytest.raises(ValueError, match="another run may hold the port"):
            PrometheusExporter("127.0.0.1", exp.port, "p", "e")
    finally:
        exp.close()
    empty = tmp_path / "empty"
    empty.write_text("")
    with pytest.raises(ValueError, match="is empty"):
        PrometheusExporter("0.0.0.0", 0, "p", "e", str(empty))
    shutil.rmtree(tmp_path, ignore_errors=True)
