"""The fully asynchronous trainer (``async_training.mode=fully_async``, verl's ``fully_async_policy``).

Fast: the config (verl's keys and defaults, the batch size they imply, what is refused by name, the dry run's plan),
and the Rollouter (``vlmrl.trainer.fully_async``) against scripted pools in this process: the freshness bound,
partial rollouts across syncs, finishing in flight without them, the checkpoint's pending prompts, a failed pool.
The engine side (a streamed group continued across a weight push, each token's log-prob its own weights') is in
``test_rollout.py``; the run (streaming, resume, learning) in the slow test at the end.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from runs import base_args, make_colour_data, metrics, run_here
from vlmrl.batch import RolloutBatch
from vlmrl.config import fully_async
from vlmrl.config.checks import batch_problems
from vlmrl.config.command import load
from vlmrl.rollout.stream import StreamGroup
from vlmrl.timing import Timer
from vlmrl.trainer.fully_async import PromptSource, StreamingRollout
from vlmrl.workers.group import Pending, WorkerError
from vlmrl.workers.sync import WeightMeta

REQUIRED = ("data.train_files=x", "actor_rollout_ref.model.path=m", "trainer.device=cpu")
POOLS = ("actor_rollout_ref.hybrid_engine=False", "trainer.cpu_workers=1", "rollout.cpu_workers=1")
FULLY = (*REQUIRED, *POOLS, "actor_rollout_ref.actor.ppo_mini_batch_size=4")
TOOLS = Path(__file__).resolve().parents[1] / "examples" / "tool_config" / "zoom.yaml"

# ------------------------------------------------------------------------------------------------------ config


def test_verls_config_of_the_trainer_gives_its_defaults_and_the_step_size() -> None:
    """``--config-name fully_async_ppo_trainer`` (what ``fully_async_main`` becomes): verl's defaults, the batch size
    0 of verl's scripts becomes require_batches x ppo_mini_batch_size, gen_batch_size 1 is accepted, the engine's
    log-probs are the old ones (``use_rollout_log_probs``), ``rollout.test_freq`` counts syncs."""
    cfg = load(
        [*FULLY, "async_training.require_batches=2", "rollout.test_freq=3"], config_name="fully_async_ppo_trainer"
    )
    at = cfg.async_training
    assert at.mode == "fully_async" and at.staleness_threshold == 0.1 and at.trigger_parameter_sync_step == 4
    assert at.partial_rollout is True and at.require_batches == 2
    assert cfg.data.train_batch_size == 8 and cfg.data.gen_batch_size == 1
    assert cfg.algorithm.rollout_correction.bypass_mode and cfg.trainer.test_freq == 12
    assert not batch_problems(cfg)
    # the mode on vlmrl's own config: verl's defaults fill what is not given
    own = load([*FULLY, "async_training.mode=fully_async", "data.train_batch_size=4"])
    assert own.async_training.trigger_parameter_sync_step == 4 and own.async_training.partial_rollout is True
    mode = ("async_training.mode=fully_async", "data.train_batch_size=4", "trainer.total_epochs=1")
    steps = load([*FULLY, *mode, "rollout.total_rollout_steps=40"])
    assert fully_async.total_steps(steps, batches_per_epoch=100) == 10  # 40 prompts / 4 per step
    assert fully_async.total_steps(steps, batches_per_epoch=5) == 5  # the data's epochs are fewer


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.train_batch_size=8"], "data.train_batch_size=8 with async_training.mode=fully_async"),
        (["actor_rollout_ref.rollout.name=hf"], "streams prompt groups through vLLM's engine"),
        (
            [
                "actor_rollout_ref.rollout.multi_turn.enable=True",
                f"actor_rollout_ref.rollout.multi_turn.tool_config_path={TOOLS}",
                "actor_rollout_ref.rollout.multi_turn.schedule=turn",
            ],
            "multi_turn.schedule=turn: the stream runs each trajectory's turns on its own schedule",
        ),
        (
            [
                "actor_rollout_ref.rollout.multi_turn.enable=True",
                f"actor_rollout_ref.rollout.multi_turn.tool_config_path={TOOLS}",
                "actor_rollout_ref.rollout.multi_turn.tool_workers=0",
                "actor_rollout_ref.rollout.multi_turn.tool_timeout_s=0",
            ],
            "tool_workers=0: streamed trajectories run their tool calls in worker processes",
        ),
        (
            [
                "actor_rollout_ref.rollout.multi_turn.enable=True",
                f"actor_rollout_ref.rollout.multi_turn.tool_config_path={TOOLS}",
                "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
                "rollout.cpu_workers=2",
            ],
            "tensor_model_parallel_size=2 and multi-turn tools",
        ),
        (["algorithm.filter_groups.enable=True"], "dynamic sampling draws whole batches"),
        (["async_training.fallback_kl=0.5"], "is the one-step off-policy trainer's"),
        (["async_training.staleness_threshold=-1"], "async_training.staleness_threshold=-1"),
        (["async_training.trigger_parameter_sync_step=0"], "trigger_parameter_sync_step=0: at least 1"),
        (["actor_rollout_ref.hybrid_engine=True"], "streams from a rollout pool of its own"),
    ],
)
def test_what_the_mode_cannot_run_is_refused_by_name(overrides: list[str], message: str) -> None:
    cfg = load([*FULLY, "async_training.mode=fully_async", "data.train_batch_size=0", *overrides])
    problems = batch_problems(cfg)
    assert any(message in p for p in problems), problems


def test_tensor_parallel_engines_stream() -> None:
    """Rollout engines of 2 workers each (tensor_model_parallel_size=2, 4 rollout workers) pass the gate, and the dry
    run's in-flight bound counts engines, not workers."""
    from vlmrl import dry_run
    from vlmrl.config.plan import run_plan

    tp = ["actor_rollout_ref.rollout.tensor_model_parallel_size=2", "rollout.cpu_workers=4"]
    cfg = load([*FULLY, "async_training.mode=fully_async", "data.train_batch_size=0", *tp])
    cfg.async_training.trigger_parameter_sync_step = 10  # a window of 44 groups, over the 2 engines' 32
    assert batch_problems(cfg) == []
    line = dry_run._pool_plan(cfg, run_plan(cfg), 4, "CPU")
    assert "at most 44 groups started between two syncs" in line and "at most 32 generating at once" in line, line


