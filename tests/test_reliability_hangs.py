"""User code that hangs fails fast (issue 32): a reward or a tool that hangs on every call stops the run within a few
timeouts naming it; one that hangs now and then costs about one timeout per worker per batch; a timeout stops work
that holds the GIL (sympy grading ``9^{9^{9}}``); a hung tool leaves no thread behind."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from utils import ScriptedEngine, inline_cfg, make_agent, make_prompt, solid, synthetic_data

from vlmrl.batch import RewardSample
from vlmrl.config import CustomRewardFunctionConfig, RewardConfig
from vlmrl.rollout.base import SamplingSpec
from vlmrl.scoring import RewardError, RewardManager
from vlmrl.supervise import (
    EXCEPTION,
    SHORT_TIMEOUT_FACTOR,
    SHORT_TIMEOUT_FLOOR_S,
    TIMEOUT,
    CallResult,
    HangError,
    HangWatch,
    SupervisedPool,
)
from vlmrl.tools.runner import ToolRunner

pytestmark = pytest.mark.serial  # runs alone in a parallel suite: timeouts of 0.5-5 s and bounds on elapsed time

REPO = Path(__file__).resolve().parents[1]
CHUNK_FALLBACK_S = 1.0
"""What a reward pool's first failed chunk adds, once per pool: the chunk's short timeout (0.1-0.2 s here) and the
restart of its worker (0.3-0.4 s on this machine) before its calls go again one per task."""

REWARDS = """
import os
import time

def vl(sample):
    r = sample.response
    if r == "sleep":
        time.sleep(600)
    if r == "spin":
        while True:
            pass
    if r == "slow":
        time.sleep(1.0)
    if r == "raise":
        raise ValueError("broken")
    if r == "exit":
        os._exit(3)
    return float(len(r))
"""

TOOLS = """
import time
from vlmrl.tools.base import BaseTool, ToolResponse

class Hang(BaseTool):
    default_schema = {"type": "function", "function": {"name": "hang", "parameters": {}}}
    def execute(self, iid, params, **kw):
        time.sleep(600)
"""

WHERE = """
import os, threading
from vlmrl.tools.base import BaseTool, ToolResponse

class Where(BaseTool):
    default_schema = {"type": "function", "function": {"name": "where", "parameters": {}}}
    def execute(self, iid, params, **kw):
        return ToolResponse(text=f"{os.getpid()} {threading.get_ident()}"), 0.0, {}
