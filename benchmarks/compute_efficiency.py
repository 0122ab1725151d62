"""Compute efficiency of the policy update: its achieved FLOP/s against this machine's measured dense-matmul FLOP/s,
and where the rest of an update's time goes (``torch.profiler`` over one vlmrl-style update).

    python benchmarks/compute_efficiency.py matmul --size 20m --rows 1024 --patches 512 --threads 1 --procs 2 --out X
    python benchmarks/compute_efficiency.py profile --size 20m --data DIR --prompts 8 --n 8 --max-tokens 16 --out X

Used by ``bench_trl_sizes.py`` (each command a subprocess under the CPU lock); the readers of the training runs'
token counts (:func:`vlmrl_achieved`, :func:`trl_achieved`) run in the benchmark's own process.

FLOP accounting (the usual 6 N D): a forward and backward costs 6 FLOPs per parameter per token it runs, so an
update achieves ``6 x (language-model parameters x tokens + vision-tower parameters x patches) / update seconds``.
Language-model parameters leave out the input embedding (a lookup, no matmul); tokens are the non-padding positions
the update's forwards ran (vlmrl runs each prompt once for its n samples, so a prompt's tokens count once; TRL runs
every sample's whole sequence); patches are the vision tower's input patches. Attention's score and value products
(~12 x layers x hidden x context FLOPs per token, a few % at these lengths) are not counted, nor is padding: the
figure is useful work per second.

Matmul reference: ``torch.mm`` in fp32 at the model's linear shapes (each layer's projections and MLP, forward and
both backward products; the vision blocks and patch merger at the patch count), each timed for ``--min-s`` seconds,
combined as the time the whole mix takes: ``sum(FLOPs) / sum(FLOPs / rate)``. ``--procs 2 --threads 1`` runs two
processes at once (vlmrl's 2 workers x 1 thread); ``--threads 2`` one process with 2 threads (TRL's).
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

PROFILE_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("autograd engine", ("autograd::", "backward0", "backward1")),
    ("attention", ("scaled_dot_product", "flash_attention", "efficient_attention")),
    ("softmax / log-softmax", ("softmax",)),
    (
        "matmul / conv",
        ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear", "conv", "mkldnn"),
    ),
    ("optimizer + clip", ("adam", "_foreach_", "optimizer")),
    (
        "copy / index / layout",
        (
            "copy",
            "clone",
            "cat",
            "index",
            "gather",
            "scatter",
            "contiguous",
            "_to_copy",
            "stack",
            "empty",
            "zeros",
            "fill_",
            "select",
            "slice",
            "narrow",
            "expand",
            "pad",
            "repeat",
            "masked",
            "where",
            "nonzero",
            "_unsafe_view",
            "as_strided",
            "split",
        ),
    ),
    (
        "elementwise / norm",
        (
            "add",
            "mul",
            "sub",
            "div",
            "silu",
            "gelu",
            "pow",
            "rsqrt",
            "sqrt",
            "mean",
            "sum",
            "neg",
            "exp",
            "log",
            "cos",
            "sin",
            "sigmoid",
            "norm",
            "rotary",
            "clamp",
            "max",
            "min",
            "abs",
            "sign",
            "square",
            "tanh",
            "threshold",
        ),
    ),
)
"""Op-name fragments of each profile group, first match wins (so ``_softmax_backward_data`` is softmax, not
elementwise, and the autograd engine's per-node events, ``autograd::engine::evaluate_function: AddmmBackward0``,
are bookkeeping, not the ops they run); an op matching none is ``other``."""


# ------------------------------------------------------------------------------------------------ shapes, FLOPs


def flop_params(counts: dict[str, int]) -> dict[str, int]:
    """The parameters the FLOP count uses (``vlmrl.testing.tiny.param_counts``): the language model without its
    input embedding, and the vision tower."""
    return {"language_model": counts["language_model"] - counts["embedding"], "vision_tower": counts["vision_tower"]}


def update_flops(params: dict[str, int], tokens: float, patches: float) -> float:
    """6 x (language-model parameters x tokens + vision-tower parameters x patches): one forward and backward."""
    return 6.0 * (params["language_model"] * tokens + params["vision_tower"] * patches)


def linear_shapes(spec: Any, rows: int, patches: int) -> list[tuple[int, int, int, int]]:
    """``(M, K, N, count)`` of the model's dense products for ``rows`` language-model tokens and ``patches`` vision
    patches: each linear's forward ``[M, K] @ [K, N]``, input gradient ``[M, N] @ [N, K]`` and weight gradient
    ``[K, M] @ [M, N]``, times the layers that have it."""
    head = spec.hidden // spec.heads
    kv = spec.kv_heads * head
    inter = spec.intermediate or 2 * spec.hidden
    vh = spec.vision_hidden
    vi = spec.vision_intermediate or 2 * vh
    lm = [(spec.hidden, spec.hidden, 2), (spec.hidden, kv, 2), (spec.hidden, inter, 2), (inter, spec.hidden, 1)]
    vision = [(vh, 3 * vh, 1), (vh, vh, 1), (vh, vi, 2), (vi, vh, 1)]
    out: dict[tuple[int, int, int], int] = {}

    def add(m: int, k: int, n: int, count: int) -> None:
        for shape in ((m, k, n), (m, n, k), (k, m, n)):  # forward, input gradient, weight gradient
            out[shape] = out.get(shape, 0) + count

    for k, n, c in lm:
        add(rows, k, n, c * spec.layers)
    for k, n, c in vision:
        add(patches, k, n, c * spec.vision_depth)
    merged = max(1, patches // 4)  # the patch merger: 2x2 patches -> one token, two linears
    add(merged, 4 * vh, 4 * vh, 1)
    add(merged, 4 * vh, spec.hidden, 1)
    return [(m, k, n, c) for (m, k, n), c in out.items()]


# ---------------------------------------------------------------------------------------------------- matmul


def _mm_rates(shapes: list[tuple[int, int, int, int]], threads: int, min_s: float, barrier: Any = None) -> list[float]:
    """FLOP/s of ``torch.mm`` (fp32) at each shape, each timed for at least ``min_s`` (after ``barrier`` when
    several processes measure together)."""
    import torch

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    rates = []
    for m, k, n, _ in shapes:
        a, b = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
        for _ in range(2):
            torch.mm(a, b)
        if barrier is not None:
            barrier.wait()
        calls, t0 = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - t0) < min_s or calls < 3:
            torch.mm(a, b)
            calls += 1
        rates.append(2.0 * m * k * n * calls / elapsed)
    return rates


def _child(shapes: list[tuple[int, int, int, int]], threads: int, min_s: float, barrier: Any, queue: Any) -> None:
    queue.put(_mm_rates(shapes, threads, min_s, barrier))


def measure_matmul(shapes: list[tuple[int, int, int, int]], threads: int, procs: int, min_s: float) -> dict[str, Any]:
    """Matmul FLOP/s at ``shapes`` with ``procs`` processes of ``threads`` threads measuring at the same time (the
    machine's rate: the processes' rates summed, shape by shape), and the mix's rate."""
    if procs == 1:
        per_proc = [_mm_rates(shapes, threads, min_s)]
    else:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        barrier, queue = ctx.Barrier(procs), ctx.Queue()
        workers = [ctx.Process(target=_child, args=(shapes, threads, min_s, barrier, queue)) for _ in range(procs)]
        for w in workers:
            w.start()
        per_proc = [queue.get(timeout=600) for _ in workers]
        for w in workers:
            w.join()
    rates = [sum(r[i] for r in per_proc) for i in range(len(shapes))]
    flops = [2.0 * m * k * n * c for m, k, n, c in shapes]
    mix = sum(flops) / sum(f / r for f, r in zip(flops, rates))
    return {
        "threads": threads,
        "procs": procs,
        "mix_flops_per_s": mix,
        "shapes": [{"mkn": [m, k, n], "count": c, "flops_per_s": r} for (m, k, n, c), r in zip(shapes, rates)],
    }


