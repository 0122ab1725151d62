"""Worker groups: the hybrid workers of a run, driven by the single controller with one typed method per worker call.

Three launchers (``trainer.launcher``), one interface (``WorkerGroup``):

* ``local`` (the default on one machine): one process per worker, started and watched by the driver, commands over
  pipes, the process group met through a file (``file://`` rendezvous) and gloo bound to loopback. Nothing a run
  starts listens on a network interface.
* ``ray``: Ray actors, for clusters (``trainer.ray_address``, or ``RAY_ADDRESS``; ``auto`` picks this launcher then).
  Ray's token authentication stays on (``RAY_AUTH_MODE=token``); the workers meet over TCP on the cluster network.
* ``inline``: one worker in the driver's own process (one device, no second process: debugging).

A worker that raises, dies or stops answering within ``trainer.worker_timeout_s`` stops the driver with a
``WorkerError`` naming the worker and the stage, instead of leaving the others waiting in a collective.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from vlmrl.batch import PreparedShard, PromptSample, RolloutBatch, TrainShard
from vlmrl.startup import StartupFailure


class WorkerError(RuntimeError):
    """A worker failed, died or stopped answering; the message names its rank and the stage. A worker that failed
    while starting carries ``failure`` (``vlmrl.startup.StartupFailure``): what it was doing, the cause and what to
    check."""

    def __init__(self, message: str, failure: StartupFailure | None = None) -> None:
        super().__init__(message)
        self.failure = failure


HUGE_PAGES = "THP_MEM_ALLOC_ENABLE"
"""torch's switch (read by its CPU allocator) that puts every tensor allocation of 2 MB or more on transparent huge
pages (``madvise``): FSDP2 allocates every unit's gathered weights and its all-gather buffers anew at each gather,
and on 4 KB pages the kernel's first touch of them cost more than the copies themselves (measured at the ``100m``
preset: the gather of every weight for the push 1.2 -> 0.58 s). Small allocations and the processes' own heaps stay
on 4 KB pages (glibc's ``glibc.malloc.hugetlb=1``, which moves those too, made the tests' tiny runs ~5 % slower).
A value the caller sets is kept (``THP_MEM_ALLOC_ENABLE=0`` turns it off)."""


def worker_env(device: str) -> dict[str, str]:
    """Environment every worker process starts with (CPU workers: one thread, vLLM's CPU settings, large tensors on
    huge pages: :data:`HUGE_PAGES`)."""
    env = {
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "ERROR"),
    }
    if device == "cpu":
        env.update(
            OMP_NUM_THREADS=os.environ.get("VLMRL_WORKER_THREADS", "1"),
            VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
            VLLM_CPU_OMP_THREADS_BIND="nobind",
            **{HUGE_PAGES: os.environ.get(HUGE_PAGES, "1")},
        )
    for k in ("VLMRL_CACHE", "HF_HOME", "HF_HUB_OFFLINE", "PYTHONPATH", "VLMRL_USER_DIRS"):
        if k in os.environ:
            env[k] = os.environ[k]
    return env


class Pending:
    """A call the workers are running (``WorkerGroup.submit``): ``result()`` waits for it (once; then it is kept).
    One call at a time per group: the next starts after this one's ``result()``."""

    def __init__(self, collect: Callable[[], list[Any]]) -> None:
        self._collect: Callable[[], list[Any]] | None = collect
        self._result: list[Any] = []

    @property
    def waited(self) -> bool:
        """Whether ``result()`` has returned."""
        return self._collect is None

    def result(self) -> list[Any]:
        """The workers' results in rank order (a failure raises ``WorkerError`` as ``call`` does)."""
        if self._collect is not None:
            collect, self._collect = self._collect, None
            self._result = collect()
        return self._result


