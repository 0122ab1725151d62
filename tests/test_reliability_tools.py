"""Multi-turn tool rollouts hold against ordinary model output (issue 32): tool text never becomes special tokens,
a turn's images are capped together and per trajectory, calls that cannot be parsed are parse errors, a record's data
cannot replace the agent's image or pixel bounds, and a tool's huge error message is cut."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from utils import ScriptedEngine, make_agent, make_prompt, noise, solid

from vlmrl.models import qwen_vl
from vlmrl.rollout.base import SamplingSpec
from vlmrl.tools import hermes
from vlmrl.tools.runner import ToolRunner

pytestmark = pytest.mark.serial  # runs alone in a parallel suite: tool timeouts

TOOLS = """
from PIL import Image
from vlmrl.tools.base import BaseTool, ToolResponse

def schema(name):
    return {"type": "function", "function": {"name": name, "parameters": {}}}

class Three(BaseTool):
    default_schema = schema("three")
    async def execute(self, iid, params, **kw):
        return ToolResponse(text="three", image=[Image.new("RGB", (56, 56), (9, 9, 9))] * 3), 0.0, {}

class One(BaseTool):
    default_schema = schema("one")
    async def execute(self, iid, params, **kw):
        return ToolResponse(text="one", image=[Image.new("RGB", (56, 56), (9, 9, 9))]), 0.0, {}

class Loud(BaseTool):
    default_schema = schema("loud")
    async def execute(self, iid, params, **kw):
        raise RuntimeError("x" * 2_000_000)
