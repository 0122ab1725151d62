"""Every key of verl's own config gets one answer from vlmrl: kept, aliased, accepted with a notice, or refused naming
its feature (``vlmrl/config/verl_rules.py``); never a "did you mean" towards an unrelated key. The key list is verl
0.9.1's (``vlmrl/config/verl_keys.txt``, regenerated from the installed verl by scripts/verl_keys.py)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from vlmrl.config import ConfigError, leaf_keys, load, translate
from vlmrl.config.verl import ACCEPT, ALIAS, FEATURE, NOTICE, RULES, render, rule_for, verl_keys

REPO = Path(__file__).resolve().parents[1]
BASE = ["data.train_files=x", "actor_rollout_ref.model.path=m"]


def verl_defaults() -> dict[str, object]:
    """verl's default value of every key of its FSDP trainer config, interpolations left out."""
    spec = importlib.util.find_spec("verl")
    assert spec is not None and spec.submodule_search_locations
    folder = Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config"
    out: dict[str, object] = {}

    def walk(node: object, prefix: str) -> None:
        if isinstance(node, dict) and node:
            for k, v in node.items():
                if k != "_target_":
                    walk(v, f"{prefix}.{k}" if prefix else str(k))
        elif not (isinstance(node, str) and ("${" in node or node == "???")):
            out[prefix] = node

    walk(yaml.safe_load((folder / "_generated_ppo_trainer.yaml").read_text()), "")
    return out


