"""The fully asynchronous trainer's rollout side (``async_training.mode=fully_async``; verl's ``fully_async_policy``):
a Rollouter that streams prompt groups through the rollout pool, a queue of finished groups, and the weight syncs.

A thread of the driver (the Rollouter) keeps the pool's engines fed one prompt group at a time and moves each group
to the queue as soon as its ``n`` samples are done, with the weight versions that generated its tokens. A trainer
step takes the first ``data.train_batch_size`` (= ``require_batches * ppo_mini_batch_size``) groups of the queue,
waiting only when fewer are ready; every ``trigger_parameter_sync_step`` updates the Rollouter pauses, the weights go
to the pool and it resumes. Between two syncs it starts at most ``(1 + staleness_threshold) * trigger_parameter_sync_
step * train_batch_size`` groups, counting those still queued or generating from older weights (verl's freshness
rule); past that it waits for the sync, so nothing it generates is dropped. At most 16 groups per engine generate at
once (verl's ``max_concurrent_samples``): the next starts as one finishes. With ``partial_rollout`` the groups in
flight at a sync are interrupted and continued with the new weights (``vlmrl.rollout.stream``); without, the pool
finishes them first. With the reward functions alone (no reward model), a scoring thread scores each step's groups
in one call as soon as the last of them finishes (steps take the queue in order, ``train_batch_size`` at a time), so
when the queue runs ahead of the trainer a step finds its groups scored (``async/scored_ahead``); the step gives the
verdict on their failures (``reward.on_error``) over its whole batch, as when it scores them itself.

The staleness of a group is the trainer's updates when it trains minus the updates of the oldest weights that
generated one of its tokens (``async/staleness_mean``, ``_max``). The engine's log-probs of each token are the
behaviour policy of the rollout correction, as in the one-step off-policy trainer.

A checkpoint records the sampler and every prompt drawn but not trained yet (queued, generating, or drawn ahead): a
resumed run generates those prompts first, from the checkpoint's weights, then goes on with the sampler.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from vlmrl.batch import PromptSample, RolloutBatch
from vlmrl.config.fully_async import in_flight, window
from vlmrl.rollout.stream import StreamGroup, StreamItem
from vlmrl.timing import Timer
from vlmrl.trainer.offpolicy import OffPolicyRollout, batch_seed
from vlmrl.trainer.rollouts import Draw
from vlmrl.workers.group import WorkerGroup

POLL_STEPS = 16
"""The most engine steps a call of the pool runs while it streams: it returns as soon as a group finishes. It bounds
how long a sync waits for the pool to stop (and each call costs the driver, which shares the machine's cores)."""


@dataclass
class PromptSource:
    """Where the Rollouter draws prompts: the sampler's batches, one index at a time, and the dataset."""

    next_indices: Callable[[], list[int]]
    """The sampler's next batch of dataset indices."""
    load: Callable[[int], PromptSample]
    sampler_state: Callable[[], dict[str, Any]]
    size: int
    """Prompts in the training data."""


@dataclass
class _Group:
    gid: int
    index: int
    prompt: PromptSample
    engine: int
    done: StreamGroup | None = None
    scored: Future[Any] | None = None
    """The rewards of the step's groups it belongs to, computed by the scoring thread."""


class StreamingRollout(OffPolicyRollout):
    """The Rollouter, its queue and the weight syncs (``vlmrl.trainer.rollouts``' interface; the module docstring)."""

    def __init__(
        self,
        trainer: WorkerGroup,
        pool: WorkerGroup,
        seed: int,
        async_cfg: Any,
        groups_per_step: int,
        total_groups: int,
        source: PromptSource,
        scorer: Callable[[list[PromptSample], list[RolloutBatch]], Any] | None = None,
        tp: int = 1,
    ) -> None:
        """``total_groups``: the groups the run's remaining steps train on (the Rollouter starts no more).
        ``scorer``: the rewards of finished groups (their prompts and rollouts), called by a scoring thread with each
        step's groups as soon as they finished; :meth:`scored` gives those of the groups a step took. None: the step
        scores them.
        ``tp``: rollout workers per engine (tensor-parallel); every worker of an engine gets the same calls, in the
        same order, and the engine's first worker's results are its own."""
        super().__init__(trainer, pool, tp, seed)
        self.engines = pool.world // tp
        self.scorer = scorer
        self.scoring = ThreadPoolExecutor(1, thread_name_prefix="vlmrl-reward") if scorer is not None else None
        self.unscored: list[_Group] = []
        """Finished groups not yet given to the scoring thread (fewer than a step's)."""
        self.taken: list[Future[Any]] | None = None
        """The rewards of the groups the last step took (with a scorer)."""
        self.G, self.source = groups_per_step, source
        self.trigger = int(async_cfg.trigger_parameter_sync_step)
        self.partial = bool(async_cfg.partial_rollout)
        self.budget = window(async_cfg.staleness_threshold, self.trigger, groups_per_step)
        """Groups the Rollouter may start between two syncs (those carried over from older weights included)."""
        self.max_in_flight = in_flight(self.engines, self.budget)
        """Groups generating at once at most (interrupted ones included)."""
        self.remaining = total_groups
        self.cv = threading.Condition()
        self.todo: deque[int] = deque()
        """Indices to generate before drawing more (a resumed run's pending prompts, the rest of a drawn batch)."""
        self.groups: dict[int, _Group] = {}
        """Groups started and not yet trained, by gid."""
        self.queue: deque[_Group] = deque()
        """Finished groups, in the order they finished."""
        self.window = 0
        self.next_gid = 0
        self.load = [0] * self.engines
        self.pause_req = self.paused = self.stop = False
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None
        self.updates = 0
        self.since_sync = 0
        self.carry: dict[str, float] = {}
        """Metrics of the syncs since the last step (reported with the next step)."""
        self.stats = {"idle_s": 0.0, "interrupted": 0.0, "syncs": 0.0}

    # --------------------------------------------------------------------------------- the Rollouter thread
    def _draw(self) -> _Group | None:
        """The next prompt (under the lock), or None when the run needs no more groups."""
        if self.remaining <= 0:
            return None
        if not self.todo:
            self.todo.extend(self.source.next_indices())
        index = self.todo.popleft()
        engine = min(range(len(self.load)), key=self.load.__getitem__)
        g = _Group(self.next_gid, index, self.source.load(index), engine)
        self.groups[g.gid] = g
        self.next_gid += 1
        self.remaining -= 1
        self.window += 1
        self.load[engine] += 1
        return g

    def _top_up(self) -> None:
        """Start groups until the window's budget (or the run's need) is reached, at most :attr:`max_in_flight`
        generating at once."""
        started: list[list[StreamItem]] = [[] for _ in range(self.engines)]
        with self.cv:
            while (
                self.window < self.budget
                and sum(self.load) < self.max_in_flight
                and not self.pause_req
                and (g := self._draw()) is not None
            ):
                started[g.engine].append(StreamItem(g.gid, g.prompt, batch_seed(self.seed, g.gid)))
        if any(started):
            self.pool.stream_add(self._per_worker(started), self.version).result()

    def _per_worker(self, per_engine: list[Any]) -> list[Any]:
        """Each worker's share of per-engine calls: its engine's."""
        return [per_engine[rank // self.tp] for rank in range(self.pool.world)]

    def _poll(self) -> int:
        """One call of the pool's engines; finished groups to the queue. Samples still unfinished."""
        results = self.pool.stream_step(POLL_STEPS).result()[:: self.tp]  # (an engine's workers agree)
        with self.cv:
            for done, _ in results:
                for sg in done:
                    g = self.groups[sg.gid]
                    g.done = sg
                    self.load[g.engine] -= 1
                    self.queue.append(g)
                    if self.scorer is not None:
                        self.unscored.append(g)
                        if len(self.unscored) == self.G:  # a step's groups (steps take the queue in order)
                            self._score()
            self.cv.notify_all()
        return sum(left for _, left in results)

    def _score(self) -> None:
        """Hand the finished groups not yet scored to the scoring thread, as one call (under the lock)."""
        assert self.scoring is not None and self.scorer is not None
        groups, self.unscored = self.unscored, []
        done = [g.done for g in groups if g.done is not None]
        future = self.scoring.submit(self.scorer, [g.prompt for g in groups], [sg.rollout for sg in done])
        for g in groups:
            g.scored = future

    def _hold(self) -> None:
        """A sync or a generation of the trainer's wants the pool: stop (interrupt or finish what runs), wait."""
        if self.partial:
            self.stats["interrupted"] += sum(self.pool.stream_interrupt()[:: self.tp])
        else:
            while self._poll():
                pass
        with self.cv:
            self.paused = True
            self.cv.notify_all()
            while self.pause_req and not self.stop:
                self.cv.wait()
            self.paused = False
        if self.partial and not self.stop:
            self.pool.stream_resume(self.version)

    def _run(self) -> None:
        try:
            busy = 0
            while not self.stop:
                if self.pause_req:
                    self._hold()
                    continue
                self._top_up()
                with self.cv:
                    inflight = len(self.groups) - len(self.queue)
                if inflight == 0 and busy == 0:  # the window is spent (or the run's groups are all out): wait
                    sw = Timer.start()
                    with self.cv:
                        self.cv.wait(0.05)
                    self.stats["idle_s"] += sw.elapsed
                    continue
                busy = self._poll()
        except BaseException as e:  # noqa: BLE001 - handed to the trainer's thread
            with self.cv:
                self.error = e
                self.cv.notify_all()

    # ------------------------------------------------------------------------------- the trainer's thread
    def _raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error

    def _start(self, updates: int) -> None:
        if self.thread is None:
            self.updates = updates
            self.carry |= self.sync(updates)
            self.thread = threading.Thread(target=self._run, name="vlmrl-rollouter", daemon=True)
            self.thread.start()

    def _pause(self) -> None:
        with self.cv:
            self.pause_req = True
            self.cv.notify_all()
            while not self.paused:
                self._raise_if_failed()
                self.cv.wait(0.5)

    def _resume(self) -> None:
        with self.cv:
            self.pause_req = False
            self.cv.notify_all()

    def _sync_paused(self, updates: int) -> dict[str, float]:
        """The weights after ``updates`` updates into the paused pool; a new window starts, counting what is queued or
        generating from the older weights."""
        metrics = self.sync(updates)
        if metrics:
            with self.cv:
                self.window = len(self.groups)
            self.since_sync = 0
            self.stats["syncs"] += 1
        return metrics

    def next_batch(
        self, draw: Draw, timer: Timer, step: int, updates: int, launch: bool
    ) -> tuple[list[PromptSample], RolloutBatch, dict[str, float]]:
        """The first ``train_batch_size`` groups that finished (waiting for them when fewer are ready)."""
        self._start(updates)
        self.updates = updates
        with timer("wait_rollout"), self.cv:
            while len(self.queue) < self.G:
                self._raise_if_failed()
                if self.remaining <= 0 and len(self.groups) < self.G:
                    raise RuntimeError(f"the Rollouter holds {len(self.groups)} groups, fewer than a step's {self.G}")
                self.cv.wait(0.5)
            taken = [self.queue.popleft() for _ in range(self.G)]
            for g in taken:
                del self.groups[g.gid]
            depth = len(self.queue)
        groups = [g.done for g in taken if g.done is not None]
        # (with a scorer a step's groups were given to it together, when the last of them finished)
        self.taken = (
            list(dict.fromkeys(g.scored for g in taken if g.scored is not None)) if self.scorer is not None else None
        )
        stale = [updates - sg.min_version for sg in groups]
        rb = RolloutBatch.concat([sg.rollout for sg in groups])
        metrics = self.carry | {
            "async/staleness_mean": sum(stale) / len(stale),
            "async/staleness_max": float(max(stale)),
            "async/staleness": sum(stale) / len(stale),
            "async/queue_depth": float(depth),
            "async/partial_groups": float(sum(sg.interrupted > 0 for sg in groups)),
            "async/rollouter_idle_s": self.stats["idle_s"],
            "async/interrupted_samples": self.stats["interrupted"],
            "async/syncs": self.stats["syncs"],
            "timing/gen_s": sum(sg.end_time - sg.start_time for sg in groups) / len(groups),
            "timeline/gen_start": min(sg.start_time for sg in groups),
            "timeline/gen_end": max(sg.end_time for sg in groups),
        }
        if self.taken is not None:
            metrics["async/scored_ahead"] = float(sum(g.scored is not None and g.scored.done() for g in taken))
        self.carry = {"timing/param_sync_s": 0.0}
        self.stats["idle_s"] = self.stats["interrupted"] = 0.0
        return [g.prompt for g in taken], rb, metrics

    def generate(
        self, prompts: list[PromptSample], step: int, updates: int, k: int = 0, validate: bool = False
    ) -> RolloutBatch:
        """With the Rollouter paused and the trainer's current weights in the pool (validation, a further batch)."""
        if self.thread is None:
            self.sync(updates)
            return self.generate_now(step, prompts, k, validate)
        self._pause()
        try:
            self.carry |= self._sync_paused(updates)
            return self.generate_now(step, prompts, k, validate)
        finally:
            self._resume()

    def after_update(self, timer: Timer) -> None:
        """Every ``trigger_parameter_sync_step`` updates: pause the Rollouter, sync the weights, resume it."""
        self.updates += 1
        self.since_sync += 1
        if self.since_sync < self.trigger or self.thread is None:
            return
        with timer("sync"):
            self._pause()
            try:
                self.carry |= self._sync_paused(self.updates)
            finally:
                self._resume()

    def scored(self) -> list[Any] | None:
        """The rewards of the groups the last step took, one result per scorer call, in their order (waiting for a
        call still running; a scorer's error is raised here, in the step that trains the groups); None without a
        scorer."""
        if self.taken is None:
            return None
        return [f.result() for f in self.taken]

    def launch_next(self, draw: Draw, step: int) -> None:
        """Nothing: the Rollouter streams on its own."""

    def after_step(self, metrics: dict[str, float], fallback_kl: float | None) -> None:
        """Nothing (``fallback_kl`` is the one-step trainer's)."""

    # --------------------------------------------------------------------------------------- checkpoints
    def checkpoint_sampler(self, current: dict[str, Any]) -> dict[str, Any]:
        """The sampler after every batch the Rollouter drew (the prompts not trained yet are :meth:`pending`)."""
        with self.cv:
            return self.source.sampler_state()

    def pending(self) -> list[int]:
        """Dataset indices drawn and not trained yet, in the order they were drawn (a checkpoint keeps them)."""
        with self.cv:
            return [g.index for _, g in sorted(self.groups.items())] + list(self.todo)

    def checkpoint_extra(self) -> dict[str, Any]:
        """``stream_pending``: the prompts drawn and not trained yet."""
        return {"stream_pending": self.pending()}

    def restore_extra(self, state: dict[str, Any], steps_left: int) -> None:
        """A resumed run: the checkpoint's pending prompts are generated first; the Rollouter starts the groups of
        ``steps_left`` steps in all."""
        pending = state.get("stream_pending", [])
        bad = [i for i in pending if not (isinstance(i, int) and 0 <= i < self.source.size)]
        if bad:
            raise ValueError(
                f"trainer_state.json stream_pending: {bad[:5]} are not prompts of the {self.source.size} training "
                "prompts (the data changed since the checkpoint?)"
            )
        with self.cv:
            self.todo = deque(pending)
            self.remaining = steps_left * self.G

    def close(self) -> None:
        """Stop the Rollouter (a call it has running ends first; the pool's shutdown ends one that does not)."""
        with self.cv:
            self.stop = True
            self.cv.notify_all()
        if self.thread is not None:
            self.thread.join(timeout=5)
        if self.scoring is not None:
            self.scoring.shutdown(wait=False, cancel_futures=True)
