"""Actor-critic PPO's math equals verl 0.9.1's own functions, run here on the same tensors (``verl.trainer.ppo.
core_algos``, ``verl.utils.torch_functional``, ``ray_trainer.apply_kl_penalty``): GAE advantages and returns, the
clipped value loss and its clip fraction, the KL penalties, KL in the reward with the adaptive controller's
coefficient sequence, REINFORCE++ and GRPO over token rewards; plus the value head's load and save names."""

from __future__ import annotations

import re
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vlmrl.algorithms import ppo
from vlmrl.algorithms.core import kl_penalty
from vlmrl.algorithms.estimators import EstimatorConfig

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from verl.trainer.ppo import core_algos as verl_algos
    from verl.utils import torch_functional as verl_F

ATOL = 1e-6


def batch(seed: int, B: int = 6, R: int = 9, tool_span: bool = True) -> dict[str, torch.Tensor]:
    """Random per-token tensors of B responses of different lengths (right padding), one with a masked tool-response
    span inside it (multi-turn), scores on each last generated token."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, R + 1, (B,), generator=g)
    lengths[0] = R
    mask = (torch.arange(R)[None, :] < lengths[:, None]).float()
    if tool_span:
        mask[0, 3:6] = 0.0  # tokens 3-5 of response 0: a tool's output, not generated
    scores = torch.randn(B, generator=g)
    return {
        "mask": mask,
        "scores": scores,
        "values": torch.randn(B, R, generator=g) * mask,
        "logp": -torch.rand(B, R, generator=g) * 3,
        "ref": -torch.rand(B, R, generator=g) * 3,
        "vpreds": torch.randn(B, R, generator=g),
        "returns": torch.randn(B, R, generator=g),
    }


def close(a: torch.Tensor | float, b: torch.Tensor | float, atol: float = ATOL) -> None:
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    assert torch.allclose(a, b, atol=atol, rtol=0), (a - b).abs().max()


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("gamma, lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0)])
def test_gae_equals_verls(seed: int, gamma: float, lam: float) -> None:
    b = batch(seed)
    rewards = ppo.token_scores(b["scores"], b["mask"])
    ours = ppo.gae(rewards, b["values"], b["mask"], gamma, lam)
    theirs = verl_algos.compute_gae_advantage_return(rewards, b["values"], b["mask"], gamma, lam)
    close(ours[0], theirs[0])
    close(ours[1], theirs[1])


def test_scores_sit_on_each_last_generated_token() -> None:
    b = batch(0)
    t = ppo.token_scores(b["scores"], b["mask"])
    lengths = b["mask"].sum(-1)
    for i in range(len(t)):
        last = int(b["mask"][i].nonzero().max())
        assert t[i, last] == b["scores"][i] and t[i].abs().sum() == b["scores"][i].abs()
        assert last == int(lengths[i]) - 1 or i == 0  # response 0: its tool span is inside, the last token is R-1


def test_masked_whiten_equals_verls() -> None:
    b = batch(3)
    close(ppo.masked_whiten(b["vpreds"], b["mask"]), verl_F.masked_whiten(b["vpreds"], b["mask"]))
    close(
        ppo.masked_whiten(b["vpreds"], b["mask"], shift_mean=False),
        verl_F.masked_whiten(b["vpreds"], b["mask"], shift_mean=False),
    )


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("clip", [0.5, 0.05])
def test_value_loss_and_clipfrac_equal_verls(agg: str, clip: float) -> None:
    b = batch(4)
    loss, frac = ppo.value_loss(b["vpreds"], b["returns"], b["values"], b["mask"], clip, agg)
    v_loss, v_frac = verl_algos.compute_value_loss(b["vpreds"], b["returns"], b["values"], b["mask"], clip, agg)
    close(loss, v_loss)
    close(frac, v_frac)
    assert 0 < float(frac) < 1  # both branches taken: the test sees the clip


@pytest.mark.parametrize("kind", ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"])
def test_kl_penalties_equal_verls(kind: str) -> None:
    b = batch(5)
    close(kl_penalty(b["logp"], b["ref"], kind), verl_algos.kl_penalty(b["logp"], b["ref"], kind))


def _verl_apply_kl_penalty(token_scores, old, ref, mask, ctrl, kind):
    """verl's ``ray_trainer.apply_kl_penalty`` on a DataProto holding these tensors."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from verl import DataProto
        from verl.trainer.ppo.ray_trainer import apply_kl_penalty

    data = DataProto.from_dict(
        tensors={"response_mask": mask, "token_level_scores": token_scores, "old_log_probs": old, "ref_log_prob": ref}
    )
    out, metrics = apply_kl_penalty(data, ctrl, kind)
    return out.batch["token_level_rewards"], metrics


