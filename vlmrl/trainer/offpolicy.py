"""The one-step off-policy trainer's rollout side (``actor_rollout_ref.hybrid_engine=False``; verl's
``verl.experimental.one_step_off_policy``).

Two pools: the training pool (the trainer's worker group: policy, reference, critic) and the rollout pool (engines
only). The driver keeps one generation in flight::

    step t:  wait for batch t (generated with the weights after update t-2) ── sync the weights after update t-1
             into the engines ── launch batch t+1 ── rewards, advantages, update t (while batch t+1 generates)

so a batch is trained on one update after the weights that generated it (``async/staleness`` 1; the first step's
batch and a resumed run's first step are generated from the weights they train, staleness 0). The engine's
log-probs of the sampled tokens are the behaviour policy of the rollout correction (``config.plan.
rollout_correction``), and the PPO ratio is taken against the old log-probs the trainer recomputes, as verl does.
A checkpoint records the sampler as it was before the in-flight batch was drawn: a resumed run generates that batch
again, from the checkpoint's weights and the batch's own seed.
"""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass
from typing import Any

from vlmrl.batch import PromptSample, RolloutBatch
from vlmrl.timing import Timer
from vlmrl.trainer.rollouts import Draw, Rollouts, chunk_prompts, gather_leaders
from vlmrl.workers.group import Pending, WorkerError, WorkerGroup


def batch_seed(seed: int, step: int, k: int = 0) -> int:
    """The sampling seed of the ``k``-th batch generated for ``step`` (a batch is the same whatever ran before it)."""
    return (seed * 1_000_003 + step * 7_919 + k * 104_729) % 2**31


@dataclass
class InFlight:
    """A training batch the rollout pool is generating."""

    step: int
    """The step that will train on it."""
    prompts: list[PromptSample]
    pending: Pending
    version: int
    """Updates the engines' weights include (the step it trains at has ``step - 1``)."""
    sampler_state: dict[str, Any]
    """The sampler before these prompts were drawn (what a checkpoint records: a resumed run draws them again)."""
    seed: int


def wait_watching(pending: Pending, other: WorkerGroup, stage: str, poll_s: float = 0.5) -> list[Any]:
    """``pending.result()``, while watching the other pool: a worker of ``other`` that died (its peers then block in
    the collective until their timeout) is reported at once, not after ``trainer.worker_timeout_s``."""
    box: dict[str, Any] = {}

    def wait() -> None:
        try:
            box["result"] = pending.result()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e

    waiter = threading.Thread(target=wait, name=f"vlmrl-{stage}", daemon=True)
    waiter.start()
    while waiter.is_alive():
        waiter.join(poll_s)
        if waiter.is_alive() and (dead := other.dead_worker_error(stage, grace_s=0.0)) is not None:
            raise dead
    if "error" in box:
        raise box["error"]
    return box["result"]