def test_multi_turn_tools_stream_per_trajectory() -> None:
    """Multi-turn tool rollouts stream (each trajectory's turns on its own schedule): the defaults pass the gate."""
    tools = [
        "actor_rollout_ref.rollout.multi_turn.enable=True",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={TOOLS}",
    ]
    assert batch_problems(load([*FULLY, "async_training.mode=fully_async", "data.train_batch_size=0", *tools])) == []


def test_the_modes_keys_without_the_mode_are_refused() -> None:
    from vlmrl.config.errors import ConfigError

    keys = ("async_training.staleness_threshold=0.5", "async_training.partial_rollout=False", "rollout.test_freq=2")
    for key in keys:
        with pytest.raises(ConfigError, match="applies to async_training.mode=fully_async"):
            load([*FULLY, key])
    with pytest.raises(ConfigError, match="async_training.mode='fast'"):
        load([*FULLY, "async_training.mode=fast"])


def test_verls_fully_async_keys_are_answered() -> None:
    """The keys verl's fully-async scripts set beyond vlmrl's own: aliased, noticed or accepted, none unknown."""
    from vlmrl.config.keys import translate

    keys = [
        "async_training.use_rollout_log_probs=True",
        "async_training.compute_prox_log_prob=False",
        "async_training.checkpoint_engine.enable=True",
        "async_training.use_trainer_do_validate=False",
        "rollout.total_epochs=10",
    ]
    out = translate(keys)
    assert out.overrides == ["++algorithm.rollout_correction.bypass_mode=True"], out
    assert not out.problems and len(out.notices) == 3, out
    assert translate(["async_training.use_trainer_do_validate=True"]).problems


# --------------------------------------------------------------------------------------------- the Rollouter


