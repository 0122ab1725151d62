"""The FSDP2 policy (and frozen reference): log-probs in micro-batches, the GRPO update, full weights for the engine.

``fully_shard`` wraps each decoder layer, each vision block and the vision tower, then the root. fp32 on CPU (gloo);
bf16 parameters with fp32 reductions on GPU (nccl). Works the same in a world of one.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist

from vlmrl.algorithms.algorithm import build_algorithm, call_hook, check_gradient_path, checked_loss
from vlmrl.algorithms.core import kl_penalty
from vlmrl.algorithms.losses import LossConfig
from vlmrl.algorithms.rollout_correction import correct
from vlmrl.config import ActorRolloutRefConfig
from vlmrl.config.plan import token_budgets
from vlmrl.config.schema import RolloutCorrectionConfig
from vlmrl.models import qwen_vl
from vlmrl.models.forward import forward_token_counts, response_logprobs, response_logprobs_and_pi2, vision_patch_count
from vlmrl.models.inputs import ModelInputs, to_device
from vlmrl.models.trainable import (
    clip_and_step,
    compute_dtype,
    fsdp_wrap,
    global_sums,
    load_model,
    load_trainable,
    optimizer_and_schedule,
    save_trainable,
)
from vlmrl.timing import Timer
from vlmrl.workers import micro_batches
from vlmrl.workers.weights import engine_weights


def token_micro_batches(
    x: ModelInputs, rows: list[int], budget: int, key: str, device: str, world: int, packed: bool = False
) -> list[list[int]]:
    """``rows`` of ``x`` in micro-batches of at most ``budget`` tokens each (``key`` names the setting in errors),
    counted as the forward computes them (``packed``: real tokens, each prompt once), as many on every rank as the
    rank needing the most (one all-reduce), so all ranks run the same passes."""
    plen = x.input_ids.shape[1] - x.responses.shape[1]
    prompt_lens = x.attention_mask[rows, :plen].sum(-1).tolist()
    response_lens = x.attention_mask[rows, plen:].sum(-1).tolist()  # every response token (tool turns too)
    # packed with tool images in responses: every sample runs its whole sequence (no prompt shared)
    prompt_of = None if not packed else rows if x.has_response_images else x.prompt_of[rows].tolist()
    batches = micro_batches.by_tokens(rows, prompt_lens, response_lens, budget, key, prompt_of)
    count = len(batches)
    if dist.is_initialized() and world > 1:
        t = torch.tensor([count], dtype=torch.int64, device=device if device == "cuda" else "cpu")
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        count = int(t.item())
    # ranks hold equal sample counts (plan_shards), so a rank can always split to the count another needs
    shared = None if prompt_of is None else dict(zip(rows, prompt_of))
    return micro_batches.split_to(batches, count, dict(zip(rows, prompt_lens)), dict(zip(rows, response_lens)), shared)


def on_last_tokens(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[b, R]: each score on its sample's last response token (mask 1), zeros elsewhere (verl's token-level
    rewards)."""
    out = torch.zeros(mask.shape, dtype=scores.dtype, device=mask.device)
    positions = torch.arange(mask.shape[1], device=mask.device)
    last = ((mask > 0) * positions).amax(dim=-1)
    out[torch.arange(mask.shape[0], device=mask.device), last] = scores
    return out


