"""Finding reward functions (registry name, ``file.py:fn``, ``module:fn``), adapting their signature, checking results.

Two signatures are accepted and told apart by the function's parameters:

* vlmrl's ``fn(sample, **kwargs)``: exactly one required positional parameter, a :class:`vlmrl.batch.RewardSample`.
* verl's ``compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs)``: a parameter named
  ``solution_str`` (or a first parameter named ``data_source``), or three or more required positional parameters.

A function returns a number (the total) or a dict naming components, whose ``score`` (or ``overall``) entry is the
total; non-numeric dict entries are ignored (verl lets them carry strings for logging).

Security: only the launcher's config names what is imported. Nothing read from a dataset row (``data_source``,
``extra_info``) is ever turned into a module or file path; ``data_source`` only selects among functions the config
or the built-in table already named.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import math
import numbers
import os
import sys
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

# name -> "module:function"; modules are imported only when their name is used (clip pulls in transformers)
REGISTRY: dict[str, str] = {
    "format": "vlmrl.rewards.format:format_reward",
    "accuracy": "vlmrl.rewards.accuracy:accuracy_reward",
    "math": "vlmrl.rewards.accuracy:math_reward",
    "choice": "vlmrl.rewards.accuracy:choice_reward",
    "number": "vlmrl.rewards.accuracy:number_reward",
    "iou": "vlmrl.rewards.iou:iou_reward",
    "similarity": "vlmrl.rewards.similarity:similarity_reward",
    "visual_consistency": "vlmrl.rewards.visual:visual_consistency",
    "clip_consistency": "vlmrl.rewards.clip:clip_consistency",
    "length_penalty": "vlmrl.rewards.length:length_penalty",
    "geo3k": "vlmrl.rewards.recipes:geo3k",
    "grounding": "vlmrl.rewards.recipes:grounding",
    "text_visual": "vlmrl.rewards.recipes:text_visual",
    "synthetic": "vlmrl.rewards.synthetic:synthetic_reward",
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


def _import_attr(target: str) -> Callable[..., Any]:
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise RewardConfigError(f"module '{module_name}' has no function '{attr}'") from None


def load_file_function(path: str, name: str = "compute_score") -> Callable[..., Any]:
    """Import ``name`` from the Python file at ``path`` (trusted code named by the launcher).

    The file is imported once per process under a private module name; its folder is appended to ``sys.path`` so a
    reward file can import helpers that sit beside it.
    """
    full = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(full):
        raise RewardConfigError(f"reward file not found: '{path}' (resolved to '{full}', cwd '{os.getcwd()}')")
    digest = hashlib.sha1(full.encode()).hexdigest()[:10]
    stem = "".join(c if c.isalnum() else "_" for c in os.path.splitext(os.path.basename(full))[0])
    mod_name = f"vlmrl_user_reward_{stem}_{digest}"
    module = sys.modules.get(mod_name)
    if module is None:
        folder = os.path.dirname(full)
        if folder not in sys.path:
            sys.path.append(folder)
        spec = importlib.util.spec_from_file_location(mod_name, full)
        if spec is None or spec.loader is None:
            raise RewardConfigError(f"cannot import reward file '{full}'")
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(mod_name, None)
            raise
    fn = getattr(module, name, None)
    if fn is None or not callable(fn):
        found = sorted(k for k, v in vars(module).items() if inspect.isfunction(v) and not k.startswith("_"))
        raise RewardConfigError(f"'{full}' has no function '{name}' (functions there: {found})")
    return fn


def split_spec(spec: str) -> tuple[str, str | None]:
    """Split ``file.py:fn`` / ``module:fn`` into (target, fn name); a bare name or ``file.py`` gives (spec, None)."""
    head, sep, tail = spec.rpartition(":")
    # a Windows drive letter ("C:\\x.py") is not a separator
    if sep and head and len(head) > 1 and tail and "/" not in tail and "\\" not in tail:
        return head, tail
    return spec, None


def resolve_function(spec: str) -> tuple[Callable[..., Any], str]:
    """Turn a registry name, ``path/to/file.py[:fn]`` or ``package.module:fn`` into (function, short name)."""
    if spec in REGISTRY:
        return _import_attr(REGISTRY[spec]), spec
    target, fn_name = split_spec(spec)
    if target.endswith(".py"):
        name = fn_name or "compute_score"
        return load_file_function(target, name), name
    if fn_name:
        try:
            return _import_attr(f"{target}:{fn_name}"), fn_name
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
    target, fn_name = split_spec(spec)
    if target.endswith(".py"):
        target = os.path.abspath(os.path.expanduser(target))
        return f"{target}:{fn_name}" if fn_name else target
    return spec


def detect_style(fn: Callable[..., Any]) -> str:
    """``vlmrl`` for ``fn(sample, **kw)``, ``verl`` for ``compute_score(data_source, solution_str, ...)``."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError) as e:
        raise RewardConfigError(f"cannot read the signature of reward function {fn!r}: {e}") from None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    names = {p.name for p in params}
    if "solution_str" in names or (positional and positional[0].name == "data_source"):
        return "verl"
    required = [p for p in positional if p.default is p.empty]
    if len(required) == 1 and required[0].name in ("reward_input", "reward_inputs"):
        raise RewardConfigError(
            f"{getattr(fn, '__qualname__', fn)!r} looks like an EasyR1 reward (a dict or a batch of dicts); vlmrl "
            "calls fn(sample) with a RewardSample (sample.response, sample.ground_truth, ...) or verl's signature"
        )
    if len(required) == 1:
        return "vlmrl"
    if len(required) >= 3:
        return "verl"
    raise RewardConfigError(
        f"reward function {getattr(fn, '__qualname__', fn)!r} has signature {inspect.signature(fn)}; expected "
        "vlmrl's fn(sample, **kwargs) or verl's compute_score(data_source, solution_str, ground_truth, "
        "extra_info=None, **kwargs)"
    )