class FakePool:
    """A rollout pool of ``world`` engines, scripted: group ``gid``'s samples take ``lengths(index)`` engine steps
    (one token a step; every sample of a group the same), each token recording the weight version it came from."""

    def __init__(self, lengths, world: int = 1, fail_at: int | None = None) -> None:
        self.world, self.lengths, self.fail_at = world, lengths, fail_at
        self.version = -1
        self.running: dict[int, dict] = {}
        self.stopped: dict[int, dict] = {}
        self.started: list[tuple[int, int]] = []
        """(gid, engine version when started)."""
        self.indices: list[int] = []
        """The dataset index of each group started, in order."""
        self.calls = 0
        self.lock = threading.Lock()
        self.peak = 0
        """The most groups generating at once (interrupted ones included)."""

    def _pending(self, value):
        return Pending(lambda: value)

    def join_sync(self, init, meta, world):
        return self._pending([0.0] * self.world)

    def receive_weights(self):
        assert not self.running, "weights received while samples generate"
        self.version = self.next_version
        return self._pending([0.0] * self.world)

    def dead_worker_error(self, stage, grace_s=2.0):
        return None

    def stream_add(self, items, version):
        assert version == self.version
        for engine_items in items:
            for it in engine_items:
                n = self.lengths(it.prompt.index)
                self.running[it.gid] = {"item": it, "left": n, "versions": [], "parts": 1}
                self.started.append((it.gid, version))
                self.indices.append(it.prompt.index)
        self.peak = max(self.peak, len(self.running) + len(self.stopped))
        return self._pending([0] * self.world)

    def stream_step(self, steps):
        time.sleep(0.002 * steps)  # an engine step takes time: the trainer's syncs fall while groups generate
        self.calls += 1
        if self.fail_at is not None and self.calls >= self.fail_at:
            raise WorkerError("rollout worker 0 died during rollout (killed by SIGKILL)")
        done = []
        for _ in range(steps):
            for gid, g in list(self.running.items()):
                g["versions"].append(self.version)
                g["left"] -= 1
                if g["left"] == 0:
                    del self.running[gid]
                    k = len(g["versions"])
                    rb = RolloutBatch([[1]] * 2, [[7] * k] * 2, [[0.0] * k] * 2, ["stop"] * 2, n=2)
                    parted = 2 * (g["parts"] > 1)
                    done.append(StreamGroup(gid, rb, [list(g["versions"])] * 2, parted, 0.0, 1.0, g["versions"][0]))
        return self._pending([(done, 2 * len(self.running))])

    def stream_interrupt(self):
        self.stopped.update(self.running)
        self.running.clear()
        return [2 * len(self.stopped)]

    def stream_resume(self, version):
        for g in self.stopped.values():
            g["parts"] += 1
        self.running.update(self.stopped)
        self.stopped.clear()
        return [0]


class FakeTrainer:
    """The training pool's side of the sync: it tells the pool which version it sends."""

    world = 1

    def __init__(self, pool: FakePool) -> None:
        self.pool = pool
        self.sends = 0

    def weight_meta(self):
        return [WeightMeta("w", (4,), "float32")]

    def sync_rendezvous(self):
        return "file:///dev/null"

    def join_sync(self, init, meta, world):
        return Pending(lambda: [0.0])

    def send_weights(self):
        self.sends += 1
        return Pending(lambda: [(0.0, 16, 0.0)])

    def dead_worker_error(self, stage, grace_s=2.0):
        return None


def _source(count: int = 10_000):
    """Dataset indices 0, 1, 2, ... in batches of 4; the prompt of index i has ``.index`` i."""
    state = {"next": 0}

    def next_indices():
        start = state["next"]
        state["next"] += 4
        return list(range(start, start + 4))

    return PromptSource(next_indices, lambda i: SimpleNamespace(index=i), lambda: dict(state), count), state


def _rollouter(
    pool, steps: int, G: int = 2, staleness: float = 0.0, trigger: int = 2, partial: bool = True, scorer=None
):
    trainer = FakeTrainer(pool)
    cfg = SimpleNamespace(staleness_threshold=staleness, trigger_parameter_sync_step=trigger, partial_rollout=partial)
    source, state = _source()
    r = StreamingRollout(trainer, pool, 0, cfg, G, steps * G, source, scorer)
    real_sync = r.sync

    def sync(updates):  # the fake pool learns the version being sent
        pool.next_version = updates
        return real_sync(updates)

    r.sync = sync
    return r, state


