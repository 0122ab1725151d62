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
from dataclasses import dataclass
from typing import Any

from vlmrl.batch import PromptSample, RolloutBatch, TrainShard
from vlmrl.config import VLMRLConfig


class WorkerError(RuntimeError):
    """A worker failed, died or stopped answering; the message names its rank and the stage. A worker that failed
    while starting carries ``failure``: what it was doing, the cause and what to check."""

    def __init__(self, message: str, failure: StartupFailure | None = None) -> None:
        super().__init__(message)
        self.failure = failure


@dataclass
class StartupFailure:
    """Why a worker could not start, as plain text that crosses a pipe or Ray: ``what`` failed (``worker 0 could not
    load the model from X``), its ``cause`` (one line: ``SafetensorError: ...``), the ``hint`` (what to check) and
    ``details`` (the worker's full traceback, for the log file)."""

    what: str
    cause: str
    hint: str = ""
    details: str = ""


MAX_CAUSE = 500
"""Characters of an error message kept in a one-line summary."""


def one_line(text: str, limit: int = MAX_CAUSE) -> str:
    """``text`` as one line: a traceback that follows the message is cut, whitespace runs become one space, and the
    rest is cut at ``limit`` characters."""
    kept = []
    for line in str(text).splitlines():
        if line.startswith(("Traceback (most recent call last)", "  File ")):
            break
        kept.append(line)
    flat = " ".join(" ".join(kept).split())
    return flat if len(flat) <= limit else flat[: limit - 3].rstrip() + "..."


def error_text(e: BaseException) -> str:
    """``Type: message`` of an exception, on one line (a SyntaxError keeps its file and line)."""
    return one_line(f"{type(e).__name__}: {e}")


# (where the failing call went: a path fragment or a function name, what failed, what to check); ``{path}`` is the
# model, ``{tools}`` the tool config file. The first rule that matches a frame below the worker's __init__ (from the
# outermost frame in) names the step that failed.
WORKER_STEPS: tuple[tuple[str, str, str], ...] = (
    ("init_process_group", "could not join the workers' process group",
     "another process may hold the rendezvous, or a firewall separates the nodes (README, GPUs and clusters)"),
    ("vlmrl/rollout/vllm", "could not start the vLLM engine for {path}",
     "check actor_rollout_ref.rollout's engine settings (max_model_len, gpu_memory_utilization, engine_kwargs.vllm) "
     "against the model and this machine, or use actor_rollout_ref.rollout.name=hf"),
    ("vlmrl/rollout/hf", "could not start the HF rollout", "check actor_rollout_ref.model.path"),
    ("vlmrl/workers/policy", "could not load the model from {path}",
     "check actor_rollout_ref.model.path (a complete Qwen2.5-VL folder or hub id: config.json and every "
     "*.safetensors file it lists)"),
    ("vlmrl/tools/", "could not load the tools of {tools}",
     "fix the tool file it names, or actor_rollout_ref.rollout.multi_turn.tool_config_path"),
    ("transformers/", "could not load the model's processor from {path}", "check actor_rollout_ref.model.path"),
)  # fmt: skip


def step_of(frames: list[Any], rules: tuple[tuple[str, str, str], ...]) -> tuple[str, str] | None:
    """(what, hint) of the first rule matching one of ``frames`` (``traceback.FrameSummary``, outermost first) by
    file path or function name; None when none does."""
    for rule, what, hint in rules:
        for f in frames:
            if rule in f.filename.replace(os.sep, "/") or rule == f.name:
                return what, hint
    return None


def frames_below(e: BaseException, code: Any) -> list[Any]:
    """The frames of ``e``'s traceback below the last one running ``code`` (a function's ``__code__``), outermost
    first, as ``traceback.FrameSummary``; every frame when none runs it."""
    import traceback

    tbs = []
    tb = e.__traceback__
    while tb is not None:
        tbs.append(tb)
        tb = tb.tb_next
    at = [i for i, t in enumerate(tbs) if t.tb_frame.f_code is code]
    below = tbs[at[-1] + 1 :] if at else tbs
    return list(traceback.StackSummary.extract((t.tb_frame, t.tb_lineno) for t in below))