def test_the_key_list_is_the_installed_verls() -> None:
    proc = subprocess.run(
        [sys.executable, "scripts/verl_keys.py", "--check"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(verl_keys()) > 900


def test_every_verl_key_is_answered_never_with_a_guess() -> None:
    schema = set(leaf_keys())
    unanswered = []
    for key in sorted(verl_keys()):
        t = translate([f"{key}=1"])
        for problem in t.problems:
            if "Unknown config key" in problem or "Did you mean" in problem:
                unanswered.append(problem)
        if key not in schema and not t.problems:
            assert t.notices or t.overrides or rule_for(key) is not None, key
    assert not unanswered, "\n".join(unanswered[:20])


def test_verls_default_values_are_accepted_except_for_features_vlmrl_lacks() -> None:
    """verl's defaults mean "off" for the features vlmrl does not implement: a launch line that spells them out
    is accepted; only keys of a refused feature (the critic, Megatron, ...) are refused, naming it."""
    refused_by_accept_rule = []
    for key, value in sorted(verl_defaults().items()):
        if key in set(leaf_keys()):
            continue
        rule = rule_for(key)
        t = translate([f"{key}={render(value)}"])
        if rule is not None and rule.kind == ACCEPT and t.problems:
            refused_by_accept_rule.append(t.problems[0])
        for problem in t.problems:
            assert "not implemented in vlmrl: " in problem, problem
    assert not refused_by_accept_rule, "\n".join(refused_by_accept_rule)


def test_every_rule_matches_some_verl_key_or_is_an_old_verl_key() -> None:
    """No dead rules: each pattern covers a key of verl 0.9.1, or one that verl's scripts of 2025-26 still pass."""
    older = {"trainer.use_legacy_worker_impl", "trainer.max_ckpt_to_keep", "actor_rollout_ref.rollout.mode",
             "actor_rollout_ref.model.use_remove_padding", "data.return_raw_chat", "data.return_raw_input_ids",
             "data.return_full_prompt", "reward_model.overlong_buffer.enable", "trainer.balance_batch",
             "actor_rollout_ref.model.use_fused_kernels", "actor_rollout_ref.model.use_liger",
             "algorithm.kl_penalty", "algorithm.lam", "npu_profile.options",
             "reward.custom_reward_function.reward_kwargs",
             "trainer.use_ray"}  # vlmrl's own older key (now trainer.launcher)  # fmt: skip
    import fnmatch

    keys = verl_keys() | older
    prefixes = {k.rsplit(".", i)[0] for k in keys for i in range(1, k.count(".") + 1)}
    candidates = keys | prefixes | {k + ".sub" for k in keys}  # a group's own key, and keys below a dict
    dead = [r.pattern for r in RULES if not any(fnmatch.fnmatchcase(k, r.pattern) for k in candidates)]
    assert not dead, dead


@pytest.mark.parametrize(
    "override,kind,expected",
    [
        ("actor_rollout_ref.model.use_fused_kernels=True", NOTICE, "vlmrl computes log-probs"),
        ("actor_rollout_ref.actor.use_torch_compile=False", NOTICE, "no torch.compile"),
        ("actor_rollout_ref.ref.entropy_from_logits_with_chunking=True", NOTICE, "entropy"),
        ("actor_rollout_ref.actor.freeze_vision_tower=True", ALIAS, "++actor_rollout_ref.model.freeze_vision_tower="),
        ("actor_rollout_ref.actor.optim.clip_grad=0.5", ALIAS, "++actor_rollout_ref.actor.grad_clip=0.5"),
        ("actor_rollout_ref.rollout.max_num_seqs=64", ALIAS,
         "++actor_rollout_ref.rollout.engine_kwargs.vllm.max_num_seqs=64"),
        ("reward.custom_reward_function.path=r.py", ALIAS, "++custom_reward_function.path=r.py"),
        ("actor_rollout_ref.actor.policy_loss.loss_mode=vanilla", ALIAS, "++actor_rollout_ref.actor.policy_loss='ppo'"),
        ("actor_rollout_ref.rollout.multi_stage_wake_up=True", FEATURE, "multi-stage wake-up (an SGLang feature)"),
        ("+actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2", FEATURE, "Megatron-LM"),
        ("global_profiler.save_path=./mem", FEATURE, "verl's profiler"),
    ],
)  # fmt: skip
def test_verl_keys_get_their_answer(override: str, kind: str, expected: str) -> None:
    t = translate([override])
    if kind == NOTICE:
        assert t.overrides == [] and not t.problems and expected in t.notices[0]
    elif kind == ALIAS:
        assert not t.problems and t.overrides and t.overrides[0].startswith(expected), t.overrides
    else:
        assert t.problems and expected in t.problems[0] and "Did you mean" not in t.problems[0], t.problems


def test_aliases_take_effect_in_the_composed_config() -> None:
    cfg = load(
        BASE + [
            "actor_rollout_ref.actor.freeze_vision_tower=True",
            "actor_rollout_ref.actor.optim.clip_grad=0.5",
            "actor_rollout_ref.actor.optim.lr_scheduler_type=cosine",
            "actor_rollout_ref.rollout.max_num_seqs=64",
            "actor_rollout_ref.rollout.enable_prefix_caching=False",
            "actor_rollout_ref.model.custom_chat_template='{{ messages }}'",
            "reward.custom_reward_function.path=r.py",
            "trainer.max_ckpt_to_keep=3",
            "actor_rollout_ref.actor.fsdp_config.offload_policy=True",
        ]
    )  # fmt: skip
    arr = cfg.actor_rollout_ref
    assert arr.model.freeze_vision_tower is True and arr.actor.grad_clip == 0.5
    assert arr.actor.optim.warmup_style == "cosine" and arr.actor.fsdp_config.param_offload is True
    assert arr.rollout.engine_kwargs["vllm"] == {"max_num_seqs": 64, "enable_prefix_caching": False}
    assert cfg.data.custom_chat_template == "{{ messages }}" and cfg.custom_reward_function.path == "r.py"
    assert cfg.trainer.max_actor_ckpt_to_keep == 3


def test_a_misspelling_still_gets_the_nearest_key_but_unrelated_keys_get_none() -> None:
    t = translate(["actor_rollout_ref.rollout.temprature=1", "trainer.totally_new_thing=1"])
    assert "Did you mean 'actor_rollout_ref.rollout.temperature'?" in t.problems[0]
    assert "Did you mean" not in t.problems[1]


def test_notices_print_once_on_stderr_and_the_run_goes_on(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "vlmrl.train", *BASE, "actor_rollout_ref.model.use_fused_kernels=True",
         "actor_rollout_ref.actor.use_torch_compile=False", "--cfg", "job"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr.count("use_fused_kernels=True: accepted with no effect") == 1
    assert "use_torch_compile=False: accepted with no effect" in proc.stderr
    assert "use_fused_kernels" not in proc.stdout  # the printed config is vlmrl's


def test_a_refused_verl_key_through_load_names_the_feature() -> None:
    with pytest.raises(ConfigError, match="the Megatron-LM backend"):
        load(BASE + ["actor_rollout_ref.actor.megatron.param_offload=True"])


def test_keys_refused_for_one_feature_make_one_line() -> None:
    t = translate([f"+actor_rollout_ref.actor.megatron.k{i}=1" for i in range(6)] + ["global_profiler.save_path=x"])
    assert len(t.problems) == 2, t.problems
    assert t.problems[0].startswith("not implemented in vlmrl: the Megatron-LM backend") and "(6 keys)" in t.problems[0]
