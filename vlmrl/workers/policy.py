"""The FSDP2 policy (and frozen reference): log-probs in micro-batches, the GRPO update, full weights for the engine.

``fully_shard`` wraps each decoder layer, each vision block and the vision tower, then the root. fp32 on CPU (gloo);
bf16 parameters with fp32 reductions on GPU (nccl). Works the same in a world of one.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist

from vlmrl import rng
from vlmrl.algos.algorithm import build_algorithm, call_hook, checked_loss
from vlmrl.algos.core import kl_penalty
from vlmrl.algos.losses import LossConfig
from vlmrl.algos.rollout_correction import correct
from vlmrl.config import ActorRolloutRefConfig
from vlmrl.config.plan import token_budgets
from vlmrl.config.schema import RolloutCorrectionConfig
from vlmrl.models import packing, qwen_vl
from vlmrl.models.forward import forward_token_counts, response_logprobs, response_logprobs_and_pi2, vision_patch_count
from vlmrl.models.inputs import ModelInputs, to_device
from vlmrl.safe_load import safe_dcp_load
from vlmrl.timing import Timer
from vlmrl.workers import micro_batches
from vlmrl.workers.weights import engine_weights

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def compute_dtype(setting: str, device: str) -> torch.dtype:
    """The mixed-precision compute dtype of ``fsdp_config.dtype`` (auto: bfloat16 on GPU, float32 on CPU)."""
    if setting == "auto":
        return torch.bfloat16 if device == "cuda" else torch.float32
    return _DTYPES[setting]


def _fsdp_wrap(
    model: torch.nn.Module,
    device: str,
    offload: bool,
    reshard: bool,
    dtype: torch.dtype = torch.float32,
    min_params: int = 0,
) -> torch.nn.Module:
    """FSDP2 over the decoder layers, vision blocks (those with at least ``min_params`` parameters), vision tower
    and root. ``dtype`` other than fp32: parameters are
    gathered and computed in it, gradients reduced in fp32, master weights stay fp32 (MixedPrecisionPolicy, on GPU
    and CPU alike). ``offload``: sharded parameters, gradients and optimizer state live in host memory between uses
    (CPUOffloadPolicy; pinned on GPU machines)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    kw: dict[str, Any] = {"reshard_after_forward": reshard}
    if dtype != torch.float32:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    if offload:
        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=device == "cuda")
    inner = qwen_vl.inner_model(model)
    for layer in [*inner.language_model.layers, *inner.visual.blocks]:
        if sum(p.numel() for p in layer.parameters()) >= min_params:
            fully_shard(layer, **kw)
    # the tower as a unit too: image features are computed by calling it directly (once per prompt, outside the
    # root forward), so its own hooks must gather patch_embed / merger
    fully_shard(inner.visual, **kw)
    fully_shard(model, **kw)
    # FSDP2 initialises lazily on the first ROOT forward; image features call the tower directly, so run one tiny
    # text-only forward through the root now (every rank does, so the collectives match)
    with torch.no_grad():
        ids = torch.zeros((1, 2), dtype=torch.long, device=device)
        model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    # with reshard_after_forward=False that forward leaves every unit gathered, its parameters registered as the
    # gathered copies: an optimizer built now would step those (overwritten by the next gather) and never learn
    _reshard_all(model)
    return model


def _reshard_all(model: torch.nn.Module) -> None:
    """Free every FSDP unit's gathered weights, so each unit's parameters are its sharded ones again (the ones an
    optimizer must hold)."""
    from torch.distributed.fsdp import FSDPModule

    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def adamw(params: list[torch.nn.Parameter], **kw: Any) -> torch.optim.AdamW:
    """AdamW with the fused kernel (one call per step for all parameters, on CPU and GPU alike, sharded or not);
    the multi-tensor (foreach) form where the fused one does not take these parameters."""
    try:
        return torch.optim.AdamW(params, fused=True, **kw)
    except RuntimeError:
        return torch.optim.AdamW(params, foreach=True, **kw)


