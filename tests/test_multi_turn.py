"""Multi-turn tool rollouts: the agent loop's bookkeeping (masks, images, limits, tool failures) on a scripted engine,
and the policy's log-probs on multi-turn trajectories with a tool image against the vLLM and HF engines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForImageTextToText
from utils import ScriptedEngine, make_agent, make_prompt, noise, solid

from vlmrl.models import qwen_vl
from vlmrl.models.forward import response_logprobs
from vlmrl.models.inputs import build_inputs, process_images, process_response_images
from vlmrl.rollout.base import SamplingSpec, TurnOutput
from vlmrl.rollout.multi_turn import multi_turn_metrics, truncate
from vlmrl.tools.runner import ToolRunner

ZOOM = '<tool_call>\n{"name": "image_zoom", "arguments": {"bbox_2d": [0, 0, 28, 28]}}\n</tool_call>'

BAD_TOOLS = """
import time
from vlmrl.tools.base import BaseTool, ToolResponse

def schema(name):
    return {"type": "function", "function": {"name": name, "parameters": {}}}

class Raiser(BaseTool):
    default_schema = schema("raiser")
    async def execute(self, iid, params, **kw):
        raise RuntimeError("tool broke")

class Sleeper(BaseTool):
    default_schema = schema("sleeper")
    def execute(self, iid, params, **kw):  # a plain (blocking) method
        time.sleep(30)

class Blocker(BaseTool):
    default_schema = schema("blocker")
    async def execute(self, iid, params, **kw):  # blocks its event loop
        time.sleep(30)

class Garbage(BaseTool):
    default_schema = schema("garbage")
    async def execute(self, iid, params, **kw):
        return "nope"

class BadImage(BaseTool):
    default_schema = schema("bad_image")
    async def execute(self, iid, params, **kw):
        return ToolResponse(text="x", image=["not an image"]), 0.0, {}

class ManyImages(BaseTool):
    default_schema = schema("many_images")
    async def execute(self, iid, params, **kw):
        from PIL import Image
        return ToolResponse(text="x", image=[Image.new("RGB", (56, 56))] * 4), 0.0, {}

class NanReward(BaseTool):
    default_schema = schema("nan_reward")
    async def execute(self, iid, params, **kw):
        return ToolResponse(text="x"), float("nan"), {}