class _MiniBatchStats:
    """Diagnostics of one mini-batch on this rank, whatever its split into micro-batches: sums (per-token means at
    the end, but ``actor/pg_loss``, a sum of the micro-batches' parts), extremes, and the work done."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.extremes: dict[str, float] = {}
        self.work = dict.fromkeys(
            ("work/update_tokens", "work/update_padding_tokens", "work/update_vision_patches"), 0.0
        )

    def add(self, name: str, value: float) -> None:
        self.sums[name] = self.sums.get(name, 0.0) + value

    def count(self, real: float, padding: float, patches: float) -> None:
        """A forward's tokens (real and padding) and vision patches."""
        for key, value in zip(self.work, (real, padding, patches)):
            self.work[key] += value

    def correction(self, corr: dict[str, float], n_tok: float) -> None:
        """A micro-batch's rollout-correction metrics: extremes over the micro-batches, means weighted by tokens."""
        for name, value in corr.items():
            if name.endswith(("_max", "_min")):
                pick = max if name.endswith("_max") else min
                self.extremes[name] = pick(self.extremes.get(name, value), value)
            else:
                self.add(name, value * n_tok)

    def into(self, metrics: dict[str, list[float]], tokens: float) -> None:
        """One value each into ``metrics`` (work: totals, one entry per mini-batch, summed in ``update``)."""
        for name, value in self.sums.items():
            metrics.setdefault(name, []).append(value if name == "actor/pg_loss" else value / tokens)
        for name, value in self.extremes.items():
            metrics.setdefault(name, []).append(value)
        for name, value in self.work.items():
            metrics.setdefault(name, []).append(value)


def _engine_logprobs(x: ModelInputs, what: str) -> torch.Tensor:
    """The engine's log-probs of the sampled tokens (rollout correction's behaviour policy), or why there are none."""
    if x.rollout_logprobs is None:
        raise RuntimeError(f"{what} needs the engine's log-probs of the sampled tokens, and this rollout returned none")
    return x.rollout_logprobs[:, : x.response_mask.shape[1]].float()


