"""The fully asynchronous trainer with multi-turn tools against the one-step off-policy trainer and the hybrid engine,
side by side on the same CPU cores (issue 46's tool workload): steps per second and the reward after the same steps.

    python benchmarks/bench_async_tools.py [--seeds 1,2,3] [--steps 20]
    python benchmarks/bench_async_tools.py --quick      # 1 seed, 6 steps; writes nothing under results/

The workload: the tool demo's task (``preprocess/synthetic.py --families zoom``, 448-px images: the colour of a small
square shows only when zoomed) with the tool demo's settings (``configs/tool_zoom_cpu.yaml`` on ``tiny_cpu``: 16
prompts x 8 trajectories a step, at most 2 assistant turns, 128 response tokens), the tool demo's tiny model
warm-started (80 steps, lr 5e-3) on a teacher that always calls ``image_zoom`` first and then answers a colour at
random, and an ``image_zoom`` that first sleeps a latency drawn from a heavy tail (log-normal, median 0.1 s, sigma 1,
at most 2 s, as ``bench_agent_loop.py``; drawn anew for every call), as a tool that waits on a service does, in 8 tool
worker processes per rollout worker. The modes are ``bench_async.py``'s: the hybrid engine on 2 workers, and 1
training + 1 rollout worker for the one-step trainer and the fully asynchronous one (staleness_threshold 1, a sync
after every step, partial rollouts; and with verl's defaults: a sync every 4 steps, staleness_threshold 0.1), and a
fifth: fully async with staleness_threshold 2. Every mode runs its trajectories per trajectory
(``multi_turn.schedule=trajectory``).

Per run, besides ``bench_async.py``'s figures: the share of trajectories that called the tool, the calls per
trajectory and the median ``timing/tool_s``. Each run holds the CPU lock and is repeated once when other processes
took over 10 % of the CPU. Writes ``benchmarks/results/async_tools.json`` and the ``## Fully async with multi-turn
tools`` section of benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_async  # noqa: E402
import common  # noqa: E402

SECTION = "Fully async with multi-turn tools"
MODES = {
    **bench_async.MODES,
    "fully_async_s2": tuple(
        "async_training.staleness_threshold=2.0" if m.startswith("async_training.staleness_threshold") else m
        for m in bench_async.MODES["fully_async"]
    ),
}
"""``bench_async.py``'s modes, and fully async with a wider window (staleness_threshold 2: at most 48 groups
started between two syncs)."""
LABELS = {**bench_async.LABELS, "fully_async_s2": "fully async, staleness 2 (1 + 1)"}
TOOL_WORKERS = 8
"""Tool worker processes per rollout worker (the calls mostly sleep: 8 wait at once, as in bench_agent_loop.py)."""

NAP_ZOOM = '''
import math
import random
import time

from vlmrl.tools.builtin import ImageZoomTool


class NapZoom(ImageZoomTool):
    """image_zoom after sleeping a heavy-tailed latency: log-normal, median 0.1 s, sigma 1, at most 2 s."""

    async def execute(self, iid, params, **kw):
        time.sleep(min(2.0, math.exp(math.log(0.1) + random.gauss(0.0, 1.0))))
        return await super().execute(iid, params, **kw)
'''

ALWAYS_ZOOM = '''
import json
import random

def write_turn(turn, conversation, sample, rng):
    """Zoom into the centre first, then answer a colour at random."""
    if turn == 0:
        call = {"name": "image_zoom", "arguments": {"bbox_2d": [53, 53, 59, 59]}}
        return "<tool_call>\\n" + json.dumps(call) + "\\n</tool_call>"
    return rng.choice(["red", "green", "blue"])
'''


def tool_workload(work: Path) -> tuple[Path, Path, tuple[str, ...]]:
    """(data, warm-started model, overrides) of the tool workload."""
    os.environ.setdefault("VLMRL_CACHE", str(common.ROOT / ".cache" / "vlmrl"))
    from vlmrl.testing.tiny import TOOL_DEMO, ensure_tiny_model

    data = common.synthetic_data(work / "data", train=1024, test=32, image_size=448, families="zoom")
    (work / "nap_zoom.py").write_text(NAP_ZOOM)
    (work / "teacher.py").write_text(ALWAYS_ZOOM)
    tools = work / "tools.yaml"
    tools.write_text(f"tools:\n  - class_name: {work / 'nap_zoom.py'}:NapZoom\n    config:\n      min_size: 28\n")
    base = ensure_tiny_model(0, TOOL_DEMO)
    model = work / "warm"
    cmd = [common.PY, "-m", "vlmrl.testing.warm_start", "--model", str(base), "--output", str(model)]
    cmd += ["--data", str(data / "train.parquet"), "--teacher", f"{work / 'teacher.py'}:write_turn"]
    cmd += ["--tools", str(common.ROOT / "examples" / "tool_config" / "zoom.yaml"), "--steps", "80", "--lr", "5e-3"]
    cmd += ["--batch-size", "8", "--max-response-length", "128"]
    subprocess.run(cmd, check=True, env=common.bench_env(2), capture_output=True, cwd=common.ROOT, timeout=900)
    overrides = (
        "data.max_prompt_length=512",
        "data.max_response_length=128",
        "actor_rollout_ref.actor.optim.lr=3e-4",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.rollout.max_model_len=768",
        "actor_rollout_ref.rollout.multi_turn.enable=True",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools}",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
        f"actor_rollout_ref.rollout.multi_turn.tool_workers={TOOL_WORKERS}",
    )
    return data, model, overrides


def markdown(res: dict[str, Any]) -> str:
    s = res["summary"]
    head = ["mode", "steps/s", "speed-up", "reward, last 10 steps", "called the tool", "calls / trajectory"]
    head += ["tool time a step (s)", "response length mean"]
    rows = []
    for mode in MODES:
        m = s[mode]
        speed = m["steps_per_s"] / s["hybrid"]["steps_per_s"]
        rows.append(
            [
                LABELS[mode],
                f"{m['steps_per_s']:.3f}",
                f"{speed:.2f}x",
                f"{m['reward_last10']:.3f} [{m['reward_last10_range'][0]:.3f}-{m['reward_last10_range'][1]:.3f}]",
                f"{m['called_share_mean']:.2f}",
                f"{m['tool_calls_per_trajectory']:.2f}",
                f"{m['tool_s_median']:.2f}",
                f"{m['response_length_mean']:.1f}",
            ]
        )
    f = s["fully_async"]
    hist: dict[str, int] = {}
    for r in res["runs"]:
        if r["mode"] == "fully_async":
            for k, v in r["staleness_hist"].items():
                hist[k] = hist.get(k, 0) + v
    shown = ", ".join(f"{v} at {k}" for k, v in sorted(hist.items()))
    return (
        "Command: `python benchmarks/bench_async_tools.py` (seeds "
        + ",".join(map(str, res["seeds"]))
        + f", {res['steps']} steps each, alternating). The tool demo's task and settings, its tiny model warm-started "
        "to always zoom first and then answer at random, and an image_zoom that sleeps a log-normal latency first "
        "(median 0.1 s, sigma 1, at most 2 s), 8 tool workers per rollout worker. Equal cores: the hybrid engine on 2 "
        "workers against 1 training + 1 "
        "rollout worker; fully async with staleness_threshold 1 (and 2), a sync after every step and partial rollouts. "
        "Steps/s over the steps after the first; reward: median [min-max] over the seeds; tool time: the median "
        "step's timing/tool_s (fully async: the longest one group's calls ran).\n\n"
        + common.table(head, rows)
        + f"\n\nFully async / one-step: {s['fully_async_over_one_step']:.2f}x (staleness 2: "
        f"{s['fully_async_s2_over_one_step']:.2f}x, {s['fully_async_s2']['staleness_mean']:.2f} updates stale on "
        f"average; verl's defaults: {s['fully_async_verl_over_one_step']:.2f}x, "
        f"{s['fully_async_verl']['staleness_mean']:.2f}); at staleness 1 its groups trained "
        f"{f['staleness_mean']:.2f} updates stale on average (steps of all seeds by their stalest group: {shown}), "
        f"{f['partial_groups']:.0f} groups a run (median) were continued across a sync.\n\n" + common.machine_line(res)
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    seeds = [1] if args.quick else [int(s) for s in args.seeds.split(",")]
    steps = 6 if args.quick else args.steps
    work = Path(tempfile.mkdtemp(prefix="bench-async-tools-"))
    data, model, overrides = tool_workload(work)
    runs = []
    for seed in seeds:
        for mode, mode_overrides in MODES.items():
            runs.append(bench_async.one(mode, "tools", seed, steps, work, model, data, overrides, mode_overrides))
            print(f"[bench_async_tools] {runs[-1]}", flush=True)
    res = {
        **common.result_head("async_tools"),
        "seeds": seeds,
        "steps": steps,
        "runs": runs,
        "summary": bench_async.summarise(runs, "tools", tuple(MODES)),
    }
    default = args.seeds == "1,2,3" and args.steps == 20 and not args.quick
    common.publish("async_tools", SECTION, res, markdown(res), check_dir=None if default else work)
    return res


if __name__ == "__main__":
    main()
