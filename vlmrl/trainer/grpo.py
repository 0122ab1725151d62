"""The GRPO training loop: one ``fit()`` a reader can follow top to bottom.

sample prompts → rollout (n per prompt, on every worker) → rewards (driver) → advantages (driver)
  → old/ref log-probs + update + weight push (every worker) → metrics → validation / checkpoint
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from vlmrl.algos.core import compute_advantages, get_advantage_fn
from vlmrl.batch import PromptSample, RewardSample, RolloutBatch
from vlmrl.config import ConfigError, VLMRLConfig

# ------------------------------------------------------------------------------------------------------ checks


def check_config(cfg: VLMRLConfig) -> None:
    """Reject configurations that cannot work, before anything expensive starts; each message says the fix."""
    arr, data, tr, alg = cfg.actor_rollout_ref, cfg.data, cfg.trainer, cfg.algorithm
    path = arr.model.path
    if not path or path == "???":
        raise ConfigError("actor_rollout_ref.model.path is not set: point it at a Qwen2.5-VL folder or hub id")
    if not os.path.isdir(path) and (path.startswith((".", "/", "~")) or os.sep in path and path.count("/") != 1):
        raise ConfigError(f"actor_rollout_ref.model.path={path!r} does not exist")
    if os.path.isdir(path):
        import json

        cfg_file = Path(path) / "config.json"
        if not cfg_file.exists():
            raise ConfigError(f"actor_rollout_ref.model.path={path!r} has no config.json (not an HF model folder)")
        mt = json.loads(cfg_file.read_text()).get("model_type")
        from vlmrl.models.qwen_vl import SUPPORTED_MODEL_TYPES

        if mt not in SUPPORTED_MODEL_TYPES:
            raise ConfigError(
                f"actor_rollout_ref.model.path={path!r} is a {mt!r} model; vlmrl trains {SUPPORTED_MODEL_TYPES}"
            )
    if not data.train_files or data.train_files == "???":
        raise ConfigError("data.train_files is not set: give a parquet file or a list (preprocess/ makes them)")
    get_advantage_fn(alg.adv_estimator)
    if alg.adv_estimator in ("grpo", "dr_grpo", "rloo") and arr.rollout.n < 2:
        raise ConfigError(
            f"algorithm.adv_estimator={alg.adv_estimator} compares the samples of a prompt: "
            f"set actor_rollout_ref.rollout.n >= 2 (got {arr.rollout.n})"
        )
    if alg.use_kl_in_reward:
        raise ConfigError(
            "algorithm.use_kl_in_reward=True is not supported; use actor_rollout_ref.actor.use_kl_loss=True instead"
        )
    if tr.critic_warmup:
        raise ConfigError("trainer.critic_warmup must be 0: GRPO-family estimators have no critic")
    world = _planned_world(cfg)
    if data.train_batch_size % world:
        raise ConfigError(
            f"data.train_batch_size={data.train_batch_size} must be divisible by the {world} workers "
            f"(trainer.cpu_workers or nnodes x n_gpus_per_node)"
        )
    mini = arr.actor.ppo_mini_batch_size
    if mini > data.train_batch_size or data.train_batch_size % mini or (mini * arr.rollout.n) % world:
        raise ConfigError(
            f"actor_rollout_ref.actor.ppo_mini_batch_size={mini} must divide data.train_batch_size="
            f"{data.train_batch_size}, and mini-batch samples (x n={arr.rollout.n}) must split over {world} workers"
        )
    if arr.rollout.name not in ("vllm", "hf"):
        raise ConfigError(f"actor_rollout_ref.rollout.name={arr.rollout.name!r}: use vllm | hf")
    if tr.resume_mode not in ("auto", "disable", "resume_path"):
        raise ConfigError(f"trainer.resume_mode={tr.resume_mode!r}: use auto | disable | resume_path")
    out = Path(tr.default_local_dir)
    probe = out if out.exists() else next((p for p in out.parents if p.exists()), Path("."))
    if not os.access(probe, os.W_OK):
        raise ConfigError(f"trainer.default_local_dir={str(out)!r} is not writable (checked {str(probe)!r})")


def _planned_world(cfg: VLMRLConfig) -> int:
    dev = cfg.trainer.device
    if dev == "auto":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cuda":
        return cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
    return cfg.trainer.cpu_workers


# ------------------------------------------------------------------------------------------------------ helpers


def split_even(items: list[Any], parts: int) -> list[list[Any]]:
    """Split into ``parts`` contiguous chunks of equal size (the caller guarantees divisibility)."""
    k = len(items) // parts
    return [items[i * k : (i + 1) * k] for i in range(parts)]


def reward_samples(
    prompts: list[PromptSample], rollout: RolloutBatch, tokenizer: Any, max_response_length: int
) -> list[RewardSample]:
    """What the reward functions see for each sample of a rollout."""
    texts = tokenizer.batch_decode(rollout.response_ids, skip_special_tokens=True)
    out = []
    for i, text in enumerate(texts):
        p = prompts[i // rollout.n]
        out.append(
            RewardSample(
                response=text,
                prompt=p.prompt_text,
                ground_truth=p.ground_truth,
                data_source=p.data_source,
                extra_info=p.extra_info,
                images=p.images,
                image_scales=p.image_scales,
                response_length=len(rollout.response_ids[i]),
                max_response_length=max_response_length,
                finish_reason=rollout.finish_reasons[i],
            )
        )
    return out


def merge_rollouts(parts: list[RolloutBatch]) -> RolloutBatch:
    """Concatenate the workers' rollouts in rank order."""
    out = RolloutBatch([], [], [], [], n=parts[0].n)
    for p in parts:
        out.prompt_ids += p.prompt_ids
        out.response_ids += p.response_ids
        out.logprobs += p.logprobs
        out.finish_reasons += p.finish_reasons
    out.timing = {k: max(p.timing.get(k, 0.0) for p in parts) for k in parts[0].timing}
    return out


