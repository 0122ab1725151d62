"""The public API for algorithms of your own: a class with step hooks (``RLAlgorithm``, named by ``algorithm.name``;
``vlmrl.algos.algorithm`` documents the hooks and their data) and verl's registries, drop-in.

A file written for verl 0.9.1's registries works with one import line changed::

    from vlmrl.algorithms import agg_loss, register_adv_est, register_policy_loss   # was: verl.trainer.ppo.core_algos

    @register_policy_loss("my_clip")
    def my_clip(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
                rollout_is_weights=None):
        ...
        return loss, {"actor/my_metric": value}

and is named in the config with the file that registers it::

    algorithm.plugins=[my_algos.py] actor_rollout_ref.actor.policy_loss.loss_mode=my_clip

``algorithm.plugins`` lists Python files (or modules importable from the working directory) imported by the driver
and by every worker before the estimator and the loss are looked up; their decorators add the names. Where verl
itself is installed, a file that keeps verl's own decorators works too: what it registers into verl's registries is
copied into vlmrl's. Estimators and losses are called as verl calls them (``vlmrl.algos.estimators`` and
``vlmrl.algos.losses`` describe the arguments).

An estimator declares what it needs from the run where it is registered (verl's trainer decides by the name)::

    from vlmrl.algorithms import Needs, register_adv_est

    @register_adv_est("my_group_baseline", needs=Needs(sequence_level=True, group=True))
    def my_group_baseline(token_level_rewards, response_mask, index, epsilon=1e-6, config=None, **kwargs):
        ...

(one advantage per sample from the scores, computed before any log-prob; ``rollout.n >= 2`` checked). Without
``needs`` an estimator runs as verl runs it: per token after the workers' forward. ``Needs`` lists the rest: a
critic's values, a greedy baseline rollout, the policy's old probabilities, the reward components.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterable

from vlmrl.algos.algorithm import AlgorithmError, RLAlgorithm
from vlmrl.algos.core import masked_mean
from vlmrl.algos.estimators import (
    ADV_ESTIMATORS,
    EstimatorConfig,
    Needs,
    get_adv_estimator_fn,
    masked_whiten,
    register_adv_est,
)
from vlmrl.algos.losses import POLICY_LOSSES, LossConfig, agg_loss, get_policy_loss, register_policy_loss
from vlmrl.userfiles import import_file

__all__ = [
    "AlgorithmError",
    "EstimatorConfig",
    "LossConfig",
    "agg_loss",
    "get_adv_estimator_fn",
    "get_policy_loss",
    "get_policy_loss_fn",
    "load_plugins",
    "masked_mean",
    "masked_whiten",
    "Needs",
    "RLAlgorithm",
    "register_adv_est",
    "register_policy_loss",
]

get_policy_loss_fn = get_policy_loss
"""verl's name of ``get_policy_loss``."""

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
