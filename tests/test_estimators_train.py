"""Each advantage estimator trains 2 steps through the launch command's code path (``vlmrl.train.main`` in the test's
process: tiny model, one in-process worker, HF rollout): verl's estimators vlmrl added, GDPO over the components of a
reward function's dict, and a user's estimator written for verl's ``@register_adv_est`` signature (run per token,
after the workers' forward)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from runs import base_args, make_colour_data, metrics, train_here_to_end

FAST = (
    "trainer.launcher=inline",
    "actor_rollout_ref.rollout.name=hf",
    "trainer.total_training_steps=2",
    "data.val_files=null",
)

REWARD = """
def colour_and_brevity(data_source, solution_str, ground_truth, extra_info=None):
    right = float(ground_truth.lower() in solution_str.lower())
    short = float(len(solution_str) <= 12)
    return {"score": right + 0.1 * short, "right": right, "short": short}
"""

USER = """
import json
from pathlib import Path

import torch


def length_scaled(token_level_rewards, response_mask, index, epsilon=1e-6, norm_adv_by_std_in_grpo=True,
                  config=None, **kwargs):
    scores = token_level_rewards.sum(-1)
    adv = (scores - scores.mean()).unsqueeze(-1) * response_mask / response_mask.sum(-1, keepdim=True).clamp(min=1)
    Path(__file__).with_name("calls.jsonl").open("a").write(json.dumps({
        "shape": list(token_level_rewards.shape), "groups": len(set(index.tolist())), "gamma": config.gamma}) + "\\n")
    return adv, adv
"""


@pytest.fixture(scope="module")
def colour_data(tmp_path_factory) -> Path:
    return make_colour_data(tmp_path_factory.mktemp("colour"))


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [
        "grpo_vectorized",
        "rloo_vectorized",
        "opo",
        "gpg",
        "grpo_passk",
        "reinforce_plus_plus_baseline",
        "gdpo",
        "remax",
        "optimal_token_baseline",
        "tir_optimal_token_baseline",
    ],
)
def test_each_estimator_trains_two_steps(tiny_model_dir, colour_data, tmp_path, name: str) -> None:
    reward = tmp_path / "reward.py"
    reward.write_text(REWARD)
    extra = [f"custom_reward_function.path={reward}", "custom_reward_function.name=colour_and_brevity"]
    if name == "gdpo":
        extra += ["algorithm.gdpo_reward_keys=[right,short]", "algorithm.gdpo_reward_weights=[1.0,0.5]"]
    out = tmp_path / "run"
    train_here_to_end(base_args(tiny_model_dir, colour_data, out, *FAST, f"algorithm.adv_estimator={name}", *extra))
    rows = metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert math.isfinite(r["actor/pg_loss"]) and math.isfinite(r["advantages/mean"]), r
        assert ("timing/baseline_s" in r) == (name == "remax")  # ReMax's greedy baseline rollout, timed


@pytest.mark.slow
def test_a_users_estimator_in_verls_signature_runs_per_token(tiny_model_dir, colour_data, tmp_path) -> None:
    """``algorithm.adv_estimator=file.py:fn`` written as for verl: called with the step's [B, R] token rewards, the
    prompt ids and the algorithm settings, after the workers' forward."""
    user = tmp_path / "my_est.py"
    user.write_text(USER)
    out = tmp_path / "run"
    est = f"algorithm.adv_estimator={user}:length_scaled"
    train_here_to_end(
        base_args(
            tiny_model_dir,
            colour_data,
            out,
            *FAST,
            est,
            "algorithm.gamma=0.97",
            "data.train_batch_size=4",
            "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        )
    )
    calls = [json.loads(x) for x in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert len(calls) == 2 and all(c["shape"][0] == 16 and c["groups"] == 4 and c["gamma"] == 0.97 for c in calls)
    assert [r["step"] for r in metrics(out)] == [1, 2]