@pytest.mark.parametrize("kind", ["kl", "low_var_kl", "mse", "abs"])
@pytest.mark.parametrize("ctrl_type", ["fixed", "adaptive"])
def test_kl_in_reward_and_the_controllers_coefficient_sequence_equal_verls(kind: str, ctrl_type: str) -> None:
    cfg = SimpleNamespace(type=ctrl_type, kl_coef=0.05, target_kl=0.05, horizon=50)
    ours_ctrl = ppo.make_kl_controller(cfg.type, cfg.kl_coef, cfg.target_kl, cfg.horizon)
    verl_ctrl = verl_algos.get_kl_controller(cfg)
    coefs = []
    for step in range(6):  # a KL below, then above the target: the coefficient moves both ways
        b = batch(10 + step)
        noise = torch.randn(b["ref"].shape, generator=torch.Generator().manual_seed(step)).abs()
        old = b["ref"] + (0.01 if step < 3 else 0.6) * noise  # KL below the target, then above it
        scores = ppo.token_scores(b["scores"], b["mask"])
        ours, metrics = ppo.kl_in_reward(scores, old, b["ref"], b["mask"], ours_ctrl, kind)
        theirs, v_metrics = _verl_apply_kl_penalty(scores, old, b["ref"], b["mask"], verl_ctrl, kind)
        close(ours, theirs)
        close(metrics["reward/kl_penalty"], v_metrics["actor/reward_kl_penalty"])
        close(metrics["reward/kl_coef"], v_metrics["actor/reward_kl_penalty_coeff"])
        close(ours_ctrl.value, verl_ctrl.value)
        coefs.append(ours_ctrl.value)
    if ctrl_type == "adaptive":
        assert min(np.diff(coefs)) < 0 < max(np.diff(coefs)), coefs
    else:
        assert coefs == [0.05] * 6


def test_kl_controller_state_round_trips() -> None:
    a = ppo.make_kl_controller("adaptive", 0.1, 0.05, 100)
    a.update(0.2, 32)
    b = ppo.make_kl_controller("adaptive", 0.1, 0.05, 100)
    b.load_state_dict(a.state_dict())
    a.update(0.01, 32)
    b.update(0.01, 32)
    assert a.value == b.value != 0.1


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_plus_plus_over_token_rewards_equals_verls(gamma: float) -> None:
    b = batch(6)
    rewards = ppo.token_scores(b["scores"], b["mask"]) - 0.01 * b["logp"] * b["mask"]  # a KL-like per-token term
    ours = ppo.token_advantages(
        "reinforce_plus_plus", rewards, b["mask"], torch.zeros(6), config=EstimatorConfig(gamma=gamma)
    )
    theirs = verl_algos.compute_reinforce_plus_plus_outcome_advantage(
        rewards, b["mask"], config=SimpleNamespace(gamma=gamma)
    )
    close(ours[0], theirs[0])
    close(ours[1], theirs[1])


@pytest.mark.parametrize("norm", [True, False])
def test_grpo_and_rloo_over_token_rewards_equal_verls(norm: bool) -> None:
    b = batch(7, B=8)
    rewards = ppo.token_scores(b["scores"], b["mask"]) - 0.01 * b["logp"] * b["mask"]
    group = torch.arange(8) // 4
    ours = ppo.token_advantages("grpo", rewards, b["mask"], group, config=EstimatorConfig(norm_adv_by_std_in_grpo=norm))
    theirs = verl_algos.compute_grpo_outcome_advantage(rewards, b["mask"], group.numpy(), norm_adv_by_std_in_grpo=norm)
    close(ours[0], theirs[0])
    ours = ppo.token_advantages("rloo", rewards, b["mask"], group)
    theirs = verl_algos.compute_rloo_outcome_advantage(rewards, b["mask"], group.numpy())
    close(ours[0], theirs[0])