def startup_failure(e: BaseException, cfg: VLMRLConfig, rank: int) -> StartupFailure:
    """Describe an exception raised while worker ``rank`` was starting (building its ``HybridWorker``)."""
    import traceback

    from vlmrl.workers.hybrid import HybridWorker

    arr = cfg.actor_rollout_ref
    step = step_of(frames_below(e, HybridWorker.__init__.__code__), WORKER_STEPS)
    what, hint = step or ("could not start", "")
    names = {"path": arr.model.path, "tools": arr.rollout.multi_turn.tool_config_path}
    return StartupFailure(
        what=f"worker {rank} " + what.format(**names),
        cause=error_text(e),
        hint=hint,
        details="".join(traceback.format_exception(type(e), e, e.__traceback__)),
    )


def worker_env(device: str) -> dict[str, str]:
    """Environment every worker process starts with."""
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
        )
    for k in ("VLMRL_CACHE", "HF_HOME", "HF_HUB_OFFLINE", "PYTHONPATH", "VLMRL_USER_DIRS"):
        if k in os.environ:
            env[k] = os.environ[k]
    return env


class WorkerGroup(ABC):
    """The run's hybrid workers. ``call`` runs a method on every worker (results in rank order); the typed methods
    below are the calls the trainer makes."""

    world: int
    """Number of workers."""
    device: str
    """cpu or cuda."""
    infos: list[dict[str, Any]]
    """Per worker: rank, device, pid, node, start-up seconds."""
    startup_s: float
    """Seconds from launch until every worker was ready."""

    @abstractmethod
    def call(self, stage: str, method: str, args: list[tuple]) -> list[Any]:
        """``method(*args[i])`` on worker i; results in rank order. The first failure raises ``WorkerError``."""

    @abstractmethod
    def shutdown(self, grace_s: float = 10.0) -> None:
        """End the workers (only what this group started), forcibly after ``grace_s`` seconds."""

    # ------------------------------------------------------------------------------------------ the calls
    def generate(self, chunks: list[list[PromptSample]], validate: bool = False) -> list[RolloutBatch]:
        """Rank i samples responses for ``chunks[i]``."""
        return self.call("validation rollout" if validate else "rollout", "generate", [(c, validate) for c in chunks])

    def train(self, shards: list[TrainShard]) -> list[dict[str, float]]:
        """Rank i updates the policy on exactly ``shards[i]``, then pushes the new weights into its engine."""
        return self.call("update", "train", [(s,) for s in shards])

    def save_checkpoint(self, folder: str) -> list[float]:
        """Every rank writes its shard of the checkpoint into ``folder``."""
        return self.call("checkpoint save", "save_checkpoint", [(folder,)] * self.world)

    def load_checkpoint(self, folder: str) -> list[float]:
        """Every rank restores its shard from ``folder`` and pushes the weights into its engine."""
        return self.call("checkpoint load", "load_checkpoint", [(folder,)] * self.world)


LAUNCHERS = ("auto", "local", "ray", "inline")
"""Values of ``trainer.launcher``."""


def launcher_of(cfg: VLMRLConfig) -> str:
    """The launcher a config asks for: ``auto`` is ray when a cluster address is given or the run spans several
    machines (``trainer.nnodes`` > 1: it joins the cluster this machine is part of, as verl's ``ray.init()`` does),
    else local."""
    if cfg.trainer.launcher != "auto":
        return cfg.trainer.launcher
    return "ray" if (ray_address(cfg) or cfg.trainer.nnodes > 1) else "local"


def ray_address(cfg: VLMRLConfig) -> str | None:
    """The cluster to join: ``trainer.ray_address``, else ``RAY_ADDRESS``, else ``auto`` when the run spans several
    machines (the cluster this machine joined with ``ray start``); None = start a private one-machine cluster."""
    return cfg.trainer.ray_address or os.environ.get("RAY_ADDRESS") or ("auto" if cfg.trainer.nnodes > 1 else None)


def make_worker_group(cfg: VLMRLConfig, total_steps: int, limit_images: int, limit_videos: int = 0) -> WorkerGroup:
    """The worker group the config asks for (``trainer.launcher``); the limits are the most images and videos a
    prompt of the data holds (the engine reserves room for them)."""
    kind = launcher_of(cfg)
    if kind == "ray":
        from vlmrl.workers.launch_ray import RayWorkerGroup

        return RayWorkerGroup(cfg, total_steps, limit_images, limit_videos)
    from vlmrl.workers.launch_local import InlineWorkerGroup, ProcessWorkerGroup

    if kind == "inline":
        return InlineWorkerGroup(cfg, total_steps, limit_images, limit_videos)
    return ProcessWorkerGroup(cfg, total_steps, limit_images, limit_videos)
