"""GRPO against TRL at several model sizes (``vlmrl.testing.tiny.SIZES``): step time (vlmrl padded and with
padding-free packing, TRL), time-to-learn, and the update's compute efficiency.

    python benchmarks/bench_trl.py --model-size tiny,20m,100m [--quick]
    python benchmarks/bench_trl_sizes.py --model-size tiny,20m,100m     (the same; also for tiny alone, which
                                                                          bench_trl.py runs as its own comparison)

Per size, bench_trl.py's comparison (its recipe; TRL 1.16 from ``.cache/trl-pkgs``; vlmrl: vLLM rollout, 2 worker
processes x 1 thread; TRL: HF ``generate``, one process x 2 threads):

1. Step time, equal lengths: ``rounds`` rounds of TRL, vlmrl, vlmrl with ``actor_rollout_ref.model.use_remove_padding
   =True`` (packing); the first ``warmup`` steps of each run dropped, medians per run, then over runs; per stage.
2. Time to learn (EOS allowed): each side until the 5-step mean reward reaches 0.9, or the size's training budget.
3. Compute efficiency (``compute_efficiency.py``): each update's FLOP/s (6 x parameters x tokens, from vlmrl's
   ``work/update_*`` metrics and TRL's mask sums) over ``torch.mm``'s FLOP/s at the model's shapes measured here
   (1 thread; 2 processes x 1 thread at once, vlmrl's layout; 1 process x 2 threads, TRL's), and a profile of one
   worker's update by op group (``torch.profiler``, 1 thread, no FSDP).

``PLANS`` holds each size's defaults, chosen so tiny,20m,100m takes ~45 min on the 2-core machine: fewer steps at the
larger sizes and, at 100m, 8 prompts x 4 samples instead of 16 x 8 (the same on both sides; recorded per size in the
results). A flag given (``--steps``, ``--prompts``...) overrides every size. Writes ``benchmarks/results/
trl_sizes.json`` and the ``## GRPO step time vs TRL by model size`` section of the README; ``--quick``: one short round
per size, results in the work folder only.
"""

from __future__ import annotations

import argparse
import functools
import sys
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_trl  # noqa: E402
import common  # noqa: E402
import compute_efficiency as ce  # noqa: E402
import trl_sizes_report  # noqa: E402

SECTION = "GRPO step time vs TRL by model size"
PACKED = "actor_rollout_ref.model.use_remove_padding=True"
ARMS = ("vlmrl", "vlmrl_packed")


@dataclass(frozen=True)
class Plan:
    """One size's workload and budget, the same for TRL and vlmrl."""

    prompts: int
    n: int
    max_tokens: int
    steps: int
    warmup: int
    rounds: int
    learn_budget_s: float


PLANS = {
    "tiny": Plan(prompts=16, n=8, max_tokens=16, steps=12, warmup=2, rounds=2, learn_budget_s=120),
    "20m": Plan(prompts=16, n=8, max_tokens=16, steps=5, warmup=1, rounds=2, learn_budget_s=240),
    "100m": Plan(prompts=8, n=4, max_tokens=16, steps=4, warmup=1, rounds=2, learn_budget_s=180),
}
QUICK = {"steps": 3, "warmup": 1, "rounds": 1, "learn_budget_s": 15.0}


def plan_for(size: str, a: argparse.Namespace) -> Plan:
    """The size's plan, ``--quick``'s short runs, then every flag given."""
    plan = replace(PLANS[size], **(QUICK if a.quick else {}))
    given = {f.name: getattr(a, f.name) for f in fields(Plan) if getattr(a, f.name) is not None}
    return replace(plan, **given)


# ------------------------------------------------------------------------------------------------------ runs


