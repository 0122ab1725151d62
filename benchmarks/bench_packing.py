"""Padding-free packing (``actor_rollout_ref.model.use_remove_padding=True``) against padded micro-batches: the policy
update's time and the token positions its forwards run, on the long-tailed workload of ``bench_dynamic_bsz.py``.

    python benchmarks/bench_packing.py [--sizes 20m,100m] [--prompts 8] [--n 8] [--max-response 192] [--micro 8]
                                       [--repeats 3]

One process, one worker (no process group), fp32, 2 threads, the model-size presets of ``vlmrl.testing.tiny.SIZES``.
Responses are random tokens with long-tailed lengths (70% 8-32 tokens, 10% near the maximum), as RL responses are.
For each size, with gradient checkpointing off (the padded forward then runs each prompt once, its KV cache shared
by its samples) and on (verl's default: the padded forward runs every sample's whole sequence), and with fixed
micro-batches (``ppo_micro_batch_size_per_gpu=--micro``) and token-budget ones (``use_dynamic_bsz``, the fixed run's
worst micro-batch as the budget): one update (one optimizer step) padded, then packed, alternating, median of
``--repeats`` after a warm-up. The token positions come from the update's own ``work/*`` metrics. The goal (issue 31):
packing cuts the update's time by at least the share of the positions it removes.

Writes ``benchmarks/results/packing.json`` and the ``## Padding-free packing`` section of the README.
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
from bench_dynamic_bsz import batch  # noqa: E402
from common import (  # noqa: E402
    RESULTS,
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

SECTION = "Padding-free packing"


def run_size(a: argparse.Namespace, size: str, data: Path) -> list[dict[str, Any]]:
    """Every (checkpointing, micro-batching) setting of one model size: padded and packed updates, alternating."""
    import torch
    from transformers import AutoProcessor

    from vlmrl.config import ActorRolloutRefConfig
    from vlmrl.models import qwen_vl
    from vlmrl.workers.policy import PolicyWorker

    model = preset_model(size)
    x, adv = batch(a, model, data)
    plen = x.input_ids.shape[1] - x.responses.shape[1]
    longest = int(x.attention_mask[:, :plen].sum(-1).max()) + int(x.response_mask.sum(-1).max())
    ids = qwen_vl.vision_token_ids(AutoProcessor.from_pretrained(model).tokenizer)
    base = ActorRolloutRefConfig()
    base.model.path = str(model)
    base.actor.ppo_micro_batch_size_per_gpu = a.micro
    base.actor.ppo_max_token_len_per_gpu = a.micro * longest
    base.actor.shuffle = False
    torch.manual_seed(0)
    worker = PolicyWorker(
        base, device="cpu", total_steps=1000, vision_ids=ids, seed=1, max_response_length=a.max_response
    )
    params = sum(p.numel() for p in worker.model.parameters())
    out = []
    for ckpt in (False, True):
        if ckpt:
            worker.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        else:
            worker.model.gradient_checkpointing_disable()
        for dyn in (False, True):
            cfg = copy.deepcopy(base)
            cfg.actor.use_dynamic_bsz = dyn
            worker.arr, worker.actor_cfg = cfg, cfg.actor
            times: dict[bool, list[float]] = {False: [], True: []}
            work: dict[bool, dict[str, float]] = {}
            for k in range(a.repeats + 1):
                for packed in (False, True):
                    worker.packed = packed
                    t0 = time.perf_counter()
                    m = worker.update(x, adv, x.batch_size)
                    dt = time.perf_counter() - t0
                    if k:
                        times[packed].append(dt)
                    work[packed] = {key: m[key] for key in m if key.startswith("work/")}
                    name = f"{size} ckpt={ckpt} budget={dyn} packed={packed}"
                    print(f"{name} round {k}: {dt:.2f} s", flush=True)
            pad, pk = work[False], work[True]
            positions_padded = pad["work/update_tokens"] + pad["work/update_padding_tokens"]
            positions_packed = pk["work/update_tokens"] + pk["work/update_padding_tokens"]
            t_pad, t_pk = median(times[False]), median(times[True])
            out.append(
                {
                    "size": size,
                    "params": params,
                    "gradient_checkpointing": ckpt,
                    "token_budget": dyn,
                    "padded_update_s": t_pad,
                    "packed_update_s": t_pk,
                    "padded_runs_s": times[False],
                    "packed_runs_s": times[True],
                    "padded_work": pad,
                    "packed_work": pk,
                    "padding_share": pad["work/update_padding_tokens"] / positions_padded,
                    "positions_removed_share": 1 - positions_packed / positions_padded,
                    "time_cut": 1 - t_pk / t_pad,
                    "goal_met": 1 - t_pk / t_pad >= pad["work/update_padding_tokens"] / positions_padded,
                }
            )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="20m,100m", help="model-size presets (vlmrl.testing.tiny.SIZES)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-response", type=int, default=192)
    ap.add_argument("--micro", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--render", action="store_true", help="rewrite the README section from results/packing.json")
    a = ap.parse_args()
    if a.render:
        import json

        write_readme_section(SECTION, markdown(json.loads((RESULTS / "packing.json").read_text())))
        return 0
    import torch

    torch.set_num_threads(a.threads)
    data = synthetic_data(Path(tempfile.gettempdir()) / "vlmrl-bench-dynbsz-data", train=64, image_size=112)
    rows = []
    with cpu_lock("bench_packing"):
        for size in a.sizes.split(","):
            rows += run_size(a, size.strip(), data)
    result = {"when": now(), "machine": machine(), "versions": versions(), "config": vars(a), "results": rows}
    write_result("packing", result)
    write_readme_section(SECTION, markdown(result))
    return 0


def markdown(result: dict[str, Any]) -> str:
    """The README section of a results file (``--render``: from the committed one, nothing measured)."""
    c, rows = result["config"], result["results"]
    body = [
        f"`python benchmarks/bench_packing.py --sizes {c['sizes']} --prompts {c['prompts']} --n {c['n']} "
        f"--max-response {c['max_response']} --micro {c['micro']} --repeats {c['repeats']}` ({result['when']}). One "
        f"update (one optimizer step) over {c['prompts']} x {c['n']} samples with long-tailed responses (70% 8-32 "
        f"tokens, 10% near {c['max_response']}), padded (`use_remove_padding=False`) and packed (`True`), "
        "alternating; median of the repeats after a warm-up. Positions: token positions the update's forwards run "
        "(`work/update_tokens` + `work/update_padding_tokens`); padding share: the padded update's positions that "
        "are padding. With gradient checkpointing off the padded forward runs each prompt once (shared KV cache), "
        "with it on every sample's whole sequence; packed runs each prompt once either way, so with checkpointing on "
        "it removes more positions than the padding. Token budget: `use_dynamic_bsz=True` with the fixed run's worst "
        "micro-batch as `ppo_max_token_len_per_gpu`, counted as each forward runs it (padded: padding included; "
        "packed: real tokens, each prompt once). The same loss and gradients (tests/test_micro_batches.py, "
        "tests/test_packing.py: within 1e-5). Goal (issue 31): the time cut is at least the padding share.",
        "",
        table(
            [
                "size",
                "checkpointing",
                "micro-batches",
                "padding share",
                "positions removed",
                "padded s",
                "packed s",
                "time cut",
                "cut >= padding share",
            ],
            [
                [
                    r["size"],
                    "on" if r["gradient_checkpointing"] else "off",
                    "token budget" if r["token_budget"] else f"fixed {c['micro']}",
                    f"{r['padding_share']:.0%}",
                    f"{r['positions_removed_share']:.0%}",
                    f"{r['padded_update_s']:.2f}",
                    f"{r['packed_update_s']:.2f}",
                    f"{r['time_cut']:.0%}",
                    "yes" if r["time_cut"] >= r["padding_share"] else "no",
                ]
                for r in rows
            ],
        ),
        "",
        machine_line(result),
        "Raw numbers: `benchmarks/results/packing.json`.",
    ]
    return "\n".join(body)


if __name__ == "__main__":
    sys.exit(main())
