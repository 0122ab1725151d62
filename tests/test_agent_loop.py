"""The per-trajectory agent loop (``multi_turn.schedule=trajectory``): a trajectory's next turn starts as soon as its
own tool calls return, the trajectories are what the turn-by-turn schedule makes, and on vLLM they do not depend on
when their turns reach the engine (each turn samples from its own seed) while the trainer's log-probs match."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import pytest
from utils import make_agent, make_prompt, noise, solid

from vlmrl.config import RolloutConfig, VLMRLConfig
from vlmrl.config.plan import multi_turn_schedule
from vlmrl.rollout.base import SamplingSpec, TurnOutput
from vlmrl.supervise import HangError
from vlmrl.tools.runner import ToolRunner

NAP_TOOLS = """
import random
import time
from vlmrl.tools.base import BaseTool, ToolResponse
from vlmrl.tools.builtin import ImageZoomTool

class NapZoom(ImageZoomTool):
    '''image_zoom after sleeping parameters["nap"] seconds (-1: a random 0-0.5 s).'''
    default_schema = {"type": "function", "function": {"name": "nap_zoom", "parameters": {}}}
    async def execute(self, iid, params, **kw):
        nap = float(params.pop("nap", 0.0))
        time.sleep(random.Random().uniform(0, 0.5) if nap < 0 else nap)
        return await super().execute(iid, params, **kw)

class Sleeper(BaseTool):
    default_schema = {"type": "function", "function": {"name": "sleeper", "parameters": {}}}
    def execute(self, iid, params, **kw):
        time.sleep(30)
"""


def call(nap: float) -> str:
    """A policy turn that calls ``nap_zoom`` on the image's corner after ``nap`` seconds."""
    args = {"bbox_2d": [0, 0, 28, 28], "nap": nap}
    return "<tool_call>\n" + json.dumps({"name": "nap_zoom", "arguments": args}) + "\n</tool_call>"


