"""User code run where a timeout can stop it: a pool of worker processes for reward functions and tools.

vlmrl calls code it does not control (reward functions, tools) every step. A thread cannot be stopped, and code that
holds the GIL (sympy grading ``9^{9^{9}}``) stops its timer too; so each call runs in a worker process
(:class:`SupervisedPool`, a ``pebble`` pool started from a clean ``forkserver``): a call still running after its
timeout ends its worker, which the pool replaces; a worker that dies costs only its call.

How much a hanging function may cost a batch (:class:`HangWatch`, one per batch):

- calls run ``num_workers`` at a time, so their timeouts run concurrently, never one after another past that;
- each slot of the pool waits at most one full ``timeout_s`` per batch: once the batch has had ``num_workers``
  timeouts, its later calls get a short timeout, ``max(1 s, 10 x the slowest call that has returned so far)`` (at
  most ``timeout_s``; ``timeout_s`` until any call has returned), so a function that hangs on 1 call in 10 costs about
  one timeout per slot, not one per hung call;
- when the first ``2 x num_workers`` calls of a batch to finish all timed out, the function hangs: the batch stops
  with :class:`HangError` naming the function, the timeout and the count (a caller's own rule can stop it earlier,
  e.g. a failure ratio that can no longer be met).

Fast functions in chunks (``map(..., chunks=True)``, the reward's pool): a task costs a round trip between processes
(~0.2 ms), more than a typical reward call, so once calls have returned, as many as take :data:`CHUNK_TARGET_S` by
the median of the last calls' own times go to the workers as one task (shrinking chunks, as OpenMP's guided
schedule). A chunk runs under a short, speculative timeout (``max(0.1 s, 10 x its calls x that median)``, never over
the call's own): a chunk that runs past it, whose worker dies or whose results cannot cross back is not a failure of
any call: its calls, and those of the tasks not yet started, go again one per task, in order, each under its own
timeout as above, and the pool sends no more chunks. So each call keeps its own timeout and a crash still costs only
its call; a function that hangs or crashes now and then costs once per pool one short chunk timeout per worker and
the restart of the workers ended.
"""

from __future__ import annotations

import logging
import math
import multiprocessing as mp
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, wait
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from multiprocessing import forkserver
from typing import Any

from vlmrl.procs import FORKSERVER_PARENT, die_with_parent

log = logging.getLogger("vlmrl.supervise")

SHORT_TIMEOUT_FLOOR_S = 1.0
"""The shortest timeout a call gets once its batch has used one full timeout per slot."""
SHORT_TIMEOUT_FACTOR = 10.0
"""... else this many times the slowest call that returned (a call that slow is no longer ordinary)."""
HANG_CALLS_PER_SLOT = 2
"""A batch whose first ``num_workers x`` this many finished calls all timed out stops: the function hangs."""
CHUNK_TARGET_S = 0.02
"""Chunks hold at most this much work (by the median of the last calls' own times): long enough to pay for a task's
round trip, short enough that the workers share a batch evenly."""
CHUNK_TIMEOUT_FLOOR_S = 0.1
"""The shortest speculative timeout of a chunk (it only decides whether its calls go again one by one)."""

PRELOAD = ("vlmrl._forkserver_guard", "vlmrl.supervise", "vlmrl.batch", "vlmrl.scoring.runner")
"""What the forkserver imports once for every pool of the process (a process has one forkserver, started by its first
pool, which may add its own: the tool pool adds the tools, torch and qwen-vl-utils, seconds to import): a worker
forked from it starts in milliseconds. The guard makes the forkserver end with the process that started it."""

TIMEOUT = "timeout"
DIED = "died"
EXCEPTION = "exception"


class HangError(RuntimeError):
    """User code that keeps running past its timeout: the run cannot go on. The message names the function, the
    timeout, how many calls timed out and the setting to change."""


STOP_POLL_S = 0.1
"""How often a running batch looks whether another part of it stopped (:meth:`HangWatch.stop`)."""