# --------------------------------------------------------------------------------------------------- profile


def equal_length_batch(model: Path, data: Path, prompts: int, n: int, max_tokens: int) -> tuple[Any, Any]:
    """Model inputs of ``prompts x n`` samples of the synthetic task, every response ``max_tokens`` random tokens
    (the step-time runs' equal lengths), and random advantages."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from vlmrl.config import DataConfig
    from vlmrl.data import RLDataset
    from vlmrl.models.inputs import build_inputs, process_images
    from vlmrl.rollout.base import SamplingSpec
    from vlmrl.rollout.hf import HFRollout

    processor = AutoProcessor.from_pretrained(model)
    cfg = DataConfig(train_files=str(data / "train.parquet"), max_prompt_length=512, max_response_length=max_tokens)
    samples = RLDataset(cfg.train_files, processor, cfg, verbose=False).get_batch(list(range(prompts)))
    hf = AutoModelForImageTextToText.from_pretrained(model, dtype=torch.float32).eval()
    rb = HFRollout(hf, processor).generate(samples, SamplingSpec(n=n, max_tokens=1, ignore_eos=True))
    g = torch.Generator().manual_seed(0)
    rb.response_ids = [torch.randint(100, 400, (max_tokens,), generator=g).tolist() for _ in range(len(rb))]
    rb.logprobs = [[0.0] * max_tokens for _ in range(len(rb))]
    rb.finish_reasons = ["length"] * len(rb)
    x = build_inputs(samples, rb, process_images(processor, samples), processor.tokenizer.pad_token_id)
    return x, torch.randn(x.batch_size, generator=g)


def batch_counts(x: Any) -> dict[str, int]:
    """What one update over ``x`` runs, as vlmrl's shared-prompt forward runs it: ``tokens`` (each distinct
    prompt's tokens once, every response token), ``padding_tokens`` (the padded layout's other positions: prompts
    left-padded to the longest, responses right-padded) and ``patches`` (vision-tower input patches, once per
    prompt)."""
    plen = x.input_ids.shape[1] - x.responses.shape[1]
    first = {int(p): row for row, p in reversed(list(enumerate(x.prompt_of.tolist())))}
    prompt_real = int(sum(int(x.attention_mask[row, :plen].sum()) for row in first.values()))
    response_real = int(x.response_mask.sum())
    positions = len(first) * plen + x.responses.numel()
    patches = sum(int(x.images[p].pixel_values.shape[0]) for p in first if x.images[p].pixel_values is not None)
    real = prompt_real + response_real
    return {"tokens": real, "padding_tokens": positions - real, "patches": patches, "prompt_tokens": prompt_real}


def group_of(name: str) -> str:
    """The profile group of an op name (``PROFILE_GROUPS``; ``other`` when none matches)."""
    low = name.lower()
    for group, fragments in PROFILE_GROUPS:
        if any(f in low for f in fragments):
            return group
    return "other"


def summarise_profile(events: Any, wall_s: float, top: int = 8) -> dict[str, Any]:
    """Self CPU seconds per group (and share of the update's wall time; ``untraced`` = wall time no op accounts
    for: Python, the autograd engine's bookkeeping), the matmul group's FLOPs as the profiler counts them, and the
    ``top`` ops by self time."""
    groups: dict[str, float] = {}
    mm_flops = 0.0
    ops = []
    for e in events:
        self_s = e.self_cpu_time_total / 1e6
        group = group_of(e.key)
        groups[group] = groups.get(group, 0.0) + self_s
        if group == "matmul / conv":
            mm_flops += float(getattr(e, "flops", 0) or 0)
        ops.append((self_s, e.key, e.count))
    traced = sum(groups.values())
    groups["untraced"] = max(0.0, wall_s - traced)
    ops.sort(reverse=True)
    mm_s = groups.get("matmul / conv", 0.0)
    return {
        "wall_s": wall_s,
        "groups_s": groups,
        "groups_share": {k: v / wall_s for k, v in groups.items()},
        "matmul_profiler_flops": mm_flops,
        "matmul_flops_per_s": mm_flops / mm_s if mm_s else None,
        "top_ops": [{"op": k, "self_s": s, "calls": c} for s, k, c in ops[:top]],
    }


def profile_update(a: argparse.Namespace) -> dict[str, Any]:
    """One warm-up update, one timed, one profiled, of a ``PolicyWorker`` in this process (no process group, so no
    FSDP collectives: one worker's compute), on ``prompts x n`` equal-length samples; ``--packed`` sets
    ``actor_rollout_ref.model.use_remove_padding`` (recorded as unavailable where the config has no such key)."""
    import torch
    from transformers import AutoProcessor

    torch.set_num_threads(a.threads)
    from vlmrl.config import ActorRolloutRefConfig
    from vlmrl.models import qwen_vl
    from vlmrl.testing.tiny import SIZES, ensure_tiny_model, param_counts
    from vlmrl.workers.policy import PolicyWorker

    out: dict[str, Any] = {"size": a.size, "threads": a.threads, "packed": a.packed}
    arr = ActorRolloutRefConfig()
    if a.packed:
        if not hasattr(arr.model, "use_remove_padding"):
            return {**out, "unavailable": "actor_rollout_ref.model.use_remove_padding is not a vlmrl config key yet"}
        arr.model.use_remove_padding = True
    spec = SIZES[a.size]
    model = ensure_tiny_model(0, spec)
    x, adv = equal_length_batch(model, Path(a.data), a.prompts, a.n, a.max_tokens)
    arr.model.path = str(model)
    arr.model.enable_gradient_checkpointing = False
    arr.actor.ppo_micro_batch_size_per_gpu = x.batch_size  # one micro-batch, as each worker runs it in the bench
    arr.actor.entropy_coeff = 0.0
    arr.actor.optim.lr, arr.actor.optim.weight_decay, arr.actor.grad_clip = 2e-3, 0.0, 1.0
    out["samples"] = x.batch_size
    ids = qwen_vl.vision_token_ids(AutoProcessor.from_pretrained(model).tokenizer)
    worker = PolicyWorker(arr, device="cpu", total_steps=100, vision_ids=ids, seed=1, max_response_length=a.max_tokens)
    worker.update(x, adv, x.batch_size)  # warm-up
    t0 = time.perf_counter()
    worker.update(x, adv, x.batch_size)
    plain_s = time.perf_counter() - t0
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        t0 = time.perf_counter()
        worker.update(x, adv, x.batch_size)
        prof_s = time.perf_counter() - t0
    counts = batch_counts(x)
    flops = update_flops(flop_params(param_counts(spec)), counts["tokens"], counts["patches"])
    summary = summarise_profile(prof.key_averages(), prof_s)
    return {
        **out,
        "update_s": plain_s,
        "batch": counts,
        "flops_6nd": flops,
        "achieved_flops_per_s": flops / plain_s,
        "matmul_flops_over_6nd": summary["matmul_profiler_flops"] / flops if flops else None,
        "profile": summary,
    }


# ----------------------------------------------------------------------------------------- training-run readers

VLMRL_COUNTS = ("update_tokens", "update_padding_tokens", "update_vision_patches")
"""vlmrl's per-step counts of what the update's forwards ran, summed over the workers: ``work/<name>`` (``perf/<name>``
read too)."""
COUNT_PREFIXES = ("work/", "perf/")


def _per_step(params: dict[str, int], steps: list[tuple[float, float, float, float]]) -> dict[str, Any]:
    """Medians over steps of (tokens, padding, patches, update seconds) and the FLOP/s they make."""
    med = statistics.median
    rates = [update_flops(params, t, v) / s for t, _, v, s in steps if s > 0]
    tokens, padding = med([s[0] for s in steps]), med([s[1] for s in steps])
    return {
        "steps": len(steps),
        "tokens": tokens,
        "padding_tokens": padding,
        "padding_share": padding / (tokens + padding) if tokens + padding else 0.0,
        "patches": med([s[2] for s in steps]),
        "update_s": med([s[3] for s in steps]),
        "flops_6nd": update_flops(params, tokens, med([s[2] for s in steps])),
        "achieved_flops_per_s": med(rates) if rates else None,
    }


def _count(row: dict[str, Any], name: str) -> float | None:
    for prefix in COUNT_PREFIXES:
        if prefix + name in row:
            return float(row[prefix + name])
    return None


def vlmrl_achieved(rows: list[dict[str, Any]], params: dict[str, int]) -> dict[str, Any]:
    """vlmrl's update FLOP/s per step from its metrics.jsonl rows (``work/update_tokens``, ``..._padding_tokens``,
    ``..._vision_patches``: summed over the workers; ``timing/update_s``: the slowest worker's), or
    ``{"missing": [...], "note": "metric missing: ..."}`` naming the metrics the rows lack."""
    missing = [COUNT_PREFIXES[0] + k for k in VLMRL_COUNTS if not rows or any(_count(r, k) is None for r in rows)]
    missing += ["timing/update_s"] if not rows or any("timing/update_s" not in r for r in rows) else []
    if missing:
        return {"missing": missing, "note": "metric missing: vlmrl's metrics.jsonl does not log " + ", ".join(missing)}
    steps = [(*(_count(r, k) for k in VLMRL_COUNTS), float(r["timing/update_s"])) for r in rows]
    return _per_step(params, steps)  # type: ignore[arg-type]


def trl_achieved(steps: list[dict[str, Any]], params: dict[str, int]) -> dict[str, Any]:
    """TRL's update FLOP/s per step from ``trl_runner.py``'s rows (its loss forwards' mask sums and pixel rows; the
    update = the step less generation and scoring), or ``{"missing": [...]}``."""
    keys = ("update_tokens", "update_padding_tokens", "update_vision_patches")
    missing = [k for k in keys if not steps or any(k not in s for s in steps)]
    if missing:
        return {"missing": missing, "note": "metric missing: trl_runner.py did not log " + ", ".join(missing)}
    return _per_step(
        params, [(s[keys[0]], s[keys[1]], s[keys[2]], s["step_s"] - s.get("generate_and_score_s", 0.0)) for s in steps]
    )


# ------------------------------------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> None:
    """``matmul`` or ``profile``, writing JSON to ``--out``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    mm = sub.add_parser("matmul", help="torch.mm FLOP/s at a preset's shapes")
    mm.add_argument("--rows", type=int, required=True, help="language-model tokens per forward (M)")
    mm.add_argument("--patches", type=int, required=True, help="vision patches per forward")
    mm.add_argument("--procs", type=int, default=1, help="processes measuring at the same time")
    mm.add_argument("--min-s", type=float, default=0.15, help="seconds each shape is timed for")
    pr = sub.add_parser("profile", help="torch.profiler over one vlmrl-style update")
    pr.add_argument("--data", required=True, help="synthetic task folder (train.parquet)")
    pr.add_argument("--prompts", type=int, default=8)
    pr.add_argument("--n", type=int, default=8)
    pr.add_argument("--max-tokens", type=int, default=16)
    pr.add_argument("--packed", action="store_true", help="actor_rollout_ref.model.use_remove_padding=True")
    for p in (mm, pr):
        p.add_argument("--size", required=True, help="vlmrl.testing.tiny.SIZES preset")
        p.add_argument("--threads", type=int, default=1)
        p.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    if a.cmd == "matmul":
        from vlmrl.testing.tiny import SIZES

        shapes = linear_shapes(SIZES[a.size], a.rows, a.patches)
        res = {"size": a.size, "rows": a.rows, "patches": a.patches}
        res.update(measure_matmul(shapes, a.threads, a.procs, a.min_s))
    else:
        res = profile_update(a)
    Path(a.out).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    os.environ.setdefault("VLMRL_CACHE", str(Path(__file__).resolve().parent.parent / ".cache" / "vlmrl"))
    sys.exit(main())
