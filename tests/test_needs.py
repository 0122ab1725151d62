"""An advantage estimator carries its own needs (``vlmrl.algorithms.estimators.Needs``, declared where it is
registered): the config's checks, the plan and the trainer read the declaration, for a user's estimator as for the
built-ins, and nothing in vlmrl compares an estimator's name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from runs import make_colour_data
from vlmrl.algorithms.estimators import ADV_ESTIMATORS, ESTIMATOR_NEEDS, OWN_CONVENTION, Needs, estimator_needs
from vlmrl.algorithms.ppo import token_advantages
from vlmrl.config import ConfigError, load
from vlmrl.config.plan import critic_enabled, needs_of

REPO = Path(__file__).resolve().parents[1]
PLUGIN = """
from vlmrl.algorithms import Needs, register_adv_est


@register_adv_est("test_grouped", needs=Needs(sequence_level=True, group=True, reads=frozenset()))
def grouped(token_level_rewards, response_mask, index, epsilon=1e-6, config=None, **kwargs):
    scores = token_level_rewards.sum(-1)
    adv = (scores - scores.mean()).unsqueeze(-1) * response_mask
    return adv, adv


@register_adv_est("test_plain")
def plain(token_level_rewards, response_mask, index, epsilon=1e-6, config=None, **kwargs):
    return token_level_rewards, token_level_rewards


@register_adv_est("test_valued", needs=Needs(critic=True))
def valued(token_level_rewards, response_mask, index, values=None, config=None, **kwargs):
    return token_level_rewards - values, token_level_rewards
"""
NAMES = ("test_grouped", "test_plain", "test_valued")


@pytest.fixture
def plugin(tmp_path: Path):
    f = tmp_path / "my_estimators.py"
    f.write_text(PLUGIN)
    yield f
    for name in NAMES:
        ADV_ESTIMATORS.pop(name, None)
        ESTIMATOR_NEEDS.pop(name, None)


def _load(tmp_path: Path, plugin: Path, *extra: str):
    data = make_colour_data(tmp_path / "data")
    base = [
        f"data.train_files={data / 'train.parquet'}",
        f"actor_rollout_ref.model.path={tmp_path}",
        f"algorithm.plugins=[{plugin}]",
    ]
    return load([*base, *extra], config_name="tiny_cpu")


def test_a_user_estimators_declared_group_is_checked_and_an_undeclared_one_is_not(tmp_path, plugin) -> None:
    """``group=True`` makes the config check ask for rollout.n >= 2, as it does for GRPO; an estimator registered
    without needs runs as verl runs it (per token after the forward) and has no such check."""
    with pytest.raises(ConfigError, match=r"algorithm.adv_estimator=test_grouped compares the samples of a prompt"):
        _load(tmp_path, plugin, "algorithm.adv_estimator=test_grouped", "actor_rollout_ref.rollout.n=1")
    cfg = _load(tmp_path, plugin, "algorithm.adv_estimator=test_grouped")
    assert needs_of(cfg) == Needs(sequence_level=True, group=True, reads=frozenset()) and not critic_enabled(cfg)
    plain = _load(tmp_path, plugin, "algorithm.adv_estimator=test_plain", "actor_rollout_ref.rollout.n=1")
    assert needs_of(plain) == Needs() and not needs_of(plain).sequence_level


def test_a_declared_critic_builds_the_critic_and_gets_its_values(tmp_path, plugin) -> None:
    """``critic=True``: the plan builds a critic for the estimator, ``critic.enable=False`` is refused naming it, and
    the estimator is called with the critic's ``values`` (without them the call stops, naming the estimator)."""
    cfg = _load(tmp_path, plugin, "algorithm.adv_estimator=test_valued")
    assert critic_enabled(cfg)
    with pytest.raises(ConfigError, match=r"algorithm.adv_estimator=test_valued needs the critic's values"):
        _load(tmp_path, plugin, "algorithm.adv_estimator=test_valued", "critic.enable=False")
    rewards, mask = torch.tensor([[0.0, 1.0], [0.0, 2.0]]), torch.ones(2, 2)
    values = torch.tensor([[0.5, 0.5], [1.0, 1.0]])
    adv, _ = token_advantages("test_valued", rewards, mask, torch.tensor([0, 0]), values=values)
    torch.testing.assert_close(adv, rewards - values)
    with pytest.raises(ValueError, match="test_valued needs the critic's values"):
        token_advantages("test_valued", rewards, mask, torch.tensor([0, 0]))


