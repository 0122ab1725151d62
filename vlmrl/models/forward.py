"""The trainer's forward passes over a batch of prompt+response samples (``models.inputs.ModelInputs``).

- :func:`response_logprobs` is what the policy calls: per-token log-probs (and entropy) of the responses.
- Each distinct prompt's image features are computed once per micro-batch and shared by its samples; the prompt
  itself also runs once, its KV cache serving all of its samples (:func:`shared_prompt_logits`), except under
  gradient checkpointing in training mode, where transformers keeps no KV cache and every sample runs its full
  sequence (:func:`full_sequence_logits`). Both give the same values and gradients (tests/test_models.py).
- A micro-batch without images runs the vision tower on a dummy input so every FSDP rank joins the same collectives.
- M-RoPE positions come from the model itself (``mm_token_type_ids``, transformers 5).
"""

from __future__ import annotations

from typing import Any

import torch

from vlmrl.models import qwen_vl
from vlmrl.models.inputs import ModelInputs
from vlmrl.models.qwen_vl import VisionTokenIds


def forward_logits(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    vision_ids: VisionTokenIds,
    pixel_values: torch.Tensor | None = None,
    image_grid_thw: torch.Tensor | None = None,
    image_embeds: torch.Tensor | None = None,
    logits_to_keep: int = 0,
) -> torch.Tensor:
    """Logits of a padded batch of prompt+response sequences with correct M-RoPE positions.

    Pass either ``pixel_values`` (the model encodes the images) or precomputed ``image_embeds`` (one row per image
    pad of the batch, in order: features computed once per prompt and repeated for its n samples).
    ``image_grid_thw`` lists one row per image occurrence in the batch either way (it drives the positions).
    ``logits_to_keep`` > 0 computes the head only on the last positions (left-padded prompts + right-padded responses
    put every response in the same trailing columns), which saves a [B, T, vocab] tensor.
    Always called on the root module, so FSDP2's root hooks run.
    """
    kwargs: dict[str, Any] = {
        "attention_mask": attention_mask,
        "use_cache": False,
        "mm_token_type_ids": qwen_vl.mm_token_type_ids(input_ids, vision_ids),
    }
    if logits_to_keep:
        kwargs["logits_to_keep"] = logits_to_keep
    if image_grid_thw is not None and image_grid_thw.numel() > 0:
        kwargs["image_grid_thw"] = image_grid_thw
        if image_embeds is None:
            kwargs["pixel_values"] = pixel_values
        else:
            kwargs["mm_encoder_outputs"] = qwen_vl.encoder_outputs(image_embeds)
    return model(input_ids=input_ids, **kwargs).logits


def rope_position_ids(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    vision_ids: VisionTokenIds,
    image_grid_thw: torch.Tensor | None,
) -> torch.Tensor:
    """3-D M-RoPE position ids [3, B, T] of a padded batch, from the model's own ``get_rope_index``."""
    if image_grid_thw is None or image_grid_thw.numel() == 0:
        # text only: plain positions over the real tokens, the same on all three axes
        pos = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        return pos.unsqueeze(0).expand(3, -1, -1)
    return qwen_vl.inner_model(model).get_rope_index(
        input_ids,
        image_grid_thw=image_grid_thw,
        attention_mask=attention_mask,
        mm_token_type_ids=qwen_vl.mm_token_type_ids(input_ids, vision_ids),
    )[0]