"""


@pytest.fixture(scope="module")
def tool_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tools")
    (d / "bad_tools.py").write_text(BAD_TOOLS)
    cfg = d / "tools.yaml"
    lines = ["tools:", "  - class_name: image_zoom", "  - class_name: calculator"]
    lines += [
        f"  - class_name: {d}/bad_tools.py:{c}"
        for c in ("Raiser", "Sleeper", "Blocker", "Garbage", "BadImage", "NanReward", "ManyImages")
    ]
    cfg.write_text("\n".join(lines) + "\n")
    return cfg


@pytest.fixture(scope="module")
def runner(tool_file: Path):
    """The tools in 2 worker processes (the default), each call with a 1 s timeout."""
    tools = ToolRunner(str(tool_file), 2, 1.0)
    yield tools
    tools.close()


def test_tool_turn_is_appended_token_in_with_its_image_and_masked_out(tiny_processor, runner) -> None:
    tok = tiny_processor.tokenizer
    prompt = make_prompt(tiny_processor, "What colour?", [noise(0, (112, 84))])
    engine = ScriptedEngine(tok, [ZOOM, "red"])
    rb = make_agent(tiny_processor, engine, runner).generate([prompt], SamplingSpec(n=2, max_tokens=400))
    assert len(rb) == 2 and len(rb.trajectories) == 2
    pad = qwen_vl.vision_token_ids(tok).image_pad
    # turn 2's request: the prompt + turn 1 + the tool turn, one pad per image, and both images
    second = engine.requests[1][0]
    assert second.ids[: len(prompt.prompt_ids)] == prompt.prompt_ids and second.ids.count(pad) == 2
    assert len(second.images) == 2 and second.images[0] is prompt.images[0]
    t = rb.trajectories[0]
    assert t.assistant_turns == 2 and t.user_turns == 1 and len(t.calls) == 1 and t.calls[0].error is None
    zoomed = t.images[0]
    assert zoomed.width % 28 == 0 and zoomed.width * zoomed.height > 28 * 28  # enlarged to the budget
    bounds = qwen_vl.pixel_bounds(tiny_processor.image_processor)
    n_img = qwen_vl.num_image_tokens(zoomed.width, zoomed.height, 28, *bounds)
    resp, mask, lps = rb.response_ids[0], t.response_mask, rb.logprobs[0]
    assert len(resp) == len(mask) == len(lps) and resp.count(pad) == n_img  # pads expanded for the trainer
    turn1 = tok(ZOOM, add_special_tokens=False)["input_ids"] + [engine.end]
    assert resp[: len(turn1)] == turn1 and set(mask[: len(turn1)]) == {1}
    tool_span = [i for i, m in enumerate(mask) if m == 0]
    assert tool_span == list(range(len(turn1), tool_span[-1] + 1))  # one contiguous tool turn
    assert all(resp[i] != pad for i, m in enumerate(mask) if m == 1) and {lps[i] for i in tool_span} == {0.0}
    assert tok.decode(resp[tool_span[0] : tool_span[-1] + 1]).startswith("\n<|im_start|>user\n<tool_response>")
    assert rb.prompt_ids[0].count(pad) == qwen_vl.num_image_tokens(
        112, 84, 28, *qwen_vl.pixel_bounds(tiny_processor.image_processor)
    )
    m = multi_turn_metrics(rb.trajectories)
    assert m["multi_turn/turns/mean"] == 2 and m["multi_turn/tool_calls/mean"] == 1
    assert m["multi_turn/calls/image_zoom"] == 2 and m["multi_turn/errors/image_zoom"] == 0


@pytest.mark.parametrize(
    ("call", "kind", "text"),
    [
        ('{"name": "raiser", "arguments": {}}', "exception", "RuntimeError: tool broke"),
        ('{"name": "sleeper", "arguments": {}}', "timeout", "timed out after 1 s"),
        ('{"name": "blocker", "arguments": {}}', "timeout", "timed out after 1 s"),
        ('{"name": "garbage", "arguments": {}}', "bad_result", "other than (response, reward, metrics)"),
        ('{"name": "bad_image", "arguments": {}}', "bad_result", "list of PIL images"),
        ('{"name": "nan_reward", "arguments": {}}', "bad_result", "not finite"),
        ('{"name": "many_images", "arguments": {}}', "bad_result", "would exceed the 4 images per trajectory"),
        ('{"name": "nosuch", "arguments": {}}', "unknown_tool", "no tool named 'nosuch'"),
        ("{broken", "parse", "invalid tool call JSON"),
        ('{"name": "calculator", "arguments": {"expression": "__import__(1)"}}', "exception", "unsupported"),
        ('{"name": "image_zoom", "arguments": {"bbox_2d": [5, 5, 1, 1]}}', "exception", "is empty"),
    ],
)
def test_a_failing_tool_gives_the_policy_an_error_and_the_step_goes_on(tiny_processor, runner, call, kind, text):
    engine = ScriptedEngine(tiny_processor.tokenizer, [f"<tool_call>{call}</tool_call>", "done"])
    prompt = make_prompt(tiny_processor, "Go.", [solid((0, 0, 255))])
    t0 = time.perf_counter()
    rb = make_agent(tiny_processor, engine, runner).generate([prompt], SamplingSpec(n=1, max_tokens=400))
    assert time.perf_counter() - t0 < 10  # a hung tool is abandoned after tool_timeout_s
    t = rb.trajectories[0]
    assert t.assistant_turns == 2 and len(t.calls) == 1
    assert t.calls[0].error.startswith(kind) and text in t.calls[0].error and t.calls[0].text.startswith("Error:")
    assert text in t.turn_texts[1][1]  # the policy read the error as the tool's result
    m = multi_turn_metrics(rb.trajectories)
    assert m["multi_turn/tool_errors"] == 1 and m[f"multi_turn/error_kind/{kind}"] == 1


def test_turn_limits_and_the_token_budget_end_trajectories(tiny_processor, runner) -> None:
    tok = tiny_processor.tokenizer
    calc = '<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}</tool_call>'
    prompt = make_prompt(tiny_processor, "Add.", [])
    for mt, turns in (({"max_assistant_turns": 3}, 3), ({"max_user_turns": 2}, 3)):
        engine = ScriptedEngine(tok, [calc])
        t = make_agent(tiny_processor, engine, runner, **mt).generate([prompt], SamplingSpec(n=1)).trajectories[0]
        assert t.assistant_turns == turns and t.calls[0].text == "2"
    engine = ScriptedEngine(tok, [calc])
    rb = make_agent(tiny_processor, engine, runner, budget=120).generate([prompt], SamplingSpec(n=1))
    assert len(rb.response_ids[0]) <= 120 and rb.trajectories[0].assistant_turns >= 2
    per_turn = make_agent(tiny_processor, ScriptedEngine(tok, [calc]), runner, max_tokens_per_turn=5)
    rb = per_turn.generate([prompt], SamplingSpec(n=1))
    assert len(rb.response_ids[0]) == 5 and rb.finish_reasons[0] == "length"  # cut mid-call: no tool runs
    assert rb.trajectories[0].calls == []


def test_extra_calls_beyond_max_parallel_calls_are_not_run(tiny_processor, runner) -> None:
    calc = '<tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}</tool_call>'
    engine = ScriptedEngine(tiny_processor.tokenizer, [calc * 3, "ok"])
    prompt = make_prompt(tiny_processor, "Multiply.", [])
    t = make_agent(tiny_processor, engine, runner, max_parallel_calls=2).generate([prompt], SamplingSpec(n=1))
    assert len(t.trajectories[0].calls) == 2 and t.trajectories[0].turn_texts[1][1] == "6\n6"


def test_truncation_sides_follow_verl() -> None:
    assert truncate("abcdefghij", 4, "left") == "abcd...(truncated)"
    assert truncate("abcdefghij", 4, "right") == "(truncated)...ghij"
    assert truncate("abcdefghij", 4, "middle") == "ab...(truncated)...ij"
    assert truncate("abc", 4, "middle") == "abc"


# ---------------------------------------------------------------------------------------- log-probs vs engines


class FirstTurnScripted:
    """Turn 1 of every trajectory is a scripted zoom call; later turns are the real engine's samples."""

    def __init__(self, engine, tokenizer) -> None:
        self.engine, self.turn = engine, 0
        end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.call = tokenizer(ZOOM, add_special_tokens=False)["input_ids"] + [end]

    def generate_turns(self, requests, spec):
        self.turn += 1
        if self.turn == 1:
            return [TurnOutput(list(self.call), [0.0] * len(self.call), "stop") for _ in requests]
        return self.engine.generate_turns(requests, spec)


