"""Every key of verl's own config gets one answer from vlmrl: kept, aliased, accepted with a notice, or refused naming
its feature (``vlmrl/config/verl/rules.py``); never a "did you mean" towards an unrelated key. The key list is verl
0.9.1's (``vlmrl/config/verl/keys.txt``, regenerated from the installed verl by scripts/verl_keys.py)."""

from __future__ import annotations

import importlib.util
import re
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
    """No dead rules: each pattern covers a key of verl 0.9.1 (its fully-async trainer's config too), or one that
    verl's scripts of 2025-26 still pass."""
    older = {
        "trainer.use_legacy_worker_impl",
        "trainer.max_ckpt_to_keep",
        "actor_rollout_ref.rollout.mode",
        "actor_rollout_ref.model.use_remove_padding",
        "data.return_raw_chat",
        "data.return_raw_input_ids",
        "data.return_full_prompt",
        "reward_model.overlong_buffer.enable",
        "trainer.balance_batch",
        "actor_rollout_ref.model.use_fused_kernels",
        "actor_rollout_ref.model.use_liger",
        "algorithm.kl_penalty",
        "algorithm.lam",
        "npu_profile.options",
        "reward.custom_reward_function.reward_kwargs",
        "actor_rollout_ref.rollout.multi_turn.interaction_config_path",
        "actor_rollout_ref.actor.fsdp_config.grad_offload",
        "critic.model.fsdp_config.param_offload",
        "critic.model.fsdp_config.optimizer_offload",
        "critic.model.fsdp_config.fsdp_size",
        "reward_model.model.fsdp_config.fsdp_size",  # the FSDP reward-model worker's (below)
        "trainer.use_ray",  # vlmrl's own older key (now trainer.launcher)
        "async.fallback_kl",
        "async.tis_by_default",  # vlmrl's short form of async_training.*
        # the FSDP reward-model worker's keys (verl before the reward loop; its scripts of 2025 still pass them)
        "reward_model.strategy",
        "reward_model.use_dynamic_bsz",
        "reward_model.forward_max_token_len_per_gpu",
        "reward_model.ulysses_sequence_parallel_size",
        "reward_model.launch_reward_fn_async",
        "reward_model.micro_batch_size",
        "reward_model.model.use_remove_padding",
        "reward_model.model.use_fused_kernels",
        # verl's fully-async trainer's own config (verl/experimental/fully_async_policy/config/)
        "async_training.use_rollout_log_probs",
        "async_training.compute_prox_log_prob",
        "async_training.checkpoint_engine.enable",
        "async_training.use_trainer_do_validate",
        "rollout.total_epochs",
    }
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
        (
            "actor_rollout_ref.rollout.max_num_seqs=64",
            ALIAS,
            "++actor_rollout_ref.rollout.engine_kwargs.vllm.max_num_seqs=64",
        ),
        ("reward.custom_reward_function.path=r.py", ALIAS, "++custom_reward_function.path=r.py"),
        ("actor_rollout_ref.rollout.multi_stage_wake_up=True", FEATURE, "multi-stage wake-up (an SGLang feature)"),
        ("+actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2", FEATURE, "Megatron-LM"),
        ("global_profiler.save_path=./mem", FEATURE, "verl's profiler"),
    ],
)
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
        BASE
        + [
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
    )
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
        [
            sys.executable,
            "-m",
            "vlmrl.train",
            *BASE,
            "actor_rollout_ref.model.use_fused_kernels=True",
            "actor_rollout_ref.actor.use_torch_compile=False",
            "--cfg",
            "job",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
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


# ------------------------------------------------------------------------------------------------------ defaults

README_FOLLOWS_VERL = {
    "trainer.val_before_train": True,
    "trainer.total_epochs": 30,
    "actor_rollout_ref.model.enable_gradient_checkpointing": True,
    "data.max_prompt_length": 512,
    "data.max_response_length": 512,
    "actor_rollout_ref.actor.optim.lr": 1e-6,
    "actor_rollout_ref.actor.kl_loss_type": "low_var_kl",
    "actor_rollout_ref.actor.kl_loss_coef": 0.001,
}
"""README, "Defaults follow verl's (``trainer.val_before_train=True``, ``total_epochs=30``, gradient checkpointing on,
512-token prompts and responses, ``lr=1e-6``, KL ``low_var_kl`` 0.001)": each key with the value the README gives."""

README_DIFFERS = {
    "data.filter_overlong_prompts": (True, False),
    "actor_rollout_ref.rollout.n": (8, 1),
    "algorithm.adv_estimator": ("grpo", "gae"),
    "actor_rollout_ref.rollout.enforce_eager": (True, False),
    "trainer.logger": (["console", "jsonl"], ["console", "wandb"]),
    "trainer.n_gpus_per_node": (1, 8),
    "algorithm.filter_groups.max_num_gen_batches": (4, 0),  # verl's 0: unbounded
    "trainer.log_val_generations": (16, 0),
    "actor_rollout_ref.model.use_remove_padding": (False, True),
    "critic.model.use_remove_padding": (False, True),
}
"""README, "... except where vlmrl differs on purpose": key -> (vlmrl's default, verl's default)."""

README_SAYS = {
    "trainer.val_before_train": "`trainer.val_before_train=True`",
    "trainer.total_epochs": "`total_epochs=30`",
    "actor_rollout_ref.model.enable_gradient_checkpointing": "gradient checkpointing on",
    "data.max_prompt_length": "512-token prompts and responses",
    "data.max_response_length": "512-token prompts and responses",
    "actor_rollout_ref.actor.optim.lr": "`lr=1e-6`",
    "actor_rollout_ref.actor.kl_loss_type": "KL `low_var_kl` 0.001",
    "actor_rollout_ref.actor.kl_loss_coef": "KL `low_var_kl` 0.001",
    "data.filter_overlong_prompts": "`data.filter_overlong_prompts=True`",
    "actor_rollout_ref.rollout.n": "`rollout.n=8` (verl: 1;",
    "algorithm.adv_estimator": "`algorithm.adv_estimator=grpo` (verl: gae,",
    "actor_rollout_ref.rollout.enforce_eager": "`rollout.enforce_eager=True`",
    "trainer.logger": "`trainer.logger=[console,jsonl]`",
    "trainer.n_gpus_per_node": "`trainer.n_gpus_per_node=1` (verl: 8;",
    "algorithm.filter_groups.max_num_gen_batches": "`algorithm.filter_groups.max_num_gen_batches=4` (verl: unbounded)",
    "trainer.log_val_generations": "`trainer.log_val_generations=16`",
    "actor_rollout_ref.model.use_remove_padding": "`model.use_remove_padding=False` (verl: True;",
    "critic.model.use_remove_padding": "`critic.model.use_remove_padding=False`",
}
"""Where the README's defaults paragraph states each value of ``README_FOLLOWS_VERL`` and ``README_DIFFERS``."""

UNDOCUMENTED = {
    # verl 0.9.1 leaves its legacy reward_model.* block null (it migrates only the values set to reward.reward_model.*);
    # vlmrl's own reward_model.* keys hold their real defaults (verl's reward.reward_model.* ones where it has them)
    "reward_model.enable",
    "reward_model.model.trust_remote_code",
    "reward_model.rollout.name",
    "reward_model.rollout.prompt_length",
    "reward_model.rollout.response_length",
    "reward_model.rollout.gpu_memory_utilization",
    # the example values of verl's file, not settings: vlmrl has no default run to point them at
    "data.train_files",
    "data.val_files",
    "actor_rollout_ref.model.path",
    "critic.model.path",  # vlmrl: None = the actor's path (verl: an example path)
    "trainer.project_name",
    "trainer.experiment_name",
    # None = "the same as actor.clip_ratio" (0.2, verl's value for both)
    "actor_rollout_ref.actor.clip_ratio_low",
    "actor_rollout_ref.actor.clip_ratio_high",
    # vlmrl's own defaults for its engine and devices: "auto" picks bf16 on GPUs and fp32 on CPUs; FSDP2 only;
    # no tensor parallelism, chunked prefill and batched-token limits left to vLLM; the device found at start
    "actor_rollout_ref.actor.fsdp_config.dtype",
    "actor_rollout_ref.ref.fsdp_config.dtype",
    "actor_rollout_ref.rollout.dtype",
    "actor_rollout_ref.actor.strategy",
    "critic.strategy",
    "critic.fsdp.dtype",
    "trainer.device",
    "actor_rollout_ref.rollout.tensor_model_parallel_size",
    "actor_rollout_ref.rollout.enable_chunked_prefill",
    "actor_rollout_ref.rollout.max_num_batched_tokens",
    "actor_rollout_ref.rollout.load_format",  # verl's "dummy" is refused (test_config)
    # batch sizes, seeds and worker counts a one-machine run can start with
    "data.train_batch_size",
    "actor_rollout_ref.actor.ppo_mini_batch_size",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "actor_rollout_ref.rollout.seed",
    "data.seed",
    "data.dataloader_num_workers",
    "reward.num_workers",
    # names with a vlmrl meaning: the default function name of a reward file, the schedule's name, the metric of
    # dynamic sampling (vlmrl's "score" is verl's per-sample reward)
    "custom_reward_function.name",
    "actor_rollout_ref.actor.optim.warmup_style",
    "critic.optim.warmup_style",
    "algorithm.filter_groups.metric",
}
"""Keys both configs have whose defaults differ and that the README's list does not name (each a known, deliberate
difference; a new one fails ``test_no_other_default_drifts_from_verls``)."""


def vlmrl_defaults() -> dict[str, object]:
    """vlmrl's default value of every leaf key (``configs/grpo.yaml`` over the schema, as a launch composes it)."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.structured(load(BASE))
    out = {}
    for key in leaf_keys():
        value = OmegaConf.select(cfg, key, default=None)
        out[key] = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
    return out


def same(a: object, b: object) -> bool:
    """Equal values; floats to rounding (1e-6 parsed two ways)."""
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and a == pytest.approx(b, rel=1e-9)
    return a == b


def test_defaults_the_readme_says_follow_verl_equal_verls_own() -> None:
    """Each default the README says follows verl's equals the value in verl's own generated trainer config (read
    from the installed verl, not copied here) and the value the README states."""
    verl, ours = verl_defaults(), vlmrl_defaults()
    for key, readme in README_FOLLOWS_VERL.items():
        assert same(verl[key], readme), (key, verl[key], readme)
        assert same(ours[key], verl[key]), (key, ours[key], verl[key])
        assert type(ours[key]) is type(verl[key]), key  # 30 epochs, not 30.0; True, not "true"


def test_the_readme_states_the_defaults_these_tests_check() -> None:
    """README_FOLLOWS_VERL and README_DIFFERS are the defaults paragraph (docs/configuration.md): each value is
    stated there, and every deliberate difference the paragraph names (a backticked ``key=value``) is one of them."""
    text = (REPO / "docs" / "configuration.md").read_text()
    start = text.index("Defaults follow verl's")
    para = re.sub(r"\s+", " ", text[start : text.index("\n\n", start)])
    assert set(README_SAYS) == set(README_FOLLOWS_VERL) | set(README_DIFFERS)
    for key, phrase in README_SAYS.items():
        assert phrase in para, (key, phrase)
    named = set(re.findall(r"`([\w.]+)=[^`]*`", para.split("except where vlmrl differs on purpose", 1)[1]))
    assert {k for k in README_DIFFERS if any(k.endswith(n) for n in named)} == set(README_DIFFERS), named
    assert len(named) == len(README_DIFFERS), named


def test_defaults_the_readme_says_differ_differ_as_it_says() -> None:
    """Each deliberate difference the README lists: vlmrl's default and verl's (read from verl's file) are the ones
    it names."""
    verl, ours = verl_defaults(), vlmrl_defaults()
    for key, (mine, theirs) in README_DIFFERS.items():
        assert verl[key] == theirs, (key, verl[key])
        assert ours[key] == mine, (key, ours[key])


def test_no_other_default_drifts_from_verls() -> None:
    """Every other key vlmrl shares with verl's config has verl's default, but for the known differences listed in
    ``UNDOCUMENTED``; a new difference (or a listed one that is gone) fails here."""
    verl, ours = verl_defaults(), vlmrl_defaults()
    differ = set()
    for key, value in verl.items():
        if key not in ours:
            continue
        if not same(ours[key], value):
            differ.add(key)
    assert differ - set(README_DIFFERS) == UNDOCUMENTED, {
        "new": sorted(differ - set(README_DIFFERS) - UNDOCUMENTED),
        "gone": sorted(UNDOCUMENTED - differ),
    }
    assert len([k for k in verl if k in ours]) > 100  # the comparison covered the shared keys


def test_vlmrl_never_imports_verl() -> None:
    """README (Install): verl is installed for the tests only; no module of the package, its rewards or its
    preprocessing imports it (verl's reward files run through vlmrl's own loader, as user files)."""
    import ast

    found = []
    for folder in ("vlmrl", "rewards", "preprocess"):
        for path in sorted((REPO / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                if any(n == "verl" or n.startswith("verl.") for n in names):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not found, found
