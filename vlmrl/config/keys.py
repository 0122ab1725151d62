"""Keys of the command line: each override answered once (``translate``): a vlmrl key is kept, a verl key is
aliased, accepted with a notice or refused naming its feature (``vlmrl.config.verl``), Hydra's own settings are
refused (no effect: ``vlmrl.config.files``), anything else is unknown and named with the nearest vlmrl key."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re

from vlmrl.config import verl
from vlmrl.config.errors import ConfigError
from vlmrl.config.files import NO_EFFECT, names_hydra
from vlmrl.config.schema import VLMRLConfig
from vlmrl.config.verl import Translated

OPEN_DICTS = (
    "actor_rollout_ref.rollout.engine_kwargs.vllm",
    "custom_reward_function.reward_kwargs",
    "reward.dispatch",
    "algorithm.params",
)
"""dict-typed fields: any key below them is valid (passed through and checked by their consumer)."""

_OVERRIDE = re.compile(r"^(\+\+|\+|~)?([^=]+)(=.*)?$", re.DOTALL)


def leaf_keys(cls: type = VLMRLConfig, prefix: str = "") -> list[str]:
    """All dotted leaf key paths of a config dataclass."""
    return list(_leaf_keys(cls, prefix))


@functools.cache
def _leaf_keys(cls: type, prefix: str) -> tuple[str, ...]:
    import typing

    hints = typing.get_type_hints(cls)
    out: list[str] = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        sub = hints.get(f.name)
        if dataclasses.is_dataclass(sub):
            out.extend(_leaf_keys(sub, key + "."))
        else:
            out.append(key)
    return tuple(out)


def nearest_key(key: str) -> str | None:
    """The vlmrl key closest to ``key``: by the full path, or by its last part within the same section; None when
    nothing is close enough to be a likely misspelling."""
    keys = leaf_keys() + list(OPEN_DICTS)
    hit = difflib.get_close_matches(key, keys, n=1, cutoff=0.8)
    if hit:
        return hit[0]
    section, _, last = key.rpartition(".")
    same_section = {k.rsplit(".", 1)[-1]: k for k in keys if k.rpartition(".")[0] == section}
    hit = difflib.get_close_matches(last, list(same_section), n=1, cutoff=0.75)
    return same_section[hit[0]] if hit else None


SCALAR_FOR_GROUP = {"actor_rollout_ref.actor.policy_loss": "actor_rollout_ref.actor.policy_loss.loss_mode"}
"""vlmrl keys that once took a scalar and are now groups, and the group key a scalar given to them means."""


def _is_schema_key(key: str) -> bool:
    valid = _leaf_keys(VLMRLConfig, "")
    return key in valid or any(v.startswith(key + ".") for v in valid)  # a group given a whole dict is fine too


def _open_dict(key: str) -> bool:
    return any(key == d or key.startswith(d + ".") for d in OPEN_DICTS)


def translate(overrides: list[str]) -> Translated:
    """Answer every ``key=value`` override (arguments starting with ``-`` pass through untouched): Hydra's own
    settings (``hydra.*``) are refused (they have no effect: ``vlmrl.config.files``); vlmrl keys are kept (``+key``
    on a schema key becomes ``++key``, a key below an open dict becomes ``++key``); verl keys follow
    ``vlmrl.config.verl.rules.RULES``; unknown keys are problems naming the nearest vlmrl key."""
    out = Translated()
    for ov in overrides:
        m = _OVERRIDE.match(ov)
        if ov.startswith("-") or m is None or (m.group(3) is None and m.group(1) != "~"):
            out.overrides.append(ov)
            continue
        prefix, key, rest = m.group(1) or "", m.group(2).strip(), m.group(3) or ""
        if names_hydra(key):
            out.problems.append(f"'{ov}': {NO_EFFECT}.")
        elif key in SCALAR_FOR_GROUP and prefix != "~" and not rest.lstrip("=").lstrip().startswith("{"):
            # an older key that became a group: its value goes to the group's key that took its place
            out.overrides.append(f"++{SCALAR_FOR_GROUP[key]}{rest}")
        elif _open_dict(key) or _is_schema_key(key):
            out.overrides.append(ov if prefix == "~" else f"++{key}{rest}")
        elif (rule := verl.rule_for(key)) is not None:
            before = len(out.overrides)
            verl.apply(rule, "", key, f"{key}{rest}" if prefix != "~" else ov, out)
            out.overrides[before:] = [o if o.startswith(("+", "~")) else f"++{o}" for o in out.overrides[before:]]
        elif key.startswith("algorithm.") and key.count(".") == 1:
            # a key the schema does not know under algorithm: an argument of algorithm.name's class (checked later:
            # without a class it is an unknown key)
            out.overrides.append(
                f"~algorithm.params.{key[10:]}" if prefix == "~" else f"++algorithm.params.{key[10:]}{rest}"
            )
        elif key in verl.verl_keys() or any(k.startswith(key + ".") for k in verl.verl_keys()):
            out.problems.append(f"'{key}': not implemented in vlmrl: a verl setting vlmrl has no counterpart for.")
        else:
            near = nearest_key(key)
            hint = f" Did you mean '{near}'?" if near else ""
            out.problems.append(f"Unknown config key '{key}'.{hint} (every key: vlmrl/config/schema.py)")
    out.problems = verl.group_problems(out.problems)
    return out


def validate_overrides(overrides: list[str]) -> Translated:
    """``translate``, raising ConfigError listing every problem."""
    t = translate(overrides)
    if t.problems:
        raise ConfigError("\n".join(t.problems))
    return t
