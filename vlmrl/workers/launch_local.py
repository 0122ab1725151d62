"""Workers on this machine: one process each (``ProcessWorkerGroup``), or one in the driver (``InlineWorkerGroup``).

The processes are the driver's children (``spawn``), each named ``vlmrl-worker-<rank>`` and ended by the kernel if the
driver dies (``PR_SET_PDEATHSIG``). Commands and results travel over pipes; the process group meets through a file in
a private temporary folder, and gloo binds to the loopback interface: no socket of a local run listens on a network
interface. This module imports no torch at its top, so a worker sets its environment (threads, visible GPU) before
torch loads.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from multiprocessing.connection import Connection, wait
from typing import Any

from vlmrl.config import VLMRLConfig
from vlmrl.workers.group import StartupFailure, WorkerError, WorkerGroup, error_text, startup_failure, worker_env


def _die_with_parent() -> None:
    """Linux: the kernel sends SIGKILL to this process when the driver exits (even on a kill -9)."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass


def _worker_main(conn: Connection, rank: int, world: int, init_method: str, device: str, cfg: VLMRLConfig,
                 total_steps: int, limit_images: int, limit_videos: int, env: dict[str, str]) -> None:  # fmt: skip
    """A worker process: build the HybridWorker, then run the driver's calls until told to stop."""
    _die_with_parent()
    os.environ.update(env)
    try:
        import setproctitle

        setproctitle.setproctitle(f"vlmrl-worker-{rank}")
    except ImportError:
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's: it ends the workers
    try:
        from vlmrl.workers.hybrid import HybridWorker

        worker = HybridWorker(cfg, rank, world, init_method, device, total_steps, limit_images, limit_videos)
        conn.send(("ok", worker.info()))
    except BaseException as e:  # noqa: BLE001 - reported to the driver, which stops the run
        try:
            failure = startup_failure(e, cfg, rank)
        except BaseException:  # noqa: BLE001 - the report itself failed (HybridWorker does not import): plain text
            failure = StartupFailure(f"worker {rank} could not start", error_text(e), details=_describe(e, 200))
        conn.send(("error", failure))
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