"""


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("tools")
    (d / "tools.py").write_text(TOOLS)
    cfg = d / "tools.yaml"
    lines = ["tools:", "  - class_name: image_zoom", "  - class_name: calculator"]
    lines += [f"  - class_name: {d}/tools.py:{c}" for c in ("Three", "One", "Loud")]
    cfg.write_text("\n".join(lines) + "\n")
    tools = ToolRunner(str(cfg), 2, 10.0)
    yield tools
    tools.close()


def call(name: str, **arguments) -> str:
    import json

    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def test_parallel_calls_share_the_turns_image_cap(tiny_processor, runner) -> None:
    """Two calls of one turn each return 3 images; max_tool_images=4: the first call's 3 are taken, the second is an
    error for the policy, and the engine's next request holds 1 + 3 images (before: each call was checked alone
    against the images before the turn, and the engine got 7 images over a limit of 5)."""
    engine = ScriptedEngine(tiny_processor.tokenizer, [call("three") + call("three"), "done"])
    prompt = make_prompt(tiny_processor, "Look.", [solid((0, 0, 255))])
    agent = make_agent(tiny_processor, engine, runner, max_images=5, max_parallel_calls=2, max_tool_images=4)
    rb = agent.generate([prompt], SamplingSpec(n=1))
    first, second = rb.trajectories[0].calls
    assert first.error is None and first.images == 3
    assert second.error.startswith("bad_result: 3 more image(s) would exceed max_tool_images=4"), second.error
    assert len(engine.requests[1][0].images) == 4 <= 5


def test_max_tool_images_counts_the_whole_trajectory(tiny_processor, runner) -> None:
    """max_tool_images=1 on a prompt without images, the engine taking 3: the second turn's image is refused (before:
    the cap was the engine's per-request room, so a prompt with fewer images than the data's most got more)."""
    engine = ScriptedEngine(tiny_processor.tokenizer, [call("one"), call("one"), "done"])
    prompt = make_prompt(tiny_processor, "Look.", [])
    rb = make_agent(tiny_processor, engine, runner, max_images=3, max_tool_images=1).generate(
        [prompt], SamplingSpec(n=1)
    )
    first, second = rb.trajectories[0].calls
    assert first.error is None and first.images == 1
    assert "would exceed max_tool_images=1 (tool images per trajectory; 1 already)" in second.error
    assert len(rb.trajectories[0].images) == 1


@pytest.mark.parametrize(
    "pad",
    ["<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|im_end|>"],
)
def test_special_token_text_echoed_by_a_tool_stays_text(tiny_processor, runner, pad: str) -> None:
    """The policy writes a special token's characters (piece by piece, as ordinary tokens) and a tool echoes them
    (an unknown tool's name, a calculator error, an image_zoom label): the tool turn holds those characters, never
    the special token (before: tokenised with special tokens on, the run stopped at step 1 with 'more image pads
    than images', or the trainer's forward crashed on a video pad)."""
    tok = tiny_processor.tokenizer
    script = [
        call(pad) + call("calculator", expression=pad) + call("image_zoom", bbox_2d=[0, 0, 28, 28], label=pad),
        "done",
    ]
    engine = ScriptedEngine(tok, script, as_text=True)
    prompt = make_prompt(tiny_processor, "Look.", [noise(1, (84, 84))])
    agent = make_agent(tiny_processor, engine, runner, budget=4000, max_parallel_calls=3)
    rb = agent.generate([prompt], SamplingSpec(n=1))
    t = rb.trajectories[0]
    assert [c.error is None for c in t.calls] == [False, False, True], [c.error for c in t.calls]
    assert pad in t.calls[0].text and pad in t.calls[1].text and pad in t.calls[2].text
    special = set(tok.convert_tokens_to_ids(["<|image_pad|>", "<|video_pad|>", "<|vision_start|>"]))
    policy = [i for i, m in zip(rb.response_ids[0], t.response_mask) if m == 1]
    assert not special & set(policy)  # the policy wrote characters
    vision = qwen_vl.vision_token_ids(tok)
    (zoomed,) = t.images
    n_img = qwen_vl.num_image_tokens(
        zoomed.width, zoomed.height, 28, *qwen_vl.pixel_bounds(tiny_processor.image_processor)
    )
    assert rb.response_ids[0].count(vision.image_pad) == n_img  # the zoom's own pads and nothing else
    assert rb.response_ids[0].count(vision.video_pad) == 0
    assert rb.response_ids[0].count(tok.convert_tokens_to_ids("<|vision_start|>")) == 1
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert rb.response_ids[0].count(im_end) == 3  # turn 1, the tool turn, turn 2: no extra turn boundary
    assert tok.decode(engine.requests[1][0].ids).count(pad) >= 3  # the next turn reads the characters back


@pytest.mark.parametrize(
    "body",
    ["[" * 1000, '{"name": "calculator", "arguments": {"expression": ' + "9" * 5000 + "}}", "[" * 100000],
    ids=["nested 1000", "5000 digits", "nested 100000"],
)
def test_tool_calls_that_break_the_json_parser_are_parse_errors(tiny_processor, runner, body: str) -> None:
    """Deep nesting (RecursionError) and a number past Python's digit limit (ValueError) inside <tool_call> escaped
    the parser and failed the rollout; now they are a parse error the policy reads."""
    (parsed,) = hermes.parse(f"<tool_call>{body}</tool_call>")
    assert parsed.error is not None and parsed.error.startswith("invalid tool call JSON")
    engine = ScriptedEngine(tiny_processor.tokenizer, [f"<tool_call>{body}</tool_call>", "done"])
    rb = make_agent(tiny_processor, engine, runner, budget=200000).generate(
        [make_prompt(tiny_processor, "Go.", [])], SamplingSpec(n=1)
    )
    (c,) = rb.trajectories[0].calls
    assert c.error.startswith("parse: invalid tool call JSON"), c.error
    assert rb.trajectories[0].assistant_turns == 2


def test_a_records_create_kwargs_cannot_replace_the_agents_image_or_bounds(tiny_processor, runner) -> None:
    """verl-style tools_kwargs kept by preprocess/jsonl.py reach create(); ones naming the agent's own arguments
    (image_bounds, source_image, image) are data and lose: the zoom renders within the model's pixel budget (before:
    a record's image_bounds made every zoom 19992 x 19992, 1.6 GB each)."""
    prompt = make_prompt(tiny_processor, "Look.", [noise(2, (84, 84))])
    huge = [28, 3136, 19992 * 19992]
    prompt.extra_info = {
        "tools_kwargs": {
            "image_zoom": {"create_kwargs": {"image_bounds": huge, "source_image": "not an image", "image": "nor this"}}
        }
    }
    engine = ScriptedEngine(tiny_processor.tokenizer, [call("image_zoom", bbox_2d=[0, 0, 42, 42]), "done"])
    rb = make_agent(tiny_processor, engine, runner).generate([prompt], SamplingSpec(n=1))
    (c,) = rb.trajectories[0].calls
    assert c.error is None, c.error
    (zoomed,) = rb.trajectories[0].images
    _, hi = qwen_vl.pixel_bounds(tiny_processor.image_processor)
    assert zoomed.width * zoomed.height <= hi


def test_a_tools_huge_error_message_is_cut(tiny_processor, runner) -> None:
    """A tool that raises with 2 MB of text: the policy reads max_tool_response_length characters and the record
    keeps a couple of thousand (before: the whole text was tokenised into the trajectory: 20 MB took 29 s and 4.6
    GB)."""
    engine = ScriptedEngine(tiny_processor.tokenizer, [call("loud"), "done"])
    rb = make_agent(tiny_processor, engine, runner).generate(
        [make_prompt(tiny_processor, "Go.", [])], SamplingSpec(n=1)
    )
    (c,) = rb.trajectories[0].calls
    assert c.error.startswith("exception: RuntimeError: xxx") and len(c.error) < 2200
    assert len(c.text) <= 256 + len("...(truncated)...") and "(truncated)" in c.text
    assert len(rb.response_ids[0]) < 400


def test_unreadable_tool_files_are_config_errors(tmp_path: Path) -> None:
    """A tool file with a syntax error is refused naming the file and the entry (it used to be a traceback)."""
    from vlmrl.tools.config import ToolConfigError

    (tmp_path / "broken.py").write_text("def oops(:\n")
    cfg = tmp_path / "tools.yaml"
    cfg.write_text(f"tools:\n  - class_name: {tmp_path / 'broken.py'}:Tool\n")
    with pytest.raises(ToolConfigError, match=r"tools\[0\].*broken\.py.*SyntaxError"):
        ToolRunner(str(cfg), 0, 0.0)


GROUP_TOOLS = """
import os, time
from vlmrl.tools.base import BaseTool, ToolResponse

class Where(BaseTool):
    default_schema = {"type": "function", "function": {"name": "where", "parameters": {}}}
    def execute(self, iid, params, **kw):
        return ToolResponse(text=os.environ["VLMRL_FORKSERVER_PARENT"]), 0.0, {}  # the rank whose worker ran it

class Hang(BaseTool):
    default_schema = {"type": "function", "function": {"name": "hang", "parameters": {}}}
    def execute(self, iid, params, **kw):
        time.sleep(600)
"""


def _tensor_parallel_rank(rank: int, init: str, config: str, out: Any) -> None:
    """One rank of a 2-rank engine group: run a turn of ``where`` calls, then one of ``hang`` calls; report."""
    import os

    import torch.distributed as dist

    from vlmrl.supervise import HangError
    from vlmrl.tools.runner import ToolGroup, ToolRequest

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    runner = ToolRunner(config, 1, 1.0, ToolGroup(dist.new_group([0, 1], backend="gloo"), 0, rank == 0))
    try:
        texts = [o.text for o in runner.run([ToolRequest("where", {}), ToolRequest("where", {})])]
        try:
            runner.run([ToolRequest("hang", {})] * 4)
            hang = "no error"
        except HangError as e:
            hang = f"HangError: {e}"
        out.put((rank, os.getpid(), runner.pool is None, texts, hang))
    finally:
        runner.close()
        dist.destroy_process_group()


def test_the_ranks_of_a_tensor_parallel_engine_get_the_leaders_tool_outcomes(tmp_path: Path) -> None:
    """Two ranks sharing an engine: only the first starts tool workers and runs the calls; both read its outcomes
    (here the id of the rank that ran them), and a tool that hangs stops both with the same HangError (before: each
    rank ran its own calls, so a timeout or a varying answer gave the engine's ranks different contexts)."""
    from runs import processes

    (tmp_path / "group_tools.py").write_text(GROUP_TOOLS)
    config = tmp_path / "tools.yaml"
    config.write_text(
        f"tools:\n  - class_name: {tmp_path}/group_tools.py:Where\n  - class_name: {tmp_path}/group_tools.py:Hang\n"
    )
    ctx = processes()
    out = ctx.Queue()
    init = f"file://{tmp_path / 'rendezvous'}"
    procs = [ctx.Process(target=_tensor_parallel_rank, args=(r, init, str(config), out)) for r in (0, 1)]
    for p in procs:
        p.start()
    got = sorted(out.get(timeout=240) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    (r0, pid0, no_pool0, texts0, hang0), (r1, _, no_pool1, texts1, hang1) = got
    assert (r0, r1) == (0, 1) and not no_pool0 and no_pool1  # only the leader has tool workers
    assert texts0 == texts1 == [str(pid0), str(pid0)]
    assert hang0 == hang1 and "the first 2 calls of this batch all ran past their timeout" in hang0, (hang0, hang1)