class WorkerGroup(ABC):
    """The run's hybrid workers (or one pool of them). ``submit`` starts a method on every worker, ``call`` also
    waits for it (results in rank order); the typed methods below are the calls the trainer makes."""

    world: int
    """Number of workers."""
    device: str
    """cpu or cuda."""
    infos: list[dict[str, Any]]
    """Per worker: rank, device, pid, node, start-up seconds."""
    startup_s: float
    """Seconds from launch until every worker was ready."""

    @abstractmethod
    def submit(self, stage: str, method: str, args: list[tuple]) -> Pending:
        """Start ``method(*args[i])`` on worker i and return at once; ``result()`` waits (a worker that raises, dies
        or does not answer within ``trainer.worker_timeout_s`` then raises ``WorkerError`` naming it and ``stage``)."""

    def call(self, stage: str, method: str, args: list[tuple]) -> list[Any]:
        """``method(*args[i])`` on worker i; results in rank order. The first failure raises ``WorkerError``."""
        return self.submit(stage, method, args).result()

    def dead_worker_error(self, stage: str, grace_s: float = 2.0) -> WorkerError | None:
        """The error naming a worker of this group whose process has ended (None: all alive, or a launcher that
        cannot tell): a peer's collective broken by it is reported as that worker's death."""
        return None

    def sync_rendezvous(self) -> str:
        """Where the weight-sync group of two pools meets (``file://`` or ``tcp://``), hosted by this group's rank
        0; only the training pool of ``hybrid_engine=False`` is asked."""
        raise NotImplementedError(f"{type(self).__name__} runs one worker: no second pool to sync with")

    @abstractmethod
    def shutdown(self, grace_s: float = 10.0) -> None:
        """End the workers (only what this group started), forcibly after ``grace_s`` seconds."""

    # ------------------------------------------------------------------------------------------ the calls
    def generate(self, chunks: list[list[PromptSample]], validate: bool = False) -> list[RolloutBatch]:
        """Rank i samples responses for ``chunks[i]`` (its engine awake); a training rollout stays on the worker."""
        return self.call("validation rollout" if validate else "rollout", "generate", [(c, validate) for c in chunks])

    def start_generate(self, chunks: list[list[PromptSample]], seed: int) -> Pending:
        """The rollout pool (``hybrid_engine=False``): rank i starts sampling ``chunks[i]`` from ``seed``; the
        batches come back to the driver (``result()``)."""
        return self.submit("rollout", "generate", [(c, False, seed) for c in chunks])

    def stream_add(self, items: list[list[Any]], version: int) -> Pending:
        """The rollout pool (``async_training.mode=fully_async``): rank i starts generating ``items[i]`` (prompt
        groups, ``vlmrl.rollout.stream.StreamItem``) with its weights (``version`` updates)."""
        return self.submit("rollout", "stream_add", [(it, version) for it in items])

    def stream_step(self, steps: int) -> Pending:
        """The rollout pool: every rank runs up to ``steps`` engine steps; per rank (finished groups, samples left)."""
        return self.submit("rollout", "stream_step", [(steps,)] * self.world)

    def stream_interrupt(self) -> list[int]:
        """The rollout pool: every rank stops its streamed samples where they are (samples stopped per rank)."""
        return self.call("rollout interruption", "stream_interrupt", [()] * self.world)

    def stream_resume(self, version: int) -> list[int]:
        """The rollout pool: every rank continues its stopped samples with its weights now (``version``)."""
        return self.call("rollout", "stream_resume", [(version,)] * self.world)

    def weight_meta(self) -> list[Any]:
        """The training pool: the tensors a weight sync sends (rank 0's list; every rank gathers)."""
        return self.call("weight sync set-up", "weight_meta", [()] * self.world)[0]

    def join_sync(self, init: str, meta: list[Any], world: int) -> Pending:
        """Start joining the weight-sync group of ``world`` members (a rendezvous of both pools: wait for both)."""
        return self.submit("weight sync set-up", "join_sync", [(init, meta, world)] * self.world)

    def send_weights(self) -> Pending:
        """The training pool starts broadcasting its weights ((seconds, bytes) per rank)."""
        return self.submit("weight sync", "send_weights", [()] * self.world)

    def receive_weights(self) -> Pending:
        """The rollout pool starts receiving weights into its engines (seconds per rank)."""
        return self.submit("weight sync", "receive_weights", [()] * self.world)

    def score_rewards(self, args: list[tuple]) -> list[Any]:
        """Each worker's discriminative reward model on its share ``(prompts, rollout, n_micro)``: per worker
        ``(scores | None, error | None, truncated)``."""
        return self.call("reward model", "score_rewards", args)

    def sleep_engines(self) -> list[float]:
        """Every engine gives its device memory to the update (GPU: KV cache freed, weights offloaded); seconds."""
        return self.call("engine sleep", "sleep_engine", [()] * self.world)

    def prepare(self, shards: list[TrainShard], need_old: bool, need_pi2: bool = False) -> list[PreparedShard]:
        """Rank i computes ``shards[i]``'s old (``need_old``) and reference log-probs, the critic's values and (with
        ``need_pi2``) the policy's sum of squared token probabilities, and keeps the shard's inputs for its update."""
        return self.call("log-probs and values", "prepare", [(s, need_old, need_pi2) for s in shards])

    def update(self, shards: list[TrainShard]) -> list[dict[str, float]]:
        """Rank i computes old/ref log-probs and updates the policy on exactly ``shards[i]``; its metrics."""
        return self.call("update", "update", [(s,) for s in shards])

    def push_weights(self) -> list[dict[str, float]]:
        """Every rank pushes the policy's weights into its engine (waking it); per rank, the seconds it spent producing
        the weights (``{"gather": s}``, empty without an engine: ``HybridWorker.push_weights``)."""
        return self.call("weight push", "push_weights", [()] * self.world)

    def save_checkpoint(self, folder: str) -> list[float]:
        """Every rank writes its shard of the checkpoint into ``folder``."""
        return self.call("checkpoint save", "save_checkpoint", [(folder,)] * self.world)

    def load_checkpoint(self, folder: str) -> list[float]:
        """Every rank restores its shard from ``folder`` and pushes the weights into its engine."""
        return self.call("checkpoint load", "load_checkpoint", [(folder,)] * self.world)
