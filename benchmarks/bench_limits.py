"""Each stage of vlmrl's GRPO step against this machine's limits, measured in the same run.

    python benchmarks/bench_limits.py [--model-size tiny,20m,100m] [--retries N]

Per model-size preset (``vlmrl.testing.tiny.SIZES``; the workload of ``bench_trl_sizes.PLANS``: prompts x samples x
tokens, equal lengths, vLLM rollout, 2 worker processes x 1 thread):

1. **Measured**: a vlmrl run of each arm, the default (every parameter sharded over both workers) and
   ``actor_rollout_ref.actor.fsdp_config.fsdp_size=1`` (each worker holds the whole model: no gathers, gradients
   all-reduced); the median seconds of the rollout, the update and the weight push (``timing/rollout_s``,
   ``timing/update_s``, ``timing/push_s``) over its steps after the first, and of the push the time spent
   producing the weights (``timing/push_gather_s``).
2. **Limits**, measured with 2 processes x 1 thread at once (the 2 workers run each stage at the same time), at the
   model's own tensors and shapes:
   - copy: one ``dst.copy_(src)`` of every parameter (fp32): the bytes a push must move into each worker's engine;
   - read: one pass of ``sum`` over the language model's weights: the bytes a decode step must read;
   - decode step: the language model's products ``[samples, K] @ [K, N]`` (each projection, MLP and the head) at one
     worker's samples; prefill: the same at one worker's prompt tokens, and the vision tower's at its patches;
   - matmul: ``compute_efficiency.py``'s mix at the update's shapes (the machine's rate, both processes summed).
3. **Bounds** (per worker, both at once) and measured / bound:
   - push >= copy (each engine receives every weight once);
   - rollout >= prefill + tokens x max(decode step's products, the weights' read): what the engine's work costs with
     no attention, sampling, scheduling or Python;
   - update >= 6 x (language-model parameters x tokens + vision parameters x patches) / matmul rate (the update's
     tokens and patches from the run's ``work/update_*`` metrics).

Writes ``benchmarks/results/limits.json`` and the ``## Stages against the machine's limits`` section of
benchmarks/README.md (docs/speed.md quotes it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

SECTION = "Stages against the machine's limits"
STAGES = ("rollout", "update", "push")
ARMS = {"sharded": [], "fsdp_size=1": ["actor_rollout_ref.actor.fsdp_config.fsdp_size=1"]}
"""vlmrl's arms: the default (parameters sharded over the 2 workers) and one full copy per worker."""


# ------------------------------------------------------------------------------------------------- the model


def model_tensors(size: str) -> dict[str, Any]:
    """The preset's parameter shapes (meta device: no memory): every tensor, the language model's products
    ``(K, N)`` a decode step runs (projections, MLP, head; the input embedding is a lookup) and the vision tower's
    ``(K, N, rows per patch)`` (the patch merger runs on a quarter of the patches)."""
    import torch

    from vlmrl.testing.tiny import SIZES, _model_class, build_tokenizer, model_config

    spec = SIZES[size]
    with torch.device("meta"):
        model = _model_class(spec)(model_config(build_tokenizer(spec), spec))
    shapes, lm, vision = [], [], []
    for name, p in model.named_parameters():
        shapes.append(list(p.shape))
        if p.dim() < 2 or "embed_tokens" in name:
            continue
        k, n = int(p[0].numel()), int(p.shape[0])  # a linear's weight is [out, in]; a conv's [out, in, t, h, w]
        if name.startswith("model.visual."):
            vision.append((k, n, 0.25 if "merger" in name else 1.0))
        else:
            lm.append((k, n))
    return {"shapes": shapes, "lm": lm, "vision": vision, "bytes": 4 * sum(p.numel() for p in model.parameters())}


# -------------------------------------------------------------------------------- limits (the worker processes)


