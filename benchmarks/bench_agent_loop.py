"""Multi-turn tool rollouts per trajectory against turn by turn (``multi_turn.schedule``), side by side.

    python benchmarks/bench_agent_loop.py [--sizes tiny,20m] [--seeds 5] [--tool-workers 8]

The workload: 8 prompts x 4 trajectories on the CPU vLLM engine (the random-weight model of each size), three
policy turns of 24 tokens each (``ignore_eos``), the first two of which call ``image_zoom`` (the engine generates
every turn; what it generated in a calling turn is replaced by the call, so every trajectory calls the tool twice
whatever the random policy writes), the tool sleeping a latency drawn from a heavy tail first (log-normal, median
0.1 s, sigma 1, capped at 2 s; drawn per trajectory and turn from the seed, so both schedules wait the same
latencies). For each size, after a warm-up rollout of each schedule, both schedules run on each seed (alternating
which goes first), each from an empty prefix cache (as after a training step's weight push: the runs of one seed
share prompts and tool turns); the rollout's wall time, the
time some call ran (``tool_s``) and the time the engine sat idle waiting on tools (``tool_wait_s``).

Holds the shared CPU lock. Writes ``benchmarks/results/agent_loop.json`` and the ``## Multi-turn agent loop``
section of benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

SECTION = "Multi-turn agent loop"
PROMPTS, N, TURN_TOKENS, CALLS = 8, 4, 24, 2

NAP_TOOL = """
import time
from vlmrl.tools.builtin import ImageZoomTool

class NapZoom(ImageZoomTool):
    '''image_zoom after sleeping parameters["nap"] seconds (a tool that waits on I/O).'''
    default_schema = {"type": "function", "function": {"name": "image_zoom", "parameters": {}}}
    async def execute(self, iid, params, **kw):
        time.sleep(float(params.pop("nap", 0.0)))
        return await super().execute(iid, params, **kw)
"""


def latency(seed: int, trajectory: int, turn: int) -> float:
    """The tool's latency for a trajectory's call in a turn: log-normal, median 0.1 s, sigma 1, at most 2 s."""
    rng = random.Random(f"{seed}-{trajectory}-{turn}")
    return min(2.0, math.exp(math.log(0.1) + rng.gauss(0.0, 1.0)))


class CallingPolicy:
    """The engine generates every turn; in a trajectory's first ``CALLS`` turns its tokens are replaced by an
    ``image_zoom`` call carrying the tool's latency (the same for both schedules)."""

    def __init__(self, engine: Any, tokenizer: Any, seed: int) -> None:
        self.engine, self.tok, self.seed = engine, tokenizer, seed
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.key: dict[int, int] = {}
        self.turn: dict[int, int] = {}
        self.pending: dict[str, tuple[int, int]] = {}

    def _which(self, request: Any) -> tuple[int, int]:
        k = self.key.setdefault(id(request.ids), len(self.key))  # the agent keeps one context list per trajectory
        t = self.turn.get(k, 0)
        self.turn[k] = t + 1
        return k, t

    def _replace(self, out: Any, k: int, t: int) -> Any:
        from vlmrl.rollout.base import TurnOutput

        if t >= CALLS:
            return out
        args = {"bbox_2d": [0, 0, 28, 28], "nap": round(latency(self.seed, k, t), 4)}
        text = "<tool_call>\n" + json.dumps({"name": "image_zoom", "arguments": args}) + "\n</tool_call>"
        ids = self.tok(text, add_special_tokens=False)["input_ids"] + [self.end]
        return TurnOutput(ids, [0.0] * len(ids), "stop")

    def generate_turns(self, requests: list[Any], spec: Any) -> list[Any]:
        which = [self._which(r) for r in requests]
        outs = self.engine.generate_turns(requests, spec)
        return [self._replace(o, k, t) for o, (k, t) in zip(outs, which)]

    def start_turns(self, requests: list[Any], spec: Any, seeds: list[int]) -> list[str]:
        which = [self._which(r) for r in requests]
        ids = self.engine.start_turns(requests, spec, seeds)
        self.pending.update(zip(ids, which))
        return ids

    def step_turns(self) -> list[tuple[str, Any]]:
        return [(rid, self._replace(o, *self.pending.pop(rid))) for rid, o in self.engine.step_turns()]

    def abort_turns(self, ids: list[str]) -> None:
        self.engine.abort_turns(ids)