@pytest.fixture(scope="module")
def nap_tools(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tool file with ``nap_zoom`` and ``sleeper``."""
    d = tmp_path_factory.mktemp("nap_tools")
    (d / "nap_tools.py").write_text(NAP_TOOLS)
    cfg = d / "tools.yaml"
    cfg.write_text(f"tools:\n  - class_name: {d}/nap_tools.py:NapZoom\n  - class_name: {d}/nap_tools.py:Sleeper\n")
    return str(cfg)


@pytest.fixture(scope="module")
def nap_runner(nap_tools: str):
    """The tools in 2 worker processes, 10 s timeout (no nap comes near it)."""
    tools = ToolRunner(nap_tools, 2, 10.0)
    yield tools
    tools.close()


class Streamed:
    """A scripted policy that streams turns: trajectory k's turn t is ``script(k, t)`` (+ <|im_end|>), every queued
    request finishes at the next step; it records when each trajectory's turns were queued (``started``)."""

    def __init__(self, tokenizer, script, step_s: float = 0.0) -> None:
        """``step_s``: seconds each engine step takes."""
        self.tok, self.script, self.step_s = tokenizer, script, step_s
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.ids = itertools.count()
        self.queued: list[tuple[str, int, int]] = []
        self.started: dict[tuple[int, int], float] = {}
        self.turns: dict[int, int] = {}
        self.key_of: dict[int, int] = {}  # id(context list) -> trajectory
        self.t0 = time.perf_counter()

    def _answer(self, k: int, t: int) -> TurnOutput:
        ids = self.tok(self.script(k, t), add_special_tokens=False)["input_ids"] + [self.end]
        return TurnOutput(ids, [-0.5] * len(ids), "stop")

    def _trajectory(self, request) -> tuple[int, int]:
        k = self.key_of.setdefault(id(request.ids), len(self.key_of))  # the agent keeps one context list each
        t = self.turns.get(k, 0)
        self.turns[k] = t + 1
        self.started[(k, t)] = time.perf_counter() - self.t0
        return k, t

    def start_turns(self, requests, spec, seeds):
        out = []
        for r in requests:
            rid = str(next(self.ids))
            self.queued.append((rid, *self._trajectory(r)))
            out.append(rid)
        return out

    def step_turns(self):
        time.sleep(self.step_s)
        done, self.queued = self.queued, []
        return [(rid, self._answer(k, t)) for rid, k, t in done]

    def abort_turns(self, ids) -> None:
        self.queued = [q for q in self.queued if q[0] not in ids]

    def generate_turns(self, requests, spec):
        time.sleep(self.step_s)
        return [self._answer(*self._trajectory(r)) for r in requests]


def _rollout(processor, runner, naps: list[float], schedule: str):
    prompts = [make_prompt(processor, f"Colour {i}?", [noise(i, (56, 56))], index=i) for i in range(len(naps))]
    engine = Streamed(processor.tokenizer, lambda k, t: call(naps[k]) if t == 0 else "red", step_s=0.3)
    agent = make_agent(processor, engine, runner, max_assistant_turns=2, schedule=schedule)
    assert agent.per_trajectory() == (schedule == "trajectory")
    rb = agent.generate(prompts, SamplingSpec(n=1, max_tokens=400))
    return rb, engine.started


def test_a_trajectory_goes_on_while_another_waits_on_its_tool(tiny_processor, nap_runner) -> None:
    naps = [2.0, 0.0, 0.0, 0.0]
    rb, started = _rollout(tiny_processor, nap_runner, naps, "trajectory")
    # the others' second turns started before trajectory 0's nap was over
    assert max(started[(k, 1)] for k in (1, 2, 3)) < started[(0, 1)] and started[(0, 1)] >= 2.0, started
    assert all(t.assistant_turns == 2 and t.calls[0].error is None for t in rb.trajectories)
    turn_rb, turn_started = _rollout(tiny_processor, nap_runner, naps, "turn")
    assert min(turn_started[(k, 1)] for k in range(4)) >= 2.0, turn_started  # turn 2 waits for the slowest call
    # the same trajectories either way: tokens, masks, log-probs, tool records and images
    assert rb.prompt_ids == turn_rb.prompt_ids and rb.response_ids == turn_rb.response_ids
    assert rb.logprobs == turn_rb.logprobs
    for a, b in zip(rb.trajectories, turn_rb.trajectories):
        assert a.response_mask == b.response_mask and a.turn_texts == b.turn_texts
        assert [c.text for c in a.calls] == [c.text for c in b.calls]
        assert [im.tobytes() for im in a.images] == [im.tobytes() for im in b.images]
    # tool_s: while some call ran; tool_wait_s: of that, while the engine idled (every trajectory waiting on tools):
    # per trajectory the others' second turns (0.3 s steps) ran during trajectory 0's nap, turn by turn nothing did
    assert rb.timing["tool_s"] >= 2.0 and rb.timing["tool_wait_s"] <= rb.timing["tool_s"] - 0.25, rb.timing
    assert turn_rb.timing["tool_s"] >= 2.0 and turn_rb.timing["generate_s"] >= turn_rb.timing["tool_s"] + 0.55


def test_a_hanging_tool_stops_a_per_trajectory_rollout_at_once(tiny_processor, nap_tools) -> None:
    """12 trajectories call a tool that hangs (2 workers, 1 s timeout): the rollout stops once the first 4 calls
    timed out (the hang rule), the other trajectories' queued calls with it, not 12 / 2 x 1 s later."""
    prompts = [make_prompt(tiny_processor, "Colour?", [solid((0, 0, 200))], index=i) for i in range(12)]
    sleeper = '<tool_call>\n{"name": "sleeper", "arguments": {}}\n</tool_call>'
    engine = Streamed(tiny_processor.tokenizer, lambda k, t: sleeper)
    runner = ToolRunner(nap_tools, 2, 1.0)
    try:
        agent = make_agent(tiny_processor, engine, runner, max_assistant_turns=3)
        assert agent.per_trajectory()
        t0 = time.perf_counter()
        with pytest.raises(HangError, match="tool_timeout_s"):
            agent.generate(prompts, SamplingSpec(n=1, max_tokens=400))
        elapsed = time.perf_counter() - t0
    finally:
        runner.close()
    assert elapsed < 5.0, elapsed
    assert not engine.queued  # nothing left in the engine


def test_the_plan_names_the_schedule() -> None:
    ro = VLMRLConfig().actor_rollout_ref.rollout
    assert "no tool_config_path" in multi_turn_schedule(ro)
    ro.multi_turn.tool_config_path = "tools.yaml"
    assert multi_turn_schedule(ro).startswith("per trajectory")
    for change, why in [
        ({"name": "hf"}, "HF rollout"),
        ({"tensor_model_parallel_size": 2}, "tensor-parallel"),
    ]:
        assert why in multi_turn_schedule(RolloutConfig(**change)), change
    ro.multi_turn.tool_workers = 0
    assert "tool_workers=0" in multi_turn_schedule(ro)
    ro.multi_turn.schedule = "turn"
    assert multi_turn_schedule(ro) == "turn by turn (multi_turn.schedule=turn)"


class FirstTurnStreamed:
    """Turn 1 of every trajectory is a scripted ``nap_zoom`` call that sleeps a random 0-0.5 s; later turns stream
    through the real engine (``order``: the seeds of the turns it was given, in the order it got them)."""

    def __init__(self, engine, tokenizer) -> None:
        self.engine, self.tok = engine, tokenizer
        self.first = True
        self.ready: list[tuple[str, TurnOutput]] = []
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.order: list[int] = []

    def start_turns(self, requests, spec, seeds):
        if not self.first:
            self.order += seeds
            return self.engine.start_turns(requests, spec, seeds)
        self.first = False
        for k, _ in enumerate(requests):
            ids = self.tok(call(-1), add_special_tokens=False)["input_ids"] + [self.end]
            self.ready.append((f"scripted-{k}", TurnOutput(ids, [0.0] * len(ids), "stop")))
        return [rid for rid, _ in self.ready]

    def step_turns(self):
        done, self.ready = self.ready, []
        return done or self.engine.step_turns()

    def abort_turns(self, ids) -> None:
        self.engine.abort_turns([i for i in ids if not i.startswith("scripted-")])


@pytest.mark.vllm
def test_on_vllm_the_trajectories_do_not_depend_on_the_tools_timing(
    tiny_model_dir: Path, tiny_processor, nap_runner
) -> None:
    """Two rollouts from one torch seed whose tool calls return in other orders (random latencies) sample the same
    tokens after the tool turn (each turn's own seed), and the trainer's log-probs equal the engine's on them (padded
    and packed). On CPU that takes chunked prefill off (``seeded_turns``: vLLM's rewind of a seeded request's
    generator after a partial prefill is CUDA-only)."""
    import torch
    from test_multi_turn import _trainer_gap
    from transformers import AutoModelForImageTextToText

    from vlmrl.models.packing import VARLEN
    from vlmrl.rollout.vllm import VLLMRollout

    cfg = RolloutConfig(enable_chunked_prefill=False)
    engine = VLLMRollout(str(tiny_model_dir), rollout_cfg=cfg, max_model_len=512, limit_images=4)
    assert engine.seeded_turns
    prompts = [
        make_prompt(tiny_processor, "What is here?", [noise(1, (112, 84))], index=0),
        make_prompt(tiny_processor, "And here?", [noise(2, (56, 56)), solid((0, 200, 0))], index=1),
    ]
    runs, orders = [], []
    try:
        while len(runs) < 2 or (orders[0] == orders[-1] and len(runs) < 6):  # until the tools' order differs
            torch.manual_seed(7)
            policy = FirstTurnStreamed(engine, tiny_processor.tokenizer)
            agent = make_agent(tiny_processor, policy, nap_runner)
            assert agent.per_trajectory()
            runs.append(agent.generate(prompts, SamplingSpec(n=2, max_tokens=60)))
            orders.append(policy.order)
    finally:
        engine.close()
    assert orders[0] != orders[-1] and sorted(orders[0]) == sorted(orders[-1])
    a, b = runs[0], runs[-1]
    assert a.response_ids == b.response_ids
    assert max(abs(x - y) for la, lb in zip(a.logprobs, b.logprobs) for x, y in zip(la, lb)) <= 1e-5
    assert len({tuple(r) for r in a.response_ids}) > 1  # the trajectories sampled apart
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation=VARLEN)
    assert _trainer_gap(model.eval(), tiny_processor, prompts, a) <= 1e-4
