"""Synchronous hybrid engine vs the one-step off-policy trainer (``actor_rollout_ref.hybrid_engine=False``), side by
side on the same CPU cores: steps per second, the reward after the same samples, and the weight sync's latency.

    python benchmarks/bench_async.py [--seeds 1,2,3] [--steps 40]
    python benchmarks/bench_async.py --quick      # 1 seed, 8 steps; writes nothing under results/

Equal cores: the hybrid engine runs 2 workers (each generates half the batch, then trains on it); the off-policy
trainer 1 training worker and 1 rollout worker (the rollout worker generates step t+1's batch while the trainer
updates on step t's); the fully asynchronous trainer on the same two pools, with a sync after every step and with
verl's defaults (a sync every 4 steps, staleness_threshold 0.1). Two workloads, ``python -m vlmrl.train
--config-name tiny_cpu`` each, alternating per seed:

* (a) the quick start's: the tiny Qwen2.5-VL on the colour task, responses of at most 8 tokens (all about equally
  long);
* (b) long-tailed: the same model warm-started (``python -m vlmrl.testing.warm_start --teacher
  benchmarks/long_tail_teacher.py:write_turn``, 200 steps) to answer a colour at random and then write a filler
  word a log-normal number of times (median 6, capped at 16x): the lengths it samples are long-tailed and decided by
  the model (it stops with the hazard it learned), up to ``data.max_response_length=128``; lr 2e-4 and no entropy
  bonus (the quick start's 0.03 pushes the filler away from stopping: within 40 steps most responses ran to the
  cap, the tail gone).

Per run: steps per second over the steps after the first (``timing/step_s``; the first holds the warm-up), the
median time the off-policy step waited for its batch, generated and synced, the training reward over the last 10
steps and the greedy validation at the end (96 prompts). The sync's figures: megabytes per sync, seconds per sync,
milliseconds per megabyte, and the broadcast's bandwidth alone; with them, an estimate for Qwen2.5-VL-7B (its
parameter count from its published config, on the meta device) at this machine's bandwidth. Each run holds the CPU
lock and is repeated once when other processes took over 10 % of the CPU. Writes ``benchmarks/results/async.json``
and the ``## One-step off-policy vs the hybrid engine`` section of benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

SECTION = "One-step off-policy vs the hybrid engine"
POOLS = ("actor_rollout_ref.hybrid_engine=False", "trainer.cpu_workers=1", "rollout.cpu_workers=1")
MODES = {
    "hybrid": ("trainer.cpu_workers=2",),
    "async": POOLS,
    "fully_async": (
        *POOLS,
        "async_training.mode=fully_async",
        "async_training.staleness_threshold=1.0",
        "async_training.trigger_parameter_sync_step=1",
    ),
    "fully_async_verl": (*POOLS, "async_training.mode=fully_async"),
}
"""The ways to use 2 CPU cores (the fully asynchronous trainer: a step of train_batch_size=16 groups, a sync after
each, at most 32 groups started between two syncs, as many as the one-step trainer has in flight; partial rollouts;
and with verl's defaults: a sync every 4 steps, staleness_threshold 0.1, at most 70 groups started between two
syncs)."""
WORKLOADS = {
    "quickstart": (),
    "long_tail": (
        "data.max_response_length=128",
        "actor_rollout_ref.actor.optim.lr=2e-4",
        "actor_rollout_ref.actor.entropy_coeff=0",
    ),
}
TEACHER = Path(__file__).resolve().parent / "long_tail_teacher.py"


def warm_model(work: Path, model: Path, data: Path) -> Path:
    """The long-tailed workload's model: the tiny one warm-started on the teacher's answers."""
    out = work / "long_tail_model"
    cmd = [
        common.PY,
        "-m",
        "vlmrl.testing.warm_start",
        "--model",
        str(model),
        "--output",
        str(out),
        "--data",
        str(data / "train.parquet"),
        "--teacher",
        f"{TEACHER}:write_turn",
        "--steps",
        "200",
        "--max-response-length",
        "128",
        "--max-assistant-turns",
        "1",
    ]
    subprocess.run(cmd, check=True, env=common.bench_env(2), capture_output=True, cwd=common.ROOT, timeout=900)
    return out


def samples_per_step() -> int:
    """Responses a step trains (configs/tiny_cpu.yaml: data.train_batch_size groups of actor_rollout_ref.rollout.n;
    the fully asynchronous trainer's step takes as many groups)."""
    import yaml

    cfg = yaml.safe_load((common.ROOT / "configs" / "tiny_cpu.yaml").read_text())
    return int(cfg["data"]["train_batch_size"]) * int(cfg["actor_rollout_ref"]["rollout"]["n"])


def qwen25_vl_7b_params() -> int:
    """Qwen2.5-VL-7B-Instruct's parameter count, from its published config (built on the meta device)."""
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    cfg = Qwen2_5_VLConfig(
        vocab_size=152064,
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        tie_word_embeddings=False,
        vision_config={
            "depth": 32,
            "hidden_size": 1280,
            "intermediate_size": 3420,
            "num_heads": 16,
            "out_hidden_size": 3584,
            "fullatt_block_indexes": [7, 15, 23, 31],
            "window_size": 112,
        },
    )
    with torch.device("meta"):
        model = Qwen2_5_VLForConditionalGeneration(cfg)
    return sum(p.numel() for p in model.parameters())


def one(
    mode: str,
    workload: str,
    seed: int,
    steps: int,
    work: Path,
    model: Path,
    data: Path,
    workload_overrides: tuple[str, ...] | None = None,
    mode_overrides: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """One training run of ``mode`` on ``workload`` (their overrides: ``MODES``' and ``WORKLOADS``' unless given)
    and its figures."""
    overrides = [
        f"trainer.seed={seed}",
        f"data.seed={seed}",
        f"data.val_files={data / 'test.parquet'}",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        *(MODES[mode] if mode_overrides is None else mode_overrides),
        *(WORKLOADS[workload] if workload_overrides is None else workload_overrides),
    ]
    res = common.uncontended(
        lambda: common.vlmrl_train(work / f"{workload}_{mode}_{seed}", data, model, steps, overrides, timeout_s=1800),
        f"{workload} {mode} seed {seed}",
    )
    rows = [r for r in res["rows"] if r.get("step", 0) > 0 and "reward/mean" in r]
    later = rows[1:]  # the first step holds the warm-up (and, off-policy, its own generation)
    step_s = [r["timing/step_s"] for r in later]
    val = [r["val/reward/mean"] for r in res["rows"] if "val/reward/mean" in r]

    def med(key: str) -> float | None:
        vals = [r[key] for r in later if key in r]
        return round(common.median(vals), 4) if vals else None

    out = {
        "mode": mode,
        "workload": workload,
        "seed": seed,
        "steps": len(rows),
        "steps_per_s": len(later) / sum(step_s),
        "step_s_median": med("timing/step_s"),
        "reward_last10": sum(r["reward/mean"] for r in rows[-10:]) / len(rows[-10:]),
        "val_end": val[-1] if val else None,
        "response_length_mean": sum(r["response_length/mean"] for r in rows) / len(rows),
        "response_length_max": max(r["response_length/max"] for r in rows),
        # responses' tokens trained per second: a step trains train_batch_size groups of n (each mode the same)
        "response_tokens_per_s": sum(r["response_length/mean"] for r in later) * samples_per_step() / sum(step_s),
        "generate_s_median": med("timing/gen_s") if mode == "async" else med("timing/rollout_s"),
        "update_s_median": med("timing/update_s"),
        "attempts": res.get("attempts", 1),
        "foreign_cpu_frac": res["foreign_cpu_frac"],
    }
    if any("multi_turn/called_share" in r for r in rows):
        out |= {
            "called_share_mean": sum(r["multi_turn/called_share"] for r in rows) / len(rows),
            "tool_calls_per_trajectory": sum(r["multi_turn/tool_calls/mean"] for r in rows) / len(rows),
            "tool_s_median": med("timing/tool_s"),
            "tool_wait_s_median": med("timing/tool_wait_s"),
        }
    if mode.startswith("fully_async"):
        out |= {
            "wait_prev_gen_s_median": med("timing/wait_rollout_s"),
            "param_sync_s_median": med("timing/param_sync_s"),
            "staleness_mean": sum(r["async/staleness_mean"] for r in rows) / len(rows),
            "staleness_max": max(r["async/staleness_max"] for r in rows),
            "staleness_hist": _histogram([r["async/staleness_max"] for r in rows]),
            "partial_groups": sum(r["async/partial_groups"] for r in rows),
            "queue_depth_median": med("async/queue_depth"),
        }
    if mode == "async":
        out |= {
            "wait_prev_gen_s_median": med("timing/wait_prev_gen_s"),
            "param_sync_s_median": med("timing/param_sync_s"),
            "param_sync_mb": rows[0]["async/param_sync_mb"],
            "param_sync_ms_per_mb_median": med("async/param_sync_ms_per_mb"),
            "broadcast_mb_per_s_median": med("async/param_sync_broadcast_mb_per_s"),
            "staleness": [r["async/staleness"] for r in rows],
        }
    return out


def _histogram(values: list[float]) -> dict[str, int]:
    """How many steps had each value."""
    out: dict[str, int] = {}
    for v in values:
        out[str(int(v))] = out.get(str(int(v)), 0) + 1
    return dict(sorted(out.items()))


def summarise(runs: list[dict[str, Any]], workload: str, modes: tuple[str, ...] = tuple(MODES)) -> dict[str, Any]:
    """Medians over the seeds per mode, and the speed-ups."""
    out: dict[str, Any] = {}
    for mode in modes:
        mine = [r for r in runs if r["mode"] == mode and r["workload"] == workload]
        out[mode] = {
            k: round(common.median([r[k] for r in mine if r.get(k) is not None]), 4)
            for k in (
                "steps_per_s",
                "step_s_median",
                "reward_last10",
                "val_end",
                "response_length_mean",
                "response_length_max",
                "response_tokens_per_s",
                "generate_s_median",
                "update_s_median",
                "wait_prev_gen_s_median",
                "param_sync_s_median",
                "param_sync_mb",
                "param_sync_ms_per_mb_median",
                "broadcast_mb_per_s_median",
                "staleness_mean",
                "staleness_max",
                "partial_groups",
                "queue_depth_median",
                "called_share_mean",
                "tool_calls_per_trajectory",
                "tool_s_median",
                "tool_wait_s_median",
            )
            if any(r.get(k) is not None for r in mine)
        }
        for k in ("reward_last10", "val_end"):
            out[mode][f"{k}_range"] = [round(min(r[k] for r in mine), 4), round(max(r[k] for r in mine), 4)]
    out["speedup"] = round(out["async"]["steps_per_s"] / out["hybrid"]["steps_per_s"], 3)
    for mode in (m for m in modes if m.startswith("fully_async")):
        f = out[mode]
        out[f"{mode}_speedup"] = round(f["steps_per_s"] / out["hybrid"]["steps_per_s"], 3)
        out[f"{mode}_over_one_step"] = round(f["steps_per_s"] / out["async"]["steps_per_s"], 3)
        out[f"{mode}_tokens_over_one_step"] = round(
            f["response_tokens_per_s"] / out["async"]["response_tokens_per_s"], 3
        )
    return out


LABELS = {
    "hybrid": "hybrid (2 workers)",
    "async": "one-step off-policy (1 + 1)",
    "fully_async": "fully async (1 + 1)",
    "fully_async_verl": "fully async, verl's defaults (1 + 1)",
}
SPEEDUPS = {"async": "speedup", "fully_async": "fully_async_speedup", "fully_async_verl": "fully_async_verl_speedup"}


def _streamed(res: dict[str, Any], w: str, mode: str) -> str:
    """One sentence on a fully asynchronous mode: its ratios to the one-step trainer, its staleness and queue."""
    s, f = res["summary"][w], res["summary"][w][mode]
    hist: dict[str, int] = {}
    for r in res["runs"]:
        if r["mode"] == mode and r["workload"] == w:
            for k, v in r["staleness_hist"].items():
                hist[k] = hist.get(k, 0) + v
    shown = ", ".join(f"{v} at {k}" for k, v in sorted(hist.items()))
    return (
        f"{w.replace('_', '-')}, {LABELS[mode]}: {s[f'{mode}_over_one_step']:.2f}x the one-step "
        f"off-policy trainer's steps/s and {s[f'{mode}_tokens_over_one_step']:.2f}x its trained response "
        f"tokens/s; its groups train {f['staleness_mean']:.2f} updates stale on average "
        f"(steps of all seeds by their stalest group: {shown}), {f['partial_groups']:.0f} groups a run (median) "
        "were continued across a "
        f"sync, and {f['queue_depth_median']:.0f} groups (median) were queued when a step took its own"
    )


def markdown(res: dict[str, Any]) -> str:
    head = [
        "workload",
        "mode",
        "steps/s",
        "speed-up",
        "response tokens/s",
        "generation (s)",
        "update (s)",
        "waited (s)",
        "sync (s)",
        "reward, last 10 steps",
        "validation at end",
        "response length mean / max",
    ]
    rows = []
    for w in WORKLOADS:
        s = res["summary"][w]
        for mode in MODES:
            m = s[mode]
            rows.append(
                [
                    w.replace("_", "-"),
                    LABELS[mode],
                    f"{m['steps_per_s']:.2f}",
                    f"{s[SPEEDUPS[mode]]:.2f}x" if mode in SPEEDUPS else "1.00x",
                    f"{m['response_tokens_per_s']:.0f}",
                    m.get("generate_s_median") or "-",
                    m.get("update_s_median"),
                    m.get("wait_prev_gen_s_median", "-"),
                    m.get("param_sync_s_median", "-"),
                    f"{m['reward_last10']:.3f} [{m['reward_last10_range'][0]:.3f}-{m['reward_last10_range'][1]:.3f}]",
                    f"{m['val_end']:.3f} [{m['val_end_range'][0]:.3f}-{m['val_end_range'][1]:.3f}]",
                    f"{m['response_length_mean']:.1f} / {m['response_length_max']:.0f}",
                ]
            )
    sync = res["sync"]
    streamed = []
    for w in WORKLOADS:
        for mode in (m for m in MODES if m.startswith("fully_async")):
            streamed.append(_streamed(res, w, mode))
    return (
        "Command: `python benchmarks/bench_async.py` (seeds "
        + ",".join(map(str, res["seeds"]))
        + f", {res['steps']} steps each, alternating). Equal cores: the hybrid engine on 2 workers against 1 training "
        "+ 1 rollout worker. Quickstart: the tiny Qwen2.5-VL on the colour task (responses <= 8 tokens). Long-tail: "
        "the same model warm-started to answer and then write a filler word a log-normal number of times (median 6, "
        "at most 16x), lengths sampled by the model up to 128 tokens; lr 2e-4, no entropy bonus. Steps/s over the "
        "steps after the first; response tokens/s: the trained responses' tokens over the same steps' time (a step "
        "trains as many responses in every mode, but not as long ones); generation, update, the off-policy step's "
        "wait for its batch and the weight sync: medians per step; reward and validation: median [min-max] over the "
        "seeds. Fully async: "
        "async_training.mode=fully_async, staleness_threshold 1, a sync after every step, partial rollouts (its "
        "'waited' is the step's wait for its groups); with verl's defaults: staleness_threshold 0.1, a sync every 4 "
        "steps, partial rollouts.\n\n"
        + common.table(head, rows)
        + "\n\n"
        + "; ".join(streamed)
        + "."
        + f"\n\nWeight sync (gloo, this machine): {sync['mb']:.2f} MB a sync in {sync['s']:.3f} s "
        f"({sync['ms_per_mb']:.1f} ms per MB, the trainer's gather, the broadcast and the engine's reload together; "
        f"the broadcast alone at {sync['broadcast_mb_per_s']:.0f} MB/s). Qwen2.5-VL-7B "
        f"({sync['qwen25_vl_7b_params'] / 1e9:.2f} B parameters, {sync['qwen25_vl_7b_gb_bf16']:.1f} GB in bf16) at "
        f"this machine's rates: {sync['qwen25_vl_7b_s_at_ms_per_mb']:.0f} s a sync (the broadcast alone "
        f"{sync['qwen25_vl_7b_s_at_broadcast']:.0f} s). On one 8-GPU node the broadcast is NCCL over NVLink, far "
        "faster than this CPU loopback; not measured here (no GPU was lent).\n\n" + common.machine_line(res)
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    seeds = [1] if args.quick else [int(s) for s in args.seeds.split(",")]
    steps = 8 if args.quick else args.steps
    work = Path(tempfile.mkdtemp(prefix="bench-async-"))
    base = common.tiny_model(seed=0)
    data = common.synthetic_data(work / "data", train=4096, test=96, image_size=112)
    models = {"quickstart": base, "long_tail": warm_model(work, base, data)}
    runs = []
    for workload in WORKLOADS:
        for seed in seeds:
            for mode in MODES:
                runs.append(one(mode, workload, seed, steps, work, models[workload], data))
                print(f"[bench_async] {runs[-1]}", flush=True)
    summary = {w: summarise(runs, w) for w in WORKLOADS}
    a = [r for r in runs if r["mode"] == "async"]
    params = qwen25_vl_7b_params()
    ms_per_mb = common.median([r["param_sync_ms_per_mb_median"] for r in a])
    bw = common.median([r["broadcast_mb_per_s_median"] for r in a])
    gb = params * 2 / 2**30
    sync = {
        "mb": a[0]["param_sync_mb"],
        "s": common.median([r["param_sync_s_median"] for r in a]),
        "ms_per_mb": ms_per_mb,
        "broadcast_mb_per_s": bw,
        "qwen25_vl_7b_params": params,
        "qwen25_vl_7b_gb_bf16": params * 2 / 1e9,
        "qwen25_vl_7b_s_at_ms_per_mb": gb * 1024 * ms_per_mb / 1000,
        "qwen25_vl_7b_s_at_broadcast": gb * 1024 / bw,
    }
    res = {
        **common.result_head("async"),
        "seeds": seeds,
        "steps": steps,
        "runs": runs,
        "summary": summary,
        "sync": sync,
    }
    default = args.seeds == "1,2,3" and args.steps == 40 and not args.quick
    common.publish("async", SECTION, res, markdown(res), check_dir=None if default else work)
    return res


if __name__ == "__main__":
    main()
