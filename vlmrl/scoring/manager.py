"""RewardManager: built once by the driver, scores each step's samples with error isolation and metrics."""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vlmrl.config.checks import reward_problems
from vlmrl.config.schema import TOTAL_SCORE_NAMES
from vlmrl.scoring.composite import Dispatch, build_scorer, make_spec
from vlmrl.scoring.loading import ERROR_KINDS, TIMEOUT, Outcome, RewardConfigError
from vlmrl.scoring.runner import InlineRunner, ProcessRunner, timeout_text
from vlmrl.timing import Timer

if TYPE_CHECKING:
    from collections.abc import Callable

    from vlmrl.config import CustomRewardFunctionConfig, RewardConfig

log = logging.getLogger("vlmrl.scoring")

_EXCERPT = 200


class RewardError(RuntimeError):
    """A reward call failed and ``reward.on_error=raise``; the message names the sample."""


@dataclass
class RewardOutput:
    """Scores of one batch, in the order of the samples given to :meth:`RewardManager.score`."""

    scores: list[float]
    """Total reward per sample (``fallback_score`` where the call failed)."""
    components: dict[str, list[float]]
    """Per component name, one value per sample; NaN where that sample's function did not report it or failed."""
    metrics: dict[str, float]
    """``reward/{mean,std,min,max}``, ``reward/<component>/{mean,std}``, ``reward/errors``, ``reward/timeouts``,
    ``reward/exceptions``, ``reward/non_finite``, ``reward/wrong_type``, ``reward/time_s`` and, for mixed batches,
    ``reward/source/<data_source>/mean``."""
    errors: list[str | None] = field(default_factory=list)
    """Per sample: None, or the error kind (exception | timeout | non_finite | wrong_type)."""

    SCORE_NAMES = TOTAL_SCORE_NAMES
    """Names ``values`` takes for the total (verl's ``filter_groups.metric`` spellings), unless a component has it."""

    def values(self, metric: str) -> list[float]:
        """Per-sample values of ``metric``: the total (``score`` and its verl spellings) or a component (NaN as 0);
        ValueError naming the components when it is neither."""
        if metric in self.SCORE_NAMES and metric not in self.components:
            return list(self.scores)
        if metric not in self.components:
            raise ValueError(
                f"algorithm.filter_groups.metric={metric!r} is neither 'score' nor a reward component "
                f"({sorted(self.components)})"
            )
        return [0.0 if math.isnan(v) else v for v in self.components[metric]]

    @staticmethod
    def combine(
        picked: list[tuple[RewardOutput, list[int]]], samples: list[Any], scored: list[RewardOutput]
    ) -> RewardOutput:
        """The scores of rows picked from several outputs (``(output, rows)`` in order; ``samples`` are the picked
        samples, in the same order) as one output whose metrics describe exactly those samples; the error counts
        and the time cover every output of ``scored`` (each of those calls happened)."""
        scores: list[float] = []
        errors: list[str | None] = []
        comps: dict[str, list[float]] = {}
        for out, rows in picked:
            for k in set(comps) | set(out.components):
                vals = out.components.get(k)
                comps.setdefault(k, [math.nan] * len(scores)).extend(
                    [vals[i] for i in rows] if vals is not None else [math.nan] * len(rows)
                )
            scores += [out.scores[i] for i in rows]
            errors += [out.errors[i] if out.errors else None for i in rows]
        kinds = Counter(e for o in scored for e in (o.errors or []) if e is not None)
        metrics = reward_metrics(samples, scores, comps, kinds, errors)
        metrics["reward/time_s"] = sum(o.metrics.get("reward/time_s", 0.0) for o in scored)
        return RewardOutput(scores=scores, components=comps, metrics=metrics, errors=errors)


@dataclass
class ScoredPart:
    """The reward calls of some samples, before the verdict on their failures (:meth:`RewardManager.outcomes`)."""

    samples: list[Any]
    outcomes: list[Outcome]
    seconds: float
    """How long the calls took."""

    @staticmethod
    def concat(parts: list[ScoredPart]) -> ScoredPart:
        """The parts one after the other (the calls' seconds summed)."""
        return ScoredPart(
            [s for p in parts for s in p.samples], [o for p in parts for o in p.outcomes], sum(p.seconds for p in parts)
        )


def excerpt(text: Any, limit: int = _EXCERPT) -> str:
    """A short, single-line view of a (maybe huge) response for logs."""
    text = str(text)
    flat = text[: limit * 2].replace("\n", "\\n")
    if len(flat) > limit or len(text) > limit * 2:
        return repr(flat[:limit]) + f"... ({len(text)} chars)"
    return repr(flat)


