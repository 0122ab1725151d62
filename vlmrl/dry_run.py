"""``trainer.dry_run=True``: every check of a launch line that needs no accelerator, then the plan.

Appended to any launch line (``python -m vlmrl.train ... trainer.dry_run=True``) it checks, without starting Ray, a
model or an engine:

* keys and values (the whole config gate: ``vlmrl.config``), every problem at once;
* the data files: readable parquet with the configured columns; with the model's processor at hand (a local folder or
  a cached hub id) every record is built as training would build it, so bad rows and the prompts the overlong filter
  drops are counted;
* the model: a local folder's config (a supported Qwen-VL family), or whether a hub id is in the local cache;
* the reward: the function resolved and its calling form, and a reward for every ``data_source`` in the data;
* the engine arguments as the installed vLLM will get them.

It prints the plan (device and workers, steps, batch sizes, engine arguments) and exits 0 when the run would start on
the machine it asks for (a GPU count this machine lacks is a note), else 2 listing every problem.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlmrl.config import VLMRLConfig
from vlmrl.config.checks import DataFacts, batch_problems, check_environment, data_problems
from vlmrl.config.fully_async import GROUPS_IN_FLIGHT_PER_ENGINE, in_flight, is_fully_async, total_steps, window
from vlmrl.config.plan import RunPlan, multi_turn_schedule, run_plan
from vlmrl.config.reward_model import effective_reward
from vlmrl.data.dataset import REWARD_KEY, RLDataset
from vlmrl.data.parquet import normalize_files
from vlmrl.models.qwen_vl import SUPPORTED_MODEL_TYPES, family_of
from vlmrl.scoring import RewardManager
from vlmrl.tools.config import build_tools, config_tool_schemas

EXIT_OK = 0
EXIT_PROBLEMS = 2


@dataclass
class Report:
    """What the dry run found: problems (the run would not start), notes, and the plan's lines."""

    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    plan: list[str] = field(default_factory=list)
    run: RunPlan | None = None
    """What the config gate derived (``Composed.plan``): what the plan's lines print."""


def _model(cfg: VLMRLConfig, rep: Report) -> str | None:
    """Check the model; return a local folder holding it (for the processor), or None."""
    path = cfg.actor_rollout_ref.model.path
    if os.path.isdir(path):
        folder = path
        where = f"local folder {path}"
    else:
        try:
            from huggingface_hub import try_to_load_from_cache

            hit = try_to_load_from_cache(path, "config.json")
        except Exception:  # noqa: BLE001 - a malformed id is reported below
            hit = None
        if not isinstance(hit, str):
            offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
            msg = f"model {path!r} is not in the local Hugging Face cache"
            if offline:
                rep.problems.append(f"{msg} and HF_HUB_OFFLINE is set: download it first or give a local folder.")
            else:
                rep.notes.append(f"{msg}: the run downloads it at start (not checked here).")
            rep.plan.append(f"model: {path} (hub id, not cached here)")
            return None
        folder = str(Path(hit).parent)
        where = f"hub id, cached at {folder}"
    try:
        from transformers import AutoConfig

        mcfg = AutoConfig.from_pretrained(folder, trust_remote_code=cfg.actor_rollout_ref.model.trust_remote_code)
    except Exception as e:  # noqa: BLE001 - any loader error is a problem of this model folder
        rep.problems.append(f"actor_rollout_ref.model.path={path!r}: cannot read its config: {type(e).__name__}: {e}")
        return None
    mt = getattr(mcfg, "model_type", None)
    arch = ", ".join(getattr(mcfg, "architectures", None) or ["?"])
    rep.plan.append(f"model: {path} ({where}; {mt}, {arch})")
    if mt not in SUPPORTED_MODEL_TYPES:  # a problem of the config gate (checks.check_environment) already; its
        return None  # processor is not checked (a text model has no image processor: that says nothing more)
    fam = family_of(mt)
    if fam.tiles:
        what = [fam.tiles.plan(mcfg)]
    else:
        what = [f"{fam.patch_size * 2}-px image tokens"] + ["DeepStack"] * fam.deepstack
    what += ["timestamped video frames"] * fam.video_timestamps
    what += [f"its own vision tokens {fam.vision_tokens[0]}"] * (fam.vision_tokens[0] != "<|image_pad|>")
    left_out = ["videos"] * (not fam.videos) + ["multi-turn tool rollouts"] * (not fam.tool_turns)
    what += [f"trained without {' or '.join(left_out)}"] * bool(left_out)
    if fam.moe:
        left = fam.moe_not_implemented
        what.append(f"mixture of experts, trained without {', '.join(left[:-1])} or {left[-1]}")
    rep.plan.append(f"model family: {fam.label} ({', '.join(what)})")
    return folder


