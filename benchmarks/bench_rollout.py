"""Rollout engines: generated tokens/s of vLLM (``VLLMRollout``) vs HF ``generate`` (``HFRollout``) on the same prompts,
images, n and lengths, at three Qwen2.5-VL shapes (random weights); plus weight push time vs model size.

    python benchmarks/bench_rollout.py [--rounds 2] [--repeats 3] [--sizes tiny,20m,100m]

Every (engine, shape, round) runs in its own subprocess (clean memory, one engine at a time) holding the shared CPU
lock; rounds alternate vLLM, HF, vLLM, HF. Inside a subprocess: engine start, one warm-up batch, then ``--repeats``
timed batches (median). Lengths are equal: ``ignore_eos`` on both engines (vLLM: the EOS ids are also removed from
``stop_token_ids``, see the README note). The vLLM subprocess then times ``update_weights`` (the full HF state
dict, perturbed each time, pushed into the running engine, prefix and encoder caches reset).
Both engines run in one process with ``--threads`` threads (default 2, the machine's cores).

Writes ``benchmarks/results/rollout.json`` and the ``## Rollout engines and weight push`` section of the README.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from vlmrl.testing.tiny import SIZES, spec_overrides  # noqa: E402

SECTION = "Rollout engines and weight push"

# the model-size presets of vlmrl/testing/tiny.py (SIZES: vocab stays the tiny tokenizer's, hidden/layers grow,
# head_dim >= 32 for vLLM's CPU attention), as the TinySpec fields that differ from the tiny model's
SHAPES: dict[str, dict[str, Any]] = {name: spec_overrides(spec) for name, spec in SIZES.items()}


# ------------------------------------------------------------------------------------------ engine subprocess


def _prompts(data: Path, model: Path, count: int) -> list[Any]:
    """``count`` PromptSamples from the synthetic parquet, built by vlmrl's dataset."""
    from transformers import AutoProcessor

    from vlmrl.config import DataConfig
    from vlmrl.data import RLDataset

    processor = AutoProcessor.from_pretrained(model)
    cfg = DataConfig(train_files=str(data / "train.parquet"), max_prompt_length=512, max_response_length=64)
    ds = RLDataset(cfg.train_files, processor, cfg, split="train")
    return ds.get_batch(list(range(count)))


def engine_worker(a: argparse.Namespace) -> dict[str, Any]:
    """Run in a subprocess: start one engine, warm up, time ``repeats`` batches (and weight pushes for vLLM)."""
    import torch

    torch.set_num_threads(a.threads)
    from vlmrl.rollout.base import SamplingSpec

    model = Path(a.model)
    prompts = _prompts(Path(a.data), model, a.prompts)
    spec = SamplingSpec(n=a.n, max_tokens=a.max_tokens, temperature=1.0, ignore_eos=True)
    out: dict[str, Any] = {"engine": a.engine}
    t0 = time.perf_counter()
    if a.engine == "vllm":
        engine = _equal_length_vllm(model, a.max_tokens)
    else:
        from transformers import AutoModelForImageTextToText, AutoProcessor

        from vlmrl.rollout.hf import HFRollout

        hf = AutoModelForImageTextToText.from_pretrained(model, dtype=torch.float32, attn_implementation="sdpa").eval()
        engine = HFRollout(hf, AutoProcessor.from_pretrained(model))
    out["start_s"] = time.perf_counter() - t0
    engine.generate(prompts, spec)  # warm-up
    times, tokens, prompt_tokens = [], [], []
    for _ in range(a.repeats):
        t = time.perf_counter()
        rb = engine.generate(prompts, spec)
        times.append(time.perf_counter() - t)
        tokens.append(sum(len(r) for r in rb.response_ids))
        prompt_tokens.append(sum(len(p) for p in rb.prompt_ids[:: spec.n]))
    out.update(times_s=times, generated_tokens=tokens, prompt_tokens=prompt_tokens)
    if a.engine == "vllm":
        out["push"] = _time_push(engine, model, a.repeats)
    return out


def _equal_length_vllm(model: Path, max_tokens: int) -> Any:
    """A ``VLLMRollout``: with ``ignore_eos`` it passes no EOS ``stop_token_ids``, so lengths are equal."""
    from vlmrl.config import RolloutConfig
    from vlmrl.rollout.vllm import VLLMRollout

    return VLLMRollout(str(model), rollout_cfg=RolloutConfig(), max_model_len=512, limit_images=1, device="cpu")


