"""Finding reward functions (registry name, ``file.py:fn``, ``module:fn``), adapting their signature, checking results.

The calling convention is told apart by the function's parameters (``detect_style``):

* vlmrl's ``fn(sample, **kwargs)``: exactly one required positional parameter, a :class:`vlmrl.batch.RewardSample`.
* verl's ``compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs)``: a parameter named
  ``solution_str``. Called as verl calls it, by keyword, passing only the names the function accepts (so
  ``compute_score(solution_str, ground_truth)`` works too); ``async def`` functions are awaited.
* positional forms: ``fn(data_source, answer, truth[, info])`` (other names, three or more required parameters) and
  verl's reward modules ``compute_score(predict_str, ground_truth, ...)`` (two required parameters), called
  ``fn(solution, ground_truth)`` as verl's ``default_compute_score`` calls its modules.

A function returns a number (the total) or a dict naming components, whose ``score`` (or ``overall``) entry is the
total; non-numeric dict entries are ignored (verl lets them carry strings for logging).

Security: only the launcher's config names what is imported. Nothing read from a dataset row (``data_source``,
``extra_info``) is ever turned into a module or file path; ``data_source`` only selects among functions the config
or the built-in table already named.
"""

from __future__ import annotations

import inspect
import math
import numbers
import os
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from vlmrl import userfiles

# name -> "module:function"; modules are imported only when their name is used (clip pulls in transformers)
REGISTRY: dict[str, str] = {
    "format": "vlmrl.rewards.format:format_reward",
    "accuracy": "vlmrl.rewards.accuracy:accuracy_reward",
    "math": "vlmrl.rewards.accuracy:math_reward",
    "choice": "vlmrl.rewards.accuracy:choice_reward",
    "number": "vlmrl.rewards.accuracy:number_reward",
    "iou": "vlmrl.rewards.iou:iou_reward",
    "box_format": "vlmrl.rewards.iou:box_format_reward",
    "similarity": "vlmrl.rewards.similarity:similarity_reward",
    "visual_consistency": "vlmrl.rewards.visual:visual_consistency",
    "clip_consistency": "vlmrl.rewards.clip:clip_consistency",
    "length_penalty": "vlmrl.rewards.length:length_penalty",
    "geo3k": "vlmrl.rewards.recipes:geo3k",
    "grounding": "vlmrl.rewards.recipes:grounding",
    "text_visual": "vlmrl.rewards.recipes:text_visual",
    "synthetic": "vlmrl.rewards.synthetic:synthetic_reward",
    "reward_model": "vlmrl.rewards.model:reward_model_score",
}

# error kinds, as counted in the metrics (reward/<kind>s) and named in logs
EXCEPTION = "exception"
TIMEOUT = "timeout"
NON_FINITE = "non_finite"
WRONG_TYPE = "wrong_type"
ERROR_KINDS = (EXCEPTION, TIMEOUT, NON_FINITE, WRONG_TYPE)

_VERL_NAMES = ("data_source", "solution_str", "ground_truth", "extra_info")


class RewardConfigError(ValueError):
    """The reward configuration cannot work (unknown name, missing file, bad signature, unknown kwarg...)."""


class Outcome(NamedTuple):
    """The checked result of one reward call: a finite total and components, or an error kind and message."""

    score: float | None
    components: dict[str, float]
    error: str | None = None
    message: str | None = None