def _describe(e: BaseException, frames: int = 8) -> str:
    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__)[-frames:])
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

    def __init__(self, cfg: VLMRLConfig, total_steps: int, limit_images: int, limit_videos: int = 0) -> None:
        from vlmrl.config.checks import planned_device, planned_world

        self.device = planned_device(cfg)
        self.world = planned_world(cfg)
        self.timeout_s = float(cfg.trainer.worker_timeout_s)
        if self.device == "cuda":
            import torch

            if cfg.trainer.nnodes > 1:
                raise WorkerError(
                    f"trainer.nnodes={cfg.trainer.nnodes}: several machines need a Ray cluster; start one (README, "
                    "GPUs and clusters) and set trainer.ray_address"
                )
            have = torch.cuda.device_count()
            if have < self.world:
                raise WorkerError(
                    f"trainer.n_gpus_per_node={self.world} but this machine has {have} CUDA GPU(s) visible"
                )
        self._dir = tempfile.mkdtemp(prefix="vlmrl-rendezvous-")
        init_method = f"file://{self._dir}/store"
        ctx = mp.get_context("spawn")
        self.conns: list[Connection] = []
        self.procs: list[Any] = []
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        gpus = visible.split(",") if visible else [str(i) for i in range(self.world)]
        t0 = time.perf_counter()
        for rank in range(self.world):
            # collectives' sockets on loopback: gloo (CPU) and NCCL's bootstrap (GPU)
            env = {**worker_env(self.device), "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo")}
            if self.device == "cuda":
                env["CUDA_VISIBLE_DEVICES"] = gpus[rank]
                env["NCCL_SOCKET_IFNAME"] = os.environ.get("NCCL_SOCKET_IFNAME", "lo")
            parent, child = ctx.Pipe(duplex=True)
            limits = (limit_images, limit_videos)
            proc = ctx.Process(
                target=_worker_main,
                args=(child, rank, self.world, init_method, self.device, cfg, total_steps, *limits, env),
                name=f"vlmrl-worker-{rank}",
            )
            proc.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)
        try:
            self.infos = self._collect("startup", self.timeout_s)
        except BaseException:
            self.shutdown(grace_s=1.0)
            raise
        self.startup_s = time.perf_counter() - t0

    def call(self, stage: str, method: str, args: list[tuple]) -> list[Any]:
        """``method(*args[i])`` on worker i; results in rank order. A worker that raises, dies or does not answer
        within ``trainer.worker_timeout_s`` raises ``WorkerError`` naming it and the stage."""
        for rank, (conn, a) in enumerate(zip(self.conns, args)):
            try:
                conn.send(("call", method, a))
            except (BrokenPipeError, OSError):
                self.procs[rank].join(timeout=5)
                code = _exit_text(self.procs[rank].exitcode)
                raise WorkerError(f"worker {rank} died during {stage} ({code})") from None
        return self._collect(stage, self.timeout_s)

    def _collect(self, stage: str, timeout_s: float) -> list[Any]:
        results: list[Any] = [None] * self.world
        pending = set(range(self.world))
        deadline = time.monotonic() + timeout_s
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                ranks = sorted(pending)
                raise WorkerError(
                    f"worker(s) {ranks} did not answer within {timeout_s:.0f} s during {stage} "
                    "(trainer.worker_timeout_s): frozen, or waiting in a collective for a worker that is"
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
                    raise WorkerError(f"worker {rank} failed during {stage}: {value.cause}", failure=value)
                if kind == "error":
                    raise WorkerError(f"worker {rank} failed during {stage}: {value}")
                results[rank] = value
                pending.discard(rank)
        return results

    def _died(self, rank: int, stage: str) -> WorkerError:
        """The error for worker ``rank``, whose process ended during ``stage`` without a word; while starting, with
        what to check."""
        self.procs[rank].join(timeout=5)
        code = self.procs[rank].exitcode
        message = f"worker {rank} died during {stage} ({_exit_text(code)})"
        if stage != "startup":
            return WorkerError(message)
        hint = "the worker's own output or the system log may say why"
        if code == -signal.SIGKILL:
            hint = ("a process killed by SIGKILL while loading is most often out of memory (dmesg says): fewer workers "
                    "(trainer.cpu_workers), or a machine with more memory")  # fmt: skip
        failure = StartupFailure(f"worker {rank} died while starting", _exit_text(code), hint)
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

    def __init__(self, cfg: VLMRLConfig, total_steps: int, limit_images: int, limit_videos: int = 0) -> None:
        from vlmrl.config.checks import planned_device
        from vlmrl.workers.hybrid import HybridWorker

        self.device = planned_device(cfg)
        self.world = 1
        for k, v in worker_env(self.device).items():
            os.environ.setdefault(k, v)
        self._dir = tempfile.mkdtemp(prefix="vlmrl-rendezvous-")
        t0 = time.perf_counter()
        try:
            self.worker = HybridWorker(
                cfg, 0, 1, f"file://{self._dir}/store", self.device, total_steps, limit_images, limit_videos
            )
        except Exception as e:
            shutil.rmtree(self._dir, ignore_errors=True)
            failure = startup_failure(e, cfg, 0)
            raise WorkerError(f"worker 0 failed during startup: {failure.cause}", failure=failure) from e
        self.infos = [self.worker.info()]
        self.startup_s = time.perf_counter() - t0

    def call(self, stage: str, method: str, args: list[tuple]) -> list[Any]:
        """``method(*args[0])`` on the worker; a failure raises ``WorkerError`` naming the stage."""
        try:
            return [getattr(self.worker, method)(*args[0])]
        except Exception as e:
            raise WorkerError(f"worker 0 failed during {stage}: {type(e).__name__}: {e}") from e

    def shutdown(self, grace_s: float = 10.0) -> None:
        """Release the worker's process group."""
        self.worker.shutdown()
        shutil.rmtree(self._dir, ignore_errors=True)
