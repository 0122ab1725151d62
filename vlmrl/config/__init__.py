"""vlmrl's configuration: the typed schema (``schema``), verl's keys and files (``verl``), config files named on the
command line (``files``), the checks (``checks``), what the workers are told (``plan``), and the one way a config is
made (``command.compose``, which ``load`` calls too):

    argv ──command.parse──▶ config files, overrides ──translate──▶ vlmrl overrides ──Hydra compose──▶ DictConfig
         ──build──▶ VLMRLConfig (types, CHOICES, value checks: ``checks.check_values``)

A key is answered once, here: a vlmrl key is kept; a verl key is aliased, accepted with a notice or refused naming
its feature (``vlmrl.config.verl``); Hydra's own settings are refused (no effect); anything else is unknown and named
with the nearest vlmrl key. This package imports nothing of vlmrl above it.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
from typing import Any

from omegaconf import DictConfig, OmegaConf

from vlmrl.config.schema import (
    CHOICES,
    LOGGERS,
    ActorConfig,
    ActorRolloutRefConfig,
    AlgorithmConfig,
    CustomRewardFunctionConfig,
    DataConfig,
    FilterGroupsConfig,
    FSDPConfig,
    ModelConfig,
    OptimConfig,
    RefConfig,
    RewardConfig,
    RolloutConfig,
    TrainerConfig,
    ValKwargs,
    VLMRLConfig,
)

__all__ = [
    "CHOICES", "LOGGERS", "ActorConfig", "ActorRolloutRefConfig", "AlgorithmConfig", "ConfigError",
    "CustomRewardFunctionConfig", "DataConfig", "FSDPConfig", "FilterGroupsConfig", "ModelConfig", "OptimConfig",
    "RefConfig", "RewardConfig", "RolloutConfig", "TrainerConfig", "Translated", "VLMRLConfig", "ValKwargs",
    "build", "leaf_keys", "load", "nearest_key", "register", "translate", "validate_overrides",
]  # fmt: skip

from vlmrl.config.files import NO_EFFECT, names_hydra  # noqa: E402
from vlmrl.config.verl import Translated  # noqa: E402


class ConfigError(ValueError):
    """A configuration the run cannot start with; the message says how to fix it (every problem, one per line)."""


# mandatory keys (MISSING in the schema) and how to set them
_REQUIRED_HINTS: dict[str, str] = {
    "actor_rollout_ref.model.path": "point it at a Qwen2.5-VL folder or hub id, "
    "e.g. actor_rollout_ref.model.path=Qwen/Qwen2.5-VL-3B-Instruct",
    "data.train_files": "give a parquet file or a list of them (preprocess/ writes them), "
    "e.g. data.train_files=$HOME/data/geo3k/train.parquet",
}

OPEN_DICTS = ("actor_rollout_ref.rollout.engine_kwargs.vllm", "custom_reward_function.reward_kwargs", "reward.dispatch")
"""dict-typed fields: any key below them is valid (passed through and checked by their consumer)."""

_OVERRIDE = re.compile(r"^(\+\+|\+|~)?([^=]+)(=.*)?$", re.DOTALL)


def register() -> None:
    """Register the schema with Hydra's ConfigStore as ``vlmrl_schema``."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="vlmrl_schema", node=VLMRLConfig)


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
    from vlmrl.config import verl

    out = Translated()
    for ov in overrides:
        m = _OVERRIDE.match(ov)
        if ov.startswith("-") or m is None or (m.group(3) is None and m.group(1) != "~"):
            out.overrides.append(ov)
            continue
        prefix, key, rest = m.group(1) or "", m.group(2).strip(), m.group(3) or ""
        if names_hydra(key):
            out.problems.append(f"'{ov}': {NO_EFFECT}.")
        elif _open_dict(key) or _is_schema_key(key):
            out.overrides.append(ov if prefix == "~" else f"++{key}{rest}")
        elif (rule := verl.rule_for(key)) is not None:
            before = len(out.overrides)
            verl.apply(rule, "", key, f"{key}{rest}" if prefix != "~" else ov, out)
            out.overrides[before:] = [o if o.startswith(("+", "~")) else f"++{o}" for o in out.overrides[before:]]
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


def _choice_problems(cfg: VLMRLConfig) -> list[str]:
    from vlmrl.config.verl import VALUE_REASONS

    problems = []
    for key, allowed in CHOICES.items():
        value: Any = cfg
        for part in key.split("."):
            value = getattr(value, part)
        if value not in allowed:
            why = VALUE_REASONS.get((key, value))
            ok = " | ".join(allowed)
            problems.append(f"{key}={value!r}: {why + '; ' if why else ''}use {ok}.")
    return problems


def _normalize_logger(cfg: VLMRLConfig) -> list[str]:
    value = cfg.trainer.logger
    names = [value] if isinstance(value, str) else list(value or [])
    bad = [n for n in names if n not in LOGGERS]
    cfg.trainer.logger = [str(n) for n in names]
    if bad:
        return [f"trainer.logger: {bad} not available; use any of {', '.join(LOGGERS)}."]
    return []


def build(cfg: DictConfig) -> tuple[VLMRLConfig | None, list[str]]:
    """Resolve interpolations, type the config and run every check of values (``checks.check_values``); returns the
    typed config (None when a mandatory key is unset) and every problem found."""
    from vlmrl.config.checks import check_values

    merged = OmegaConf.merge(OmegaConf.structured(VLMRLConfig), cfg)
    missing = sorted(OmegaConf.missing_keys(merged))
    if missing:
        what = "".join(f"\n  {k}: {_REQUIRED_HINTS.get(k, f'set it, e.g. {k}=...')}" for k in missing)
        return None, [f"Required setting(s) not given:{what}"]
    obj = OmegaConf.to_object(merged)
    assert isinstance(obj, VLMRLConfig)
    return obj, _choice_problems(obj) + _normalize_logger(obj) + check_values(obj)


def load(overrides: list[str] | None = None, config_name: str = "grpo") -> VLMRLConfig:
    """The typed, checked config of ``configs/<config_name>.yaml`` with ``overrides``, composed as the command line
    composes it (``vlmrl.config.command``); ConfigError listing every problem."""
    from vlmrl.config.command import Command, compose

    composed = compose(Command(config_name=config_name, overrides=list(overrides or [])))
    if composed.problems or composed.cfg is None:
        raise ConfigError("\n".join(composed.problems))
    return composed.cfg