@dataclass
class RewardFn:
    """A reward function with its calling convention and bound keyword arguments; call it with a RewardSample."""

    fn: Callable[..., Any]
    name: str
    style: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    needs_images: bool = True
    _verl_keywords: bool = True
    _verl_extra_info: bool = True

    def __call__(self, sample: Any) -> Any:
        if self.style == "vlmrl":
            return self.fn(sample, **self.kwargs)
        if self._verl_keywords:
            call_kw = {"data_source": sample.data_source, "solution_str": sample.response}
            call_kw["ground_truth"] = sample.ground_truth
            if self._verl_extra_info:
                call_kw["extra_info"] = sample.extra_info
            return self.fn(**call_kw, **self.kwargs)
        args = [sample.data_source, sample.response, sample.ground_truth]
        if self._verl_extra_info:
            args.append(sample.extra_info)
        return self.fn(*args, **self.kwargs)

    def describe(self) -> str:
        """One line naming the function and its convention (for logs)."""
        return f"{self.name} ({self.style}-style{', kwargs=' + str(self.kwargs) if self.kwargs else ''})"


def make_reward_fn(
    spec: str | Callable[..., Any], kwargs: Mapping[str, Any] | None = None, name: str | None = None
) -> RewardFn:
    """Load (if ``spec`` is a string) and adapt a reward function; unknown keyword arguments are rejected here.

    ``needs_images`` comes from the function's ``needs_images`` attribute (default True for vlmrl-style functions,
    always False for verl-style ones, which never see images): worker processes are sent images only when needed.
    """
    if isinstance(spec, str):
        fn, short = resolve_function(spec)
    else:
        fn, short = spec, getattr(spec, "__name__", "reward")
    kwargs = dict(kwargs or {})
    style = detect_style(fn)
    sig = inspect.signature(fn)
    params = sig.parameters
    has_var_kw = any(p.kind == p.VAR_KEYWORD for p in params.values())
    out = RewardFn(fn=fn, name=name or short, style=style, kwargs=kwargs)
    if style == "vlmrl":
        out.needs_images = bool(getattr(fn, "needs_images", True))
        try:
            sig.bind(None, **kwargs)
        except TypeError as e:
            raise RewardConfigError(f"reward '{out.name}' does not accept kwargs {sorted(kwargs)}: {e}") from None
        return out
    out.needs_images = False
    out._verl_keywords = all(n in params for n in _VERL_NAMES[:3]) or has_var_kw and "solution_str" in params
    out._verl_extra_info = "extra_info" in params or has_var_kw or not out._verl_keywords and _n_positional(sig) >= 4
    for key in kwargs:
        if key in _VERL_NAMES:
            raise RewardConfigError(f"reward_kwargs may not set '{key}' (vlmrl passes it to '{out.name}')")
        if key not in params and not has_var_kw:
            raise RewardConfigError(f"reward '{out.name}' does not accept keyword '{key}' (signature {sig})")
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
        out = float(value)
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
    """Call ``scorer(sample)`` and check the result; never raises an Exception (errors become an Outcome)."""
    try:
        total, comps = normalize(scorer(sample))
    except Exception as e:  # noqa: BLE001 - isolation is the point
        return error_outcome(e)
    return Outcome(total, comps)


def outcome_of(raw: Any) -> Outcome:
    """Check an already computed raw result (used where the call itself was guarded elsewhere)."""
    try:
        total, comps = normalize(raw)
    except BadResult as e:
        return Outcome(None, {}, e.kind, str(e))
    return Outcome(total, comps)