def _time_push(engine: Any, model: Path, repeats: int) -> dict[str, Any]:
    """Median seconds of ``update_weights`` with the whole (perturbed) HF state dict, and its size."""
    import torch
    from transformers import AutoModelForImageTextToText

    from vlmrl.models import qwen_vl

    hf = AutoModelForImageTextToText.from_pretrained(model, dtype=torch.float32)
    params = list(hf.named_parameters())
    nbytes = sum(p.numel() * p.element_size() for _, p in params)
    times = []
    for i in range(repeats + 1):
        with torch.no_grad():
            for _, p in params:
                p.add_(1e-4 * (i + 1))
        t = time.perf_counter()
        engine.update_weights((qwen_vl.engine_weight_name(n), p.detach()) for n, p in params)
        if i:  # the first push is a warm-up
            times.append(time.perf_counter() - t)
    return {"times_s": times, "bytes": nbytes, "params": sum(p.numel() for _, p in params), "tensors": len(params)}


# ----------------------------------------------------------------------------------------------- driver


def run_engine(engine: str, shape: str, model: Path, data: Path, a: argparse.Namespace, tag: str) -> dict[str, Any]:
    """One engine subprocess under the CPU lock; returns its JSON."""
    out = Path(a.work) / f"{tag}.json"
    cmd = [common.PY, __file__, "--worker", "--engine", engine, "--model", str(model), "--data", str(data)]
    cmd += ["--prompts", str(a.prompts), "--n", str(a.n), "--max-tokens", str(a.max_tokens)]
    cmd += ["--repeats", str(a.repeats), "--threads", str(a.threads), "--worker-out", str(out)]
    env = common.bench_env(a.threads)
    env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="2", VLLM_CPU_OMP_THREADS_BIND="nobind")
    return common.run_json_worker(cmd, env=env, out=out, what=f"{engine} on {shape}")


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median tokens/s over every timed batch of every round of one (engine, shape)."""
    tps = [tok / t for r in runs for tok, t in zip(r["generated_tokens"], r["times_s"])]
    per_round = [common.median([tok / t for tok, t in zip(r["generated_tokens"], r["times_s"])]) for r in runs]
    out = {
        "tokens_per_s": common.median(tps),
        "round_medians_tokens_per_s": per_round,
        "batch_s": common.median([t for r in runs for t in r["times_s"]]),
        "generated_tokens": runs[0]["generated_tokens"][0],
        "prompt_tokens": runs[0]["prompt_tokens"][0],
        "start_s": common.median([r["start_s"] for r in runs]),
    }
    if "push" in runs[0]:
        out["push_s"] = common.median([t for r in runs for t in r["push"]["times_s"]])
        out["push_bytes"] = runs[0]["push"]["bytes"]
        out["params"] = runs[0]["push"]["params"]
        out["tensors"] = runs[0]["push"]["tensors"]
    return out


def markdown(res: dict[str, Any]) -> str:
    """The README section."""
    c = res["config"]
    lines = [
        f"`python benchmarks/bench_rollout.py --rounds {c['rounds']} --repeats {c['repeats']}` ({res['date']}). "
        f"{c['prompts']} prompts (synthetic colour task, one {c['image_size']}x{c['image_size']} image each) x "
        f"n={c['n']} x {c['max_tokens']} generated tokens (`ignore_eos`, equal lengths), temperature 1, fp32, one "
        f"process with {c['threads']} threads per engine; random-weight Qwen2.5-VL shapes with the tiny tokenizer "
        f"(vocab {c['vocab']}). Median over {c['rounds']} alternating rounds x {c['repeats']} timed batches.",
        "",
    ]
    rows = []
    for shape, r in res["results"].items():
        v, h = r["vllm"], r["hf"]
        rows.append(
            [
                f"{shape} ({v['params'] / 1e6:.1f} M)",
                f"{r['spec'].get('hidden', 64)} / {r['spec'].get('layers', 2)}",
                f"{v['tokens_per_s']:,.0f}",
                f"{h['tokens_per_s']:,.0f}",
                f"{v['tokens_per_s'] / h['tokens_per_s']:.2f}x",
                f"{v['batch_s']:.2f} / {h['batch_s']:.2f}",
                f"{v['push_s'] * 1000:.0f}",
                f"{v['push_bytes'] / 2**20:.0f}",
                f"{v['push_bytes'] / 2**30 / v['push_s']:.2f}",
            ]
        )
    header = ["shape (params)", "hidden / layers", "vLLM tok/s", "HF tok/s", "vLLM / HF", "batch s (vLLM / HF)"]
    header += ["push ms", "push MiB", "push GiB/s"]
    lines.append(common.table(header, rows))
    lines += [
        "",
        "tok/s counts generated tokens only (prompt prefill, image encoding included in the time). Push = "
        "`VLLMRollout.update_weights` with the full fp32 state dict (every tensor, vision tower included) into the "
        "running engine, prefix + encoder caches reset; median of "
        f"{c['repeats']} pushes per round after a warm-up push.",
        "",
        "Note: vLLM stops on `stop_token_ids` even with `ignore_eos=True`; `VLLMRollout` therefore passes no EOS "
        "ids as stop tokens when `rollout.ignore_eos` is set, so lengths are equal.",
        "",
        common.machine_line(res),
        "Raw numbers: `benchmarks/results/rollout.json`.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    """Build the shapes, run the engine subprocesses alternately, write the results and the README section."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="tiny,20m,100m", help=f"comma list of {','.join(SHAPES)}")
    p.add_argument("--rounds", type=int, default=2, help="alternating vLLM/HF rounds per shape")
    p.add_argument("--repeats", type=int, default=3, help="timed batches per subprocess")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--image-size", type=int, default=112)
    p.add_argument("--retries", type=int, default=2, help="re-runs of a run during which others used > 10%% CPU")
    p.add_argument("--work", default=str(common.ROOT / ".cache" / "bench" / "rollout"))
    # subprocess mode
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--engine", choices=["vllm", "hf"], help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--worker-out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        res = engine_worker(a)
        Path(a.worker_out).write_text(json.dumps(res))
        return None
    sizes = [s.strip() for s in a.sizes.split(",") if s.strip()]
    bad = [s for s in sizes if s not in SHAPES]
    if bad:
        p.error(f"unknown --sizes {bad}; choose from {list(SHAPES)}")
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    data = common.synthetic_data(work / f"data{a.image_size}", train=max(64, a.prompts), image_size=a.image_size)
    results: dict[str, Any] = {}
    for shape in sizes:
        with common.cpu_lock(f"build {shape}"):
            model = common.tiny_model(seed=0, **SHAPES[shape])
        runs: dict[str, list[dict[str, Any]]] = {"vllm": [], "hf": []}
        for r in range(a.rounds):
            for engine in ("vllm", "hf"):
                print(f"[bench_rollout] {shape} round {r + 1}/{a.rounds}: {engine}", flush=True)
                tag = f"{shape}_{engine}_{r}"
                job = functools.partial(run_engine, engine, shape, model, data, a, tag)
                runs[engine].append(common.uncontended(job, tag, a.retries))
                last = runs[engine][-1]
                tps = common.median([t / s for t, s in zip(last["generated_tokens"], last["times_s"])])
                print(f"[bench_rollout]   {tps:,.0f} generated tokens/s", flush=True)
        results[shape] = {"spec": SHAPES[shape], "model": str(model), "runs": runs}
        results[shape].update({e: summarise(rs) for e, rs in runs.items()})
    res = {
        **common.result_head("rollout"),
        "config": {
            "rounds": a.rounds,
            "repeats": a.repeats,
            "prompts": a.prompts,
            "n": a.n,
            "max_tokens": a.max_tokens,
            "threads": a.threads,
            "image_size": a.image_size,
            "vocab": 512,
            "sizes": sizes,
        },
        "results": results,
    }
    path = common.write_result("rollout", res)
    common.write_readme_section(SECTION, markdown(res))
    print(f"[bench_rollout] wrote {path}", flush=True)
    for shape, r in results.items():
        v, h = r["vllm"], r["hf"]
        print(
            f"{shape}: vLLM {v['tokens_per_s']:,.0f} tok/s, HF {h['tokens_per_s']:,.0f} tok/s, push {v['push_s']:.3f} s"
        )
    return res


if __name__ == "__main__":
    os.environ.setdefault("VLMRL_CACHE", str(common.ROOT / ".cache" / "vlmrl"))
    main()
