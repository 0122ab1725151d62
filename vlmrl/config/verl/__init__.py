"""verl's keys that are not vlmrl's own: one table of aliases, notices and refusals (``RULES``), applied to the
command-line overrides before Hydra sees them (``translate``).

A verl launch line passes keys of four kinds, and each gets one answer:

* **alias** — the same setting under another path (``actor_rollout_ref.actor.freeze_vision_tower`` →
  ``actor_rollout_ref.model.freeze_vision_tower``; vLLM engine settings such as ``rollout.max_num_seqs`` →
  ``rollout.engine_kwargs.vllm.max_num_seqs``): rewritten, so the value takes effect.
* **notice** — a switch for speed or memory that vlmrl has no use for (``use_fused_kernels``, ``use_torch_compile``):
  accepted, with one printed line saying what vlmrl does instead.
* **accept** — a setting of a verl feature vlmrl does not implement, at the value that means "off"
  (``algorithm.use_kl_in_reward=False``): accepted (vlmrl behaves so); any other value is refused naming the feature.
* **feature** — a key of a verl feature vlmrl does not implement (Megatron, the critic, the profiler...): refused
  naming the feature.

``keys.txt`` lists every key of verl's own config (scripts/verl_keys.py regenerates it); a key listed there that
no rule covers is refused as "a verl setting vlmrl does not implement", never answered with a "did you mean" towards
an unrelated vlmrl key. A key that is neither vlmrl's nor verl's gets the nearest vlmrl key.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlmrl.config.verl.rules import (  # noqa: F401  (re-exported: the table's names)
    ACCEPT,
    ALIAS,
    DROP,
    FEATURE,
    NOTICE,
    RULES,
    VALUE_REASONS,
    Rule,
)


@functools.cache
def verl_keys() -> frozenset[str]:
    """Every key path of verl's trainer config (``keys.txt`` beside this file)."""
    text = (Path(__file__).with_name("keys.txt")).read_text(encoding="utf-8")
    return frozenset(line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#"))


def rule_for(key: str) -> Rule | None:
    """The first rule whose pattern matches ``key`` (``*`` crosses dots)."""
    for rule in RULES:
        if fnmatch.fnmatchcase(key, rule.pattern):
            return rule
    return None


@dataclass
class Translated:
    """The overrides Hydra gets, the notices to print once, and the problems (every refused override)."""

    overrides: list[str] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def parse_value(override: str) -> Any:
    """The Python value of a ``key=value`` override, parsed as Hydra parses it (``True``, ``null``, ``[a,b]``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_override(override).value()


def render(value: Any) -> str:
    """A value as override text that Hydra parses back to ``value``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):  # Hydra unescapes only backslashes before a quote or at the end of a quoted string
        body = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", value)
        return "'" + re.sub(r"(\\+)$", lambda m: m.group(1) * 2, body) + "'"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(render(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{render(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot render {value!r}")


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _show(values: tuple[Any, ...]) -> str:
    return " | ".join("null" if v is None else repr(v) if isinstance(v, str) else str(v) for v in values)


def group_problems(problems: list[str]) -> list[str]:
    """One line per refused feature: several keys refused for the same reason (a Megatron script sets a dozen
    ``*.megatron.*`` keys) become ``not implemented in vlmrl: <feature>: key, key, ... (N keys)``."""
    marker = ": not implemented in vlmrl: "
    by_reason: dict[str, list[str]] = {}
    order: list[str] = []
    for p in problems:
        if p.startswith("'") and marker in p and " (accepted: " not in p:
            head, reason = p.split(marker, 1)
            if reason not in by_reason:
                order.append(reason)
            by_reason.setdefault(reason, []).append(head.strip("'"))
        else:
            order.append(p)
    out = []
    for item in order:
        keys = by_reason.get(item)
        if keys is None:
            out.append(item)
        elif len(keys) == 1:
            out.append(f"'{keys[0]}'{marker}{item}")
        else:
            shown = ", ".join(keys[:4]) + (", ..." if len(keys) > 4 else "")
            out.append(f"not implemented in vlmrl: {item.rstrip('.')}: {shown} ({len(keys)} keys).")
    return out


def apply(rule: Rule, prefix: str, key: str, override: str, out: Translated) -> None:
    """Answer one override of a key covered by ``rule`` (appending to ``out``)."""
    if rule.kind == FEATURE:
        out.problems.append(f"'{key}': not implemented in vlmrl: {rule.why}.")
        return
    if rule.kind == NOTICE:
        out.notices.append(f"{override.lstrip('+~')}: accepted with no effect ({rule.why}).")
        return
    try:
        value = parse_value(override.lstrip("+")) if "=" in override else None
    except Exception as e:  # noqa: BLE001 - Hydra's grammar errors: say which override
        out.problems.append(f"'{override}': cannot parse the value ({e}).")
        return
    if rule.kind == ACCEPT:
        if not any(_same(value, v) for v in rule.values):
            out.problems.append(
                f"'{key}={render(value)}': not implemented in vlmrl: {rule.why} (accepted: {_show(rule.values)})."
            )
        return
    assert rule.kind == ALIAS and rule.target is not None
    if rule.mapping is not None:
        hit = [v for k, v in rule.mapping.items() if _same(value, k)]
        if not hit:
            out.problems.append(
                f"'{key}={render(value)}': vlmrl implements only {_show(tuple(rule.mapping))} here (as {rule.target})."
            )
            return
        if hit[0] is DROP:
            return
        value = hit[0]
        out.overrides.append(f"{prefix}{rule.target}={render(value)}")
        return
    out.overrides.append(f"{prefix}{rule.target}={override.split('=', 1)[1]}" if "=" in override else override)