def clip_grad_norm(params: list[torch.nn.Parameter], max_norm: float) -> float:
    """Clip the gradients to a global L2 norm of ``max_norm``; returns the norm before clipping (non-finite when a
    gradient is). Gradients sharded by FSDP2 (every rank a different shard) are handled on their local shards: the
    squared norms summed over ranks in one all-reduce, then every shard scaled in place; the same as
    ``torch.nn.utils.clip_grad_norm_`` without its per-op DTensor dispatch (in a third of its time on a small model).
    Gradients placed otherwise (replicated) go through ``clip_grad_norm_``."""
    from torch.distributed.tensor import DTensor, Shard

    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    sharded = [g for g in grads if isinstance(g, DTensor)]
    mesh = sharded[0].device_mesh if sharded else None
    if sharded and (
        len(sharded) < len(grads)
        or mesh.ndim != 1
        or any(g.device_mesh != mesh or not isinstance(g.placements[0], Shard) for g in sharded)
    ):
        gn = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
        return float(gn.full_tensor() if hasattr(gn, "full_tensor") else gn)
    local = [g.to_local() for g in sharded] if sharded else grads
    sq = torch.stack(torch._foreach_norm(local, 2.0)).float().square().sum()
    if mesh is not None and mesh.size() > 1:
        group = mesh.get_group()
        on = torch.device("cuda" if dist.get_backend(group) == "nccl" else "cpu")  # offloaded gradients: host
        summed = sq.to(on)
        dist.all_reduce(summed, group=group)
        sq = summed.to(sq.device)
    total = sq.sqrt()
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    torch._foreach_mul_(local, coef.to(local[0].dtype))
    return float(total)


def load_model(path: str, device: str, trust_remote_code: bool = False, where: str | None = None) -> torch.nn.Module:
    """Load a Qwen-VL checkpoint in fp32 (the master weights) on the worker's device; rejects other models, naming
    ``where`` the path came from (default: the config key). Its attention is ``sdpa`` behind vlmrl's varlen function
    (``models.packing``), which also runs padding-free packed rows."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    qwen_vl.check_model_type(config, where or f"actor_rollout_ref.model.path={path}")
    model = AutoModelForImageTextToText.from_pretrained(
        path, dtype=torch.float32, trust_remote_code=trust_remote_code, attn_implementation=packing.VARLEN
    )
    return model.to(device)


def lr_lambda(step: int, warmup: int, total: int, style: str, min_ratio: float) -> float:
    """Learning-rate multiplier: linear warm-up, then constant or cosine down to ``min_ratio``."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if style == "constant":
        return 1.0
    if style == "cosine":
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"actor_rollout_ref.actor.optim.warmup_style={style!r}: use constant | cosine")


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


def last_token_scores(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[b, R]: each score on its sample's last response token (mask 1), zeros elsewhere (verl's token-level
    rewards)."""
    out = torch.zeros(mask.shape, dtype=scores.dtype, device=mask.device)
    positions = torch.arange(mask.shape[1], device=mask.device)
    last = ((mask > 0) * positions).amax(dim=-1)
    out[torch.arange(mask.shape[0], device=mask.device), last] = scores
    return out


def global_sums(device: str, world: int, *values: float) -> list[float]:
    """Sums of these numbers over ranks, in one all-reduce."""
    if not dist.is_initialized() or world == 1:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device if device == "cuda" else "cpu")
    dist.all_reduce(t)
    return t.tolist()


def save_trainable(folder: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
                   world: int) -> None:  # fmt: skip
    """Sharded model + optimizer state into ``folder`` (a collective: every rank calls it with the same folder),
    plus this rank's scheduler and RNG states as JSON (``extra_rank<R>.json``: plain data, nothing to unpickle)."""
    import json

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    _reshard_all(model)  # the sharded parameters are the ones saved (a push may have left units gathered)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=folder)
    rank = dist.get_rank() if dist.is_initialized() else 0
    extra = {"scheduler": scheduler.state_dict(), "rng": rng.state(), "world": world}
    with open(f"{folder}/extra_rank{rank}.json", "w", encoding="utf-8") as f:
        json.dump(extra, f)
        f.flush()
        os.fsync(f.fileno())