def _train(
    r: StreamingRollout, steps: int, start: int = 0, update_s: float = 0.0, scores: list | None = None
) -> list[tuple[list[int], dict]]:
    """The trainer's loop: each step takes its groups (and their rewards, into ``scores``) and "updates" for
    ``update_s`` (then the Rollouter's after_update)."""
    out = []
    for step in range(start, start + steps):
        prompts, rb, m = r.next_batch(None, Timer(), step + 1, step, launch=True)
        out.append(([p.index for p in prompts], m))
        if scores is not None:
            scores.append(r.scored())
        time.sleep(update_s)
        r.after_update(Timer())
    return out


def test_with_staleness_0_every_group_starts_after_the_last_sync_and_the_window_is_kept() -> None:
    """``staleness_threshold=0``, a sync every 2 steps of 2 groups: the Rollouter starts exactly 4 groups per
    window, each from the weights of the last sync, so a group is at most 1 update stale (the second step of a
    window) and never more; the long groups make the trainer wait rather than the bound give way."""
    pool = FakePool(lambda i: 3 + 5 * (i % 3))
    r, _ = _rollouter(pool, steps=8)
    try:
        out = _train(r, 8)
    finally:
        r.close()
    per_version: dict[int, int] = {}
    for _, v in pool.started:
        per_version[v] = per_version.get(v, 0) + 1
    assert set(per_version.values()) == {4}, per_version  # the budget (1 + 0) * 2 * 2, and nothing more
    stale = [m["async/staleness_max"] for _, m in out]
    assert max(stale) <= 1.0 and stale.count(1.0) >= 2, stale
    trained = [i for idx, _ in out for i in idx]
    assert sorted(trained) == list(range(16))  # every prompt drawn was trained, once
    assert all(m["async/partial_groups"] == 0 for _, m in out)  # nothing was in flight at a sync


@pytest.mark.parametrize("world", [1, 2])
def test_at_most_16_groups_per_engine_generate_at_once(world: int) -> None:
    """A window of 64 groups (staleness 1, a sync every 4 steps of 8): the Rollouter keeps 16 groups per engine
    generating at once, as verl's Rollouter does, starting the next as one finishes; every prompt is trained once."""
    pool = FakePool(lambda i: 3 + 4 * (i % 5), world=world)
    r, _ = _rollouter(pool, steps=8, G=8, staleness=1.0, trigger=4)
    assert r.budget == 64 and r.max_in_flight == 16 * world
    try:
        out = _train(r, 8)
    finally:
        r.close()
    assert pool.peak == 16 * world, pool.peak
    trained = [i for idx, _ in out for i in idx]
    assert sorted(trained) == list(range(64))


class TensorParallelPool(FakePool):
    """4 rollout workers as 2 tensor-parallel engines of 2: the workers of an engine must get the same calls, and
    report the same results (as vLLM's workers of one engine do)."""

    def __init__(self, lengths) -> None:
        super().__init__(lengths, world=4)

    def stream_add(self, items, version):
        assert len(items) == 4 and items[0] == items[1] and items[2] == items[3], items
        super().stream_add([items[0], items[2]], version)
        return self._pending([0] * 4)

    def stream_step(self, steps):
        [(done, left)] = super().stream_step(steps).result()
        return self._pending([(done, left), (done, left), ([], 0), ([], 0)])  # (the engines' groups in one list)

    def stream_interrupt(self):
        [stopped] = super().stream_interrupt()
        self.stopped_total = getattr(self, "stopped_total", 0) + stopped
        return [stopped, stopped, 0, 0]


