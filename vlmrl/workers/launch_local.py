"""Workers on this machine: one process each (``ProcessWorkerGroup``), or one in the driver (``InlineWorkerGroup``).

Each process is named ``vlmrl-worker-<rank>`` and ended by the kernel if the process that started it dies
(``PR_SET_PDEATHSIG``). CPU workers are forked from the driver's forkserver (:func:`start_forkserver`: it imports torch,
transformers and vLLM once, in the background, and ends with the driver), so a worker starts with its imports done; GPU
workers are spawned (a fresh interpreter each: CUDA does not survive a fork). Commands and results travel over pipes;
the process group meets through a file in a private temporary folder, and gloo binds to the loopback interface: no
socket of a local run listens on a network interface. This module imports no torch at its top, so a worker sets its
environment (threads, visible GPU) before torch loads."""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import signal
import tempfile
import time
import traceback
from multiprocessing.connection import Connection, wait
from typing import Any

from vlmrl.config import VLMRLConfig
from vlmrl.config.plan import WorkerPlan
from vlmrl.procs import die_with_parent
from vlmrl.startup import StartupFailure, failure_of
from vlmrl.timing import Timer
from vlmrl.workers.group import Pending, WorkerError, WorkerGroup, worker_env

WORKER_PRELOAD = "vlmrl.workers.preload"
"""The module the forkserver imports for the CPU workers: it imports :data:`WORKER_MODULES`."""
WORKER_MODULES = (
    "torch",
    "vlmrl.workers.hybrid",
    "vlmrl.models.inputs",
    "transformers.image_processing_utils",
    "transformers.processing_utils",
)
"""What a local CPU worker imports before its model is built, in the order it would."""
VLLM_MODULES = (
    "vlmrl.rollout.vllm",
    "vllm",
    "vllm.entrypoints.llm",
    "vllm.v1.engine.llm_engine",
    "vllm.v1.executor.uniproc_executor",
    "vllm.v1.worker.cpu_worker",
    "vllm.v1.worker.cpu_model_runner",
)
"""... and before its vLLM engine is built (``actor_rollout_ref.rollout.name=vllm``)."""
PRELOAD_VLLM = "VLMRL_PRELOAD_VLLM"
"""Set to 1 in the forkserver's environment: it imports :data:`VLLM_MODULES` too."""


def start_forkserver(vllm: bool, also: tuple[str, ...] = ()) -> None:
    """Start this process's forkserver now, if none runs yet, with the CPU workers' imports (``vlmrl.workers.
    preload``) besides the supervised pools' (``vlmrl.supervise.PRELOAD``) and the modules in ``also``: it imports
    them in the background while the caller goes on, and the workers, the reward and the tool workers forked from it
    start with them done (``vllm``: vLLM's too, for a run whose rollout is vLLM's; else vLLM stays out of the run's
    processes). The forkserver's environment is the workers' (``worker_env``: one thread, vLLM's CPU settings) from
    its start, since the libraries read some of it at import. A process has one forkserver: where one runs already
    (a pool started it), its preload stays and the workers import what it lacks themselves."""
    from multiprocessing import forkserver

    from vlmrl.procs import FORKSERVER_PARENT
    from vlmrl.supervise import PRELOAD

    preload = [*PRELOAD, "vlmrl.config.command", *also, WORKER_PRELOAD]
    mp.get_context("forkserver").set_forkserver_preload(list(dict.fromkeys(preload)))
    env = {
        **worker_env("cpu"),
        "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
        FORKSERVER_PARENT: str(os.getpid()),
        PRELOAD_VLLM: "1" if vllm else "0",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        forkserver.ensure_running()  # from this thread: a parent-death signal follows the thread that forked
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        os.environ[FORKSERVER_PARENT] = str(os.getpid())  # the pools' guard reads it where they start the server


def _worker_main(conn: Connection, rank: int, init_method: str, plan: WorkerPlan, env: dict[str, str]) -> None:
    """A worker process: build the HybridWorker, then run the driver's calls until told to stop. ``env`` is the whole
    environment the worker runs in (the driver's when it started the worker, with ``worker_env``'s): a worker forked
    from the forkserver would otherwise have the forkserver's."""
    try:  # before the environment changes: setproctitle finds the argv area after the first environment variable
        import setproctitle

        setproctitle.setproctitle(f"vlmrl-{'rollout' if plan.role == 'rollout' else 'worker'}-{rank}")
    except ImportError:
        pass
    die_with_parent()
    os.environ.clear()
    os.environ.update(env)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's: it ends the workers
    try:
        from vlmrl.workers.hybrid import HybridWorker

        worker = HybridWorker(plan, rank, init_method)
        conn.send(("ok", worker.info()))
    except BaseException as e:  # noqa: BLE001 - reported to the driver, which stops the run
        who = "rollout worker" if plan.role == "rollout" else "worker"
        conn.send(("error", failure_of(e, f"{who} {rank} could not start")))
        return
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return  # the driver is gone
        if msg[0] == "stop":
            break
        _, method, args = msg
        try:
            result = getattr(worker, method)(*args)
        except BaseException as e:  # noqa: BLE001
            conn.send(("error", _describe(e)))
            continue
        conn.send(("ok", result))
    worker.shutdown()


def _describe(e: BaseException) -> str:
    """The exception and the last frames of its traceback, as the driver reports a worker's failure."""
    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__)[-8:])
    return f"{type(e).__name__}: {e}\n{tb}".rstrip()


