"""The CPU quick start as a user runs it: ``bash examples/quickstart_cpu.sh``, timed by part, and what it learns.

    python benchmarks/bench_quickstart.py [--runs 3] [--retries 1]
    python benchmarks/bench_quickstart.py --quick      # one smoke-mode run (SMOKE=1); writes nothing under results/

Each run is the script itself, unchanged, in a fresh output folder (``OUT``) and, unless ``--reuse-cache``, a fresh
model cache (``VLMRL_CACHE``: the tiny model is built as on a user's first run); the virtual environment is the
checkout's ``.venv`` (the script's install check finds it installed). The script's own commands are traced with
their start times (``common.traced_env``: bash's ``set -x`` through ``BASH_ENV``, into a separate file) to split
its wall time into the install check, the tiny model, the data, training (start-up, validations and steps), the
reward curve and the report. From ``metrics.jsonl``: the median ``timing/step_s``, greedy validation before
training and at each validation, the first step where the 5-step mean training reward reaches 0.9 and the seconds
of training (the steps' ``timing/step_s``) to it. Also the tiny model's size on disk and parameter count.

Each run holds the shared CPU lock (``$VLMRL_CPU_LOCK``); a run during which other processes used more than 10 % of
the machine is repeated (``--retries``). Writes ``benchmarks/results/quickstart.json`` (per run, and median / min
/ max over the runs) and the ``## Quick start`` section of ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

SECTION = "Quick start"
SCRIPT = "examples/quickstart_cpu.sh"
PARTS = (
    ("install_check", "bash scripts/install.sh"),
    ("model", "ensure_tiny_model"),
    ("data", "preprocess/synthetic.py"),
    ("train", "-m vlmrl.train"),
    ("curve", "-m vlmrl.trainer.tracking"),
    ("report", "-m vlmrl.report"),
)
"""The script's parts, each starting at the first traced command containing its marker, in script order."""
UNSET = ("SMOKE", "OUT", "VLMRL_DRY_RUN", "RAY_ADDRESS", "VLMRL_VENV", "VLMRL_CACHE", "BASH_ENV", "PYTHONPATH")
"""Environment variables of the calling shell the runs do not inherit (they would change what the script does)."""


def hit_and_seconds(rows: list[dict[str, Any]], window: int = 5, threshold: float = 0.9) -> tuple[int | None, Any]:
    """First step where the ``window``-step mean training reward reaches ``threshold`` and the training seconds to
    it (the sum of ``timing/step_s`` over steps 1..hit); (None, None) when it never does."""
    train = [r for r in rows if r.get("step", 0) > 0 and "reward/mean" in r]
    hit = common.moving_average_hit([r["reward/mean"] for r in train], window, threshold)
    if hit is None:
        return None, None
    return int(train[hit - 1]["step"]), sum(float(r.get("timing/step_s", 0.0)) for r in train[:hit])


