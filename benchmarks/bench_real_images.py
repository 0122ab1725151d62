"""Learning on real images: ``bash examples/real_images_cpu.sh`` as a user runs it, per model size and seed.

    python benchmarks/bench_real_images.py [--sizes tiny] [--seeds 1,2,3]
    python benchmarks/bench_real_images.py --sizes 20m --seeds 1
    python benchmarks/bench_real_images.py --quick     # tiny, one seed, 10 GRPO steps; writes nothing under results/

Each run is the script, unchanged but for ``MODEL_SIZE`` and the GRPO run's seed (``trainer.seed`` and
``data.seed``, Hydra overrides a user passes the same way), in a fresh output folder: scikit-learn's handwritten
digits (``preprocess/digits.py``: 200 labelled scans, 1,237 training prompts, 360 held out), the supervised warm
start on the labelled 200 (the same model for every seed of a size: its seed is the script's), then 100 GRPO steps
with the greedy held-out accuracy before the first step (the warm start's) and every 25. The script's parts are
timed from its own commands (``common.traced_env``). Per run: the accuracy curve, the gain over the warm start, the
warm start's and the training's seconds, the median step. Each run holds the CPU lock and is repeated once when
other processes took over 10 % of the CPU. Writes ``benchmarks/results/real_images.json`` (the runs of the sizes
given; those of a size not given are kept from the file) and the ``## Real images`` section of benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

SECTION = "Real images"
SCRIPT = "examples/real_images_cpu.sh"
PARTS = (
    ("install_check", "bash scripts/install.sh"),
    ("model", "ensure_tiny_model"),
    ("data", "preprocess/digits.py"),
    ("warm_start", "-m vlmrl.testing.warm_start"),
    ("train", "-m vlmrl.train"),
    ("curve", "-m vlmrl.trainer.tracking"),
    ("report", "-m vlmrl.report"),
)
"""The script's parts, each starting at the first traced command containing its marker, in script order."""
UNSET = ("SMOKE", "OUT", "MODEL_SIZE", "VLMRL_DRY_RUN", "RAY_ADDRESS", "VLMRL_VENV", "BASH_ENV", "PYTHONPATH")
"""Environment variables of the calling shell the runs do not inherit (they would change what the script does)."""


