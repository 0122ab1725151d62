"""The config gate: every check a run passes before anything expensive starts, each problem with its fix.

``check_values`` looks at the config's values and the Prometheus token file they name (run by ``build``, so a
composed config is a checked one); ``check_environment`` looks at the machine the run would start on (files, model
folder, output folder, tools, Ray's authentication); ``batch_problems`` at how the batches split over the workers it
would start there (``planned_world``: CPU workers or GPUs) and their engines (``machine_problems``: both, run by
``command.compose`` for ``python -m vlmrl.train``); ``data_problems`` at what only the data can tell (run by the
trainer and the dry run). Each returns every problem, not only the first; ``check_config`` raises the machine's
together.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vlmrl.config import fully_async
from vlmrl.config.errors import ConfigError
from vlmrl.config.network import prometheus_problems, ray_auth_problem
from vlmrl.config.plan import RunPlan, critic_plan, needs_of, planned_device, run_plan, token_budgets
from vlmrl.config.reward_model import reward_model_environment, reward_model_problems
from vlmrl.config.schema import TOTAL_SCORE_NAMES, RewardConfig, RolloutConfig, VLMRLConfig
from vlmrl.userfiles import short_name


def _positive(problems: list[str], key: str, value: Any, fix: str = "") -> None:
    if value is None or not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 1:
        problems.append(f"{key}={value!r}: must be a whole number >= 1{fix}.")


def check_values(cfg: VLMRLConfig) -> list[str]:
    """Problems of the config's values (no devices; the one file read is the Prometheus token file it names, whose
    owner-only permissions are part of the setting); every one says how to fix it."""
    p = number_problems(cfg) + algorithm_problems(cfg) + token_budget_problems(cfg)
    p += multi_turn_problems(cfg) + video_problems(cfg) + ppo_problems(cfg) + engine_problems(cfg)
    p += reward_problems(cfg.reward) + reward_key_problems(cfg) + reward_model_problems(cfg)
    tr = cfg.trainer
    if tr.val_only and not cfg.data.val_files:
        p.append("trainer.val_only=True evaluates on data.val_files: set data.val_files=<parquet>.")
    if tr.resume_mode == "resume_path" and not tr.resume_from_path:
        p.append("trainer.resume_mode=resume_path needs trainer.resume_from_path=<global_step_N dir>.")
    if "prometheus" in list(tr.logger or []):
        p += prometheus_problems(tr.prometheus.host, tr.prometheus.port, tr.prometheus.token_file)
    return p


def number_problems(cfg: VLMRLConfig) -> list[str]:
    """Sizes, counts, rates and bounds that must be positive, finite or in a range."""
    p: list[str] = []
    arr, data, tr = cfg.actor_rollout_ref, cfg.data, cfg.trainer
    actor, ro = arr.actor, arr.rollout
    lr = actor.optim.lr
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        p.append(f"actor_rollout_ref.actor.optim.lr={lr!r}: must be a finite number > 0 (e.g. 1e-6).")
    if not 0.0 <= actor.optim.lr_warmup_steps_ratio <= 1.0:
        p.append(f"actor_rollout_ref.actor.optim.lr_warmup_steps_ratio={actor.optim.lr_warmup_steps_ratio}: 0 to 1.")
    _positive(p, "actor_rollout_ref.actor.ppo_epochs", actor.ppo_epochs, " (passes over each batch)")
    _positive(p, "data.train_batch_size", data.train_batch_size)
    _positive(p, "actor_rollout_ref.actor.ppo_mini_batch_size", actor.ppo_mini_batch_size)
    _positive(p, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", actor.ppo_micro_batch_size_per_gpu)
    for key, value in (
        ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", ro.log_prob_micro_batch_size_per_gpu),
        ("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", arr.ref.log_prob_micro_batch_size_per_gpu),
        ("data.val_batch_size", data.val_batch_size),
        ("trainer.total_training_steps", tr.total_training_steps),
    ):
        if value is not None:
            _positive(p, key, value, " (or null)")
    _positive(p, "trainer.total_epochs", tr.total_epochs)
    _positive(p, "data.max_prompt_length", data.max_prompt_length)
    _positive(p, "data.max_response_length", data.max_response_length)
    _positive(p, "actor_rollout_ref.rollout.n", ro.n, " (samples per prompt)")
    _positive(p, "actor_rollout_ref.rollout.val_kwargs.n", ro.val_kwargs.n)
    _positive(p, "trainer.nnodes", tr.nnodes)
    _positive(p, "trainer.n_gpus_per_node", tr.n_gpus_per_node)
    _positive(p, "trainer.cpu_workers", tr.cpu_workers)
    for key, fc in fsdp_groups(cfg):
        if isinstance(fc.fsdp_size, bool) or fc.fsdp_size == 0 or fc.fsdp_size < -1:
            p.append(f"{key}.fsdp_size={fc.fsdp_size!r}: -1 (shard over all workers) or a number of workers >= 1.")
    for key, fc in (("actor", actor.fsdp_config), ("ref", arr.ref.fsdp_config)):
        if fc.wrap_policy.min_num_params < 0:
            p.append(
                f"actor_rollout_ref.{key}.fsdp_config.wrap_policy.min_num_params={fc.wrap_policy.min_num_params}:"
                " must be >= 0 (0: every decoder layer and vision block is an FSDP unit)."
            )
    _positive(p, "actor_rollout_ref.rollout.tensor_model_parallel_size", ro.tensor_model_parallel_size)
    _positive(p, "actor_rollout_ref.nccl_timeout", arr.nccl_timeout, " (seconds)")
    for key in ("worker_timeout_s", "worker_startup_timeout_s"):
        if not (math.isfinite(getattr(tr, key)) and getattr(tr, key) > 0):
            p.append(f"trainer.{key}={getattr(tr, key)}: must be a finite number of seconds > 0.")
    p += sampling_problems(ro)
    for key, value in (
        ("actor_rollout_ref.actor.grad_clip", actor.grad_clip),
        ("actor_rollout_ref.actor.clip_ratio", actor.clip_ratio),
    ):
        if not (math.isfinite(value) and value > 0):
            p.append(f"{key}={value}: must be a finite number > 0.")
    for key, value in (
        ("actor_rollout_ref.actor.kl_loss_coef", actor.kl_loss_coef),
        ("actor_rollout_ref.actor.entropy_coeff", actor.entropy_coeff),
    ):
        if not math.isfinite(value):
            p.append(f"{key}={value}: must be finite.")
    return p


def sampling_problems(ro: RolloutConfig) -> list[str]:
    """The rollout's temperature and top-p."""
    p: list[str] = []
    if not (math.isfinite(ro.temperature) and ro.temperature >= 0):
        p.append(f"actor_rollout_ref.rollout.temperature={ro.temperature}: must be >= 0.")
    elif ro.temperature == 0 and ro.n > 1:
        p.append(
            f"actor_rollout_ref.rollout.temperature=0 with rollout.n={ro.n}: greedy decoding gives {ro.n} identical "
            "samples per prompt (no reward variance, no learning); use a temperature > 0 (e.g. 1.0)."
        )
    if not 0 < ro.top_p <= 1:
        p.append(f"actor_rollout_ref.rollout.top_p={ro.top_p}: must be in (0, 1].")
    return p


