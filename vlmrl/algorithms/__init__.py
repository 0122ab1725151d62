"""The public API for algorithms of your own: a class with step hooks (``RLAlgorithm``, named by ``algorithm.name``;
``vlmrl.algorithms.algorithm`` documents the hooks and their data) and verl's registries, drop-in.

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
copied into vlmrl's. Estimators and losses are called as verl calls them (``vlmrl.algorithms.estimators`` and
``vlmrl.algorithms.losses`` describe the arguments).

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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # (what the names below are, for readers and type checkers; at run time they load on first use)
    from vlmrl.algorithms.algorithm import AlgorithmError, RLAlgorithm
    from vlmrl.algorithms.core import masked_mean
    from vlmrl.algorithms.estimators import (
        ADV_ESTIMATORS,
        EstimatorConfig,
        Needs,
        get_adv_estimator_fn,
        masked_whiten,
        register_adv_est,
    )
    from vlmrl.algorithms.losses import POLICY_LOSSES, LossConfig, agg_loss, get_policy_loss, register_policy_loss
    from vlmrl.algorithms.plugins import load_plugins

_API = {
    "AlgorithmError": ("algorithm", "AlgorithmError"),
    "RLAlgorithm": ("algorithm", "RLAlgorithm"),
    "masked_mean": ("core", "masked_mean"),
    "ADV_ESTIMATORS": ("estimators", "ADV_ESTIMATORS"),
    "EstimatorConfig": ("estimators", "EstimatorConfig"),
    "Needs": ("estimators", "Needs"),
    "get_adv_estimator_fn": ("estimators", "get_adv_estimator_fn"),
    "masked_whiten": ("estimators", "masked_whiten"),
    "register_adv_est": ("estimators", "register_adv_est"),
    "POLICY_LOSSES": ("losses", "POLICY_LOSSES"),
    "LossConfig": ("losses", "LossConfig"),
    "agg_loss": ("losses", "agg_loss"),
    "get_policy_loss": ("losses", "get_policy_loss"),
    "get_policy_loss_fn": ("losses", "get_policy_loss"),  # verl's name of get_policy_loss
    "register_policy_loss": ("losses", "register_policy_loss"),
    "load_plugins": ("plugins", "load_plugins"),
}
"""The public names -> (module of this package, name there). They load on first use, so that importing one module of
the package (the config's ``loss_settings``, which holds no torch) does not load torch."""

__all__ = [
    "ADV_ESTIMATORS",
    "AlgorithmError",
    "EstimatorConfig",
    "LossConfig",
    "Needs",
    "POLICY_LOSSES",
    "RLAlgorithm",
    "agg_loss",
    "get_adv_estimator_fn",
    "get_policy_loss",
    "get_policy_loss_fn",
    "load_plugins",
    "masked_mean",
    "masked_whiten",
    "register_adv_est",
    "register_policy_loss",
]


def __getattr__(name: str) -> Any:
    """The public name ``name``, imported from its module on first use (PEP 562)."""
    if name not in _API:
        raise AttributeError(f"module 'vlmrl.algorithms' has no attribute {name!r}")
    module, attr = _API[name]
    value = getattr(importlib.import_module(f"vlmrl.algorithms.{module}"), attr)
    globals()[name] = value
    return value