def test_a_functions_needs_attribute_declares_for_a_file_estimator(tmp_path: Path) -> None:
    """An estimator named ``file.py:fn`` (not registered) declares its needs as a ``needs`` attribute."""
    f = tmp_path / "est.py"
    body = "    return token_level_rewards, token_level_rewards\n"
    head = "def {}(token_level_rewards, response_mask, **kw):\n"
    f.write_text(
        "from vlmrl.algorithms import Needs\n\n"
        + head.format("fn")
        + body
        + "\nfn.needs = Needs(group=True)\n\n"
        + head.format("bare")
        + body
    )
    assert estimator_needs(f"{f}:fn") == Needs(group=True)
    assert estimator_needs(f"{f}:bare") == Needs()
    with pytest.raises(ValueError, match="unknown"):
        estimator_needs("no_such_estimator")


def test_the_builtins_declare_what_the_trainer_gives_them() -> None:
    """The built-ins' declarations, read as the trainer reads them: GAE (own convention) the critic; ReMax a
    baseline rollout; GDPO the reward components; the optimal-token baselines the policy's probabilities; every
    group-comparing estimator sequence-level; REINFORCE++ per token (its discounting needs the tokens)."""
    assert OWN_CONVENTION["gae"].critic and not any(d.critic for d in ESTIMATOR_NEEDS.values())
    assert [n for n, d in ESTIMATOR_NEEDS.items() if d.baseline_rollout] == ["remax"]
    assert [n for n, d in ESTIMATOR_NEEDS.items() if d.reward_components] == ["gdpo"]
    assert sorted(n for n, d in ESTIMATOR_NEEDS.items() if d.policy_probs) == [
        "optimal_token_baseline",
        "tir_optimal_token_baseline",
    ]
    assert all(d.sequence_level for d in ESTIMATOR_NEEDS.values() if d.group)
    assert not ESTIMATOR_NEEDS["reinforce_plus_plus"].sequence_level and not ESTIMATOR_NEEDS["remax"].group


NAMES_ = "|".join(sorted({*ESTIMATOR_NEEDS, *OWN_CONVENTION}, key=len, reverse=True))
COMPARE = re.compile(
    rf"""(==|!=)\s*["']({NAMES_})["']|["']({NAMES_})["']\s*(==|!=|\bin\b)|adv_estimator\s+(not\s+)?in\b"""
)
"""A built-in estimator's name compared (``== "remax"``, ``"gae" in ...``) or the configured name tested against a
set (``adv_estimator in GROUP``); a lookup of a name in a registry is neither."""


def test_no_estimator_name_is_compared_outside_its_registration() -> None:
    """Config, plan, trainer and workers decide by ``Needs``; the only names are where estimators are registered
    (``vlmrl/algorithms/estimators.py``)."""
    found = []
    for path in sorted((REPO / "vlmrl").rglob("*.py")):
        if path.name == "estimators.py":
            continue
        for no, line in enumerate(path.read_text().splitlines(), 1):
            if COMPARE.search(line.split("#")[0]):
                found.append(f"{path.relative_to(REPO)}:{no}: {line.strip()}")
    assert not found, "\n".join(found)
    # the scan sees what it looks for: the comparisons this replaced
    assert COMPARE.search('remax = cfg.algorithm.adv_estimator == "remax"')
    assert COMPARE.search("if alg.adv_estimator in GROUP_ESTIMATORS and ro.n < 2:")
    assert not COMPARE.search("if estimator in OWN_CONVENTION:")