def algorithm_problems(cfg: VLMRLConfig) -> list[str]:
    """The plugins, the estimator (and what it declares it needs), the policy loss, the algorithm class."""
    from vlmrl.algorithms import load_plugins  # torch (as in vlmrl.config.plan.needs_of)
    from vlmrl.algorithms.estimators import Needs, estimator_needs
    from vlmrl.algorithms.losses import get_policy_loss

    p: list[str] = []
    alg, actor, ro = cfg.algorithm, cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    try:
        load_plugins(alg.plugins)
    except (FileNotFoundError, ImportError, ValueError, SyntaxError) as e:
        p.append(f"algorithm.plugins: {type(e).__name__}: {e}")
    needs = Needs()
    try:
        needs = estimator_needs(alg.adv_estimator)
    except (ValueError, FileNotFoundError, AttributeError, ImportError) as e:
        p.append(f"algorithm.adv_estimator: {e}")
    try:
        get_policy_loss(actor.policy_loss.loss_mode)
    except (ValueError, FileNotFoundError, AttributeError, ImportError) as e:
        p.append(f"actor_rollout_ref.actor.policy_loss.loss_mode: {e}")
    if actor.policy_loss.loss_mode == "dro" and not (actor.policy_loss.dro_beta or 0) > 0:
        p.append(
            "actor_rollout_ref.actor.policy_loss.loss_mode=dro needs actor_rollout_ref.actor.policy_loss.dro_beta "
            "> 0 (the weight of its quadratic log-ratio penalty)."
        )
    if 0.0 < actor.clip_ratio_c <= 1.0 and actor.policy_loss.loss_mode in ("vanilla", "ppo"):
        p.append(
            f"actor_rollout_ref.actor.clip_ratio_c={actor.clip_ratio_c}: the dual clip's bound must be > 1 "
            "(verl's default 3.0), or 0 for no dual clip."
        )
    p.extend(loss_setting_problems(cfg))
    p.extend(rollout_correction_problems(cfg))
    p.extend(algorithm_class_problems(cfg))
    if alg.gdpo_reward_weights is not None and len(alg.gdpo_reward_weights) != len(alg.gdpo_reward_keys or []):
        p.append(
            f"algorithm.gdpo_reward_weights has {len(alg.gdpo_reward_weights)} weight(s) for "
            f"{len(alg.gdpo_reward_keys or [])} algorithm.gdpo_reward_keys: give one weight per key."
        )
    if needs.group and ro.n < 2:
        p.append(
            f"algorithm.adv_estimator={alg.adv_estimator} compares the samples of a prompt: "
            f"set actor_rollout_ref.rollout.n >= 2 (got {ro.n})."
        )
    return p


def component_names(components: list[Any]) -> list[str] | None:
    """The names of ``reward.components``' entries, known before any reward loads: each entry's ``name``, else its
    function's short name (``userfiles.short_name``, the rule the reward itself uses); None when an entry is not
    one the reward would build (its own check names it)."""
    names = []
    for entry in components:
        spec = entry if isinstance(entry, str) else entry.get("function") if isinstance(entry, Mapping) else None
        if not spec:
            return None
        name = entry.get("name") if isinstance(entry, Mapping) else None
        names.append(str(name or short_name(str(spec))))
    return names


def reward_key_problems(cfg: VLMRLConfig) -> list[str]:
    """``algorithm.gdpo_reward_keys`` and ``algorithm.filter_groups.metric`` against the reward's components, when
    the reward is a ``reward.components`` list (a dict-valued component adds ``name/<key>`` entries). A reward of one
    function reports its keys only when it runs: step 1 names a key it lacks."""
    r, alg = cfg.reward, cfg.algorithm
    names = component_names(list(r.components)) if r.components and not r.dispatch else None
    if names is None:
        return []

    def known(key: str) -> bool:
        return key in names or any(key.startswith(f"{n}/") for n in names)

    p = []
    listed = ", ".join(names)
    for key in alg.gdpo_reward_keys or []:
        if not known(key):
            p.append(
                f"algorithm.gdpo_reward_keys: {key!r} is not a reward component (reward.components: {listed}; a "
                "dict-valued component's entries are <name>/<key>)."
            )
    fg = alg.filter_groups
    if fg.enable and fg.metric not in TOTAL_SCORE_NAMES and not known(fg.metric):
        p.append(
            f"algorithm.filter_groups.metric={fg.metric!r} is neither the total ({', '.join(TOTAL_SCORE_NAMES)}) "
            f"nor a reward component (reward.components: {listed})."
        )
    return p