def run_size(model: Path, seeds: int, tool_workers: int, work: Path) -> dict[str, Any]:
    """Both schedules on one model, ``seeds`` latency draws each."""
    import torch
    from PIL import Image
    from transformers import AutoProcessor

    from vlmrl.batch import PromptSample
    from vlmrl.config import RolloutConfig
    from vlmrl.config.schema import MultiTurnConfig
    from vlmrl.models import qwen_vl
    from vlmrl.rollout.base import SamplingSpec
    from vlmrl.rollout.multi_turn import MultiTurnAgent
    from vlmrl.rollout.vllm import VLLMRollout
    from vlmrl.tools.runner import ToolRunner

    processor = AutoProcessor.from_pretrained(model)
    ip = processor.image_processor
    factor, (lo, hi) = qwen_vl.patch_factor(ip), qwen_vl.pixel_bounds(ip)
    (work / "nap_tool.py").write_text(NAP_TOOL)
    (work / "tools.yaml").write_text(f"tools:\n  - class_name: {work / 'nap_tool.py'}:NapZoom\n")
    prompts = []
    for i in range(PROMPTS):
        image = qwen_vl.resize_image(Image.new("RGB", (56, 56), (40 * i % 255, 90, 160)), factor, lo, hi)
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is here?"}]}]
        text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = qwen_vl.engine_prompt_ids(processor.tokenizer, text, 1)
        prompts.append(
            PromptSample(
                index=i,
                uid=f"bench:{i}",
                data_source="bench",
                messages=messages,
                prompt_text=text,
                prompt_ids=ids,
                images=[image],
                original_sizes=[(56, 56)],
                ground_truth="",
                source_images=[image],
            )
        )
    engine = VLLMRollout(str(model), rollout_cfg=RolloutConfig(), max_model_len=1024, limit_images=1 + CALLS)
    tools = ToolRunner(str(work / "tools.yaml"), tool_workers, 30.0)
    spec = SamplingSpec(n=N, max_tokens=512, ignore_eos=True)
    runs: list[dict[str, Any]] = []
    try:
        plan = [(-1, "turn"), (-1, "trajectory")]  # a warm-up rollout of each, not recorded
        for seed in range(seeds):
            plan += [(seed, s) for s in (("turn", "trajectory") if seed % 2 == 0 else ("trajectory", "turn"))]
        for seed, schedule in plan:
            cfg = MultiTurnConfig(
                enable=True,
                tool_config_path="tools.yaml",
                tool_workers=tool_workers,
                max_assistant_turns=CALLS + 1,
                max_tokens_per_turn=TURN_TOKENS,
                max_tool_images=CALLS,
                schedule=schedule,
            )
            agent = MultiTurnAgent(
                CallingPolicy(engine, processor.tokenizer, max(seed, 0)),
                tools,
                cfg,
                processor.tokenizer,
                (factor, lo, hi),
                512,
                max_images=1 + CALLS,
            )
            torch.manual_seed(max(seed, 0))
            engine.reset_caches()  # as after a training step's weight push: no prefix cached from the last rollout
            t0 = time.perf_counter()
            rb = agent.generate(prompts, spec)
            wall = time.perf_counter() - t0
            calls = sum(len(t.calls) for t in rb.trajectories)
            errors = sum(1 for t in rb.trajectories for c in t.calls if c.error)
            if calls != PROMPTS * N * CALLS or errors:
                raise RuntimeError(f"{schedule}: {calls} calls, {errors} errors; expected {PROMPTS * N * CALLS}")
            if seed < 0:
                continue
            runs.append(
                {
                    "seed": seed,
                    "schedule": schedule,
                    "wall_s": round(wall, 3),
                    "tool_s": round(rb.timing["tool_s"], 3),
                    "tool_wait_s": round(rb.timing["tool_wait_s"], 3),
                    "policy_tokens": sum(sum(t.response_mask) for t in rb.trajectories),
                }
            )
            print(f"[bench_agent_loop]   seed {seed} {schedule}: {wall:.2f} s", flush=True)
    finally:
        tools.close()
        engine.close()
    lat = [latency(s, k, t) for s in range(seeds) for k in range(PROMPTS * N) for t in range(CALLS)]
    by = {s: [r for r in runs if r["schedule"] == s] for s in ("turn", "trajectory")}
    speedups = [a["wall_s"] / b["wall_s"] for a, b in zip(by["turn"], by["trajectory"])]
    return {
        "runs": runs,
        "median_wall_s": {s: common.median([r["wall_s"] for r in rs]) for s, rs in by.items()},
        "median_tool_wait_s": {s: common.median([r["tool_wait_s"] for r in rs]) for s, rs in by.items()},
        "speedups": [round(x, 3) for x in speedups],
        "speedup_median": round(common.median(speedups), 3),
        "latency_s": {
            "median": round(common.median(lat), 3),
            "mean": round(sum(lat) / len(lat), 3),
            "max": round(max(lat), 3),
        },
    }