def _exit_text(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class ProcessWorkerGroup(WorkerGroup):
    """One worker process per CPU worker (``trainer.cpu_workers``) or per GPU of this machine
    (``trainer.n_gpus_per_node``, ``CUDA_VISIBLE_DEVICES`` set per worker)."""

    def __init__(self, cfg: VLMRLConfig, plan: WorkerPlan, first_gpu: int = 0) -> None:
        """Start ``plan.world`` worker processes on this machine (``trainer.worker_startup_timeout_s`` bounds their
        start-up, ``trainer.worker_timeout_s`` each call); on GPU, worker r gets visible GPU ``first_gpu`` + r."""
        self.device, self.world = plan.device, plan.world
        self.role = plan.role
        self.timeout_s = float(cfg.trainer.worker_timeout_s)
        startup_timeout_s = float(cfg.trainer.worker_startup_timeout_s)
        if self.device == "cuda":
            import torch

            have = torch.cuda.device_count()
            if have < first_gpu + self.world:
                pools = "" if first_gpu == 0 else f" after the training pool's {first_gpu}"
                key = "rollout.n_gpus_per_node" if plan.role == "rollout" else "trainer.n_gpus_per_node"
                raise WorkerError(f"{key}={self.world}{pools} but this machine has {have} CUDA GPU(s) visible")
        self._dir = tempfile.mkdtemp(prefix="vlmrl-rendezvous-")
        init_method = f"file://{self._dir}/store"
        if self.device == "cpu":
            start_forkserver(vllm=plan.arr.rollout.name == "vllm" and plan.role != "actor")
        ctx = mp.get_context("forkserver" if self.device == "cpu" else "spawn")
        self.conns: list[Connection] = []
        self.procs: list[Any] = []
        self._pending: Pending | None = None
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        gpus = visible.split(",") if visible else [str(i) for i in range(first_gpu + self.world)]
        gpus = gpus[first_gpu:]
        sw = Timer.start()
        for rank in range(self.world):
            # collectives' sockets on loopback: gloo (CPU) and NCCL's bootstrap (GPU)
            env = {
                **os.environ,
                **worker_env(self.device),
                "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
            }
            if self.device == "cuda":
                env["CUDA_VISIBLE_DEVICES"] = gpus[rank]
                env["NCCL_SOCKET_IFNAME"] = os.environ.get("NCCL_SOCKET_IFNAME", "lo")
            parent, child = ctx.Pipe(duplex=True)
            name = f"vlmrl-{'rollout' if plan.role == 'rollout' else 'worker'}-{rank}"
            proc = ctx.Process(target=_worker_main, args=(child, rank, init_method, plan, env), name=name)
            proc.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)
        try:
            self.infos = self._collect("startup", startup_timeout_s)
        except BaseException:
            self.shutdown(grace_s=1.0)
            raise
        self.startup_s = sw.elapsed

    def submit(self, stage: str, method: str, args: list[tuple]) -> Pending:
        """Send ``method(*args[i])`` to worker i; ``result()`` collects the answers in rank order. A worker that
        raises, dies or does not answer within ``trainer.worker_timeout_s`` (counted from now) raises
        ``WorkerError`` naming it and the stage."""
        if self._pending is not None and not self._pending.waited:
            raise RuntimeError(f"{self.name}: {method} sent while the previous call's answers are not collected")
        for rank, (conn, a) in enumerate(zip(self.conns, args)):
            try:
                conn.send(("call", method, a))
            except (BrokenPipeError, OSError):
                self.procs[rank].join(timeout=5)
                code = _exit_text(self.procs[rank].exitcode)
                raise WorkerError(f"{self._who(rank)} died during {stage} ({code})") from None
        deadline = time.monotonic() + self.timeout_s
        self._pending = Pending(lambda: self._collect(stage, self.timeout_s, deadline))
        return self._pending

    def dead_worker_error(self, stage: str, grace_s: float = 2.0) -> WorkerError | None:
        """The error naming the first worker process of this group that has ended, waiting up to ``grace_s`` for
        one to end (None: all alive). A process killed by a signal closes its sockets before its exit can be
        collected, so a peer's broken collective is often seen first; the grace lets the death be the one named."""
        ended = set(wait([p.sentinel for p in self.procs], timeout=grace_s))
        for rank, proc in enumerate(self.procs):
            # (a sentinel is ready when the process's files close, a moment before its exit can be collected)
            if proc.sentinel in ended or not proc.is_alive():
                return self._died(rank, stage)
        return None

    def sync_rendezvous(self) -> str:
        """Where the weight-sync group of two pools meets: a file in this group's private temporary folder."""
        return f"file://{self._dir}/weight-sync"

    @property
    def name(self) -> str:
        """How messages name this group's workers: worker (hybrid, training pool) or rollout worker."""
        return "rollout worker" if self.role == "rollout" else "worker"

    def _who(self, rank: int | list[int]) -> str:
        return f"{self.name}{'(s)' if isinstance(rank, list) else ''} {rank}"

    def _collect(self, stage: str, timeout_s: float, deadline: float | None = None) -> list[Any]:
        results: list[Any] = [None] * self.world
        pending = set(range(self.world))
        deadline = time.monotonic() + timeout_s if deadline is None else deadline
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                ranks = sorted(pending)
                key = "worker_startup_timeout_s" if stage == "startup" else "worker_timeout_s"
                raise WorkerError(
                    f"{self._who(ranks)} did not answer within {timeout_s:.0f} s during {stage} "
                    f"(trainer.{key}): frozen, or waiting in a collective for a worker that is"
                )
            waitables = {self.conns[r]: r for r in pending} | {self.procs[r].sentinel: r for r in pending}
            for obj in wait(list(waitables), timeout=min(left, 5.0)):
                rank = waitables[obj]
                if rank not in pending:
                    continue
                conn = self.conns[rank]
                if obj is not conn and not conn.poll():  # the process ended without a last word
                    raise self._died(rank, stage)
                try:
                    kind, value = conn.recv()
                except (EOFError, OSError):
                    raise self._died(rank, stage) from None
                if kind == "error" and isinstance(value, StartupFailure):
                    raise WorkerError(f"{self._who(rank)} failed during {stage}: {value.cause}", failure=value)
                if kind == "error":
                    raise WorkerError(f"{self._who(rank)} failed during {stage}: {value}")
                results[rank] = value
                pending.discard(rank)
        return results

    def _died(self, rank: int, stage: str) -> WorkerError:
        """The error for worker ``rank``, whose process ended during ``stage`` without a word; while starting, with
        what to check."""
        self.procs[rank].join(timeout=5)
        code = self.procs[rank].exitcode
        message = f"{self._who(rank)} died during {stage} ({_exit_text(code)})"
        if stage != "startup":
            return WorkerError(message)
        hint = "the worker's own output or the system log may say why"
        if code == -signal.SIGKILL:
            hint = (
                "a process killed by SIGKILL while loading is most often out of memory (dmesg says): fewer workers "
                "(trainer.cpu_workers), or a machine with more memory"
            )
        failure = StartupFailure(f"{self._who(rank)} died while starting", _exit_text(code), hint)
        return WorkerError(message, failure=failure)

    def shutdown(self, grace_s: float = 10.0) -> None:
        """Ask the workers to stop, then end any that did not within ``grace_s`` (only the processes this group
        started)."""
        for conn in self.conns:
            try:
                conn.send(("stop",))
            except (BrokenPipeError, OSError):
                pass
        end = time.monotonic() + grace_s
        for proc in self.procs:
            proc.join(timeout=max(0.0, end - time.monotonic()))
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        for conn in self.conns:
            conn.close()
        self.conns, self.procs = [], []
        shutil.rmtree(self._dir, ignore_errors=True)