def loss_setting_problems(cfg: VLMRLConfig) -> list[str]:
    """The policy losses' settings against their valid ranges (verl's, and where verl checks nothing, the range in
    which the loss still trains: a bound that makes every term zero, or a division by zero, is refused)."""
    actor, key = cfg.actor_rollout_ref.actor, "actor_rollout_ref.actor"
    pl, mode = actor.policy_loss, actor.policy_loss.loss_mode
    p: list[str] = []

    def bad(name: str, value: Any, ok: bool, rule: str) -> None:
        if not (isinstance(value, int | float) and math.isfinite(value) and ok):
            p.append(f"{key}.{name}={value}: {rule}.")

    if actor.clip_ratio_low is not None:
        rule = "must be in [0, 1) (the ratio's lower clip is 1 - it)"
        bad("clip_ratio_low", actor.clip_ratio_low, 0 <= actor.clip_ratio_low < 1, rule)
    if actor.clip_ratio_high is not None:
        bad("clip_ratio_high", actor.clip_ratio_high, actor.clip_ratio_high >= 0, "must be a finite number >= 0")
    bad("clip_ratio_c", actor.clip_ratio_c, actor.clip_ratio_c >= 0, "must be a finite number >= 0 (0: no dual clip)")
    if mode == "sapo":
        for name in ("tau_pos", "tau_neg"):
            value = getattr(actor, name)
            bad(name, value, value > 0, "SAPO's gate temperature must be > 0 (its gate divides by it)")
    if mode == "clip_cov":
        share = "a share of the tokens, in (0, 1]"
        bad("policy_loss.clip_cov_ratio", pl.clip_cov_ratio, 0 < pl.clip_cov_ratio <= 1, share)
        if not pl.clip_cov_lb <= pl.clip_cov_ub:
            p.append(f"{key}.policy_loss.clip_cov_lb={pl.clip_cov_lb} > clip_cov_ub={pl.clip_cov_ub}: no token is cut.")
    if mode == "kl_cov":
        bad("policy_loss.kl_cov_ratio", pl.kl_cov_ratio, 0 < pl.kl_cov_ratio <= 1, "a share of the tokens, in (0, 1]")
        bad("policy_loss.ppo_kl_coef", pl.ppo_kl_coef, pl.ppo_kl_coef >= 0, "must be a finite number >= 0")
    return p