def _trainer_gap(model, processor, prompts, rb) -> float:
    """Largest |trainer - engine| log-prob over the engine's own tokens (the policy's turns after the first); the
    padding-free (packed) forward gives the trainer's log-probs and gradients too (<= 1e-5)."""
    ids = qwen_vl.vision_token_ids(processor.tokenizer)
    x = build_inputs(
        prompts,
        rb,
        process_images(processor, prompts),
        processor.tokenizer.pad_token_id,
        process_response_images(processor, rb),
    )
    assert x.has_response_images
    grads = []
    for packed in (False, True):
        model.zero_grad()
        lp, _, extra = response_logprobs(model, x, ids, packed=packed)
        ((lp * x.response_mask).sum() + extra).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        if not packed:
            padded = lp.detach()
    model.zero_grad()
    lp = lp.detach()
    assert float(((lp - padded) * x.response_mask).abs().max()) <= 1e-5
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 4
    # fp32 sums in another order: within 1e-5 of the gradients' scale (a sum over every response token)
    scale = max(1.0, max(float(g.abs().max()) for g in grads[0].values()))
    worst = max(float((grads[0][k] - grads[1][k]).abs().max()) for k in grads[0])
    print(f"packed vs padded gradients: {worst:.2e} (scale {scale:.1f})")
    assert worst <= 1e-5 * scale, (worst, scale)
    gaps = []
    for i, t in enumerate(rb.trajectories):
        first_tool = t.response_mask.index(0)
        later = [j for j, m in enumerate(t.response_mask) if m == 1 and j > first_tool]
        assert later and t.images, "the engine generated after the tool image"
        gaps += [abs(float(lp[i, j]) - rb.logprobs[i][j]) for j in later]
        assert float(x.response_mask[i].sum()) == sum(t.response_mask)  # the loss sees policy tokens only
    return max(gaps)


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    from vlmrl.models.packing import VARLEN

    return AutoModelForImageTextToText.from_pretrained(
        tiny_model_dir, dtype=torch.float32, attn_implementation=VARLEN
    ).eval()