def one_run(size: str, seed: int, work: Path, overrides: list[str]) -> dict[str, Any]:
    """One run of the script at ``size`` with GRPO seed ``seed``; its figures."""
    base = work / f"{size}_seed{seed}"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    out, trace = base / "out", base / "trace.txt"
    env = {k: v for k, v in os.environ.items() if k not in UNSET}
    env.update(OUT=str(out), MODEL_SIZE=size, RAY_TMPDIR=tempfile.mkdtemp(prefix="vlmrl-bench-ray-"))
    cmd = ["bash", SCRIPT, f"trainer.seed={seed}", f"data.seed={seed}", *overrides]
    run = common.run_locked(
        cmd, env=common.traced_env(env, trace), log=base / "script.log", timeout_s=3600, what=f"{size} seed {seed}"
    )
    log = Path(run["log"]).read_text(errors="replace")
    if run["returncode"] != 0:
        raise RuntimeError(f"{SCRIPT} failed (exit {run['returncode']}); log {run['log']}:\n{log[-4000:]}")
    parts = common.script_phases(trace, PARTS, run["started_epoch"], run["started_epoch"] + run["wall_s"])
    rows = common.read_jsonl(out / "metrics.jsonl")
    train = [r for r in rows if r.get("step", 0) > 0 and "timing/step_s" in r]
    val = {str(int(r["step"])): float(r["val/reward/mean"]) for r in rows if "val/reward/mean" in r}
    warm = json.loads((out / "warm" / "vlmrl_warm_start.json").read_text())
    return {
        "size": size,
        "seed": seed,
        "params": common.safetensors_params(out / "warm"),
        "wall_s": run["wall_s"],
        "parts_s": parts,
        "warm_start_loss": [warm.get("first_loss"), warm.get("loss")],
        "steps": int(train[-1]["step"]),
        "step_s": common.median([float(r["timing/step_s"]) for r in train]),
        "train_s": sum(float(r["timing/step_s"]) for r in train),
        "val": val,
        "warm_start_accuracy": val["0"],
        "final_accuracy": val[max(val, key=int)],
        "best_accuracy": max(val.values()),
        "gain": val[max(val, key=int)] - val["0"],
        "reward_last10": sum(float(r["reward/mean"]) for r in train[-10:]) / len(train[-10:]),
        "foreign_cpu_frac": run["foreign_cpu_frac"],
    }


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per size: median, min and max over its seeds of the accuracies, the gain and the times."""
    out: dict[str, Any] = {}
    for size in sorted({r["size"] for r in runs}):
        rs = [r for r in runs if r["size"] == size]
        keys = ("warm_start_accuracy", "final_accuracy", "gain", "step_s", "train_s", "wall_s")
        out[size] = {k: common.spread([r[k] for r in rs]) for k in keys}
        out[size]["warm_start_s"] = common.spread([r["parts_s"].get("warm_start") for r in rs])
        out[size]["params"] = rs[0]["params"]
        out[size]["seeds"] = [r["seed"] for r in rs]
    return out


def markdown(res: dict[str, Any]) -> str:
    """The benchmarks/README.md section."""
    lines = [
        f"`python benchmarks/bench_real_images.py` ({res['date']}). `bash {SCRIPT}` as a user runs it, with "
        "`MODEL_SIZE` and the GRPO run's seed set: scikit-learn's handwritten digits (real scans), a supervised warm "
        "start on 200 labelled ones, then 100 GRPO steps on 1,237 others; the greedy accuracy on 360 held-out scans "
        "before the first step (the warm start's) and every 25 steps.",
        "",
    ]
    header = ["size (parameters)", "seed", "held-out accuracy at 0 / 25 / 50 / 75 / 100", "gain", "warm start s"]
    header += ["training s (s/step)", "script s", "CPU used by others"]
    rows = []
    for r in res["runs"]:
        curve = " / ".join(f"{r['val'][k]:.3f}" for k in sorted(r["val"], key=int))
        rows.append(
            [
                f"{r['size']} ({r['params'] / 1e6:.1f} M)",
                str(r["seed"]),
                curve,
                f"{r['gain']:+.3f}",
                f"{r['parts_s'].get('warm_start', 0):.0f}",
                f"{r['train_s']:.0f} ({r['step_s']:.2f})",
                f"{r['wall_s']:.0f}",
                f"{r['foreign_cpu_frac']:.0%}",
            ]
        )
    lines += [common.table(header, rows), "", common.machine_line(res)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the script per size and seed, write the results and the README section."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="tiny", help="comma list of vlmrl.testing.tiny presets")
    p.add_argument("--seeds", default="1,2,3", help="comma list of GRPO seeds")
    p.add_argument("--retries", type=int, default=1, help="repeat a run during which others used > 10%% of the CPU")
    p.add_argument("--quick", action="store_true", help="tiny, one seed, 10 steps; results only under --work")
    p.add_argument("--work", type=Path, default=common.ROOT / ".cache" / "bench" / "real_images")
    p.add_argument("overrides", nargs="*", help="Hydra overrides passed to the script (changes what is measured)")
    a = p.parse_args(argv)
    sizes = ["tiny"] if a.quick else [s for s in a.sizes.split(",") if s]
    seeds = [1] if a.quick else [int(s) for s in a.seeds.split(",") if s]
    overrides = ["trainer.total_training_steps=10", "trainer.test_freq=5"] if a.quick else a.overrides
    runs = []
    for size in sizes:
        for seed in seeds:
            r = common.uncontended(
                lambda size=size, seed=seed: one_run(size, seed, a.work, overrides), f"{size} seed {seed}", a.retries
            )
            runs.append(r)
            print(
                f"[bench_real_images] {size} seed {seed}: held-out accuracy {r['val']} (gain {r['gain']:+.3f}), "
                f"warm start {r['parts_s'].get('warm_start', 0):.0f} s, training {r['train_s']:.0f} s",
                flush=True,
            )
    check = a.work if a.quick or a.overrides else None
    previous = common.RESULTS / "real_images.json"
    if check is None and previous.exists():  # the sizes not run now keep their runs
        runs = [r for r in json.loads(previous.read_text())["runs"] if r["size"] not in sizes] + runs
    res = {
        **common.result_head("real_images"),
        "config": {"sizes": sizes, "seeds": seeds, "script": SCRIPT, "overrides": overrides, "retries": a.retries},
        "runs": runs,
        "summary": summarise(runs),
    }
    common.publish("real_images", SECTION, res, markdown(res), check)
    return res


if __name__ == "__main__":
    main()
