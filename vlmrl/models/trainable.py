"""The model and FSDP2 building blocks every trained model uses (the policy and reference, the critic, the reward
model, the trainers of reward models, judges and warm starts, export): loading a checkpoint, wrapping it in FSDP2,
the optimizer, its learning-rate schedule, clip-and-step, and the trainable state a checkpoint holds."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from vlmrl import rng
from vlmrl.models import packing, qwen_vl
from vlmrl.safe_load import safe_dcp_load

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def compute_dtype(setting: str, device: str) -> torch.dtype:
    """The mixed-precision compute dtype of ``fsdp_config.dtype`` (auto: bfloat16 on GPU, float32 on CPU)."""
    if setting == "auto":
        return torch.bfloat16 if device == "cuda" else torch.float32
    return _DTYPES[setting]


def fsdp_wrap(
    model: torch.nn.Module,
    device: str,
    offload: bool,
    reshard: bool,
    dtype: torch.dtype = torch.float32,
    min_params: int = 0,
    fsdp_size: int = -1,
) -> torch.nn.Module:
    """FSDP2 over the decoder layers, vision blocks (those with at least ``min_params`` parameters), vision tower
    and root, sharded over all workers (``fsdp_size`` -1) or, hybrid (HSDP), within groups of ``fsdp_size`` workers
    that replicate each other (:func:`shard_mesh`). ``dtype`` other than fp32: parameters are
    gathered and computed in it, gradients reduced in fp32, master weights stay fp32 (MixedPrecisionPolicy, on GPU
    and CPU alike). ``offload``: sharded parameters, gradients and optimizer state live in host memory between uses
    (CPUOffloadPolicy; pinned on GPU machines)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    kw: dict[str, Any] = {"reshard_after_forward": reshard, "mesh": shard_mesh(device, fsdp_size)}
    if dtype != torch.float32:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    if offload:
        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=device == "cuda")
    inner = qwen_vl.inner_model(model)
    decoder = getattr(inner, qwen_vl.family_of(inner.config).text_model)
    for layer in [*decoder.layers, *qwen_vl.vision_blocks(model)]:
        if sum(p.numel() for p in layer.parameters()) >= min_params:
            fully_shard(layer, **kw)
    # the tower as a unit too: image features are computed by calling it directly (once per prompt, outside the
    # root forward), so its own hooks must gather patch_embed / merger (InternVL: the tower and the projector)
    for module in qwen_vl.vision_modules(model):
        fully_shard(module, **kw)
    fully_shard(model, **kw)
    _keep_output_recording(model)
    # FSDP2 initialises lazily on the first ROOT forward; image features call the tower directly, so run one tiny
    # text-only forward through the root now (every rank does, so the collectives match)
    with torch.no_grad():
        ids = torch.zeros((1, 2), dtype=torch.long, device=device)
        model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    # with reshard_after_forward=False that forward leaves every unit gathered, its parameters registered as the
    # gathered copies: an optimizer built now would step those (overwritten by the next gather) and never learn
    reshard_all(model)
    return model


def _keep_output_recording(model: torch.nn.Module) -> None:
    """transformers 5.19 looks up which layer outputs a submodel records (``output_hidden_states``) by the submodel's
    class, which ``fully_shard`` replaces with an ``FSDP<Class>`` subclass: the subclass gets its base's entry, or a
    sharded tower returns no hidden states (LLaVA-OneVision's features are a SigLIP layer's hidden states)."""
    from torch.distributed.fsdp import FSDPModule
    from transformers.utils.output_capturing import _CAN_RECORD_REGISTRY

    for m in model.modules():
        cls = type(m)
        if isinstance(m, FSDPModule) and str(cls) not in _CAN_RECORD_REGISTRY:
            base = next((b for b in cls.__mro__[1:] if str(b) in _CAN_RECORD_REGISTRY), None)
            if base is not None:
                _CAN_RECORD_REGISTRY[str(cls)] = _CAN_RECORD_REGISTRY[str(base)]


def shard_mesh(device: str, fsdp_size: int) -> Any:
    """The device mesh FSDP2 shards over: None (its default, every worker of the default process group) for
    ``fsdp_size`` -1 or the whole world; else a 2-D mesh of ``world / fsdp_size`` replicas x ``fsdp_size`` shards
    (verl's ``fsdp_size``: HSDP)."""
    world = dist.get_world_size()
    if fsdp_size in (-1, world):
        return None
    if fsdp_size < 1 or world % fsdp_size:
        raise ValueError(f"fsdp_size={fsdp_size}: -1 or a divisor of the {world} workers")
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device, (world // fsdp_size, fsdp_size), mesh_dim_names=("replicate", "shard"))


def reshard_all(model: torch.nn.Module) -> None:
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


def global_sums(device: str, world: int, *values: float) -> list[float]:
    """Sums of these numbers over ranks, in one all-reduce."""
    if not dist.is_initialized() or world == 1:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device if device == "cuda" else "cpu")
    dist.all_reduce(t)
    return t.tolist()


def save_trainable(
    folder: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, world: int
) -> None:
    """Sharded model + optimizer state into ``folder`` (a collective: every rank calls it with the same folder),
    plus this rank's scheduler and RNG states as JSON (``extra_rank<R>.json``: plain data, nothing to unpickle)."""
    import json

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    reshard_all(model)  # the sharded parameters are the ones saved (a push may have left units gathered)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=folder)
    rank = dist.get_rank() if dist.is_initialized() else 0
    extra = {"scheduler": scheduler.state_dict(), "rng": rng.state(), "world": world}
    with open(f"{folder}/extra_rank{rank}.json", "w", encoding="utf-8") as f:
        json.dump(extra, f)
        f.flush()
        os.fsync(f.fileno())


def load_trainable(
    folder: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, world: int
) -> None:
    """Restore what ``save_trainable`` wrote (same world size for the RNG states; model and optimizer reshard
    freely). Nothing stored in the files runs: DCP's metadata goes through an allowlist unpickler, byte items load
    with ``weights_only=True``, the extra state is JSON (``vlmrl.safe_load``)."""
    import json

    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    reshard_all(model)  # loaded into the sharded parameters; the push after it gathers them again
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


def optimizer_and_schedule(
    model: torch.nn.Module, oc: Any, total_steps: int
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over ``model``'s trainable (sharded) parameters with an optimizer config's lr, betas and weight decay,
    and its learning-rate schedule (warm-up, then constant or cosine) over ``total_steps``."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = adamw(params, lr=oc.lr, betas=tuple(oc.betas), weight_decay=oc.weight_decay)
    warmup = warmup_steps(oc, total_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_lambda(s, warmup, total_steps, oc.warmup_style, oc.min_lr_ratio)
    )
    return optimizer, scheduler


def check_output_folder(output: str | os.PathLike, overwrite: bool = False) -> None:
    """Refuse to write a model into ``output`` when it already holds one (a ``config.json`` or ``*.safetensors``),
    unless ``overwrite`` (``--overwrite``): an output folder that is a base model's, or another run's, would lose its
    weights and config. FileExistsError naming the folder and the flag."""
    folder = Path(output)
    if folder.exists() and not folder.is_dir():
        raise FileExistsError(f"{folder} is a file, not a folder: give a folder for the model (--output)")
    held = [p.name for p in (folder.glob("*.safetensors") if folder.is_dir() else [])][:3]
    held += ["config.json"] if (folder / "config.json").is_file() else []
    if held and not overwrite:
        raise FileExistsError(
            f"{folder} already holds a model ({', '.join(held)}): give another --output, or --overwrite to replace it"
        )