def test_tensor_parallel_engines_get_the_same_groups_on_each_worker_and_count_once() -> None:
    """Engines of 2 workers (tp=2): each group goes to both workers of its engine, is taken from the engine's first
    worker only (trained once), and the in-flight bound is 16 per engine; interrupted samples are counted once."""
    pool = TensorParallelPool(lambda i: 3 + 4 * (i % 5))
    trainer = FakeTrainer(pool)
    cfg = SimpleNamespace(staleness_threshold=1.0, trigger_parameter_sync_step=4, partial_rollout=True)
    source, _ = _source()
    r = StreamingRollout(trainer, pool, 0, cfg, 8, 8 * 8, source, tp=2)
    real_sync = r.sync

    def sync(updates):
        pool.next_version = updates
        return real_sync(updates)

    r.sync = sync
    assert r.engines == 2 and r.max_in_flight == 32
    try:
        out = _train(r, 8)
    finally:
        r.close()
    assert pool.peak == 32, pool.peak
    trained = [i for idx, _ in out for i in idx]
    assert sorted(trained) == list(range(64))
    reported = sum(m["async/interrupted_samples"] for _, m in out) + r.stats["interrupted"]  # (+ the last sync's)
    assert reported == pool.stopped_total > 0


def test_partial_rollouts_continue_across_a_sync_and_count_their_staleness() -> None:
    """A staleness threshold of 1 lets the Rollouter start the next window's groups early; a sync interrupts the
    long ones, which continue with the new weights: their tokens span two versions, their staleness is measured
    from the older, and they are counted in ``async/partial_groups``."""
    pool = FakePool(lambda i: 40 if i % 4 == 3 else 2)
    r, _ = _rollouter(pool, steps=6, staleness=1.0, trigger=1)
    try:
        out = _train(r, 6)
    finally:
        r.close()
    assert sum(m["async/partial_groups"] for _, m in out) >= 1, out
    assert max(m["async/staleness_max"] for _, m in out) >= 1.0
    assert sum(m["async/interrupted_samples"] for _, m in out) >= 2


def test_without_partial_rollouts_a_sync_waits_for_the_groups_in_flight() -> None:
    """``partial_rollout=False``: at a sync the pool finishes what it runs (no interruption); every group's tokens
    come from one version."""
    pool = FakePool(lambda i: 40 if i % 4 == 3 else 2)
    r, _ = _rollouter(pool, steps=6, staleness=1.0, trigger=1, partial=False)
    seen: list[StreamGroup] = []
    real = pool.stream_step

    def spy(steps):
        p = real(steps)
        for done, _ in p.result():
            seen.extend(done)
        return p

    pool.stream_step = spy
    try:
        out = _train(r, 6)
    finally:
        r.close()
    assert all(m["async/partial_groups"] == 0 and m["async/interrupted_samples"] == 0 for _, m in out)
    assert seen and all(g.min_version == g.max_version for g in seen)


def test_a_checkpoint_keeps_the_prompts_drawn_and_not_trained_and_a_resumed_run_generates_them_first() -> None:
    pool = FakePool(lambda i: 2 + (i % 5))
    r, state = _rollouter(pool, steps=10, staleness=0.5)
    try:
        done = _train(r, 3)
        with r.cv:
            extra = r.checkpoint_extra()
            sampler = r.checkpoint_sampler({})
    finally:
        r.close()
    trained = {i for idx, _ in done for i in idx}
    pending = extra["stream_pending"]
    assert pending and not trained & set(pending)
    assert sorted(trained | set(pending)) == list(range(sampler["next"]))  # every drawn prompt: trained or pending
    # a resumed run: the pending prompts first, then the sampler from where it was
    pool2 = FakePool(lambda i: 2)
    r2, state2 = _rollouter(pool2, steps=10, staleness=0.5)
    state2["next"] = sampler["next"]
    r2.restore_extra(extra, steps_left=7)
    try:
        more = _train(r2, 7, start=3)
    finally:
        r2.close()
    again = [i for idx, _ in more for i in idx]
    assert set(pending) <= set(again) and not set(again) & trained
    assert pool2.indices[: len(pending)] == pending
    # a checkpoint whose pending prompts are not in this run's data is refused, naming the key
    r3, _ = _rollouter(FakePool(lambda i: 2), steps=1)
    with pytest.raises(ValueError, match=r"stream_pending: \[10000, -1\] are not prompts of the 10000 training"):
        r3.restore_extra({"stream_pending": [3, 10000, -1]}, steps_left=1)
    assert len(again) == 14 and len(set(again)) == 14