class BadResult(Exception):
    """A reward function returned something that is not a finite number (or a dict holding one as ``score``)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def registered_names() -> list[str]:
    """The built-in reward names usable as ``reward.function``, in components and in ``reward.dispatch``."""
    return sorted(REGISTRY)


def load_file_function(path: str, name: str = "compute_score") -> Callable[..., Any]:
    """Import ``name`` from the Python file at ``path`` (trusted code named by the launcher), once per process
    (``vlmrl.userfiles``: its functions pickle into child processes, helpers beside it import)."""
    return _load(f"{os.path.abspath(os.path.expanduser(path))}:{name}")


def _load(spec: str) -> Callable[..., Any]:
    """``userfiles.load_callable`` with its errors as :class:`RewardConfigError`."""
    try:
        return userfiles.load_callable(spec, what="reward")
    except FileNotFoundError as e:
        raise RewardConfigError(str(e)) from None
    except (ValueError, AttributeError) as e:
        raise RewardConfigError(str(e)) from None


def resolve_function(spec: str) -> tuple[Callable[..., Any], str, str]:
    """Turn a registry name, ``path/to/file.py[:fn]`` or ``package.module:fn`` into (function, short name, where
    it comes from). The short name is the function's own (a component's default name, its metrics' key); the
    source names the file or module too (``my_reward.py:acc``), for messages."""
    if spec in REGISTRY:
        return _load(REGISTRY[spec]), spec, spec
    target, fn_name = userfiles.split_spec(spec)
    if target.endswith(".py"):
        name = userfiles.short_name(spec)
        return load_file_function(target, name), name, f"{os.path.basename(target)}:{name}"
    if fn_name:
        try:
            return _load(spec), userfiles.short_name(spec), spec
        except ModuleNotFoundError as e:
            if e.name is None or not (target == e.name or target.startswith(e.name + ".")):
                raise  # the module exists but one of its own imports is missing: say so
    raise RewardConfigError(
        f"unknown reward function '{spec}'. Use a registered name ({', '.join(registered_names())}), "
        "'path/to/file.py:fn', or set custom_reward_function.path=my_reward.py custom_reward_function.name=fn"
    )


def absolutize_spec(spec: str) -> str:
    """Make the file part of a ``file.py[:fn]`` spec absolute (worker processes may not share the cwd)."""
    if spec in REGISTRY:
        return spec
    target, fn_name = userfiles.split_spec(spec)
    if target.endswith(".py"):
        target = os.path.abspath(os.path.expanduser(target))
        return f"{target}:{fn_name}" if fn_name else target
    return spec


# calling conventions (``RewardFn.style``)
VLMRL = "vlmrl"
"""``fn(sample, **kwargs)``: one required positional parameter, a RewardSample."""
VERL = "verl"
"""verl's keyword call: ``fn(data_source=, solution_str=, ground_truth=, extra_info=)``, only the names it accepts."""
VERL_POSITIONAL = "verl-positional"
"""``fn(data_source, solution, ground_truth[, extra_info])`` with other parameter names: called positionally."""
VERL_MODULE = "verl-module"
"""verl's own reward modules (``verl/utils/reward_score/geo3k.py``: ``compute_score(predict_str, ground_truth)``):
two required positional parameters, called as verl's ``default_compute_score`` calls them, ``fn(solution, truth)``."""


def detect_style(fn: Callable[..., Any]) -> str:
    """The calling convention of a reward function, from its parameters (see ``VLMRL``, ``VERL``, ``VERL_POSITIONAL``,
    ``VERL_MODULE``)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError) as e:
        raise RewardConfigError(f"cannot read the signature of reward function {fn!r}: {e}") from None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    keyword = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    required = [p for p in positional if p.default is p.empty]
    if "solution_str" in keyword or (not required and any(p.kind == p.VAR_KEYWORD for p in params)):
        return VERL
    if positional and positional[0].name == "data_source" and len(required) >= 2:
        return VERL_POSITIONAL
    if len(required) == 1 and required[0].name in ("reward_input", "reward_inputs"):
        raise RewardConfigError(
            f"{getattr(fn, '__qualname__', fn)!r} looks like an EasyR1 reward (a dict or a batch of dicts); vlmrl "
            "calls fn(sample) with a RewardSample (sample.response, sample.ground_truth, ...) or verl's signature"
        )
    if len(required) == 1:
        return VLMRL
    if len(required) == 2:
        return VERL_MODULE
    if len(required) >= 3:
        return VERL_POSITIONAL
    raise RewardConfigError(
        f"reward function {getattr(fn, '__qualname__', fn)!r} has signature {inspect.signature(fn)}; expected "
        "vlmrl's fn(sample, **kwargs), verl's compute_score(data_source, solution_str, ground_truth, "
        "extra_info=None, **kwargs) or a verl reward module's compute_score(solution_str, ground_truth)"
    )


def _run_coroutine(result: Any) -> Any:
    """The value of an ``async def`` reward's call (verl accepts coroutine reward functions too)."""
    if inspect.iscoroutine(result):
        import asyncio

        return asyncio.run(result)
    return result