def shared_prompt_logits(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_len: int,
    prompt_rows: torch.Tensor,
    sample_prompt: torch.Tensor,
    vision_ids: VisionTokenIds,
    image_grid_thw: torch.Tensor | None = None,
    image_embeds: torch.Tensor | None = None,
) -> torch.Tensor:
    """Logits [B, R, V] predicting each response token, running every distinct prompt ONCE.

    ``input_ids`` is [B, P+R] (left-padded prompts, right-padded responses); ``prompt_rows`` [U] picks one row per
    distinct prompt and ``sample_prompt`` [B] says which of the U prompts each row belongs to (given, not inferred:
    prompts with equal token ids may carry different images). The prompts run as a batch of U with a KV
    cache; the cache is indexed out to the B samples (gradients flow back through it) and only the R response columns
    run per sample. The n samples of a GRPO group then cost one prompt pass instead of n. ``image_grid_thw`` /
    ``image_embeds`` cover the images of the U prompts in order.
    """
    P = input_ids.shape[1] - response_len
    rows = prompt_rows.to(input_ids.device)
    p_ids, p_mask = input_ids[rows, :P], attention_mask[rows, :P]
    inv = sample_prompt.to(input_ids.device)
    if not bool((input_ids[:, :P] == p_ids[inv]).all()):
        raise ValueError("shared-prompt forward: a sample's prompt ids differ from its prompt's")
    p_pos = rope_position_ids(model, p_ids, p_mask, vision_ids, image_grid_thw)
    last = p_pos.amax(dim=(0, 2))  # [U] highest prompt position; responses continue from it
    offs = (attention_mask[:, P:].long().cumsum(-1) - 1).clamp(min=0)
    r_pos = (last[inv].unsqueeze(-1) + 1 + offs).unsqueeze(0).expand(3, -1, -1)
    kwargs: dict[str, Any] = {"attention_mask": p_mask, "position_ids": p_pos, "use_cache": True, "logits_to_keep": 1}
    if image_grid_thw is not None and image_grid_thw.numel() > 0:
        kwargs["image_grid_thw"] = image_grid_thw
        kwargs["mm_encoder_outputs"] = qwen_vl.encoder_outputs(image_embeds)
    out = model(input_ids=p_ids, **kwargs)
    first = out.logits[:, -1][inv]  # predicts each sample's first response token
    cache = out.past_key_values
    cache.batch_select_indices(inv)
    resp = model(
        input_ids=input_ids[:, P:],
        attention_mask=attention_mask,
        position_ids=r_pos,
        past_key_values=cache,
        use_cache=True,
    ).logits
    return torch.cat([first.unsqueeze(1), resp[:, :-1]], dim=1)


def checkpointing_in_training(model: torch.nn.Module) -> bool:
    """True when the model recomputes activations in backward right now (gradient checkpointing on, training mode).

    transformers then drops the KV cache (``use_cache`` is forced off and each checkpointed layer ignores
    ``past_key_values``), so a forward that shares a prompt's KV cache among its samples cannot run."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return bool(model.training and getattr(base, "is_gradient_checkpointing", False))


def _vision_features(
    model: torch.nn.Module, mb: ModelInputs
) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor], torch.Tensor]:
    """Image features per distinct prompt of the micro-batch (computed once) and per row whose response holds tool
    images (multi-turn), from ONE vision-tower pass, and the dummy-vision term (exactly 0). Every micro-batch runs
    the tower exactly once (a micro-batch without images on a dummy input), so every FSDP rank joins the same
    collectives whatever its samples hold."""
    device = mb.input_ids.device
    with_images = [p for p in sorted(set(mb.prompt_of.tolist())) if mb.images[p].num_images > 0]
    tool_rows = [r for r, im in enumerate(mb.sample_images or []) if im.num_images]
    parts = [mb.images[p] for p in with_images] + [mb.sample_images[r] for r in tool_rows]  # type: ignore[index]
    if not parts:
        return {}, {}, qwen_vl.dummy_vision_loss(model)
    pv = torch.cat([i.pixel_values for i in parts]).to(device)
    g = torch.cat([i.image_grid_thw for i in parts]).to(device)
    feats = qwen_vl.image_embeddings(model, pv, g)
    merge = qwen_vl.vision_tower(model).spatial_merge_size
    split = torch.split(feats, [sum(qwen_vl.tokens_per_image(i.image_grid_thw, merge)) for i in parts])
    k = len(with_images)
    return dict(zip(with_images, split[:k])), dict(zip(tool_rows, split[k:])), torch.zeros((), device=device)


def _images_of(
    mb: ModelInputs, feats: dict[int, torch.Tensor], prompts: list[int]
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Features and grid rows for the given prompt sequence (one entry per occurrence)."""
    used = [p for p in prompts if p in feats]
    if not used:
        return None, None
    grid = torch.cat([mb.images[p].image_grid_thw for p in used]).to(mb.input_ids.device)
    return torch.cat([feats[p] for p in used]), grid