"""


def S(response: str) -> RewardSample:
    return RewardSample(response=response, ground_truth="", data_source="src", prompt="p", extra_info={})


@pytest.fixture(scope="module")
def reward_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("rewards") / "rewards.py"
    path.write_text(REWARDS)
    return str(path)


def manager(path: str, **kw) -> RewardManager:
    return RewardManager(RewardConfig(function=f"{path}:vl", **kw), CustomRewardFunctionConfig())


# ------------------------------------------------------------------------------------------------------ rewards


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("how", ["sleep", "spin"])
def test_a_reward_that_hangs_on_every_call_stops_the_batch_within_three_timeouts(reward_file, workers, how) -> None:
    """reward.timeout_s=1, every call hangs (blocked or spinning): the first 2 x workers calls time out together
    and the batch stops with HangError naming the function, the timeout and the count; before, 16 samples x 1 s
    one after another (or 8 s with 2 workers) and then a step of fallback scores. (The batch's first calls go in a
    chunk, whose failure costs CHUNK_FALLBACK_S once per pool.)"""
    with manager(reward_file, num_workers=workers, timeout_s=1.0) as rm:
        rm.score([S("warm")] * workers)  # the workers started (the first rollout comes after start-up)
        t0 = time.perf_counter()
        with pytest.raises(HangError) as e:
            rm.score([S(how)] * 16)
        elapsed = time.perf_counter() - t0
    assert elapsed < 3 * 1.0 + CHUNK_FALLBACK_S, elapsed
    msg = str(e.value)
    assert "vl" in msg and "reward.timeout_s=1 s" in msg and f"first {2 * workers} calls" in msg and "hangs" in msg


def test_a_reward_that_hangs_on_one_call_in_ten_costs_about_one_timeout_per_worker(reward_file) -> None:
    """1 call in 10 hangs: the first hang costs reward.timeout_s (3 s), each later one in the batch the short
    timeout (1 s: 10x the slowest call that returned, at least 1 s); every other sample is scored and the hangs
    are counted (and the first chunk's failure, once per pool). Before: 4 x 3 s one after another."""
    samples = [S("sleep" if i % 10 == 0 else "ab") for i in range(40)]
    with manager(reward_file, num_workers=1, timeout_s=3.0) as rm:
        rm.score([S("warm")])
        t0 = time.perf_counter()
        out = rm.score(samples)
        elapsed = time.perf_counter() - t0
    assert out.errors == ["timeout" if i % 10 == 0 else None for i in range(40)]
    assert out.scores == [0.0 if i % 10 == 0 else 2.0 for i in range(40)]
    assert out.metrics["reward/timeouts"] == 4.0
    assert elapsed < 3.0 + 3 * SHORT_TIMEOUT_FLOOR_S + CHUNK_FALLBACK_S + 1.5, elapsed  # before: 12 s


def test_the_short_timeout_is_ten_times_the_slowest_return_at_least_1_s_at_most_the_timeout() -> None:
    """The rule the README states: full timeouts until each slot has had one, then 10x the slowest call that
    returned, never under 1 s nor over the configured timeout; no call returned yet: the full timeout."""

    def watch(slowest: float | None, timeout_s: float = 5.0, slots: int = 2) -> HangWatch:
        w = HangWatch("f", "reward.timeout_s", slots, timeout_s, slowest)
        assert w.timeout() == timeout_s  # no timeout yet in this batch
        w.record(CallResult(error=TIMEOUT, seconds=timeout_s))
        assert w.timeout() == timeout_s  # one slot of two has had its timeout
        w.record(CallResult(error=TIMEOUT, seconds=timeout_s))
        return w

    assert watch(0.01).timeout() == SHORT_TIMEOUT_FLOOR_S == 1.0
    assert watch(0.3).timeout() == pytest.approx(SHORT_TIMEOUT_FACTOR * 0.3) == pytest.approx(3.0)
    assert watch(0.9).timeout() == 5.0  # 9 s capped at the timeout
    assert watch(None).timeout() == 5.0  # nothing returned: nothing to scale
    w = watch(0.01)
    w.record(CallResult(error=None, seconds=0.2))  # a slower return in the batch raises the short timeout
    assert w.timeout() == pytest.approx(2.0)


def test_the_short_timeout_applies_within_a_batch_and_a_new_batch_starts_with_full_timeouts(reward_file) -> None:
    """One worker, timeout 5 s: the first hang costs 5 s, the second the short timeout (1 s: the floor, the warm
    call returned at once); a call of 1 s in a new batch is not stopped (its budget starts over at 5 s)."""
    with manager(reward_file, num_workers=1, timeout_s=5.0) as rm:
        rm.score([S("warm")])
        t0 = time.perf_counter()
        out = rm.score([S("sleep"), S("ab"), S("sleep")])
        elapsed = time.perf_counter() - t0
        assert out.errors == ["timeout", None, "timeout"]
        assert 5.0 + SHORT_TIMEOUT_FLOOR_S <= elapsed < 5.0 + 5.0, elapsed  # two full timeouts would be 10 s
        out = rm.score([S("slow"), S("abc")])  # a new batch: 1 s is well within its 5 s
        assert out.errors == [None, None] and out.scores == [4.0, 3.0]


def test_a_batch_stops_as_soon_as_the_failure_ratio_cannot_be_met(reward_file) -> None:
    """reward.max_failed_ratio=0.25: once 4 of 16 calls failed, the batch stops without waiting for the rest
    (before: the 12 slow calls ran to the end first, 12 s)."""
    samples = [S("raise")] * 4 + [S("slow")] * 12
    with manager(reward_file, num_workers=1, timeout_s=30.0, max_failed_ratio=0.25) as rm:
        rm.score([S("warm")])
        t0 = time.perf_counter()
        with pytest.raises(RewardError, match=r"reward exception on sample 0 .*ValueError: broken"):
            rm.score(samples)
        assert time.perf_counter() - t0 < 4.0


HANG_FROM_STEP_2 = """
import os, time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    log = LOG
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, b"%.6f\\n" % time.time())
    os.close(fd)
    with open(log) as f:
        calls = len(f.readlines())
    if calls > 8:  # step 1 has 4 prompts x 2 samples: from step 2 on, every call hangs
        time.sleep(600)
    return 1.0 if "a" in solution_str else 0.0
"""


@pytest.mark.slow
def test_a_run_whose_reward_starts_hanging_stops_within_three_timeouts_keeping_the_checkpoint(
    tiny_model_dir: str, tmp_path: Path
) -> None:
    """Training with a reward that hangs on every call from step 2 on: the run stops with the reward's name, the
    timeout and the checkpoint of step 1, within 3 x reward.timeout_s of the first hanging call."""
    from vlmrl.trainer.grpo import RunStopped, fit

    data = synthetic_data(tmp_path / "data")
    calls = tmp_path / "calls.log"
    reward = tmp_path / "hang.py"
    reward.write_text(f"LOG = {str(calls)!r}\n" + HANG_FROM_STEP_2)
    out = tmp_path / "run"
    cfg = inline_cfg(
        tiny_model_dir,
        data,
        out,
        "trainer.total_training_steps=4",
        "trainer.save_freq=1",
        f"custom_reward_function.path={reward}",
        "reward.timeout_s=2",
    )
    with pytest.raises(RunStopped) as e:
        fit(cfg)
    stopped = time.time()
    first_hang = float(calls.read_text().splitlines()[8])
    msg = str(e.value)
    assert msg.startswith("step 2: reward ") and "compute_score" in msg, msg
    assert "reward.timeout_s=2 s" in msg and "first 2 calls" in msg and "it hangs" in msg
    assert f"last complete checkpoint: {out / 'global_step_1'}" in msg
    assert stopped - first_hang < 3 * 2.0, stopped - first_hang


# -------------------------------------------------------------------------------------------------------- tools


GEO3K = "tools:\n  - class_name: geo3k_check\n"


@pytest.mark.timeout(120)
def test_a_tool_call_that_holds_the_gil_is_stopped_and_the_step_goes_on(tiny_processor, tmp_path: Path) -> None:
    """The policy answers ``9^{9^{9}}`` to geo3k_check: math-verify in sympy holds the GIL (a thread's timeout never
    fires; before, the workers froze until trainer.worker_timeout_s). In a tool worker process the call ends as a
    timeout error after tool_timeout_s, and the next call works."""
    cfg = tmp_path / "geo3k.yaml"
    cfg.write_text(GEO3K)
    tools = ToolRunner(str(cfg), 2, 2.0)
    try:
        call = '<tool_call>{"name": "calc_geo3k_reward", "arguments": {"answer": "9^{9^{9}}"}}</tool_call>'
        ok = '<tool_call>{"name": "calc_geo3k_reward", "arguments": {"answer": "12"}}</tool_call>'
        prompt = make_prompt(tiny_processor, "Solve.", [], answer="12")
        t0 = time.perf_counter()
        engine = ScriptedEngine(tiny_processor.tokenizer, [call, ok, "done"])
        rb = make_agent(tiny_processor, engine, tools).generate([prompt], SamplingSpec(n=1))
        elapsed = time.perf_counter() - t0
    finally:
        tools.close()
    first, second = rb.trajectories[0].calls
    assert first.error.startswith("timeout: calc_geo3k_reward timed out after 2 s"), first.error
    assert second.error is None and second.text == "Current parsed answer='12' reward=1.0"
    assert elapsed < 2.0 + 3.0, elapsed


def test_a_tool_that_hangs_on_every_call_stops_the_run_and_leaves_no_thread(tiny_processor, tmp_path: Path) -> None:
    """A tool that never returns: its first 2 x tool_workers calls time out together and the rollout stops with
    HangError naming the tool and tool_timeout_s (before: every turn of every step waited the timeout, and each call
    left its thread running, never reclaimed)."""
    (tmp_path / "hang.py").write_text(TOOLS)
    cfg = tmp_path / "tools.yaml"
    cfg.write_text(f"tools:\n  - class_name: {tmp_path / 'hang.py'}:Hang\n")
    threads = threading.active_count()
    tools = ToolRunner(str(cfg), 2, 1.0)
    try:
        call = '<tool_call>{"name": "hang", "arguments": {}}</tool_call>'
        prompts = [make_prompt(tiny_processor, "Go.", [solid((0, 0, 255))], index=i) for i in range(4)]
        engine = ScriptedEngine(tiny_processor.tokenizer, [call])
        t0 = time.perf_counter()
        with pytest.raises(HangError) as e:
            make_agent(tiny_processor, engine, tools).generate(prompts, SamplingSpec(n=2))
        elapsed = time.perf_counter() - t0
    finally:
        tools.close()
    assert elapsed < 3 * 1.0, elapsed
    msg = str(e.value)
    assert "hang (4)" in msg and "actor_rollout_ref.rollout.multi_turn.tool_timeout_s=1 s" in msg
    time.sleep(0.5)
    assert threading.active_count() <= threads + 1  # nothing of the hung calls runs on here


def test_a_tool_that_hangs_one_call_a_turn_stops_the_rollout_after_2_x_tool_workers_turns(
    tiny_processor, tmp_path: Path
) -> None:
    """One trajectory calling a hanging tool once a turn: the timeouts count across the rollout's turns, so the
    rollout stops at the 4th (2 x tool_workers) instead of paying a timeout every turn to the end of its budget."""
    (tmp_path / "hang.py").write_text(TOOLS)
    cfg = tmp_path / "tools.yaml"
    cfg.write_text(f"tools:\n  - class_name: {tmp_path / 'hang.py'}:Hang\n")
    tools = ToolRunner(str(cfg), 2, 1.0)
    try:
        engine = ScriptedEngine(tiny_processor.tokenizer, ['<tool_call>{"name": "hang", "arguments": {}}</tool_call>'])
        agent = make_agent(tiny_processor, engine, tools, budget=4000, max_assistant_turns=20)
        with pytest.raises(HangError, match=r"the first 4 calls of this batch all ran past their timeout"):
            agent.generate([make_prompt(tiny_processor, "Go.", [])], SamplingSpec(n=1))
    finally:
        tools.close()
    assert len(engine.requests) == 4  # one call per turn, four turns


def test_hung_tool_calls_now_and_then_are_bounded_and_counted(tiny_processor, tmp_path: Path) -> None:
    """A tool that hangs on some calls: each such call is a counted timeout for the policy, the others answer; no
    thread or process is left per hung call (the pool holds tool_workers processes)."""
    import psutil

    (tmp_path / "hang.py").write_text(TOOLS)
    cfg = tmp_path / "tools.yaml"
    cfg.write_text(f"tools:\n  - class_name: {tmp_path / 'hang.py'}:Hang\n  - class_name: calculator\n")
    tools = ToolRunner(str(cfg), 2, 1.0)
    me = psutil.Process()
    try:
        hang = '<tool_call>{"name": "hang", "arguments": {}}</tool_call>'
        calc = '<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}</tool_call>'
        prompt = make_prompt(tiny_processor, "Go.", [])
        for _ in range(3):
            engine = ScriptedEngine(tiny_processor.tokenizer, [calc + hang, "done"])
            rb = make_agent(tiny_processor, engine, tools, max_parallel_calls=2).generate(
                [prompt] * 3, SamplingSpec(n=1)
            )
            kinds = [(c.name, (c.error or "").split(":")[0]) for t in rb.trajectories for c in t.calls]
            assert kinds == [("calculator", ""), ("hang", "timeout")] * 3
        children = [p for p in me.children(recursive=True) if p.is_running()]
        assert len(children) <= 2 + 2  # the pool's workers (+ the forkserver and its resource tracker)
    finally:
        tools.close()


def test_tool_workers_zero_runs_calls_inline_and_takes_no_timeout(tiny_processor, tmp_path: Path) -> None:
    """tool_workers=0 (debugging) runs calls in the caller's thread, where nothing can stop one: the config check
    asks for tool_timeout_s=0 with it."""
    from vlmrl.config import ConfigError, load

    zoom = REPO / "examples/tool_config/zoom.yaml"
    base = [
        "data.train_files=x.parquet",
        "actor_rollout_ref.model.path=m",
        "actor_rollout_ref.rollout.multi_turn.enable=True",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={zoom}",
        "actor_rollout_ref.rollout.multi_turn.tool_workers=0",
    ]
    with pytest.raises(ConfigError, match="tool_workers=0 runs tool calls in the rollout worker's own thread"):
        load(base)
    assert load(base + ["actor_rollout_ref.rollout.multi_turn.tool_timeout_s=0"]).actor_rollout_ref.rollout.multi_turn
    runner = ToolRunner(str(zoom), 0, 0.0)
    assert runner.pool is None
    call = '<tool_call>{"name": "image_zoom", "arguments": {"bbox_2d": [0, 0, 28, 28]}}</tool_call>'
    engine = ScriptedEngine(tiny_processor.tokenizer, [call, "done"])
    prompt = make_prompt(tiny_processor, "Look.", [solid((255, 0, 0), (112, 112))])
    rb = make_agent(tiny_processor, engine, runner).generate([prompt], SamplingSpec(n=1))
    (c,) = rb.trajectories[0].calls
    assert c.error is None and c.images == 1
    # where the call ran: this process and this thread
    (tmp_path / "where.py").write_text(WHERE)
    (tmp_path / "where.yaml").write_text(f"tools:\n  - class_name: {tmp_path / 'where.py'}:Where\n")
    runner = ToolRunner(str(tmp_path / "where.yaml"), 0, 0.0)
    engine = ScriptedEngine(
        tiny_processor.tokenizer, ['<tool_call>{"name": "where", "arguments": {}}</tool_call>', "ok"]
    )
    rb = make_agent(tiny_processor, engine, runner).generate(
        [make_prompt(tiny_processor, "Go.", [])], SamplingSpec(n=1)
    )
    (c,) = rb.trajectories[0].calls
    assert c.error is None and c.text.split() == [str(os.getpid()), str(threading.get_ident())], c.text


def test_a_hung_reward_is_named_by_its_spec(reward_file: str) -> None:
    """The message of a hung reward names the function it was loaded from (several rewards can be told apart)."""
    with manager(reward_file, num_workers=1, timeout_s=0.5) as rm:
        rm.score([S("warm")])
        with pytest.raises(HangError, match=r"reward .*rewards\.py:vl"):
            rm.score([S("sleep")] * 4)


# ------------------------------------------------------------------------------------------ fast calls in chunks


def tasks_of(pool: SupervisedPool) -> list[int]:
    """The number of calls in each task ``pool`` hands its workers from now on."""
    sizes: list[int] = []
    real = pool.pool.schedule

    def schedule(fn, args=(), **kw):
        sizes.append(len(args[1]) if fn.__name__ == "_timed_each" else 1)
        return real(fn, args=args, **kw)

    pool.pool.schedule = schedule
    return sizes


def test_a_fast_reward_goes_to_its_workers_in_chunks_with_the_same_scores(reward_file: str) -> None:
    """128 fast calls: a few tasks of many calls each (a task's round trip costs more than the call), every score and
    its order as one call per task gives; the chunks shrink as the batch drains."""
    samples = [S("x" * (i % 7)) for i in range(128)]
    for workers in (1, 2):
        with manager(reward_file, num_workers=workers, timeout_s=30.0) as rm:
            rm.score([S("warm")] * 16)
            sizes = tasks_of(rm._pool.pool)
            out = rm.score(samples)
        assert out.scores == [float(i % 7) for i in range(128)] and out.errors == [None] * 128
        assert sum(sizes) == 128 and len(sizes) <= 24 and sizes[0] >= 8, sizes
        assert sizes == sorted(sizes, reverse=True), sizes


def test_a_hang_inside_a_chunk_costs_only_its_own_call_and_ends_the_chunks(reward_file: str) -> None:
    """A call that hangs inside a chunk: the chunk runs past its short timeout, its calls go again one per task, the
    hung one alone times out (under reward.timeout_s, not the chunk's), every other is scored in order, and the
    pool sends no more chunks."""
    samples = [S("sleep" if i == 5 else "ab") for i in range(40)]
    with manager(reward_file, num_workers=1, timeout_s=2.0) as rm:
        rm.score([S("warm")] * 4)
        pool = rm._pool.pool
        sizes = tasks_of(pool)
        t0 = time.perf_counter()
        out = rm.score(samples)
        elapsed = time.perf_counter() - t0
        assert out.errors == ["timeout" if i == 5 else None for i in range(40)]
        assert out.scores == [0.0 if i == 5 else 2.0 for i in range(40)]
        assert sizes[0] > 1 and elapsed >= 2.0, (sizes, elapsed)  # the hung call had its own full timeout
        del sizes[:]
        assert rm.score(samples[6:]).scores == [2.0] * 34
        assert sizes == [1] * 34


def test_a_call_that_kills_its_worker_inside_a_chunk_costs_only_that_call(reward_file: str) -> None:
    """``os._exit`` in one call of a chunk: only that sample fails (its worker died), the others are scored."""
    samples = [S("exit" if i == 3 else "abc") for i in range(24)]
    with manager(reward_file, num_workers=1, timeout_s=30.0) as rm:
        rm.score([S("warm")] * 4)
        sizes = tasks_of(rm._pool.pool)
        out = rm.score(samples)
    assert sizes[0] > 1, sizes
    assert out.errors == ["exception" if i == 3 else None for i in range(24)]
    assert out.scores == [0.0 if i == 3 else 3.0 for i in range(24)]


def test_a_call_that_raises_inside_a_chunk_is_that_calls_failure() -> None:
    """The pool itself: an exception in one call of a chunk is that call's EXCEPTION result with its message, the
    chunk's other calls return their values, in order."""
    import math

    pool = SupervisedPool("sqrt", "t.timeout_s", 1, 30.0)
    try:
        pool.map(math.sqrt, [(4.0,)] * 4, chunks=True)
        sizes = tasks_of(pool)
        res = pool.map(math.sqrt, [(float(i),) if i != 2 else (-1.0,) for i in range(12)], chunks=True)
    finally:
        pool.close()
    assert sizes[0] > 1, sizes
    assert [r.error for r in res] == [EXCEPTION if i == 2 else None for i in range(12)]
    assert res[2].message == "ValueError: math domain error"
    assert [r.value for r in res if r.error is None] == [math.sqrt(i) for i in range(12) if i != 2]
