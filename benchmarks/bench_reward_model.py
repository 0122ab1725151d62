"""RL from a learned reward on CPU: train a tiny reward model, then GRPO whose only reward is that model, measured by
the rule check it never sees.

    python benchmarks/bench_reward_model.py [--rm-steps 600] [--rl-steps 160] [--seeds 0,1,2]

1. ``python -m vlmrl.reward_model.train`` on the colour task's records (512 train, 96 held out, 112 px; the tiny
   Qwen2.5-VL with a score head; candidate responses labelled by the rule): the Bradley–Terry loss, the held-out
   pair accuracy and the time.
2. ``python -m vlmrl.train --config-name tiny_cpu`` (the quick start's settings on the quick start's data) with
   ``reward.components=[{function: reward_model, name: rm, weight: 1}, {function: synthetic, name: rule, weight:
   0}]``: the reward is the model's score alone; the rule component is logged (weight 0) and, in greedy validation
   every 40 steps, says how many answers are right. The same run with the rule as the reward is the baseline. Each
   seed trains its own reward model and seeds both runs.

Writes ``benchmarks/results/reward_model.json`` and the ``## RL from a learned reward`` section of
benchmarks/README.md; ``--quick`` (a check: 1 seed, 100 + 20 steps) writes under a temporary folder only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

COMPONENTS = (
    "reward.components=[{function: reward_model, name: rm, weight: 1.0}, {function: synthetic, name: rule, "
    "weight: 0.0}]"
)


def validations(rows: list[dict[str, Any]], key: str) -> dict[int, float]:
    """Step -> the validation value of ``key`` (steps that validated)."""
    return {int(r["step"]): float(r[key]) for r in rows if key in r}


def one_seed(work: Path, model: Path, pairs: Path, data: Path, seed: int, rm_steps: int, rl_steps: int) -> dict:
    """One seed: the reward model trained with it, then GRPO on its score and GRPO on the rule."""
    rm_dir = work / f"rm_{seed}"
    cmd = [
        common.PY,
        "-m",
        "vlmrl.reward_model.train",
        "--model",
        str(model),
        "--data",
        str(pairs / "train.parquet"),
        "--val-data",
        str(pairs / "test.parquet"),
        "--output",
        str(rm_dir),
        "--steps",
        str(rm_steps),
        "--seed",
        str(seed),
    ]
    proc = subprocess.run(cmd, env=common.bench_env(1), capture_output=True, text=True, cwd=common.ROOT)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    trained = json.loads((rm_dir / "vlmrl_reward_model.json").read_text())
    val = [f"data.val_files={data / 'test.parquet'}", "trainer.test_freq=40", "trainer.val_before_train=true"]
    out: dict[str, Any] = {
        "reward_model_training": {
            k: trained[k] for k in ("first_loss", "loss", "heldout_pair_accuracy", "train_seconds")
        }
    }
    for name, extra in (
        (
            "reward_model",
            ["reward.function=null", "reward_model.enable=True", f"reward_model.model.path={rm_dir}", COMPONENTS],
        ),
        ("rule", []),
    ):
        run = common.vlmrl_train(
            work / f"{name}_{seed}", data, model, rl_steps, [*extra, *val, f"trainer.seed={seed}"], timeout_s=1800
        )
        rows = run["rows"]
        rule_key = "val/reward/rule/mean" if name == "reward_model" else "val/reward/mean"
        out[name] = {
            "val_rule": validations(rows, rule_key),
            "val_reward": validations(rows, "val/reward/mean"),
            "step_s_median": common.median([r["timing/step_s"] for r in rows if r.get("step", 0) > 1]),
            "reward_model_s_median": common.median(
                [r.get("timing/reward_model_s", 0.0) for r in rows if r.get("step", 0) > 1]
            ),
        }
    return out


def spread(values: list[float], fmt: str = ".2f") -> str:
    """``median`` or ``median [min-max]`` as the README writes it."""
    lo, mid, hi = (format(v, fmt) for v in (min(values), common.median(values), max(values)))
    return mid if lo == hi else f"{mid} [{lo}-{hi}]"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rm-steps", type=int, default=600)
    ap.add_argument("--rl-steps", type=int, default=160)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args(argv)
    seeds = [int(x) for x in a.seeds.split(",")]
    if a.quick:
        a.rm_steps, a.rl_steps, seeds = 100, 20, seeds[:1]
    work = Path(tempfile.mkdtemp(prefix="bench_rm_"))
    model = common.tiny_model()
    pairs = common.synthetic_data(work / "pairs", train=512, test=96, image_size=112)
    data = common.synthetic_data(work / "colour", train=4096, test=96, image_size=112)
    per_seed = {str(s): one_seed(work, model, pairs, data, s, a.rm_steps, a.rl_steps) for s in seeds}
    result = common.result_head("reward_model") | {
        "settings": {
            "rm_steps": a.rm_steps,
            "rl_steps": a.rl_steps,
            "seeds": seeds,
            "pairs_train": 512,
            "pairs_heldout": 96,
        },
        "seeds": per_seed,
    }
    runs = list(per_seed.values())
    steps = sorted(runs[0]["reward_model"]["val_rule"], key=int)
    last = steps[-1]

    def col(kind: str, what: str, step: int) -> str:
        return spread([r[kind][what][step] for r in runs])

    summary = {
        "heldout_pair_accuracy": [r["reward_model_training"]["heldout_pair_accuracy"] for r in runs],
        "train_seconds": [r["reward_model_training"]["train_seconds"] for r in runs],
        "final_rule_reward_model": [r["reward_model"]["val_rule"][last] for r in runs],
        "final_rule_rule": [r["rule"]["val_rule"][last] for r in runs],
        "step_s_reward_model": [r["reward_model"]["step_s_median"] for r in runs],
        "step_s_rule": [r["rule"]["step_s_median"] for r in runs],
        "reward_model_s": [r["reward_model"]["reward_model_s_median"] for r in runs],
    }
    result["summary"] = summary
    body = (
        f"`python benchmarks/bench_reward_model.py` ({common.machine_line(result)}), seeds "
        f"{','.join(map(str, seeds))}: median "
        f"[min-max]. Reward models trained {a.rm_steps} steps (candidates labelled by the rule): held-out pair "
        f"accuracy {spread(summary['heldout_pair_accuracy'], '.3f')} in {spread(summary['train_seconds'], '.0f')} s. "
        "GRPO on the model's score alone (the quick start's settings), greedy validation by the rule check it never "
        "sees, against GRPO on the rule itself:\n\n"
        + common.table(
            ["step", "reward model's score", "rule check (reward-model run)", "rule check (rule run)"],
            [
                [
                    s,
                    col("reward_model", "val_reward", s),
                    col("reward_model", "val_rule", s),
                    col("rule", "val_rule", s),
                ]
                for s in steps
            ],
        )
        + f"\n\nMedian step {spread(summary['step_s_reward_model'])} s with the reward model "
        f"({spread(summary['reward_model_s'])} s of it its forward), {spread(summary['step_s_rule'])} s with the rule."
    )
    common.publish("reward_model", "RL from a learned reward", result, body, check_dir=work if a.quick else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
