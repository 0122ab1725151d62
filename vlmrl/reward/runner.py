"""Running a scorer over a batch: in worker processes with a per-sample timeout (the default), or in the driver.

``reward.num_workers = N >= 1`` (default 1) -> :class:`ProcessRunner`: a ``pebble`` process pool of N workers
(``forkserver``: forked from a clean server that preloaded this module, so starting or replacing a worker is cheap and
never forks the driver's threads). Each worker builds the scorer once from the picklable spec. Every sample is one
task with ``reward.timeout_s``: a call still running then (a loop, ``time.sleep``, a socket read without a timeout,
a catastrophic regex) is stopped by killing its worker, which the pool replaces; a worker that dies (``os._exit``, a
segfault, the OOM killer) costs only the sample it was scoring. Results keep the input order.

``reward.num_workers = 0`` -> :class:`InlineRunner`: calls run in the driver's thread (a debugger works, a fast
function costs only the call). Nothing can stop a call there once it blocks, so this mode takes no timeout
(``reward.timeout_s`` must be 0 with it; the config check says so).

Either way a reward that raises, returns something that is not a finite number, or calls ``sys.exit`` becomes a
counted failure with its message (``vlmrl.reward.loading.evaluate``), never an exception in the trainer.
"""

from __future__ import annotations

import logging
import math
import multiprocessing as mp
import os
import sys
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from vlmrl.reward.loading import EXCEPTION, TIMEOUT, Outcome, RewardConfigError, evaluate

log = logging.getLogger("vlmrl.reward")


class RewardWorkerError(RuntimeError):
    """The worker pool cannot go on (the reward function cannot be built in a worker)."""


class InlineRunner:
    """Scores in the calling thread, without a timeout (``reward.num_workers=0``: debugging)."""

    def __init__(self, scorer: Callable[[Any], Any]) -> None:
        self.scorer = scorer

    def run(self, samples: list[Any]) -> list[Outcome]:
        """Score ``samples`` in order; every outcome is a result or an error, never an exception."""
        return [evaluate(self.scorer, s) for s in samples]

    def close(self) -> None:
        """Nothing to release."""


# --------------------------------------------------------------------------------------------------- worker pool

_SCORER: Any = None
_BUILD_ERROR: tuple[str, bool] | None = None


def _init_worker(spec: dict[str, Any], sys_path: list[str], cwd: str, threads: int) -> None:
    """Worker start-up: the driver's import path and folder, then the scorer, built once."""
    global _SCORER, _BUILD_ERROR
    import signal

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
        _SCORER = build_scorer(spec)
    except BaseException as e:  # noqa: BLE001 - reported with the first task
        _BUILD_ERROR = (f"{type(e).__name__}: {e}", isinstance(e, RewardConfigError))


def _score(sample: Any) -> Outcome | tuple[str, str, bool]:
    """One task: the sample's outcome (or, when the scorer could not be built, why)."""
    if _BUILD_ERROR is not None:
        return ("build_error", *_BUILD_ERROR)
    return evaluate(_SCORER, sample)


class ProcessRunner:
    """``num_workers`` reward processes with per-sample timeouts, kill-and-replace, and order-preserving results."""

    def __init__(self, spec: dict[str, Any], num_workers: int, timeout_s: float) -> None:
        from pebble import ProcessPool

        if num_workers < 1:
            raise ValueError("ProcessRunner needs num_workers >= 1")
        self.num_workers = int(num_workers)
        self.timeout_s = float(timeout_s) if timeout_s and timeout_s > 0 else None
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["vlmrl.batch", "vlmrl.reward.runner"])
        threads = max(1, (os.cpu_count() or 1) // self.num_workers)
        self.pool = ProcessPool(
            max_workers=self.num_workers,
            initializer=_init_worker,
            initargs=(spec, list(sys.path), os.getcwd(), threads),
            context=ctx,
        )

    def run(self, samples: list[Any]) -> list[Outcome]:
        """Score ``samples`` across the workers; results come back in input order."""
        from pebble import ProcessExpired

        futures = [self.pool.schedule(_score, args=(s,), timeout=self.timeout_s) for s in samples]
        out: list[Outcome] = []
        for f in futures:
            try:
                res = f.result()
            except FutureTimeout:
                res = Outcome(None, {}, TIMEOUT, f"reward call ran past timeout_s={self.timeout_s:g}s (worker killed)")
            except ProcessExpired as e:
                res = Outcome(None, {}, EXCEPTION, f"reward worker process died (exit code {e.exitcode})")
            except Exception as e:  # noqa: BLE001 - pickling a sample or a result failed: that sample's failure
                res = Outcome(None, {}, EXCEPTION, f"{type(e).__name__}: {e}")
            if isinstance(res, tuple) and res and res[0] == "build_error":
                self.close()
                _, message, config_error = res
                raise (RewardConfigError if config_error else RewardWorkerError)(
                    f"a reward worker could not build the reward function: {message}"
                )
            out.append(res)
        return out

    def close(self) -> None:
        """Stop every worker."""
        self.pool.stop()
        self.pool.join(timeout=10)


def timeout_text(timeout_s: float) -> str:
    """``30s`` or ``none`` for logs."""
    return f"{timeout_s:g}s" if timeout_s and math.isfinite(timeout_s) and timeout_s > 0 else "none"