def token_budget_problems(cfg: VLMRLConfig) -> list[str]:
    """Token budgets of the dynamic batch sizes, and the generation batch."""
    p: list[str] = []
    arr, data = cfg.actor_rollout_ref, cfg.data
    actor, ro = arr.actor, arr.rollout
    _positive(p, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu", actor.ppo_max_token_len_per_gpu)
    for key, budget in (
        ("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu", arr.ref.log_prob_max_token_len_per_gpu),
        ("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu", ro.log_prob_max_token_len_per_gpu),
    ):
        if budget is not None:
            _positive(p, key, budget)
    longest = data.max_prompt_length + data.max_response_length
    for key, on, budget in token_budgets(arr).values():
        if on and isinstance(budget, int) and budget < longest:
            p.append(
                f"{key}={budget} with dynamic batch sizes: a sample can hold data.max_prompt_length + "
                f"data.max_response_length = {longest} tokens; set the budget to at least that."
            )
    streamed = fully_async.is_fully_async(cfg) and data.gen_batch_size == 1  # (verl's: one prompt at a time)
    if data.gen_batch_size is not None and data.gen_batch_size != data.train_batch_size and not streamed:
        p.append(
            f"data.gen_batch_size={data.gen_batch_size}: vlmrl rolls out data.train_batch_size={data.train_batch_size}"
            f" prompts per batch (also with algorithm.filter_groups; max_num_gen_batches bounds the extra batches); "
            f"unset it or set it to {data.train_batch_size}."
        )
    return p


def engine_problems(cfg: VLMRLConfig) -> list[str]:
    """The rollout engine's own settings: vLLM's multimodal cache off, no other engine's settings."""
    p: list[str] = []
    ro = cfg.actor_rollout_ref.rollout
    cache_problem = cache_kept_on(dict((ro.engine_kwargs or {}).get("vllm") or {}))
    if cache_problem:
        p.append(cache_problem + ".")
    other_engines = {k: v for k, v in (ro.engine_kwargs or {}).items() if k != "vllm" and v}
    if other_engines:
        p.append(
            f"actor_rollout_ref.rollout.engine_kwargs: {sorted(other_engines)} are settings of other rollout engines; "
            "vlmrl runs vLLM (engine_kwargs.vllm.*) or transformers (rollout.name=hf)."
        )
    return p


INLINE_TIMEOUT = (
    "reward.num_workers=0 scores in the driver's own thread, where nothing can stop a call that blocks (a sleep, a "
    "socket read): set reward.timeout_s=0 with it (no timeout, for debugging), or reward.num_workers>=1 (worker "
    "processes, where reward.timeout_s is enforced by ending the worker)."
)


def algorithm_class_problems(cfg: VLMRLConfig) -> list[str]:
    """``algorithm.name``: the class loads and takes ``algorithm.params``; parameters without a class are unknown
    keys (named with the nearest key)."""
    from vlmrl.config.keys import nearest_key

    alg = cfg.algorithm
    if alg.name is None:
        out = []
        for k in alg.params:
            near = nearest_key(f"algorithm.{k}")
            out.append(
                f"Unknown config key 'algorithm.{k}'."
                + (f" Did you mean '{near}'?" if near else "")
                + " (keys under algorithm other than the schema's are the arguments of algorithm.name's "
                "class, and none is set)"
            )
        return out
    from vlmrl.algorithms.algorithm import build_algorithm

    try:
        build_algorithm(alg.name, dict(alg.params))
    except Exception as e:  # noqa: BLE001 - a user's file: anything it raises at import or construction
        return [f"algorithm.name={alg.name!r}: {type(e).__name__}: {e}"]
    return []


def rollout_correction_problems(cfg: VLMRLConfig) -> list[str]:
    """``algorithm.rollout_correction``: the bypass loss only through bypass mode (as verl), the settings parsed (as
    the workers will), and a sampling temperature of 1 (the engine reports log-probs of the unscaled
    distribution)."""
    rc = cfg.algorithm.rollout_correction
    key = "algorithm.rollout_correction"
    p = []
    if cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "bypass_mode" and not rc.bypass_mode:
        p.append(
            "actor_rollout_ref.actor.policy_loss.loss_mode=bypass_mode: set algorithm.rollout_correction."
            "bypass_mode=True instead (as in verl, the trainer then picks this loss and the old log-probs)."
        )
    if rc.loss_type not in ("ppo_clip", "reinforce"):
        p.append(f"{key}.loss_type={rc.loss_type!r}: use ppo_clip | reinforce (bypass mode's loss).")
    if not rc.enabled:
        return p
    from vlmrl.algorithms.rollout_correction import IS_LEVELS, parse_is_threshold, parse_rs

    try:
        if rc.rollout_is is not None:
            if rc.rollout_is not in IS_LEVELS:
                raise ValueError(f"{key}.rollout_is={rc.rollout_is!r}: use token | sequence")
            parse_is_threshold(rc.rollout_is_threshold)
        if rc.rollout_rs is not None:
            parse_rs(rc.rollout_rs, rc.rollout_rs_threshold)
    except (ValueError, TypeError) as e:
        p.append(str(e))
    if cfg.actor_rollout_ref.rollout.temperature != 1.0:
        p.append(
            f"{key}: needs actor_rollout_ref.rollout.temperature=1.0 (got "
            f"{cfg.actor_rollout_ref.rollout.temperature}): the engine reports log-probs of the unscaled "
            "distribution, the trainer of the scaled one."
        )
    return p


def ppo_problems(cfg: VLMRLConfig) -> list[str]:
    """The critic's, GAE's and the in-reward KL's settings."""
    alg, c, p = cfg.algorithm, cfg.critic, []
    if needs_of(cfg).critic and c.enable is False:
        p.append(
            f"algorithm.adv_estimator={alg.adv_estimator} needs the critic's values: drop critic.enable=False "
            "(or set True)."
        )
    for key, value in (("algorithm.gamma", alg.gamma), ("algorithm.lam", alg.lam)):
        if not (math.isfinite(value) and 0.0 <= value <= 1.0):
            p.append(f"{key}={value}: must be between 0 and 1.")
    kc = alg.kl_ctrl
    if not (math.isfinite(kc.kl_coef) and kc.kl_coef >= 0):
        p.append(f"algorithm.kl_ctrl.kl_coef={kc.kl_coef}: must be a finite number >= 0.")
    if kc.type == "adaptive":
        if kc.horizon <= 0:
            p.append(f"algorithm.kl_ctrl.horizon={kc.horizon}: the adaptive controller needs a horizon > 0.")
        if not (math.isfinite(kc.target_kl) and kc.target_kl > 0):
            p.append(f"algorithm.kl_ctrl.target_kl={kc.target_kl}: the adaptive controller needs a target > 0.")
    plan = critic_plan(cfg)
    if plan is None:
        return p
    lr = plan.optim.lr
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        p.append(f"critic.optim.lr={lr!r}: must be a finite number > 0 (e.g. 1e-5).")
    for key, value in (("critic.cliprange_value", plan.cliprange_value), ("critic.grad_clip", plan.grad_clip)):
        if not (math.isfinite(value) and value > 0):
            p.append(f"{key}={value}: must be a finite number > 0.")
    for key, value in (
        ("critic.ppo_mini_batch_size", plan.mini_batch_size),
        ("critic.ppo_micro_batch_size_per_gpu", plan.micro_batch_size),
        ("critic.forward_micro_batch_size_per_gpu", plan.forward_micro_batch_size),
        ("critic.ppo_epochs", plan.epochs),
        ("critic.ppo_max_token_len_per_gpu", plan.max_token_len),
        ("critic.forward_max_token_len_per_gpu", plan.forward_max_token_len),
    ):
        _positive(p, key, value)
    longest = cfg.data.max_prompt_length + cfg.data.max_response_length
    if plan.use_dynamic_bsz:
        for key, budget in (
            ("critic.ppo_max_token_len_per_gpu", plan.max_token_len),
            ("critic.forward_max_token_len_per_gpu", plan.forward_max_token_len),
        ):
            if isinstance(budget, int) and 1 <= budget < longest:
                p.append(
                    f"{key}={budget} with dynamic batch sizes: a sample can hold data.max_prompt_length + "
                    f"data.max_response_length = {longest} tokens; set the budget to at least that."
                )
    return p


def unused_settings(cfg: VLMRLConfig, overrides: list[str], plan: RunPlan | None = None) -> tuple[list[str], list[str]]:
    """(problems, notices) for PPO settings the command line sets that this run would not use: ``critic.*`` without
    a critic is refused (vlmrl's default estimator is grpo, verl's gae: a verl PPO script would otherwise train GRPO
    without its critic); the in-reward KL's settings while it is off, and GAE's or discounting's with an estimator
    that does not use them, are notices (verl ignores them the same way). ``plan``: the gate's (None: derived)."""
    plan = plan or run_plan(cfg)
    keys = [o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o]
    problems, notices = [], []
    alg = cfg.algorithm
    # (critic.strategy names the backend only: verl's GRPO scripts pass critic.strategy=fsdp2 beside the actor's)
    critic = [k for k in keys if k.startswith("critic.") and k not in ("critic.enable", "critic.strategy")]
    if "critic.strategy" in keys and plan.critic is None:
        notices.append(f"critic.strategy: this run builds no critic (algorithm.adv_estimator={alg.adv_estimator})")
    if critic and plan.critic is None:
        problems.append(
            f"{critic[0]} is set but this run builds no critic: algorithm.adv_estimator={alg.adv_estimator} (vlmrl's "
            "default is grpo; verl's default, gae, is the estimator that uses a critic). Add "
            "algorithm.adv_estimator=gae for PPO with a critic (or critic.enable=True), or drop the critic.* settings."
        )
    kl = [k for k in keys if k == "algorithm.kl_penalty" or k.startswith("algorithm.kl_ctrl.")]
    if kl and not alg.use_kl_in_reward:
        notices.append(f"{', '.join(kl)}: the in-reward KL is off (algorithm.use_kl_in_reward=False), as in verl")
    reads = plan.needs.reads  # what the estimator declares it reads (a user's: both, by default)
    if "algorithm.lam" in keys and "lam" not in reads:
        notices.append(f"algorithm.lam: GAE's lambda; algorithm.adv_estimator={alg.adv_estimator} does not use it")
    if "algorithm.gamma" in keys and "gamma" not in reads:
        notices.append(
            f"algorithm.gamma: algorithm.adv_estimator={alg.adv_estimator} scores whole responses (no discounting)"
        )
    return problems, notices


def cache_kept_on(user: dict[str, Any]) -> str | None:
    """Why engine kwargs that would turn the multimodal preprocessor cache back on are refused (None if they do not):
    across RL steps it grows host memory without bound (EasyR1 #159, vLLM #12973)."""
    on = (user.get("disable_mm_preprocessor_cache") is False) or (user.get("mm_processor_cache_gb") or 0) > 0
    if not on:
        return None
    return (
        "actor_rollout_ref.rollout.engine_kwargs.vllm: vlmrl keeps vLLM's multimodal preprocessor cache off (it grows "
        "host memory without bound across RL steps: EasyR1 #159, vLLM #12973); drop disable_mm_preprocessor_cache="
        "False / mm_processor_cache_gb > 0"
    )


def reward_problems(r: RewardConfig) -> list[str]:
    """Problems of ``reward.*`` values (the config gate runs it; so does ``RewardManager`` for one built from a
    ``RewardConfig`` directly)."""
    p = []
    if not 0.0 < r.max_failed_ratio <= 1.0:
        p.append(
            f"reward.max_failed_ratio={r.max_failed_ratio}: must be in (0, 1] (1.0 = stop only when every sample "
            "failed)."
        )
    if r.on_error not in ("fallback", "raise"):
        p.append(f"reward.on_error={r.on_error!r}: use fallback | raise.")
    if r.num_workers < 0:
        p.append(f"reward.num_workers={r.num_workers}: must be >= 0.")
    elif r.num_workers == 0 and r.timeout_s > 0:
        p.append(INLINE_TIMEOUT)
    elif r.num_workers > 0 and not r.timeout_s > 0:
        p.append(f"reward.timeout_s={r.timeout_s}: reward worker processes need a timeout > 0.")
    if not math.isfinite(r.fallback_score):
        p.append(f"reward.fallback_score={r.fallback_score}: must be finite.")
    return p


def fsdp_groups(cfg: VLMRLConfig) -> list[tuple[str, Any]]:
    """(key, FSDP settings) of each model the workers shard: the actor, the reference and the critic."""
    arr = cfg.actor_rollout_ref
    return [
        ("actor_rollout_ref.actor.fsdp_config", arr.actor.fsdp_config),
        ("actor_rollout_ref.ref.fsdp_config", arr.ref.fsdp_config),
        ("critic.fsdp", cfg.critic.fsdp),
    ]


def batch_problems(cfg: VLMRLConfig, plan: RunPlan | None = None) -> list[str]:
    """Batch sizes that do not split over the planned workers, and engine groups that do not fit them (call it on
    values ``check_values`` accepted; ``plan``: the gate's, None: derived)."""
    plan = plan or run_plan(cfg)
    arr, data = cfg.actor_rollout_ref, cfg.data
    world = plan.world
    p = []
    if cfg.trainer.nnodes > 1 and cfg.trainer.launcher == "local":
        p.append(
            f"trainer.nnodes={cfg.trainer.nnodes} with trainer.launcher=local: the local launcher runs on this machine "
            "only; several machines train as a Ray cluster (README, GPUs and clusters: launcher auto or ray)."
        )
    if data.train_batch_size % world:
        p.append(
            f"data.train_batch_size={data.train_batch_size} must be divisible by the {world} workers "
            f"(trainer.nnodes x trainer.cpu_workers on CPU, trainer.nnodes x trainer.n_gpus_per_node on GPU)."
        )
    mini = arr.actor.ppo_mini_batch_size
    if mini > data.train_batch_size or data.train_batch_size % mini or (mini * arr.rollout.n) % world:
        p.append(
            f"actor_rollout_ref.actor.ppo_mini_batch_size={mini} must divide data.train_batch_size="
            f"{data.train_batch_size}, and mini-batch samples (x n={arr.rollout.n}) must split over {world} workers."
        )
    for key, fc in fsdp_groups(cfg):
        if fc.fsdp_size >= 1 and world % fc.fsdp_size:
            p.append(
                f"{key}.fsdp_size={fc.fsdp_size}: the workers each parameter is sharded over: -1 (all {world}) or a "
                f"divisor of the {world} workers (1: every worker holds the whole model)."
            )
    crit = plan.critic
    if crit is not None:
        cm = crit.mini_batch_size
        if cm > data.train_batch_size or data.train_batch_size % cm or (cm * arr.rollout.n) % world:
            p.append(
                f"critic.ppo_mini_batch_size={cm} must divide data.train_batch_size={data.train_batch_size}, and "
                f"mini-batch samples (x n={arr.rollout.n}) must split over {world} workers."
            )
    p += fully_async.problems(cfg, plan.separate_pools, arr.rollout.tensor_model_parallel_size)
    if plan.separate_pools:
        return p + pool_problems(cfg, plan)
    tp = arr.rollout.tensor_model_parallel_size
    if tp > 1:
        key = f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}"
        if arr.rollout.name != "vllm":
            p.append(
                f"{key}: tensor-parallel engines are vLLM's; the HF rollout generates with the policy itself "
                "(set rollout.name=vllm or tensor_model_parallel_size=1)."
            )
        elif world % tp:
            p.append(f"{key} must divide the {world} workers (each engine is shared by {tp} of them).")
        elif plan.per_node % tp and cfg.trainer.launcher != "inline":
            what = "n_gpus_per_node" if plan.device == "cuda" else "cpu_workers"
            p.append(f"{key} must divide trainer.{what}={plan.per_node}: an engine's workers share one node.")
    return p


