"""The FSDP2 critic (value model) of actor-critic PPO, on the same hybrid worker as policy, reference and engine.

A Qwen2.5-VL backbone with a value head (``models.value_head``) sharded like the actor (``models.trainable.fsdp_wrap``),
its own AdamW, schedule, gradient clipping and checkpoint folder; values in micro-batches (fixed sizes or token budgets)
through the policy's forward (``models.forward.response_values``: the same vision features, M-RoPE positions and dummy
vision pass), and the clipped value loss (``algos.ppo.value_loss``) in ``critic.ppo_epochs`` passes of mini-batches."""

from __future__ import annotations

import torch
import torch.distributed as dist

from vlmrl.algorithms.ppo import value_loss
from vlmrl.config.plan import CriticPlan
from vlmrl.models import qwen_vl
from vlmrl.models.forward import response_values
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
from vlmrl.models.value_head import add_value_head
from vlmrl.timing import Timer
from vlmrl.workers import micro_batches
from vlmrl.workers.policy import token_micro_batches


class CriticWorker:
    """The critic of one rank: ``values`` (no gradient) and ``update`` on the rank's samples."""

    def __init__(
        self,
        plan: CriticPlan,
        *,
        device: str,
        total_steps: int,
        vision_ids: qwen_vl.VisionTokenIds,
        seed: int,
        max_response_length: int,
    ) -> None:
        """``plan``: the critic's resolved settings (``config.plan.critic_plan``); the rest as the policy's."""
        self.plan = plan
        self.device = device
        self.vision_ids = vision_ids
        self.seed = int(seed)
        self.max_response_length = int(max_response_length)
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        self.model = load_model(plan.path, device, plan.trust_remote_code, where=f"critic.model.path={plan.path}")
        self.head_source = add_value_head(self.model, plan.path)
        if plan.gradient_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        fc = plan.fsdp
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
        self.optimizer, self.scheduler = optimizer_and_schedule(self.model, plan.optim, total_steps)
        # optimizer state in host memory between steps (critic.fsdp.optimizer_offload; param_offload keeps it there)
        self.offload_optimizer = device == "cuda" and fc.optimizer_offload and not fc.param_offload

    def micro_batches(self, x: ModelInputs, rows: list[int], update: bool) -> list[list[int]]:
        """``rows`` as micro-batches of the update (``update``) or of the value forward: fixed sizes or token
        budgets (``critic.use_dynamic_bsz``), the same count on every rank."""
        p = self.plan
        if not p.use_dynamic_bsz:
            return micro_batches.fixed(rows, p.micro_batch_size if update else p.forward_micro_batch_size)
        key = "critic.ppo_max_token_len_per_gpu" if update else "critic.forward_max_token_len_per_gpu"
        budget = p.max_token_len if update else p.forward_max_token_len
        return token_micro_batches(x, rows, budget, key, self.device, self.world, self.plan.use_remove_padding)

    @torch.no_grad()
    def values(self, x: ModelInputs) -> torch.Tensor:
        """Values [B, R] (aligned with ``x.responses``) of every sample, in eval mode (Qwen-VL has no dropout: the
        training-mode values)."""
        out = torch.zeros(x.responses.shape, dtype=torch.float32)
        was_training = self.model.training
        self.model.eval()
        try:
            for idx in self.micro_batches(x, list(range(x.batch_size)), update=False):
                mb = to_device(x.select(idx), self.device)
                v, _ = response_values(self.model, mb, self.vision_ids, self.plan.use_remove_padding)
                out[idx, : v.shape[1]] = v.cpu()
        finally:
            self.model.train(was_training)
        return out

    def update(
        self, x: ModelInputs, returns: torch.Tensor, old_values: torch.Tensor, mini_batch_samples: int
    ) -> dict[str, float]:
        """``critic.ppo_epochs`` passes of mini-batches (``mini_batch_samples`` on this rank) minimising the clipped
        value loss against ``returns`` [B, R], clipped around ``old_values`` [B, R] (the values at rollout time)."""
        p = self.plan
        timer = Timer()
        n_mini = max(1, x.batch_size // max(1, mini_batch_samples))
        metrics: dict[str, list[float]] = {}
        g = torch.Generator().manual_seed(self.seed + 7919 + int(self.scheduler.last_epoch))
        with timer("critic_update"):
            self.model.train()
            for _epoch in range(p.epochs):
                order = torch.randperm(x.batch_size, generator=g) if p.shuffle else torch.arange(x.batch_size)
                for mini in order.chunk(n_mini):
                    self._mini_step(x, mini, returns, old_values, metrics)
            self.scheduler.step()
        out = {k: float(sum(v) / len(v)) for k, v in metrics.items()}
        out["critic/lr"] = float(self.scheduler.get_last_lr()[0])
        return out | timer.metrics()

    def _mini_step(
        self,
        x: ModelInputs,
        rows: torch.Tensor,
        returns: torch.Tensor,
        old_values: torch.Tensor,
        metrics: dict[str, list[float]],
    ) -> None:
        p = self.plan
        mini = x.select(rows)
        tokens_here = max(float(mini.response_mask.sum()), 1.0)
        g_tokens, g_seqs = global_sums(self.device, self.world, float(mini.response_mask.sum()), float(mini.batch_size))
        agg_kw = dict(global_tokens=g_tokens, global_seqs=g_seqs, max_len=self.max_response_length)
        self.optimizer.zero_grad(set_to_none=True)
        sums = {"critic/vf_loss": 0.0, "critic/vf_clipfrac": 0.0, "critic/vpred_mean": 0.0}
        for idx in self.micro_batches(x, rows.tolist(), update=True):
            mb = to_device(x.select(idx), self.device)
            vpreds, extra = response_values(self.model, mb, self.vision_ids, self.plan.use_remove_padding)
            R = vpreds.shape[1]
            mask = mb.response_mask
            m = mask.to(vpreds.dtype)
            loss, clipfrac = value_loss(
                vpreds,
                returns[idx, :R].to(vpreds.device),
                old_values[idx, :R].to(vpreds.device),
                mask,
                p.cliprange_value,
                p.loss_agg_mode,
                **agg_kw,
            )
            # FSDP averages gradients over ranks; the global denominators already did: undo the average
            (loss * self.world + extra).backward()
            n_tok = float(mask.sum())
            sums["critic/vf_loss"] += float(loss.detach()) * self.world
            sums["critic/vf_clipfrac"] += float(clipfrac) * n_tok
            sums["critic/vpred_mean"] += float((vpreds.detach() * m).sum())
        for name, value in sums.items():
            metrics.setdefault(name, []).append(value if name == "critic/vf_loss" else value / tokens_here)
        gn = clip_and_step(
            self.optimizer,
            p.grad_clip,
            self.device if self.offload_optimizer else None,
            lambda gn: (
                f"non-finite critic gradient norm ({gn}); the critic's weights were not changed. Usual "
                "causes: critic.optim.lr too high, returns far from the values' scale (rewards of large magnitude)"
            ),
        )
        metrics.setdefault("critic/grad_norm", []).append(gn)

    def save(self, folder: str) -> None:
        """Sharded critic + optimizer and scheduler states into ``folder``."""
        save_trainable(folder, self.model, self.optimizer, self.scheduler, self.world)

    def load(self, folder: str) -> None:
        """Restore what ``save`` wrote."""
        load_trainable(folder, self.model, self.optimizer, self.scheduler, self.world)