def load_trainable(folder: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
                   world: int) -> None:  # fmt: skip
    """Restore what ``save_trainable`` wrote (same world size for the RNG states; model and optimizer reshard
    freely). Nothing stored in the files runs: DCP's metadata goes through an allowlist unpickler, byte items load
    with ``weights_only=True``, the extra state is JSON (``vlmrl.safe_load``)."""
    import json

    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    _reshard_all(model)  # loaded into the sharded parameters; the push after it gathers them again
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    safe_dcp_load(state, folder)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    rank = dist.get_rank() if dist.is_initialized() else 0
    path = f"{folder}/extra_rank{rank}.json"
    if not os.path.exists(path):
        old = f"{folder}/extra_rank{rank}.pt"
        raise FileNotFoundError(
            f"{old} is a pickle (written by an older vlmrl): not loaded, unpickling a file can run code"
            if os.path.exists(old)
            else f"{path} missing: the checkpoint was written by fewer workers than this run has"
        )
    try:
        with open(path, encoding="utf-8") as f:
            extra = json.load(f)
        sched = extra["scheduler"]
        if not isinstance(sched, dict):
            raise TypeError(f"scheduler state is {type(sched).__name__}")
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a vlmrl worker state ({type(e).__name__}: {e})") from None
    scheduler.load_state_dict(sched)
    if extra.get("world") == world:
        rng.restore(extra["rng"])


def optimizer_state_to(optimizer: torch.optim.Optimizer, device: str) -> None:
    """Move the optimizer's state tensors to ``device`` (verl's optimizer_offload: host memory between steps)."""
    for state in optimizer.state.values():
        for k, v in state.items():
            if isinstance(v, torch.Tensor) and v.device.type != device:
                state[k] = v.to(device, non_blocking=True)


def clip_and_step(
    optimizer: torch.optim.Optimizer, max_norm: float, offload_device: str | None, failure: Callable[[float], str]
) -> float:
    """Clip the gradients of the optimizer's (sharded) parameters to a global norm of ``max_norm``, step and clear
    them; returns the norm before clipping. A non-finite norm (every rank sees the same one, so every rank stops
    together) clears the gradients and raises ``FloatingPointError(failure(norm))`` with the weights unchanged.
    ``offload_device``: the optimizer state lives in host memory and moves there for the step (optimizer_offload)."""
    params = [p for g in optimizer.param_groups for p in g["params"]]  # the sharded ones, as registered
    gn = clip_grad_norm(params, max_norm)
    if not math.isfinite(gn):
        optimizer.zero_grad(set_to_none=True)
        raise FloatingPointError(failure(gn))
    if offload_device is not None:
        optimizer_state_to(optimizer, offload_device)
    optimizer.step()
    if offload_device is not None:
        optimizer_state_to(optimizer, "cpu")
    optimizer.zero_grad(set_to_none=True)
    return gn