@dataclass
class RewardFn:
    """A reward function with its calling convention and bound keyword arguments; call it with a RewardSample."""

    fn: Callable[..., Any]
    name: str
    style: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    needs_images: bool = True
    verl_names: tuple[str, ...] = _VERL_NAMES
    """verl-style keyword calls: the names of ``data_source, solution_str, ground_truth, extra_info`` it accepts;
    positional calls: whether extra_info is passed (it is, when the 4th positional parameter exists)."""
    source: str = ""
    """Where the function comes from (``my_reward.py:acc``, ``package.module:fn``), for messages."""

    def __call__(self, sample: Any) -> Any:
        if self.style == VLMRL:
            return _run_coroutine(self.fn(sample, **self.kwargs))
        values = {
            "data_source": sample.data_source,
            "solution_str": sample.response,
            "ground_truth": sample.ground_truth,
            "extra_info": sample.extra_info,
        }
        if self.style == VERL:
            return _run_coroutine(self.fn(**{k: values[k] for k in self.verl_names}, **self.kwargs))
        if self.style == VERL_MODULE:
            return _run_coroutine(self.fn(sample.response, sample.ground_truth, **self.kwargs))
        args = [values[k] for k in self.verl_names]
        return _run_coroutine(self.fn(*args, **self.kwargs))

    def describe(self) -> str:
        """One line naming the function and its convention (for logs)."""
        source = f" from {self.source}" if self.source and self.source != self.name else ""
        return f"{self.name}{source} ({self.style}-style{', kwargs=' + str(self.kwargs) if self.kwargs else ''})"


def make_reward_fn(
    spec: str | Callable[..., Any], kwargs: Mapping[str, Any] | None = None, name: str | None = None
) -> RewardFn:
    """Load (if ``spec`` is a string) and adapt a reward function; unknown keyword arguments are rejected here.

    ``needs_images`` comes from the function's ``needs_images`` attribute (default True for vlmrl-style functions,
    always False for verl-style ones, which never see images): worker processes are sent images only when needed.
    """
    if isinstance(spec, str):
        fn, short, source = resolve_function(spec)
    else:
        fn, short = spec, getattr(spec, "__name__", "reward")
        source = f"{getattr(spec, '__module__', '?')}:{getattr(spec, '__qualname__', short)}"
    kwargs = dict(kwargs or {})
    style = detect_style(fn)
    sig = inspect.signature(fn)
    params = sig.parameters
    has_var_kw = any(p.kind == p.VAR_KEYWORD for p in params.values())
    out = RewardFn(fn=fn, name=name or short, style=style, kwargs=kwargs, source=source)
    if style == VLMRL:
        out.needs_images = bool(getattr(fn, "needs_images", True))
        try:
            sig.bind(None, **kwargs)
        except TypeError as e:
            raise RewardConfigError(f"reward '{out.name}' does not accept kwargs {sorted(kwargs)}: {e}") from None
        return out
    out.needs_images = False
    if style == VERL:  # by keyword, as verl calls it, passing only what the function accepts
        out.verl_names = tuple(n for n in _VERL_NAMES if n in params or has_var_kw)
    elif style == VERL_POSITIONAL:
        out.verl_names = _VERL_NAMES if _n_positional(sig) >= 4 else _VERL_NAMES[:3]
    else:
        out.verl_names = ("solution_str", "ground_truth")
    taken = set(out.verl_names) | set(list(params)[: len(out.verl_names)] if style != VERL else ())
    for key in kwargs:
        if key in _VERL_NAMES or key in taken:
            raise RewardConfigError(f"reward_kwargs may not set '{key}' (vlmrl passes it to '{out.name}')")
        if key not in params and not has_var_kw:
            raise RewardConfigError(f"reward '{out.name}' does not accept keyword '{key}' (signature {sig})")
    try:  # the call vlmrl will make binds (a required parameter it would not pass is a configuration error)
        if style == VERL:
            sig.bind(**dict.fromkeys(out.verl_names), **kwargs)
        else:
            sig.bind(*[None] * len(out.verl_names), **kwargs)
    except TypeError as e:
        raise RewardConfigError(
            f"reward '{out.name}' {sig} cannot be called the way vlmrl calls {style}-style functions "
            f"({', '.join(out.verl_names)}): {e}"
        ) from None
    return out