def test_gae_needs_values() -> None:
    b = batch(0)
    with pytest.raises(ValueError, match="needs the critic's values"):
        ppo.token_advantages("gae", b["scores"][:, None] * b["mask"], b["mask"], torch.zeros(6))


def test_explained_variance_equals_verls_formula() -> None:
    b = batch(8)
    m = b["mask"].bool()
    r, v = torch.masked_select(b["returns"], m), torch.masked_select(b["values"], m)
    expected = 1.0 - torch.var(r - v) / (torch.var(r) + 1e-5)
    close(ppo.explained_variance(b["values"], b["returns"], b["mask"]), expected, atol=1e-5)


def test_adaptive_controller_rejects_a_zero_horizon() -> None:
    with pytest.raises(ValueError, match="horizon must be > 0"):
        ppo.make_kl_controller("adaptive", 0.1, 0.1, 0)


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["algorithm.adv_estimator=gae", "critic.enable=False"], "algorithm.adv_estimator=gae needs the critic's"),
        (["algorithm.gamma=1.5"], "algorithm.gamma=1.5: must be between 0 and 1"),
        (["algorithm.lam=-0.1"], "algorithm.lam=-0.1: must be between 0 and 1"),
        (["algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.horizon=0"], "needs a horizon > 0"),
        (["algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.target_kl=0"], "needs a target > 0"),
        (["algorithm.kl_ctrl.type=pid"], "algorithm.kl_ctrl.type='pid'"),
        (["algorithm.adv_estimator=gae", "critic.optim.lr=0"], "critic.optim.lr=0.0: must be a finite number > 0"),
        (["algorithm.adv_estimator=gae", "critic.cliprange_value=0"], "critic.cliprange_value=0.0: must be"),
        (["algorithm.adv_estimator=gae", "critic.loss_agg_mode=sum"], "critic.loss_agg_mode='sum'"),
        (
            ["algorithm.adv_estimator=gae", "critic.use_dynamic_bsz=True", "critic.ppo_max_token_len_per_gpu=100"],
            "critic.ppo_max_token_len_per_gpu=100 with dynamic batch sizes",
        ),
    ],
)
def test_ppo_settings_are_checked_before_anything_starts(overrides: list[str], expected: str) -> None:
    from vlmrl.config import ConfigError, load

    with pytest.raises(ConfigError, match=re.escape(expected)):
        load(["data.train_files=x", "actor_rollout_ref.model.path=m", *overrides])


def test_the_critic_follows_the_actors_settings_where_verl_interpolates_them() -> None:
    from vlmrl.config import load
    from vlmrl.config.plan import critic_plan, reference_needed

    base = ["data.train_files=x", "actor_rollout_ref.model.path=m"]
    assert critic_plan(load(base)) is None and not reference_needed(load(base))  # GRPO: no critic, no reference
    cfg = load(
        [
            *base,
            "algorithm.adv_estimator=gae",
            "actor_rollout_ref.actor.ppo_epochs=3",
            "actor_rollout_ref.actor.use_dynamic_bsz=True",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
            "data.train_batch_size=16",
        ]
    )
    plan = critic_plan(cfg)
    assert (plan.path, plan.epochs, plan.use_dynamic_bsz, plan.loss_agg_mode, plan.mini_batch_size) == (
        "m",
        3,
        True,
        "seq-mean-token-mean",
        8,
    )
    assert plan.optim.lr == 1e-5 and plan.cliprange_value == 0.5  # verl's critic defaults
    own = critic_plan(
        load(
            [
                *base,
                "algorithm.adv_estimator=gae",
                "critic.model.path=c",
                "critic.ppo_epochs=2",
                "critic.loss_agg_mode=token-mean",
                "critic.use_dynamic_bsz=False",
            ]
        )
    )
    assert (own.path, own.epochs, own.loss_agg_mode, own.use_dynamic_bsz) == ("c", 2, "token-mean", False)
    assert critic_plan(load([*base, "critic.enable=True"])) is not None  # a critic with another estimator (verl)
    assert reference_needed(load([*base, "algorithm.use_kl_in_reward=True"]))


