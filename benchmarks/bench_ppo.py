"""Actor-critic PPO against GRPO on the quick start's task: steps and seconds to a 0.9 training reward, side by side.

    python benchmarks/bench_ppo.py [--seeds 1,2] [--steps 120]
    python benchmarks/bench_ppo.py --quick      # 1 seed, 12 steps; writes nothing under results/

Both runs are ``python -m vlmrl.train --config-name tiny_cpu`` on the quick start's data (the tiny Qwen2.5-VL, the
colour task at 112 px, 2 CPU workers, vLLM), alternating per seed, the same budget of steps: GRPO as the quick start
trains, PPO with ``configs/ppo_tiny_cpu.yaml``'s overrides (``algorithm.adv_estimator=gae``, a critic from the same
checkpoint, its lr 2e-3). Per run: the first step where the 5-step mean training reward reaches 0.9 and the training
seconds to it (the steps' ``timing/step_s``), the first greedy validation (every 10 steps) at 0.9 or more, the median
step time and the critic's share of it, the validation at the end. Each run holds the CPU lock and is repeated when
other processes took over 10 % of the CPU. Writes ``benchmarks/results/ppo.json`` and the ``## PPO with a critic vs
GRPO`` section of benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

SECTION = "PPO with a critic vs GRPO"
PPO = (
    "algorithm.adv_estimator=gae",
    "critic.optim.lr=2e-3",
    "critic.optim.weight_decay=0",
    "critic.model.enable_gradient_checkpointing=False",
    "critic.fsdp.reshard_after_forward=False",
    "critic.fsdp.wrap_policy.min_num_params=1000000",
)
"""configs/ppo_tiny_cpu.yaml's settings over tiny_cpu, as overrides."""


def one(algo: str, seed: int, steps: int, work: Path, model: Path, data: Path) -> dict[str, Any]:
    overrides = [
        f"trainer.seed={seed}",
        f"data.seed={seed}",
        f"data.val_files={data / 'test.parquet'}",
        f"trainer.test_freq={min(10, steps)}",
        "trainer.val_before_train=False",
    ]
    if algo == "ppo":
        overrides += PPO
    res = common.uncontended(
        lambda: common.vlmrl_train(work / f"{algo}_{seed}", data, model, steps, overrides, timeout_s=1800),
        f"{algo} seed {seed}",
    )
    rows = [r for r in res["rows"] if r.get("step", 0) > 0 and "reward/mean" in r]
    hit = common.moving_average_hit([r["reward/mean"] for r in rows], 5, 0.9)
    step_s = [r["timing/step_s"] for r in rows[1:]]
    critic = [r.get("timing/critic_update_s", 0.0) + r.get("timing/critic_values_s", 0.0) for r in rows[1:]]
    val = [(r["step"], r["val/reward/mean"]) for r in res["rows"] if "val/reward/mean" in r]
    val_hit = next((step for step, v in val if v >= 0.9), None)
    return {
        "algo": algo,
        "seed": seed,
        "steps_to_0.9": int(rows[hit - 1]["step"]) if hit else None,
        "seconds_to_0.9": sum(r["timing/step_s"] for r in rows[:hit]) if hit else None,
        "val_steps_to_0.9": val_hit,
        "seconds_to_val_0.9": sum(r["timing/step_s"] for r in rows if r["step"] <= val_hit) if val_hit else None,
        "step_s_median": common.median(step_s),
        "critic_s_median": common.median(critic) if algo == "ppo" else 0.0,
        "val_end": val[-1][1] if val else None,
        "attempts": res.get("attempts", 1),
        "foreign_cpu_frac": res["foreign_cpu_frac"],
    }


HEADER = [
    "run",
    "validation reached 0.9",
    "step",
    "seconds",
    "training reached 0.9",
    "step",
    "seconds",
    "step (s)",
    "validation at end",
]


def markdown(res: dict[str, Any]) -> str:
    rows = []
    for algo in ("grpo", "ppo"):
        s = res["summary"][algo]
        rows.append(
            [
                algo.upper() + (" + critic (GAE)" if algo == "ppo" else ""),
                f"{s['val_reached']}/{len(res['seeds'])}",
                s["val_steps_to_0.9_median"],
                s["seconds_to_val_0.9_median"],
                f"{s['reached']}/{len(res['seeds'])}",
                s["steps_to_0.9_median"],
                s["seconds_to_0.9_median"],
                f"{s['step_s_median']:.3f}",
                s["val_end_median"],
            ]
        )
    return (
        "Command: `python benchmarks/bench_ppo.py` (seeds "
        + ",".join(map(str, res["seeds"]))
        + f", {res['steps']} steps each, alternating). The quick start's task and model on 2 CPU workers; PPO adds a "
        "critic from the same checkpoint and GAE (configs/ppo_tiny_cpu.yaml). 'Validation to 0.9': the first greedy "
        "validation (every 10 steps) at 0.9 or more; 'training to 0.9': the first step where the 5-step mean training "
        "reward (sampled at temperature 1, with the quick start's entropy bonus) reaches 0.9; seconds: the training "
        "steps' time to it; medians over the seeds that reached it.\n\n"
        + common.table(HEADER, rows)
        + f"\n\nPPO's step is {res['summary']['ppo']['step_s_median'] / res['summary']['grpo']['step_s_median']:.2f}x "
        "GRPO's: the critic's value forward and update (median "
        f"{res['summary']['ppo']['critic_s_median']:.3f} s a step) and the separate log-prob round before the "
        "advantages.\n\n" + common.machine_line(res)
    )


def summarise(runs: list[dict[str, Any]], algo: str) -> dict[str, Any]:
    mine = [r for r in runs if r["algo"] == algo]
    hits = [r for r in mine if r["steps_to_0.9"] is not None]
    val_hits = [r for r in mine if r["val_steps_to_0.9"] is not None]

    def med(key: str, rs: list[dict[str, Any]]) -> Any:
        vals = [r[key] for r in rs if r[key] is not None]
        return round(common.median(vals), 3) if vals else None

    return {
        "val_reached": len(val_hits),
        "val_steps_to_0.9_median": med("val_steps_to_0.9", val_hits),
        "seconds_to_val_0.9_median": med("seconds_to_val_0.9", val_hits),
        "reached": len(hits),
        "steps_to_0.9_median": med("steps_to_0.9", hits),
        "seconds_to_0.9_median": med("seconds_to_0.9", hits),
        "step_s_median": med("step_s_median", mine),
        "critic_s_median": med("critic_s_median", mine),
        "val_end_median": med("val_end", mine),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="1,2")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    seeds = [0] if args.quick else [int(s) for s in args.seeds.split(",")]
    steps = 12 if args.quick else args.steps
    work = Path(tempfile.mkdtemp(prefix="bench-ppo-"))
    model = common.tiny_model(seed=0)
    data = common.synthetic_data(work / "data", train=4096, test=96, image_size=112)
    runs = []
    for seed in seeds:
        for algo in ("grpo", "ppo"):
            runs.append(one(algo, seed, steps, work, model, data))
            print(f"[bench_ppo] {runs[-1]}", flush=True)
    res = {
        **common.result_head("ppo"),
        "seeds": seeds,
        "steps": steps,
        "runs": runs,
        "summary": {a: summarise(runs, a) for a in ("grpo", "ppo")},
    }
    default = args.seeds == "1,2" and args.steps == 120 and not args.quick
    common.publish("ppo", SECTION, res, markdown(res), check_dir=None if default else work)
    return res


if __name__ == "__main__":
    main()
