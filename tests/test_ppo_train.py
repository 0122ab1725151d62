"""Actor-critic PPO end to end on CPU: the critic's value head (load, save names, the shared-prompt forward equal to
the full one), PPO learning the quick start's task (examples/ppo_cpu.sh, whose preset is the quick start's config
with PPO overrides), and a resume that continues the critic, both
optimizers and the adaptive KL controller exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from runs import base_args, colour_data_dir, make_colour_data, metrics, run_example, train_here_to_end


def test_value_head_loads_from_a_critic_folder_and_saves_under_verls_name(tiny_model_dir: str, tmp_path: Path) -> None:
    """A policy checkpoint gets a new head (normal(0, initializer_range), zero bias); a folder holding
    ``score.weight`` / ``score.bias`` (verl's token-classification critic, vlmrl's export) or TRL's
    ``v_head.summary.*`` loads that head."""
    from safetensors.torch import load_file, save_file

    from vlmrl.models.trainable import load_model
    from vlmrl.models.value_head import add_value_head, export_names, saved_value_head

    model = load_model(tiny_model_dir, "cpu")
    assert add_value_head(model, tiny_model_dir) == "new" and model.lm_head.out_features == 1
    assert float(model.lm_head.bias) == 0.0 and 0 < float(model.lm_head.weight.std()) < 0.1
    ids = torch.tensor([[1, 2, 3, 4]])
    assert model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.shape == (1, 4, 1)
    folder = tmp_path / "critic"
    folder.mkdir()
    for f in Path(tiny_model_dir).iterdir():
        if f.suffix != ".safetensors":
            (folder / f.name).write_bytes(f.read_bytes())
    state = export_names({k: v.detach().clone() for k, v in model.state_dict().items()})
    assert "score.weight" in state and not any(k.startswith("lm_head.") for k in state)
    base = load_file(next(Path(tiny_model_dir).glob("*.safetensors")))
    save_file(
        {**base, "score.weight": state["score.weight"], "score.bias": state["score.bias"] + 0.5},
        str(folder / "model.safetensors"),
    )
    head, name = saved_value_head(str(folder))
    assert name == "score.weight" and torch.equal(head["weight"], state["score.weight"])
    again = load_model(str(folder), "cpu")
    assert add_value_head(again, str(folder)) == "score.weight"
    assert torch.equal(again.lm_head.weight, model.lm_head.weight) and float(again.lm_head.bias) == pytest.approx(0.5)
    # TRL's value-head models keep it as v_head.summary.*
    save_file(
        {**base, "v_head.summary.weight": state["score.weight"] * 2, "v_head.summary.bias": torch.ones(1)},
        str(folder / "model.safetensors"),
    )
    head, name = saved_value_head(str(folder))
    assert name == "v_head.summary.weight" and torch.equal(head["weight"], state["score.weight"] * 2)


def test_values_from_the_shared_prompt_forward_equal_the_full_sequence(tiny_model_dir: str, tiny_processor) -> None:
    """The critic runs the policy's forward: each prompt once with its KV cache shared by its samples, or every
    sample's whole sequence (gradient checkpointing, tool images); both give the same values."""
    from vlmrl.models import qwen_vl
    from vlmrl.models.forward import full_sequence_logits, response_values
    from vlmrl.models.trainable import load_model
    from vlmrl.models.value_head import add_value_head

    model = load_model(tiny_model_dir, "cpu").eval()
    add_value_head(model, tiny_model_dir)
    x = _two_prompt_inputs(tiny_processor)
    ids = qwen_vl.vision_token_ids(tiny_processor.tokenizer)
    with torch.no_grad():
        shared, _ = response_values(model, x, ids)
        full, _ = full_sequence_logits(model, x, ids)
    m = x.response_mask.bool()
    assert shared.shape == x.responses.shape
    assert torch.allclose(shared[m], full[..., 0][m], atol=1e-5), (shared[m] - full[..., 0][m]).abs().max()


def _two_prompt_inputs(tiny_processor):
    from utils import expanded, make_prompt, solid

    from vlmrl.batch import RolloutBatch
    from vlmrl.models.inputs import build_inputs, process_images

    prompts = [
        make_prompt(tiny_processor, "colour?", [solid((200, 10, 10))], 0),
        make_prompt(tiny_processor, "and this one?", [solid((10, 200, 10))], 1),
    ]
    responses = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14]]
    ids = [expanded(tiny_processor, p) for p in prompts for _ in range(2)]
    rb = RolloutBatch(ids, responses, [[0.0] * len(r) for r in responses], ["stop"] * 4, n=2)
    return build_inputs(prompts, rb, process_images(tiny_processor, prompts), tiny_processor.tokenizer.pad_token_id)