def test_critic_settings_without_a_critic_are_refused_and_unused_kl_settings_noticed() -> None:
    """A verl PPO script that leaves the estimator at the default (verl's gae, vlmrl's grpo) is refused naming the
    fix instead of training GRPO without its critic; in-reward KL and GAE settings that would go unused are
    printed as notices (verl ignores them the same way)."""
    from vlmrl.config.command import compose

    base = ["data.train_files=x", "actor_rollout_ref.model.path=m"]
    c = compose([*base, "critic.optim.lr=1e-5", "critic.model.path=m"])
    assert len(c.problems) == 1 and "critic.optim.lr is set but this run builds no critic" in c.problems[0]
    assert "Add algorithm.adv_estimator=gae" in c.problems[0]
    assert not compose([*base, "critic.optim.lr=1e-5", "algorithm.adv_estimator=gae"]).problems
    c = compose([*base, "algorithm.kl_ctrl.kl_coef=0.001", "algorithm.lam=0.95", "algorithm.gamma=0.99"])
    assert not c.problems
    assert any("algorithm.kl_ctrl.kl_coef: the in-reward KL is off" in n for n in c.notices), c.notices
    assert any("algorithm.lam: GAE's lambda" in n for n in c.notices) and any("algorithm.gamma" in n for n in c.notices)
    c = compose([*base, "algorithm.kl_ctrl.kl_coef=0.001", "algorithm.use_kl_in_reward=True"])
    assert not c.problems and not any("in-reward KL is off" in n for n in c.notices)


def test_on_resume_the_command_line_owns_what_it_changed_and_restored_values_are_checked() -> None:
    """Issue 44 item 4: a fixed in-reward KL coefficient is the config's (the checkpoint's value used to win: 0.5 on
    the command line ran as 0.001); an adaptive one continues from the checkpoint unless the command line changed
    its type or starting value; a saved coefficient that is negative or not finite (an edited file) is refused; an
    algorithm class's constructor parameter set anew wins over the checkpoint's, its other state does not."""
    from vlmrl.trainer.checkpoint import CheckpointError, restored_algorithm_state, restored_kl

    saved = {"value": 0.001, "kind": "fixed", "kl_coef": 0.001}
    note = "algorithm.kl_ctrl.kl_coef=0.5 (the config's; the checkpoint's fixed value was 0.001)"
    assert restored_kl(saved, "fixed", 0.5, "f") == (None, note)
    assert restored_kl(saved, "fixed", 0.001, "f") == (None, None)
    adapted = {"value": 0.037, "kind": "adaptive", "kl_coef": 0.05}
    assert restored_kl(adapted, "adaptive", 0.05, "f") == (0.037, None)
    value, note = restored_kl(adapted, "adaptive", 0.2, "f")
    assert value is None and "kl_coef=0.2 (set anew" in note
    assert restored_kl({"value": 0.037}, "adaptive", 0.05, "f") == (0.037, None)  # a checkpoint from before
    for bad in (-5.0, float("nan"), float("inf"), "0.1", True):
        with pytest.raises(CheckpointError, match="kl_ctrl.value=.* is not a finite number >= 0"):
            restored_kl({"value": bad}, "adaptive", 0.05, "ckpt/trainer_state.json")
    state = {"penalty": 0.5, "count": 7}
    out, notes = restored_algorithm_state(state, {"penalty": 0.5}, {"penalty": 0.9})
    assert out == {"penalty": 0.9, "count": 7} and notes == [
        "algorithm.penalty=0.9 (the config's; the checkpoint had 0.5)"
    ]
    assert restored_algorithm_state({"penalty": 0.7}, {"penalty": 0.9}, {"penalty": 0.9}) == ({"penalty": 0.7}, [])


def test_a_value_head_with_several_outputs_is_named(tiny_model_dir, tmp_path) -> None:
    """Issue 44 item 11: a saved head whose bias has 3 values (a 3-label classifier) was reported as "shape '[1]' is
    invalid for input of size 3"; it is named as what it is."""
    import shutil

    from safetensors.torch import load_file, save_file

    from vlmrl.models.trainable import load_model
    from vlmrl.models.value_head import add_value_head

    folder = tmp_path / "three"
    shutil.copytree(tiny_model_dir, folder)
    [weights] = folder.glob("*.safetensors")
    state = load_file(weights)
    hidden = state["lm_head.weight"].shape[1]
    state.update({"score.weight": torch.zeros(1, hidden), "score.bias": torch.zeros(3)})
    save_file(state, weights, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"score.weight's bias has 3 values; a value head has one output"):
        add_value_head(load_model(str(folder), "cpu"), str(folder))