def pool_problems(cfg: VLMRLConfig, plan: RunPlan) -> list[str]:
    """The rollout pool of ``actor_rollout_ref.hybrid_engine=False``: its size, its engines' tensor-parallel groups,
    the launcher and the fallback threshold."""
    p: list[str] = []
    ro, pool = cfg.actor_rollout_ref.rollout, cfg.rollout
    what = "n_gpus_per_node" if plan.device == "cuda" else "cpu_workers"
    for key, value in (("rollout.nnodes", pool.nnodes), (f"rollout.{what}", plan.rollout_per_node)):
        if value < 1:
            p.append(f"{key}={value}: the rollout pool of actor_rollout_ref.hybrid_engine=False needs at least 1.")
    if cfg.trainer.launcher == "inline":
        p.append(
            "actor_rollout_ref.hybrid_engine=False with trainer.launcher=inline: the one-step off-policy "
            "trainer runs a training pool and a rollout pool side by side; use trainer.launcher=local (or "
            "ray)."
        )
    if pool.nnodes > 1 and cfg.trainer.launcher == "local":
        p.append(
            f"rollout.nnodes={pool.nnodes} with trainer.launcher=local: the local launcher runs on this machine "
            "only; a pool on several machines runs on a Ray cluster (launcher auto or ray)."
        )
    world, tp = plan.rollout_world, ro.tensor_model_parallel_size
    if tp > 1 and world > 0:
        key = f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}"
        if ro.name != "vllm":
            p.append(
                f"{key}: tensor-parallel engines are vLLM's (set rollout.name=vllm or tensor_model_parallel_size=1)."
            )
        elif plan.rollout_per_node % tp:
            p.append(f"{key} must divide rollout.{what}={plan.rollout_per_node}: an engine's workers share one node.")
    temp = ro.temperature
    if not cfg.algorithm.rollout_correction.enabled and cfg.async_training.tis_by_default and temp != 1.0:
        p.append(
            f"actor_rollout_ref.hybrid_engine=False corrects the stale batches with token-level TIS "
            f"(async_training.tis_by_default), which needs actor_rollout_ref.rollout.temperature=1.0 (got {temp}):"
            " the engine reports log-probs of the unscaled distribution; set the temperature to 1, or "
            "async_training.tis_by_default=False (no correction)."
        )
    fk = cfg.async_training.fallback_kl
    if fk is not None and not (isinstance(fk, (int, float)) and math.isfinite(fk) and fk > 0):
        p.append(
            f"async_training.fallback_kl={fk!r}: a KL above which a step waits for a fresh generation, a number "
            "> 0 (None: never)."
        )
    elif fk is not None and plan.rollout_correction is None:
        p.append(
            f"async_training.fallback_kl={fk}: the KL is measured by the rollout correction, which is off "
            "(keep async_training.tis_by_default=True or set algorithm.rollout_correction.*)."
        )
    return p