def test_critic_token_budget_micro_batches_train_exactly_as_fixed_ones(tiny_model_dir: str, tiny_processor) -> None:
    """critic.use_dynamic_bsz: micro-batches by a token budget (here several, of other sizes than the fixed run's)
    give the critic the same values, loss and weights after an update as fixed micro-batches of one sample."""
    from dataclasses import replace

    from vlmrl.config import load
    from vlmrl.config.plan import critic_plan
    from vlmrl.models import qwen_vl
    from vlmrl.workers.critic import CriticWorker

    cfg = load(
        [
            "data.train_files=x",
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            "algorithm.adv_estimator=gae",
            "critic.optim.lr=1e-2",
            "critic.model.enable_gradient_checkpointing=False",
        ]
    )
    fixed = replace(critic_plan(cfg), micro_batch_size=1, forward_micro_batch_size=1)
    x = _two_prompt_inputs(tiny_processor)
    budget = int(x.attention_mask.sum(-1).max()) + 2  # room for about one sample per micro-batch
    dynamic = replace(fixed, use_dynamic_bsz=True, max_token_len=2 * budget, forward_max_token_len=budget)
    ids = qwen_vl.vision_token_ids(tiny_processor.tokenizer)
    workers = []
    for plan in (fixed, dynamic):
        torch.manual_seed(0)  # the same new value head
        workers.append(CriticWorker(plan, device="cpu", total_steps=4, vision_ids=ids, seed=1, max_response_length=8))
    a, b = workers
    assert len(b.micro_batches(x, list(range(4)), update=True)) not in (1, 4)  # another split than either extreme
    va, vb = a.values(x), b.values(x)
    assert torch.allclose(va, vb, atol=1e-6)
    returns = torch.rand(va.shape)
    ma, mb = a.update(x, returns, va, 4), b.update(x, returns, vb, 4)
    assert ma["critic/vf_loss"] == pytest.approx(mb["critic/vf_loss"], abs=1e-6)
    # the updated critics predict alike (compared by their outputs: AdamW's first step is about lr x sign(gradient),
    # so a parameter whose gradient is 0 up to rounding, the attention's key bias, moves by +-lr either way)
    after_a, after_b = a.values(x), b.values(x)
    assert torch.allclose(after_a, after_b, atol=1e-5)
    assert torch.allclose(a.model.lm_head.weight, b.model.lm_head.weight, atol=1e-6)
    assert not torch.allclose(after_a, va)  # the update moved the values


@pytest.fixture(scope="module")
def colour_data(tmp_path_factory) -> Path:
    return make_colour_data(tmp_path_factory.mktemp("colour"))


PPO_OVERRIDES = (
    "algorithm.adv_estimator=gae",
    "critic.optim.lr=2e-3",
    "critic.optim.weight_decay=0",
    "critic.model.enable_gradient_checkpointing=False",
)
"""PPO with a critic on the quick start as a verl user writes it: overrides on the quick start's config."""


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def test_the_ppo_preset_is_the_quick_start_with_ppo_overrides() -> None:
    """``configs/ppo_tiny_cpu.yaml`` (the PPO example's preset) resolves to the quick start's config with the overrides
    PPO_OVERRIDES but for the critic's FSDP units (a speed setting, as the actor's) and the run's names: what the
    example learns (the next test), the overrides learn."""
    import dataclasses

    from vlmrl.config import load

    given = ["data.train_files=train.parquet", "actor_rollout_ref.model.path=model"]
    preset = _flat(dataclasses.asdict(load(given, "ppo_tiny_cpu")))
    overrides = _flat(dataclasses.asdict(load([*given, *PPO_OVERRIDES], "tiny_cpu")))
    differ = {k for k in preset.keys() | overrides.keys() if preset.get(k, "-") != overrides.get(k, "-")}
    assert differ == {
        "critic.fsdp.reshard_after_forward",
        "critic.fsdp.wrap_policy.min_num_params",
        "trainer.project_name",
        "trainer.experiment_name",
        "trainer.default_local_dir",
    }, differ


@pytest.mark.slow
def test_the_ppo_example_learns_the_quick_start_task(tmp_path) -> None:
    """``bash examples/ppo_cpu.sh`` (the quick start's pipeline with ``CONFIG=ppo_tiny_cpu``: GAE and a critic built
    from the actor's checkpoint): greedy validation 0 before training, >= 0.9 at step 60 (the test stops the
    example's 120 steps there, ``trainer.total_training_steps=60``, a Hydra override as a user passes one; the
    learning rate is constant, so the curve to step 60 is the full run's: measured 0.33 / 1.00 / 1.00 at steps
    20 / 40 / 60 on 2026-11-28, benchmarks/bench_ppo.py's seeds reach 0.9 by step 50); the critic's metrics in every
    step's line; the critic's panel in the report."""
    out = tmp_path / "ppo"
    log = run_example(
        "ppo_cpu.sh", out, "trainer.total_training_steps=60", timeout=1200, QUICKSTART_DATA=str(colour_data_dir())
    )
    rows = metrics(out)
    val = {r["step"]: r["val/reward/mean"] for r in rows if "val/reward/mean" in r}
    assert sorted(val) == [0, 60] and val[0] <= 0.05 and val[60] >= 0.9, val
    for key in (
        "critic/vf_loss",
        "critic/vf_clipfrac",
        "critic/vpred_mean",
        "critic/vf_explained_var",
        "critic/grad_norm",
        "critic/lr",
        "timing/critic_update_s",
        "timing/values_s",
    ):
        assert all(key in r for r in rows[1:]), key
    assert max(r["critic/vf_explained_var"] for r in rows[1:]) > 0.2  # the critic learns to predict the returns
    assert "id='panel-critic'" in (out / "report.html").read_text() and (out / "reward_curve.png").is_file()
    assert "[quickstart] tiny model:" in log and "ppo_tiny_cpu" not in log.split("[quickstart] tiny model:")[0]


