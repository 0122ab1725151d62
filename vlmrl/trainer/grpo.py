"""The training loop (GRPO family and actor-critic PPO): one ``fit()`` a reader can follow top to bottom, each stage
of a step one call.

sample prompts → rollout (n per prompt, on every worker) → [reward model: every worker scores its share, or the
  driver's judge] → rewards (driver) [→ more batches: dynamic sampling]
  → engines sleep → advantages (driver) → old/ref log-probs + update (every worker, its shard) → weight push (every
  worker's engine, awake again) → metrics → validation / checkpoint

With a critic or the in-reward KL (``algorithm.adv_estimator=gae``, ``algorithm.use_kl_in_reward``; REINFORCE++
too) the advantages are per token and need the workers first: engines sleep → old/ref log-probs + values (every
worker, its shard, kept there) → token rewards, KL penalty, GAE (driver) → critic + policy update (every worker)
→ weight push.

With ``actor_rollout_ref.hybrid_engine=False`` (verl's one-step off-policy trainer, ``trainer/offpolicy.py``) the
rollout runs in a pool of its own and overlaps the update: a step waits for the batch generated while the previous
step trained (``wait_prev_gen``), syncs the weights into the engines (``param_sync``) and launches the next batch,
then scores, computes advantages and updates as above; there is no sleep and no push.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf
from tqdm import tqdm
from transformers import AutoProcessor

from vlmrl import rng
from vlmrl.algorithms import filter_groups, load_plugins
from vlmrl.algorithms.algorithm import AlgorithmError, build_algorithm
from vlmrl.algorithms.estimators import EstimatorConfig, sequence_advantages
from vlmrl.algorithms.losses import LossConfig
from vlmrl.algorithms.ppo import make_kl_controller
from vlmrl.batch import PromptSample, RewardSample, RolloutBatch, TrainShard
from vlmrl.config import ConfigError, VLMRLConfig
from vlmrl.config.checks import DataFacts, check_config, data_problems
from vlmrl.config.fully_async import is_fully_async, total_steps
from vlmrl.config.plan import RunPlan, rollout_plan, run_plan, worker_plan
from vlmrl.config.reward_model import effective_reward
from vlmrl.data import BatchSampler, RLDataset
from vlmrl.report import health_summary, load_run
from vlmrl.report.gallery import write_gallery
from vlmrl.reward_model import RewardModel
from vlmrl.scoring import RewardError, RewardManager, RewardOutput, ScoredPart
from vlmrl.startup import stage
from vlmrl.supervise import HangError
from vlmrl.timing import StartupClock, Timer
from vlmrl.tools.config import config_tool_schemas
from vlmrl.trainer import checkpoint as ckpt
from vlmrl.trainer.fully_async import PromptSource, StreamingRollout
from vlmrl.trainer.offpolicy import OffPolicyRollout
from vlmrl.trainer.rollouts import Draw, HybridRollouts, Rollouts
from vlmrl.trainer.step import (
    StepData,
    after_train_step,
    assemble,
    attach_token_targets,
    before_train_step,
    gather_prepared,
    plan_shards,
    step_metrics,
    token_targets,
)
from vlmrl.trainer.tracking import Tracker, plot_curve
from vlmrl.workers.group import WorkerError, WorkerGroup
from vlmrl.workers.launch import make_worker_group

# ------------------------------------------------------------------------------------------------------ helpers


def truncate_metrics(path: Path, last_step: int) -> None:
    """Keep the lines of a metrics.jsonl up to ``last_step`` (a resumed run rewrites the steps after its checkpoint)."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            if int(json.loads(line).get("step", 0)) <= last_step:
                keep.append(line)
        except (ValueError, AttributeError):
            continue  # a line cut by a crash
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(x + "\n" for x in keep), encoding="utf-8")
    os.replace(tmp, path)


# -------------------------------------------------------------------------------------------------------- fit