class OffPolicyRollout(Rollouts):
    """The rollout pool, its weight sync and the one batch in flight (``vlmrl.trainer.rollouts``' interface)."""

    def __init__(self, trainer: WorkerGroup, pool: WorkerGroup, tp: int, seed: int) -> None:
        """Form the weight-sync group (training rank 0 + every rollout worker) and push the initial weights, so
        the engines hold exactly the trainer's (a checkpoint loaded before counts: call after loading it)."""
        self.trainer, self.pool, self.tp, self.seed = trainer, pool, tp, seed
        sw = Timer.start()
        meta = trainer.weight_meta()
        init, world = trainer.sync_rendezvous(), 1 + pool.world
        joining = [trainer.join_sync(init, meta, world), pool.join_sync(init, meta, world)]
        for j in joining:
            j.result()
        self.mb = sum(m.nbytes for m in meta) / 2**20
        """Megabytes a sync sends."""
        self.version = -1
        """Updates the engines' weights include (-1: not synced yet)."""
        self.inflight: InFlight | None = None
        self.setup_s = sw.elapsed
        self.fallback_due = False
        """Set when a step's behaviour KL exceeded ``async_training.fallback_kl``: the next step regenerates."""

    # ----------------------------------------------------------------------------------------------- weights
    def sync(self, updates: int) -> dict[str, float]:
        """The trainer's weights (after ``updates`` updates) into every engine, unless they hold them already;
        the pool must be idle. ``async/param_sync_*`` metrics (empty when nothing was sent)."""
        if self.version == updates:
            return {}
        sw = Timer.start()
        send, receive = self.trainer.send_weights(), self.pool.receive_weights()
        for pending, other in ((send, self.pool), (receive, self.trainer)):
            try:
                wait_watching(pending, other, "weight sync")
            except WorkerError as e:  # a broken broadcast: name the other pool's worker when it is the one gone
                dead = other.dead_worker_error("weight sync")
                if dead is not None:
                    raise dead from e
                raise
        sent = send.result()
        self.version = updates
        s = sw.elapsed
        return {
            "timing/param_sync_s": s,
            "async/param_sync_mb": self.mb,
            "async/param_sync_ms_per_mb": 1000.0 * s / max(self.mb, 1e-9),
            "async/param_sync_send_s": max(x[0] for x in sent),
            "async/param_sync_broadcast_s": sent[0][2],
            "async/param_sync_broadcast_mb_per_s": sent[0][1] / 2**20 / max(sent[0][2], 1e-9),
        }

    # ------------------------------------------------------------------------------------------- generation
    def launch(self, step: int, prompts: list[PromptSample], sampler_state: dict[str, Any]) -> None:
        """Start generating ``step``'s batch with the engines' current weights."""
        assert self.inflight is None, "one generation in flight at a time"
        seed = batch_seed(self.seed, step)
        pending = self.pool.start_generate(chunk_prompts(prompts, self.pool.world, self.tp), seed)
        self.inflight = InFlight(step, prompts, pending, self.version, copy.deepcopy(sampler_state), seed)

    def drain(self) -> float:
        """Wait for the generation in flight, if any (its batch stays for ``take``); seconds waited."""
        sw = Timer.start()
        if self.inflight is not None:
            self.inflight.pending.result()
        return sw.elapsed

    def take(self) -> tuple[InFlight, RolloutBatch]:
        """The batch in flight (waited for) and its rollout; nothing is in flight afterwards."""
        assert self.inflight is not None, "no generation in flight"
        gen, self.inflight = self.inflight, None
        return gen, gather_leaders(gen.pending.result(), self.tp)

    def generate_now(self, step: int, prompts: list[PromptSample], k: int, validate: bool = False) -> RolloutBatch:
        """Generate on the idle pool and wait (validation; dynamic sampling's further batches, the ``k``-th of
        ``step``; a fallback's fresh round)."""
        chunks = chunk_prompts(prompts, self.pool.world, self.tp)
        if validate:
            return gather_leaders(self.pool.generate(chunks, validate=True), self.tp)
        return gather_leaders(self.pool.start_generate(chunks, batch_seed(self.seed, step, k)).result(), self.tp)

    def checkpoint_sampler(self, current: dict[str, Any]) -> dict[str, Any]:
        """The sampler state a checkpoint records: before the in-flight batch was drawn (``current`` if none)."""
        return self.inflight.sampler_state if self.inflight is not None else current

    # ------------------------------------------------------------------------------- the trainer's stages
    @property
    def infos(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.pool.infos

    def next_batch(
        self, draw: Draw, timer: Timer, step: int, updates: int, launch: bool
    ) -> tuple[list[PromptSample], RolloutBatch, dict[str, float]]:
        """The batch generated while the previous step trained (generated now on the first step, after a resume,
        or after a fallback); then the trainer's weights go into the engines and (``launch``) the next step's batch
        starts generating. The ``async/*`` metrics."""
        metrics = {"timing/param_sync_s": 0.0}
        if self.inflight is None:  # nothing was launched for this step (first step, resumed run)
            metrics |= self.sync(updates)
            self.launch_next(draw, step)
        fallback = self.fallback_due and self.inflight is not None and self.inflight.version != updates
        with timer("wait_prev_gen"):
            gen, rb = self.take()
        version = gen.version
        metrics |= self.sync(updates)
        if fallback:  # the behaviour policy drifted too far: the same prompts again, from the current weights
            with timer("rollout"):
                rb, version = self.generate_now(step, gen.prompts, 0), updates
        self.fallback_due = False
        if launch:
            self.launch_next(draw, step + 1)
        return (
            gen.prompts,
            rb,
            metrics
            | {
                "async/staleness": float(updates - version),
                "async/fallback": float(fallback),
                "timing/gen_s": float(rb.timing.get("generate_s", 0.0)),
                "timeline/gen_start": rb.timing.get("start_time", 0.0),  # the rollout pool's, while the last update ran
                "timeline/gen_end": rb.timing.get("end_time", 0.0),
            },
        )

    def generate(
        self, prompts: list[PromptSample], step: int, updates: int, k: int = 0, validate: bool = False
    ) -> RolloutBatch:
        """Once the generation in flight is done, with the trainer's current weights."""
        self.drain()
        self.sync(updates)
        return self.generate_now(step, prompts, k, validate)

    def before_update(self, timer: Timer) -> None:
        """Nothing: the pool keeps generating the next batch while the update runs."""

    def after_update(self, timer: Timer) -> None:
        """Nothing: the new weights reach the pool by ``sync`` before its next generation."""

    def launch_next(self, draw: Draw, step: int) -> None:
        """Draw ``step``'s prompts and start generating them, unless a batch is in flight already."""
        if self.inflight is None:
            prompts, state = draw()
            self.launch(step, prompts, state)

    def after_step(self, metrics: dict[str, float], fallback_kl: float | None) -> None:
        """When this step's KL between the behaviour policy and the trainer's old log-probs (``rollout_corr/k3_kl``)
        exceeds ``async_training.fallback_kl``, the next step waits for a fresh generation from the current weights
        instead of the batch generated meanwhile."""
        if fallback_kl is not None and metrics.get("rollout_corr/k3_kl", 0.0) > fallback_kl:
            self.fallback_due = True
