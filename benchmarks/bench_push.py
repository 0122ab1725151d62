"""Weight push into the CPU vLLM engine: vLLM's ``reload_weights`` against vlmrl's direct reload, side by side.

    python benchmarks/bench_push.py [--sizes tiny,20m,100m] [--repeats 5]

For each shape (the random-weight Qwen2.5-VL shapes of bench_rollout.py) one subprocess starts one engine and pushes
the full fp32 state dict (perturbed before every push) alternately through vLLM's layer-by-layer
``collective_rpc("reload_weights")`` and through ``VLLMRollout.update_weights`` (on CPU: ``cpu_reload.direct_reload``),
both followed by the same cache resets; median seconds per path after one warm-up push of each. Exactness: for one
perturbed state dict, greedy samples and their log-probs after each path must be equal, to the bit (the run fails
otherwise). Peak resident memory during each path's pushes is recorded (the direct path unpacks the packed layers'
weights for the length of a push).

Each subprocess holds the shared CPU lock. Writes ``benchmarks/results/push.json`` and the ``## Weight push on CPU``
section of benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from bench_rollout import SHAPES, _prompts  # noqa: E402

SECTION = "Weight push on CPU"


class PeakRss:
    """Peak resident memory of this process while ``with`` runs (10 ms sampling), in bytes above its start."""

    def __enter__(self) -> PeakRss:
        import psutil

        self._proc = psutil.Process()
        self.start = self.peak = self._proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)

    @property
    def above_start(self) -> int:
        return self.peak - self.start


def push_worker(a: argparse.Namespace) -> dict[str, Any]:
    """Run in a subprocess: one engine, pushes through both paths alternately, the exactness check."""
    import torch
    from transformers import AutoModelForImageTextToText

    from vlmrl.config import RolloutConfig
    from vlmrl.models import qwen_vl
    from vlmrl.rollout.base import SamplingSpec
    from vlmrl.rollout.vllm import VLLMRollout

    torch.set_num_threads(a.threads)
    model = Path(a.model)
    engine = VLLMRollout(str(model), rollout_cfg=RolloutConfig(), max_model_len=512, limit_images=1, device="cpu")
    if engine.direct_push_unsupported is not None:
        raise RuntimeError(f"the direct push is not used here: {engine.direct_push_unsupported}")
    hf = AutoModelForImageTextToText.from_pretrained(model, dtype=torch.float32)
    params = list(hf.named_parameters())

    def weights() -> Any:
        return ((qwen_vl.engine_weight_name(n), p.detach()) for n, p in params)

    def by_vllm() -> None:
        engine.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights()})
        engine.reset_caches()

    def direct() -> None:
        engine.update_weights(weights())

    paths = {"vllm_reload": by_vllm, "direct": direct}
    times: dict[str, list[float]] = {k: [] for k in paths}
    peak: dict[str, int] = {k: 0 for k in paths}
    step = 0
    for i in range(a.repeats + 1):
        for name, push in paths.items():
            step += 1
            with torch.no_grad():
                for _, p in params:
                    p.add_(1e-4 * step)
            with PeakRss() as mem:
                t = time.perf_counter()
                push()
                elapsed = time.perf_counter() - t
            peak[name] = max(peak[name], mem.above_start)
            if i:  # the first push of each path is a warm-up
                times[name].append(elapsed)
    prompts = _prompts(Path(a.data), model, 2)
    greedy = SamplingSpec(n=1, max_tokens=16, greedy=True)
    outs = {}
    for name, push in paths.items():
        push()
        rb = engine.generate(prompts, greedy)
        outs[name] = (rb.response_ids, rb.logprobs)
    if outs["vllm_reload"] != outs["direct"]:
        raise RuntimeError("the direct push and vLLM's reload_weights left the engine computing different outputs")
    return {
        "times_s": times,
        "peak_rss_above_start_bytes": peak,
        "bytes": sum(p.numel() * p.element_size() for _, p in params),
        "params": sum(p.numel() for _, p in params),
        "tensors": len(params),
        "equal_outputs": True,
    }


def markdown(res: dict[str, Any]) -> str:
    """The README section."""
    c = res["config"]
    lines = [
        f"`python benchmarks/bench_push.py --repeats {c['repeats']}` ({res['date']}). The full fp32 state dict "
        "(perturbed before every push) pushed into one running CPU engine, alternately through vLLM's "
        "`reload_weights` (layer by layer, its own tracking of every copy) and through vlmrl's direct reload "
        "(`vlmrl/rollout/cpu_reload.py`, what `VLLMRollout.update_weights` uses on CPU), both followed by the same "
        f"cache resets; one process, {c['threads']} thread{'s' if c['threads'] > 1 else ''}; median of "
        f"{c['repeats']} pushes per path after a "
        "warm-up push. After one push through each path the engine's greedy samples and log-probs were equal to the "
        "bit at every shape.",
        "",
    ]
    rows = []
    for shape, r in res["results"].items():
        v, d = common.median(r["times_s"]["vllm_reload"]), common.median(r["times_s"]["direct"])
        mem = r["peak_rss_above_start_bytes"]
        rows.append(
            [
                f"{shape} ({r['params'] / 1e6:.1f} M)",
                f"{r['bytes'] / 2**20:.0f}",
                f"{v * 1000:.1f}",
                f"{d * 1000:.1f}",
                f"{d / v:.2f}x",
                f"{mem['vllm_reload'] / 2**20:.0f} / {mem['direct'] / 2**20:.0f}",
            ]
        )
    header = ["shape (params)", "MiB", "vLLM reload_weights ms", "direct ms", "direct / vLLM"]
    header += ["peak RSS above start, MiB (vLLM / direct)"]
    lines.append(common.table(header, rows))
    lines += [
        "",
        "Peak RSS above start: the most this process's resident memory rose during that path's pushes (10 ms "
        "sampling). The direct path holds the unpacked weights of every packed layer for the length of a push (one "
        "copy of the linear layers' weights); vLLM's reload holds them one layer at a time.",
        "",
        common.machine_line(res),
        "Raw numbers: `benchmarks/results/push.json`.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    """Build the shapes, run one subprocess per shape, write the results and the README section."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="tiny,20m,100m", help=f"comma list of {','.join(SHAPES)}")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--work", default=str(common.ROOT / ".cache" / "bench" / "push"))
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--worker-out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        Path(a.worker_out).write_text(json.dumps(push_worker(a)))
        return None
    sizes = [s.strip() for s in a.sizes.split(",") if s.strip()]
    bad = [s for s in sizes if s not in SHAPES]
    if bad:
        p.error(f"unknown --sizes {bad}; choose from {list(SHAPES)}")
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    data = common.synthetic_data(work / "data", train=16, test=16, image_size=56)
    results: dict[str, Any] = {}
    for shape in sizes:
        with common.cpu_lock(f"build {shape}"):
            model = common.tiny_model(seed=0, **SHAPES[shape])
        out = work / f"{shape}.json"
        cmd = [common.PY, __file__, "--worker", "--model", str(model), "--data", str(data)]
        cmd += ["--repeats", str(a.repeats), "--threads", str(a.threads), "--worker-out", str(out)]
        env = common.bench_env(a.threads)
        env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND="nobind")
        print(f"[bench_push] {shape}", flush=True)
        r = common.run_json_worker(cmd, env=env, out=out, what=f"push on {shape}")
        r["spec"] = SHAPES[shape]
        results[shape] = r
        v, d = common.median(r["times_s"]["vllm_reload"]), common.median(r["times_s"]["direct"])
        print(f"[bench_push]   vLLM reload {v * 1000:.1f} ms, direct {d * 1000:.1f} ms ({d / v:.2f}x)", flush=True)
    res = {
        **common.result_head("push"),
        "config": {"repeats": a.repeats, "threads": a.threads, "sizes": sizes},
        "results": results,
    }
    path = common.write_result("push", res)
    common.write_readme_section(SECTION, markdown(res))
    print(f"[bench_push] wrote {path}", flush=True)
    return res


if __name__ == "__main__":
    os.environ.setdefault("VLMRL_CACHE", str(common.ROOT / ".cache" / "vlmrl"))
    main()
