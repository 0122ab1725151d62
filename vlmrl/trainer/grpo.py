"""The GRPO training loop: one ``fit()`` a reader can follow top to bottom.

sample prompts → rollout (n per prompt, on every worker) → rewards (driver) → advantages (driver)
  → old/ref log-probs + update + weight push (every worker) → metrics → validation / checkpoint
"""

from __future__ import annotations

import errno
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from vlmrl import rng
from vlmrl.algos import filter_groups
from vlmrl.algos.core import compute_advantages
from vlmrl.batch import PromptSample, RewardSample, RolloutBatch
from vlmrl.config import ConfigError, VLMRLConfig
from vlmrl.config.checks import check_config, tp_size
from vlmrl.trainer import checkpoint as ckpt
from vlmrl.trainer.step import StepData, assemble, mean_of_workers, plan_shards, split_even, stats, zero_variance_groups

# ------------------------------------------------------------------------------------------------------ helpers


def truncate_metrics(path: Path, last_step: int) -> None:
    """Keep the lines of a metrics.jsonl up to ``last_step`` (a resumed run rewrites the steps after its checkpoint)."""
    import json

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

    def __init__(self, cfg: VLMRLConfig) -> None:
        check_config(cfg)  # before any heavy import: a bad config fails in a second
        from transformers import AutoProcessor

        from vlmrl.data import BatchSampler, RLDataset
        from vlmrl.reward import RewardManager
        from vlmrl.trainer.tracking import Tracker

        self.cfg = cfg
        arr = cfg.actor_rollout_ref
        self.processor = AutoProcessor.from_pretrained(arr.model.path, trust_remote_code=arr.model.trust_remote_code)
        self.tokenizer = self.processor.tokenizer
        from vlmrl.tools.config import config_tool_schemas

        tools = config_tool_schemas(cfg)
        self.train_ds = RLDataset(cfg.data.train_files, self.processor, cfg.data, split="train", tools=tools)
        self.val_ds = (
            RLDataset(cfg.data.val_files, self.processor, cfg.data, split="val", tools=tools)
            if cfg.data.val_files
            else None
        )
        bs = cfg.data.train_batch_size
        if len(self.train_ds) < bs:
            raise ConfigError(
                f"data.train_batch_size={bs} exceeds the {len(self.train_ds)} usable training records "
                f"({self.train_ds.format_report().splitlines()[0]})"
            )
        if self.val_ds is not None and len(self.val_ds) == 0:  # before start-up, not after the last training step
            raise ConfigError(
                f"data.val_files: no usable validation record ({self.val_ds.format_report().splitlines()[0]}); fix "
                "the files (or data.max_prompt_length / data.max_pixels), or set data.val_files=null"
            )
        self.sampler = BatchSampler(len(self.train_ds), bs, cfg.data.shuffle, cfg.data.seed, drop_last=True)
        steps_per_epoch = len(self.sampler)
        self.total_steps = cfg.trainer.total_training_steps or steps_per_epoch * cfg.trainer.total_epochs
        self.rewards = RewardManager(cfg.reward, cfg.custom_reward_function)
        self.out_dir = Path(cfg.trainer.default_local_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.resume_from = self._find_resume()
        self.resume_state = ckpt.read_trainer_state(self.resume_from) if self.resume_from else None
        if self.resume_state is not None:  # the log continues where the checkpoint was taken
            truncate_metrics(self.out_dir / "metrics.jsonl", int(self.resume_state["step"]))
        from omegaconf import OmegaConf

        self.tracker = Tracker(
            cfg.trainer.logger,
            self.out_dir,
            cfg.trainer.project_name,
            cfg.trainer.experiment_name,
            OmegaConf.to_container(OmegaConf.structured(cfg)),
            fresh=self.resume_state is None,
            prometheus=cfg.trainer.prometheus,
        )
        limit = max(self.train_ds.max_images_per_prompt, self.val_ds.max_images_per_prompt if self.val_ds else 0)
        videos = max(self.train_ds.max_videos_per_prompt, self.val_ds.max_videos_per_prompt if self.val_ds else 0)
        if videos and arr.rollout.multi_turn.enable:
            raise ConfigError(
                "actor_rollout_ref.rollout.multi_turn.enable=True with video prompts: multi-turn tool rollouts take "
                "image prompts only; train on the videos single-turn or drop them from the data"
            )
        from vlmrl.workers.group import make_worker_group

        t0 = time.perf_counter()
        self.group = make_worker_group(cfg, self.total_steps, limit, videos)
        self.world = self.group.world
        self.tp = tp_size(cfg)
        nodes = ", ".join(f"{i.get('rank')}@{i.get('node')}" for i in self.group.infos)
        engines = (
            f"{self.world // self.tp} vLLM engine(s) of tensor-parallel size {self.tp}"
            if arr.rollout.name == "vllm"
            else "HF rollout on the policy"
        )
        print(
            f"[vlmrl] {self.world} hybrid worker(s) on {self.group.device} ready in {time.perf_counter() - t0:.1f} s "
            f"(rank@node: {nodes}); {engines}; {len(self.train_ds)} training prompts, {self.total_steps} steps",
            flush=True,
        )
        self.step = 0
        self._warned_flat = False
        if self.resume_from is not None:
            self._load_checkpoint(self.resume_from)

    # ------------------------------------------------------------------------------------------- checkpoints
    def _find_resume(self) -> Path | None:
        tr = self.cfg.trainer
        if tr.resume_mode == "disable":
            return None
        if tr.resume_mode == "resume_path":
            if not tr.resume_from_path:
                raise ConfigError("trainer.resume_mode=resume_path needs trainer.resume_from_path=<global_step_N dir>")
            path = Path(tr.resume_from_path)
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
        t0 = time.perf_counter()
        state = self.resume_state or ckpt.read_trainer_state(path)
        self.group.load_checkpoint(str(path))
        self.step = int(state["step"])
        self.sampler.load_state_dict(state["sampler"])
        rng.restore(state["rng"])
        print(
            f"[vlmrl] resumed from {path} at step {self.step} ({time.perf_counter() - t0:.1f} s)",
            flush=True,
        )

    def save_checkpoint(self) -> Path:
        """Write the checkpoint of the current step atomically (see ``vlmrl.trainer.checkpoint``)."""
        from omegaconf import OmegaConf

        from vlmrl.workers.group import WorkerError

        t0 = time.perf_counter()
        tmp = ckpt.tmp_dir(self.out_dir, self.step)
        try:
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir(parents=True)
            self.group.save_checkpoint(str(tmp))
            state = {
                "step": self.step,
                "sampler": self.sampler.state_dict(),
                "rng": rng.state(),
                "world": self.world,
            }
            ckpt.write_trainer_state(tmp, state, OmegaConf.to_yaml(OmegaConf.structured(self.cfg)))
        except (OSError, WorkerError) as e:  # a full disk, a quota, a read-only mount: the previous checkpoint stays
            shutil.rmtree(tmp, ignore_errors=True)
            full = isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT) or "[Errno 28]" in str(e)
            what = "disk full while writing" if full else "could not write"
            raise ckpt.CheckpointError(f"{what} checkpoint {tmp}: {e}") from e
        keep = self.cfg.trainer.max_actor_ckpt_to_keep
        final = ckpt.commit(self.out_dir, self.step, keep)
        print(f"[vlmrl] checkpoint {final} ({time.perf_counter() - t0:.1f} s)", flush=True)
        return final

    # ------------------------------------------------------------------------------------------------- batches
    def _batches(self):
        """Prompt-index batches, epoch after epoch, from the sampler's current position."""
        while True:
            yield from self.sampler
            self.sampler.set_epoch(self.sampler.epoch + 1)

    def rollout(self, prompts: list[PromptSample], validate: bool = False) -> RolloutBatch:
        """Generate on every engine (prompts split evenly over the engine groups; the ranks of a tensor-parallel
        group all get their group's prompts) and gather in order, one copy per group."""
        groups = self.world // self.tp
        chunks = split_even(prompts, groups) if len(prompts) % groups == 0 else None
        if chunks is None:  # validation tail: pad groups with empty lists
            k = -(-len(prompts) // groups)
            chunks = [prompts[i * k : (i + 1) * k] for i in range(groups)]
        parts = self.group.generate([chunks[rank // self.tp] for rank in range(self.world)], validate)
        leaders = parts[:: self.tp]
        return RolloutBatch.concat([p for p in leaders if len(p) or p is leaders[0]])

    def collect(self, batches: Iterator[list[int]]) -> tuple[StepData, dict[str, float]]:
        """One step's data: prompts → rollout → reward samples → scores. With ``algorithm.filter_groups.enable`` (DAPO
        dynamic sampling) more batches are rolled out until ``train_batch_size`` groups vary on the metric (or
        ``max_num_gen_batches`` were tried), and the step takes ``choose_groups``' pick of them."""
        cfg = self.cfg
        fg = cfg.algorithm.filter_groups
        metrics: dict[str, float] = {"timing/data_s": 0.0, "timing/rollout_s": 0.0, "timing/reward_s": 0.0}

        def one_batch() -> StepData:
            t0 = time.perf_counter()
            prompts = self.train_ds.get_batch(next(batches))
            t1 = time.perf_counter()
            rb = self.rollout(prompts)
            t2 = time.perf_counter()
            samples = RewardSample.of_rollout(prompts, rb, self.tokenizer, cfg.data.max_response_length)
            scored = self.rewards.score(samples)
            metrics["timing/data_s"] += t1 - t0
            metrics["timing/rollout_s"] += t2 - t1
            metrics["timing/reward_s"] += time.perf_counter() - t2
            return StepData(prompts, rb, samples, scored)

        collected = [one_batch()]
        if not fg.enable:
            return collected[0], metrics
        bs = cfg.data.train_batch_size

        def varying(d: StepData) -> list[bool]:
            try:
                return filter_groups.varying_groups(d.scores.values(fg.metric), d.rollout.n)
            except ValueError as e:  # a metric that is no reward component
                raise ConfigError(str(e)) from None

        varies = [varying(collected[0])]
        while not filter_groups.enough(varies, bs) and not 0 < fg.max_num_gen_batches <= len(collected):
            collected.append(one_batch())
            varies.append(varying(collected[-1]))
        kept = sum(sum(v) for v in varies)
        metrics["filter_groups/gen_batches"] = float(len(collected))
        metrics["filter_groups/kept_ratio"] = kept / (len(collected) * bs)
        metrics["filter_groups/filled"] = float(max(0, bs - kept))
        return assemble(collected, filter_groups.choose_groups(varies, bs)), metrics

    # ----------------------------------------------------------------------------------------------------- fit
    def fit(self) -> dict[str, float]:
        """Train for ``total_steps``; returns the last step's metrics (plus the final validation)."""
        cfg = self.cfg
        n = cfg.actor_rollout_ref.rollout.n
        mini_samples = cfg.actor_rollout_ref.actor.ppo_mini_batch_size * n // self.world
        last: dict[str, float] = {}
        if cfg.trainer.val_before_train and self.val_ds is not None and not cfg.trainer.val_only:
            self.tracker.log(self.validate(), self.step)
        if cfg.trainer.val_only:
            out = self.validate()
            self.tracker.log(out, self.step)
            return out
        batches = self._batches()
        bar = tqdm(total=self.total_steps, initial=self.step, desc="GRPO", dynamic_ncols=True, disable=not os.isatty(2))
        while self.step < self.total_steps:
            t_step = time.perf_counter()
            self.step += 1
            # 1-3. prompts → rollout (n samples per prompt on every worker) → rewards (driver)
            step, metrics = self.collect(batches)
            rb, scored = step.rollout, step.scores
            # 4. advantages (groups = the n samples of a prompt)
            scores = torch.tensor(scored.scores, dtype=torch.float32)
            group = torch.arange(len(scores)) // n
            lengths = torch.tensor([len(r) for r in rb.response_ids], dtype=torch.float32)
            adv = compute_advantages(
                cfg.algorithm.adv_estimator,
                scores,
                group,
                norm_by_std=cfg.algorithm.norm_adv_by_std_in_grpo,
                response_lengths=lengths,
            )
            if not torch.isfinite(adv).all():  # rewards are sanitised upstream; this must never happen
                raise FloatingPointError(f"non-finite advantages from scores {scored.scores}")
            flat = zero_variance_groups(scores, n)
            metrics["advantages/zero_variance_groups"] = float(flat)
            metrics["advantages/zero_variance_share"] = flat / max(1, len(scores) // n)
            if flat == len(scores) // n and not self._warned_flat:
                self._warned_flat = True
                print(
                    f"[vlmrl] warning: step {self.step}: every group's rewards are equal (all {flat} prompts' samples "
                    "scored the same), so every advantage is 0 and this step teaches nothing. Counted each step in "
                    "advantages/zero_variance_groups; if it persists: a reward that cannot tell samples apart, a "
                    "task too hard or too easy for the model, too few samples per prompt (rollout.n), or try "
                    "algorithm.filter_groups.enable=True",
                    flush=True,
                )
            # 5. update + weight push on every worker, each on exactly the shard it is given
            t0 = time.perf_counter()
            worker_metrics = self.group.train(plan_shards(step, adv.tolist(), self.world, mini_samples, self.tp))
            metrics["timing/train_s"] = time.perf_counter() - t0
            metrics.update(mean_of_workers(worker_metrics))
            # 6. metrics
            metrics.update(scored.metrics)
            metrics.update(stats("response_length", lengths.tolist()))
            metrics["response_length/clip_ratio"] = float(np.mean([f == "length" for f in rb.finish_reasons]))
            if rb.trajectories:
                from vlmrl.rollout.multi_turn import multi_turn_metrics

                metrics.update(multi_turn_metrics(rb.trajectories))
                metrics["timing/tool_s"] = float(rb.timing.get("tool_s", 0.0))
            metrics["advantages/mean"] = float(adv.mean())
            metrics["advantages/abs_mean"] = float(adv.abs().mean())
            tokens = float(lengths.sum()) + sum(len(p) for p in rb.prompt_ids)
            metrics["timing/step_s"] = time.perf_counter() - t_step
            metrics["throughput/tokens_per_s"] = tokens / metrics["timing/step_s"]
            metrics["training/epoch"] = float(self.sampler.epoch)
            if cfg.trainer.rollout_data_dir:
                self._dump_samples(cfg.trainer.rollout_data_dir, step.samples, scored, adv)
            tf = cfg.trainer.test_freq
            if self.val_ds is not None and tf > 0 and self.step % tf == 0 and self.step < self.total_steps:
                metrics.update(self.validate())
            if self.step == self.total_steps and self.val_ds is not None:
                metrics.update(self.validate())
            sf = cfg.trainer.save_freq
            if sf > 0 and (self.step % sf == 0 or self.step == self.total_steps):
                t0 = time.perf_counter()
                self.save_checkpoint()
                metrics["timing/checkpoint_s"] = time.perf_counter() - t0
            self.tracker.log(metrics, self.step)
            bar.update(1)
            bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}", step_s=f"{metrics['timing/step_s']:.2f}")
            last = metrics
        bar.close()
        return last

    # ------------------------------------------------------------------------------------------------ validate
    def validate(self) -> dict[str, float]:
        """Greedy (by default) validation over the whole validation set; mean reward overall and per data_source."""
        assert self.val_ds is not None
        t0 = time.perf_counter()
        bs = self.cfg.data.val_batch_size or len(self.val_ds)
        scores: list[float] = []
        sources: list[str] = []
        shown: list[RewardSample] = []
        shown_components: dict[str, list[float]] = {}
        limit = self.cfg.trainer.log_val_generations
        for start in range(0, len(self.val_ds), bs):
            prompts = self.val_ds.get_batch(list(range(start, min(start + bs, len(self.val_ds)))))
            rb = self.rollout(prompts, validate=True)
            samples = RewardSample.of_rollout(prompts, rb, self.tokenizer, self.cfg.data.max_response_length)
            scored = self.rewards.score(samples)
            if self.cfg.trainer.validation_data_dir:
                self._dump_samples(self.cfg.trainer.validation_data_dir, samples, scored, None, append=start > 0)
            take = max(0, min(limit - len(shown), len(samples)))
            for k, v in scored.components.items():
                shown_components.setdefault(k, [float("nan")] * len(shown)).extend(v[:take])
            shown += samples[:take]
            for v in shown_components.values():
                v.extend([float("nan")] * (len(shown) - len(v)))
            scores += scored.scores
            sources += [s.data_source for s in samples]
        out = {"val/reward/mean": float(np.mean(scores)), "timing/validate_s": time.perf_counter() - t0}
        if shown:
            from vlmrl.trainer.gallery import write_gallery

            path = self.out_dir / "val_gallery" / f"step_{self.step:06d}.html"
            write_gallery(
                path, self.step, shown, scores[: len(shown)], shown_components, limit=limit,
                summary=list(zip(sources, scores)),
            )  # fmt: skip
        for src in sorted(set(sources)):
            vals = [s for s, d in zip(scores, sources) if d == src]
            out[f"val/{src}/reward"] = float(np.mean(vals))
        return out

    def _dump_samples(
        self, folder: str, samples: list[RewardSample], scored: Any, adv: torch.Tensor | None, append: bool = False
    ) -> None:
        """One JSON line per sample (prompt, response, answer, score and components, advantage when training) into
        ``folder/step_N.jsonl`` (``trainer.rollout_data_dir`` / ``trainer.validation_data_dir``)."""
        import json

        d = Path(folder)
        d.mkdir(parents=True, exist_ok=True)
        with open(d / f"step_{self.step:06d}.jsonl", "a" if append else "w", encoding="utf-8") as f:
            for i, s in enumerate(samples):
                row = {
                    "step": self.step,
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

    def close(self, grace_s: float = 10.0) -> None:
        """Stop workers (ended after ``grace_s`` if they do not stop), close trackers and the reward pool, draw the
        curve."""
        self.tracker.close()
        self.rewards.close()
        self.group.shutdown(grace_s)
        if self.tracker.jsonl_path.exists():
            from vlmrl.report import health_summary, load_run
            from vlmrl.trainer.tracking import plot_curve

            try:
                plot_curve(self.tracker.jsonl_path, self.out_dir / "reward_curve.png")
                print("[vlmrl] " + health_summary(load_run(self.out_dir).rows).replace("\n", "\n[vlmrl] "), flush=True)
            except Exception as e:  # noqa: BLE001 - a plot must never fail a finished run
                print(f"[vlmrl] could not draw the reward curve or check the run's health: {e}", flush=True)


class RunStopped(RuntimeError):
    """The run cannot go on (a worker failed, died or froze; non-finite numbers; a checkpoint that could not be
    written); the message names the step, the cause and the last complete checkpoint."""


def fit(cfg: VLMRLConfig) -> dict[str, float]:
    """Build everything, train, clean up. A failure during training raises ``RunStopped`` naming the step and the
    checkpoint to resume from."""
    from vlmrl.reward import RewardError
    from vlmrl.supervise import HangError
    from vlmrl.workers.group import WorkerError

    trainer = Trainer(cfg)
    failed = True
    try:
        out = trainer.fit()
        failed = False
        return out
    except (WorkerError, RewardError, HangError, FloatingPointError, ckpt.CheckpointError) as e:
        last = ckpt.find_resume(trainer.out_dir)
        where = f"{last} (trainer.resume_mode=auto continues from it)" if last else "none yet"
        raise RunStopped(f"step {trainer.step}: {e}\nlast complete checkpoint: {where}") from e
    finally:
        trainer.close(grace_s=1.0 if failed else 10.0)  # a failed run's workers may be stuck: do not wait long