class Trainer:
    """Holds the run's pieces; ``fit()`` is the loop."""

    def __init__(self, cfg: VLMRLConfig, clock: StartupClock | None = None, plan: RunPlan | None = None) -> None:
        """Start the run: each step a ``vlmrl.startup.stage`` (a failure says what and what to check); what started
        before a failure is ended. ``cfg`` is a composed config (``vlmrl.config.command.compose`` checked it);
        ``clock`` times the start-up's stages (printed when the first step begins); ``plan``: the values the gate
        derived from ``cfg`` (None: derived here, once)."""
        self.cfg = cfg
        load_plugins(cfg.algorithm.plugins)  # (imported already when the config check ran in this process)
        self.plan = plan or run_plan(cfg)  # (after the plugins: a plugin's estimator declares its needs)
        """What the config gate derived (device, launcher, pools, critic, needs...): read, never derived again."""
        self.clock = clock or StartupClock()
        self.step = 0
        self.updates = 0
        """Policy updates done (the step's own counts once it trained; a resumed run starts at its step)."""
        self.rollouts: Rollouts
        """Where the step's batches come from: the hybrid engine, or the rollout pool of ``hybrid_engine=False``."""
        self._warned_flat = False
        self.started = time.time()
        """The run's start (wall clock): ``timeline/*`` metrics are seconds since."""
        try:
            self._start()
        except BaseException:
            self.close(grace_s=1.0, quiet=True)
            raise

    def _start(self) -> None:
        """The start-up's stages, in order (the clock marks each)."""
        self._start_data()
        self._start_algorithm()
        self._start_output()
        self._start_workers()
        self.clock.mark("workers")
        cfg, tr = self.cfg, self.cfg.trainer
        if cfg.reward_model.enable:
            rm = cfg.reward_model
            with stage(
                f"could not start the reward model ({rm.style}, {rm.model.path})",
                "check reward_model.model.path and reward_model.rollout.*",
            ):
                self.reward_model = RewardModel(cfg, self.group, self.world, self.group.device, self.limits, tr.seed)
        if self.resume_from is not None:
            with stage(
                f"could not resume from the checkpoint {self.resume_from}",
                "check it, or start over with trainer.resume_mode=disable",
            ):
                self._load_checkpoint(self.resume_from)
        self.clock.mark("reward model and resume")

    def _start_data(self) -> None:
        """The processor, the tools' schemas, the datasets (checked against the config) and the sampler."""
        cfg, arr = self.cfg, self.cfg.actor_rollout_ref
        path, tools_file = arr.model.path, arr.rollout.multi_turn.tool_config_path
        with stage(f"could not load the model's processor from {path}", "check actor_rollout_ref.model.path"):
            self.processor = AutoProcessor.from_pretrained(path, trust_remote_code=arr.model.trust_remote_code)
            self.tokenizer = self.processor.tokenizer
        self.clock.mark("processor")
        with stage(
            f"could not load the tools of {tools_file}",
            "fix the tool file it names, or actor_rollout_ref.rollout.multi_turn.tool_config_path",
        ):
            tools = config_tool_schemas(cfg)
        with stage(
            "could not read the data",
            "check data.train_files and data.val_files (trainer.dry_run=True checks every record)",
        ):
            self.train_ds = RLDataset(cfg.data.train_files, self.processor, cfg.data, split="train", tools=tools)
            self.val_ds = (
                RLDataset(cfg.data.val_files, self.processor, cfg.data, split="val", tools=tools)
                if (cfg.data.val_files)
                else None
            )
        problems = data_problems(cfg, self._data_facts())
        if problems:  # before the workers start, not after the last training step
            raise ConfigError("\n".join(problems))
        self.clock.mark("data")
        self.sampler = BatchSampler(
            len(self.train_ds), cfg.data.train_batch_size, cfg.data.shuffle, cfg.data.seed, drop_last=True
        )
        self.total_steps = total_steps(cfg, len(self.sampler))

    def _start_algorithm(self) -> None:
        """The algorithm class, the critic's plan, the in-reward KL, the estimator's needs and the reward."""
        cfg = self.cfg
        alg = cfg.algorithm
        self.algorithm = build_algorithm(alg.name, dict(alg.params), LossConfig.from_actor(cfg.actor_rollout_ref.actor))
        """``algorithm.name``'s instance (the base class's hooks do nothing): its hooks run here, its
        ``compute_loss`` in the workers' instances, which get its state with each shard."""
        self.critic = self.plan.critic
        self.kl_ctrl = (
            make_kl_controller(alg.kl_ctrl.type, alg.kl_ctrl.kl_coef, alg.kl_ctrl.target_kl, alg.kl_ctrl.horizon)
            if alg.use_kl_in_reward
            else None
        )
        self.needs = self.plan.needs
        """What the estimator declared it needs (``vlmrl.algorithms.estimators.Needs``): read here, never its name."""
        self.token_level = self.critic is not None or self.kl_ctrl is not None or not self.needs.sequence_level
        """Per-token advantages computed after the workers' log-probs and values (PPO path; REINFORCE++ too: verl
        whitens its discounted returns over the batch's tokens, which needs each response's generated tokens; and a
        user's estimator, which gets the real response masks as in verl)."""
        with stage("could not start the reward", "check reward.function / custom_reward_function.*"):
            self.rewards = RewardManager(effective_reward(cfg), cfg.custom_reward_function)
        self.clock.mark("reward")
        self.reward_model: RewardModel | None = None
        """``reward_model.enable``: scores every sample before the rewards run (their ``reward_model`` component)."""

    def _start_output(self) -> None:
        """The output folder, the checkpoint to resume from, and the loggers."""
        cfg, tr = self.cfg, self.cfg.trainer
        self.out_dir = Path(tr.default_local_dir)
        with stage(f"could not create trainer.default_local_dir={tr.default_local_dir}", "check it"):
            self.out_dir.mkdir(parents=True, exist_ok=True)
        with stage(
            "could not find the checkpoint to resume from",
            "check trainer.resume_mode and trainer.resume_from_path, or start over with trainer.resume_mode=disable",
        ):
            self.resume_from = self._find_resume()
            self.resume_state = ckpt.read_trainer_state(self.resume_from) if self.resume_from else None
        if self.resume_state is not None:  # the log continues where the checkpoint was taken
            truncate_metrics(self.out_dir / "metrics.jsonl", int(self.resume_state["step"]))
        with stage("could not start the loggers", "check trainer.logger"):
            self.tracker = Tracker(
                tr.logger,
                self.out_dir,
                tr.project_name,
                tr.experiment_name,
                OmegaConf.to_container(OmegaConf.structured(cfg)),
                fresh=self.resume_state is None,
                prometheus=tr.prometheus,
            )
        self.clock.mark("loggers")

    def _data_facts(self) -> DataFacts:
        """What the datasets say that the config cannot (``config.checks.data_problems`` reads it)."""
        val = self.val_ds
        return DataFacts(
            train_prompts=len(self.train_ds),
            val_prompts=len(val) if val is not None else None,
            videos=max(self.train_ds.max_videos_per_prompt, val.max_videos_per_prompt if val is not None else 0),
            train_summary=self.train_ds.format_report().splitlines()[0],
            val_summary=val.format_report().splitlines()[0] if val is not None else "",
        )

    def _pool_rollouts(self, pool: WorkerGroup, tp: int) -> OffPolicyRollout:
        """The rollout side on a separate pool: the one-step trainer's, or the fully asynchronous Rollouter (which
        scores each step's groups as they finish, unless a reward model must score them on the training workers)."""
        cfg = self.cfg
        if not is_fully_async(cfg):
            return OffPolicyRollout(self.group, pool, tp, cfg.trainer.seed)
        streamed = self._batches()
        source = PromptSource(
            lambda: next(streamed), self.train_ds.__getitem__, self.sampler.state_dict, len(self.train_ds)
        )
        bs = cfg.data.train_batch_size
        scorer = None if cfg.reward_model.enable else self._score_groups
        return StreamingRollout(
            self.group, pool, cfg.trainer.seed, cfg.async_training, bs, self.total_steps * bs, source, scorer, tp
        )

    def _start_workers(self) -> None:
        """The worker group (``config.plan.worker_plan`` is what every worker is told), and the start-up line."""
        cfg, arr = self.cfg, self.cfg.actor_rollout_ref
        images = max(self.train_ds.max_images_per_prompt, self.val_ds.max_images_per_prompt if self.val_ds else 0)
        videos = max(self.train_ds.max_videos_per_prompt, self.val_ds.max_videos_per_prompt if self.val_ds else 0)
        sw = Timer.start()
        self.limits = (images, videos)
        plan = worker_plan(cfg, self.total_steps, images, videos, run=self.plan)
        with stage("the workers did not start"):
            self.group = make_worker_group(cfg, plan)
        self.world, self.tp = self.group.world, plan.tp
        self.mini_samples = arr.actor.ppo_mini_batch_size * arr.rollout.n // self.world
        """Samples of one mini-batch on one worker."""
        self.critic_mini_samples = self.critic.mini_batch_size * arr.rollout.n // self.world if self.critic else 0
        """Samples of one critic mini-batch on one worker."""
        nodes = ", ".join(f"{i.get('rank')}@{i.get('node')}" for i in self.group.infos)
        if self.plan.separate_pools:
            with stage("the rollout pool did not start"):
                self.pool = pool = make_worker_group(cfg, rollout_plan(cfg, plan, run=self.plan), first_gpu=self.world)
            tp = self.plan.tp
            with stage("the weight-sync group of the two pools did not form"):
                self.rollouts = offpolicy = self._pool_rollouts(pool, tp)
            where = ", ".join(f"{i.get('rank')}@{i.get('node')}" for i in pool.infos)
            engines = (
                f"{pool.world // tp} vLLM engine(s) of tensor-parallel size {tp}"
                if arr.rollout.name == "vllm"
                else f"{pool.world} HF rollout model(s)"
            )
            print(
                f"[vlmrl] {'fully-async' if is_fully_async(cfg) else 'one-step off-policy'}: {self.world} training "
                f"worker(s) (rank@node: {nodes}) and "
                f"{pool.world} rollout worker(s) (rank@node: {where}) on {self.group.device} ready in "
                f"{sw.elapsed:.1f} s; {engines}; weights synced by a collective ({offpolicy.mb:.1f} MB); "
                f"{len(self.train_ds)} training prompts, {self.total_steps} steps",
                flush=True,
            )
            return
        self.rollouts = HybridRollouts(self.group, self.tp)
        engines = (
            f"{self.world // self.tp} vLLM engine(s) of tensor-parallel size {self.tp}"
            if arr.rollout.name == "vllm"
            else "HF rollout on the policy"
        )
        print(
            f"[vlmrl] {self.world} hybrid worker(s) on {self.group.device} ready in {sw.elapsed:.1f} s "
            f"(rank@node: {nodes}); {engines}; {len(self.train_ds)} training prompts, {self.total_steps} steps",
            flush=True,
        )

    # ------------------------------------------------------------------------------------------- checkpoints
    def _find_resume(self) -> Path | None:
        tr = self.cfg.trainer
        if tr.resume_mode == "disable":
            return None
        if tr.resume_mode == "resume_path":  # (the config gate requires resume_from_path with it)
            path = Path(tr.resume_from_path or "")
            if not ckpt.is_complete(path):
                raise ConfigError(
                    f"trainer.resume_from_path={str(path)!r} is not a complete checkpoint "
                    "(expected trainer_state.json and actor/.metadata inside a global_step_N folder)"
                )
            return path
        removed = ckpt.remove_partial(self.out_dir)
        for p in removed:
            print(f"[vlmrl] removed an unfinished checkpoint: {p}", flush=True)
        return ckpt.find_resume(self.out_dir)

    def _load_checkpoint(self, path: Path) -> None:
        sw = Timer.start()
        state = self.resume_state or ckpt.read_trainer_state(path)
        self.group.load_checkpoint(str(path))
        self.step = self.updates = int(state["step"])
        self.sampler.load_state_dict(state["sampler"])
        self.rollouts.restore_extra(state, self.total_steps - self.step)
        rng.restore(state["rng"])
        self._restore_owned_state(state, path)
        print(
            f"[vlmrl] resumed from {path} at step {self.step} ({sw.elapsed:.1f} s)",
            flush=True,
        )

    def _restore_owned_state(self, state: dict[str, Any], path: Path) -> None:
        """The KL controller and the algorithm class's state: the checkpoint's, except what the command line changed
        since it was saved (printed once each)."""
        alg, notes = self.cfg.algorithm, []
        if self.kl_ctrl is not None:
            kl = alg.kl_ctrl
            value, note = ckpt.restored_kl(state.get("kl_ctrl"), kl.type, kl.kl_coef, f"{path}/trainer_state.json")
            self.kl_ctrl.value = self.kl_ctrl.value if value is None else value
            notes += [note] if note else []
        algo_state, more = ckpt.restored_algorithm_state(
            state.get("algorithm", {}), state.get("algorithm_params"), dict(alg.params)
        )
        self.algorithm.load_state_dict(algo_state)
        saved_critic = (path / "critic").is_dir()
        if saved_critic and self.critic is None:
            more.append(
                f"the checkpoint holds a critic ({path / 'critic'}) and this run trains none "
                f"(algorithm.adv_estimator={alg.adv_estimator}): the critic is left behind"
            )
        elif self.critic is not None and not saved_critic:
            more.append(f"the checkpoint holds no critic: the critic starts from {self.critic.path}")
        for note in notes + more:
            print(f"[vlmrl] resume: {note}", flush=True)

    def save_checkpoint(self) -> Path:
        """Write the checkpoint of the current step atomically (see ``vlmrl.trainer.checkpoint``)."""
        sw = Timer.start()
        tmp = ckpt.tmp_dir(self.out_dir, self.step)
        try:
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir(parents=True)
            self.group.save_checkpoint(str(tmp))
            sampler = self.sampler.state_dict()
            state = {
                "step": self.step,
                # with a batch in flight: the sampler before it was drawn (a resumed run generates it again)
                "sampler": self.rollouts.checkpoint_sampler(sampler),
                "rng": rng.state(),
                "world": self.world,
                **self.rollouts.checkpoint_extra(),
            }
            if self.kl_ctrl is not None:
                kl = self.cfg.algorithm.kl_ctrl
                state["kl_ctrl"] = {**self.kl_ctrl.state_dict(), "kind": kl.type, "kl_coef": kl.kl_coef}
            state["algorithm"] = self.algorithm.state_dict()
            state["algorithm_params"] = dict(self.cfg.algorithm.params)
            ckpt.write_trainer_state(tmp, state, OmegaConf.to_yaml(OmegaConf.structured(self.cfg)))
        except (OSError, WorkerError) as e:  # a full disk, a quota, a read-only mount: the previous checkpoint stays
            shutil.rmtree(tmp, ignore_errors=True)
            full = isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT) or "[Errno 28]" in str(e)
            what = "disk full while writing" if full else "could not write"
            raise ckpt.CheckpointError(f"{what} checkpoint {tmp}: {e}") from e
        keep = self.cfg.trainer.max_actor_ckpt_to_keep
        final = ckpt.commit(self.out_dir, self.step, keep)
        print(f"[vlmrl] checkpoint {final} ({sw.elapsed:.1f} s)", flush=True)
        return final

    # ------------------------------------------------------------------------------------------------- batches
    def _batches(self):
        """Prompt-index batches, epoch after epoch, from the sampler's current position."""
        while True:
            yield from self.sampler
            self.sampler.set_epoch(self.sampler.epoch + 1)

    def _draw(self, batches: Iterator[list[int]], timer: Timer) -> Draw:
        """How the rollout side draws a batch's prompts (timed as data), with the sampler's state before them."""

        def draw() -> tuple[list[PromptSample], dict[str, Any]]:
            with timer("data"):
                state = self.sampler.state_dict()
                return self.train_ds.get_batch(next(batches), self.cfg.data.dataloader_num_workers), state

        return draw

    def collect(self, batches: Iterator[list[int]], timer: Timer) -> tuple[StepData, dict[str, float]]:
        """One step's data: prompts → rollout → reward samples → scores (timed as data, rollout, reward), the same
        for both rollout sides (``trainer/rollouts.py``; the rollout pool's ``async/*`` metrics in the second dict).
        With ``algorithm.filter_groups.enable`` (DAPO dynamic sampling) more batches are rolled out until
        ``train_batch_size`` groups vary on the metric (or ``max_num_gen_batches`` were tried), and the step takes
        ``choose_groups``' pick of them (the ``filter_groups/*`` metrics)."""
        fg = self.cfg.algorithm.filter_groups
        draw, extra = self._draw(batches, timer), {}
        last = self.step >= self.total_steps
        # the next step's batch may start with the step's own, unless more generation comes first
        launch = not (fg.enable or self.needs.baseline_rollout or last)

        def one_batch(k: int) -> StepData:
            if k == 0:  # (with a rollout pool: the batch generated while the previous step trained)
                prompts, rb, metrics = self.rollouts.next_batch(draw, timer, self.step, self.updates, launch)
                extra.update(metrics)
            else:
                prompts, _ = draw()
                with timer("rollout"):
                    rb = self.rollouts.generate(prompts, self.step, self.updates, k)
            with timer("reward"):  # (the groups' rewards when the rollout side scored them as they finished)
                parts = self.rollouts.scored() if k == 0 else None
            samples, scored = self.score(prompts, rb, timer, extra, parts)
            return StepData(prompts, rb, samples, scored, self._baselines(prompts, rb, timer, extra))

        collected = [one_batch(0)]
        chosen = None
        if fg.enable:
            chosen, metrics = self._sample_dynamically(collected, one_batch)
            extra |= metrics
        if not last:
            self.rollouts.launch_next(draw, self.step + 1)
        return (collected[0] if chosen is None else assemble(collected, chosen)), extra

    def _sample_dynamically(
        self, collected: list[StepData], one_batch: Callable[[int], StepData]
    ) -> tuple[list[tuple[int, int]], dict[str, float]]:
        """DAPO's dynamic sampling: batches are added to ``collected`` until enough groups vary on the metric (or
        ``max_num_gen_batches`` were tried); the (batch, group) pairs the step takes and the ``filter_groups/*``
        metrics."""
        fg, bs = self.cfg.algorithm.filter_groups, self.cfg.data.train_batch_size

        def varying(d: StepData) -> list[bool]:
            try:
                return filter_groups.varying_groups(d.scores.values(fg.metric), d.rollout.n)
            except ValueError as e:  # a metric that is no reward component
                raise ConfigError(str(e)) from None

        varies = [varying(collected[0])]
        while not filter_groups.enough(varies, bs) and not 0 < fg.max_num_gen_batches <= len(collected):
            collected.append(one_batch(len(collected)))
            varies.append(varying(collected[-1]))
        kept = sum(sum(v) for v in varies)
        return filter_groups.choose_groups(varies, bs), {
            "filter_groups/gen_batches": float(len(collected)),
            "filter_groups/kept_ratio": kept / (len(collected) * bs),
            "filter_groups/filled": float(max(0, bs - kept)),
        }

    def _baselines(
        self, prompts: list[PromptSample], rb: RolloutBatch, timer: Timer, metrics: dict[str, float]
    ) -> list[float] | None:
        """The estimator's baseline when it declares one (``Needs.baseline_rollout``, ReMax's): each prompt's greedy
        rollout, scored, repeated over the prompt's samples."""
        if not self.needs.baseline_rollout:
            return None
        with timer("baseline"):
            greedy = self.rollouts.generate(prompts, self.step, self.updates, validate=True)
            _, ref = self.score(prompts, greedy, None, metrics)
            per_prompt = torch.tensor(ref.scores).view(len(prompts), -1).mean(dim=1)
            return per_prompt.repeat_interleave(rb.n).tolist()

    def _score_groups(self, prompts: list[PromptSample], rbs: list[RolloutBatch]) -> ScoredPart:
        """Finished groups' reward calls (the fully asynchronous Rollouter's scoring thread)."""
        rb = RolloutBatch.concat(rbs)
        return self.rewards.outcomes(
            RewardSample.of_rollout(prompts, rb, self.tokenizer, self.cfg.data.max_response_length)
        )

    def score(
        self,
        prompts: list[PromptSample],
        rb: RolloutBatch,
        timer: Timer | None,
        metrics: dict[str, float],
        parts: list[ScoredPart] | None = None,
    ) -> tuple[list[RewardSample], RewardOutput]:
        """A rollout's rewards: the reward model's score of every sample first (``reward_model.enable``; its
        ``reward_model/*`` metrics summed into ``metrics``), then the reward functions (timed as reward_model and
        reward). ``parts``: the reward calls of its groups, made as they finished (``Rollouts.scored``): only the
        verdict on their failures is left to give."""
        timer = timer or Timer()
        if parts is not None:
            with timer("reward"):
                done = ScoredPart.concat(parts)
                return done.samples, self.rewards.assemble(done.samples, done.outcomes, done.seconds)
        with timer("reward"):
            samples = RewardSample.of_rollout(prompts, rb, self.tokenizer, self.cfg.data.max_response_length)
        if self.reward_model is not None:
            with timer("reward_model"):
                for k, v in self.reward_model.score(prompts, rb, samples).items():
                    metrics[k] = metrics.get(k, 0.0) + v if k.endswith(("errors", "truncated")) else v
        with timer("reward"):
            return samples, self.rewards.score(samples)

    # ----------------------------------------------------------------------------------------------------- fit
    def fit(self) -> dict[str, float]:
        """Train for ``total_steps``; returns the last step's metrics (plus the final validation). Each stage of a
        step is one call here, the same for the hybrid engine and a rollout pool (``trainer/rollouts.py``);
        ``step.py`` holds the pure functions between them."""
        tr = self.cfg.trainer
        if tr.val_only:
            return self.log(self.validate())
        if tr.val_before_train and self.val_ds is not None:
            self.log(self.validate())
        startup = self._startup_done()
        batches = self._batches()
        last: dict[str, float] = {}
        bar = tqdm(
            total=self.total_steps,
            initial=self.step,
            desc="PPO" if self.critic else "GRPO",
            dynamic_ncols=True,
            disable=not os.isatty(2),
        )
        while self.step < self.total_steps:
            self.step += 1
            timer = Timer()
            with timer("step"):
                step, sampling = self.collect(batches, timer)  # prompts → rollout → rewards (→ more batches)
                self.rollouts.before_update(timer)  # (the hybrid engine's engines sleep)
                hook_s = self.cfg.trainer.worker_timeout_s  # the algorithm's hook (may reshape rewards), bounded
                scored = before_train_step(self.algorithm, step, self.step, hook_s)
                shards, adv, ppo = self.prepare(step, scored, timer)
                updated = self.update(shards, scored, timer)
                self.rollouts.after_update(timer)  # (the hybrid engine's: the new weights pushed)
            metrics = step_metrics(step, adv, updated, timer, epoch=self.sampler.epoch) | sampling | ppo | startup
            startup = {}
            last = self.end_step(step, adv, metrics, timer)
            bar.update(1)
            bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}", step_s=f"{metrics['timing/step_s']:.2f}")
        bar.close()
        return last

    def prepare(
        self, step: StepData, scored: StepData, timer: Timer
    ) -> tuple[list[TrainShard], torch.Tensor, dict[str, float]]:
        """Each worker's shard and the samples' advantages (and the PPO metrics). A sequence-level estimator without
        a critic or in-reward KL (the GRPO family): one advantage per sample, from the scores alone. Otherwise (the
        PPO preparation): old/ref log-probs and values first (kept on the workers), then per-token advantages."""
        if not self.token_level:
            with timer("advantages"):
                adv = self.advantages(scored)
            return plan_shards(step, adv.tolist(), self.world, self.mini_samples, self.tp), adv, {}
        shards = plan_shards(step, None, self.world, self.mini_samples, self.tp)
        with timer("values"):
            pi2 = self.needs.policy_probs
            prepared = self.group.prepare(shards, need_old=self.kl_ctrl is not None or pi2, need_pi2=pi2)
        with timer("advantages"):
            tokens = gather_prepared(shards, prepared, len(step.samples))
            adv_tok, returns, ppo = token_targets(scored, tokens, self.cfg.algorithm, self.kl_ctrl)
            adv = (adv_tok * tokens.mask).sum(-1) / tokens.mask.sum(-1).clamp(min=1.0)
        actor = self.step >= self.cfg.trainer.critic_warmup
        shards = attach_token_targets(shards, prepared, adv_tok, returns, self.critic_mini_samples, update_actor=actor)
        return shards, adv, ppo

    def update(self, shards: list[TrainShard], scored: StepData, timer: Timer) -> list[dict[str, float]]:
        """(Old/ref log-probs and) the update, each worker on exactly its shard, with the algorithm's state."""
        with timer("train"):
            state = self.algorithm.state_dict()
            for shard in shards:
                shard.algorithm_state = state
                shard.rewards = [scored.scores.scores[i] for i in shard.samples]
            updated = self.group.update(shards)
            self.updates += 1
        return updated

    def end_step(self, step: StepData, adv: torch.Tensor, metrics: dict[str, float], timer: Timer) -> dict[str, float]:
        """After the update: the algorithm's hook (``algorithm/*`` metrics), the rollout side's and the run's
        checks, the samples' dump, the validation and the checkpoint when due; logs the metrics and returns them."""
        tr = self.cfg.trainer
        metrics |= after_train_step(self.algorithm, metrics, self.step, self.cfg.trainer.worker_timeout_s)
        self.rollouts.after_step(metrics, self.cfg.async_training.fallback_kl)
        self._warn_if_flat(metrics)
        if tr.rollout_data_dir:
            self._dump_samples(tr.rollout_data_dir, step.prompts, step.samples, step.scores, adv)
        if self.val_ds is not None and (self._due(tr.test_freq) or self.step == self.total_steps):
            metrics.update(self.validate())
        if self._due(tr.save_freq) or (tr.save_freq > 0 and self.step == self.total_steps):
            with timer("checkpoint"):
                self.save_checkpoint()
            metrics["timing/checkpoint_s"] = timer["checkpoint"]
        return self.log(metrics)

    def _startup_done(self) -> dict[str, float]:
        """The first step begins: print the start-up's stages (the slowest worker's own split beside ``workers``);
        its total, as the first step's ``timing/startup_s``."""
        self.clock.mark("validation")
        infos = [*self.group.infos, *self.rollouts.infos]
        slow = max(infos, key=lambda i: i.get("process_s", 0.0), default={})
        detail = (
            {
                "workers": f"the slowest ready {slow['process_s']:.1f} s after its process started: engine "
                f"{slow.get('engine_s', 0.0):.1f}, model {slow.get('model_s', 0.0):.1f}"
            }
            if ("process_s" in slow and self.plan.launcher != "inline")
            else None
        )
        print(f"[vlmrl] {self.clock.line(detail)}", flush=True)
        return {"timing/startup_s": self.clock.total}

    def _due(self, freq: int) -> bool:
        """Whether a ``*_freq`` stage runs after this step (before the last step; the last step is handled by the
        caller)."""
        return freq > 0 and self.step % freq == 0 and self.step < self.total_steps

    def log(self, metrics: dict[str, float]) -> dict[str, float]:
        """Send this step's metrics to every tracker (``timeline/*`` wall-clock times as seconds since the run's
        start); returns them."""
        metrics = {k: v - self.started if k.startswith("timeline/") else v for k, v in metrics.items()}
        self.tracker.log(metrics, self.step)
        return metrics

    def advantages(self, step: StepData) -> torch.Tensor:
        """Per sample: the configured estimator over the groups of ``rollout.n`` samples of a prompt."""
        alg = self.cfg.algorithm
        scores = torch.tensor(step.scores.scores, dtype=torch.float32)
        lengths = torch.tensor([len(r) for r in step.rollout.response_ids], dtype=torch.float32)
        group = torch.arange(len(scores)) // step.rollout.n
        adv = sequence_advantages(
            alg.adv_estimator,
            scores,
            group,
            lengths,
            EstimatorConfig.from_algorithm(alg),
            step.scores.components,
            step.baselines,
        )
        if not torch.isfinite(adv).all():  # rewards are sanitised upstream; this must never happen
            raise FloatingPointError(f"non-finite advantages from scores {step.scores.scores}")
        return adv

    def _warn_if_flat(self, metrics: dict[str, float]) -> None:
        """Once per run: a step in which every group's rewards were equal taught nothing (it is counted every step);
        not with a critic, whose values make advantages of equal rewards differ."""
        if self._warned_flat or self.critic is not None or metrics["advantages/zero_variance_share"] < 1.0:
            return
        self._warned_flat = True
        print(
            f"[vlmrl] warning: step {self.step}: every group's rewards are equal (all "
            f"{metrics['advantages/zero_variance_groups']:.0f} prompts' samples scored the same), so every advantage "
            "is 0 and this step teaches nothing. Counted each step in advantages/zero_variance_groups; if it "
            "persists: a reward that cannot tell samples apart, a task too hard or too easy for the model, too few "
            "samples per prompt (rollout.n), or try algorithm.filter_groups.enable=True",
            flush=True,
        )

    # ------------------------------------------------------------------------------------------------ validate
    def validate(self) -> dict[str, float]:
        """Greedy (by default) validation over the whole validation set; mean reward overall and per data_source."""
        assert self.val_ds is not None
        sw = Timer.start()
        bs = self.cfg.data.val_batch_size or len(self.val_ds)
        scores: list[float] = []
        sources: list[str] = []
        shown: list[RewardSample] = []
        shown_components: dict[str, list[float]] = {}
        components: dict[str, list[float]] = {}
        rm_metrics: dict[str, float] = {}
        limit = self.cfg.trainer.log_val_generations
        for start in range(0, len(self.val_ds), bs):
            indices = list(range(start, min(start + bs, len(self.val_ds))))
            prompts = self.val_ds.get_batch(indices, self.cfg.data.dataloader_num_workers)
            rb = self.rollouts.generate(prompts, self.step, self.updates, validate=True)
            samples, scored = self.score(prompts, rb, None, rm_metrics)
            if self.cfg.trainer.validation_data_dir:
                folder = self.cfg.trainer.validation_data_dir
                self._dump_samples(folder, prompts, samples, scored, None, append=start > 0)
            take = max(0, min(limit - len(shown), len(samples)))
            for k, v in scored.components.items():
                shown_components.setdefault(k, [float("nan")] * len(shown)).extend(v[:take])
            shown += samples[:take]
            for v in shown_components.values():
                v.extend([float("nan")] * (len(shown) - len(v)))
            for k, v in scored.components.items():
                components.setdefault(k, []).extend(v)
            scores += scored.scores
            sources += [s.data_source for s in samples]
        out = {"val/reward/mean": float(np.mean(scores)), "timing/validate_s": sw.elapsed}
        for k, v in components.items():  # each component's mean (a weight-0 rule component: the rule's check)
            vals = [x for x in v if not np.isnan(x)]
            if vals:
                out[f"val/reward/{k}/mean"] = float(np.mean(vals))
        out |= {f"val/{k}": v for k, v in rm_metrics.items()}
        if shown:
            path = self.out_dir / "val_gallery" / f"step_{self.step:06d}.html"
            write_gallery(
                path,
                self.step,
                shown,
                scores[: len(shown)],
                shown_components,
                limit=limit,
                summary=list(zip(sources, scores)),
            )
        for src in sorted(set(sources)):
            vals = [s for s, d in zip(scores, sources) if d == src]
            out[f"val/{src}/reward"] = float(np.mean(vals))
        return out

    def _dump_samples(
        self,
        folder: str,
        prompts: list[PromptSample],
        samples: list[RewardSample],
        scored: Any,
        adv: torch.Tensor | None,
        append: bool = False,
    ) -> None:
        """One JSON line per sample (its record's ``uid`` <file>:<row>, prompt, response, answer, score and components,
        advantage when training) into ``folder/step_N.jsonl`` (``trainer.rollout_data_dir`` /
        ``trainer.validation_data_dir``)."""
        d = Path(folder)
        d.mkdir(parents=True, exist_ok=True)
        per = len(samples) // max(1, len(prompts))
        with open(d / f"step_{self.step:06d}.jsonl", "a" if append else "w", encoding="utf-8") as f:
            for i, s in enumerate(samples):
                row = {
                    "step": self.step,
                    "uid": prompts[i // per].uid if per else None,
                    "data_source": s.data_source,
                    "prompt": s.prompt,
                    "response": s.response,
                    "ground_truth": str(s.ground_truth),
                    "score": scored.scores[i],
                    "components": {k: v[i] for k, v in scored.components.items()},
                }
                if adv is not None:
                    row["advantage"] = float(adv[i])
                f.write(json.dumps(row, ensure_ascii=False) + "\n")

    def close(self, grace_s: float = 10.0, quiet: bool = False) -> None:
        """Stop workers (ended after ``grace_s`` if they do not stop), close trackers and the reward pool, draw the
        curve. ``quiet``: after a failed start (only what started is ended; nothing is drawn)."""
        names = ("tracker", "rewards", "group", "pool", "reward_model")
        tracker, rewards, group, pool, rm = (getattr(self, k, None) for k in names)
        if getattr(self, "rollouts", None) is not None:
            self.rollouts.close()  # (the streaming pool's Rollouter thread, before the pool ends)
        for part in (tracker, rewards, rm):
            if part is not None:
                part.close()
        for workers in (pool, group):  # (the rollout pool of hybrid_engine=False first)
            if workers is not None:
                workers.shutdown(grace_s)
        if quiet or tracker is None or not tracker.logged or not tracker.jsonl_path.exists():
            return  # (a run that logged no step has no curve or health of its own: not the previous run's)
        try:
            plot_curve(tracker.jsonl_path, self.out_dir / "reward_curve.png")
            print("[vlmrl] " + health_summary(load_run(self.out_dir).rows).replace("\n", "\n[vlmrl] "), flush=True)
        except Exception as e:  # noqa: BLE001 - a plot must never fail a finished run
            print(f"[vlmrl] could not draw the reward curve or check the run's health: {e}", flush=True)


class RunStopped(RuntimeError):
    """The run cannot go on (a worker failed, died or froze; non-finite numbers; a checkpoint that could not be
    written); the message names the step, the cause and the last complete checkpoint."""


def fit(
    cfg: VLMRLConfig, checked: bool = False, clock: StartupClock | None = None, plan: RunPlan | None = None
) -> dict[str, float]:
    """Build everything, train, clean up. ``checked``: ``cfg`` comes from ``vlmrl.config.command.compose`` with the
    machine's checks (``python -m vlmrl.train``); else ``check_config`` runs first, so a bad config is refused before
    anything loads. ``clock``: the start-up's stages so far (the command line's; else the start-up counts from
    here); ``plan``: the gate's derived values (``Composed.plan``; None: derived once here). A failure during
    training raises ``RunStopped`` naming the step and the checkpoint to resume from; one while starting,
    ``vlmrl.startup.StartupError``."""
    if not checked:
        plan = check_config(cfg)
    trainer = Trainer(cfg, clock, plan)
    failed = True
    try:
        out = trainer.fit()
        failed = False
        return out
    except (WorkerError, RewardError, HangError, FloatingPointError, ckpt.CheckpointError, AlgorithmError) as e:
        last = ckpt.find_resume(trainer.out_dir)
        where = f"{last} (trainer.resume_mode=auto continues from it)" if last else "none yet"
        raise RunStopped(f"step {trainer.step}: {e}\nlast complete checkpoint: {where}") from e
    finally:
        trainer.close(grace_s=1.0 if failed else 10.0)  # a failed run's workers may be stuck: do not wait long
