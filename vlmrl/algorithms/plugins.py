"""``algorithm.plugins``: the files and modules that register estimators and losses, imported by the driver and
by every worker before the estimator and the loss are looked up (``vlmrl.algorithms`` documents the API)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterable

from vlmrl.algorithms.estimators import ADV_ESTIMATORS
from vlmrl.algorithms.losses import POLICY_LOSSES
from vlmrl.userfiles import import_file

_VERL = "verl.trainer.ppo.core_algos"


def load_plugins(plugins: Iterable[str]) -> list[str]:
    """Import each plugin (a ``.py`` path, or a module name importable from the working directory) once; copy into
    vlmrl's registries what a plugin registered with verl's own decorators. Returns the names the plugins added."""
    added: list[str] = []
    for plugin in plugins:
        before = (set(ADV_ESTIMATORS), set(POLICY_LOSSES))
        module = import_file(plugin) if plugin.endswith(".py") else _import_module(plugin)
        added += sorted(set(ADV_ESTIMATORS) - before[0]) + sorted(set(POLICY_LOSSES) - before[1])
        added += _from_verl(module.__name__)
    return added


def _import_module(name: str):
    """A module by dotted name, the working directory first on the path (a user's package next to their script)."""
    if "" not in sys.path:
        sys.path.insert(0, "")
    return importlib.import_module(name)


def _from_verl(module_name: str) -> list[str]:
    """What ``module_name`` registered with verl's decorators (verl's own built-ins stay out)."""
    verl = sys.modules.get(_VERL)
    if verl is None:
        return []
    added = []
    for theirs, ours in ((verl.ADV_ESTIMATOR_REGISTRY, ADV_ESTIMATORS), (verl.POLICY_LOSS_REGISTRY, POLICY_LOSSES)):
        for name, fn in theirs.items():
            if getattr(fn, "__module__", "") == module_name and name not in ours:
                ours[name] = fn
                added.append(name)
    return added