def video_problems(cfg: VLMRLConfig) -> list[str]:
    """Problems of the ``data.video_*`` values and ``rollout.limit_videos``."""
    data, ro = cfg.data, cfg.actor_rollout_ref.rollout
    p: list[str] = []
    if not (isinstance(data.video_fps, (int, float)) and math.isfinite(data.video_fps) and data.video_fps > 0):
        p.append(f"data.video_fps={data.video_fps!r}: frames per second to sample, a number > 0 (e.g. 2.0).")
    _positive(p, "data.video_min_frames", data.video_min_frames)
    _positive(p, "data.video_max_frames", data.video_max_frames)
    if isinstance(data.video_min_frames, int) and isinstance(data.video_max_frames, int):
        if data.video_max_frames < max(2, data.video_min_frames):
            p.append(
                f"data.video_max_frames={data.video_max_frames}: must be >= 2 (frames go in pairs) and >= "
                f"data.video_min_frames={data.video_min_frames}."
            )
    for key in ("video_min_pixels", "video_max_pixels", "video_total_pixels"):
        value = getattr(data, key)
        if value is not None:
            _positive(p, f"data.{key}", value, " (pixels, or null for the processor's value)")
    lo, hi = data.video_min_pixels, data.video_max_pixels
    if isinstance(lo, int) and isinstance(hi, int) and lo > hi:
        p.append(f"data.video_min_pixels={lo} > data.video_max_pixels={hi}.")
    if ro.limit_videos is not None and (isinstance(ro.limit_videos, bool) or ro.limit_videos < 0):
        p.append(f"actor_rollout_ref.rollout.limit_videos={ro.limit_videos!r}: videos per prompt, >= 0 (or null).")
    return p