def full_sequence_logits(
    model: torch.nn.Module, mb: ModelInputs, vision_ids: VisionTokenIds
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits [b, R, V] predicting each response token, every sample running its whole prompt+response (prompt image
    features still computed once per prompt; images inside a response, from tools, follow their prompt's in the
    row's order), and the dummy-vision term."""
    feats, tool, extra = _vision_features(model, mb)
    embeds, grids = [], []
    for row, p in enumerate(mb.prompt_of.tolist()):
        if p in feats:
            embeds.append(feats[p])
            grids.append(mb.images[p].image_grid_thw)
        if row in tool:
            embeds.append(tool[row])
            grids.append(mb.sample_images[row].image_grid_thw)  # type: ignore[index]
    R = mb.responses.shape[1]
    logits = forward_logits(
        model, mb.input_ids, mb.attention_mask, vision_ids,
        image_grid_thw=torch.cat(grids).to(mb.input_ids.device) if grids else None,
        image_embeds=torch.cat(embeds) if embeds else None, logits_to_keep=R + 1,
    )  # fmt: skip
    return logits[:, :-1], extra


def shared_sample_logits(
    model: torch.nn.Module, mb: ModelInputs, vision_ids: VisionTokenIds
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits [b, R, V] predicting each response token, each distinct prompt running once (its KV cache shared by
    its samples: :func:`shared_prompt_logits`), and the dummy-vision term."""
    feats, _, extra = _vision_features(model, mb)  # no response images here (those take the full sequence)
    order = sorted(set(mb.prompt_of.tolist()))
    first_row: dict[int, int] = {}
    for row, p in enumerate(mb.prompt_of.tolist()):
        first_row.setdefault(p, row)
    embeds, grid = _images_of(mb, feats, order)
    logits = shared_prompt_logits(
        model,
        mb.input_ids,
        mb.attention_mask,
        mb.responses.shape[1],
        torch.tensor([first_row[p] for p in order]),
        torch.tensor([order.index(p) for p in mb.prompt_of.tolist()]),
        vision_ids,
        image_grid_thw=grid,
        image_embeds=embeds,
    )
    return logits, extra


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log p(target) per position, computed in fp32 (``logits[:, t]`` predicts ``targets[:, t]``)."""
    return logprobs_and_entropy(logits, targets, temperature)[0]


def logprobs_and_entropy(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-position log p(target) in fp32 and, when asked, the entropy of the (temperature-scaled) distribution."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    lp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    ent = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else None
    return lp, ent


def response_logprobs(
    model: torch.nn.Module,
    mb: ModelInputs,
    vision_ids: VisionTokenIds,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Per-token log-probs [b, R] of the responses (and entropy [b, R] when asked), plus the dummy-vision term (add
    it to the loss: it is exactly 0). Shares each prompt's forward among its samples unless the model is
    checkpointing in training mode or some response holds images (multi-turn tool results: their M-RoPE positions
    need the whole sequence)."""
    full = checkpointing_in_training(model) or mb.has_response_images
    forward = full_sequence_logits if full else shared_sample_logits
    logits, extra = forward(model, mb, vision_ids)
    lp, ent = logprobs_and_entropy(logits, mb.responses, temperature, with_entropy)
    return lp, ent, extra
