"""RL from a learned reward, end to end on CPU, as a user runs it: ``bash examples/reward_model_cpu.sh`` (the
colour task's records with candidate answers labelled by the task's rule, ``python -m vlmrl.reward_model.train`` on
them, then the quick start's pipeline whose only reward is that model's score). The rule the reward model learned from
is logged with weight 0: the greedy validation by it is how the test (and the README) measure that the policy learned
the task and not an exploit of the model."""

from __future__ import annotations

import json
import math

import pytest

from runs import colour_data_dir, metrics, run_example

pytestmark = pytest.mark.slow


def test_grpo_on_a_learned_reward_alone_learns_the_colour_task(tmp_path):
    """The reward model reaches a held-out pair accuracy of at least 0.9; GRPO on its score alone (no rule reward:
    the rule's weight is 0) answers the colour right on at least 0.9 of the validation images at one of its
    validations (steps 40 and 80) and on at least 0.6 at step 80 (no exploit: an exploited model's rule check falls
    to 0), while validation before training is at most 0.05; the model's score rises with it. The test stops the
    recipe's 160 steps at 80 (``trainer.total_training_steps=80``, a Hydra override as a user passes one; the
    learning rate is constant, so the curve to step 80 is the full run's) to keep the suite within its budget. Seed 1
    (the reward model's and the run's, as the script sets): on some seeds the tiny policy settles on two of the
    three colours whichever reward it gets (the README's figures are over 3 seeds, with the rule-rewarded run beside
    them), and a test needs one that does not. One seed's curve moves with any change to the numbers (measured: 1.00
    at steps 120 and 160 on 2026-11-26; 1.00 at 80 and 120, 0.84 at 160 after the model-family work; 0.33 at 40,
    1.00 at 80 and 120 on 2026-11-29): the test asks that the policy learns the task and keeps it, not a value at
    one step."""
    out = tmp_path / "reward_model"
    data = colour_data_dir()  # the quick start's, which the GRPO run would make
    log = run_example(
        "reward_model_cpu.sh", out, "trainer.total_training_steps=80", timeout=1500, QUICKSTART_DATA=str(data)
    )
    assert "[reward_model] step 600/600" in log and (out / "reward_model" / "model.safetensors").is_file()
    trained = json.loads((out / "reward_model" / "vlmrl_reward_model.json").read_text())
    assert trained["heldout_pair_accuracy"] >= 0.9 and trained["heldout_pairs"] == 96, trained
    # the Bradley-Terry loss falls from log 2; the folder holds the score head, not the language-model head
    assert trained["first_loss"] == pytest.approx(math.log(2), abs=0.1), trained
    assert trained["loss_last_20_mean"] < trained["first_loss"] / 2 and trained["pairs_per_record"] == 3, trained
    from safetensors import safe_open

    with safe_open(str(out / "reward_model" / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
    assert {"score.weight", "score.bias"} <= keys and "lm_head.weight" not in keys
    rows = metrics(out)
    rule = {r["step"]: r["val/reward/rule/mean"] for r in rows if "val/reward/rule/mean" in r}
    score = {r["step"]: r["val/reward_model/score/mean"] for r in rows if "val/reward_model/score/mean" in r}
    assert sorted(rule) == [0, 40, 80], rule
    assert rule[0] <= 0.05 and max(rule[40], rule[80]) >= 0.9 and rule[80] >= 0.6, rule
    assert score[80] > score[0], score
    assert all(r.get("reward_model/errors", 0) == 0 for r in rows)
    assert all(
        r["reward/rm/mean"] == pytest.approx(r["reward_model/score/mean"]) and "reward/rule/mean" in r for r in rows[1:]
    )
    assert "id='panel-reward_model'" in (out / "report.html").read_text()
    print(
        f"RL from a learned reward: held-out pair accuracy {trained['heldout_pair_accuracy']:.3f}, rule check "
        f"{rule}, reward model's score {score}"
    )