def _data(cfg: VLMRLConfig, folder: str | None, rep: Report) -> dict[str, Any]:
    """Check the data files; return {split: (kept prompts or None, data sources)}."""

    out: dict[str, Any] = {}
    videos, summary = 0, {"train": "", "val": ""}
    processor = None
    if folder is not None:
        try:
            from transformers import AutoProcessor

            processor = AutoProcessor.from_pretrained(
                folder, trust_remote_code=cfg.actor_rollout_ref.model.trust_remote_code
            )
        except Exception as e:  # noqa: BLE001
            rep.problems.append(f"the model's processor does not load from {folder}: {type(e).__name__}: {e}")
    for split, files in (("train", cfg.data.train_files), ("val", cfg.data.val_files)):
        paths = [f for f in normalize_files(files) if os.path.isfile(os.path.expanduser(f))]
        if not paths or len(paths) != len(normalize_files(files)):
            continue  # missing files are already problems (check_environment)
        rows, sources, ok = 0, set(), True
        for f in paths:
            n, found, good = _data_file(cfg, split, f, rep)
            rows, sources, ok = rows + n, sources | found, ok and good
        kept = None
        if ok and processor is not None:
            try:
                ds = RLDataset(files, processor, cfg.data, split=split, verbose=False, tools=config_tool_schemas(cfg))
                kept = len(ds)
                r = ds.report
                why = ", ".join(f"{k}: {v}" for k, v in r["filtered_by_reason"].items())
                rep.plan.append(
                    f"data.{split}: {r['rows_read']} rows -> {kept} prompts"
                    + (f" ({r['filtered']} filtered: {why})" if r["filtered"] else "")
                    + f"; prompt length max {r['prompt_length_max']}, mean {r['prompt_length_mean']}; "
                    f"max images/prompt {r['max_images_per_prompt']}"
                    + (f", max videos/prompt {r['max_videos_per_prompt']}" if r["max_videos_per_prompt"] else "")
                )
                videos = max(videos, int(r["max_videos_per_prompt"]))
                summary[split] = ds.format_report().splitlines()[0]
            except Exception as e:  # noqa: BLE001 - DataError names file and row
                rep.problems.append(f"data.{split}_files: {type(e).__name__}: {e}")
        elif ok:
            rep.plan.append(f"data.{split}: {rows} rows (the overlong filter is counted once the model is available)")
        out[split] = (kept, sources)
    train, val = out.get("train", (None, None))[0], out.get("val", (None, None))[0]
    if train is not None:  # what only the data can tell, as the trainer checks it
        rep.problems += data_problems(cfg, DataFacts(train, val, videos, summary["train"], summary["val"]))
    return out