def test_a_failed_rollout_pool_stops_the_trainer_naming_the_worker() -> None:
    pool = FakePool(lambda i: 5, fail_at=2)
    r, _ = _rollouter(pool, steps=4)
    try:
        with pytest.raises(WorkerError, match="rollout worker 0 died during rollout"):
            _train(r, 4)
    finally:
        r.close()


def test_a_steps_groups_are_scored_together_as_they_finish_and_the_step_gets_their_rewards_in_order() -> None:
    """With a scorer (the reward functions), a scoring thread scores each step's groups in one call as soon as the
    last of them finishes (steps take the queue in order), while the trainer updates: a step finds its groups'
    rewards (``scored()``, in the order of its prompts) computed before it took them (``async/scored_ahead``), and
    each group is scored once."""
    calls: list[tuple[list[int], int, str]] = []
    taken = [0]
    """Steps whose take began."""

    def scorer(prompts, rbs):
        calls.append(([p.index for p in prompts], taken[0], threading.current_thread().name))
        return [("score", p.index, len(rb.response_ids)) for p, rb in zip(prompts, rbs, strict=True)]

    pool = FakePool(lambda i: 2 + 3 * (i % 2))
    r, _ = _rollouter(pool, steps=6, staleness=1.0, trigger=2, scorer=scorer)
    scores: list = []
    out = []
    try:
        for step in range(6):
            taken[0] = step + 1  # step's take begins: what is scored from now on was not scored ahead of it
            out += _train(r, 1, start=step, update_s=0.1, scores=scores)
    finally:
        r.close()
    for (idx, _), got in zip(out, scores, strict=True):
        assert got == [[("score", i, 2) for i in idx]]  # one call: its groups' rewards, in its order
    steps = [idx for idx, _ in out]
    assert [c[0] for c in calls[: len(steps)]] == steps  # one call per step, with exactly its groups
    assert all(name.startswith("vlmrl-reward") for _, _, name in calls)
    # scored before the step that trains the groups began taking them: while the trainer updated
    ahead = [when <= step for step, (_, when, _) in enumerate(calls[: len(steps)])]
    assert sum(ahead[1:]) >= 3, calls
    assert sum(m["async/scored_ahead"] == 2.0 for _, m in out) >= 2, [m["async/scored_ahead"] for _, m in out]


def test_a_scorer_error_stops_the_step_that_trains_the_groups() -> None:
    """A reward call that raises in the scoring thread reaches the trainer in the step that takes those groups."""

    def scorer(prompts, rbs):
        if 3 in [p.index for p in prompts]:
            raise ValueError("reward call failed on prompt 3")
        return [p.index for p in prompts]

    pool = FakePool(lambda i: 2)
    r, _ = _rollouter(pool, steps=4, scorer=scorer)
    scores: list = []
    try:
        with pytest.raises(ValueError, match="prompt 3"):
            _train(r, 4, scores=scores)
    finally:
        r.close()
    assert scores == [[[0, 1]]]  # the first step's rewards came; the second step raised


# ------------------------------------------------------------------------------------------------------ the run


def _uids(folder: Path, steps: range) -> list[str]:
    """The records trained at ``steps`` (one uid per group: the dump has one line per sample)."""
    out: list[str] = []
    for step in steps:
        text = (folder / f"step_{step:06d}.jsonl").read_text()  # (not splitlines: a response may hold U+2028)
        rows = [json.loads(x) for x in text.split("\n") if x]
        out += list(dict.fromkeys(r["uid"] for r in rows))
    return out