@pytest.fixture(scope="module")
def vllm_engine(tiny_model_dir):
    from vlmrl.config import RolloutConfig
    from vlmrl.rollout.vllm import VLLMRollout

    engine = VLLMRollout(tiny_model_dir, rollout_cfg=RolloutConfig(), max_model_len=512, limit_images=4)
    yield engine
    engine.close()


@pytest.mark.vllm
def test_multi_turn_logprobs_with_a_tool_image_match_vllm(tiny_processor, hf_model, runner, vllm_engine):
    prompts = [
        make_prompt(tiny_processor, "What is here?", [noise(1, (112, 84))], index=0),
        make_prompt(tiny_processor, "And here?", [noise(2, (56, 56)), solid((0, 200, 0))], index=1),
    ]
    wrapped = FirstTurnScripted(vllm_engine, tiny_processor.tokenizer)
    rb = make_agent(tiny_processor, wrapped, runner).generate(prompts, SamplingSpec(n=2, max_tokens=400))
    assert _trainer_gap(hf_model, tiny_processor, prompts, rb) <= 1e-4


def _scripted_first_turn_stream(engine, agent, spec, tokenizer):
    """A :class:`TrajectoryStream` whose trajectories' first turn is the zoom call (log-prob 0, as
    :class:`FirstTurnScripted`'s); the later turns are the engine's."""
    from vlmrl.rollout.stream_turns import TrajectoryStream

    call = tokenizer(ZOOM, add_special_tokens=False)["input_ids"] + [tokenizer.convert_tokens_to_ids("<|im_end|>")]

    class Scripted(TrajectoryStream):
        def _start_turn(self, t) -> None:
            if t.state.traj.assistant_turns == 0:
                t.turn_ids, t.turn_logprobs, t.turn_versions = list(call), [0.0] * len(call), [self.version] * len(call)
                self._end_turn(t, "stop")
            else:
                super()._start_turn(t)

    return Scripted(engine, agent, spec)


@pytest.mark.vllm
def test_streamed_trajectories_continue_across_weight_pushes_with_their_tool_images(
    tiny_model_dir, tiny_processor, runner, vllm_engine
):
    """Multi-turn trajectories streamed into the running engine (the fully asynchronous trainer's rollout with tools):
    each one's zoom call runs in the tool workers and its next turn starts when the call returns. A first sync comes
    while the calls run: nothing is in the engine to interrupt, the calls go on, and the turns after them start from
    the weights pushed then (version 1). A second comes with every second turn part-way through: the turns are
    interrupted, the engine takes new weights (version 2), and each turn continues where it stopped. Every policy
    token's log-prob is that of the weights that generated it (the trainer's forward on those weights with the
    prompt's and the tool's images, <= 1e-4; the other weights' differ), the tool turns are masked out with their
    images in the trajectory, and nothing stays in the engine."""
    from vlmrl.rollout.stream import StreamItem

    def load(seed: int | None):
        m = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
        g = torch.Generator().manual_seed(seed or 0)
        with torch.no_grad():
            for n, p in m.named_parameters():
                if seed is not None and "visual" not in n:
                    p.add_(torch.randn(p.shape, generator=g) * 0.3 * (p.std() if p.numel() > 1 else 1.0))
        return m

    original, first, second = load(None), load(5), load(6)
    prompts = [
        make_prompt(tiny_processor, "What is here?", [noise(1, (112, 84))], index=0),
        make_prompt(tiny_processor, "And here?", [noise(2, (56, 56)), solid((0, 200, 0))], index=1),
    ]
    agent = make_agent(tiny_processor, vllm_engine, runner, max_tokens_per_turn=64, max_assistant_turns=2)
    spec = SamplingSpec(n=2, max_tokens=400, ignore_eos=True)
    stream = _scripted_first_turn_stream(vllm_engine, agent, spec, tiny_processor.tokenizer)
    llm = vllm_engine.llm.llm_engine
    try:
        stream.add([StreamItem(g, p, seed=10 + g) for g, p in enumerate(prompts)], version=0)
        assert len(stream.calling) == 4 and not stream.running  # the four zoom calls run; the engine waits
        assert stream.interrupt() == 0
        _push(vllm_engine, first)
        assert stream.resume(version=1) == 0 and len(stream.calling) == 4  # the calls went on through the sync
        deadline = time.time() + 60
        while not (len(stream.running) == 4 and all(len(t.turn_ids) >= 3 for t in stream.running.values())):
            assert stream.step(1) == [] and time.time() < deadline
        assert stream.interrupt() == 4 and not llm.has_unfinished_requests()
        _push(vllm_engine, second)
        assert stream.resume(version=2) == 4
        done = []
        while stream.unfinished:
            done += stream.step(4)
    finally:
        _push(vllm_engine, original)
        stream.close()
    assert sorted(d.gid for d in done) == [0, 1] and not stream.groups and not llm.has_unfinished_requests()
    ids = qwen_vl.vision_token_ids(tiny_processor.tokenizer)
    for d in done:
        p, rb = prompts[d.gid], d.rollout
        assert len(rb) == 2 and d.interrupted == 2 and (d.min_version, d.max_version) == (0, 2)
        assert 0 < rb.timing["tool_s"] < rb.timing["generate_s"]
        x = build_inputs(
            [p],
            rb,
            process_images(tiny_processor, [p]),
            tiny_processor.tokenizer.pad_token_id,
            process_response_images(tiny_processor, rb),
        )
        assert x.has_response_images
        with torch.no_grad():
            by_first = response_logprobs(first, x, ids)[0]
            by_second = response_logprobs(second, x, ids)[0]
        for k, t in enumerate(rb.trajectories):
            assert t.assistant_turns == 2 and t.user_turns == 1 and len(t.images) == 1 and t.calls[0].error is None
            mask, v = t.response_mask, torch.tensor(d.versions[k])
            tool = mask.index(0)
            assert set(v[:tool].tolist()) == {0}  # the scripted first turn, before any push
            later = torch.tensor([j for j, m in enumerate(mask) if m == 1 and j > tool])
            assert len(later) == 64 and set(v[later].tolist()) == {1, 2}  # the second turn, across the second push
            lps = torch.tensor(rb.logprobs[k])[later]
            want = torch.where(v[later] == 1, by_first[k, later], by_second[k, later])
            assert float((want - lps).abs().max()) <= 1e-4
            other = torch.where(v[later] == 1, by_second[k, later], by_first[k, later])
            assert float((other - want).abs().max()) > 1e-3


