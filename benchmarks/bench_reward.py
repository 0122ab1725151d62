"""Reward scoring overhead: the driver's own thread (``reward.num_workers=0``, no timeout possible) against worker
processes (``num_workers=1``, the default, and 2), where ``reward.timeout_s`` is enforced by ending the worker.

    python benchmarks/bench_reward.py [--samples 128] [--repeats 20]

A step's worth of samples (16 prompts x 8 samples, one 112x112 image per prompt) scored by the quick start's reward
(``synthetic``: text only, no images sent to workers) and by an image reward (``visual_consistency``: each sample's
images are pickled to the worker). The median of ``--repeats`` scorings after a warm-up.

Writes ``benchmarks/results/reward.json`` and the ``## Reward scoring`` section of ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import cpu_lock, machine_line, median, result_head, table, write_readme_section, write_result  # noqa: E402


def samples(n: int, per_prompt: int = 8) -> list:
    from PIL import Image, ImageDraw

    from vlmrl.batch import RewardSample

    out = []
    for i in range(n):
        if i % per_prompt == 0:
            im = Image.new("RGB", (112, 112), "white")
            ImageDraw.Draw(im).rectangle((20, 20, 90, 90), fill=("red", "green", "blue")[i // per_prompt % 3])
        colour = ("red", "green", "blue")[i % 3]
        out.append(
            RewardSample(
                response=f"The shape is {colour}.",
                prompt="What colour is the shape?",
                ground_truth="red",
                data_source="synthetic/colour",
                images=[im],
                extra_info={"family": "colour", "answer": "red", "choices": ["red", "green", "blue"]},
                image_scales=[(1.0, 1.0)],
            )
        )
    return out


def measure(function: str, workers: int, batch: list, repeats: int) -> dict[str, float]:
    from vlmrl.config import CustomRewardFunctionConfig, RewardConfig
    from vlmrl.scoring import RewardManager

    cfg = RewardConfig(function=function, num_workers=workers, timeout_s=30.0 if workers else 0.0)  # type: ignore[call-arg]
    t0 = time.perf_counter()
    with RewardManager(cfg, CustomRewardFunctionConfig()) as rm:
        rm.score(batch[:1])
        start_s = time.perf_counter() - t0
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            out = rm.score(batch)
            times.append(time.perf_counter() - t)
        assert out.metrics["reward/errors"] == 0, out.metrics
    return {"step_s": median(times), "per_sample_ms": 1000 * median(times) / len(batch), "startup_s": start_s}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=20)
    a = ap.parse_args()
    head = result_head("reward")  # before anything runs: the commit and checkout measured
    batch = samples(a.samples)
    rows = {}
    with cpu_lock("bench_reward"):
        for function in ("synthetic", "visual_consistency"):
            for workers in (0, 1, 2):
                rows[f"{function}/{workers}"] = measure(function, workers, batch, a.repeats)
                print(function, workers, rows[f"{function}/{workers}"], flush=True)
    result = {**head, "config": vars(a), "results": rows}
    write_result("reward", result)
    body = [
        f"`python benchmarks/bench_reward.py --samples {a.samples} --repeats {a.repeats}` ({result['date']}). One "
        f"step's samples ({a.samples}: 16 prompts x 8, one 112x112 image per prompt) scored in the driver "
        "(`reward.num_workers=0`: no timeout can stop a blocked call there) and in 1 (the default) or 2 worker "
        "processes (a call past `reward.timeout_s` is stopped by ending its worker; a fast function's calls go "
        "several per task). Median of the repeats after a warm-up; start-up is the pool's first call.",
        "",
    ]
    table_rows = []
    for function in ("synthetic", "visual_consistency"):
        base = rows[f"{function}/0"]["step_s"]
        for workers in (0, 1, 2):
            r = rows[f"{function}/{workers}"]
            extra = "-" if workers == 0 else f"{1000 * (r['step_s'] - base):+.0f} ms"
            table_rows.append(
                [
                    f"`{function}`",
                    "driver" if workers == 0 else f"{workers} process(es)",
                    f"{r['step_s'] * 1000:.1f}",
                    f"{r['per_sample_ms']:.2f}",
                    extra,
                    f"{r['startup_s']:.2f}",
                ]
            )
    body.append(table(["reward", "where", "ms per step", "ms per sample", "vs driver", "start-up s"], table_rows))
    body += ["", machine_line(result), "Raw numbers: `benchmarks/results/reward.json`."]
    write_readme_section("Reward scoring", "\n".join(body))
    return 0


if __name__ == "__main__":
    sys.exit(main())
