"""verl's registries, drop-in: a file written for verl 0.9.1's ``@register_adv_est`` / ``@register_policy_loss``
works with vlmrl's decorators (one import line changed) or with verl's own, named through ``algorithm.plugins``;
the functions are called as verl calls them, in the driver (estimators) and in every worker process (losses)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from runs import base_args, make_colour_data, metrics, run_here
from vlmrl.algorithms import load_plugins
from vlmrl.algorithms.estimators import ADV_ESTIMATORS, get_adv_estimator_fn
from vlmrl.algorithms.losses import POLICY_LOSSES, LossConfig, get_policy_loss

BODY = """
import json, os
from pathlib import Path

import torch


@register_adv_est("{est}")
def centred(token_level_rewards, response_mask, index, epsilon=1e-6, norm_adv_by_std_in_grpo=True, config=None,
            **kwargs):
    scores = token_level_rewards.sum(-1)
    adv = (scores - scores.mean()).unsqueeze(-1) * response_mask
    _note("estimator", list(token_level_rewards.shape))
    return adv, adv


@register_policy_loss("{loss}")
def plain_pg(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
             rollout_is_weights=None):
    _note("loss", list(log_prob.shape))
    loss = agg_loss(-advantages * log_prob, response_mask, loss_agg_mode, **config.global_batch_info)
    return loss, {{"actor/plain_pg_calls": 1.0}}


def _note(what, shape):
    with Path(__file__).with_name("calls.jsonl").open("a") as f:
        f.write(json.dumps({{"what": what, "pid": os.getpid(), "shape": shape}}) + "\\n")
"""
VLMRL_STYLE = "from vlmrl.algorithms import agg_loss, register_adv_est, register_policy_loss\n" + BODY
VERL_STYLE = "from verl.trainer.ppo.core_algos import agg_loss, register_adv_est, register_policy_loss\n" + BODY


def _write(folder: Path, text: str, est: str, loss: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    f = folder / "my_algos.py"
    f.write_text(text.format(est=est, loss=loss))
    return f


@pytest.mark.parametrize("style", ["vlmrl", "verl"])
def test_a_plugin_file_registers_its_names(tmp_path: Path, style: str) -> None:
    est, loss = f"centred_{style}", f"plain_pg_{style}"
    f = _write(tmp_path, VLMRL_STYLE if style == "vlmrl" else VERL_STYLE, est, loss)
    try:
        added = load_plugins([str(f)])
        assert sorted(added) == sorted([est, loss])
        assert load_plugins([str(f)]) == [] or style == "verl"  # imported once: nothing new the second time
        rewards, mask = torch.tensor([[0.0, 1.0], [0.0, 3.0]]), torch.ones(2, 2)
        adv, _ = get_adv_estimator_fn(est)(token_level_rewards=rewards, response_mask=mask, index=[0, 0])
        torch.testing.assert_close(adv, torch.tensor([[-1.0, -1.0], [1.0, 1.0]]))
        logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.5]], requires_grad=True)
        out, m = get_policy_loss(loss)(logp.detach(), logp, adv, mask, "token-mean", LossConfig(), None)
        torch.testing.assert_close(out, (-1.0 - 2.0 + 0.5 + 0.5) / 4 * torch.tensor(1.0))
        assert m == {"actor/plain_pg_calls": 1.0}
        if style == "verl":  # verl's own built-ins are not copied over vlmrl's
            assert get_policy_loss("vanilla").__module__ == "vlmrl.algorithms.losses"
    finally:
        ADV_ESTIMATORS.pop(est, None)
        POLICY_LOSSES.pop(loss, None)
        verl = sys.modules.get("verl.trainer.ppo.core_algos")
        if verl is not None:  # verl's own registries too: other tests compare them with vlmrl's
            verl.ADV_ESTIMATOR_REGISTRY.pop(est, None)
            verl.POLICY_LOSS_REGISTRY.pop(loss, None)


def test_a_bad_plugin_is_a_config_problem_naming_the_key(tmp_path: Path) -> None:
    from vlmrl.config import ConfigError, load

    data = make_colour_data(tmp_path / "data")
    base = [f"data.train_files={data / 'train.parquet'}", f"actor_rollout_ref.model.path={tmp_path}"]
    with pytest.raises(ConfigError, match=r"algorithm.plugins: FileNotFoundError: file not found: 'nope.py'"):
        load([*base, "algorithm.plugins=[nope.py]"], config_name="tiny_cpu")
    with pytest.raises(ConfigError, match=r"algorithm.adv_estimator='unregistered': unknown"):
        load([*base, "algorithm.adv_estimator=unregistered"], config_name="tiny_cpu")


@pytest.mark.slow
def test_plugin_names_train_through_the_launch_command_in_worker_processes(tiny_model_dir, tmp_path: Path) -> None:
    """The quick start's launch (2 CPU worker processes, vLLM) with ``algorithm.plugins=[file]`` and the names the
    file registers: the estimator runs in the driver on [B, R] token rewards, the loss in both workers, 2 steps."""
    data = make_colour_data(tmp_path / "data")
    f = _write(tmp_path / "plug", VLMRL_STYLE, "centred_e2e", "plain_pg_e2e")
    out = tmp_path / "run"
    run_here(
        base_args(
            tiny_model_dir,
            data,
            out,
            "trainer.total_training_steps=2",
            "data.val_files=null",
            f"algorithm.plugins=[{f}]",
            "algorithm.adv_estimator=centred_e2e",
            "actor_rollout_ref.actor.policy_loss.loss_mode=plain_pg_e2e",
        )
    )
    calls = [json.loads(x) for x in (f.parent / "calls.jsonl").read_text().splitlines()]
    est = [c for c in calls if c["what"] == "estimator"]
    loss_pids = {c["pid"] for c in calls if c["what"] == "loss"}
    assert len(est) == 2 and est[0]["shape"][0] == 128, est  # 16 prompts x n=8 per step, one call per step
    assert len(loss_pids) == 2 and est[0]["pid"] not in loss_pids and os.getpid() not in loss_pids
    rows = metrics(out)
    assert [r["step"] for r in rows] == [1, 2] and all(r["actor/plain_pg_calls"] == 1.0 for r in rows)
