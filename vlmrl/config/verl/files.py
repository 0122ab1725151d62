"""verl's config files and launch-script arguments, as vlmrl reads them.

* ``--config-name=ppo_trainer`` is verl's own trainer config: vlmrl's ``grpo`` config stands for it; its Megatron
  counterpart is refused naming the feature (``VERL_CONFIGS``).
* A config file built on it (``defaults: [ppo_trainer, _self_]``, as verl's multi-turn examples ship) is read as
  overrides that come before the command line's (:func:`read_config_file`), so each of its keys gets the same answer
  as on the command line and the command line wins. It is settings only: a key that would reach Hydra's own config
  or that is override syntax is refused (:func:`file_problems`); its ``hydra.searchpath``, which points Hydra at
  verl's configs, is dropped with a notice.
* verl's example scripts read their engine from ``$1`` and pass ``$@`` on, so the engine name reaches the trainer as
  a bare word (:func:`bare_engine_args`).
"""

from __future__ import annotations

import re
from typing import Any

from vlmrl.config.files import NO_EFFECT, defaults_entries, names_hydra
from vlmrl.config.verl import render

VERL_CONFIGS = {
    "ppo_trainer": None,
    "ppo_megatron_trainer": "the Megatron-LM backend (vlmrl trains with FSDP2)",
    "one_step_off_ppo_megatron_trainer": "the Megatron-LM backend (vlmrl trains with FSDP2)",
    "fully_async_ppo_megatron_trainer": "the Megatron-LM backend (vlmrl trains with FSDP2)",
}
"""verl's own top-level config names: ppo_trainer is what vlmrl's grpo config stands for; the others are refused."""

VERL_TRAINER_CONFIGS = {
    "ppo_trainer": "grpo",
    "one_step_off_ppo_trainer": "one_step_off_ppo_trainer",
    "fully_async_ppo_trainer": "fully_async_ppo_trainer",
}
"""verl's configs that vlmrl has a counterpart of in its ``configs/``: a script's ``--config-path=config
--config-name=<verl's>`` (verl's package folder, not the script's) composes vlmrl's."""

_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)*$")
"""A setting's name in a config file: letters, digits, ``_`` and ``-``, dotted parts allowed (``a.b: 1``)."""


def flatten(doc: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """The leaves of a nested mapping as (dotted key, value); lists are values."""
    out: list[tuple[str, Any]] = []
    for k, v in doc.items():
        key = f"{prefix}{k}"
        out += flatten(v, key + ".") if isinstance(v, dict) and v else [(key, v)]
    return out


def verl_parents(doc: dict[str, Any]) -> tuple[set[str], set[str]]:
    """(the verl configs a config file's defaults build on, its other defaults entries but ``_self_``)."""
    entries = {e.split(":")[0].strip() for e in defaults_entries(doc.get("defaults"))}
    return entries & set(VERL_CONFIGS), entries - set(VERL_CONFIGS) - {"_self_"}


def file_problems(doc: dict[str, Any], where: str) -> list[str]:
    """Keys of a verl config file that are not settings: any that would reach Hydra's own config (its ``hydra:``
    section but ``searchpath``, ``+hydra...``, a ``hydra/`` defaults entry), and any key that is not a setting's name
    (``+x``, ``a=b``, ``x/y``: override syntax, not data)."""
    problems = [
        f"{where}: its defaults entry '{e}' names Hydra's own config; {NO_EFFECT}."
        for e in defaults_entries(doc.get("defaults"))
        if names_hydra(e)
    ]

    def walk(node: dict[Any, Any], path: str) -> None:
        for k, v in node.items():
            key = f"{path}{k}"
            if not path and k == "defaults":
                continue
            if not path and k == "hydra" and isinstance(v, dict):
                problems.extend(
                    f"{where}: 'hydra.{sub}' would set Hydra's own config; {NO_EFFECT}."
                    for sub in v
                    if sub != "searchpath"
                )
            elif names_hydra(k) and not path:
                problems.append(f"{where}: '{k}' would set Hydra's own config; {NO_EFFECT}.")
            elif not _PLAIN_KEY.match(str(k)):
                problems.append(f"{where}: '{key}' is not a setting's name (letters, digits, _ and -, dotted).")
            elif isinstance(v, dict):
                walk(v, key + ".")

    walk(doc, "")
    return problems


def read_config_file(doc: dict[str, Any], name: str, file: str) -> tuple[list[str], list[str], list[str]]:
    """A verl config file built on ``ppo_trainer`` as (overrides to put before the command line's, problems,
    notices)."""
    where = f"--config-name={name} ({file})"
    if bad := file_problems(doc, where):
        return [], bad, []
    parents, others = verl_parents(doc)
    for parent in sorted(parents):
        if VERL_CONFIGS[parent]:
            why = VERL_CONFIGS[parent]
            return [], [f"{where} builds on verl's {parent} config; not implemented in vlmrl: {why}."], []
    if others:
        return (
            [],
            [
                f"{where}: its defaults {sorted(others)} are verl config groups vlmrl does not have; pass their "
                "settings as key=value overrides."
            ],
            [],
        )
    leaves = flatten({k: v for k, v in doc.items() if k not in ("defaults", "hydra")})
    notes = [
        f"--config-name={name}: verl's config file {file} read as {len(leaves)} override(s) on vlmrl's grpo "
        "config (the command line's come after it and win)."
    ]
    if "searchpath" in (doc.get("hydra") or {}):
        notes.append(
            f"{where}: its hydra.searchpath points Hydra at verl's own configs; vlmrl's grpo config stands "
            "for them, so it is not used."
        )
    return [f"{k}={render(v)}" for k, v in leaves], [], notes


def bare_engine_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """Drop a bare word equal to the line's ``actor_rollout_ref.rollout.name`` (verl's scripts pass their ENGINE
    argument on to the trainer), with a notice; returns (the arguments left, notices). Any other bare word stays."""
    engines = {
        a.split("=", 1)[1].strip("'\"") for a in argv if a.lstrip("+").startswith("actor_rollout_ref.rollout.name=")
    }
    out, notices = [], []
    for a in argv:
        if "=" not in a and not a.startswith("-") and a in engines:
            notices.append(
                f"'{a}': a bare argument equal to actor_rollout_ref.rollout.name (verl's scripts pass "
                "their ENGINE argument on to the trainer): ignored."
            )
            continue
        out.append(a)
    return out, notices
