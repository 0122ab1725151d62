"""What vLLM's own CPU settings do to a GRPO rollout: KV block size, chunked prefill, the step's token budget and the
KV cache's size, one engine start per setting, side by side.

    python benchmarks/bench_vllm_cpu.py [--sizes tiny,20m,100m] [--repeats 5]

The workload is one worker's share of bench_limits.py's rollout (``bench_trl_sizes.py``'s plan: 8 prompts of the
synthetic colour task, one 112x112 image each, x n=8 samples x 16 tokens, ``ignore_eos``), on one engine with one
thread. Each setting starts its own engine (vlmrl's ``VLLMRollout``, whose CPU default is a 32-token KV block) and
times ``--repeats`` rollouts after two warm-ups, each from an empty prefix cache (as after a weight push); median
seconds (vlmrl's default runs first and again last, its median over both: a run's first engine is its slowest).
The settings change one thing each from vlmrl's default: ``block_size=128`` (vLLM's CPU default),
``enable_chunked_prefill=False``, ``max_num_batched_tokens=1024`` and a 4 GiB KV cache (``VLLM_CPU_KVCACHE_SPACE``;
vlmrl's default 1).

Each engine runs in a subprocess holding the shared CPU lock. Writes ``benchmarks/results/vllm_cpu.json`` and the
``## vLLM CPU settings`` section of benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

SECTION = "vLLM CPU settings"
PROMPTS, N, TOKENS = 8, 8, 16
DEFAULT = "vlmrl default (block 32)"
SETTINGS: dict[str, dict[str, Any]] = {
    DEFAULT: {},
    "block_size=128 (vLLM's CPU default)": {"engine": {"block_size": 128}},
    "enable_chunked_prefill=False": {"engine": {"enable_chunked_prefill": False}},
    "max_num_batched_tokens=1024": {"engine": {"max_num_batched_tokens": 1024}},
    "KV cache 4 GiB": {"env": {"VLLM_CPU_KVCACHE_SPACE": "4"}},
}


def worker(a: argparse.Namespace) -> dict[str, Any]:
    """In a subprocess: one engine with one setting, ``repeats`` timed rollouts."""
    import torch

    torch.set_num_threads(1)
    from bench_rollout import _prompts

    from vlmrl.config import RolloutConfig
    from vlmrl.rollout.base import SamplingSpec
    from vlmrl.rollout.vllm import VLLMRollout

    setting = SETTINGS[a.setting]
    prompts = _prompts(Path(a.data), Path(a.model), PROMPTS)
    cfg = RolloutConfig(engine_kwargs={"vllm": dict(setting.get("engine", {}))})
    engine = VLLMRollout(a.model, rollout_cfg=cfg, max_model_len=1024, limit_images=1)
    spec = SamplingSpec(n=N, max_tokens=TOKENS, ignore_eos=True)
    try:
        for _ in range(2):
            engine.generate(prompts, spec)
        times = []
        for _ in range(a.repeats):
            engine.reset_caches()
            t0 = time.perf_counter()
            rb = engine.generate(prompts, spec)
            times.append(round(time.perf_counter() - t0, 4))
        block = engine.llm.llm_engine.vllm_config.cache_config.block_size
    finally:
        engine.close()
    return {"times_s": times, "block_size": block, "prompt_tokens": [len(p) for p in rb.prompt_ids[::N]]}


def markdown(res: dict[str, Any]) -> str:
    """The README section."""
    sizes = list(res["results"])
    rows = []
    for name in SETTINGS:
        row = [name]
        for size in sizes:
            r = res["results"][size]
            base = r[DEFAULT]["median_s"]
            m = r[name]["median_s"]
            row.append(f"{m:.2f} s" + ("" if name.startswith("vlmrl") else f" ({m / base:.2f}x)"))
        rows.append(row)
    lengths = next(iter(res["results"].values()))[DEFAULT]["prompt_tokens"]
    return "\n".join(
        [
            f"`python benchmarks/bench_vllm_cpu.py` ({res['date']}). One worker's rollout of bench_limits.py's "
            f"workload: {PROMPTS} prompts ({min(lengths)}-{max(lengths)} tokens, one 112x112 image each) x n={N} x "
            f"{TOKENS} tokens, one engine, one thread, each setting on its own engine changing one thing from vlmrl's "
            f"default; median of {res['config']['repeats']} rollouts after two warm-ups, each from an empty prefix "
            "cache (vlmrl's default on the first and the last engine of each size, both counted). In brackets: "
            "against vlmrl's default.",
            "",
            common.table(["setting", *[f"{s} ({res['params'][s] / 1e6:.1f} M)" for s in sizes]], rows),
            "",
            "A group's samples start together and vLLM shares their prompt's KV through the prefix cache in whole "
            "blocks only: with vLLM's 128-token CPU blocks a prompt shorter than a block is prefilled once per "
            "sample (n times); vlmrl's CPU engines use 32-token blocks (`vlmrl.rollout.vllm.CPU_BLOCK_SIZE`, "
            "`engine_kwargs.vllm.block_size` overrides it).",
            "",
            common.machine_line(res),
        ]
    )


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="tiny,20m,100m")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--work", default=str(common.ROOT / ".cache" / "bench" / "vllm_cpu"))
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--setting", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--worker-out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        Path(a.worker_out).write_text(json.dumps(worker(a)))
        return None
    sizes = [s.strip() for s in a.sizes.split(",") if s.strip()]
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    data = common.synthetic_data(work / "data", train=16, test=4, image_size=112)
    results: dict[str, Any] = {}
    params: dict[str, int] = {}
    for size in sizes:
        with common.cpu_lock(f"build {size}"):
            model = common.preset_model(size)
        params[size] = common.safetensors_params(model)
        results[size] = {}
        # vlmrl's default first and again last (its times from both): the first engine of a run is the slowest
        for k, name in enumerate([*SETTINGS, DEFAULT]):
            setting = SETTINGS[name]
            out = work / f"{size}-{k}.json"
            cmd = [common.PY, __file__, "--worker", "--setting", name, "--model", str(model), "--data", str(data)]
            cmd += ["--repeats", str(a.repeats), "--worker-out", str(out)]
            env = common.bench_env(1)
            env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1")
            env.update(VLLM_CPU_OMP_THREADS_BIND="nobind")
            env.update(setting.get("env", {}))
            r = common.run_json_worker(cmd, env=env, out=out, what=f"{name} at {size}")
            if name in results[size]:
                first = results[size][name]
                r = {**r, "times_s": first["times_s"] + r["times_s"]}
                r["foreign_cpu_frac"] = max(first["foreign_cpu_frac"], r["foreign_cpu_frac"])
            r["median_s"] = common.median(r["times_s"])
            results[size][name] = r
            print(f"[bench_vllm_cpu] {size} {name}: {r['median_s']:.3f} s", flush=True)
    res = {
        **common.result_head("vllm_cpu"),
        "config": {"sizes": sizes, "repeats": a.repeats, "prompts": PROMPTS, "n": N, "tokens": TOKENS},
        "params": params,
        "results": results,
    }
    common.publish("vllm_cpu", SECTION, res, markdown(res))
    return res


if __name__ == "__main__":
    os.environ.setdefault("VLMRL_CACHE", str(common.ROOT / ".cache" / "vlmrl"))
    main()