class PolicyWorker:
    """The actor (trainable, FSDP2-sharded) and, when KL is on, the frozen reference."""

    def __init__(
        self,
        arr: ActorRolloutRefConfig,
        *,
        device: str,
        total_steps: int,
        vision_ids: qwen_vl.VisionTokenIds,
        seed: int,
        max_response_length: int,
        reference: bool | None = None,
        rollout_correction: RolloutCorrectionConfig | None = None,
        algorithm: tuple[str | None, dict[str, Any]] = (None, {}),
    ) -> None:
        """``arr`` is ``actor_rollout_ref``; ``seed`` (trainer.seed) orders mini-batches; ``max_response_length``
        (data.max_response_length) normalises the seq-mean-token-sum-norm loss; ``reference``: build the frozen
        reference (``config.plan.reference_needed``; None: when the KL loss is on); ``rollout_correction``: weights
        and rejection against the engine's log-probs in each update (None: off); ``algorithm``: the class whose
        ``compute_loss`` runs on each micro-batch and its parameters (``algorithm.name``; None: the base class)."""
        self.arr = arr
        self.correction = rollout_correction
        self.device = device
        self.vision_ids = vision_ids
        self.seed = int(seed)
        self.max_response_length = int(max_response_length)
        self.actor_cfg = arr.actor
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        self._load_models(arr, device, reference)
        self.optimizer, self.scheduler = optimizer_and_schedule(self.model, arr.actor.optim, total_steps)
        self.loss_config = LossConfig.from_actor(arr.actor)
        if rollout_correction is not None and rollout_correction.bypass_mode:  # as verl's apply_bypass_mode
            self.loss_config.policy_loss.loss_mode = "bypass_mode"
            self.loss_config.policy_loss.rollout_correction = rollout_correction
        self.algorithm = build_algorithm(algorithm[0], dict(algorithm[1]), self.loss_config)
        self._gradient_path_checked = False
        self.temperature = max(arr.rollout.temperature, 1e-6)
        self.packed = arr.model.use_remove_padding
        """Padding-free forwards (``models.packing``) for the actor and the reference."""
        # optimizer state in host memory between steps (verl's optimizer_offload). With param_offload FSDP2 keeps
        # it there already (CPUOffloadPolicy); on a CPU device it is host memory anyway.
        fc = arr.actor.fsdp_config
        self.offload_optimizer = device == "cuda" and fc.optimizer_offload and not fc.param_offload

    # ------------------------------------------------------------------------------------------------ log-probs
    def _load_models(self, arr: ActorRolloutRefConfig, device: str, reference: bool | None) -> None:
        """The actor (frozen vision tower, LoRA and gradient checkpointing as set; FSDP2 when distributed) and the
        frozen reference when it is needed."""
        self.model = load_model(arr.model.path, device, arr.model.trust_remote_code)
        if arr.model.freeze_vision_tower:
            for p in (q for m in qwen_vl.vision_modules(self.model) for q in m.parameters()):
                p.requires_grad_(False)
        if arr.model.lora_rank > 0:
            from vlmrl.workers.lora import apply_lora

            self.model = apply_lora(self.model, arr.model)
        if arr.model.enable_gradient_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        fc = arr.actor.fsdp_config
        if dist.is_initialized():
            self.model = fsdp_wrap(
                self.model,
                device,
                fc.param_offload,
                fc.reshard_after_forward,
                compute_dtype(fc.dtype, device),
                fc.wrap_policy.min_num_params,
                fc.fsdp_size,
            )
        self.ref = None
        if arr.actor.use_kl_loss if reference is None else reference:
            ref = load_model(arr.model.path, device, arr.model.trust_remote_code).eval()
            ref.requires_grad_(False)
            if dist.is_initialized():
                rc = arr.ref.fsdp_config
                ref = fsdp_wrap(
                    ref,
                    device,
                    rc.param_offload,
                    True,
                    compute_dtype(rc.dtype, device),
                    rc.wrap_policy.min_num_params,
                    rc.fsdp_size,
                )
            self.ref = ref

    def micro_batches(self, x: ModelInputs, rows: list[int], which: str) -> list[list[int]]:
        """``rows`` of ``x`` as micro-batches for the update (``which="update"``) or a log-prob forward (``actor`` =
        old log-probs, ``ref``): fixed sizes, or token budgets (``use_dynamic_bsz``) with the count every rank
        needs reduced to the largest, so all ranks run the same number of passes."""
        arr = self.arr
        key, dynamic, budget = token_budgets(arr)[which]
        if not dynamic:
            if which == "update":
                size = arr.actor.ppo_micro_batch_size_per_gpu
            else:
                c = arr.ref if which == "ref" else arr.rollout
                size = c.log_prob_micro_batch_size_per_gpu or arr.actor.ppo_micro_batch_size_per_gpu
            return micro_batches.fixed(rows, size)
        return token_micro_batches(x, rows, budget, key, self.device, self.world, self.packed)

    def old_logprobs_and_pi2(self, x: ModelInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """The actor's log-probs [B, R] and its sum of squared token probabilities [B, R] (for the optimal-token-
        baseline estimators), one eval-mode forward per micro-batch."""
        old = torch.zeros(x.responses.shape, dtype=torch.float32)
        pi2 = torch.zeros(x.responses.shape, dtype=torch.float32)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                for idx in self.micro_batches(x, list(range(x.batch_size)), "actor"):
                    mb = to_device(x.select(idx), self.device)
                    lp, p2 = response_logprobs_and_pi2(self.model, mb, self.vision_ids, self.temperature, self.packed)
                    old[idx, : lp.shape[1]] = lp.float().cpu()
                    pi2[idx, : p2.shape[1]] = p2.float().cpu()
        finally:
            self.model.train(was_training)
        return old, pi2

    @torch.no_grad()
    def logprobs(self, x: ModelInputs, which: str = "actor") -> torch.Tensor:
        """Per-token log-probs [B, R] (aligned with ``x.responses``) under the actor or the reference.

        Runs in eval mode (Qwen-VL has no dropout, so the values are the training-mode ones): there the prompt's KV
        cache is shared by its samples even when gradient checkpointing is on."""
        model = self.model if which == "actor" else self.ref
        assert model is not None, "reference model requested but actor.use_kl_loss is off"
        out = torch.zeros(x.responses.shape, dtype=torch.float32)
        was_training = model.training
        model.eval()
        try:
            for idx in self.micro_batches(x, list(range(x.batch_size)), which):
                mb = to_device(x.select(idx), self.device)
                lp, _, _ = response_logprobs(model, mb, self.vision_ids, self.temperature, packed=self.packed)
                out[idx, : lp.shape[1]] = lp.float().cpu()
        finally:
            model.train(was_training)
        return out

    # --------------------------------------------------------------------------------------------------- update
    def old_and_ref(
        self, x: ModelInputs, mini_batch_samples: int, need_old: bool = False
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The old log-probs (None when the update is exactly on-policy, one epoch of one mini-batch, and
        ``need_old`` is False: the update then uses the current ones, detached) and the reference's (None without
        a reference)."""
        n_mini = max(1, x.batch_size // max(1, mini_batch_samples))
        on_policy = self.actor_cfg.ppo_epochs == 1 and n_mini == 1
        old = None if on_policy and not need_old else self.logprobs(x, "actor")
        ref = self.logprobs(x, "ref") if self.ref is not None else None
        return old, ref

    def update(
        self,
        x: ModelInputs,
        advantages: torch.Tensor,
        mini_batch_samples: int,
        given: tuple[torch.Tensor | None, torch.Tensor | None] | None = None,
        rewards: torch.Tensor | None = None,
    ) -> dict[str, float]:
        """PPO-style update over ``x`` (this rank's samples) with ``ppo_epochs`` passes of mini-batches.
        ``advantages``: [B] (one per sample) or [B, R] (per token). ``given``: old and reference log-probs computed
        before (``old_and_ref``); else they are computed here. ``rewards``: [B] each sample's score (the algorithm
        class's ``compute_loss`` gets it on the last generated token).

        With one epoch and one mini-batch the data is exactly on-policy: the old log-probs equal the current ones,
        so the ratio is computed against their detached values and no separate forward is spent on them.
        """
        ac = self.actor_cfg
        timer = Timer()
        n_mini = max(1, x.batch_size // max(1, mini_batch_samples))
        bypass = self.correction is not None and self.correction.bypass_mode
        decoupled = self.correction is not None and not bypass
        lazy = self._lazy_correction(n_mini)
        with timer("old_ref_logprob"):
            need = decoupled and not lazy
            old, ref = given if given is not None else self.old_and_ref(x, mini_batch_samples, need_old=need)
            if need and old is None:  # (a prepared shard computed none: on-policy)
                old = self.logprobs(x, "actor")
            lazy = lazy and old is None
            if bypass:  # verl's bypass mode: the engine's log-probs are the old ones (no recomputation)
                old = _engine_logprobs(x, "algorithm.rollout_correction.bypass_mode")
        weights, corrected = None, {}
        if decoupled and not lazy:
            x, weights, corrected = self._correct(x, old)
        elif lazy:
            _engine_logprobs(x, "algorithm.rollout_correction")
        metrics: dict[str, list[float]] = {}
        g = torch.Generator().manual_seed(self.seed + int(self.scheduler.last_epoch))
        with timer("update"):
            self.model.train()
            for _epoch in range(ac.ppo_epochs):
                order = torch.randperm(x.batch_size, generator=g) if ac.shuffle else torch.arange(x.batch_size)
                for mini in order.chunk(n_mini):
                    self._mini_step(x, mini, advantages, old, ref, metrics, weights, rewards, lazy)
            self.scheduler.step()
        empty = len(metrics.pop("actor/empty_mini_batches", []))
        out = {k: float(sum(v) / (1 if k.startswith("work/") else len(v))) for k, v in metrics.items()}
        out["actor/lr"] = float(self.scheduler.get_last_lr()[0])
        if self.correction is not None:
            out["actor/empty_mini_batches"] = float(empty)
        return out | corrected | timer.metrics()

    def _lazy_correction(self, n_mini: int) -> bool:
        """Whether the importance weights are computed inside the update's micro-batches: with one pass of one
        mini-batch the old log-probs are the update's own forward, detached, and token-level weights (no rejection,
        no batch normalisation: nothing needs the whole shard; their metrics are token means and extremes, merged
        exactly) come from that forward instead of a separate forward for the old ones."""
        rc = self.correction
        return (
            rc is not None
            and not rc.bypass_mode
            and self.actor_cfg.ppo_epochs == 1
            and n_mini == 1
            and rc.rollout_is == "token"
            and rc.rollout_rs is None
            and not rc.rollout_is_batch_normalize
        )

    def _correct(self, x: ModelInputs, old: torch.Tensor) -> tuple[ModelInputs, torch.Tensor | None, dict]:
        """Rollout correction of this shard: the inputs with the rejected tokens out of the response mask, the
        importance weights and the ``rollout_corr/*`` metrics (``vlmrl.algorithms.rollout_correction``)."""
        if x.rollout_logprobs is None:
            raise RuntimeError(
                "algorithm.rollout_correction needs the engine's log-probs of the sampled tokens, and "
                "this rollout returned none"
            )
        R = x.response_mask.shape[1]
        mask = x.response_mask.to(old.dtype)

        def global_mean(values: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
            num, den = self._global_sums(float((values * m).sum()), float(m.sum()))
            return torch.tensor(num / max(den, 1e-8), dtype=values.dtype)

        weights, new_mask, metrics = correct(
            old[:, :R], x.rollout_logprobs[:, :R].to(old.dtype), mask, self.correction, global_mean
        )
        return replace(x, response_mask=new_mask.to(x.response_mask.dtype)), weights, metrics

    def _global_sums(self, *values: float) -> list[float]:
        """Sums of these numbers over ranks, in one all-reduce."""
        return global_sums(self.device, self.world, *values)

    def _mini_step(
        self,
        x: ModelInputs,
        rows: torch.Tensor,
        advantages: torch.Tensor,
        old: torch.Tensor | None,
        ref: torch.Tensor | None,
        metrics: dict[str, list[float]],
        weights: torch.Tensor | None = None,
        rewards: torch.Tensor | None = None,
        lazy_correction: bool = False,
    ) -> None:
        """One optimizer step on the samples ``rows`` of ``x``, micro-batch by micro-batch. ``lazy_correction``:
        the rollout correction's weights come from each micro-batch's own forward (``update``)."""
        mini = x.select(rows)
        # the whole mini-batch's token / sequence counts across ranks: accumulation = one big batch (agg_loss
        # divides by them and multiplies by the ranks, whose gradients FSDP averages)
        g_tokens, g_seqs = self._global_sums(float(mini.response_mask.sum()), float(mini.batch_size))
        if g_tokens == 0:  # every token rejected (rollout correction) on every rank: nothing to learn, no step
            metrics.setdefault("actor/empty_mini_batches", []).append(1.0)
            return
        self.loss_config.global_batch_info = dict(
            dp_size=self.world,
            batch_num_tokens=g_tokens,
            global_batch_size=g_seqs,
            loss_scale_factor=self.max_response_length,
        )
        self.optimizer.zero_grad(set_to_none=True)
        stats = _MiniBatchStats()
        targets = (advantages, old, ref, weights, rewards)
        for idx in self.micro_batches(x, rows.tolist(), "update"):
            self._micro_step(to_device(x.select(idx), self.device), idx, targets, lazy_correction, stats)
        stats.into(metrics, max(float(mini.response_mask.sum()), 1.0))
        losses = [v for v in metrics.get("actor/pg_loss", []) if not math.isfinite(v)]
        gn = clip_and_step(
            self.optimizer,
            self.actor_cfg.grad_clip,
            self.device if self.offload_optimizer else None,
            lambda gn: (
                f"non-finite gradient norm ({gn}) in the update"
                + (f" (non-finite loss: {losses[0]})" if losses else "")
                + "; the weights were not changed. Usual causes: a learning rate too high for this model, fp16 "
                "overflow, a reward that was inf/NaN upstream"
            ),
        )
        metrics.setdefault("actor/grad_norm", []).append(gn)

    def _micro_step(
        self,
        mb: ModelInputs,
        idx: list[int],
        targets: tuple[torch.Tensor | None, ...],
        lazy_correction: bool,
        stats: _MiniBatchStats,
    ) -> None:
        """Forward and backward of one micro-batch (rows ``idx`` of the mini-step's inputs, ``mb`` on the device):
        the algorithm's loss on its data (``targets``: advantages, old, ref log-probs, correction weights, rewards),
        its diagnostics into ``stats``."""
        advantages, old, ref, weights, rewards = targets
        lp, ent, extra = response_logprobs(
            self.model, mb, self.vision_ids, self.temperature, with_entropy=True, packed=self.packed
        )
        real, padding = forward_token_counts(mb, self.model, self.packed)
        stats.count(real, padding, vision_patch_count(mb))
        mask = mb.response_mask
        m = mask.to(lp.dtype)
        n_tok = float(mask.sum())
        R = lp.shape[1]
        old_lp = lp.detach() if old is None else old[idx, :R].to(lp.device)
        w = None if weights is None else weights[idx, :R].to(lp.device)
        if lazy_correction:  # the micro-batch's own importance weights: old = this forward, detached
            w, _, corr = correct(old_lp, mb.rollout_logprobs[:, :R].to(lp.device, lp.dtype), m, self.correction)
            stats.correction(corr, n_tok)
        adv = (advantages[idx] if advantages.dim() == 1 else advantages[idx, :R]).to(lp.device)
        if adv.dim() == 1:
            adv = adv.unsqueeze(-1).expand_as(lp)
        data = {
            "responses": mb.responses,
            "response_mask": mask,
            "attention_mask": mb.attention_mask,
            "old_log_probs": old_lp,
            "log_probs": lp,
            "advantages": adv,
            "entropy": ent,
            "ref_log_probs": None if ref is None else ref[idx, :R].to(lp.device),
            "rollout_is_weights": w,
            "response_lengths": mask.sum(-1),
            "rewards": None if rewards is None else on_last_tokens(rewards[idx].to(lp.device), mask),
        }
        loss, loss_metrics = self._loss(data)
        pg_loss = loss_metrics.pop("pg_loss", float(loss.detach()))
        if mb.rollout_logprobs is not None and self.temperature == 1.0:
            # engine vs trainer log-probs of the same tokens: drifts when a weight push or M-RoPE input is wrong
            gap = (lp.detach() - mb.rollout_logprobs.to(lp.device)).abs()
            stats.add("rollout/logprob_diff", float((gap * m).sum()))
        if ref is not None:
            kl = kl_penalty(lp.detach(), data["ref_log_probs"], self.actor_cfg.kl_loss_type)
            stats.add("actor/kl_loss", float((kl * m).sum()))
        (loss + extra).backward()
        stats.add("actor/pg_loss", float(pg_loss))  # the micro-batch's part of the loss (x ranks)
        for name, value in loss_metrics.items():  # the loss's own diagnostics: per-token means, weighted
            if name != "kl_loss":
                stats.add(name if "/" in name else f"actor/{name}", float(value) * n_tok)
        stats.add("actor/entropy", float((ent.detach() * m).sum()))

    def _loss(self, data: dict[str, Any]) -> tuple[torch.Tensor, dict[str, float]]:
        """The algorithm's loss on one micro-batch's data, checked (and, once a run, its path to the log-probs)."""
        self.algorithm.loss_config = self.loss_config
        step = int(self.scheduler.last_epoch) + 1
        out = call_hook(self.algorithm, "compute_loss", step, data)
        loss, loss_metrics = checked_loss(self.algorithm, out, step)
        if not self._gradient_path_checked:
            check_gradient_path(self.algorithm, out, data, step)
            self._gradient_path_checked = True
        return loss, loss_metrics

    # -------------------------------------------------------------------------------------------- checkpoints
    def save(self, folder: str) -> None:
        """Sharded model + optimizer, scheduler and RNG states into ``folder`` (``save_trainable``)."""
        save_trainable(folder, self.model, self.optimizer, self.scheduler, self.world)

    def load(self, folder: str) -> None:
        """Restore what ``save`` wrote (``load_trainable``)."""
        load_trainable(folder, self.model, self.optimizer, self.scheduler, self.world)

    # ----------------------------------------------------------------------------------------------- weights
    def engine_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full (unsharded) parameters one at a time under the engine's names. Every rank must consume the whole
        iterator in the same order: each unit's gather is a collective. On CPU the gathered units stay gathered
        until the next update's backward (host memory is not what the engine's KV cache competes for; on GPU it
        is, so there they are freed at once)."""
        yield from engine_weights(self.model, keep_gathered=self.device == "cpu")