class BatchStopped(RuntimeError):
    """A batch of calls ended early because another part of it stopped (:meth:`HangWatch.stop`: the per-trajectory
    agent loop runs a rollout's calls from several threads under one watch; the error that stopped it is raised
    there, not this)."""


@dataclass
class CallResult:
    """What one supervised call gave: its return value, or why it has none."""

    value: Any = None
    error: str | None = None
    """None, :data:`TIMEOUT` (stopped by ending its worker), :data:`DIED` (its worker process died) or
    :data:`EXCEPTION` (the call's arguments or result could not cross to or from the worker)."""
    message: str = ""
    seconds: float = 0.0
    """How long the call ran: measured in the worker for a call that returned; else from when it was handed to the
    pool (a worker's start included) to its end."""
    limit_s: float = math.inf
    """The timeout the call ran under."""


class HangWatch:
    """One batch's timeout policy (see the module docstring). ``record`` each finished call; ``timeout`` gives the
    next call's timeout; ``record`` raises :class:`HangError` once the function is known to hang."""

    def __init__(self, what: str, setting: str, slots: int, timeout_s: float, slowest_ok_s: float | None) -> None:
        """``what`` names the function in messages; ``setting`` is the config key of ``timeout_s``; ``slots`` the
        calls that run at once; ``slowest_ok_s`` the slowest call that returned so far in the run (None: none)."""
        self.what, self.setting, self.slots, self.timeout_s = what, setting, max(1, int(slots)), float(timeout_s)
        self.slowest_ok_s = slowest_ok_s
        self.finished = 0
        self.timeouts = 0
        self.returned = 0
        self.timed_out_names: dict[str, int] = {}
        self._lock = threading.Lock()  # batches of calls may run from several threads (the per-trajectory agent loop)
        self.stopped: str | None = None
        """Why the batch stopped (:meth:`stop`, or a hang found): every ``map`` under this watch ends at once."""

    def stop(self, reason: str) -> None:
        """End every call of the batch: each ``map`` under this watch cancels its calls (ending the workers that run
        them) and raises :class:`BatchStopped` within a poll (0.1 s)."""
        self.stopped = self.stopped or reason

    def timeout(self) -> float:
        """The timeout of the next call to start."""
        with self._lock:
            if self.timeouts < self.slots or self.slowest_ok_s is None:
                return self.timeout_s
            return min(self.timeout_s, max(SHORT_TIMEOUT_FLOOR_S, SHORT_TIMEOUT_FACTOR * self.slowest_ok_s))

    def record(self, result: CallResult, name: str | None = None) -> None:
        """Count a finished call; :class:`HangError` when every one of the first ``2 x slots`` timed out."""
        with self._lock:
            self._record(result, name)

    def _record(self, result: CallResult, name: str | None) -> None:
        self.finished += 1
        if result.error == TIMEOUT:
            self.timeouts += 1
            key = name or self.what
            self.timed_out_names[key] = self.timed_out_names.get(key, 0) + 1
        elif result.error is None:
            self.returned += 1
            self.slowest_ok_s = max(self.slowest_ok_s or 0.0, result.seconds)
        limit = HANG_CALLS_PER_SLOT * self.slots
        if self.finished == self.timeouts >= limit:
            names = ", ".join(f"{k} ({v})" for k, v in self.timed_out_names.items())
            self.stop(f"{self.what} hangs")
            raise HangError(
                f"{self.what}: the first {self.timeouts} calls of this batch all ran past their timeout "
                f"({self.setting}={self.timeout_s:g} s, {self.slots} at a time; timed out: {names}): it hangs. "
                f"Fix it, or raise {self.setting} if it is only slow."
            )


def _init_worker(
    initializer: Callable[..., Any] | None, args: tuple, sys_path: list[str], cwd: str, registry: str
) -> None:
    """Worker start-up: its own process group, registered in ``registry`` (what user code starts in it, such as
    verl's math_verify reward with its own process pool, can be ended with it), Ctrl-C is the parent's to handle, the
    parent's import path and folder, one thread (the pool is the parallelism), then the caller's own initializer."""
    import signal

    die_with_parent()  # the forkserver; which dies with the process that started the pool
    try:
        os.setpgid(0, 0)
        import psutil

        with open(os.path.join(registry, str(os.getpid())), "w") as f:
            f.write(repr(psutil.Process().create_time()))
    except OSError:
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for p in sys_path:
        if p not in sys.path:
            sys.path.append(p)
    try:
        os.chdir(cwd)
    except OSError:
        pass
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)
    if initializer is not None:
        initializer(*args)