def step_runs(model: Path, data: Path, work: Path, plan: Plan, a: argparse.Namespace) -> dict[str, list[Any]]:
    """``plan.rounds`` rounds of TRL, vlmrl, vlmrl packed (equal lengths), each re-run when contended."""
    trl_args = trl_workload(plan) + ["--steps", str(plan.steps), "--equal-lengths"]
    ns = argparse.Namespace(steps=plan.steps, warmup=plan.warmup, retries=a.retries)
    over = [*vlmrl_workload(plan), "actor_rollout_ref.actor.entropy_coeff=0"]
    runs: dict[str, list[Any]] = {"trl": [], "vlmrl": [], "vlmrl_packed": []}
    for r in range(plan.rounds):
        tag = f"[bench_trl_sizes] {work.name} round {r + 1}/{plan.rounds}"
        print(f"{tag}: TRL", flush=True)
        job = functools.partial(bench_trl.run_trl, model, data, work / f"trl_step_{r}.json", trl_args, 1200)
        runs["trl"].append(common.uncontended(job, f"TRL {work.name} round {r + 1}", a.retries))
        for arm, extra in (("vlmrl", []), ("vlmrl_packed", [PACKED])):
            print(f"{tag}: {arm}", flush=True)
            what = f"{arm} {work.name} round {r + 1}"
            runs[arm].append(bench_trl.vlmrl_step_run(work / f"{arm}_step_{r}", data, model, ns, [*over, *extra], what))
        print(
            f"{tag}: medians " + ", ".join(f"{k} {run_median(v[-1], plan):.3f} s" for k, v in runs.items()), flush=True
        )
    return runs


def trl_micro(plan: Plan) -> int:
    """TRL's samples per forward/backward: 64 as bench_trl.py, or the whole batch when 64 does not divide it."""
    samples = plan.prompts * plan.n
    return 64 if samples % 64 == 0 else samples


def trl_workload(plan: Plan) -> list[str]:
    """trl_runner.py's workload arguments."""
    args = {
        "--prompts": plan.prompts,
        "--n": plan.n,
        "--max-tokens": plan.max_tokens,
        "--threads": 2,
        "--micro": trl_micro(plan),
    }
    return [str(x) for pair in args.items() for x in pair]


def vlmrl_workload(plan: Plan) -> list[str]:
    """vlmrl's overrides for the workload (one optimizer step per batch)."""
    return [
        f"data.train_batch_size={plan.prompts}",
        f"actor_rollout_ref.rollout.n={plan.n}",
        f"data.max_response_length={plan.max_tokens}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={plan.prompts}",
    ]


def kept(run: dict[str, Any], plan: Plan) -> list[dict[str, Any]]:
    """A run's measured steps: TRL's step rows or vlmrl's metrics rows after the warm-up."""
    return run["kept"] if "kept" in run else run["steps"][plan.warmup :]


def run_median(run: dict[str, Any], plan: Plan) -> float:
    """Median step seconds of a run's measured steps."""
    return common.median([s.get("timing/step_s", s.get("step_s", 0.0)) for s in kept(run, plan)])


def step_summary(runs: dict[str, list[Any]], plan: Plan) -> dict[str, Any]:
    """Medians per run and over runs, stage breakdowns, start-up and contention of each arm."""
    trl_rows = [s for r in runs["trl"] for s in kept(r, plan)]
    out: dict[str, Any] = {
        "trl_run_medians_s": [run_median(r, plan) for r in runs["trl"]],
        "trl_breakdown": bench_trl.trl_breakdown(trl_rows),
        "trl_startup_s": common.median([r["process_wall_s"] - r["train_wall_s"] for r in runs["trl"]]),
        "foreign_cpu_frac": {k: [r["foreign_cpu_frac"] for r in v] for k, v in runs.items()},
    }
    out["trl_median_s"] = common.median(out["trl_run_medians_s"])
    out["trl_breakdown"]["update_s"] = common.median([s["step_s"] - s["generate_and_score_s"] for s in trl_rows])
    for arm in ARMS:
        rows = [x for r in runs[arm] for x in r["kept"]]
        out[f"{arm}_run_medians_s"] = [run_median(r, plan) for r in runs[arm]]
        out[f"{arm}_median_s"] = common.median(out[f"{arm}_run_medians_s"])
        out[f"{arm}_breakdown"] = bench_trl.vlmrl_breakdown(rows)
        out[f"{arm}_startup_s"] = common.median([bench_trl.startup_s(r["log"]) or float("nan") for r in runs[arm]])
        out[f"{arm}_mean_response_length"] = sum(x["response_length/mean"] for x in rows) / len(rows)
        out[f"ratio_{arm}_over_trl"] = out[f"{arm}_median_s"] / out["trl_median_s"]
    out["ratio_packed_over_padded"] = out["vlmrl_packed_median_s"] / out["vlmrl_median_s"]
    return out