def _data_file(cfg: VLMRLConfig, split: str, f: str, rep: Report) -> tuple[int, set[str], bool]:
    """One data file: readable parquet with the prompt and reward columns (its media noted); its rows, data
    sources, and whether it passed."""
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(os.path.expanduser(f))
        names = pf.schema_arrow.names
    except Exception as e:  # noqa: BLE001 - not parquet, unreadable
        rep.problems.append(f"data.{split}_files: {f}: not a readable parquet file ({type(e).__name__}: {e})")
        return 0, set(), False
    ok = True
    for col, key in ((cfg.data.prompt_key, "data.prompt_key"), (REWARD_KEY, None)):
        if col not in names:
            what = f" ({key})" if key else " ({style, ground_truth}: the answers rewards score against)"
            rep.problems.append(f"{f}: no column {col!r}{what}; it has {names}")
            ok = False
    media = _media_note(pf, names, cfg.data.image_key, cfg.data.video_key)
    if media:
        rep.notes.append(f"{f}: {media}")
    sources = set()
    if "data_source" in names:
        sources = {str(s) for s in pf.read(columns=["data_source"]).column(0).to_pylist()}
    return pf.metadata.num_rows, sources, ok


def _count_videos(pf: Any, key: str) -> int | None:
    """Videos in a parquet file's video column (the lengths of its lists), or None when the column is not a list (the
    dataset says why). Only its shallowest leaf is read (a video's path or fps, not its frames' bytes)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    t = pf.schema_arrow.field(key).type
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
        return None
    leaves = [pf.schema.column(i).path for i in range(len(pf.schema)) if pf.schema.column(i).path.startswith(key + ".")]
    column = min(leaves, key=lambda p: (p.count("."), p.endswith(".bytes"))) if leaves else key
    n = 0
    for batch in pf.iter_batches(batch_size=1024, columns=[column]):
        n += int(pc.sum(pc.list_value_length(batch.column(0))).as_py() or 0)
    return n


def _media_note(pf: Any, names: list[str], image_key: str, video_key: str) -> str | None:
    """What a data file's media columns hold, when it is not the usual image column alone: a videos column (with its
    video count, and whether there is an image column too) or text-only prompts (neither column)."""
    has_images = image_key in names
    if video_key not in names or video_key == image_key:
        if has_images:
            return None
        return f"no column {image_key!r} (data.image_key) nor {video_key!r} (data.video_key): text-only prompts"
    n = _count_videos(pf, video_key)
    videos = f"videos column {video_key!r} (data.video_key): {'?' if n is None else n} video(s)"
    if has_images:
        return f"{videos}; images column {image_key!r} (data.image_key)"
    return f"{videos}; no image column ({image_key!r}: data.image_key)"


def _reward(cfg: VLMRLConfig, sources: set[str], rep: Report) -> None:
    try:
        with RewardManager(effective_reward(cfg), cfg.custom_reward_function) as rm:
            rep.plan.append(f"reward: {rm.scorer.describe()}")
            rm.scorer.check(sources)
    except Exception as e:  # noqa: BLE001 - RewardConfigError, or the user's file failing to import
        rep.problems.append(f"reward: {type(e).__name__}: {e}")


def _engine(cfg: VLMRLConfig, rep: Report) -> None:
    ro = cfg.actor_rollout_ref.rollout
    if ro.name != "vllm":
        rep.plan.append("rollout: transformers generate (hf)")
        return
    try:
        from vlmrl.rollout.vllm import default_cache_off, translate_engine_kwargs

        kwargs = {**default_cache_off(), **translate_engine_kwargs(dict((ro.engine_kwargs or {}).get("vllm") or {}))}
    except ImportError as e:
        rep.problems.append(
            f"actor_rollout_ref.rollout.name=vllm but vLLM does not import here ({e}); install it "
            "(README, Install) or use actor_rollout_ref.rollout.name=hf"
        )
        return
    except ValueError as e:
        rep.problems.append(str(e))
        return
    tp = ro.tensor_model_parallel_size
    world = rep.run.world
    engines = f"{world // tp} engine(s) of {tp} worker(s) each" if tp > 1 and world % tp == 0 else "one per worker"
    rep.plan.append(
        f"rollout: vLLM, n={ro.n}, temperature={ro.temperature}, tensor_model_parallel_size={tp} ({engines}), "
        f"engine kwargs {kwargs}"
    )


def _multi_turn(cfg: VLMRLConfig, rep: Report) -> None:
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    if not mt.enable:
        return

    try:
        names = ", ".join(build_tools(mt.tool_config_path))
    except Exception as e:  # noqa: BLE001 - ToolConfigError names the file and entry; a tool's own import error
        rep.problems.append(f"actor_rollout_ref.rollout.multi_turn.tool_config_path: {type(e).__name__}: {e}")
        return
    turns = f"at most {mt.max_assistant_turns} assistant turn(s)" if mt.max_assistant_turns else "turns: no limit"
    rep.plan.append(
        f"multi-turn: tools {names} ({mt.format}), {turns}, {mt.max_parallel_calls} call(s) per turn, "
        f"tool timeout {mt.tool_timeout_s:g} s, the whole trajectory within data.max_response_length="
        f"{cfg.data.max_response_length}; {multi_turn_schedule(cfg.actor_rollout_ref.rollout, is_fully_async(cfg))}"
    )


def _resources(cfg: VLMRLConfig, rep: Report, sane: bool) -> None:
    """Workers, launcher, and how the batches split over them (when the values are ``sane``). A run that asks for
    GPUs, on a machine without CUDA and with ``trainer.device=auto``, is checked for the GPUs it asks for; what would
    not fit the CPU workers this machine would use instead is a note."""
    import torch

    tr, run = cfg.trainer, rep.run
    cuda = torch.cuda.is_available()
    dev, world = run.device, run.world
    if dev == "cuda":
        inline = tr.launcher == "inline"
        gpus = f"{tr.nnodes} node(s) x {tr.n_gpus_per_node} GPU(s) = {world} hybrid worker(s)"
        rep.plan.append("workers: 1 hybrid worker in this process (GPU)" if inline else f"workers: {gpus}")
        have = torch.cuda.device_count() if cuda else 0
        need = 1 if inline else tr.n_gpus_per_node
        if have < need:
            rep.notes.append(f"this machine has {have} CUDA GPU(s); the run asks for {need} per node")
    else:
        rep.plan.append(f"workers: {world} CPU hybrid worker(s)" + (" (in this process)" if world == 1 else ""))
    if run.separate_pools:
        pool, unit = run.rollout_world, "GPU" if dev == "cuda" else "CPU"
        rep.plan[-1] = rep.plan[-1].replace("hybrid worker", "training worker")
        how = _pool_plan(cfg, run, pool, unit)
        rep.plan.append(f"rollout pool (actor_rollout_ref.hybrid_engine=False, {how}")

    launcher = run.launcher
    if launcher == "ray":
        address = run.ray_address
        where = f"joins the Ray cluster at {address}" if address else "starts a private one-machine Ray cluster"
        launcher += f" ({where}; workers of a node on one machine)"
    rep.plan.append(f"launcher: {launcher}")
    if not sane:
        return
    if cfg.trainer.device == "auto" and not cuda and tr.launcher != "inline" and tr.nnodes * tr.n_gpus_per_node > 1:
        for problem in batch_problems(_with_device(cfg, "cuda")):
            rep.problems.append(f"on GPUs ({tr.nnodes} x {tr.n_gpus_per_node}): {problem}")
        here = batch_problems(cfg, run)
        rep.notes.append(
            f"trainer.device=auto and no CUDA here: this machine would train on {world} CPU worker(s)"
            + (f", which it cannot as set ({' '.join(here)})" if here else "")
            + f"; on a GPU machine the plan is {tr.nnodes} x {tr.n_gpus_per_node} GPU worker(s), checked above"
        )
    else:
        rep.problems += batch_problems(cfg, run)


def _pool_plan(cfg: VLMRLConfig, run: RunPlan, pool: int, unit: str) -> str:
    """The rollout pool's line of the plan after its "(actor_rollout_ref.hybrid_engine=False, ": the trainer (one-step
    off-policy or fully asynchronous), the pool's size, how its batches come and when the weights reach it."""
    at = cfg.async_training
    if is_fully_async(cfg):
        bs, trigger = cfg.data.train_batch_size, at.trigger_parameter_sync_step
        budget = window(at.staleness_threshold, trigger, bs)
        how = (
            f"fully asynchronous): {cfg.rollout.nnodes} node(s) x {run.rollout_per_node} {unit} rollout worker(s) "
            f"= {pool}; prompt groups streamed one at a time, a step trains on the first {bs} that finish; weights "
            f"synced by a collective every {trigger} step(s) (async_training.trigger_parameter_sync_step), at most "
            f"{budget} groups started between two syncs (staleness_threshold={at.staleness_threshold}), at most "
            f"{in_flight(pool // run.tp, budget)} generating at once ({GROUPS_IN_FLIGHT_PER_ENGINE} per engine, as "
            "verl); "
            + (
                "generations in flight at a sync are interrupted and continued with the new weights (partial rollouts)"
                if at.partial_rollout
                else "generations in flight at a sync finish first (partial_rollout=False)"
            )
        )
    else:
        how = (
            f"one-step off-policy): {cfg.rollout.nnodes} node(s) x {run.rollout_per_node} {unit} rollout "
            f"worker(s) = {pool}; the batch of step t+1 generated while step t trains (staleness 1), weights "
            "synced by a collective after each update"
            + (
                f"; a step whose behaviour KL exceeds {at.fallback_kl} makes the next one wait for a fresh generation"
                if at.fallback_kl
                else ""
            )
        )
    return how


