"""Composite rewards (weighted, gated components), dispatch by ``data_source``, and building the scorer from config.

Selection (first that applies), for every sample whose ``data_source`` no ``reward.dispatch`` entry claims:

1. ``custom_reward_function.path`` set: that file's function (``.name``, default ``compute_score``), called with
   ``custom_reward_function.reward_kwargs``;
2. ``reward.components`` non-empty: the composite of those components;
3. ``reward.function`` set: a registry name, ``file.py:fn`` or ``package.module:fn``, called with ``reward_kwargs``;
4. otherwise the built-in default dispatch (as verl's ``default_compute_score``): ``geo3k`` /
   ``hiyouga/geometry3k`` -> ``geo3k``; ``synthetic/*`` -> ``synthetic``; anything else is a configuration error.

``reward.dispatch`` maps a ``data_source`` (exact, or a glob such as ``synthetic/*``) to a function spec string,
``{function, kwargs}`` or ``{components: [...]}``; exact keys win over globs, globs are tried in config order.

A component is ``{function, weight=1.0, kwargs={}, gate=None, gate_threshold=0.5, name=<function's name>}``. The
total is ``sum(weight * value)`` over components whose gate passed: a component with ``gate: format`` contributes only
when the component named ``format`` scored at least ``gate_threshold``. Gating accuracy on format stops a policy from
collecting accuracy reward with unparseable or tag-less answers (format gaming) while the raw accuracy is still
logged. Every component value is reported (``components[name]``); dict-valued components add ``name/<key>`` entries.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from vlmrl.scoring.loading import (
    BadResult,
    RewardConfigError,
    RewardFn,
    absolutize_spec,
    make_reward_fn,
    normalize,
    registered_names,
)

# built-in data_source -> registry name, used when the config names no function (like verl's default_compute_score)
DEFAULT_DISPATCH: dict[str, str] = {
    "geo3k": "geo3k",
    "hiyouga/geometry3k": "geo3k",
    "synthetic": "synthetic",
    "synthetic/*": "synthetic",
}

_COMPONENT_KEYS = ("function", "weight", "kwargs", "gate", "gate_threshold", "name")


@dataclass
class Component:
    """One weighted term of a composite reward."""

    name: str
    fn: Callable[[Any], Any]
    weight: float = 1.0
    gate: str | None = None
    gate_threshold: float = 0.5


class Composite:
    """Weighted sum of components with optional gates; returns ``{"score": total, <name>: value, ...}``."""

    def __init__(self, components: list[Component]) -> None:
        if not components:
            raise RewardConfigError("a composite reward needs at least one component")
        names = [c.name for c in components]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise RewardConfigError(f"reward components share names {dupes}: give each a distinct 'name'")
        for c in components:
            if c.gate is not None and c.gate not in names:
                raise RewardConfigError(
                    f"component '{c.name}' is gated on '{c.gate}', which is not a component {names}"
                )
            if c.gate == c.name:
                raise RewardConfigError(f"component '{c.name}' cannot gate itself")
        self.components = components
        self.needs_images = any(getattr(c.fn, "needs_images", True) for c in components)

    def __call__(self, sample: Any) -> dict[str, float]:
        values: dict[str, float] = {}
        out: dict[str, float] = {}
        for c in self.components:
            try:
                value, sub = normalize(c.fn(sample))
            except BadResult as e:
                raise BadResult(e.kind, f"component '{c.name}': {e}") from None
            values[c.name] = value
            out[c.name] = value
            for key, v in sub.items():
                out[f"{c.name}/{key}"] = v
        total = 0.0
        for c in self.components:
            if c.gate is None or values[c.gate] >= c.gate_threshold:
                total += c.weight * values[c.name]
        out["score"] = total
        return out

    def describe(self) -> str:
        """One line: the components, their weights and gates."""
        parts = []
        for c in self.components:
            gate = f" if {c.gate}>={c.gate_threshold:g}" if c.gate else ""
            parts.append(f"{c.weight:g}*{c.name}{gate}")
        return "composite(" + " + ".join(parts) + ")"


def build_component(entry: Any, index: int) -> Component:
    """A Component from its config mapping; unknown keys are an error naming the nearest valid one."""
    if isinstance(entry, str):
        entry = {"function": entry}
    if not isinstance(entry, Mapping):
        raise RewardConfigError(
            f"reward.components[{index}] must be a mapping {{function, weight, ...}}, got {entry!r}"
        )
    for key in entry:
        if key not in _COMPONENT_KEYS:
            near = difflib.get_close_matches(str(key), _COMPONENT_KEYS, n=1)
            hint = f" (did you mean '{near[0]}'?)" if near else ""
            raise RewardConfigError(f"reward.components[{index}]: unknown key '{key}'{hint}; valid: {_COMPONENT_KEYS}")
    if not entry.get("function"):
        raise RewardConfigError(f"reward.components[{index}] needs a 'function' (one of {registered_names()})")
    fn = make_reward_fn(str(entry["function"]), entry.get("kwargs") or {})
    try:
        weight = float(entry.get("weight", 1.0))
        threshold = float(entry.get("gate_threshold", 0.5))
    except (TypeError, ValueError):
        raise RewardConfigError(f"reward.components[{index}]: weight and gate_threshold must be numbers") from None
    return Component(
        name=str(entry.get("name") or fn.name),
        fn=fn,
        weight=weight,
        gate=None if entry.get("gate") is None else str(entry["gate"]),
        gate_threshold=threshold,
    )


def build_composite(entries: list[Any]) -> Composite:
    """A Composite from the ``reward.components`` list."""
    return Composite([build_component(e, i) for i, e in enumerate(entries)])


def _build_entry(value: Any, where: str) -> Callable[[Any], Any]:
    if isinstance(value, str):
        return make_reward_fn(value)
    if isinstance(value, Mapping):
        if value.get("components"):
            return build_composite(list(value["components"]))
        if value.get("function"):
            extra = set(value) - {"function", "kwargs"}
            if extra:
                raise RewardConfigError(f"{where}: unknown keys {sorted(extra)} (use function, kwargs or components)")
            return make_reward_fn(str(value["function"]), value.get("kwargs") or {})
    raise RewardConfigError(f"{where}: expected a function name, {{function, kwargs}} or {{components}}, got {value!r}")


class Dispatch:
    """Routes each sample to a scorer by its ``data_source``; the top-level scorer the manager calls."""

    def __init__(
        self,
        routes: list[tuple[str, Callable[[Any], Any]]],
        fallback: Callable[[Any], Any] | None,
        uses_default: bool = False,
    ) -> None:
        self.exact = {pattern: fn for pattern, fn in routes if not _is_glob(pattern)}
        self.globs = [(pattern, fn) for pattern, fn in routes if _is_glob(pattern)]
        self.fallback = fallback
        self.uses_default = uses_default
        self._cache: dict[str, Callable[[Any], Any]] = {}
        scorers = [fn for _, fn in routes] + ([fallback] if fallback is not None else [])
        self.needs_images = any(getattr(fn, "needs_images", True) for fn in scorers)

    def route(self, data_source: str) -> Callable[[Any], Any]:
        """The scorer for ``data_source``, or RewardConfigError when none is configured."""
        hit = self._cache.get(data_source)
        if hit is not None:
            return hit
        fn = self.exact.get(data_source)
        if fn is None:
            fn = next((f for pattern, f in self.globs if fnmatch.fnmatchcase(data_source, pattern)), None)
        if fn is None:
            fn = self.fallback
        if fn is None:
            raise RewardConfigError(self._no_route_message(data_source))
        self._cache[data_source] = fn
        return fn

    def _no_route_message(self, data_source: str) -> str:
        known = sorted(self.exact) + [p for p, _ in self.globs]
        return (
            f"no reward function for data_source '{data_source}' (configured data sources: {known}). Set one of: "
            "custom_reward_function.path=my_reward.py custom_reward_function.name=compute_score (verl's keys); "
            f"reward.function=<name> with a registered name ({', '.join(registered_names())}) or file.py:fn; "
            f"or reward.dispatch entry '{data_source}: <name>'"
        )

    def check(self, data_sources: set[str]) -> None:
        """Raise RewardConfigError if any of these data sources has no scorer (before any call is made)."""
        for ds in data_sources:
            self.route(ds)

    def __call__(self, sample: Any) -> Any:
        return self.route(sample.data_source)(sample)

    def describe(self) -> str:
        """Readable summary of the routing table."""

        def name(fn: Callable[[Any], Any]) -> str:
            return fn.describe() if hasattr(fn, "describe") else repr(fn)

        parts = [f"{p} -> {name(f)}" for p, f in list(self.exact.items()) + self.globs]
        if self.fallback is not None:
            parts.append(f"* -> {name(self.fallback)}")
        return "; ".join(parts) + (" (built-in default dispatch)" if self.uses_default else "")


def _is_glob(pattern: str) -> bool:
    return any(ch in pattern for ch in "*?[")


def _plain(obj: Any) -> Any:
    """Config objects (dataclass, DictConfig, ListConfig) as plain Python containers."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(obj, DictConfig | ListConfig):
        return OmegaConf.to_container(obj, resolve=True)
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    return obj


