"""The ``vlmrl`` console script (``vlmrl train|report|export|analyze``), installed by pip next to the ``python -m``
forms: it dispatches to the same code, and ``analyze`` prints a run's metrics as the docs users copy show."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from vlmrl.cli import main

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(sys.executable).parent / "vlmrl"


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    rows = [
        {
            "step": s,
            "reward/mean": s / 10,
            "response_length/mean": 20.0 - s,
            "timing/step_s": 0.5,
            "val/reward/mean": 0.1 * s,
        }
        for s in range(1, 6)
    ]
    rows[2].pop("response_length/mean")
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def test_the_console_script_is_installed_and_dispatches(run_dir: Path) -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["vlmrl"] == "vlmrl.cli:main"
    assert SCRIPT.is_file(), f"{SCRIPT}: pip did not install the console script (scripts/install.sh)"
    out = subprocess.run(
        [str(SCRIPT), "analyze", "--log-dir", str(run_dir), "--metric", "reward/mean"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and "reward/mean: first 0.1, last 0.5" in out.stdout, out.stdout + out.stderr
    missing = subprocess.run(
        [str(SCRIPT), "report", str(run_dir / "nope")], capture_output=True, text=True, timeout=120
    )
    assert missing.returncode == 2 and "vlmrl.report:" in missing.stderr and "no metrics.jsonl" in missing.stderr
    usage = subprocess.run([str(SCRIPT), "train", "--help"], capture_output=True, text=True, timeout=120)
    assert usage.returncode == 0 and "usage: python -m vlmrl.train" in usage.stdout
    bad = subprocess.run([str(SCRIPT), "trian"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "unknown command 'trian'" in bad.stderr


def test_analyze_prints_the_metrics_per_step_and_a_summary(run_dir: Path, capsys) -> None:
    assert main(["analyze", "--log-dir", str(run_dir), "--metric", "reward/mean,length_mean", "--every", "2"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == ["step", "reward/mean", "response_length/mean"]  # a unique ending found the name
    assert [ln.split()[0] for ln in lines[1:4]] == ["1", "3", "5"]  # every 2nd step, and the last
    assert lines[2].split() == ["3", "0.3", "-"]  # not logged at that step
    assert "response_length/mean: first 19, last 15, min 15, max 19, mean 17, steps 4" in out


def test_analyze_json_and_listing(run_dir: Path, capsys) -> None:
    assert main(["analyze", "--log-dir", str(run_dir), "--metric", "timing/step_s", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["step"] for r in data["rows"]] == [1, 2, 3, 4, 5] and data["summary"]["timing/step_s"]["mean"] == 0.5
    assert main(["analyze", "--log-dir", str(run_dir)]) == 0
    listing = capsys.readouterr().out
    assert "5 logged step(s)" in listing and "  response_length/mean (4)" in listing


@pytest.mark.parametrize(
    "metric,message",
    [
        ("rewrd/mean", "not logged by this run; did you mean reward/mean"),
        ("mean", "is ambiguous"),
        (",", "names no metric"),
        (" , ,", "names no metric"),
    ],
)
def test_analyze_names_a_wrong_metric(run_dir: Path, capsys, metric: str, message: str) -> None:
    assert main(["analyze", "--log-dir", str(run_dir), "--metric", metric]) == 2
    assert message in capsys.readouterr().err


def test_analyze_json_is_strict_json_when_values_are_not_finite(tmp_path: Path, capsys) -> None:
    """NaN and overflowed values print as null (JSON has no NaN or Infinity; Python's default would write them)."""
    rows = [{"step": 1, "loss": float("nan")}, {"step": 2, "loss": float("inf")}, {"step": 3, "loss": 1e308}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["analyze", "--log-dir", str(tmp_path), "--metric", "loss", "--json"]) == 0
    out = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"non-standard JSON {c}"))
    assert [r["loss"] for r in out["rows"]] == [None, None, 1e308] and out["summary"]["loss"]["steps"] == 1


def test_analyze_a_missing_run(tmp_path: Path, capsys) -> None:
    assert main(["analyze", "--log-dir", str(tmp_path / "none")]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err


@pytest.fixture
def validated_run(tmp_path: Path) -> Path:
    """A run that validated: each training metric has its val/ twin, as the length-aware tutorial's run logs them."""
    rows = []
    for s in range(1, 11):
        row = {
            "step": s,
            "reward/mean": s / 10,
            "response_length/mean": 30.0 - s,
            "reward/length_penalty/mean": -s / 20,
        }
        if s % 5 == 0:
            row |= {
                "val/reward/mean": s / 12,
                "val/response_length/mean": 28.0 - s,
                "val/reward/length_penalty/mean": -s / 25,
            }
        rows.append(row)
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def test_the_tutorials_analyze_line_works_on_a_validated_run_and_plots(validated_run: Path, capsys) -> None:
    """``--metric length_mean,length_penalty_mean,reward_mean`` on a run that validated: ``reward_mean`` is exactly
    ``reward/mean`` (``/`` and ``_`` read alike), the endings mean the training metrics over their ``val/`` twins;
    ``--plot`` writes one panel a metric, an image that opens."""
    from PIL import Image

    png = validated_run / "chart.png"
    args = ["analyze", "--log-dir", str(validated_run), "--metric", "length_mean,length_penalty_mean,reward_mean"]
    assert main([*args, "--plot", str(png)]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[0].split() == ["step", "response_length/mean", "reward/length_penalty/mean", "reward/mean"]
    assert "reward/mean: first 0.1, last 1, min 0.1, max 1" in out and f"wrote {png}" in err
    with Image.open(png) as im:
        assert im.format == "PNG" and im.size[0] >= 600 and im.size[1] >= 3 * 200, im.size  # three panels
    assert main(["analyze", "--log-dir", str(validated_run), "--metric", "val/reward/mean"]) == 0
    assert "val/reward/mean: first 0.4167, last 0.8333" in capsys.readouterr().out