def _n_positional(sig: inspect.Signature) -> int:
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if any(p.kind == p.VAR_POSITIONAL for p in sig.parameters.values()):
        return 99
    return sum(p.kind in kinds for p in sig.parameters.values())


def as_float(value: Any, what: str = "score") -> float:
    """A finite float from a reward's return value, or BadResult naming what was wrong."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, numbers.Real):
        try:
            out = float(value)
        except OverflowError:  # an int like 10**400
            raise BadResult(NON_FINITE, f"{what} is an integer too large for a float ({str(value)[:20]}...)") from None
    elif hasattr(value, "item") and getattr(value, "ndim", None) == 0:  # numpy / torch scalars
        try:
            out = float(value.item())
        except (TypeError, ValueError):
            raise BadResult(WRONG_TYPE, f"{what} is {type(value).__name__}, not a number") from None
    else:
        text = repr(value)
        text = text if len(text) <= 80 else text[:77] + "..."
        raise BadResult(WRONG_TYPE, f"{what} is {type(value).__name__} ({text}), not a number")
    if not math.isfinite(out):
        raise BadResult(NON_FINITE, f"{what} is {out}")
    if abs(out) > float(np.finfo(np.float32).max):  # advantages are computed in float32: it would become inf
        raise BadResult(NON_FINITE, f"{what} is {out}, not finite as a float32")
    return out


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) or (hasattr(value, "item") and getattr(value, "ndim", None) == 0)


def normalize(result: Any) -> tuple[float, dict[str, float]]:
    """(total, components) from a reward's return value: a number, or a dict with ``score``/``overall``."""
    if isinstance(result, Mapping):
        key = "score" if "score" in result else "overall" if "overall" in result else None
        if key is None:
            raise BadResult(WRONG_TYPE, f"dict result without a 'score' (or 'overall') entry: keys {sorted(result)}")
        total = as_float(result[key], key)
        comps: dict[str, float] = {}
        for k, v in result.items():
            if k in ("score", "overall") or not _is_number(v):
                continue
            comps[str(k)] = as_float(v, f"component '{k}'")
        return total, comps
    return as_float(result), {}


def error_outcome(exc: BaseException) -> Outcome:
    """The Outcome of a reward call that raised: the exception and the innermost frames of its traceback."""
    if isinstance(exc, BadResult):
        return Outcome(None, {}, exc.kind, str(exc))
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-6:])
    return Outcome(None, {}, EXCEPTION, f"{type(exc).__name__}: {exc}\n{tb}".rstrip())


def evaluate(scorer: Callable[[Any], Any], sample: Any) -> Outcome:
    """Call ``scorer(sample)`` and check the result; never raises an Exception (errors become an Outcome). A reward
    that calls ``sys.exit`` is a failure too, not the end of the run."""
    try:
        total, comps = normalize(scorer(sample))
    except Exception as e:  # noqa: BLE001 - isolation is the point
        return error_outcome(e)
    except SystemExit as e:
        return Outcome(None, {}, EXCEPTION, f"the reward called sys.exit({e.code!r})")
    return Outcome(total, comps)


def outcome_of(raw: Any) -> Outcome:
    """Check an already computed raw result (used where the call itself was guarded elsewhere)."""
    try:
        total, comps = normalize(raw)
    except BadResult as e:
        return Outcome(None, {}, e.kind, str(e))
    return Outcome(total, comps)
