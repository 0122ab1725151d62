"""GRPO on one GPU at the Qwen2.5-VL-3B shape (random weights, bf16 compute, fp32 master weights, FSDP2).

    python benchmarks/bench_gpu.py [--steps 8] [--prompts 16] [--n 4] [--response 128] [--image-size 448]
    python benchmarks/bench_gpu.py --report-only        # redraw the README section from results/gpu.json

Builds a random-weight model with Qwen2.5-VL-3B-Instruct's architecture (36 layers x 2048, 32 vision blocks, vocab
151,936, tied embeddings; the tiny tokenizer), writes synthetic colour-task data with large images, and runs the
real training entry point: ``python -m vlmrl.train`` with one in-process worker (``trainer.launcher=inline``), the HF
rollout (vLLM is not installed on the benchmark GPU machine), gradient checkpointing, KL off. Reports the median step
time and its parts, generated tokens/s, trained tokens/s and peak GPU memory.
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
    now,
    read_jsonl,
    table,
    versions,
    write_readme_section,
    write_result,
)

TITLE = "GPU: GRPO at the Qwen2.5-VL-3B shape"


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


def run(a: argparse.Namespace) -> dict:
    work = Path(a.work_dir)
    t0 = time.perf_counter()
    model, params = build_model(work / "model")
    build_s = time.perf_counter() - t0
    data = work / "data"
    if not (data / "train.parquet").exists():
        subprocess.run(
            [PY, str(ROOT / "preprocess" / "synthetic.py"), "--output-dir", str(data), "--families", "colour",
             "--image-size", str(a.image_size), "--train-size", str(a.prompts * (a.steps + 1)), "--test-size", "16",
             "--no-progress"],
            check=True, cwd=ROOT,
        )  # fmt: skip
    out = work / "run"
    cmd = [
        PY, "-m", "vlmrl.train",
        f"data.train_files={data / 'train.parquet'}", "data.val_files=null",
        f"data.train_batch_size={a.prompts}", "data.max_prompt_length=1024",
        f"data.max_response_length={a.response}",
        f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.model.enable_gradient_checkpointing=true",
        "actor_rollout_ref.actor.optim.lr=1e-6", f"actor_rollout_ref.actor.ppo_mini_batch_size={a.prompts}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={a.micro}",
        "actor_rollout_ref.rollout.name=hf", f"actor_rollout_ref.rollout.n={a.n}",
        "actor_rollout_ref.rollout.ignore_eos=true",
        "trainer.device=cuda", "trainer.launcher=inline", f"trainer.total_training_steps={a.steps}",
        "trainer.logger=[console,jsonl]", f"trainer.default_local_dir={out}", "trainer.resume_mode=disable",
        "reward.function=synthetic",
    ]  # fmt: skip
    t1 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    wall = time.perf_counter() - t1
    if proc.returncode != 0:
        raise SystemExit(f"training failed with exit code {proc.returncode}")
    rows = [r for r in read_jsonl(out / "metrics.jsonl") if "timing/step_s" in r]
    steady = rows[2:] if len(rows) > 3 else rows  # the first steps include CUDA/cuBLAS warm-up

    def med(key: str) -> float:
        return median([r.get(key, 0.0) for r in steady])

    import torch

    gen_tokens = a.prompts * a.n * a.response
    result = {
        "when": now(),
        "machine": {**machine(), "gpu": torch.cuda.get_device_name(0)},
        "versions": versions(),
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
        "model_build_s": build_s,
        "wall_s": wall,
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
    return result


def report(result: dict) -> None:
    c = result["config"]
    body = [
        f"`python benchmarks/bench_gpu.py --steps {c['steps']} --prompts {c['prompts_per_step']} --n {c['n']} "
        f"--response {c['response_tokens']} --image-size {c['image_size']}` ({result['when']}) on one "
        f"{result['machine']['gpu']}. {c['shape']}, {c['params'] / 1e9:.2f} B parameters; {c['prompts_per_step']} "
        f"prompts x {c['n']} samples x {c['response_tokens']} generated tokens per step (`ignore_eos`), one "
        f"{c['image_size']}x{c['image_size']} image per prompt; rollout: {c['rollout']}; update: {c['update']}. "
        "Median over the steps after the first two.",
        "",
        table(
            [
                "step s",
                "rollout s",
                "input prep s",
                "update s",
                "generated tok/s",
                "trained tok/s",
                "peak allocated GiB",
                "peak reserved GiB",
            ],
            [
                [
                    f"{result['step_s']:.2f}",
                    f"{result['rollout_s']:.2f}",
                    f"{result['input_prep_s']:.3f}",
                    f"{result['update_s']:.2f}",
                    f"{result['generated_tokens_per_s']:,.0f}",
                    f"{result['throughput_tokens_per_s']:,.0f}",
                    f"{result['peak_memory_allocated_gb']:.1f}",
                    f"{result['peak_memory_reserved_gb']:.1f}",
                ]
            ],
        ),  # fmt: skip
        "",
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
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--response", type=int, default=128)
    ap.add_argument("--image-size", type=int, default=448)
    ap.add_argument("--micro", type=int, default=16, help="samples per forward/backward")
    ap.add_argument("--work-dir", default="/tmp/vlmrl-bench-gpu")
    ap.add_argument("--report-only", action="store_true", help="redraw the README section from results/gpu.json")
    a = ap.parse_args()
    if a.report_only:
        report(json.loads((ROOT / "benchmarks" / "results" / "gpu.json").read_text()))
        return
    result = run(a)
    path = write_result("gpu", result)
    report(result)
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
