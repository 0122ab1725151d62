"""RL from a learned reward on CPU: train a tiny reward model, then GRPO whose only reward is that model, measured by
the rule check it never sees.

    python benchmarks/bench_reward_model.py [--rm-steps 600] [--rl-steps 120] [--seed 0]

1. ``python -m vlmrl.reward_model.train`` on the colour task's labelled records (512 train, 96 held out, 112 px; the
   tiny Qwen2.5-VL with a score head): the Bradley–Terry loss, the held-out pair accuracy and the time.
2. ``python -m vlmrl.train --config-name tiny_cpu`` (the quick start's settings on the quick start's data) with
   ``reward.components=[{function: reward_model, name: rm, weight: 1}, {function: synthetic, name: rule, weight:
   0}]``: the reward is the model's score alone; the rule component is logged (weight 0) and, in greedy validation
   every 40 steps, says how many answers are right. The same run with the rule as the reward is the baseline.

Writes ``benchmarks/results/reward_model.json`` and the ``## RL from a learned reward`` section of
benchmarks/README.md; ``--quick`` (a check: 100 + 20 steps) writes under a temporary folder only.
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

COMPONENTS = ("reward.components=[{function: reward_model, name: rm, weight: 1.0}, {function: synthetic, name: rule, "
              "weight: 0.0}]")  # fmt: skip


def validations(rows: list[dict[str, Any]], key: str) -> dict[int, float]:
    """Step -> the validation value of ``key`` (steps that validated)."""
    return {int(r["step"]): float(r[key]) for r in rows if key in r}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rm-steps", type=int, default=600)
    ap.add_argument("--rl-steps", type=int, default=120)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args(argv)
    if a.quick:
        a.rm_steps, a.rl_steps = 100, 20
    work = Path(tempfile.mkdtemp(prefix="bench_rm_"))
    model = common.tiny_model()
    pairs = common.synthetic_data(work / "pairs", train=512, test=96, image_size=112)
    data = common.synthetic_data(work / "colour", train=4096, test=96, image_size=112)
    rm_dir = work / "rm"
    cmd = [common.PY, "-m", "vlmrl.reward_model.train", "--model", str(model), "--data", str(pairs / "train.parquet"),
           "--val-data", str(pairs / "test.parquet"), "--output", str(rm_dir), "--steps", str(a.rm_steps),
           "--seed", str(a.seed)]  # fmt: skip
    proc = subprocess.run(cmd, env=common.bench_env(1), capture_output=True, text=True, cwd=common.ROOT)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    trained = json.loads((rm_dir / "vlmrl_reward_model.json").read_text())
    val = [f"data.val_files={data / 'test.parquet'}", "trainer.test_freq=40", "trainer.val_before_train=true"]
    runs = {}
    for name, extra in (
        (
            "reward_model",
            ["reward.function=null", "reward_model.enable=True", f"reward_model.model.path={rm_dir}", COMPONENTS],
        ),  # fmt: skip
        ("rule", []),
    ):
        out = common.vlmrl_train(work / name, data, model, a.rl_steps, [*extra, *val, f"trainer.seed={a.seed}"],
                                 timeout_s=1800)  # fmt: skip
        rows = out["rows"]
        rule_key = "val/reward/rule/mean" if name == "reward_model" else "val/reward/mean"
        runs[name] = {
            "val_rule": validations(rows, rule_key),
            "val_reward": validations(rows, "val/reward/mean"),
            "step_s_median": common.median([r["timing/step_s"] for r in rows if r.get("step", 0) > 1]),
            "reward_model_s_median": common.median(
                [r.get("timing/reward_model_s", 0.0) for r in rows if r.get("step", 0) > 1]
            ),  # fmt: skip
        }
    result = common.result_head("reward_model") | {
        "settings": {
            "rm_steps": a.rm_steps,
            "rl_steps": a.rl_steps,
            "seed": a.seed,
            "pairs_train": 512,
            "pairs_heldout": 96,
        },  # fmt: skip
        "reward_model_training": {
            k: trained[k] for k in ("first_loss", "loss", "heldout_pair_accuracy", "train_seconds")
        },  # fmt: skip
        "rl": runs,
    }
    rm, rule = runs["reward_model"], runs["rule"]
    last = max(rm["val_rule"])
    body = (
        f"`python benchmarks/bench_reward_model.py` ({common.machine_line(result)}). A reward model trained "
        f"{a.rm_steps} steps: held-out pair accuracy {trained['heldout_pair_accuracy']:.3f} "
        f"({trained['train_seconds']:.0f} s). GRPO on its score alone, greedy validation by the rule check:\n\n"
        + common.table(
            ["step", "reward model's score", "rule check (RM-trained)", "rule check (rule-trained)"],
            [
                [
                    s,
                    f"{rm['val_reward'][s]:.2f}",
                    f"{rm['val_rule'][s]:.2f}",
                    f"{rule['val_rule'].get(s, float('nan')):.2f}",
                ]
                for s in sorted(rm["val_rule"])
            ],
        )  # fmt: skip
        + f"\n\nMedian step {rm['step_s_median']:.2f} s with the reward model ({rm['reward_model_s_median']:.2f} s "
        f"of it scoring), {rule['step_s_median']:.2f} s with the rule; rule check at step {last}: "
        f"{rm['val_rule'][last]:.2f} (reward model) vs {rule['val_rule'][last]:.2f} (rule)."
    )
    common.publish("reward_model", "RL from a learned reward", result, body, check_dir=work if a.quick else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