def _absolutize(value: Any) -> Any:
    """Make every ``file.py`` reference inside a function spec absolute (workers may run elsewhere)."""
    if isinstance(value, str):
        return absolutize_spec(value)
    if isinstance(value, dict):
        out = dict(value)
        if isinstance(out.get("function"), str):
            out["function"] = absolutize_spec(out["function"])
        if isinstance(out.get("components"), list):
            out["components"] = [_absolutize(c) for c in out["components"]]
        return out
    return value


def make_spec(reward_cfg: Any, custom_cfg: Any = None) -> dict[str, Any]:
    """A picklable description of the reward selection (what worker processes rebuild the scorer from)."""
    reward = _plain(reward_cfg) if reward_cfg is not None else {}
    custom = _plain(custom_cfg) if custom_cfg is not None else {}
    path = custom.get("path")
    spec = {
        "function": _absolutize(reward.get("function")) if reward.get("function") else None,
        "components": [_absolutize(c) for c in (reward.get("components") or [])],
        "dispatch": {str(k): _absolutize(v) for k, v in (reward.get("dispatch") or {}).items()},
        "path": absolutize_spec(str(path)) if path else None,
        "name": custom.get("name") or "compute_score",
        "reward_kwargs": dict(custom.get("reward_kwargs") or {}),
    }
    return spec


def build_scorer(spec: dict[str, Any]) -> Dispatch:
    """Build the top-level scorer from :func:`make_spec`'s output (in the driver and again in each worker)."""
    kwargs = spec.get("reward_kwargs") or {}
    main: Callable[[Any], Any] | None = None
    if spec.get("path"):
        main = make_reward_fn(f"{spec['path']}:{spec.get('name') or 'compute_score'}", kwargs)
    elif spec.get("components"):
        if kwargs:
            raise RewardConfigError(
                "custom_reward_function.reward_kwargs applies to custom_reward_function.path or reward.function; "
                "give a component its arguments in reward.components[i].kwargs"
            )
        main = build_composite(spec["components"])
    elif spec.get("function"):
        main = make_reward_fn(spec["function"], kwargs)
    routes = [(ds, _build_entry(v, f"reward.dispatch['{ds}']")) for ds, v in (spec.get("dispatch") or {}).items()]
    if main is not None:
        return Dispatch(routes, main)
    built: dict[str, RewardFn] = {}
    for ds, name in DEFAULT_DISPATCH.items():
        if ds not in dict(routes):
            built.setdefault(name, make_reward_fn(name))
            routes.append((ds, built[name]))
    return Dispatch(routes, None, uses_default=True)