def _noop() -> None:
    """A task that starts a worker."""


def _timed(fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    """Run ``fn(*args)`` in the worker: its value and how long the call itself took (the parent's clock also counts
    a worker's start and the wait in the queue)."""
    t0 = time.perf_counter()
    value = fn(*args)
    return value, time.perf_counter() - t0


def _timed_each(fn: Callable[..., Any], items: Sequence[tuple]) -> list[tuple[Any, str | None, float]]:
    """Run a chunk's calls in the worker, one after another: each call's value (or why it raised) and its own time."""
    out: list[tuple[Any, str | None, float]] = []
    for args in items:
        t0 = time.perf_counter()
        try:
            out.append((fn(*args), None, time.perf_counter() - t0))
        except Exception as e:  # noqa: BLE001 - that call's failure, as one call's would be
            out.append((None, f"{type(e).__name__}: {str(e)[:500]}", time.perf_counter() - t0))
    return out


def _chunk_results(future: Any, limit: float) -> list[CallResult] | None:
    """A finished chunk's results, or None when it ran past its speculative timeout, its worker died or its results
    could not cross back (its calls then go again one per task)."""
    try:
        pairs = future.result()
    except Exception:  # noqa: BLE001 - any of the three: not a failure of one call
        return None
    return [
        CallResult(value, seconds=s, limit_s=limit) if err is None else CallResult(None, EXCEPTION, err, s, limit)
        for value, err, s in pairs
    ]


@dataclass
class _Task:
    """What one scheduled task runs: the calls' indices, when it was handed to the pool and its timeout."""

    indices: list[int]
    started: float
    limit: float


def _result_of(future: Any, seconds: float, limit: float) -> CallResult:
    """A finished call's value, or why it has none."""
    from pebble import ProcessExpired

    try:
        value, seconds = future.result()
        return CallResult(value, seconds=seconds, limit_s=limit)
    except FutureTimeout:
        return CallResult(None, TIMEOUT, f"timed out after {limit:g} s (its worker process was ended)", seconds, limit)
    except ProcessExpired as e:
        return CallResult(None, DIED, f"its worker process died (exit code {e.exitcode})", seconds, limit)
    except Exception as e:  # noqa: BLE001 - arguments or a result that cannot cross processes
        return CallResult(None, EXCEPTION, f"{type(e).__name__}: {str(e)[:500]}", seconds, limit)


class SupervisedPool:
    """``num_workers`` worker processes that run calls with timeouts, kill-and-replace, results in input order."""

    def __init__(
        self,
        what: str,
        setting: str,
        num_workers: int,
        timeout_s: float,
        initializer: Callable[..., Any] | None = None,
        initargs: tuple = (),
        preload: Sequence[str] = (),
    ) -> None:
        """``what`` names the code in messages, ``setting`` the config key of ``timeout_s`` (0 = no timeout);
        ``initializer(*initargs)`` runs once in each worker (build the function there); ``preload``: modules the
        forkserver imports once besides :data:`PRELOAD`, so starting a worker is cheap."""
        from pebble import ProcessPool

        if num_workers < 1:
            raise ValueError(f"{setting}: a supervised pool needs at least one worker")
        self.what, self.setting = what, setting
        self.num_workers = int(num_workers)
        self.timeout_s = float(timeout_s) if timeout_s and timeout_s > 0 and math.isfinite(timeout_s) else math.inf
        self.slowest_ok_s: float | None = None
        self._chunks_ok = True
        """False once a chunk failed (:meth:`map`'s ``chunks``): the function is not one to send in chunks."""
        self._recent_s: deque[float] = deque(maxlen=16)
        """The last calls' own times: their median sizes the chunks (a slow first call does not keep them small)."""
        self._registry = tempfile.mkdtemp(prefix="vlmrl-workers-")  # each worker's pid and start time
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(list(dict.fromkeys([*PRELOAD, *preload])))
        os.environ[FORKSERVER_PARENT] = str(os.getpid())
        forkserver.ensure_running()  # from this thread: a parent-death signal follows the thread that forked
        self.pool = ProcessPool(
            max_workers=self.num_workers,
            initializer=_init_worker,
            initargs=(initializer, tuple(initargs), list(sys.path), os.getcwd(), self._registry),
            context=ctx,
        )

    def map(
        self,
        fn: Callable[..., Any],
        items: Sequence[tuple],
        names: Sequence[str] | None = None,
        give_up: Callable[[int, list[CallResult | None]], None] | None = None,
        watch: HangWatch | None = None,
        chunks: bool = False,
    ) -> list[CallResult]:
        """``fn(*items[i])`` for every i, ``num_workers`` at a time, each under the batch's :class:`HangWatch`.
        ``names[i]`` names the code call i runs (for a pool that runs several tools); ``give_up(i, results so
        far)``, called as call i finishes, may raise to stop the batch early. Raises :class:`HangError` when the
        calls keep timing out. ``watch``: the :meth:`new_watch` of a batch that spans several calls of ``map`` (a
        multi-turn rollout's turns); by default each ``map`` is its own batch. ``chunks``: fast calls may go
        several per task (see the module docstring)."""
        watch = watch or self.new_watch()
        results: list[CallResult | None] = [None] * len(items)
        queue = deque(range(len(items)))
        running: dict[Any, _Task] = {}
        ended_workers = False
        try:
            while queue or running:
                self._schedule(fn, items, queue, running, watch, chunks)
                if watch.stopped is not None:
                    raise BatchStopped(watch.stopped)
                done, _ = wait(list(running), timeout=STOP_POLL_S, return_when=FIRST_COMPLETED)
                for future in done:
                    task = running.pop(future)
                    if not self._finish(future, task, results, queue, running, watch, names, give_up):
                        ended_workers = True
                self._requeue_waiting(running, queue, watch.timeout())
        except BaseException:
            for future in running:
                future.cancel()
            raise
        finally:
            self.slowest_ok_s = watch.slowest_ok_s
            if ended_workers or any(r is not None and r.error in (TIMEOUT, DIED) for r in results):
                self._end_strays(every_group=False)  # what ended workers had started
        assert all(r is not None for r in results)
        return results  # type: ignore[return-value]

    def _schedule(
        self,
        fn: Callable[..., Any],
        items: Sequence[tuple],
        queue: deque,
        running: dict,
        watch: HangWatch,
        chunks: bool,
    ) -> None:
        """Hand calls to the pool: while nothing timed out, a second task waits queued behind each running one (no
        round trip between tasks); after a timeout, calls start one by one, each with the watch's current timeout."""
        ahead = 2 * self.num_workers if watch.timeouts == 0 else self.num_workers
        while queue and len(running) < ahead:
            k = self._chunk_size(len(queue), watch) if chunks else 1
            indices = [queue.popleft() for _ in range(k)]
            limit = watch.timeout()
            if k > 1:
                limit = min(limit, max(CHUNK_TIMEOUT_FLOOR_S, SHORT_TIMEOUT_FACTOR * k * self._typical_s()))
                args: tuple = (_timed_each, (fn, [items[i] for i in indices]))
            else:
                args = (_timed, (fn, *items[indices[0]]))
            timeout = None if math.isinf(limit) else limit
            future = self.pool.schedule(args[0], args=args[1], timeout=timeout)
            running[future] = _Task(indices, time.perf_counter(), limit)

    def _chunk_size(self, queued: int, watch: HangWatch) -> int:
        """How many calls the next task runs: 1 until a call returned, after any timeout or failed chunk; else as
        many as fit :data:`CHUNK_TARGET_S`, at most an even share of what is queued per task slot."""
        if not self._chunks_ok or watch.timeouts or not self._recent_s:
            return 1
        by_time = int(CHUNK_TARGET_S / max(self._typical_s(), 1e-6))
        return max(1, min(by_time, math.ceil(queued / (2 * self.num_workers))))

    def _typical_s(self) -> float:
        """The median of the last calls' own times."""
        return statistics.median(self._recent_s) if self._recent_s else 0.0

    def _finish(
        self,
        future: Any,
        task: _Task,
        results: list[CallResult | None],
        queue: deque,
        running: dict,
        watch: HangWatch,
        names: Sequence[str] | None,
        give_up: Callable[[int, list[CallResult | None]], None] | None,
    ) -> bool:
        """Record a finished task's calls; False when it was a chunk that failed (its calls, and those of the tasks
        not yet started, go back to the queue to run one per task, in order; the pool sends no more chunks)."""
        if len(task.indices) == 1:
            got: list[CallResult] | None = [_result_of(future, time.perf_counter() - task.started, task.limit)]
        else:
            got = _chunk_results(future, task.limit)
        if got is None:
            self._chunks_ok = False
            log.info(
                "%s: a task of %d calls did not come back within %.2g s (a slow or hung call, or its worker died): "
                "its calls run again one per task, and so do all later calls",
                self.what,
                len(task.indices),
                task.limit,
            )
            self._requeue_waiting(running, queue, -math.inf, task.indices)  # and every task not yet started
            return False
        for i, res in zip(task.indices, got):
            if res.error is None:
                self._recent_s.append(res.seconds)
            results[i] = res
            watch.record(res, names[i] if names is not None else None)
            if give_up is not None:
                give_up(i, results)
        return True

    @staticmethod
    def _requeue_waiting(running: dict[Any, _Task], queue: deque, limit: float, also: Sequence[int] = ()) -> None:
        """Calls scheduled with a longer timeout than ``limit`` that no worker has started yet go back to the front
        of the queue (in order, with the calls ``also``), to start under ``limit``: once the batch has used its full
        timeouts, a call queued before then does not keep one. (``limit`` -inf, ``also`` a failed chunk's calls:
        they and every call not yet started go again one per task.)"""
        back = list(also)
        for future, task in list(running.items()):
            # pebble's cancel() would also end a running call's worker: only calls still waiting. (Should a worker
            # take one between the check and the cancel, that call is ended and runs again from the queue.)
            if task.limit > limit and not future.running() and future.cancel():
                del running[future]
                back += task.indices
        queue.extendleft(sorted(back, reverse=True))

    def new_watch(self) -> HangWatch:
        """The timeout policy of a new batch of calls (see the module docstring)."""
        return HangWatch(self.what, self.setting, self.num_workers, self.timeout_s, self.slowest_ok_s)

    def warm(self) -> None:
        """Start every worker now (forkserver, preloads, initializer) rather than at the first call."""
        futures = [self.pool.schedule(_noop) for _ in range(self.num_workers)]
        wait(futures)

    def close(self) -> None:
        """Stop every worker, and whatever user code started in them."""
        self.pool.stop()
        self.pool.join(timeout=10)
        self._end_strays(every_group=True)
        shutil.rmtree(self._registry, ignore_errors=True)

    def _end_strays(self, every_group: bool) -> None:
        """End the process groups of the workers that are gone (with ``every_group``: of all workers): a worker ended
        for a timeout, or stopped, leaves the processes its user code started (a pool of its own) waiting forever.
        A group is ended only while its worker is known to be this pool's (the same pid and start time) or gone."""
        import psutil

        try:
            names = os.listdir(self._registry)
        except OSError:
            return
        for name in names:
            path = os.path.join(self._registry, name)
            try:
                with open(path) as f:
                    pid, born = int(name), float(f.read() or "nan")
            except (OSError, ValueError):
                continue
            try:
                alive = abs(psutil.Process(pid).create_time() - born) < 1e-3
                if not alive:  # the number belongs to another process now: not ours to touch
                    os.remove(path)
                    continue
            except psutil.NoSuchProcess:
                alive = False
            if alive and not every_group:
                continue
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                os.remove(path)
            except OSError:
                pass