def _median_s(fn: Any, reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _measure(tensors: dict[str, Any], samples: int, prompt_tokens: int, patches: int, reps: int, barrier: Any) -> dict:
    """One process's seconds for each limit (after ``barrier``, so both processes measure at once)."""
    import torch

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    out: dict[str, float] = {}
    src = [torch.randn(s, generator=g) for s in tensors["shapes"]]
    dst = [torch.empty_like(t) for t in src]
    barrier.wait()
    out["copy_s"] = _median_s(lambda: [d.copy_(s) for d, s in zip(dst, src)], reps)
    weights = [torch.randn(k, n, generator=g) for k, n in tensors["lm"]]
    barrier.wait()
    out["read_s"] = _median_s(lambda: [w.sum() for w in weights], reps)
    xs = {k: torch.randn(samples, k, generator=g) for k, _ in tensors["lm"]}
    barrier.wait()
    out["decode_step_s"] = _median_s(lambda: [torch.mm(xs[w.shape[0]], w) for w in weights], reps)
    rows = {k: torch.randn(prompt_tokens, k, generator=g) for k, _ in tensors["lm"]}
    vweights = [(torch.randn(k, n, generator=g), max(1, int(patches * f))) for k, n, f in tensors["vision"]]
    vrows = {(w.shape[0], r): torch.randn(r, w.shape[0], generator=g) for w, r in vweights}

    def prefill() -> None:
        for w in weights:
            torch.mm(rows[w.shape[0]], w)
        for w, r in vweights:
            torch.mm(vrows[w.shape[0], r], w)

    barrier.wait()
    out["prefill_s"] = _median_s(prefill, max(1, reps // 2))
    return out


def _child(args: tuple, barrier: Any, queue: Any) -> None:
    queue.put(_measure(*args, barrier))


def measure_limits(size: str, samples: int, prompt_tokens: int, patches: int, reps: int, procs: int = 2) -> dict:
    """Each limit's seconds in ``procs`` processes measuring at once (1 thread each); the slowest process's (the
    step waits for the slower worker)."""
    import multiprocessing as mp

    tensors = model_tensors(size)
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(procs), ctx.Queue()
    args = (tensors, samples, prompt_tokens, patches, reps)
    workers = [ctx.Process(target=_child, args=(args, barrier, queue)) for _ in range(procs)]
    for w in workers:
        w.start()
    per_proc = [queue.get(timeout=1200) for _ in workers]
    for w in workers:
        w.join()
    out = {k: max(p[k] for p in per_proc) for k in per_proc[0]}
    lm_bytes = 4 * sum(k * n for k, n in tensors["lm"])
    out.update(
        per_process=per_proc,
        bytes=tensors["bytes"],
        lm_weight_bytes=lm_bytes,
        copy_gb_per_s=tensors["bytes"] / out["copy_s"] / 1e9,
        read_gb_per_s=lm_bytes / out["read_s"] / 1e9,
    )
    return out


# ------------------------------------------------------------------------------------------------ one size


def _flags(values: dict[str, Any]) -> list[str]:
    return [str(x) for pair in values.items() for x in pair]


def worker_json(cmd: list[str], out: Path, a: argparse.Namespace) -> dict[str, Any]:
    """A measuring subprocess (``cmd`` + ``--out``) under the CPU lock, re-run when contended; its JSON."""
    return common.uncontended(
        lambda: common.run_json_worker(
            [common.PY, *cmd, "--out", str(out)], env=common.bench_env(1), out=out, what=out.stem
        ),
        out.stem,
        a.retries,
    )


def run_size(size: str, a: argparse.Namespace, data: Path, work: Path) -> dict[str, Any]:
    """The vlmrl run, the limits at its workload and the bounds, for one preset."""
    import bench_trl
    import bench_trl_sizes
    import compute_efficiency as ce

    from vlmrl.testing.tiny import SIZES, param_counts

    plan = bench_trl_sizes.PLANS[size]
    model = common.preset_model(size)
    steps = max(3, plan.steps)
    ns = argparse.Namespace(steps=steps, warmup=1, retries=a.retries)
    runs = {}
    for arm, over in ARMS.items():
        print(f"[bench_limits] {size}: vlmrl {arm}, {steps} steps", flush=True)
        workload = [*bench_trl_sizes.vlmrl_workload(plan), *over]
        tag = arm.replace("=", "")
        runs[arm] = bench_trl.vlmrl_step_run(work / f"vlmrl-{size}-{tag}", data, model, ns, workload, f"{size} {arm}")
    rows = runs["sharded"]["kept"]
    measured = {
        arm: {s: common.median([r[f"timing/{s}_s"] for r in run["kept"]]) for s in STAGES} for arm, run in runs.items()
    }
    params = ce.flop_params(param_counts(SIZES[size]))
    achieved = ce.vlmrl_achieved(rows, params)
    if "missing" in achieved:
        raise RuntimeError(f"{size}: {achieved['note']}")
    samples_w = plan.prompts * plan.n // 2
    responses = plan.prompts * plan.n * plan.max_tokens  # equal lengths (ignore_eos)
    prompt_tokens_w = max(1, round((achieved["tokens"] - responses) / 2))
    patches_w = max(1, round(achieved["patches"] / 2))
    worker_rows = max(1, round(achieved["tokens"] / 2))

    print(f"[bench_limits] {size}: limits (2 processes x 1 thread)", flush=True)
    shape = {"--samples": samples_w, "--prompt-tokens": prompt_tokens_w, "--patches": patches_w, "--reps": a.reps}
    limits = worker_json([__file__, "--worker", size, *_flags(shape)], work / f"limits-{size}.json", a)
    mm = {"--size": size, "--rows": worker_rows, "--patches": patches_w, "--threads": 1, "--procs": 2}
    matmul = worker_json(
        [str(common.HERE / "compute_efficiency.py"), "matmul", *_flags(mm)], work / f"mm-{size}.json", a
    )
    decode = max(limits["decode_step_s"], limits["read_s"])
    bounds = {
        "rollout": limits["prefill_s"] + plan.max_tokens * decode,
        "update": achieved["flops_6nd"] / matmul["mix_flops_per_s"],
        "push": limits["copy_s"],
    }
    return {
        "plan": {**vars(plan), "steps_run": steps, "warmup_dropped": 1},
        "params": param_counts(SIZES[size]),
        "workload_per_worker": {
            "samples": samples_w,
            "prompt_tokens": prompt_tokens_w,
            "patches": patches_w,
            "update_tokens": worker_rows,
        },
        "measured_s": measured,
        "bounds_s": bounds,
        "over_bound": {arm: {s: m[s] / bounds[s] for s in STAGES} for arm, m in measured.items()},
        "step_s": {arm: common.median([r["timing/step_s"] for r in run["kept"]]) for arm, run in runs.items()},
        "push_gather_s": {  # of the push, the slowest worker's time producing the weights (the rest the engine's)
            arm: common.median([r["timing/push_gather_s"] for r in run["kept"]]) for arm, run in runs.items()
        },
        "rollout_bound_parts_s": {
            "prefill": limits["prefill_s"],
            "decode_products": plan.max_tokens * limits["decode_step_s"],
            "decode_weight_reads": plan.max_tokens * limits["read_s"],
        },
        "limits": limits,
        "matmul_flops_per_s": matmul["mix_flops_per_s"],
        "update_flops_6nd": achieved["flops_6nd"],
        "vlmrl_breakdown": {arm: bench_trl.vlmrl_breakdown(run["kept"]) for arm, run in runs.items()},
        "foreign_cpu_frac": {
            **{arm: run["foreign_cpu_frac"] for arm, run in runs.items()},
            "limits": limits["foreign_cpu_frac"],
            "matmul": matmul["foreign_cpu_frac"],
        },
    }


# ------------------------------------------------------------------------------------------------- markdown


def _bound_from(r: dict[str, Any], stage: str) -> str:
    lim = r["limits"]
    if stage == "rollout":
        return (
            f"prefill {r['rollout_bound_parts_s']['prefill']:.3f} s + {r['plan']['max_tokens']} x max(products "
            f"{lim['decode_step_s'] * 1e3:.1f} ms, weight reads {lim['read_s'] * 1e3:.1f} ms at "
            f"{lim['read_gb_per_s']:.1f} GB/s)"
        )
    if stage == "update":
        return f"{r['update_flops_6nd'] / 1e9:.1f} GFLOP at {r['matmul_flops_per_s'] / 1e9:.1f} GFLOP/s"
    return f"{lim['bytes'] / 1e6:.0f} MB at {lim['copy_gb_per_s']:.2f} GB/s per worker"


def markdown(res: dict[str, Any]) -> str:
    """The benchmarks/README.md section."""
    rows = []
    for size, r in res["sizes"].items():
        for stage in STAGES:
            rows.append(
                [
                    size if stage == "rollout" else "",
                    stage,
                    f"{r['bounds_s'][stage]:.3g}",
                    *(f"{r['measured_s'][arm][stage]:.3f} ({r['over_bound'][arm][stage]:.1f}x)" for arm in ARMS),
                    _bound_from(r, stage),
                ]
            )
        rows.append(["", "of the push: gather", "", *(f"{r['push_gather_s'][arm]:.3f}" for arm in ARMS), ""])
        rows.append(["", "whole step", "", *(f"{r['step_s'][arm]:.3f}" for arm in ARMS), ""])
    sizes = ",".join(res["sizes"])
    return "\n".join(
        [
            f"`python benchmarks/bench_limits.py --model-size {sizes}` ({res['date']}). Each stage's median seconds "
            "in vlmrl runs (vLLM rollout, 2 worker processes x 1 thread, bench_trl_sizes.py's workload, equal "
            "lengths; the default sharding over both workers, and `actor_rollout_ref.actor.fsdp_config.fsdp_size=1`: "
            "a whole copy per worker) against its lower bound on this machine, measured in the same run with 2 "
            "processes x 1 thread at once at the model's own tensors: the push >= one copy of every weight into each "
            "worker's engine; the rollout >= the prefill's products + tokens x a decode step (the language model's "
            "products at one worker's samples, or one read of its weights where slower); the update >= 6 x "
            "parameters x tokens at the machine's matmul rate. In brackets: measured / bound. Of the push, the "
            "gather is the slowest worker's time producing the weights (`timing/push_gather_s`: FSDP's gathers, the "
            "checkpoint's layout); the rest is the engine's (loading them, and repacking its layers for oneDNN).",
            "",
            common.table(["size", "stage", "bound s", *(f"{arm} s" for arm in ARMS), "bound from"], rows, "llrrrl"),
            "",
            common.machine_line(res),
        ]
    )


# ------------------------------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-size", default="tiny,20m,100m", help="vlmrl.testing.tiny.SIZES presets")
    ap.add_argument("--reps", type=int, default=5, help="timed passes of each limit (median)")
    ap.add_argument("--retries", type=int, default=1, help="re-runs of a contended measurement")
    ap.add_argument("--worker", help=argparse.SUPPRESS)  # worker mode: one size's limits, JSON to --out
    ap.add_argument("--samples", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--prompt-tokens", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--patches", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        res = measure_limits(a.worker, a.samples, a.prompt_tokens, a.patches, a.reps)
        Path(a.out).write_text(json.dumps(res))
        return 0
    work = Path(os.environ.get("VLMRL_BENCH_DIR", "/tmp/vlmrl-bench-limits"))
    work.mkdir(parents=True, exist_ok=True)
    data = common.synthetic_data(work / "colour", train=512, test=16, image_size=112)
    sizes = a.model_size.split(",")
    res: dict[str, Any] = common.result_head("limits")
    res["config"] = {"sizes": sizes, "reps": a.reps, "image_size": 112, "workers": 2, "threads_per_worker": 1}
    res["sizes"] = {size: run_size(size, a, data, work) for size in sizes}
    default = sizes == ["tiny", "20m", "100m"] and a.reps == 5
    common.publish("limits", SECTION, res, markdown(res), None if default else work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
