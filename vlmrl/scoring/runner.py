"""Running a scorer over a batch: in worker processes with a per-sample timeout (the default), or in the driver.

``reward.num_workers = N >= 1`` (default 1) -> :class:`ProcessRunner`: N worker processes
(:class:`vlmrl.supervise.SupervisedPool`: forked from a clean ``forkserver`` that preloaded this module, so starting
or replacing a worker is cheap and never forks the driver's threads). Each worker builds the scorer once from the
picklable spec. Every sample is one call with ``reward.timeout_s``: a call still running then (a loop,
``time.sleep``, a socket read without a timeout, a catastrophic regex, sympy holding the GIL) is stopped by ending
its worker, which the pool replaces; a worker that dies (``os._exit``, a segfault, the OOM killer) costs only the
sample it was scoring. N calls run at a time, so their timeouts overlap; a batch that keeps timing out costs about
one timeout per worker and stops the run when its first 2 x N calls all timed out (see ``vlmrl.supervise``).
Results keep the input order. A fast function's calls go to the workers several per task (a round trip between
processes costs more than most reward calls; the chunks' rules, which keep each call's timeout, are in
``vlmrl.supervise``).

``reward.num_workers = 0`` -> :class:`InlineRunner`: calls run in the driver's thread (a debugger works, a fast
function costs only the call). Nothing can stop a call there once it blocks, so this mode takes no timeout
(``reward.timeout_s`` must be 0 with it; the config check says so).

Either way a reward that raises, returns something that is not a finite number, or calls ``sys.exit`` becomes a
counted failure with its message (``vlmrl.scoring.loading.evaluate``), never an exception in the trainer.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from typing import Any

from vlmrl.scoring.composite import build_scorer
from vlmrl.scoring.loading import EXCEPTION, TIMEOUT, Outcome, RewardConfigError, evaluate
from vlmrl.supervise import DIED, CallResult, SupervisedPool
from vlmrl.supervise import TIMEOUT as CALL_TIMEOUT

log = logging.getLogger("vlmrl.scoring")


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


def _build_scorer(spec: dict[str, Any]) -> None:
    """Worker start-up (after vlmrl.supervise's): the scorer, built once."""
    global _SCORER, _BUILD_ERROR

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
    """``num_workers`` reward processes (:class:`vlmrl.supervise.SupervisedPool`): per-sample timeouts that run
    concurrently, kill-and-replace, a batch that keeps timing out stopped early, order-preserving results."""

    def __init__(
        self, spec: dict[str, Any], num_workers: int, timeout_s: float, what: str = "the reward function"
    ) -> None:
        self.num_workers = int(num_workers)
        self.pool = SupervisedPool(
            what, "reward.timeout_s", self.num_workers, timeout_s or 0.0, initializer=_build_scorer, initargs=(spec,)
        )
        # the workers start while the run starts up (seconds of imports), not in the first step's reward time
        self._warming: threading.Thread | None = threading.Thread(target=self._warm, name="reward-warm", daemon=True)
        self._warming.start()

    def _warm(self) -> None:
        try:
            self.pool.warm()
        except Exception:  # noqa: BLE001 - a worker that cannot start is reported by the first batch
            pass

    def _ready(self) -> None:
        if self._warming is not None:
            self._warming.join()
            self._warming = None

    def run(
        self, samples: list[Any], give_up: Callable[[int, list[Outcome | None]], None] | None = None
    ) -> list[Outcome]:
        """Score ``samples`` across the workers; results come back in input order. ``give_up(i, outcomes so far,
        None where not yet scored)``, called as sample i is scored, may raise to stop the batch early;
        :class:`vlmrl.supervise.HangError` when the calls keep timing out."""
        self._ready()
        outcomes: list[Outcome | None] = [None] * len(samples)

        def outcome(res: CallResult) -> Outcome:
            if res.error == CALL_TIMEOUT:
                return Outcome(None, {}, TIMEOUT, f"reward call {res.message}")
            if res.error == DIED:
                return Outcome(None, {}, EXCEPTION, f"reward call: {res.message}")
            if res.error is not None:  # a sample or a result that cannot be pickled: that sample's failure
                return Outcome(None, {}, EXCEPTION, res.message)
            value = res.value
            if isinstance(value, tuple) and value and value[0] == "build_error":
                self.close()
                _, message, config_error = value
                raise (RewardConfigError if config_error else RewardWorkerError)(
                    f"a reward worker could not build the reward function: {message}"
                )
            return value

        def check(i: int, results: list[CallResult | None]) -> None:
            res = results[i]
            assert res is not None
            outcomes[i] = outcome(res)
            if give_up is not None:
                give_up(i, outcomes)

        self.pool.map(_score, [(s,) for s in samples], give_up=check, chunks=True)
        assert all(o is not None for o in outcomes)
        return outcomes  # type: ignore[return-value]

    def close(self) -> None:
        """Stop every worker."""
        self._ready()
        self.pool.close()


def timeout_text(timeout_s: float) -> str:
    """``30s`` or ``none`` for logs."""
    return f"{timeout_s:g}s" if timeout_s and math.isfinite(timeout_s) and timeout_s > 0 else "none"