CURVE = (
    "reward/mean",
    "critic/vf_loss",
    "critic/vpred_mean",
    "reward/kl_penalty",
    "reward/kl_coef",
    "actor/pg_loss",
    "actor/entropy",
)


@pytest.mark.slow
def test_resume_continues_critic_optimizers_and_kl_controller_exactly(tiny_model_dir, colour_data, tmp_path) -> None:
    """GAE with the adaptive in-reward KL and trainer.critic_warmup=2 (verl's rule: the actor updates from step 2):
    a run stopped after its step-2 checkpoint and resumed equals an uninterrupted one step for step; the checkpoint
    holds the critic's shards and the controller's coefficient. (One worker in this process with the HF rollout: what
    is resumed is the trainer's state; tests/test_train_e2e.py resumes runs of worker processes.)"""
    extra = (
        "algorithm.adv_estimator=gae",
        "algorithm.use_kl_in_reward=True",
        "algorithm.kl_ctrl.type=adaptive",
        "algorithm.kl_ctrl.target_kl=0.001",
        "algorithm.kl_ctrl.horizon=64",
        "algorithm.kl_ctrl.kl_coef=0.05",
        "trainer.critic_warmup=2",
        "critic.optim.lr=1e-3",
        "trainer.save_freq=2",
        "data.val_files=null",
        "actor_rollout_ref.rollout.name=hf",
        "trainer.launcher=inline",
    )
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    train_here_to_end(base_args(tiny_model_dir, colour_data, whole, *extra, "trainer.total_training_steps=4"))
    train_here_to_end(base_args(tiny_model_dir, colour_data, cut, *extra, "trainer.total_training_steps=2"))
    state = json.loads((cut / "global_step_2" / "trainer_state.json").read_text())
    assert (cut / "global_step_2" / "critic" / ".metadata").is_file() and state["kl_ctrl"]["value"] != 0.05
    again = train_here_to_end(base_args(tiny_model_dir, colour_data, cut, *extra, "trainer.total_training_steps=4"))
    assert "resumed from" in again
    a, b = metrics(whole), metrics(cut)
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3, 4]
    for ra, rb in zip(a, b):
        for k in CURVE if ra["step"] > 1 else CURVE[:5]:  # step 1: the critic only (no actor metrics)
            assert ra[k] == pytest.approx(rb[k], rel=1e-5, abs=1e-7), (ra["step"], k, ra[k], rb[k])
    assert "actor/pg_loss" not in a[0] and all("actor/pg_loss" in r for r in a[1:])  # critic only at step 1
    # the critic exports as a folder that loads as a critic again, with its trained head
    from vlmrl.export import main as export
    from vlmrl.models.trainable import load_model
    from vlmrl.models.value_head import add_value_head, saved_value_head

    assert export(["--checkpoint", str(cut), "--output", str(tmp_path / "critic"), "--critic"]) == 0
    head, name = saved_value_head(str(tmp_path / "critic"))
    model = load_model(str(tmp_path / "critic"), "cpu")
    assert name == "score.weight" and add_value_head(model, str(tmp_path / "critic")) == "score.weight"
    assert torch.equal(model.lm_head.weight, head["weight"])
    assert export(["--checkpoint", str(whole), "--output", str(tmp_path / "p"), "--critic", "--model", "/nope"]) == 2
    # resumed without the critic (GRPO): said, not silent (issue 44 item 8)
    grpo = [x for x in extra if x.startswith(("trainer.save", "data.", "actor_", "trainer.launcher"))]
    log = train_here_to_end(base_args(tiny_model_dir, colour_data, cut, *grpo, "trainer.total_training_steps=5"))
    assert "resume: the checkpoint holds a critic" in log and "algorithm.adv_estimator=grpo" in log
    coefs = [r["reward/kl_coef"] for r in a]
    # step 1: the policy is the reference (KL 0, below the target): the coefficient falls by 20 % x 128 / 64
    assert coefs[0] == pytest.approx(0.05) and coefs[1] == pytest.approx(0.05 * (1 - 0.2 * 128 / 64))