class RewardManager:
    """Scores batches of :class:`vlmrl.batch.RewardSample` with the configured reward.

    ``RewardManager(cfg.reward, cfg.custom_reward_function)`` builds (and so validates) the reward once: a wrong
    name, a missing file, an unknown keyword argument or a bad signature raises :class:`RewardConfigError` here, not
    at the first step. Use :meth:`score` each step and :meth:`close` at the end (or use it as a context manager).
    """

    def __init__(self, reward_cfg: RewardConfig, custom_cfg: CustomRewardFunctionConfig | None = None) -> None:
        problems = reward_problems(reward_cfg)  # the config gate's check, for a manager built outside it
        if problems:
            raise RewardConfigError("\n".join(problems))
        self.num_workers = int(reward_cfg.num_workers or 0)
        self.timeout_s = float(reward_cfg.timeout_s or 0.0)
        self.on_error = str(reward_cfg.on_error)
        self.fallback_score = float(reward_cfg.fallback_score)
        self.max_failed_ratio = float(reward_cfg.max_failed_ratio)
        self.spec = make_spec(reward_cfg, custom_cfg)
        self.scorer: Dispatch = build_scorer(self.spec)
        self._inline: InlineRunner | None = None
        self._pool: ProcessRunner | None = None
        if self.num_workers == 0:
            self._inline = InlineRunner(self.scorer)
        else:
            self._pool = ProcessRunner(
                self.spec, self.num_workers, self.timeout_s, what=f"reward {self.scorer.describe()}"
            )
        self._seen_kinds: set[str] = set()
        self._lock = threading.Lock()
        """One batch of calls at a time (the Rollouter's scoring thread and the trainer's validation)."""
        self.totals: Counter[str] = Counter()
        where = "in-process" if self.num_workers == 0 else f"{self.num_workers} worker processes"
        log.info(
            "reward: %s (%s, timeout %s, on_error=%s)",
            self.scorer.describe(),
            where,
            timeout_text(self.timeout_s),
            self.on_error,
        )

    @property
    def needs_images(self) -> bool:
        """Whether any configured function looks at the images or video frames (worker processes are sent them only
        then)."""
        return self.scorer.needs_images

    def score(self, samples: list[Any]) -> RewardOutput:
        """Score ``samples`` (RewardSample); the output keeps their order. Raises RewardError only when on_error=raise.

        A data_source with no configured function raises RewardConfigError before any call (whatever on_error).
        """
        sw = Timer.start()
        samples = list(samples)
        failed = 0

        def give_up(i: int, so_far: list[Outcome | None]) -> None:
            nonlocal failed
            o = so_far[i]
            if o is not None and o.error is not None:
                failed += 1
                self._give_up(samples, so_far, failed)

        outcomes = self._calls(samples, give_up)
        return self.assemble(samples, outcomes, sw.elapsed)

    def outcomes(self, samples: list[Any]) -> ScoredPart:
        """The reward calls of ``samples`` without the step's verdict on their failures: the fully asynchronous
        Rollouter scores a step's groups as they finish, and the step that trains them gives the verdict over its whole
        batch (:meth:`assemble`: the same output, errors and stop as :meth:`score` of the batch)."""
        sw = Timer.start()
        samples = list(samples)
        outcomes = self._calls(samples, None)
        return ScoredPart(samples, outcomes, sw.elapsed)

    def _calls(self, samples: list[Any], give_up: Callable[[int, list[Outcome | None]], None] | None) -> list[Outcome]:
        """Every sample's reward call (in worker processes or in this thread; one batch at a time)."""
        with self._lock:
            self.scorer.check({s.data_source for s in samples})
            if self._pool is not None:
                payload = samples if self.scorer.needs_images else [_without_images(s) for s in samples]
                return self._pool.run(payload, give_up=give_up)
            assert self._inline is not None
            return self._inline.run(samples)

    def assemble(self, samples: list[Any], outcomes: list[Outcome], elapsed: float) -> RewardOutput:
        """The output of the reward calls' ``outcomes`` of ``samples`` (in order; ``elapsed`` seconds of calls): the
        scores, the fallback score where a call failed, the metrics, and the run stopped (:class:`RewardError`) when
        the failures reach ``on_error``'s limit."""
        n = len(samples)
        scores: list[float] = []
        errors: list[str | None] = []
        names: dict[str, None] = {}
        for o in outcomes:
            for key in o.components:
                names.setdefault(key, None)
        components = {key: [math.nan] * n for key in names}
        kinds: Counter[str] = Counter()
        first: dict[str, int] = {}
        for i, o in enumerate(outcomes):
            if o.error is not None:
                kinds[o.error] += 1
                first.setdefault(o.error, i)
                scores.append(self.fallback_score)
                errors.append(o.error)
                continue
            assert o.score is not None
            scores.append(o.score)
            errors.append(None)
            for key, v in o.components.items():
                components[key][i] = v
        if kinds:
            self._report(samples, outcomes, kinds, first)
        metrics = reward_metrics(samples, scores, components, kinds, errors)
        metrics["reward/time_s"] = elapsed
        return RewardOutput(scores=scores, components=components, metrics=metrics, errors=errors)

    def _give_up(self, samples: list[Any], outcomes: list[Outcome | None], failed: int) -> None:
        """Stop a batch as soon as its outcome is certain (``failed`` calls of it failed so far): with
        ``on_error=raise`` at the first failure, else once the failures reach ``max_failed_ratio`` of the batch
        whatever the calls still running give."""
        if failed and (self.on_error == "raise" or failed >= self.max_failed_ratio * len(samples)):
            raise self._stop_error(samples, outcomes, failed)

    def _stop_error(self, samples: list[Any], outcomes: list[Outcome | None], failed: int) -> RewardError:
        """The error that stops the run: the first failure, and why the run cannot go on."""
        i = next(k for k, o in enumerate(outcomes) if o is not None and o.error is not None)
        s, o = samples[i], outcomes[i]
        assert o is not None
        if self.on_error == "raise":
            why = "(set reward.on_error=fallback to score failures with reward.fallback_score)"
        else:  # a step with no working reward teaches nothing: stop instead of training on fallback scores
            why = (
                f"({failed} of {len(samples)} samples' reward calls failed this step, at or above "
                f"reward.max_failed_ratio={self.max_failed_ratio:g}; the reward function is broken for this data)"
            )
        return RewardError(
            f"reward {o.error} on sample {i} (data_source={s.data_source!r}, response={excerpt(s.response)}): "
            f"{o.message}\n{why}"
        )

    def _report(self, samples: list[Any], outcomes: list[Outcome], kinds: Counter[str], first: dict[str, int]) -> None:
        self.totals.update(kinds)
        failed = sum(kinds.values())
        if self.on_error == "raise" or failed >= self.max_failed_ratio * len(samples):
            raise self._stop_error(samples, list(outcomes), failed)
        for kind, i in first.items():
            if kind in self._seen_kinds:
                continue
            self._seen_kinds.add(kind)
            s = samples[i]
            log.warning(
                "reward %s on sample %d (data_source=%r, response=%s), scored %g; later %s errors are only counted "
                "(metric reward/%s):\n%s",
                kind,
                i,
                s.data_source,
                excerpt(s.response),
                self.fallback_score,
                kind,
                _plural(kind),
                outcomes[i].message,
            )
        summary = ", ".join(f"{k}: {v}" for k, v in sorted(kinds.items()))
        log.warning("reward: %d of %d samples failed this step (%s)", sum(kinds.values()), len(samples), summary)

    def close(self) -> None:
        """Stop the worker processes / watchdog thread."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._inline is not None:
            self._inline.close()
            self._inline = None

    def __enter__(self) -> RewardManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def _without_images(sample: Any) -> Any:
    """The sample without its images and video frames (a reward that does not look at them is not sent them)."""
    if not dataclasses.is_dataclass(sample):
        return sample
    heavy = {k: [] for k in ("images", "videos") if getattr(sample, k, None)}
    return dataclasses.replace(sample, **heavy) if heavy else sample


def _plural(kind: str) -> str:
    return {TIMEOUT: "timeouts", "exception": "exceptions"}.get(kind, kind)


def _mean_std(values: list[float]) -> tuple[float, float]:
    vals = [v for v in values if not math.isnan(v)]
    if not vals:
        return math.nan, math.nan
    mean = sum(vals) / len(vals)
    var = sum((v - mean) ** 2 for v in vals) / len(vals)
    return mean, math.sqrt(var)


def reward_metrics(
    samples: list[Any],
    scores: list[float],
    components: dict[str, list[float]],
    kinds: Counter[str],
    errors: list[str | None],
) -> dict[str, float]:
    """The ``reward/*`` metrics of scored samples (see ``RewardOutput.metrics``); ``kinds`` counts errors by kind."""
    out: dict[str, float] = {}
    if scores:
        mean, std = _mean_std(scores)
        out.update({"reward/mean": mean, "reward/std": std, "reward/min": min(scores), "reward/max": max(scores)})
    for key, values in components.items():
        mean, std = _mean_std(values)
        out[f"reward/{key}/mean"] = mean
        out[f"reward/{key}/std"] = std
    out["reward/errors"] = float(sum(kinds.values()))
    for kind in ERROR_KINDS:
        out[f"reward/{_plural(kind)}"] = float(kinds.get(kind, 0))
    sources: dict[str, list[float]] = {}
    for s, v in zip(samples, scores):
        sources.setdefault(s.data_source, []).append(v)
    if 1 < len(sources) <= 32:
        for ds, values in sources.items():
            out[f"reward/source/{ds}/mean"] = sum(values) / len(values)
    return out
