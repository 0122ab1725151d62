"""vlmrl.scoring: the machinery that runs reward functions (the functions themselves live in ``rewards/``).

Loading by registry name, ``file.py:fn`` or verl's ``custom_reward_function.path/.name``; both signatures (vlmrl's
``fn(sample)`` and verl's ``compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw)``);
composite weighted and gated rewards; dispatch by ``data_source``; in-process or worker-pool runs with per-call
timeouts and error isolation; per-component metrics. The driver does::

    rm = RewardManager(cfg.reward, cfg.custom_reward_function)
    out = rm.score(samples)          # out.scores, out.components, out.metrics, out.errors (input order)
    rm.close()
"""

from vlmrl.scoring.composite import DEFAULT_DISPATCH, Component, Composite, Dispatch, build_scorer, make_spec
from vlmrl.scoring.loading import (
    REGISTRY,
    Outcome,
    RewardConfigError,
    RewardFn,
    load_file_function,
    make_reward_fn,
    registered_names,
)
from vlmrl.scoring.manager import RewardError, RewardManager, RewardOutput, ScoredPart
from vlmrl.scoring.runner import RewardWorkerError

__all__ = [
    "DEFAULT_DISPATCH",
    "REGISTRY",
    "Component",
    "Composite",
    "Dispatch",
    "Outcome",
    "RewardConfigError",
    "RewardError",
    "RewardFn",
    "RewardManager",
    "RewardOutput",
    "RewardWorkerError",
    "ScoredPart",
    "build_scorer",
    "load_file_function",
    "make_reward_fn",
    "make_spec",
    "registered_names",
]