def warmup_steps(oc: Any, total_steps: int) -> int:
    """Warm-up steps of an optimizer config (``lr_warmup_steps``, else the ratio of the run's steps)."""
    return oc.lr_warmup_steps if oc.lr_warmup_steps >= 0 else int(oc.lr_warmup_steps_ratio * total_steps)


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
        self.model = load_model(arr.model.path, device, arr.model.trust_remote_code)
        if arr.model.freeze_vision_tower:
            for p in qwen_vl.vision_tower(self.model).parameters():
                p.requires_grad_(False)
        if arr.model.lora_rank > 0:
            from vlmrl.workers.lora import apply_lora

            self.model = apply_lora(self.model, arr.model)
        if arr.model.enable_gradient_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        fc = arr.actor.fsdp_config
        if dist.is_initialized():
            self.model = _fsdp_wrap(
                self.model, device, fc.param_offload, fc.reshard_after_forward, compute_dtype(fc.dtype, device),
                fc.wrap_policy.min_num_params,
            )  # fmt: skip
        self.ref = None
        if arr.actor.use_kl_loss if reference is None else reference:
            ref = load_model(arr.model.path, device, arr.model.trust_remote_code).eval()
            ref.requires_grad_(False)
            if dist.is_initialized():
                rc = arr.ref.fsdp_config
                ref = _fsdp_wrap(ref, device, rc.param_offload, True, compute_dtype(rc.dtype, device),
                                 rc.wrap_policy.min_num_params)  # fmt: skip
            self.ref = ref
        oc = arr.actor.optim
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = adamw(params, lr=oc.lr, betas=tuple(oc.betas), weight_decay=oc.weight_decay)
        warmup = warmup_steps(oc, total_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_lambda(s, warmup, total_steps, oc.warmup_style, oc.min_lr_ratio)
        )
        self.loss_config = LossConfig.from_actor(arr.actor)
        if rollout_correction is not None and rollout_correction.bypass_mode:  # as verl's apply_bypass_mode
            self.loss_config.policy_loss.loss_mode = "bypass_mode"
            self.loss_config.policy_loss.rollout_correction = rollout_correction
        self.algorithm = build_algorithm(algorithm[0], dict(algorithm[1]), self.loss_config)
        self.temperature = max(arr.rollout.temperature, 1e-6)
        self.packed = arr.model.use_remove_padding
        """Padding-free forwards (``models.packing``) for the actor and the reference."""
        # optimizer state in host memory between steps (verl's optimizer_offload). With param_offload FSDP2 keeps
        # it there already (CPUOffloadPolicy); on a CPU device it is host memory anyway.
        self.offload_optimizer = device == "cuda" and fc.optimizer_offload and not fc.param_offload

    # ------------------------------------------------------------------------------------------------ log-probs
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
    def old_and_ref(self, x: ModelInputs, mini_batch_samples: int, need_old: bool = False) -> tuple[
            torch.Tensor | None, torch.Tensor | None]:  # fmt: skip
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
        # one pass of one mini-batch: the old log-probs are the update's own forward, detached. Token-level
        # importance weights (no rejection, no batch normalisation: nothing needs the whole shard; their metrics are
        # token means and extremes, merged exactly) are then computed in each micro-batch from that forward, instead
        # of a separate forward for the old ones
        rc = self.correction
        lazy = (decoupled and ac.ppo_epochs == 1 and n_mini == 1 and rc.rollout_is == "token"
                and rc.rollout_rs is None and not rc.rollout_is_batch_normalize)  # fmt: skip
        with timer("old_ref_logprob"):
            need = decoupled and not lazy
            old, ref = given if given is not None else self.old_and_ref(x, mini_batch_samples, need_old=need)
            if need and old is None:  # (a prepared shard computed none: on-policy)
                old = self.logprobs(x, "actor")
            lazy = lazy and old is None
            if bypass:  # verl's bypass mode: the engine's log-probs are the old ones (no recomputation)
                if x.rollout_logprobs is None:
                    raise RuntimeError("algorithm.rollout_correction.bypass_mode needs the engine's log-probs of the "
                                       "sampled tokens, and this rollout returned none")  # fmt: skip
                old = x.rollout_logprobs[:, : x.response_mask.shape[1]].float()
        weights, corrected = None, {}
        if decoupled and not lazy:
            x, weights, corrected = self._correct(x, old)
        elif lazy and x.rollout_logprobs is None:
            raise RuntimeError("algorithm.rollout_correction needs the engine's log-probs of the sampled tokens, and "
                               "this rollout returned none")  # fmt: skip
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

    def _correct(self, x: ModelInputs, old: torch.Tensor) -> tuple[ModelInputs, torch.Tensor | None, dict]:
        """Rollout correction of this shard: the inputs with the rejected tokens out of the response mask, the
        importance weights and the ``rollout_corr/*`` metrics (``vlmrl.algos.rollout_correction``)."""
        if x.rollout_logprobs is None:
            raise RuntimeError("algorithm.rollout_correction needs the engine's log-probs of the sampled tokens, and "
                               "this rollout returned none")  # fmt: skip
        R = x.response_mask.shape[1]
        mask = x.response_mask.to(old.dtype)

        def global_mean(values: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
            num, den = self._global_sums(float((values * m).sum()), float(m.sum()))
            return torch.tensor(num / max(den, 1e-8), dtype=values.dtype)

        weights, new_mask, metrics = correct(old[:, :R], x.rollout_logprobs[:, :R].to(old.dtype), mask,
                                             self.correction, global_mean)  # fmt: skip
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
        ac = self.actor_cfg
        mini = x.select(rows)
        # the whole mini-batch's token / sequence counts across ranks: accumulation = one big batch (agg_loss
        # divides by them and multiplies by the ranks, whose gradients FSDP averages)
        g_tokens, g_seqs = self._global_sums(float(mini.response_mask.sum()), float(mini.batch_size))
        if g_tokens == 0:  # every token rejected (rollout correction) on every rank: nothing to learn, no step
            metrics.setdefault("actor/empty_mini_batches", []).append(1.0)
            return
        cfg = self.loss_config
        cfg.global_batch_info = dict(dp_size=self.world, batch_num_tokens=g_tokens, global_batch_size=g_seqs,
                                     loss_scale_factor=self.max_response_length)  # fmt: skip
        self.optimizer.zero_grad(set_to_none=True)
        # diagnostics of the whole mini-batch on this rank, whatever its split: sums, then one value each
        tokens = max(float(mini.response_mask.sum()), 1.0)
        sums: dict[str, float] = {}
        extremes: dict[str, float] = {}

        def add(name: str, value: float) -> None:
            sums[name] = sums.get(name, 0.0) + value

        work = dict.fromkeys(("work/update_tokens", "work/update_padding_tokens", "work/update_vision_patches"), 0.0)

        for idx in self.micro_batches(x, rows.tolist(), "update"):
            mb = to_device(x.select(idx), self.device)
            lp, ent, extra = response_logprobs(
                self.model, mb, self.vision_ids, self.temperature, with_entropy=True, packed=self.packed
            )
            real, padding = forward_token_counts(mb, self.model, self.packed)
            work["work/update_tokens"] += real
            work["work/update_padding_tokens"] += padding
            work["work/update_vision_patches"] += vision_patch_count(mb)
            mask = mb.response_mask
            m = mask.to(lp.dtype)
            n_tok = float(mask.sum())
            R = lp.shape[1]
            old_lp = lp.detach() if old is None else old[idx, :R].to(lp.device)
            w = None if weights is None else weights[idx, :R].to(lp.device)
            if lazy_correction:  # the micro-batch's own importance weights: old = this forward, detached
                w, _, corr = correct(old_lp, mb.rollout_logprobs[:, :R].to(lp.device, lp.dtype), m, self.correction)
                for name, value in corr.items():  # extremes over the micro-batches, means weighted by tokens
                    if name.endswith(("_max", "_min")):
                        pick = max if name.endswith("_max") else min
                        extremes[name] = pick(extremes.get(name, value), value)
                    else:
                        add(name, value * n_tok)
            adv = (advantages[idx] if advantages.dim() == 1 else advantages[idx, :R]).to(lp.device)
            if adv.dim() == 1:
                adv = adv.unsqueeze(-1).expand_as(lp)
            data = {
                "responses": mb.responses, "response_mask": mask, "attention_mask": mb.attention_mask,
                "old_log_probs": old_lp, "log_probs": lp, "advantages": adv, "entropy": ent,
                "ref_log_probs": None if ref is None else ref[idx, :R].to(lp.device),
                "rollout_is_weights": w,
                "response_lengths": mask.sum(-1),
                "rewards": None if rewards is None else last_token_scores(rewards[idx].to(lp.device), mask),
            }  # fmt: skip
            self.algorithm.loss_config = cfg
            step = int(self.scheduler.last_epoch) + 1
            out = call_hook(self.algorithm, "compute_loss", step, data)
            loss, loss_metrics = checked_loss(self.algorithm, out, step)
            pg_loss = loss_metrics.pop("pg_loss", float(loss.detach()))
            if mb.rollout_logprobs is not None and self.temperature == 1.0:
                # engine vs trainer log-probs of the same tokens: drifts when a weight push or M-RoPE input is wrong
                gap = (lp.detach() - mb.rollout_logprobs.to(lp.device)).abs()
                add("rollout/logprob_diff", float((gap * m).sum()))
            if ref is not None:
                kl = kl_penalty(lp.detach(), data["ref_log_probs"], ac.kl_loss_type)
                add("actor/kl_loss", float((kl * m).sum()))
            (loss + extra).backward()
            add("actor/pg_loss", float(pg_loss))  # the micro-batch's part of the loss (x ranks)
            for name, value in loss_metrics.items():  # the loss's own diagnostics: per-token means, weighted
                if name != "kl_loss":
                    add(name if "/" in name else f"actor/{name}", float(value) * n_tok)
            add("actor/entropy", float((ent.detach() * m).sum()))
        for name, value in sums.items():
            metrics.setdefault(name, []).append(value if name == "actor/pg_loss" else value / tokens)
        for name, value in extremes.items():
            metrics.setdefault(name, []).append(value)
        for name, value in work.items():  # totals over the update: one entry per mini-batch, summed in update()
            metrics.setdefault(name, []).append(value)
        losses = [v for v in metrics.get("actor/pg_loss", []) if not math.isfinite(v)]
        gn = clip_and_step(
            self.optimizer, ac.grad_clip, self.device if self.offload_optimizer else None,
            lambda gn: f"non-finite gradient norm ({gn}) in the update"
            + (f" (non-finite loss: {losses[0]})" if losses else "")
            + "; the weights were not changed. Usual causes: a learning rate too high for this model, fp16 "
            "overflow, a reward that was inf/NaN upstream",
        )  # fmt: skip
        metrics.setdefault("actor/grad_norm", []).append(gn)

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