def measure_run(cmd: list[str], work: Path, tag: str, threads: int, a: argparse.Namespace) -> dict[str, Any]:
    """One ``compute_efficiency.py`` subprocess under the CPU lock (re-run when contended); its JSON."""
    out = work / f"{tag}.json"
    full = [common.PY, str(common.HERE / "compute_efficiency.py"), *cmd, "--out", str(out)]
    job = functools.partial(common.run_json_worker, full, env=common.bench_env(threads), out=out, what=tag)
    return common.uncontended(job, tag, a.retries)


def efficiency(
    size: str,
    plan: Plan,
    runs: dict[str, list[Any]],
    learn_runs: dict[str, Any],
    params: dict[str, int],
    work: Path,
    a: argparse.Namespace,
) -> dict[str, Any]:
    """Matmul references at this size's shapes, each side's achieved update FLOP/s and its share of them, and the
    padding shares of the step-time runs (equal lengths) and of the time-to-learn runs (lengths vary)."""
    patches_per_image = (2 * round(a.image_size / 28)) ** 2
    worker_rows = plan.prompts * plan.n // 2 * plan.max_tokens  # one worker's response tokens per forward
    worker_patches = max(1, plan.prompts // 2) * patches_per_image
    trl_rows = [s for r in runs["trl"] for s in kept(r, plan)]
    trl = ce.trl_achieved(trl_rows, params)
    micro = trl_micro(plan)
    per_forward = (trl["tokens"] + trl["padding_tokens"]) * micro / (plan.prompts * plan.n) if "tokens" in trl else 0
    trl_m = int(per_forward) or micro * (plan.max_tokens + 80)  # its [prompt | completion] batch's positions
    layouts = {
        "1x1": (["--rows", worker_rows, "--patches", worker_patches, "--threads", 1], 1),
        "2x1": (["--rows", worker_rows, "--patches", worker_patches, "--threads", 1, "--procs", 2], 1),
        "1x2": (["--rows", worker_rows, "--patches", worker_patches, "--threads", 2], 2),
        "trl_1x2": (["--rows", trl_m, "--patches", micro * patches_per_image, "--threads", 2], 2),
    }
    matmul = {}
    for name, (args, threads) in layouts.items():
        print(f"[bench_trl_sizes] {size}: matmul FLOP/s, {name}", flush=True)
        matmul[name] = measure_run(["matmul", "--size", size, *map(str, args)], work, f"matmul_{name}", threads, a)
    out: dict[str, Any] = {"matmul": matmul, "flop_params": params, "trl": trl}
    for arm in ARMS:
        out[arm] = ce.vlmrl_achieved([x for r in runs[arm] for x in r["kept"]], params)
    for side, ref in (("vlmrl", "2x1"), ("vlmrl_packed", "2x1"), ("trl", "trl_1x2")):
        rate = out[side].get("achieved_flops_per_s")
        out[side]["reference"] = ref
        out[side]["of_matmul"] = rate / matmul[ref]["mix_flops_per_s"] if rate else None
    if learn_runs:
        out["learn_runs"] = {
            "vlmrl": ce.vlmrl_achieved(learn_runs["vlmrl"]["rows"], params),
            "trl": ce.trl_achieved(learn_runs["trl"]["steps"], params),
        }
    return out


def profiles(size: str, plan: Plan, data: Path, work: Path, a: argparse.Namespace) -> dict[str, Any]:
    """``compute_efficiency.py profile`` of one worker's share of the batch, padded and packed."""
    args = {
        "--size": size,
        "--data": data,
        "--prompts": max(1, plan.prompts // 2),
        "--n": plan.n,
        "--max-tokens": plan.max_tokens,
        "--threads": 1,
    }
    base = ["profile", *(str(x) for pair in args.items() for x in pair)]
    out = {}
    for arm, extra in (("vlmrl", []), ("vlmrl_packed", ["--packed"])):
        print(f"[bench_trl_sizes] {size}: profile of one update, {arm}", flush=True)
        out[arm] = measure_run([*base, *extra], work, f"profile_{arm}", 1, a)
    return out


def run_size(size: str, a: argparse.Namespace, data: Path) -> dict[str, Any]:
    """Everything for one size: parameters, plan, step time, time to learn, efficiency, profiles."""
    from vlmrl.testing.tiny import SIZES, param_counts

    plan = plan_for(size, a)
    work = Path(a.work) / size
    with common.cpu_lock(f"build {size}"):
        model = common.preset_model(size)
    counts = param_counts(SIZES[size])
    runs = step_runs(model, data, work, plan, a)
    learning, learn_runs = {}, {}
    if not a.skip_learn:
        ns = argparse.Namespace(
            learn_budget_s=plan.learn_budget_s, learn_threshold=a.learn_threshold, learn_secondary=a.learn_secondary
        )
        learning, learn_runs = bench_trl.time_to_learn(model, data, work, trl_workload(plan), vlmrl_workload(plan), ns)
    params = ce.flop_params(counts)
    return {
        "params": counts,
        "plan": asdict(plan),
        "trl_micro": trl_micro(plan),
        "step_time": step_summary(runs, plan),
        "learning": learning,
        "efficiency": efficiency(size, plan, runs, learn_runs, params, work, a),
        "profile": {} if a.skip_profile else profiles(size, plan, data, work, a),
    }


# ---------------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run every size, write the results file and the README section (``--quick``: the work folder only)."""
    from vlmrl.testing.tiny import SIZES

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-size", default="tiny,20m,100m", help=f"comma list of {','.join(SIZES)}")
    p.add_argument("--quick", action="store_true", help=f"a check: {QUICK} per size, nothing under results/")
    for f in fields(Plan):
        p.add_argument(
            f"--{f.name.replace('_', '-')}",
            type=float if f.type == "float" else int,
            help=f"every size's {f.name} (default: per size, PLANS)",
        )
    p.add_argument("--learn-threshold", type=float, default=0.9)
    p.add_argument("--learn-secondary", type=float, default=0.3, help="a lower level also reported (first progress)")
    p.add_argument("--retries", type=int, default=1, help="re-runs of a run during which others used > 10%% CPU")
    p.add_argument("--skip-learn", action="store_true", help="no time-to-learn runs")
    p.add_argument("--skip-profile", action="store_true", help="no torch.profiler runs")
    p.add_argument("--image-size", type=int, default=112)
    p.add_argument("--work", default=str(common.ROOT / ".cache" / "bench" / "trl_sizes"), help="scratch folder")
    a = p.parse_args(argv)
    sizes = [s.strip() for s in a.model_size.split(",") if s.strip()]
    bad = [s for s in sizes if s not in SIZES or s not in PLANS]
    if bad:
        p.error(f"unknown --model-size {bad}; choose from {list(PLANS)}")
    for s in sizes:
        if plan_for(s, a).steps <= plan_for(s, a).warmup:
            p.error(f"{s}: steps must exceed warmup")
    trl_version = bench_trl.ensure_trl()
    data = common.synthetic_data(Path(a.work) / f"data{a.image_size}", train=4096, test=32, image_size=a.image_size)
    results = {}
    for size in sizes:
        print(f"[bench_trl_sizes] size {size}: {plan_for(size, a)}", flush=True)
        results[size] = run_size(size, a, data)
    res = {
        **common.result_head("trl_sizes", trl=trl_version),
        "config": {
            "sizes": sizes,
            "argv": sys.argv[1:] if argv is None else list(argv),
            "quick": a.quick,
            "plans": {s: asdict(plan_for(s, a)) for s in sizes},
            "image_size": a.image_size,
            "learn_threshold": a.learn_threshold,
            "learn_secondary": a.learn_secondary,
            "vlmrl_workers": 2,
            "vlmrl_learn_entropy_coeff": 0.03,
            "trl_threads": 2,
            "lr": 2e-3,
            "packed_override": PACKED,
        },
        "sizes": results,
    }
    body = trl_sizes_report.markdown(res)
    common.publish("trl_sizes", SECTION, res, body, check_dir=Path(a.work) if a.quick else None)
    return res


if __name__ == "__main__":
    main()