def _with_device(cfg: VLMRLConfig, device: str) -> VLMRLConfig:
    import copy

    out = copy.deepcopy(cfg)
    out.trainer.device = device
    return out


def _loggers(cfg: VLMRLConfig, rep: Report) -> None:
    import importlib.util

    for name, module in (("wandb", "wandb"), ("tensorboard", "tensorboard")):
        if name in cfg.trainer.logger and importlib.util.find_spec(module) is None:
            rep.problems.append(f"trainer.logger includes {name} but it is not installed: pip install {module}")


def _steps(cfg: VLMRLConfig, kept: int | None, rep: Report) -> None:
    arr, data, tr = cfg.actor_rollout_ref, cfg.data, cfg.trainer
    bs, n, world = data.train_batch_size, arr.rollout.n, rep.run.world
    if tr.total_training_steps:
        steps = f"{tr.total_training_steps} (trainer.total_training_steps)"
    elif kept is not None:
        per_epoch = kept // bs
        steps = f"{per_epoch * tr.total_epochs} ({tr.total_epochs} epoch(s) x {per_epoch} steps of {bs} prompts)"
        if total_steps(cfg, per_epoch) < per_epoch * tr.total_epochs:
            capped = cfg.rollout.total_rollout_steps
            steps = f"{total_steps(cfg, per_epoch)} (rollout.total_rollout_steps={capped} prompts)"
    else:
        steps = f"{tr.total_epochs} epoch(s) (steps counted once the data is checked)"
    mini = arr.actor.ppo_mini_batch_size
    rep.plan.append(f"steps: {steps}")
    rep.plan.append(
        f"batch: {bs} prompts x n={n} = {bs * n} samples per step; {bs // mini if mini else '?'} optimizer step(s) of "
        f"{mini} prompts ({mini * n // max(world, 1)} samples per worker), micro-batches of "
        f"{arr.actor.ppo_micro_batch_size_per_gpu} per worker, {arr.actor.ppo_epochs} epoch(s)"
    )
    rep.plan.append(
        f"policy: lr {arr.actor.optim.lr:g}, KL loss {'on (' + arr.actor.kl_loss_type + ')' if arr.actor.use_kl_loss else 'off'}"  # noqa: E501
        f", LoRA rank {arr.model.lora_rank}, gradient checkpointing {arr.model.enable_gradient_checkpointing}, "
        f"{'padding-free (packed) forwards' if arr.model.use_remove_padding else 'padded micro-batches'}, "
        f"vision tower {'frozen' if arr.model.freeze_vision_tower else 'trained'}"
    )
    rep.plan.append(
        f"output: {tr.default_local_dir} (checkpoints every {tr.save_freq} steps; validation every {tr.test_freq}"
        f"{', and before training' if tr.val_before_train else ''}; loggers {', '.join(tr.logger)})"
    )