def multi_turn_problems(cfg: VLMRLConfig) -> list[str]:
    """Problems of ``actor_rollout_ref.rollout.multi_turn`` (values only; ``check_environment`` checks that the tool
    file exists, and the rollout worker builds its tools at start-up)."""
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    key = "actor_rollout_ref.rollout.multi_turn"
    if not mt.enable:
        return []
    p: list[str] = []
    if not mt.tool_config_path:
        p.append(f"{key}.enable=True needs {key}.tool_config_path (verl's tool YAML: tools: [{{class_name, ...}}]).")
    for name, value in (
        ("max_assistant_turns", mt.max_assistant_turns),
        ("max_user_turns", mt.max_user_turns),
        ("max_tokens_per_turn", mt.max_tokens_per_turn),
    ):
        if value is not None:
            _positive(p, f"{key}.{name}", value, " (or null)")
    _positive(p, f"{key}.max_parallel_calls", mt.max_parallel_calls)
    _positive(p, f"{key}.max_tool_images", mt.max_tool_images)
    _positive(p, f"{key}.max_tool_response_length", mt.max_tool_response_length, " (characters)")
    if isinstance(mt.tool_workers, bool) or mt.tool_workers < 0:
        p.append(f"{key}.tool_workers={mt.tool_workers!r}: processes that run tool calls, >= 0.")
    elif mt.tool_workers == 0 and mt.tool_timeout_s != 0:
        p.append(
            f"{key}.tool_workers=0 runs tool calls in the rollout worker's own thread, where nothing can stop a call "
            f"that blocks: set {key}.tool_timeout_s=0 with it (no timeout, for debugging), or tool_workers>=1 "
            "(worker processes, where tool_timeout_s is enforced by ending the process)."
        )
    elif mt.tool_workers > 0 and not (math.isfinite(mt.tool_timeout_s) and mt.tool_timeout_s > 0):
        p.append(f"{key}.tool_timeout_s={mt.tool_timeout_s}: must be a finite number of seconds > 0.")
    return p


def _model_folder_problems(cfg: VLMRLConfig, cfg_file: Path, supported: tuple[str, ...]) -> list[str]:
    """The policy folder's model type, what its family is not trained on in vlmrl, and its language-model head."""
    from vlmrl.models.value_head import policy_head_problem

    path = cfg.actor_rollout_ref.model.path
    try:
        config = json.loads(cfg_file.read_text(encoding="utf-8"))
        mt = config.get("model_type")
    except (OSError, ValueError, AttributeError) as e:
        return [f"{cfg_file}: unreadable model config ({type(e).__name__}: {e})."]
    from vlmrl.models.families import closest_family, family_of

    if mt not in supported:
        return [
            f"actor_rollout_ref.model.path={path!r} is a {mt!r} model; vlmrl trains {', '.join(supported)}"
            f"{closest_family(mt)}."
        ]
    p = family_problems(cfg, mt)
    if problem := family_of(mt).config_problem(config):
        p.append(f"actor_rollout_ref.model.path={path!r}: {problem}.")
    try:
        head = policy_head_problem(path, config)
    except Exception:  # noqa: BLE001 - weights that do not read: the model loader names them at start-up
        head = None
    return p + ([f"actor_rollout_ref.model.path: {head}"] if head else [])


def family_problems(cfg: VLMRLConfig, model_type: str) -> list[str]:
    """What the model's family is not trained on in vlmrl (``Family.videos``, ``Family.tool_turns``) that the config
    asks for, by name (a data file's videos are refused by the dataset, naming the file and row); and pixel bounds
    for a tiled family (``Family.tiles``), whose processor bounds its own tiles."""
    from vlmrl.models.families import family_of

    fam = family_of(model_type)
    ro = cfg.actor_rollout_ref.rollout
    p = []
    if not fam.tool_turns and ro.multi_turn.enable:
        p.append(
            f"actor_rollout_ref.rollout.multi_turn.enable=True: vlmrl writes tool turns in Qwen's hermes format, "
            f"which {fam.label} ({model_type}) does not read; multi-turn tool rollouts run with the Qwen-VL families."
        )
    if not fam.videos and ro.limit_videos:
        p.append(
            f"actor_rollout_ref.rollout.limit_videos={ro.limit_videos}: vlmrl trains {fam.label} ({model_type}) on "
            "images and text, not videos; set it to 0 or null."
        )
    if fam.bidirectional_images and ro.name == "vllm" and planned_device(cfg) == "cpu":
        p.append(
            f"actor_rollout_ref.rollout.name=vllm: {fam.label} ({model_type})'s image tokens attend to each other both "
            "ways, which vLLM's CPU attention does not do (it would attend causally, and its log-probs would not be "
            "the trainer's); on CPU set actor_rollout_ref.rollout.name=hf."
        )
    if fam.tiles:
        for key in ("min_pixels", "max_pixels"):
            if getattr(cfg.data, key) is not None:
                p.append(
                    f"data.{key}={getattr(cfg.data, key)}: {fam.label} ({model_type})'s processor cuts each image "
                    "into tiles of its own size, which bound its tokens (the checkpoint's processor config: "
                    f"{fam.tiles.bounded_by}); pixel bounds do not apply to it. Drop the key."
                )
    return p