def markdown(res: dict[str, Any]) -> str:
    """The README section."""
    cfg = res["config"]
    rows = []
    for size, r in res["results"].items():
        w, idle = r["median_wall_s"], r["median_tool_wait_s"]
        rows.append(
            [
                size,
                f"{w['turn']:.2f} s",
                f"{w['trajectory']:.2f} s",
                f"**{r['speedup_median']:.2f}x** ({min(r['speedups']):.2f}-{max(r['speedups']):.2f})",
                f"{idle['turn']:.2f} s / {idle['trajectory']:.2f} s",
            ]
        )
    lat = next(iter(res["results"].values()))["latency_s"]
    return "\n".join(
        [
            "`python benchmarks/bench_agent_loop.py` (`benchmarks/results/agent_loop.json`): one multi-turn rollout of "
            f"{PROMPTS} prompts x {N} trajectories on the CPU vLLM engine, {CALLS + 1} policy turns of {TURN_TOKENS} "
            f"tokens, the first {CALLS} calling `image_zoom` after a heavy-tailed latency (log-normal, median "
            f"{lat['median']:.2f} s, mean {lat['mean']:.2f} s, max {lat['max']:.2f} s over the draws), "
            f"{cfg['tool_workers']} tool workers; {cfg['seeds']} latency draws, both schedules on each (medians; the "
            "speed-up's range over the draws).",
            "",
            common.table(
                ["model", "turn by turn", "per trajectory", "speed-up", "engine idle on tools (turn / traj.)"],
                rows,
            ),
            "",
            common.machine_line(res),
        ]
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="tiny,20m")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--tool-workers", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    os.environ.update(common.bench_env(a.threads))
    engine_env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}
    os.environ.update(engine_env, VLLM_CPU_OMP_THREADS_BIND="nobind")
    import torch

    torch.set_num_threads(a.threads)
    sizes = [s.strip() for s in a.sizes.split(",") if s.strip()]
    results: dict[str, Any] = {}
    with common.cpu_lock("agent loop"), tempfile.TemporaryDirectory(prefix="vlmrl-bench-agent-") as tmp:
        for size in sizes:
            model = common.tiny_model(seed=0) if size == "tiny" else common.preset_model(size)
            print(f"[bench_agent_loop] {size}", flush=True)
            results[size] = run_size(model, a.seeds, a.tool_workers, Path(tmp))
            print(f"[bench_agent_loop]   speed-up {results[size]['speedup_median']:.2f}x", flush=True)
    res = {
        **common.result_head("agent_loop"),
        "config": {"sizes": sizes, "seeds": a.seeds, "tool_workers": a.tool_workers, "threads": a.threads},
        "results": results,
    }
    return {"path": str(common.publish("agent_loop", SECTION, res, markdown(res)))}


if __name__ == "__main__":
    os.environ.setdefault("VLMRL_CACHE", str(common.ROOT / ".cache" / "vlmrl"))
    main()
