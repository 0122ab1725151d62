"""GRPO and actor-critic PPO on one GPU at the Qwen2.5-VL-3B shape (random weights, bf16 compute, fp32 master
weights, FSDP2).

    python benchmarks/bench_gpu.py [--algos grpo,ppo] [--steps 8] [--prompts 16] [--n 4] [--response 128]
    python benchmarks/bench_gpu.py --build-only         # build the model and data only (timings not taken)
    python benchmarks/bench_gpu.py --report-only        # redraw the README section from results/gpu.json

Builds a random-weight model with Qwen2.5-VL-3B-Instruct's architecture (36 layers x 2048, 32 vision blocks, vocab
151,936, tied embeddings; the tiny tokenizer), writes synthetic colour-task data with large images, and runs the
real training entry point: ``python -m vlmrl.train`` with one in-process worker (``trainer.launcher=inline``), the HF
rollout (vLLM is not installed on the benchmark GPU machine), gradient checkpointing, KL off. PPO adds the critic (a
second 3B-shape model with a value head, GAE): with both models' fp32 master weights and AdamW state on the GPU (2 x 60
GB) an 80 GB card is too small, so the critic's parameters and optimizer state are offloaded to the CPU
(``critic.fsdp.param_offload``, as verl users do on one GPU). Reports per algorithm the median step time and its
parts, generated tokens/s, trained tokens/s and peak GPU memory; each algorithm's result is written as soon as it ends
(a later failure keeps the earlier figures, with the failure's last lines).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    PY,
    ROOT,
    machine,
    machine_line,
    median,
    read_jsonl,
    result_head,
    table,
    write_readme_section,
    write_result,
)

TITLE = "GPU: GRPO and PPO at the Qwen2.5-VL-3B shape"


def build_model(out: Path) -> tuple[Path, int]:
    """A random Qwen2.5-VL-3B-shape folder (bf16 safetensors); returns it and its parameter count."""
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration

    from vlmrl.testing.tiny import QWEN25_VL_3B, build_processor, build_tokenizer, generation_config, model_config

    if (out / "config.json").exists():
        cfg = json.loads((out / "vlmrl_bench.json").read_text())
        return out, int(cfg["params"])
    tok = build_tokenizer(QWEN25_VL_3B)
    proc = build_processor(tok, QWEN25_VL_3B)
    config = model_config(tok, QWEN25_VL_3B)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen2_5_VLForConditionalGeneration._from_config(config, dtype=torch.bfloat16)
    model.generation_config = generation_config(tok)
    params = sum(p.numel() for p in model.parameters())
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    proc.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "vlmrl_bench.json").write_text(json.dumps({"params": params}))
    del model
    torch.cuda.empty_cache()
    return out, params


ALGOS = {
    "grpo": [],
    "ppo": [
        "algorithm.adv_estimator=gae",
        "critic.optim.lr=1e-5",
        "critic.model.enable_gradient_checkpointing=true",
        "critic.fsdp.param_offload=true",
        "critic.fsdp.optimizer_offload=true",
    ],
}


def prepare(a: argparse.Namespace) -> tuple[Path, int, float, Path]:
    """The model folder, its parameter count, the seconds its build took, and the data folder."""
    work = Path(a.work_dir)
    t0 = time.perf_counter()
    model, params = build_model(work / "model")
    build_s = time.perf_counter() - t0
    data = work / "data"
    if not (data / "train.parquet").exists():
        subprocess.run(
            [
                PY,
                str(ROOT / "preprocess" / "synthetic.py"),
                "--output-dir",
                str(data),
                "--families",
                "colour",
                "--image-size",
                str(a.image_size),
                "--train-size",
                str(a.prompts * (a.steps + 1)),
                "--test-size",
                "16",
                "--no-progress",
            ],
            check=True,
            cwd=ROOT,
        )
    return model, params, build_s, data


def run_algo(a: argparse.Namespace, algo: str, model: Path, data: Path) -> dict:
    """Train ``a.steps`` steps with ``algo``; the per-step medians (first two steps left out) and the raw rows."""
    out = Path(a.work_dir) / f"run_{algo}"
    cmd = [
        PY,
        "-m",
        "vlmrl.train",
        f"data.train_files={data / 'train.parquet'}",
        "data.val_files=null",
        f"data.train_batch_size={a.prompts}",
        "data.max_prompt_length=1024",
        f"data.max_response_length={a.response}",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.enable_gradient_checkpointing=true",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={a.prompts}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={a.micro}",
        "actor_rollout_ref.rollout.name=hf",
        f"actor_rollout_ref.rollout.n={a.n}",
        "actor_rollout_ref.rollout.ignore_eos=true",
        "trainer.device=cuda",
        "trainer.launcher=inline",
        f"trainer.total_training_steps={a.steps}",
        "trainer.logger=[console,jsonl]",
        f"trainer.default_local_dir={out}",
        "trainer.resume_mode=disable",
        "trainer.save_freq=-1",
        "reward.function=synthetic",
        *ALGOS[algo],
    ]
    # streamed to a file as it runs (a run killed by a time limit still leaves its progress behind)
    log = Path(a.work_dir) / f"run_{algo}.log"
    print(f"[bench_gpu] {algo}: training {a.steps} steps, output in {log}", flush=True)
    t1 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.run(
            cmd, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=f, stderr=subprocess.STDOUT
        )
    wall = time.perf_counter() - t1
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-4000:].strip()
        return {"failed": f"exit code {proc.returncode}", "tail": tail, "wall_s": wall, "overrides": ALGOS[algo]}
    rows = [r for r in read_jsonl(out / "metrics.jsonl") if "timing/step_s" in r]
    steady = rows[2:] if len(rows) > 3 else rows  # the first steps include CUDA/cuBLAS warm-up

    def med(key: str) -> float:
        return median([r.get(key, 0.0) for r in steady])

    gen_tokens = a.prompts * a.n * a.response
    result = {
        "overrides": ALGOS[algo],
        "wall_s": wall,
        "steps_run": len(rows),
        "step_s": med("timing/step_s"),
        "rollout_s": med("timing/rollout_s"),
        "input_prep_s": med("timing/input_prep_s"),
        "update_s": med("timing/update_s"),
        "reward_s": med("timing/reward_s"),
        "generated_tokens_per_s": gen_tokens / med("timing/rollout_s"),
        "throughput_tokens_per_s": med("throughput/tokens_per_s"),
        "peak_memory_allocated_gb": max(r.get("perf/max_memory_allocated_gb", 0.0) for r in rows),
        "peak_memory_reserved_gb": max(r.get("perf/max_memory_reserved_gb", 0.0) for r in rows),
        "rows": rows,
    }
    if algo == "ppo":
        result["critic_values_s"] = med("timing/critic_values_s")
        result["critic_update_s"] = med("timing/critic_update_s")
        result["vf_loss_first_last"] = [rows[0].get("critic/vf_loss"), rows[-1].get("critic/vf_loss")]
    return result


def run(a: argparse.Namespace) -> dict:
    """Build (or reuse) the model and data, then run each algorithm, writing the results file after each."""
    import torch

    model, params, build_s, data = prepare(a)
    result = {
        **result_head("gpu"),
        "machine": {**machine(), "gpu": torch.cuda.get_device_name(0)},
        "config": {
            "shape": "Qwen2.5-VL-3B (random weights)",
            "params": params,
            "prompts_per_step": a.prompts,
            "n": a.n,
            "response_tokens": a.response,
            "image_size": a.image_size,
            "micro_batch": a.micro,
            "steps": a.steps,
            "rollout": "hf generate (bf16)",
            "update": "FSDP2, bf16 params / fp32 reduce, fp32 master + AdamW, gradient checkpointing",
        },
        "command": f"python benchmarks/bench_gpu.py --algos {a.algos} --steps {a.steps} --prompts {a.prompts} "
        f"--n {a.n} --response {a.response} --image-size {a.image_size} --micro {a.micro}",
        "model_build_s": build_s,
        "algos": {},
    }
    for algo in a.algos.split(","):
        result["algos"][algo] = run_algo(a, algo, model, data)
        write_result("gpu", result)
    return result


def report(result: dict) -> None:
    """The benchmarks/README.md section from a results dict."""
    c = result["config"]
    done = {k: v for k, v in result["algos"].items() if "failed" not in v}
    rows = [
        [
            algo,
            f"{r['step_s']:.2f}",
            f"{r['rollout_s']:.2f}",
            f"{r['input_prep_s']:.3f}",
            f"{r['update_s']:.2f}",
            f"{r.get('critic_values_s', 0.0) + r.get('critic_update_s', 0.0):.2f}" if algo == "ppo" else "-",
            f"{r['generated_tokens_per_s']:,.0f}",
            f"{r['throughput_tokens_per_s']:,.0f}",
            f"{r['peak_memory_allocated_gb']:.1f}",
            f"{r['peak_memory_reserved_gb']:.1f}",
        ]
        for algo, r in done.items()
    ]
    failed = [f"`{k}` failed ({v['failed']})" for k, v in result["algos"].items() if "failed" in v]
    body = [
        f"`{result['command']}` ({result['date']}) on one {result['machine']['gpu']}. {c['shape']}, "
        f"{c['params'] / 1e9:.2f} B parameters; "
        f"{c['prompts_per_step']} prompts x {c['n']} samples x {c['response_tokens']} generated tokens per step "
        f"(`ignore_eos`), one {c['image_size']}x{c['image_size']} image per prompt; rollout: {c['rollout']}; update: "
        f"{c['update']}. PPO: a critic of the same shape with its parameters and optimizer state offloaded to the "
        "CPU. "
        + ("Median over the steps after the first two." if c["steps"] > 3 else f"Median over the {c['steps']} steps."),
        "",
        table(
            [
                "algorithm",
                "step s",
                "rollout s",
                "input prep s",
                "update s",
                "critic s",
                "generated tok/s",
                "trained tok/s",
                "peak allocated GiB",
                "peak reserved GiB",
            ],
            rows,
        ),
        "",
        *([("; ".join(failed) + ": see `benchmarks/results/gpu.json`."), ""] if failed else []),
        "vLLM could not be installed on that machine (its wheel pins another torch), so the rollout is HF `generate`; "
        "with vLLM the rollout part is expected to shrink several-fold. trained tok/s counts prompt + response tokens "
        "of the step over the whole step time.",
        "",
        machine_line(result),
        "Raw numbers: `benchmarks/results/gpu.json`.",
    ]
    write_readme_section(TITLE, "\n".join(body))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--algos", default="grpo,ppo", help="comma-separated: " + ",".join(ALGOS))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--response", type=int, default=128)
    ap.add_argument("--image-size", type=int, default=448)
    ap.add_argument("--micro", type=int, default=16, help="samples per forward/backward")
    ap.add_argument("--work-dir", default="/tmp/vlmrl-bench-gpu")
    ap.add_argument("--report-only", action="store_true", help="redraw the README section from results/gpu.json")
    ap.add_argument("--build-only", action="store_true", help="build the model and the data, then stop")
    a = ap.parse_args()
    if unknown := set(a.algos.split(",")) - set(ALGOS):
        ap.error(f"--algos: unknown {sorted(unknown)}; known: {sorted(ALGOS)}")
    if a.build_only:
        print(prepare(a)[:3])
        return
    if a.report_only:
        report(json.loads((ROOT / "benchmarks" / "results" / "gpu.json").read_text()))
        return
    result = run(a)
    path = write_result("gpu", result)
    report(result)
    print(
        json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "rows"} for k, v in result["algos"].items()}, indent=1)
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