def step_numbers(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures a run's ``metrics.jsonl`` gives: steps, step time, training seconds, validation, the 0.9 mark."""
    train = [r for r in rows if r.get("step", 0) > 0 and "timing/step_s" in r]
    if not train:
        raise RuntimeError("metrics.jsonl has no training step")
    hit, hit_s = hit_and_seconds(rows)
    return {
        "steps": int(train[-1]["step"]),
        "step_s": common.median([float(r["timing/step_s"]) for r in train]),
        "train_s": sum(float(r["timing/step_s"]) for r in train),
        "validate_s": sum(float(r.get("timing/validate_s", 0.0)) for r in rows if "val/reward/mean" in r),
        "val": {str(int(r["step"])): float(r["val/reward/mean"]) for r in rows if "val/reward/mean" in r},
        "hit_0.9_step": hit,
        "hit_0.9_train_s": hit_s,
        "reward_last10": sum(float(r["reward/mean"]) for r in train[-10:]) / len(train[-10:]),
    }


def run_env(out: Path, cache: Path, trace: Path, smoke: bool) -> dict[str, str]:
    """The environment of one run: the caller's, less what would change the script, with its own output folder,
    model cache, Ray temp dir and the trace."""
    env = {k: v for k, v in os.environ.items() if k not in UNSET}
    env.update(OUT=str(out), VLMRL_CACHE=str(cache), RAY_TMPDIR=tempfile.mkdtemp(prefix="vlmrl-bench-ray-"))
    if smoke:
        env["SMOKE"] = "1"
    return common.traced_env(env, trace)


def one_run(k: int, work: Path, smoke: bool, reuse_cache: bool, overrides: list[str]) -> dict[str, Any]:
    """One run of the script in a fresh folder; its figures."""
    base = work / f"run_{k}"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    out, trace = base / "out", base / "trace.txt"
    cache = work / "cache" if reuse_cache else base / "cache"
    env = run_env(out, cache, trace, smoke)
    cmd = ["bash", SCRIPT, *overrides]
    run = common.run_locked(cmd, env=env, log=base / "script.log", timeout_s=1800, what=f"quickstart run {k}")
    log = Path(run["log"]).read_text(errors="replace")
    if run["returncode"] != 0:
        raise RuntimeError(f"{SCRIPT} failed (exit {run['returncode']}); log {run['log']}:\n{log[-4000:]}")
    parts = common.script_phases(trace, PARTS, run["started_epoch"], run["started_epoch"] + run["wall_s"])
    m = re.search(r"\[quickstart\] tiny model: (\S+)", log)
    model = Path(m.group(1)) if m else None
    rows = common.read_jsonl(out / "metrics.jsonl")
    res: dict[str, Any] = {
        "run": k,
        "wall_s": run["wall_s"],
        "parts_s": parts,
        "after_install_check_s": run["wall_s"] - parts.get("install_check", 0.0),
        **step_numbers(rows),
        "model_bytes": common.dir_bytes(model) if model else None,
        "model_file_bytes": sum(f.stat().st_size for f in model.iterdir() if f.is_file()) if model else None,
        "model_params": common.safetensors_params(model) if model else None,
        "outputs": sorted(p.name for p in out.iterdir()),
        "foreign_cpu_frac": run["foreign_cpu_frac"],
    }
    res["train_other_s"] = parts.get("train", 0.0) - res["train_s"] - res["validate_s"]
    return res


SUMMARY_KEYS = (
    "wall_s",
    "after_install_check_s",
    "step_s",
    "train_s",
    "validate_s",
    "train_other_s",
    "hit_0.9_step",
    "hit_0.9_train_s",
    "reward_last10",
)


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median, min and max over the runs of every figure (and of each part and each validation)."""
    out = {key: common.spread([r[key] for r in runs]) for key in SUMMARY_KEYS}
    for part in {p for r in runs for p in r["parts_s"]}:
        out[f"parts_s/{part}"] = common.spread([r["parts_s"].get(part) for r in runs])
    for step in sorted({s for r in runs for s in r["val"]}, key=int):
        out[f"val/{step}"] = common.spread([r["val"].get(step) for r in runs])
    return out


def markdown(res: dict[str, Any]) -> str:
    """The benchmarks/README.md section."""
    c, s = res["config"], res["summary"]
    vsteps = sorted({st for r in res["runs"] for st in r["val"]}, key=int)
    lines = [
        f"`python benchmarks/bench_quickstart.py --runs {c['runs']}` ({res['date']}). `bash {SCRIPT}` as a user "
        f"runs it, {c['runs']} time(s), each in a fresh output folder"
        + ("" if c["reuse_cache"] else " with a fresh model cache (the tiny model built as on a first run)")
        + "; the install check finds `.venv` installed. The script's parts are timed from its own commands (bash's "
        "`set -x` with timestamps, through `BASH_ENV`, into a separate file). Training seconds: the sum of the "
        "steps' `timing/step_s`; start-up and the rest: the training command's time less the steps and "
        "validations.",
        "",
    ]
    header = ["run", "script s", "install check s", "model s", "data s", "training command s", "curve + report s"]
    header += ["s/step", "val " + " / ".join(vsteps), "5-step mean >= 0.9 at step (training s)", "CPU used by others"]
    rows = []
    for r in res["runs"]:
        p = r["parts_s"]
        hit = f"{r['hit_0.9_step']} ({r['hit_0.9_train_s']:.1f})" if r["hit_0.9_step"] else "not reached"
        rows.append(
            [
                str(r["run"]),
                f"{r['wall_s']:.1f}",
                f"{p.get('install_check', 0):.1f}",
                f"{p.get('model', 0):.1f}",
                f"{p.get('data', 0):.1f}",
                f"{p.get('train', 0):.1f}",
                f"{p.get('curve', 0) + p.get('report', 0):.1f}",
                f"{r['step_s']:.3f}",
                " / ".join(f"{r['val'].get(st, float('nan')):.2f}" for st in vsteps),
                hit,
                f"{r['foreign_cpu_frac']:.0%}",
            ]
        )

    def rng(key: str, fmt: str) -> str:
        v = s[key]
        if v["median"] is None:
            return "-"
        return f"{v['median']:{fmt}} ({v['min']:{fmt}}-{v['max']:{fmt}})"

    rows.append(
        [
            "**median (min-max)**",
            rng("wall_s", ".1f"),
            rng("parts_s/install_check", ".1f") if "parts_s/install_check" in s else "-",
            rng("parts_s/model", ".1f") if "parts_s/model" in s else "-",
            rng("parts_s/data", ".1f") if "parts_s/data" in s else "-",
            rng("parts_s/train", ".1f") if "parts_s/train" in s else "-",
            "",
            rng("step_s", ".3f"),
            " / ".join(rng(f"val/{st}", ".2f") for st in vsteps),
            f"{rng('hit_0.9_step', '.0f')}, {rng('hit_0.9_train_s', '.1f')} s",
            "",
        ]
    )
    lines.append(common.table(header, rows))
    r0 = res["runs"][0]
    lines += [
        "",
        f"Training command, median: {s['train_s']['median']:.1f} s of steps, {s['validate_s']['median']:.1f} s of "
        f"validation, {s['train_other_s']['median']:.1f} s start-up and the rest. The tiny model: "
        f"{r0['model_params']:,} parameters, {r0['model_bytes'] / 1e6:.2f} MB on disk.",
        "",
        common.machine_line(res),
        "Raw numbers: `benchmarks/results/quickstart.json`.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the script ``--runs`` times, write the results and the README section."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--retries", type=int, default=1, help="repeat a run during which others used > 10%% of the CPU")
    p.add_argument("--quick", action="store_true", help="one SMOKE=1 run; results only under --work")
    p.add_argument("--reuse-cache", action="store_true", help="build the tiny model once, not once per run")
    p.add_argument("--work", type=Path, default=common.ROOT / ".cache" / "bench" / "quickstart")
    p.add_argument("overrides", nargs="*", help="Hydra overrides passed to the script (changes what is measured)")
    a = p.parse_args(argv)
    runs_n = 1 if a.quick else a.runs
    runs = []
    for k in range(1, runs_n + 1):
        r = common.uncontended(
            lambda k=k: one_run(k, a.work, a.quick, a.reuse_cache, a.overrides), f"quickstart run {k}", a.retries
        )
        runs.append(r)
        print(
            f"[bench_quickstart] run {k}: script {r['wall_s']:.1f} s (install check "
            f"{r['parts_s'].get('install_check', 0):.1f} s), {r['step_s']:.3f} s/step, val {r['val']}, "
            f"5-step mean >= 0.9 at step {r['hit_0.9_step']} ({r['hit_0.9_train_s']} s of training)",
            flush=True,
        )
    res = {
        **common.result_head("quickstart"),
        "config": {
            "runs": runs_n,
            "script": SCRIPT,
            "smoke": a.quick,
            "reuse_cache": a.reuse_cache,
            "overrides": a.overrides,
            "retries": a.retries,
        },
        "runs": runs,
        "summary": summarise(runs),
    }
    common.publish("quickstart", SECTION, res, markdown(res), a.work if a.quick or a.overrides else None)
    return res


if __name__ == "__main__":
    main()