@pytest.mark.slow
def test_fully_async_learns_the_colour_task_and_resumes_with_its_pending_prompts(tiny_model_dir, tmp_path) -> None:
    """The quick start's task on 1 training + 1 rollout worker, streamed (staleness_threshold 0.5, a sync after every
    step, partial rollouts): it learns (validation >= 0.9 after 120 steps); the trained groups are 0 or 1 update stale
    and never more than the window allows; every prompt is trained once; the report draws its panel. (Its 8-token
    groups are rarely in flight at a sync: partial rollouts are proven on the engine in test_rollout.py and in the
    Rollouter's tests above.) Resumed from its step-60 checkpoint, the run generates the checkpoint's pending prompts
    (drawn and not trained) before any new one and trains none of the prompts trained before the checkpoint."""
    data = make_colour_data(tmp_path / "data")
    first, dumps = tmp_path / "first", tmp_path / "dumps"
    common = (
        *POOLS,
        "async_training.mode=fully_async",
        "data.train_batch_size=0",
        "async_training.staleness_threshold=0.5",
        "async_training.trigger_parameter_sync_step=1",
        "trainer.val_before_train=false",
        "trainer.save_freq=60",
    )
    run = run_here(
        base_args(
            tiny_model_dir,
            data,
            first,
            *common,
            "trainer.total_training_steps=120",
            "trainer.test_freq=60",
            f"trainer.rollout_data_dir={dumps}",
        )
    )
    out = run.output()
    assert "fully-async: 1 training worker(s)" in out, out[-3000:]
    rows = metrics(first)
    assert [r["step"] for r in rows] == list(range(1, 121))
    assert rows[-1]["val/reward/mean"] >= 0.9, [(r["step"], r.get("val/reward/mean")) for r in rows]
    stale = [r["async/staleness_max"] for r in rows]
    assert set(stale) <= {0.0, 1.0} and stale.count(1.0) > 10, stale
    assert rows[0]["async/staleness_max"] == 0.0 and rows[0]["rollout/logprob_diff"] <= 1e-5
    assert all(r["async/queue_depth"] <= 8 for r in rows)  # (1 + 0.5) x 16 started at most, 16 taken
    # each step's groups scored by the Rollouter's thread in one call, as the last of them finished: ready or not
    assert {r["async/scored_ahead"] for r in rows} <= {0.0, 16.0}, [r["async/scored_ahead"] for r in rows]
    trained = _uids(dumps, range(1, 121))
    assert len(trained) == len(set(trained)) == 120 * 16
    from vlmrl.report.__main__ import main as report

    assert report([str(first), "--output", str(tmp_path / "report.html")]) == 0
    assert "<section class='panel' id='panel-stream'>" in (tmp_path / "report.html").read_text()  # drawn, not empty

    state = json.loads((first / "global_step_60" / "trainer_state.json").read_text())
    pending = state["stream_pending"]
    assert pending and len(pending) <= 24 + 15  # the window's groups, and the rest of the sampler's last batch
    resumed, dumps2 = tmp_path / "resumed", tmp_path / "dumps_resumed"
    shutil.copytree(first / "global_step_60", resumed / "global_step_60")
    (resumed / "latest_checkpointed_iteration.txt").write_text("60")
    steps = -(-len(pending) // 16)
    run_here(
        base_args(
            tiny_model_dir,
            data,
            resumed,
            *common,
            f"trainer.total_training_steps={60 + steps}",
            "trainer.test_freq=-1",
            f"trainer.rollout_data_dir={dumps2}",
        )
    )
    again = _uids(dumps2, range(61, 61 + steps))
    rows_of = {int(u.rsplit(":", 1)[1]) for u in again}
    assert set(pending) <= rows_of  # every pending prompt generated again (the run starts exactly steps x 16 groups)
    assert not set(again) & set(_uids(dumps, range(1, 61)))  # nothing trained before the checkpoint comes again


def test_a_config_built_in_code_gets_verls_defaults_when_checked() -> None:
    """``vlmrl.train.fit(cfg)`` on a config built in Python (no command line): the check fills verl's fully-async
    defaults and the step's batch size as composing does, and reports the config's real problems only."""
    from vlmrl.config import VLMRLConfig
    from vlmrl.config.checks import check_config
    from vlmrl.config.errors import ConfigError

    cfg = VLMRLConfig()
    cfg.async_training.mode = "fully_async"
    cfg.data.train_batch_size = 0
    cfg.actor_rollout_ref.actor.ppo_mini_batch_size = 4
    with pytest.raises(ConfigError) as e:  # (no data and no model: those problems remain)
        check_config(cfg)
    assert "staleness_threshold" not in str(e.value) and "train_batch_size" not in str(e.value), str(e.value)
    assert cfg.async_training.staleness_threshold == 0.1 and cfg.async_training.partial_rollout is True
    assert cfg.data.train_batch_size == 4