def check_environment(cfg: VLMRLConfig, plan: RunPlan | None = None) -> list[str]:
    """Problems of the machine the run would start on: data files, the model folder, the output folder (``plan``:
    the gate's, None: derived)."""
    p: list[str] = []
    arr, data, tr = cfg.actor_rollout_ref, cfg.data, cfg.trainer
    path = arr.model.path
    if not os.path.isdir(path) and (path.startswith((".", "/", "~")) or os.sep in path and path.count("/") != 1):
        p.append(
            f"actor_rollout_ref.model.path={path!r} does not exist: give a local Qwen-VL folder "
            "(python -m vlmrl.testing.tiny --output DIR builds a tiny one) or a hub id such as "
            "Qwen/Qwen2.5-VL-3B-Instruct."
        )
    elif os.path.isdir(path):
        from vlmrl.models.qwen_vl import SUPPORTED_MODEL_TYPES

        cfg_file = Path(path) / "config.json"
        if not cfg_file.is_file():
            p.append(f"actor_rollout_ref.model.path={path!r} has no config.json (not an HF model folder).")
        else:
            p += _model_folder_problems(cfg, cfg_file, SUPPORTED_MODEL_TYPES)
    for key in ("train_files", "val_files"):
        files = getattr(data, key)
        for f in [files] if isinstance(files, str) else list(files or []):
            if f and not os.path.isfile(os.path.expanduser(str(f))):
                p.append(
                    f"data.{key}: {str(f)!r} does not exist or is not a file "
                    "(make it with a preprocess/ script, e.g. python preprocess/synthetic.py --output-dir DIR)."
                )
    mt = arr.rollout.multi_turn
    if mt.enable and mt.tool_config_path and not os.path.isfile(os.path.expanduser(mt.tool_config_path)):
        p.append(f"actor_rollout_ref.rollout.multi_turn.tool_config_path: {mt.tool_config_path!r} is not a file.")
    if (plan or run_plan(cfg)).launcher == "ray" and (auth := ray_auth_problem()):
        p.append(auth + ".")
    p += reward_model_environment(cfg)
    out = Path(tr.default_local_dir)
    probe = out if out.exists() else next((q for q in out.parents if q.exists()), Path("."))
    if not probe.is_dir():
        p.append(f"trainer.default_local_dir={str(out)!r} cannot be created: {str(probe)!r} is not a folder.")
    elif not os.access(probe, os.W_OK):
        p.append(f"trainer.default_local_dir={str(out)!r} is not writable (checked {str(probe)!r}).")
    return p


@dataclass
class DataFacts:
    """What the data says that the config's values cannot: read by the trainer from its datasets and by the dry
    run from its scan (None: not known, e.g. a dry run without the model's processor)."""

    train_prompts: int | None
    """Usable training prompts (after the overlong filter)."""
    val_prompts: int | None
    """Usable validation prompts; None without ``data.val_files``."""
    videos: int
    """The most videos a prompt holds."""
    train_summary: str = ""
    """What was read and dropped (the first line of ``RLDataset.format_report``)."""
    val_summary: str = ""


def data_problems(cfg: VLMRLConfig, facts: DataFacts) -> list[str]:
    """Problems only the data can tell: no usable training or validation prompt, fewer training prompts than a
    batch, video prompts with multi-turn tools (their tools work on images)."""
    p = []
    bs, longest = cfg.data.train_batch_size, cfg.data.max_prompt_length
    for split, n, summary in (
        ("train", facts.train_prompts, facts.train_summary),
        ("val", facts.val_prompts, facts.val_summary),
    ):
        if n == 0:
            why = f" ({summary})" if summary else ""
            unset = ", or set data.val_files=null" if split == "val" else ""
            fix = f"fix the files (or data.max_prompt_length / data.max_pixels){unset}"
            p.append(
                f"data.{split}_files: no prompt survives the overlong filter (data.max_prompt_length={longest}) "
                f"and the record checks{why}; {fix}."
            )
    if facts.train_prompts and facts.train_prompts < bs:
        p.append(
            f"data.train_batch_size={bs} exceeds the {facts.train_prompts} usable training prompts"
            + (f" ({facts.train_summary})" if facts.train_summary else "")
            + "."
        )
    if facts.videos and cfg.actor_rollout_ref.rollout.multi_turn.enable:
        p.append(
            "actor_rollout_ref.rollout.multi_turn.enable=True with video prompts: multi-turn tool rollouts take image "
            "prompts only; train on the videos single-turn or drop them from the data."
        )
    return p


def machine_problems(cfg: VLMRLConfig, plan: RunPlan | None = None) -> list[str]:
    """Problems of the machine the run would start on (``check_environment``) and of how its batches split over the
    workers it would start there (``batch_problems``). Run on values ``check_values`` accepted."""
    plan = plan or run_plan(cfg)
    return check_environment(cfg, plan) + batch_problems(cfg, plan)


def check_config(cfg: VLMRLConfig) -> RunPlan:
    """Raise ConfigError listing every problem of a typed config built or changed in code: its values, then (when
    they are sane) the machine's; else return the plan the checks derived (``run_plan``). ``command.compose`` runs the
    same checks on a command line."""
    problems = fully_async.resolve(cfg) + check_values(
        cfg
    )  # (verl's fully-async defaults filled in, as composing does)
    plan = run_plan(cfg)
    problems += check_environment(cfg, plan) + (batch_problems(cfg, plan) if not problems else [])  # sane numbers
    if problems:
        raise ConfigError("\n".join(problems))
    return plan