def _push(engine, model) -> float:
    return engine.update_weights((qwen_vl.engine_weight_name(n), p.detach()) for n, p in model.named_parameters())


@pytest.mark.vllm
@pytest.mark.parametrize("family", ["qwen3_vl", "qwen3_vl_moe"])
def test_tool_images_in_every_family_match_vllm(family, runner):
    """The same check on the Qwen3-VL families (32-px image tokens, DeepStack): a zoom's image inside the response,
    then the engine's samples; the trainer's padded and packed forwards give the engine's log-probs (<= 1e-4) and
    the same gradients."""
    from transformers import AutoProcessor

    from vlmrl.config import RolloutConfig
    from vlmrl.models.packing import VARLEN
    from vlmrl.rollout.vllm import VLLMRollout
    from vlmrl.testing.tiny import FAMILY_SPECS, ensure_tiny_model

    path = str(ensure_tiny_model(0, FAMILY_SPECS[family]))
    proc = AutoProcessor.from_pretrained(path)
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32, attn_implementation=VARLEN).eval()
    engine = VLLMRollout(path, rollout_cfg=RolloutConfig(), max_model_len=512, limit_images=4)
    try:
        prompts = [
            make_prompt(proc, "What is here?", [noise(1, (112, 84))], index=0),
            make_prompt(proc, "And here?", [noise(2, (64, 64)), solid((0, 200, 0))], index=1),
        ]
        wrapped = FirstTurnScripted(engine, proc.tokenizer)
        rb = make_agent(proc, wrapped, runner).generate(prompts, SamplingSpec(n=2, max_tokens=400))
        assert _trainer_gap(model, proc, prompts, rb) <= 1e-4
    finally:
        engine.close()