def _size(b: float) -> str:
    return f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:.1f} MiB"


def _algorithm(cfg: VLMRLConfig, folder: str | None, rep: Report) -> None:
    """The estimator, the in-reward KL and the critic, and the models each worker holds with their memory (from the
    checkpoints' parameter counts): trained models 16 bytes a parameter sharded over the workers (fp32 weights,
    gradients, AdamW's two moments), the reference 4 (fp32, sharded), the engine's full copy 2 (bf16) on GPU, 4 on
    CPU."""
    from vlmrl.models.value_head import checkpoint_params

    alg = cfg.algorithm
    critic = f" (gamma {alg.gamma:g}, lambda {alg.lam:g})" if rep.run.needs.critic else ""
    rep.plan.append(f"algorithm: {alg.adv_estimator}{critic}, {_kl_in_reward(cfg)}")
    act = cfg.actor_rollout_ref.actor
    low = act.clip_ratio_low if act.clip_ratio_low is not None else act.clip_ratio
    high = act.clip_ratio_high if act.clip_ratio_high is not None else act.clip_ratio
    rep.plan.append(f"policy loss: {act.policy_loss.loss_mode} ({act.loss_agg_mode}, clip {low:g} / {high:g})")
    if alg.name:
        rep.plan.append(_algorithm_class(cfg))
    _rollout_correction(cfg, rep)
    crit = rep.run.critic
    if crit is not None:
        head = "from the actor's checkpoint" if crit.path == cfg.actor_rollout_ref.model.path else crit.path
        rep.plan.append(
            f"critic: {head}, value head per token; lr {crit.optim.lr:g}, {crit.epochs} epoch(s) of "
            f"{crit.mini_batch_size}-prompt mini-batches, cliprange_value {crit.cliprange_value:g}, loss "
            f"{crit.loss_agg_mode}, gradient checkpointing {crit.gradient_checkpointing}"
            + (", padding-free (packed) forwards" if crit.use_remove_padding else "")
            + (f", critic-only steps before step {cfg.trainer.critic_warmup}" if cfg.trainer.critic_warmup > 1 else "")
        )
        if os.path.isdir(crit.path) and not (Path(crit.path) / "config.json").is_file():
            rep.problems.append(f"critic.model.path={crit.path!r}: no config.json in it (a Qwen2.5-VL folder)")
    rm = cfg.reward_model
    rm_params = checkpoint_params(rm.model.path) if rm.enable and rm.model.path else None
    if rm.enable:
        where = (
            "on every training worker, FSDP-sharded, no gradient"
            if rm.style == "discriminative"
            else f"a judge on its own {rm.rollout.name} engine in the driver"
        )
        size = f", {rm_params / 1e6:.1f} M parameters ({_size(4 * rm_params)} in fp32)" if rm_params else ""
        rep.plan.append(f"reward model: {rm.style}, {rm.model.path}{size}; {where}")
    _memory(cfg, folder, crit, rm_params, rep)