def _stats(prefix: str, values: list[float] | np.ndarray) -> dict[str, float]:
    a = np.asarray(values, dtype=np.float64)
    if a.size == 0:
        return {}
    return {
        f"{prefix}/mean": float(a.mean()),
        f"{prefix}/std": float(a.std()),
        f"{prefix}/max": float(a.max()),
        f"{prefix}/min": float(a.min()),
    }


def _mean_dicts(dicts: list[dict[str, float]]) -> dict[str, float]:
    keys = set().union(*dicts)
    out = {}
    for k in keys:
        vals = [d[k] for d in dicts if k in d]
        out[k] = max(vals) if k.startswith("timing/") else float(np.mean(vals))
    return out


# -------------------------------------------------------------------------------------------------------- fit


class Trainer:
    """Holds the run's pieces; ``fit()`` is the loop."""

    def __init__(self, cfg: VLMRLConfig) -> None:
        from transformers import AutoProcessor

        from vlmrl.data import BatchSampler, RLDataset
        from vlmrl.reward import RewardManager
        from vlmrl.trainer.tracking import Tracker

        check_config(cfg)
        self.cfg = cfg
        arr = cfg.actor_rollout_ref
        self.processor = AutoProcessor.from_pretrained(arr.model.path, trust_remote_code=arr.model.trust_remote_code)
        self.tokenizer = self.processor.tokenizer
        self.train_ds = RLDataset(cfg.data.train_files, self.processor, cfg.data, split="train")
        self.val_ds = (
            RLDataset(cfg.data.val_files, self.processor, cfg.data, split="val") if cfg.data.val_files else None
        )
        bs = cfg.data.train_batch_size
        if len(self.train_ds) < bs:
            raise ConfigError(f"data.train_batch_size={bs} exceeds the {len(self.train_ds)} usable training records")
        self.sampler = BatchSampler(len(self.train_ds), bs, cfg.data.shuffle, cfg.data.seed, drop_last=True)
        steps_per_epoch = len(self.sampler)
        self.total_steps = cfg.trainer.total_training_steps or steps_per_epoch * cfg.trainer.total_epochs
        self.rewards = RewardManager(cfg.reward, cfg.custom_reward_function)
        self.out_dir = Path(cfg.trainer.default_local_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        from omegaconf import OmegaConf

        self.tracker = Tracker(
            cfg.trainer.logger,
            self.out_dir,
            cfg.trainer.project_name,
            cfg.trainer.experiment_name,
            OmegaConf.to_container(OmegaConf.structured(cfg)),
        )
        limit = max(self.train_ds.max_images_per_prompt, self.val_ds.max_images_per_prompt if self.val_ds else 0)
        from vlmrl.workers.group import WorkerGroup

        t0 = time.perf_counter()
        self.group = WorkerGroup(cfg, self.total_steps, limit)
        self.world = self.group.world
        print(
            f"[vlmrl] {self.world} hybrid worker(s) on {self.group.device} ready in {time.perf_counter() - t0:.1f} s; "
            f"{len(self.train_ds)} training prompts, {self.total_steps} steps",
            flush=True,
        )
        self.step = 0

    # ------------------------------------------------------------------------------------------------- batches
    def _batches(self):
        """Prompt-index batches, epoch after epoch, from the sampler's current position."""
        while True:
            yield from self.sampler
            self.sampler.set_epoch(self.sampler.epoch + 1)

    def rollout(self, prompts: list[PromptSample], validate: bool = False) -> RolloutBatch:
        """Generate on every worker (prompts split evenly by rank) and gather in order."""
        chunks = split_even(prompts, self.world) if len(prompts) % self.world == 0 else None
        if chunks is None:  # validation tail: pad ranks with empty lists
            k = -(-len(prompts) // self.world)
            chunks = [prompts[i * k : (i + 1) * k] for i in range(self.world)]
        parts = self.group.run(
            "validation rollout" if validate else "rollout", "generate", [(c, validate) for c in chunks]
        )
        return merge_rollouts([p for p in parts if len(p) or p is parts[0]])

    # ----------------------------------------------------------------------------------------------------- fit
    def fit(self) -> dict[str, float]:
        """Train for ``total_steps``; returns the last step's metrics (plus the final validation)."""
        cfg = self.cfg
        n = cfg.actor_rollout_ref.rollout.n
        mini_samples = cfg.actor_rollout_ref.actor.ppo_mini_batch_size * n // self.world
        last: dict[str, float] = {}
        if cfg.trainer.val_before_train and self.val_ds is not None:
            self.tracker.log(self.validate(), self.step)
        if cfg.trainer.val_only:
            return self.validate() if self.val_ds is not None else {}
        batches = self._batches()
        bar = tqdm(total=self.total_steps, initial=self.step, desc="GRPO", dynamic_ncols=True, disable=not os.isatty(2))
        while self.step < self.total_steps:
            t_step = time.perf_counter()
            self.step += 1
            metrics: dict[str, float] = {}
            # 1. prompts
            t0 = time.perf_counter()
            prompts = self.train_ds.get_batch(next(batches))
            metrics["timing/data_s"] = time.perf_counter() - t0
            # 2. rollout: n samples per prompt on every worker
            t0 = time.perf_counter()
            rb = self.rollout(prompts)
            metrics["timing/rollout_s"] = time.perf_counter() - t0
            # 3. rewards (driver)
            t0 = time.perf_counter()
            samples = reward_samples(prompts, rb, self.tokenizer, cfg.data.max_response_length)
            scored = self.rewards.score(samples)
            metrics["timing/reward_s"] = time.perf_counter() - t0
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
            # 5. update + weight push on every worker (each trains on the samples it generated)
            t0 = time.perf_counter()
            per_rank = split_even(adv.tolist(), self.world)
            worker_metrics = self.group.run("update", "train", [(a, mini_samples) for a in per_rank])
            metrics["timing/train_s"] = time.perf_counter() - t0
            metrics.update(_mean_dicts(worker_metrics))
            # 6. metrics
            metrics.update(scored.metrics)
            metrics.update(_stats("reward", scored.scores))
            metrics.update(_stats("response_length", lengths.tolist()))
            metrics["response_length/clip_ratio"] = float(np.mean([f == "length" for f in rb.finish_reasons]))
            metrics["advantages/mean"] = float(adv.mean())
            metrics["advantages/abs_mean"] = float(adv.abs().mean())
            tokens = float(lengths.sum()) + sum(len(p) for p in rb.prompt_ids)
            metrics["timing/step_s"] = time.perf_counter() - t_step
            metrics["throughput/tokens_per_s"] = tokens / metrics["timing/step_s"]
            metrics["training/epoch"] = float(self.sampler.epoch)
            if cfg.trainer.rollout_data_dir:
                self._dump_samples(samples, scored, adv)
            tf = cfg.trainer.test_freq
            if self.val_ds is not None and tf > 0 and self.step % tf == 0 and self.step < self.total_steps:
                metrics.update(self.validate())
            if self.step == self.total_steps and self.val_ds is not None:
                metrics.update(self.validate())
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
        for start in range(0, len(self.val_ds), bs):
            prompts = self.val_ds.get_batch(list(range(start, min(start + bs, len(self.val_ds)))))
            rb = self.rollout(prompts, validate=True)
            samples = reward_samples(prompts, rb, self.tokenizer, self.cfg.data.max_response_length)
            scores += self.rewards.score(samples).scores
            sources += [s.data_source for s in samples]
        out = {"val/reward/mean": float(np.mean(scores)), "timing/validate_s": time.perf_counter() - t0}
        for src in sorted(set(sources)):
            vals = [s for s, d in zip(scores, sources) if d == src]
            out[f"val/{src}/reward"] = float(np.mean(vals))
        return out

    def _dump_samples(self, samples: list[RewardSample], scored: Any, adv: torch.Tensor) -> None:
        import json

        d = Path(self.cfg.trainer.rollout_data_dir)
        d.mkdir(parents=True, exist_ok=True)
        with open(d / f"step_{self.step:06d}.jsonl", "w", encoding="utf-8") as f:
            for i, s in enumerate(samples):
                comps = {k: v[i] for k, v in scored.components.items()}
                f.write(
                    json.dumps(
                        {
                            "step": self.step,
                            "data_source": s.data_source,
                            "prompt": s.prompt,
                            "response": s.response,
                            "ground_truth": str(s.ground_truth),
                            "score": scored.scores[i],
                            "components": comps,
                            "advantage": float(adv[i]),
                        },
                        ensure_ascii=False,
                    )
                    + "\n"
                )

    def close(self) -> None:
        """Stop workers, close trackers and the reward pool, draw the curve."""
        self.tracker.close()
        self.rewards.close()
        self.group.shutdown()
        if self.tracker.jsonl_path.exists():
            from vlmrl.trainer.tracking import plot_curve

            try:
                plot_curve(self.tracker.jsonl_path, self.out_dir / "reward_curve.png")
            except Exception as e:  # noqa: BLE001 - a plot must never fail a finished run
                print(f"[vlmrl] could not draw the reward curve: {e}", flush=True)


def fit(cfg: VLMRLConfig) -> dict[str, float]:
    """Build everything, train, clean up."""
    trainer = Trainer(cfg)
    try:
        return trainer.fit()
    finally:
        trainer.close()