def test_multi_turn_logprobs_with_a_tool_image_match_hf_generate(tiny_processor, hf_model, runner):
    from vlmrl.rollout.hf import HFRollout

    prompts = [
        make_prompt(tiny_processor, "What is here?", [noise(3, (112, 84))], index=0),
        make_prompt(tiny_processor, "And here?", [solid((200, 0, 0), (84, 84))], index=1),
    ]
    wrapped = FirstTurnScripted(HFRollout(hf_model, tiny_processor), tiny_processor.tokenizer)
    rb = make_agent(tiny_processor, wrapped, runner).generate(prompts, SamplingSpec(n=2, max_tokens=300))
    assert _trainer_gap(hf_model, tiny_processor, prompts, rb) <= 1e-4


def test_micro_batches_keep_each_samples_tool_images(tiny_processor, runner) -> None:
    """A micro-batch (``ModelInputs.select``) carries its rows' tool images and trims padding by real tokens, not by
    the policy mask (a response may end in tokens the mask leaves out)."""
    prompts = [
        make_prompt(tiny_processor, "Look.", [noise(4, (84, 84))], index=0),
        make_prompt(tiny_processor, "No image to zoom into.", [], index=1),
    ]
    engine = ScriptedEngine(tiny_processor.tokenizer, [ZOOM, "ok"])
    rb = make_agent(tiny_processor, engine, runner).generate(prompts, SamplingSpec(n=1))
    assert rb.trajectories[0].images and not rb.trajectories[1].images  # sample 1's call failed: no image
    rb.trajectories[1].response_mask[-3:] = [0, 0, 0]  # a response that ends in masked-out tokens
    x = build_inputs(
        prompts, rb, process_images(tiny_processor, prompts), 0, process_response_images(tiny_processor, rb)
    )
    one = x.select([1])
    assert one.sample_images == [x.sample_images[1]] and not one.has_response_images
    assert one.responses.shape[1] == len(rb.response_ids[1])  # trimmed by real tokens, not the last policy token
    both = x.select([1, 0])
    assert both.has_response_images and both.sample_images[1].num_images == 1


ALWAYS_ZOOM = """
import json


def write_turn(turn, conversation, sample, rng):
    if turn == 0:
        return "<tool_call>\\n" + json.dumps({"name": "image_zoom", "arguments": {"bbox_2d": [53, 53, 59, 59]}}) + (
            "\\n</tool_call>")
    return str(sample.ground_truth)
"""


def always_zoom_policy() -> tuple[Path, Path]:
    """(data folder, model folder): 16 zoom records and the tool-token tiny model after an 80-step warm start on a
    teacher that always zooms, then answers (``ALWAYS_ZOOM``); built once per version of the code that makes it (in
    $VLMRL_CACHE, atomically: the tests that train from it share one warm start)."""
    import hashlib

    from runs import ENV
    from vlmrl.preprocess import synthetic
    from vlmrl.testing.tiny import BUILDER_VERSION, TOOL_DEMO, cache_root, cached_build, ensure_tiny_model

    repo = Path(__file__).resolve().parents[1]
    code = [
        repo / "vlmrl" / "testing" / "warm_start.py",
        repo / "preprocess" / "synthetic.py",
        repo / "examples" / "tool_config" / "zoom.yaml",
    ]
    key = hashlib.sha256(b"".join(f.read_bytes() for f in code) + f"{ALWAYS_ZOOM}{BUILDER_VERSION}".encode())

    def build(folder: Path) -> None:
        data = folder / "data"
        synthetic.main(
            [
                "--output-dir",
                str(data),
                "--families",
                "zoom",
                "--image-size",
                "448",
                "--train-size",
                "16",
                "--test-size",
                "0",
                "--seed",
                "0",
                "--no-progress",
            ]
        )
        (folder / "teacher.py").write_text(ALWAYS_ZOOM)
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "vlmrl.testing.warm_start",
                "--model",
                str(ensure_tiny_model(0, TOOL_DEMO)),
                "--output",
                str(folder / "warm"),
                "--data",
                str(data / "train.parquet"),
                "--teacher",
                f"{folder / 'teacher.py'}:write_turn",
                "--tools",
                str(repo / "examples" / "tool_config" / "zoom.yaml"),
                "--steps",
                "80",
                "--lr",
                "5e-3",
                "--batch-size",
                "8",
                "--max-response-length",
                "128",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=repo,
            env={**os.environ, **ENV},
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    folder = cached_build(cache_root() / f"always-zoom-{key.hexdigest()[:12]}", "warm/vlmrl_warm_start.json", build)
    return folder / "data", folder / "warm"


