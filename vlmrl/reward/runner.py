"""Running a scorer over a batch with a per-call timeout: in the driver (``InlineRunner``) or in worker processes.

``reward.num_workers = 0`` -> :class:`InlineRunner`: calls run in the calling thread (the driver's), so reward code
can use ``signal`` (math-verify's own timeouts do) and a debugger, and a fast function costs only the call itself.
A watchdog thread enforces ``timeout_s``: when a call overruns it raises :class:`RewardTimeout` inside the calling
thread (``PyThreadState_SetAsyncExc``; re-raised every second if swallowed). That stops anything running Python
code: loops, sympy, pure-Python parsing. It cannot stop a call blocked inside C code (a socket read without a
timeout, ``time.sleep``, a catastrophic ``re`` backtrack): the watchdog logs that the call is stuck, and rewards that
do I/O should run with ``num_workers >= 1``.

``reward.num_workers = N >= 1`` -> :class:`ProcessPool`: N processes (``forkserver``: forked from a clean server
that preloaded this module, so starting or replacing a worker is cheap and never forks the driver's threads; the
driver's ``__main__`` is not re-imported in them). Each
worker builds the scorer once from the picklable spec. The batch is cut into contiguous chunks (about four per
worker; one message per chunk, samples of one prompt share pickled images inside it); each worker reports each
sample's result as it finishes, which tells the driver which sample is running. A sample running past
``timeout_s`` gets a timeout outcome; its worker is killed (SIGKILL) and replaced, and the rest of its chunk is
requeued. A worker that dies (segfault, ``os._exit``, OOM kill) costs only the sample it was running.
"""

from __future__ import annotations

import collections
import ctypes
import io
import logging
import math
import multiprocessing as mp
import multiprocessing.context
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing import forkserver as mp_forkserver
from multiprocessing import popen_forkserver
from multiprocessing import spawn as mp_spawn
from multiprocessing import util as mp_util
from multiprocessing.connection import Connection, wait
from multiprocessing.context import reduction, set_spawning_popen
from typing import Any

from vlmrl.reward.loading import (
    EXCEPTION,
    TIMEOUT,
    Outcome,
    RewardConfigError,
    error_outcome,
    evaluate,
    outcome_of,
)

log = logging.getLogger("vlmrl.reward")

WORKER_START_TIMEOUT_S = 300.0
"""How long a worker may take to import and build the reward function before the step fails."""


class RewardTimeout(BaseException):  # noqa: N818 - reads as what happened
    """Raised inside an in-process reward call that ran past ``reward.timeout_s``.

    A BaseException (like KeyboardInterrupt), so ``except Exception`` in reward code does not swallow it.
    """


class RewardWorkerError(RuntimeError):
    """The worker pool cannot go on (a worker failed to start)."""


def _timeout_outcome(timeout_s: float, where: str) -> Outcome:
    return Outcome(None, {}, TIMEOUT, f"reward call ran past timeout_s={timeout_s:g}s ({where})")


def _async_raise(thread_id: int, exc_type: type[BaseException]) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(exc_type))


def _noop() -> None:
    """A Python-level call: an interrupt injected before it is delivered on entry (drains a late one)."""


class InlineRunner:
    """Scores in the calling thread; a watchdog thread interrupts a call that runs past the timeout."""

    def __init__(self, scorer: Callable[[Any], Any], timeout_s: float) -> None:
        self.scorer = scorer
        self.timeout_s = float(timeout_s)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._token: tuple[int, float] | None = None  # (serial, deadline) of the running call
        self._fired = -1  # serial of the last call interrupted
        self._serial = 0
        self._tid = 0
        self._closed = False
        self._thread: threading.Thread | None = None

    def _start(self) -> None:
        if self._thread is None and self.timeout_s > 0 and math.isfinite(self.timeout_s):
            self._thread = threading.Thread(target=self._watch, name="vlmrl-reward-watchdog", daemon=True)
            self._thread.start()

    def _watch(self) -> None:
        last_fire = 0.0
        warned = -1
        while not self._closed:
            self._wake.clear()
            tok = self._token
            if tok is None:
                self._wake.wait()
                continue
            serial, deadline = tok
            now = time.monotonic()
            if now < deadline:
                self._wake.wait(min(deadline - now, 0.1))
                continue
            with self._lock:
                if self._token is tok and (self._fired != serial or now - last_fire > 1.0):
                    self._fired = serial
                    last_fire = now
                    _async_raise(self._tid, RewardTimeout)
            if now - deadline > max(5.0, self.timeout_s) and warned != serial:
                warned = serial
                log.warning(
                    "reward call still running %.0fs past timeout_s=%gs although interrupted: it is blocked in C code "
                    "(I/O, sleep, regex) that an in-process timeout cannot stop; use reward.num_workers>=1",
                    now - deadline,
                    self.timeout_s,
                )
            self._wake.wait(0.1)

    def _call(self, sample: Any) -> Outcome:
        self._serial += 1
        serial = self._serial
        raw: Any = None
        exc: BaseException | None = None
        timed_out = False
        try:
            with self._lock:
                self._token = (serial, time.monotonic() + self.timeout_s)
            self._wake.set()
            raw = self.scorer(sample)
        except RewardTimeout:
            timed_out = True
        except Exception as e:  # noqa: BLE001 - isolation is the point; no calls in this handler (see below)
            exc = e
        # Disarm inline (a call to a helper would be a delivery point outside any try): once the token is cleared
        # under the lock no new interrupt can be sent; one sent just before is still pending and is delivered at the
        # next Python-level call, _noop(), inside this try.
        while True:
            try:
                with self._lock:
                    self._token = None
                _noop()
                break
            except RewardTimeout:  # late: the call itself had finished, so its own result stands
                continue
        if timed_out:
            return _timeout_outcome(self.timeout_s, "interrupted in-process")
        if exc is not None:
            return error_outcome(exc)
        return outcome_of(raw)

    def run(self, samples: list[Any]) -> list[Outcome]:
        """Score ``samples`` in order; every outcome is a result or an error, never an exception."""
        self._tid = threading.get_ident()
        self._start()
        if self._thread is None:
            return [evaluate(self.scorer, s) for s in samples]
        return [self._call(s) for s in samples]

    def close(self) -> None:
        """Stop the watchdog thread."""
        self._closed = True
        self._wake.set()


