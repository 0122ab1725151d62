"""Where a step's batches come from, and what the engines do around the update: one interface, two implementations.

- :class:`HybridRollouts` (``actor_rollout_ref.hybrid_engine=True``, the default): the training workers' own
  engines generate; they sleep for the update (their device memory goes to it) and wake with the new weights (the
  push).
- ``vlmrl.trainer.offpolicy.OffPolicyRollout`` (``hybrid_engine=False``, verl's one-step off-policy trainer): a
  rollout pool of its own generates the next batch while the update runs; the weights reach it by a collective
  before each launch.

The trainer's ``fit`` calls the same stages for both: ``next_batch`` (the step's batch) → ``generate`` (any further
batch now: dynamic sampling's, an estimator's baseline rollout, validation) → ``launch_next`` (the pool: the next
step's batch starts generating) → ``before_update`` → the update → ``after_update``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from vlmrl.batch import PromptSample, RolloutBatch
from vlmrl.timing import Timer
from vlmrl.workers.group import WorkerGroup

Draw = Callable[[], tuple[list[PromptSample], dict[str, Any]]]
"""The next batch's prompts and the sampler's state before they were drawn (timed as ``data`` by the trainer)."""


def chunk_prompts(prompts: list[Any], world: int, tp: int) -> list[list[Any]]:
    """Rank r's prompts: the prompts split evenly (or, when they do not divide, in ceil-sized chunks with empty
    tails) over the ``world // tp`` engine groups, every rank of a tensor-parallel group getting its group's."""
    groups = world // tp
    k = -(-len(prompts) // groups)
    chunks = [prompts[i * k : (i + 1) * k] for i in range(groups)]
    return [chunks[rank // tp] for rank in range(world)]


def gather_leaders(parts: list[RolloutBatch], tp: int) -> RolloutBatch:
    """One copy of each engine group's samples (its first rank's), in rank order."""
    leaders = parts[::tp]
    return RolloutBatch.concat([p for p in leaders if len(p) or p is leaders[0]])


class Rollouts(ABC):
    """The rollout side of a step (the module's docstring lists the stages and the two implementations)."""

    infos: list[dict[str, Any]] = []
    """What the workers beyond the training group reported when they started (the start-up line)."""

    @abstractmethod
    def next_batch(
        self, draw: Draw, timer: Timer, step: int, updates: int, launch: bool
    ) -> tuple[list[PromptSample], RolloutBatch, dict[str, float]]:
        """The step's batch: its prompts, its rollout and the metrics of getting it. ``updates``: the policy
        updates done; ``launch``: no further generation comes this step (the next step's batch may start)."""

    @abstractmethod
    def generate(
        self, prompts: list[PromptSample], step: int, updates: int, k: int = 0, validate: bool = False
    ) -> RolloutBatch:
        """Generate ``prompts`` now with the weights after ``updates`` updates (``k``: the step's k-th batch;
        ``validate``: the validation's sampling)."""

    @abstractmethod
    def before_update(self, timer: Timer) -> None:
        """The engines make room for the update."""

    @abstractmethod
    def after_update(self, timer: Timer) -> None:
        """The engines get what the update changed (or will before they next generate)."""

    def launch_next(self, draw: Draw, step: int) -> None:
        """Start ``step``'s batch now, if this side generates ahead (nothing by default)."""
        return None

    def scored(self) -> list[Any] | None:
        """The rewards of the batch :meth:`next_batch` returned last, one result per scoring call, where this side
        scored its groups as they finished (the fully asynchronous Rollouter); None (the default): the step scores
        it."""
        return None

    def checkpoint_sampler(self, current: dict[str, Any]) -> dict[str, Any]:
        """The sampler state a checkpoint records (the current one by default)."""
        return current

    def after_step(self, metrics: dict[str, float], fallback_kl: float | None) -> None:
        """Read the step's metrics (the pool: whether the behaviour policy drifted past ``fallback_kl``)."""
        return None

    def checkpoint_extra(self) -> dict[str, Any]:
        """What a checkpoint keeps of this side beyond the sampler (the streaming pool's pending prompts)."""
        return {}

    def restore_extra(self, state: dict[str, Any], steps_left: int) -> None:
        """Take back :meth:`checkpoint_extra` from a checkpoint's state (``steps_left``: the run's remaining steps)."""
        return None

    def close(self) -> None:
        """Stop what this side runs in the driver (before the workers are shut down)."""
        return None


class HybridRollouts(Rollouts):
    """The hybrid engine: every training worker's own engine generates its share of the prompts."""

    def __init__(self, group: WorkerGroup, tp: int) -> None:
        self.group, self.tp = group, tp
        self.infos = []

    def next_batch(
        self, draw: Draw, timer: Timer, step: int, updates: int, launch: bool
    ) -> tuple[list[PromptSample], RolloutBatch, dict[str, float]]:
        prompts, _ = draw()
        with timer("rollout"):
            return prompts, self.generate(prompts, step, updates), {}

    def generate(
        self, prompts: list[PromptSample], step: int, updates: int, k: int = 0, validate: bool = False
    ) -> RolloutBatch:
        """Prompts split evenly over the engine groups (the ranks of a tensor-parallel group all get their
        group's), gathered in order, one copy per group."""
        return gather_leaders(self.group.generate(chunk_prompts(prompts, self.group.world, self.tp), validate), self.tp)

    def before_update(self, timer: Timer) -> None:
        with timer("sleep"):  # the engines give their device memory to the update (GPU; CPU: nothing)
            self.group.sleep_engines()

    def after_update(self, timer: Timer) -> None:
        with timer("push"):  # the new weights into the engines, which wake for the next rollout
            pushed = self.group.push_weights()
        gather = [p["gather"] for p in pushed if "gather" in p]
        if gather:  # of it, the slowest rank's time producing the weights (the rest is the engines')
            timer.add("push_gather", max(gather))