def _kl_in_reward(cfg: VLMRLConfig) -> str:
    """The in-reward KL setting in words."""
    alg = cfg.algorithm
    if not alg.use_kl_in_reward:
        return "no in-reward KL"
    ctrl = alg.kl_ctrl
    target = f" (target {ctrl.target_kl:g}, horizon {ctrl.horizon})" if ctrl.type == "adaptive" else ""
    return f"in-reward KL {alg.kl_penalty}, {ctrl.type} coefficient {ctrl.kl_coef:g}{target}"


def _algorithm_class(cfg: VLMRLConfig) -> str:
    """The plan's line for ``algorithm.name``: the class with its parameters (given, or defaults)."""
    from vlmrl.algorithms.algorithm import load_class, parameters

    alg = cfg.algorithm
    try:
        defaults = parameters(load_class(alg.name))
    except Exception as e:  # noqa: BLE001 - the config check names the problem; the plan says it is missing
        return f"algorithm class: {alg.name} (does not load: {type(e).__name__})"
    given = dict(alg.params)
    shown = ", ".join(f"{k}={given.get(k, v)!r}" + ("" if k in given else " (default)") for k, v in defaults.items())
    return f"algorithm class: {alg.name}({shown})"


def _rollout_correction(cfg: VLMRLConfig, rep: Report) -> None:
    """The rollout correction's line of the plan, when it is on."""
    rc = rep.run.rollout_correction
    if rc is not None:
        parts = (
            [
                f"{rc.rollout_is}-level importance weights (threshold {rc.rollout_is_threshold}"
                + (", batch-normalised" if rc.rollout_is_batch_normalize else "")
                + ")"
            ]
            if rc.rollout_is
            else []
        )
        parts += [f"rejection {rc.rollout_rs} (threshold {rc.rollout_rs_threshold})"] if rc.rollout_rs else []
        parts += (
            [f"bypass mode (the engine's log-probs as the old ones, {rc.loss_type} loss)"] if rc.bypass_mode else []
        )
        rep.plan.append("rollout correction against the engine's log-probs: " + ", ".join(parts))


