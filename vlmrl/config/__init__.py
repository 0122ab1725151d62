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

from vlmrl.config.command import build, load, register
from vlmrl.config.errors import ConfigError
from vlmrl.config.keys import OPEN_DICTS, leaf_keys, nearest_key, translate, validate_overrides
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
from vlmrl.config.verl import Translated

__all__ = [
    "CHOICES",
    "LOGGERS",
    "OPEN_DICTS",
    "ActorConfig",
    "ActorRolloutRefConfig",
    "AlgorithmConfig",
    "ConfigError",
    "CustomRewardFunctionConfig",
    "DataConfig",
    "FSDPConfig",
    "FilterGroupsConfig",
    "ModelConfig",
    "OptimConfig",
    "RefConfig",
    "RewardConfig",
    "RolloutConfig",
    "TrainerConfig",
    "Translated",
    "VLMRLConfig",
    "ValKwargs",
    "build",
    "leaf_keys",
    "load",
    "nearest_key",
    "register",
    "translate",
    "validate_overrides",
]
