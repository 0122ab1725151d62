"""Token-budget micro-batches (``actor.use_dynamic_bsz``) vs fixed-size ones on a batch with varied response lengths:
the policy update's time and the tokens its forwards compute, same data, same loss.

    python benchmarks/bench_dynamic_bsz.py [--prompts 8] [--n 8] [--max-response 192] [--micro 8] [--repeats 3]

One process, one worker (no process group), the 20 M-parameter preset (``vlmrl.testing.tiny.SIZES["20m"]``), fp32,
2 threads. Responses are random tokens with lengths drawn from a long-tailed distribution (most short, a few near
the maximum), as RL responses are. Fixed: ``ppo_micro_batch_size_per_gpu=--micro``. Token budget: the same memory bound,
``ppo_max_token_len_per_gpu = micro x (longest prompt + longest response)``. Each timed update is one optimizer step
over the whole batch (one mini-batch); runs alternate fixed / budget, median of ``--repeats`` after a warm-up.

Writes ``benchmarks/results/dynamic_bsz.json`` and the ``## Token-budget micro-batches`` section of the README.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    cpu_lock,
    machine,
    machine_line,
    median,
    now,
    preset_model,
    synthetic_data,
    table,
    versions,
    write_readme_section,
    write_result,
)

SECTION = "Token-budget micro-batches"


def batch(a: argparse.Namespace, model: Path, data: Path) -> tuple[Any, Any]:
    """Model inputs of ``prompts x n`` samples with long-tailed response lengths, and advantages."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from vlmrl.config import DataConfig
    from vlmrl.data import RLDataset
    from vlmrl.models.inputs import build_inputs, process_images
    from vlmrl.rollout.base import SamplingSpec
    from vlmrl.rollout.hf import HFRollout

    processor = AutoProcessor.from_pretrained(model)
    cfg = DataConfig(train_files=str(data / "train.parquet"), max_prompt_length=512, max_response_length=a.max_response)
    prompts = RLDataset(cfg.train_files, processor, cfg, verbose=False).get_batch(list(range(a.prompts)))
    hf = AutoModelForImageTextToText.from_pretrained(model, dtype=torch.float32).eval()
    rb = HFRollout(hf, processor).generate(prompts, SamplingSpec(n=a.n, max_tokens=1, ignore_eos=True))
    g = torch.Generator().manual_seed(0)
    # long tail: 70% short (8-32 tokens), 20% medium, 10% near the maximum
    u = torch.rand(len(rb), generator=g)
    top = a.max_response
    medium = top * 0.25 + (u - 0.7) / 0.2 * top * 0.4
    long = top * 0.85 + (u - 0.9) / 0.1 * top * 0.15
    lengths = torch.where(u < 0.7, 8 + u / 0.7 * 24, torch.where(u < 0.9, medium, long)).long().clamp(1, top)
    vocab = [t for t in range(100, 400)]
    rb.response_ids = [
        [vocab[int(k)] for k in torch.randint(len(vocab), (int(n),), generator=g)] for n in lengths.tolist()
    ]
    rb.logprobs = [[0.0] * len(r) for r in rb.response_ids]
    rb.finish_reasons = ["length"] * len(rb)
    x = build_inputs(prompts, rb, process_images(processor, prompts), processor.tokenizer.pad_token_id)
    adv = torch.randn(x.batch_size, generator=g)
    return x, adv


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-response", type=int, default=192)
    ap.add_argument("--micro", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    import torch

    torch.set_num_threads(a.threads)
    from vlmrl.config import ActorRolloutRefConfig
    from vlmrl.models import qwen_vl
    from vlmrl.workers import micro_batches
    from vlmrl.workers.policy import PolicyWorker

    model = preset_model("20m")
    data = synthetic_data(Path(tempfile.gettempdir()) / "vlmrl-bench-dynbsz-data", train=64, image_size=112)
    with cpu_lock("bench_dynamic_bsz"):
        x, adv = batch(a, model, data)
        plen = x.input_ids.shape[1] - x.responses.shape[1]
        p = dict(enumerate(x.attention_mask[:, :plen].sum(-1).tolist()))
        r = dict(enumerate(x.response_mask.sum(-1).tolist()))
        arr = ActorRolloutRefConfig()
        arr.model.path = str(model)
        arr.model.enable_gradient_checkpointing = False
        arr.actor.ppo_micro_batch_size_per_gpu = a.micro
        arr.actor.shuffle = False
        budget = a.micro * (max(p.values()) + max(r.values()))
        dyn = copy.deepcopy(arr)
        dyn.actor.use_dynamic_bsz = True
        dyn.actor.ppo_max_token_len_per_gpu = budget
        from transformers import AutoProcessor

        ids = qwen_vl.vision_token_ids(AutoProcessor.from_pretrained(model).tokenizer)
        worker = PolicyWorker(
            arr, device="cpu", total_steps=100, vision_ids=ids, seed=1, max_response_length=a.max_response
        )
        rows = list(range(x.batch_size))
        plans = {"fixed": micro_batches.fixed(rows, a.micro)}
        worker.arr, worker.actor_cfg = dyn, dyn.actor
        plans["budget"] = worker.micro_batches(x, rows, "update")
        times: dict[str, list[float]] = {"fixed": [], "budget": []}
        losses: dict[str, float] = {}
        for k in range(a.repeats + 1):
            for name, cfg in (("fixed", arr), ("budget", dyn)):
                worker.arr, worker.actor_cfg = cfg, cfg.actor
                t0 = time.perf_counter()
                m = worker.update(x, adv, x.batch_size)
                if k:
                    times[name].append(time.perf_counter() - t0)
                losses[name] = m["actor/pg_loss"]
                print(f"{name} round {k}: {time.perf_counter() - t0:.2f} s", flush=True)
    rows_out = {}
    for name in ("fixed", "budget"):
        plan = plans[name]
        rows_out[name] = {
            "update_s": median(times[name]),
            "micro_batches": len(plan),
            "sizes": [len(b) for b in plan],
            "padded_tokens": sum(micro_batches.padded_tokens(b, p, r) for b in plan),
            "pg_loss_last": losses[name],
        }
    real = int(sum(p.values()) + sum(r.values()))
    result = {
        "when": now(),
        "machine": machine(),
        "versions": versions(),
        "config": vars(a),
        "budget": budget,
        "real_tokens": real,
        "results": rows_out,
    }
    write_result("dynamic_bsz", result)
    f, b = rows_out["fixed"], rows_out["budget"]
    body = [
        f"`python benchmarks/bench_dynamic_bsz.py --prompts {a.prompts} --n {a.n} --max-response {a.max_response} "
        f"--micro {a.micro} --repeats {a.repeats}` ({result['when']}). One update (one optimizer step) of the 20 M "
        f"shape over {x.batch_size} samples whose responses are long-tailed (70% 8-32 tokens, 10% near "
        f"{a.max_response}); {real} real tokens. Fixed: `ppo_micro_batch_size_per_gpu={a.micro}`. Token budget: "
        f"`use_dynamic_bsz=True ppo_max_token_len_per_gpu={budget}` (the fixed run's worst micro-batch: the same "
        "memory bound). Median of the repeats after a warm-up; the loss is the same (tests/test_micro_batches.py: "
        "gradients within 1e-5).",
        "",
        table(
            ["micro-batches", "count", "sizes", "tokens computed (padding included)", "update s", "speed-up"],
            [
                [
                    "fixed",
                    f["micro_batches"],
                    "/".join(map(str, f["sizes"])),
                    f["padded_tokens"],
                    f"{f['update_s']:.2f}",
                    "1.00x",
                ],
                [
                    "token budget",
                    b["micro_batches"],
                    "/".join(map(str, b["sizes"])),
                    b["padded_tokens"],
                    f"{b['update_s']:.2f}",
                    f"{f['update_s'] / b['update_s']:.2f}x",
                ],
            ],
        ),
        "",
        machine_line(result),
        "Raw numbers: `benchmarks/results/dynamic_bsz.json`.",
    ]
    write_readme_section(SECTION, "\n".join(body))
    return 0


if __name__ == "__main__":
    sys.exit(main())
