"""Rewards from a model (``reward_model.enable``): the driver's side of the reward-model stage of a step.

rollout → **reward model** (this stage: every sample gets ``rm_score``) → rule rewards (the composite; its
``reward_model`` component returns ``rm_score``) → advantages ...

Two kinds, ``reward_model.style``:

- ``discriminative``: a Qwen2.5-VL with a one-output score head (``discriminative.RewardModelWorker``), sharded on
  the training workers beside the policy (verl's colocated reward model); the driver sends each worker an equal
  share of the step's prompt groups and gathers the scores in order.
- ``generative``: a VLM judge (``judge.Judge``) on an engine of its own in the driver; its verdicts are parsed into
  scores.

A reward-model call that fails (a worker's forward raised, the judge's engine failed) leaves that batch's samples
without a score (``rm_error``): the ``reward_model`` component then counts each as a reward error
(``reward.on_error``), as a failing rule reward is.

Training a reward model: ``python -m vlmrl.reward_model.train`` (Bradley–Terry on preference pairs).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from vlmrl.batch import PromptSample, RewardSample, RolloutBatch, split_even

__all__ = ["RewardModel"]


class RewardModel:
    """Scores a step's samples with the configured reward model (``score``), in place."""

    def __init__(
        self,
        cfg: Any,
        group: Any = None,
        world: int = 1,
        device: str = "cpu",
        limits: tuple[int, int] = (1, 0),
        seed: int = 0,
    ) -> None:
        """``group``: the training workers (they hold the discriminative model); ``limits``: the most images and
        videos a prompt holds (the judge's engine); ``device``: where the judge runs."""
        rm = cfg.reward_model
        self.style = rm.style
        self.group, self.world = group, world
        self.micro = max(1, int(rm.micro_batch_size_per_gpu))
        self.judge = None
        if self.style == "generative":
            from vlmrl.reward_model.judge import Judge

            r = cfg.reward
            self.judge = Judge(rm, device, limits[0], limits[1], seed, int(r.num_workers), float(r.timeout_s))

    def score(
        self, prompts: list[PromptSample], rollout: RolloutBatch, samples: list[RewardSample]
    ) -> dict[str, float]:
        """Set ``rm_score`` (or ``rm_error``) on every sample (sample i answers ``prompts[i // rollout.n]``);
        returns the ``reward_model/*`` metrics (the trainer times the stage as ``timing/reward_model_s``)."""
        metrics: dict[str, float] = {}
        try:
            if self.judge is not None:
                metrics |= self.judge.score(prompts, rollout.n, samples)
            else:
                metrics |= self._discriminative(prompts, rollout, samples)
        except Exception as e:  # noqa: BLE001 - the batch's samples are counted as reward errors, not lost
            why = f"the reward model failed on this batch: {type(e).__name__}: {e}"
            for s in samples:
                s.rm_score, s.rm_error = None, why
            print(f"[vlmrl] {why}", flush=True)
        scored = [s.rm_score for s in samples if s.rm_score is not None]
        metrics["reward_model/errors"] = float(len(samples) - len(scored))
        if scored:
            metrics["reward_model/score/mean"] = float(np.mean(scored))
            metrics["reward_model/score/std"] = float(np.std(scored))
        return metrics

    def _discriminative(
        self, prompts: list[PromptSample], rollout: RolloutBatch, samples: list[RewardSample]
    ) -> dict[str, float]:
        """Each worker scores an equal share of the prompt groups (a worker left without one scores a copy of the
        first, dropped), every worker in the same number of micro-batches (FSDP's collectives pair them up)."""
        n = rollout.n
        shares = split_even(list(range(len(prompts))), self.world)
        real = [bool(g) for g in shares]
        shares = [g or [0] for g in shares]
        n_micro = max(math.ceil(len(g) * n / self.micro) for g in shares)
        args = [([prompts[i] for i in g], rollout.select_groups(g), n_micro) for g in shares]
        results = self.group.score_rewards(args)
        truncated = 0
        offset = 0
        for g, ok, (scores, error, cut) in zip(shares, real, results):
            if not ok:
                continue
            rows = range(offset, offset + len(g) * n)
            offset += len(g) * n
            truncated += cut
            for k, i in enumerate(rows):
                if error is not None:
                    samples[i].rm_score, samples[i].rm_error = None, error
                else:
                    samples[i].rm_score = float(scores[k])
        return {"reward_model/truncated": float(truncated)}

    def close(self) -> None:
        """Stop the judge's engine."""
        if self.judge is not None:
            self.judge.close()