@pytest.mark.vllm
@pytest.mark.slow
def test_training_with_multi_turn_tools_runs_on_vllm(tmp_path) -> None:
    """Two GRPO steps with multi-turn on (``tool_zoom_cpu``: 2 CPU workers, vLLM, the zoom tool) from a policy that
    calls the tool (the tool-token tiny model after an 80-step warm start on a teacher that always zooms, then
    answers): the tools' schemas are in every prompt, and the calls really run through the agent loop and the
    tool: most trajectories call ``image_zoom`` and get its result (2 assistant turns), the tool's text comes back in
    the response as a masked tool turn, and the metrics count them (turns, calls per tool, called share)."""
    from runs import metrics, run_here

    data, warm = always_zoom_policy()
    out, dump = tmp_path / "run", tmp_path / "dump"
    run_here(
        [
            "--config-name",
            "tool_zoom_cpu",
            f"data.train_files={data / 'train.parquet'}",
            "data.val_files=null",
            f"actor_rollout_ref.model.path={warm}",
            f"trainer.default_local_dir={out}",
            "trainer.logger=[jsonl]",
            "trainer.total_training_steps=2",
            "data.train_batch_size=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "actor_rollout_ref.rollout.n=4",
            f"trainer.rollout_data_dir={dump}",
        ]
    )
    rows = [r for r in metrics(out) if "multi_turn/turns/mean" in r]
    assert [r["step"] for r in rows] == [1, 2]
    samples = 8 * 4
    for r in rows:
        assert r["multi_turn/turns/mean"] > 1.5 and r["multi_turn/turns/max"] == 2, r  # max_assistant_turns=2
        assert r["multi_turn/tool_calls/mean"] > 0.5 and r["multi_turn/called_share"] > 0.5, r
        assert r["multi_turn/calls/image_zoom"] >= samples // 2, r  # calls that parsed and reached the tool
        assert r["multi_turn/errors/image_zoom"] < r["multi_turn/calls/image_zoom"], r
        assert 0 < r["multi_turn/policy_tokens/mean"] <= 128 and r["timing/tool_s"] > 0, r
    dumped = [json.loads(line) for p in sorted(dump.glob("*.jsonl")) for line in p.read_text().splitlines()]
    assert len(dumped) == 2 * samples
    assert all("# Tools" in d["prompt"] and "image_zoom" in d["prompt"] for d in dumped)  # the prompts list the tool
    zoomed = [d for d in dumped if "<tool_response>\nZoomed in on the region [53, 53, 59, 59]." in d["response"]]
    assert len(zoomed) >= samples, f"{len(zoomed)} of {len(dumped)} responses hold the tool's result"


def test_records_tools_kwargs_reach_the_tool_and_rewards_see_the_trajectory(tiny_processor) -> None:
    """verl's ``extra_info.tools_kwargs.<tool>.create_kwargs`` reach ``create``; the reward sample carries the
    trajectory and verl's ``tool_rewards``."""
    from utils import VERL_EXAMPLES

    from vlmrl.batch import RewardSample

    tools = VERL_EXAMPLES / "sglang_multiturn/config/tool_config/geo3k_tool_config.yaml"
    prompt = make_prompt(tiny_processor, "Solve.", [], answer="99")
    prompt.extra_info = {"tools_kwargs": {"calc_geo3k_reward": {"create_kwargs": {"ground_truth": "12"}}}}
    call = '<tool_call>{"name": "calc_geo3k_reward", "arguments": {"answer": "12"}}</tool_call>'
    engine = ScriptedEngine(tiny_processor.tokenizer, [call, "The answer is 12."])
    runner = ToolRunner(str(tools), 1, 30.0)
    try:
        rb = make_agent(tiny_processor, engine, runner).generate([prompt], SamplingSpec(n=1))
    finally:
        runner.close()
    t = rb.trajectories[0]
    assert t.calls[0].text == "Current parsed answer='12' reward=1.0"  # graded against create_kwargs, not "99"
    (sample,) = RewardSample.of_rollout([prompt], rb, tiny_processor.tokenizer, 400)
    assert sample.trajectory is t and sample.extra_info["tool_rewards"] == [0.0]
    assert "reward=1.0" in sample.response and sample.response.endswith("The answer is 12.")  # tool turns included
    assert prompt.extra_info == {"tools_kwargs": {"calc_geo3k_reward": {"create_kwargs": {"ground_truth": "12"}}}}