class InlineWorkerGroup(WorkerGroup):
    """One hybrid worker in the driver's own process (``trainer.launcher=inline``): one device, no second process
    (debugging with breakpoints, a single GPU)."""

    def __init__(self, cfg: VLMRLConfig, plan: WorkerPlan) -> None:
        """Build the one worker here."""
        from vlmrl.workers.hybrid import HybridWorker

        self.device, self.world = plan.device, 1
        for k, v in worker_env(self.device).items():
            os.environ.setdefault(k, v)
        self._dir = tempfile.mkdtemp(prefix="vlmrl-rendezvous-")
        sw = Timer.start()
        try:
            self.worker = HybridWorker(plan, 0, f"file://{self._dir}/store")
        except Exception as e:
            shutil.rmtree(self._dir, ignore_errors=True)
            failure = failure_of(e, "worker 0 could not start")
            raise WorkerError(f"worker 0 failed during startup: {failure.cause}", failure=failure) from e
        self.infos = [self.worker.info()]
        self.startup_s = sw.elapsed

    def submit(self, stage: str, method: str, args: list[tuple]) -> Pending:
        """``method(*args[0])`` on the worker, run now (one process: nothing runs beside it); a failure raises
        ``WorkerError`` naming the stage."""
        try:
            result = [getattr(self.worker, method)(*args[0])]
        except Exception as e:
            raise WorkerError(f"worker 0 failed during {stage}: {type(e).__name__}: {e}") from e
        return Pending(lambda: result)

    def shutdown(self, grace_s: float = 10.0) -> None:
        """Release the worker's process group."""
        self.worker.shutdown()
        shutil.rmtree(self._dir, ignore_errors=True)
