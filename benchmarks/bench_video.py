"""Video against images at the tiny shape: time per training step, and what the tiny model learns from video.

    python benchmarks/bench_video.py [--rounds 2] [--steps 120] [--temporal-steps 600]

Step time: the quick start's recipe (``configs/tiny_cpu.yaml``: 16 prompts x 8 samples, vLLM rollout, 2 worker
processes) on the image colour task (112x112 images: 16 image tokens a prompt) and on the video colour task (4 frames
of 112x112 at 2 fps: 2 frame pairs x 16 = 32 video tokens), runs alternating image, video, ...; median step time of
each run (its first 2 steps dropped) and of its stages. Learning: each run's greedy validation before training, at
the middle and at the end, and the first step where the 5-step mean training reward reaches 0.9. Temporal tasks
(``video_order``, ``video_motion``) and the image ``position`` family (a spatial relation, for comparison): one run
each of ``--temporal-steps``.

Writes ``benchmarks/results/video.json`` and the ``## Video`` section of ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    ROOT,
    machine,
    machine_line,
    median,
    moving_average_hit,
    now,
    synthetic_data,
    table,
    tiny_model,
    uncontended,
    versions,
    vlmrl_train,
    write_readme_section,
    write_result,
)

STAGES = (
    "timing/data_s",
    "timing/rollout_s",
    "timing/reward_s",
    "timing/input_prep_s",
    "timing/update_s",
    "timing/push_s",
)


def run(name: str, data: Path, model: Path, steps: int, work: Path, retries: int) -> dict[str, Any]:
    """One training run with validation before, at the middle and at the end; its numbers."""
    overrides = [
        f"data.val_files={data / 'test.parquet'}",
        f"trainer.test_freq={steps // 2}",
        "trainer.val_before_train=True",
    ]

    def once() -> dict[str, Any]:
        return vlmrl_train(work / name, data, model, steps, overrides, timeout_s=60 * 30)

    res = uncontended(once, name, retries=retries)
    rows = res["rows"]
    train = [r for r in rows if r.get("step", 0) > 0 and "timing/step_s" in r]
    rewards = [r["reward/mean"] for r in train]
    log = Path(res["log"]).read_text(errors="replace")
    m = re.search(r"\[data:train\] .*?prompt length max (\d+) mean ([\d.]+)", log)
    return {
        "name": name,
        "step_s": median([r["timing/step_s"] for r in train[2:]]),
        "stages": {k: median([r[k] for r in train[2:] if k in r]) for k in STAGES if any(k in r for r in train)},
        "val": {int(r["step"]): r["val/reward/mean"] for r in rows if "val/reward/mean" in r},
        "hit_0.9": moving_average_hit(rewards, 5, 0.9),
        "last5_reward": sum(rewards[-5:]) / 5,
        "prompt_tokens": float(m.group(2)) if m else None,
        "wall_s": res["wall_s"],
        "foreign_cpu_frac": res["foreign_cpu_frac"],
        "attempts": res["attempts"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--temporal-steps", type=int, default=600)
    ap.add_argument("--retries", type=int, default=1, help="repeat a run during which others used > 10% of the CPU")
    ap.add_argument("--work", type=Path, default=ROOT / ".cache" / "bench_video")
    a = ap.parse_args()
    model = tiny_model(0)
    data = {
        f: synthetic_data(a.work / "data" / f, 4096, 96, 112, f)
        for f in ("colour", "video_colour", "video_order", "video_motion", "position")
    }
    runs: dict[str, list[dict[str, Any]]] = {"colour": [], "video_colour": []}
    for k in range(a.rounds):
        for fam in runs:
            r = run(f"{fam}_{k + 1}", data[fam], model, a.steps, a.work / "runs", a.retries)
            runs[fam].append(r)
            print(f"{fam} round {k + 1}: {r['step_s']:.3f} s/step, val {r['val']}, 0.9 at {r['hit_0.9']}", flush=True)
    temporal = {}
    for fam in ("video_order", "video_motion", "position"):
        temporal[fam] = run(fam, data[fam], model, a.temporal_steps, a.work / "runs", a.retries)
        print(f"{fam}: val {temporal[fam]['val']}", flush=True)
    result = {
        "when": now(),
        "machine": machine(),
        "versions": versions(),
        "config": {**vars(a), "work": str(a.work)},
        "runs": runs,
        "temporal": temporal,
    }
    write_result("video", result)
    write_readme_section("Video", section(result, a))
    return 0


def _val(r: dict[str, Any]) -> str:
    return " / ".join(f"{v:.2f}" for _, v in sorted(r["val"].items()))


def section(result: dict[str, Any], a: argparse.Namespace) -> str:
    """The README section of a result."""
    runs, temporal = result["runs"], result["temporal"]
    lines = [
        f"`python benchmarks/bench_video.py --rounds {a.rounds} --steps {a.steps} --temporal-steps "
        f"{a.temporal_steps}` ({result['when']}). The quick start's recipe (`configs/tiny_cpu.yaml`, vLLM rollout, 2 "
        "worker processes, 16 prompts x 8 samples, 8-token responses) on the image colour task (112x112 images) and "
        "the video colour task (4 frames of 112x112 at 2 fps), runs alternating; median of each run's steps after "
        "the first 2.",
        "",
    ]
    rows = []
    for fam, label in (("colour", "image colour"), ("video_colour", "video colour")):
        for k, r in enumerate(runs[fam]):
            st = r["stages"]
            rows.append(
                [
                    f"{label}, run {k + 1}",
                    f"{r['prompt_tokens']:.0f}",
                    f"{r['step_s']:.3f}",
                    f"{st.get('timing/rollout_s', 0):.3f}",
                    f"{st.get('timing/update_s', 0):.3f}",
                    f"{st.get('timing/push_s', 0):.3f}",
                    _val(r),
                    str(r["hit_0.9"]),
                    f"{r['foreign_cpu_frac']:.0%}",
                ]
            )
    header = [
        "task",
        "prompt tokens",
        "s/step",
        "rollout s",
        "update s",
        "push s",
        "val before / middle / end",
        "5-step reward >= 0.9 at step",
        "CPU used by others",
    ]
    lines.append(table(header, rows))
    img = median([r["step_s"] for r in runs["colour"]])
    vid = median([r["step_s"] for r in runs["video_colour"]])
    lines += ["", f"Video / image step time: **{vid / img:.2f}x** ({vid:.3f} s against {img:.3f} s, medians).", ""]
    rows = [
        [
            f"`{fam}`",
            f"{r['prompt_tokens']:.0f}",
            _val(r),
            f"{r['last5_reward']:.2f}",
            str(r["hit_0.9"]),
            f"{r['foreign_cpu_frac']:.0%}",
        ]
        for fam, r in temporal.items()
    ]
    lines.append(f"Tasks the tiny model may not see, {a.temporal_steps} steps each:")
    lines.append("")
    lines.append(
        table(
            [
                "family",
                "prompt tokens",
                "val before / middle / end",
                "last 5 steps' reward",
                "5-step reward >= 0.9 at step",
                "CPU used by others",
            ],
            rows,
        )
    )
    lines += ["", machine_line(result), "Raw numbers: `benchmarks/results/video.json`."]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