def _memory(cfg: VLMRLConfig, folder: str | None, crit: Any, rm_params: int | None, rep: Report) -> None:
    """The memory line: the models each worker holds (``_algorithm`` says how each is counted)."""
    from vlmrl.models.value_head import checkpoint_params

    rm = cfg.reward_model
    params = checkpoint_params(folder) if folder else None
    if params is None:
        return
    world = max(rep.run.world, 1)
    gpu = rep.run.device == "cuda"
    parts = [("actor", 16 * params / world)]
    if rep.run.reference:
        parts.append(("reference", 4 * params / world))
    if crit is not None:
        cp = checkpoint_params(crit.path) or params
        parts.append(("critic", 16 * cp / world))
    if rm.enable and rm.style == "discriminative":
        parts.append(("reward model", 4 * (rm_params or params) / world))
    if cfg.actor_rollout_ref.rollout.name == "vllm":
        parts.append(("engine weights", (2 if gpu else 4) * params))
    total = sum(b for _, b in parts)
    rep.plan.append(
        f"memory per worker (models only, {params / 1e6:.1f} M parameters, {world} worker(s)): "
        + ", ".join(f"{n} {_size(b)}" for n, b in parts)
        + f" = {_size(total)}, plus activations"
        + (" and the engine's KV cache (rollout.gpu_memory_utilization)" if gpu else "")
    )


def run(cfg: VLMRLConfig | None, problems: list[str], notices: list[str], plan: RunPlan | None = None) -> int:
    """Run every check on ``cfg`` (None when the config itself could not be built: ``problems`` say why) and the
    plan the gate derived from it (``Composed.plan``; None: derived here), print the report and return the exit
    status."""
    rep = Report(problems=list(problems), notes=list(notices))
    if cfg is not None:
        rep.run = plan or run_plan(cfg)
        rep.problems += check_environment(cfg, rep.run)
        _resources(cfg, rep, sane=not problems)
        folder = _model(cfg, rep)
        data = _data(cfg, folder, rep)
        _reward(cfg, set().union(*(s for _, s in data.values())) if data else set(), rep)
        _engine(cfg, rep)
        _multi_turn(cfg, rep)
        _loggers(cfg, rep)
        _steps(cfg, data.get("train", (None, None))[0], rep)
        _algorithm(cfg, folder, rep)
    print("[vlmrl dry run] plan:")
    for line in rep.plan:
        print(f"  {line}")
    for note in rep.notes:
        print(f"  note: {note}")
    if rep.problems:
        print(f"[vlmrl dry run] {len(rep.problems)} problem(s); the run would not start:", flush=True)
        for pr in rep.problems:
            print("  - " + pr.replace("\n", "\n    "), flush=True)
        return EXIT_PROBLEMS
    print("[vlmrl dry run] OK: the run would start (nothing was started).", flush=True)
    return EXIT_OK