# --------------------------------------------------------------------------------------------------- worker pool


def _worker_main(conn: Connection, spec: dict[str, Any], sys_path: list[str], cwd: str, threads: int) -> None:
    """Entry point of a worker process: build the scorer, then score chunks until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle; it closes the pool
    for p in sys_path:
        if p not in sys.path:
            sys.path.append(p)
    try:
        os.chdir(cwd)
    except OSError:
        pass
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)
    from vlmrl.reward.composite import build_scorer

    try:
        scorer = build_scorer(spec)
    except BaseException as e:  # noqa: BLE001 - reported to the driver, which raises
        conn.send(("build_error", f"{type(e).__name__}: {e}", isinstance(e, RewardConfigError)))
        return
    conn.send(("ready",))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return  # the driver went away
        if msg[0] == "stop":
            return
        for idx, sample in msg[1]:
            conn.send(("r", idx, evaluate(scorer, sample)))


class _WorkerPopen(popen_forkserver.Popen):
    """forkserver's Popen, minus re-running the driver's ``__main__`` in the worker.

    spawn and forkserver children normally re-import the parent's main module (so functions pickled from it
    resolve). Reward workers never unpickle anything from ``__main__`` (they rebuild the scorer from its spec), and
    re-importing it would cost every worker the driver's imports and break scripts without a ``__main__`` guard.
    This is CPython 3.11's ``popen_forkserver.Popen._launch`` with those two preparation entries dropped.
    """

    def _launch(self, process_obj: Any) -> None:
        prep_data = mp_spawn.get_preparation_data(process_obj._name)
        prep_data.pop("init_main_from_name", None)
        prep_data.pop("init_main_from_path", None)
        buf = io.BytesIO()
        set_spawning_popen(self)
        try:
            reduction.dump(prep_data, buf)
            reduction.dump(process_obj, buf)
        finally:
            set_spawning_popen(None)
        self.sentinel, w = mp_forkserver.connect_to_new_process(self._fds)
        parent_w = os.dup(w)  # the child watches it to notice the parent is gone
        self.finalizer = mp_util.Finalize(self, mp_util.close_fds, (parent_w, self.sentinel))
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        self.pid = mp_forkserver.read_signed(self.sentinel)


class _WorkerProcess(mp.context.ForkServerProcess):
    @staticmethod
    def _Popen(process_obj: Any) -> _WorkerPopen:  # noqa: N802 - multiprocessing's name
        return _WorkerPopen(process_obj)


@dataclass
class _Worker:
    proc: Any
    conn: Connection
    started_at: float
    ready: bool = False
    pending: collections.deque[int] = field(default_factory=collections.deque)
    since: float = 0.0  # when the sample at pending[0] started (as far as the driver can tell)


class ProcessPool:
    """``num_workers`` reward processes with per-sample timeouts, kill-and-replace, and order-preserving results."""

    def __init__(self, spec: dict[str, Any], num_workers: int, timeout_s: float, chunks_per_worker: int = 4) -> None:
        if num_workers < 1:
            raise ValueError("ProcessPool needs num_workers >= 1")
        self.spec = spec
        self.num_workers = int(num_workers)
        self.timeout_s = float(timeout_s) if timeout_s and timeout_s > 0 else math.inf
        self.chunks_per_worker = chunks_per_worker
        self.replaced = 0
        self._ctx = mp.get_context("forkserver")
        try:
            self._ctx.set_forkserver_preload(["vlmrl.batch", "vlmrl.reward.runner"])
        except (AttributeError, ValueError):  # pragma: no cover - older Pythons
            pass
        self._threads = max(1, (os.cpu_count() or 1) // self.num_workers)
        self._workers: list[_Worker] = [self._spawn() for _ in range(self.num_workers)]

    def _spawn(self) -> _Worker:
        parent, child = mp.Pipe(duplex=True)
        proc = _WorkerProcess(
            target=_worker_main,
            args=(child, self.spec, list(sys.path), os.getcwd(), self._threads),
            name="vlmrl-reward-worker",
            daemon=True,
        )
        proc.start()
        child.close()
        return _Worker(proc=proc, conn=parent, started_at=time.monotonic())

    def _kill(self, w: _Worker) -> None:
        try:
            w.proc.kill()
            w.proc.join(timeout=5)
        except (OSError, ValueError):
            pass
        w.conn.close()

    def _replace(self, w: _Worker) -> _Worker:
        self._kill(w)
        self.replaced += 1
        new = self._spawn()
        self._workers[self._workers.index(w)] = new
        return new

    def run(self, samples: list[Any]) -> list[Outcome]:
        """Score ``samples`` across the workers; results come back in input order."""
        n = len(samples)
        results: list[Outcome | None] = [None] * n
        if n == 0:
            return []
        size = max(1, math.ceil(n / (self.num_workers * self.chunks_per_worker)))
        queue: collections.deque[list[int]] = collections.deque(
            list(range(i, min(i + size, n))) for i in range(0, n, size)
        )
        done = 0
        while done < n:
            now = time.monotonic()
            for w in list(self._workers):
                if w.ready and not w.pending and queue:
                    self._send(w, queue, samples)
            deadline = math.inf
            for w in self._workers:
                if not w.ready:
                    deadline = min(deadline, w.started_at + WORKER_START_TIMEOUT_S)
                elif w.pending:
                    deadline = min(deadline, w.since + self.timeout_s)
            conns = [w.conn for w in self._workers if not w.ready or w.pending]
            wait_s = None if deadline == math.inf else max(0.0, deadline - now)
            for conn in wait(conns, timeout=wait_s):
                w = next(x for x in self._workers if x.conn is conn)
                done += self._receive(w, results, queue)
            now = time.monotonic()
            for w in list(self._workers):
                if not w.ready and now - w.started_at > WORKER_START_TIMEOUT_S:
                    self.close()
                    raise RewardWorkerError(f"a reward worker did not start within {WORKER_START_TIMEOUT_S:g}s")
                if w.ready and w.pending and now - w.since > self.timeout_s:
                    idx = w.pending.popleft()
                    results[idx] = _timeout_outcome(self.timeout_s, "worker process killed and replaced")
                    done += 1
                    if w.pending:
                        queue.appendleft(list(w.pending))
                    self._replace(w)
        return results  # type: ignore[return-value]

    def _send(self, w: _Worker, queue: collections.deque[list[int]], samples: list[Any]) -> None:
        if not w.proc.is_alive():  # died while idle (e.g. killed by the OOM killer between steps)
            self._replace(w)
            return
        chunk = queue.popleft()
        try:
            w.conn.send(("chunk", [(i, samples[i]) for i in chunk]))
        except (BrokenPipeError, OSError):  # died just now: nothing of this chunk ran, so requeue all of it
            queue.appendleft(chunk)
            self._replace(w)
            return
        w.pending.extend(chunk)
        w.since = time.monotonic()

    def _receive(self, w: _Worker, results: list[Outcome | None], queue: collections.deque[list[int]]) -> int:
        try:
            msg = w.conn.recv()
        except (EOFError, OSError):
            return self._on_death(w, results, queue)
        kind = msg[0]
        if kind == "ready":
            w.ready = True
            w.since = time.monotonic()
            return 0
        if kind == "build_error":
            self.close()
            if msg[2]:
                raise RewardConfigError(msg[1])
            raise RewardWorkerError(f"a reward worker could not build the reward function: {msg[1]}")
        idx = w.pending.popleft()
        assert idx == msg[1], f"worker reported sample {msg[1]}, expected {idx}"
        results[idx] = msg[2]
        w.since = time.monotonic()
        return 1

    def _on_death(self, w: _Worker, results: list[Outcome | None], queue: collections.deque[list[int]]) -> int:
        w.proc.join(timeout=5)
        code = w.proc.exitcode
        if not w.ready:
            self.close()
            raise RewardWorkerError(f"a reward worker exited while starting (exit code {code})")
        got = 0
        if w.pending:
            idx = w.pending.popleft()
            results[idx] = Outcome(None, {}, EXCEPTION, f"reward worker process died (exit code {code})")
            got = 1
            if w.pending:
                queue.appendleft(list(w.pending))
        self._replace(w)
        return got

    def close(self) -> None:
        """Stop every worker (politely, then by force)."""
        for w in self._workers:
            try:
                w.conn.send(("stop",))
            except (OSError, ValueError):
                pass
        end = time.monotonic() + 2.0
        for w in self._workers:
            w.proc.join(timeout=max(0.0, end - time.monotonic()))
            if w.proc.is_alive():
                w.proc.kill()
                w.proc.join(timeout=2)
            w.conn.close()
        self._workers = []
