"""The trainer's forward passes over a batch of prompt+response samples (``models.inputs.ModelInputs``).

- :func:`response_logprobs` is what the policy calls: per-token log-probs (and entropy) of the responses.
- Each distinct prompt's image and video features are computed once per micro-batch (one vision-tower pass for all of
  them) and shared by its samples; the prompt
  itself also runs once, its KV cache serving all of its samples (:func:`shared_prompt_logits`), except under
  gradient checkpointing in training mode, where transformers keeps no KV cache and every sample runs its full
  sequence (:func:`full_sequence_logits`). Both give the same values and gradients (tests/test_models.py).
- A micro-batch without images or videos runs the vision tower on a dummy input so every FSDP rank joins the same
  collectives.
- With ``packed`` (verl's ``use_remove_padding=True``), a micro-batch's real tokens run as one row, each distinct
  prompt once and its samples' responses continuing it, with or without gradient checkpointing
  (:func:`packed_logits`, ``models.packing``).
- M-RoPE positions are given to the model, built by ``qwen_vl.rope_index`` as the engine builds them (transformers 5's
  own differ after a video).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from vlmrl.models import packing, qwen_vl
from vlmrl.models.inputs import ModelInputs
from vlmrl.models.qwen_vl import VisionTokenIds


@dataclass
class Vision:
    """The vision inputs of a batch of sequences: features (one row per pad, in order) and the grids that place them
    (one row per item occurrence, row after row)."""

    image_embeds: torch.Tensor | None = None
    image_grid_thw: torch.Tensor | None = None
    video_embeds: torch.Tensor | None = None
    video_grid_thw: torch.Tensor | None = None
    second_per_grid_ts: torch.Tensor | None = None

    def encoder_outputs(self, model: torch.nn.Module) -> dict[str, Any] | None:
        """The features as ``model``'s forward takes them (None without any; DeepStack levels split out)."""
        if self.image_embeds is None and self.video_embeds is None:
            return None
        tiling = family(model).tiles
        if tiling:
            return tiling.encoder_outputs(self.image_embeds, qwen_vl.inner_model(model).config)  # type: ignore[arg-type]
        return qwen_vl.encoder_outputs(self.image_embeds, self.video_embeds, qwen_vl.vision_levels(model))


def family(model: torch.nn.Module) -> qwen_vl.Family:
    """The model's family (``models.families``)."""
    return qwen_vl.family_of(qwen_vl.inner_model(model).config)


def model_positions(model: torch.nn.Module, positions: torch.Tensor) -> torch.Tensor:
    """Positions [3, ...] as the model takes them: M-RoPE's three axes, or one (``Family.mrope`` false: the axes are
    equal)."""
    return positions if family(model).mrope else positions[0]


def image_token_types(model: torch.nn.Module, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """``{"token_type_ids": 1 on image tokens}`` for a family whose image tokens attend both ways
    (``Family.bidirectional_images``: transformers' Gemma 3 builds its masks from them), else ``{}``."""
    if not family(model).bidirectional_images:
        return {}
    image = int(qwen_vl.inner_model(model).config.image_token_id)
    return {"token_type_ids": (input_ids == image).long()}


def image_blocks(input_ids: torch.Tensor, image_token_id: int) -> torch.Tensor:
    """A packed row's image blocks (``packing.Segments.image_blocks``): each run of image tokens numbered from 0, -1
    elsewhere (transformers' ``get_block_sequence_ids_for_mask`` on one row)."""
    is_image = input_ids == image_token_id
    starts = is_image & ~torch.nn.functional.pad(is_image, (1, 0))[:-1]
    return torch.where(is_image, starts.long().cumsum(0) - 1, -1)


def forward_logits(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    vision_ids: VisionTokenIds,
    pixel_values: torch.Tensor | None = None,
    image_grid_thw: torch.Tensor | None = None,
    image_embeds: torch.Tensor | None = None,
    logits_to_keep: int = 0,
    vision: Vision | None = None,
) -> torch.Tensor:
    """Logits of a padded batch of prompt+response sequences with correct M-RoPE positions.

    Pass either ``pixel_values`` (the model encodes the images) or precomputed ``image_embeds`` (one row per image
    pad of the batch, in order: features computed once per prompt and repeated for its n samples), or ``vision``
    (precomputed image and video features with their grids). ``image_grid_thw`` lists one row per image occurrence in
    the batch either way (it drives the positions). ``logits_to_keep`` > 0 computes the head only on the last
    positions (left-padded prompts + right-padded responses put every response in the same trailing columns), which
    saves a [B, T, vocab] tensor. Always called on the root module, so FSDP2's root hooks run.
    """
    if vision is None:
        vision = Vision(image_embeds, image_grid_thw)
    kwargs: dict[str, Any] = {
        "attention_mask": attention_mask,
        "use_cache": False,
        "position_ids": model_positions(model, rope_position_ids(model, input_ids, attention_mask, vision_ids, vision)),
        **image_token_types(model, input_ids),
    }
    if logits_to_keep:
        kwargs["logits_to_keep"] = logits_to_keep
    if pixel_values is not None and vision.image_embeds is None and vision.image_grid_thw is not None:
        kwargs.update(pixel_values=pixel_values, image_grid_thw=vision.image_grid_thw)
    elif (outputs := vision.encoder_outputs(model)) is not None:
        kwargs["mm_encoder_outputs"] = outputs
    return model(input_ids=input_ids, **kwargs).logits


def rope_position_ids(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    vision_ids: VisionTokenIds,
    vision: Vision | torch.Tensor | None,
) -> torch.Tensor:
    """3-D M-RoPE position ids [3, B, T] of a padded batch (``qwen_vl.rope_index``: the engine's positions);
    ``vision`` holds the batch's grids (a bare tensor: image grids only). A family without M-RoPE gets one position
    per real token on all three axes (:func:`model_positions` takes one)."""
    if not isinstance(vision, Vision):
        vision = Vision(image_grid_thw=vision)
    has = any(g is not None and g.numel() > 0 for g in (vision.image_grid_thw, vision.video_grid_thw))
    if not has or not family(model).mrope:
        # text only (or 1-D RoPE): plain positions over the real tokens, the same on all three axes
        pos = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        return pos.unsqueeze(0).expand(3, -1, -1)
    return qwen_vl.rope_index(
        input_ids,
        attention_mask,
        vision_ids,
        qwen_vl.inner_model(model).config,
        vision.image_grid_thw,
        vision.video_grid_thw,
        vision.second_per_grid_ts,
    )


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
    vision: Vision | None = None,
) -> torch.Tensor:
    """Logits [B, R, V] predicting each response token, running every distinct prompt ONCE.

    ``input_ids`` is [B, P+R] (left-padded prompts, right-padded responses); ``prompt_rows`` [U] picks one row per
    distinct prompt and ``sample_prompt`` [B] says which of the U prompts each row belongs to (given, not inferred:
    prompts with equal token ids may carry different images). The prompts run as a batch of U with a KV
    cache; the cache is indexed out to the B samples (gradients flow back through it) and only the R response columns
    run per sample. The n samples of a GRPO group then cost one prompt pass instead of n. ``image_grid_thw`` /
    ``image_embeds`` (or ``vision``, videos included) cover the images of the U prompts in order.
    """
    if vision is None:
        vision = Vision(image_embeds, image_grid_thw)
    P = input_ids.shape[1] - response_len
    rows = prompt_rows.to(input_ids.device)
    p_ids, p_mask = input_ids[rows, :P], attention_mask[rows, :P]
    inv = sample_prompt.to(input_ids.device)
    p_pos, r_pos = shared_prompt_positions(model, input_ids, attention_mask, P, rows, inv, vision_ids, vision)
    p_pos, r_pos = model_positions(model, p_pos), model_positions(model, r_pos)
    kwargs: dict[str, Any] = {"attention_mask": p_mask, "position_ids": p_pos, "use_cache": True, "logits_to_keep": 1}
    kwargs.update(image_token_types(model, p_ids))  # (responses hold no image tokens: their pass is causal)
    if (outputs := vision.encoder_outputs(model)) is not None:
        kwargs["mm_encoder_outputs"] = outputs
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


def shared_prompt_positions(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_len: int,
    rows: torch.Tensor,
    inv: torch.Tensor,
    vision_ids: VisionTokenIds,
    vision: Vision,
) -> tuple[torch.Tensor, torch.Tensor]:
    """M-RoPE positions when each distinct prompt runs once: [3, U, P] of the prompts (row ``rows[u]``'s first
    ``prompt_len`` columns; ``vision`` holds their grids) and [3, B, R] of each sample's response, continuing its
    prompt ``inv[b]`` from its highest position. Refuses a sample whose prompt ids differ from its prompt's."""
    P = prompt_len
    p_ids, p_mask = input_ids[rows, :P], attention_mask[rows, :P]
    if not bool((input_ids[:, :P] == p_ids[inv]).all()):
        raise ValueError("shared-prompt forward: a sample's prompt ids differ from its prompt's")
    p_pos = rope_position_ids(model, p_ids, p_mask, vision_ids, vision)
    last = p_pos.amax(dim=(0, 2))  # [U] highest prompt position; responses continue from it
    offs = (attention_mask[:, P:].long().cumsum(-1) - 1).clamp(min=0)
    return p_pos, (last[inv].unsqueeze(-1) + 1 + offs).unsqueeze(0).expand(3, -1, -1)


def distinct_prompts(mb: ModelInputs) -> tuple[list[int], list[int], list[int]]:
    """A micro-batch's distinct prompts (indices into ``mb.images``, sorted), the row of each one's first sample, and
    each row's place among them."""
    prompt_of = mb.prompt_of.tolist()
    order = sorted(set(prompt_of))
    first_row: dict[int, int] = {}
    for row, p in enumerate(prompt_of):
        first_row.setdefault(p, row)
    place = {p: u for u, p in enumerate(order)}
    return order, [first_row[p] for p in order], [place[p] for p in prompt_of]


def checkpointing_in_training(model: torch.nn.Module) -> bool:
    """True when the model recomputes activations in backward right now (gradient checkpointing on, training mode).

    transformers then drops the KV cache (``use_cache`` is forced off and each checkpointed layer ignores
    ``past_key_values``), so a forward that shares a prompt's KV cache among its samples cannot run."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return bool(model.training and getattr(base, "is_gradient_checkpointing", False))


@dataclass
class _Features:
    """A micro-batch's vision features from its one tower pass: per distinct prompt (images, videos) and per row
    whose response holds tool images."""

    images: dict[int, torch.Tensor]
    videos: dict[int, torch.Tensor]
    tool: dict[int, torch.Tensor]
    dummy: torch.Tensor | None = None
    """Without images or videos: zero rows of the dummy features, the forward's (empty) image features."""


def _vision_features(model: torch.nn.Module, mb: ModelInputs) -> tuple[_Features, torch.Tensor]:
    """Image and video features per distinct prompt of the micro-batch (computed once) and per row whose response
    holds tool images (multi-turn), from ONE vision-tower pass, and the dummy-vision term (exactly 0). Every
    micro-batch runs the tower exactly once (a micro-batch without images or videos on a dummy input), so every FSDP
    rank joins the same collectives whatever its samples hold."""
    device = mb.input_ids.device
    prompts = sorted(set(mb.prompt_of.tolist()))
    with_images = [p for p in prompts if mb.images[p].num_images > 0]
    with_videos = [p for p in prompts if mb.images[p].num_videos > 0]
    tool_rows = [r for r, im in enumerate(mb.sample_images or []) if im.num_images]
    tiling = family(model).tiles
    if not with_images and not with_videos and not tool_rows:
        dummy = dummy_vision_features(model)
        return _Features({}, {}, {}, qwen_vl.dummy_link(dummy)), qwen_vl.dummy_vision_loss_of(dummy)
    if tiling:
        tiled = [mb.images[p].tiled for p in with_images] + [mb.sample_images[r].tiled for r in tool_rows]  # type: ignore[index]
        _gather_root_for_features(model)
        feats = tiling.features(qwen_vl.inner_model(model), tiled, device)  # type: ignore[arg-type]
        split = torch.split(feats, [int(t.rows.sum()) for t in tiled])
    else:
        parts = [(mb.images[p].pixel_values, mb.images[p].image_grid_thw) for p in with_images]
        parts += [(mb.images[p].pixel_values_videos, mb.images[p].video_grid_thw) for p in with_videos]
        parts += [(mb.sample_images[r].pixel_values, mb.sample_images[r].image_grid_thw) for r in tool_rows]  # type: ignore[index]
        pv = torch.cat([pix for pix, _ in parts]).to(device)
        g = torch.cat([grid for _, grid in parts]).to(device)
        feats = qwen_vl.image_embeddings(model, pv, g)
        merge = qwen_vl.vision_tower(model).spatial_merge_size
        split = torch.split(feats, [sum(qwen_vl.tokens_per_image(grid, merge)) for _, grid in parts])
    a, b = len(with_images), len(with_images) + len(with_videos)
    out = _Features(
        dict(zip(with_images, split[:a])), dict(zip(with_videos, split[a:b])), dict(zip(tool_rows, split[b:]))
    )
    return out, torch.zeros((), device=device)


def _gather_root_for_features(model: torch.nn.Module) -> None:
    """Gather the FSDP root's own parameters when the family's features use some (``Family.root_vision_params``):
    the features are computed outside the root's forward, whose hooks would gather them; the root forward that
    follows finds them gathered, and its backward reduces their gradients with the rest of the root's."""
    from torch.distributed.fsdp import FSDPModule

    if family(model).root_vision_params and isinstance(model, FSDPModule):
        model.unshard()


def dummy_vision_features(model: torch.nn.Module) -> torch.Tensor:
    """The vision tower's features of a dummy input (``qwen_vl.dummy_vision_features``; a tiled family's: one blank
    tile)."""
    fam = family(model)
    if not fam.tiles:
        return qwen_vl.dummy_vision_features(model)
    inner = qwen_vl.inner_model(model)
    tower = getattr(inner, fam.vision_modules[0])
    _gather_root_for_features(model)
    return fam.tiles.dummy_features(inner, qwen_vl.device_of(tower), qwen_vl.dtype_of(tower))


def _vision_of(mb: ModelInputs, feats: _Features, occurrences: list[tuple[int, int | None]]) -> Vision:
    """Features and grids for a sequence of (prompt, row) occurrences, in order: each prompt's images and videos, then
    the row's tool images (row None: none)."""
    device = mb.input_ids.device
    img, igrid, vid, vgrid, secs = [], [], [], [], []
    for p, row in occurrences:
        if p in feats.images:
            img.append(feats.images[p])
            igrid.append(mb.images[p].image_grid_thw)
        if row is not None and row in feats.tool:
            img.append(feats.tool[row])
            igrid.append(mb.sample_images[row].image_grid_thw)  # type: ignore[index]
        if p in feats.videos:
            vid.append(feats.videos[p])
            vgrid.append(mb.images[p].video_grid_thw)
            secs.append(mb.images[p].second_per_grid_ts)
    if not img and not vid and feats.dummy is not None:
        return Vision(image_embeds=feats.dummy)  # no pad takes them: only their gradient's path matters
    igrid = [g for g in igrid if g is not None]  # a tiled family's images have no grid
    return Vision(
        torch.cat(img) if img else None,
        torch.cat(igrid).to(device) if igrid else None,
        torch.cat(vid) if vid else None,
        torch.cat(vgrid).to(device) if vgrid else None,
        torch.cat(secs) if secs else None,
    )


def full_sequence_logits(
    model: torch.nn.Module, mb: ModelInputs, vision_ids: VisionTokenIds
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits [b, R, V] predicting each response token, every sample running its whole prompt+response (prompt image
    and video features still computed once per prompt; images inside a response, from tools, follow their prompt's
    in the row's order), and the dummy-vision term."""
    feats, extra = _vision_features(model, mb)
    vision = _vision_of(mb, feats, [(p, row) for row, p in enumerate(mb.prompt_of.tolist())])
    R = mb.responses.shape[1]
    logits = forward_logits(model, mb.input_ids, mb.attention_mask, vision_ids, logits_to_keep=R + 1, vision=vision)
    return logits[:, :-1], extra


def shared_sample_logits(
    model: torch.nn.Module, mb: ModelInputs, vision_ids: VisionTokenIds
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits [b, R, V] predicting each response token, each distinct prompt running once (its KV cache shared by
    its samples: :func:`shared_prompt_logits`), and the dummy-vision term."""
    feats, extra = _vision_features(model, mb)  # no response images here (those take the full sequence)
    order, rows, inv = distinct_prompts(mb)
    logits = shared_prompt_logits(
        model,
        mb.input_ids,
        mb.attention_mask,
        mb.responses.shape[1],
        torch.tensor(rows),
        torch.tensor(inv),
        vision_ids,
        vision=_vision_of(mb, feats, [(p, None) for p in order]),
    )
    return logits, extra


def packed_logits(
    model: torch.nn.Module, mb: ModelInputs, vision_ids: VisionTokenIds
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits [b, R, V] predicting each response token with no padding run (``models.packing``): each distinct prompt
    once, then each sample's response continuing it (``pack_shared``); when some response holds tool images (their
    M-RoPE positions need the whole sequence), every sample's whole sequence (``pack_rows``). Each sequence keeps
    its own M-RoPE positions and features and attends only within itself. Equals the padded forwards
    (tests/test_packing.py), gradient checkpointing included (no KV cache is involved)."""
    if not packing.supports_packing(model):
        raise ValueError(
            "use_remove_padding=True needs the model loaded with vlmrl's varlen attention "
            f"(attn_implementation={packing.VARLEN!r}, as models.trainable.load_model does)"
        )
    feats, extra = _vision_features(model, mb)
    B, R = mb.responses.shape
    P = mb.input_ids.shape[1] - R
    if mb.has_response_images:
        layout = packing.pack_rows(mb.attention_mask, R)
        vision = _vision_of(mb, feats, [(p, row) for row, p in enumerate(mb.prompt_of.tolist())])
        grid = rope_position_ids(model, mb.input_ids, mb.attention_mask, vision_ids, vision)
    else:
        order, rows, inv = distinct_prompts(mb)
        vision = _vision_of(mb, feats, [(p, None) for p in order])
        at = mb.input_ids.device
        p_pos, r_pos = shared_prompt_positions(
            model,
            mb.input_ids,
            mb.attention_mask,
            P,
            torch.tensor(rows, device=at),
            torch.tensor(inv, device=at),
            vision_ids,
            vision,
        )
        layout = packing.pack_shared(mb.attention_mask, R, rows, inv)
        grid = torch.zeros((3, *mb.input_ids.shape), dtype=p_pos.dtype, device=p_pos.device)
        grid[:, rows, :P] = p_pos
        grid[:, :, P:] = r_pos
    positions = grid.flatten(1)[:, layout.tokens.to(grid.device)]
    kwargs: dict[str, Any] = {
        "attention_mask": None,
        "use_cache": False,
        "position_ids": model_positions(model, positions.unsqueeze(1)),
        "logits_to_keep": layout.predict.to(mb.input_ids.device),
        "vlmrl_segments": layout.segments,  # (no cu_seq_lens: another attention would read them without the prefixes)
    }
    if (outputs := vision.encoder_outputs(model)) is not None:
        kwargs["mm_encoder_outputs"] = outputs
    ids = mb.input_ids.flatten()[layout.tokens.to(mb.input_ids.device)].unsqueeze(0)
    layout.segments.positions = positions[0].to(ids.device)
    if family(model).bidirectional_images:
        layout.segments.image_blocks = image_blocks(ids[0], int(qwen_vl.inner_model(model).config.image_token_id))
    logits = model(input_ids=ids, **kwargs).logits[0]
    out = logits.new_zeros(B * R, logits.shape[-1])  # the response padding's columns: zeros, which the mask drops
    out[layout.predicted.to(out.device)] = logits
    return out.view(B, R, -1), extra


def response_logits(
    model: torch.nn.Module, mb: ModelInputs, vision_ids: VisionTokenIds, packed: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's outputs [b, R, ...] at the positions predicting each response token, and the dummy-vision term:
    packed (``packed``), else each distinct prompt running once (:func:`shared_sample_logits`) unless the model is
    checkpointing in training mode or some response holds images (multi-turn tool results: their M-RoPE positions
    need the whole sequence), where every sample runs its whole sequence (:func:`full_sequence_logits`)."""
    if packed:
        return packed_logits(model, mb, vision_ids)
    if checkpointing_in_training(model) or mb.has_response_images:
        return full_sequence_logits(model, mb, vision_ids)
    return shared_sample_logits(model, mb, vision_ids)


def forward_token_counts(mb: ModelInputs, model: torch.nn.Module, packed: bool = False) -> tuple[int, int]:
    """(real, padding) token positions the language model runs for ``mb`` in :func:`response_logits` (distinct
    prompts counted once where the forward runs them once): the forward's work and its waste, for throughput."""
    B, T = mb.input_ids.shape
    real = int(mb.attention_mask.sum())
    full = mb.has_response_images or (not packed and checkpointing_in_training(model))
    if full:
        return real, 0 if packed else B * T - real
    R = mb.responses.shape[1]
    P = T - R
    _, rows, _ = distinct_prompts(mb)
    prompt_real = int(mb.attention_mask[rows, :P].sum())
    response_real = int(mb.attention_mask[:, P:].sum())
    run = prompt_real + response_real
    return run, 0 if packed else len(rows) * P + B * R - run


def vision_patch_count(mb: ModelInputs) -> int:
    """Patches the vision tower encodes for ``mb`` (each distinct prompt's images and videos once, each row's tool
    images): its share of the forward's work."""
    n = 0
    for p in set(mb.prompt_of.tolist()):
        for pix in (mb.images[p].pixel_values, mb.images[p].pixel_values_videos):
            n += 0 if pix is None else int(pix.shape[0])
    for im in mb.sample_images or []:
        n += 0 if im.pixel_values is None else int(im.pixel_values.shape[0])
    return n


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
    packed: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Per-token log-probs [b, R] of the responses (and entropy [b, R] when asked), plus the dummy-vision term (add
    it to the loss: it is exactly 0). The forward is :func:`response_logits`'s (``packed``: padding-free)."""
    logits, extra = response_logits(model, mb, vision_ids, packed)
    lp, ent = logprobs_and_entropy(logits, mb.responses, temperature, with_entropy)
    return lp, ent, extra


def response_logprobs_and_pi2(
    model: torch.nn.Module,
    mb: ModelInputs,
    vision_ids: VisionTokenIds,
    temperature: float = 1.0,
    packed: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs [b, R] and the sum over the vocabulary of the squared token probabilities [b, R] (the
    optimal-token-baseline estimators' ``sum_pi_squared``), from one forward (no gradient needed)."""
    logits, _ = response_logits(model, mb, vision_ids, packed)
    logits = logits.float() / temperature if temperature != 1.0 else logits.float()
    logp_all = torch.log_softmax(logits, dim=-1)
    lp = logp_all.gather(-1, mb.responses.unsqueeze(-1)).squeeze(-1)
    return lp, torch.exp(2 * logp_all).sum(-1)


def response_values(
    model: torch.nn.Module, mb: ModelInputs, vision_ids: VisionTokenIds, packed: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """The critic's values [b, R] in fp32: at each response token, the value of the state before it (the position
    whose logits would predict it, as verl's ``values[:, -R-1:-1]``), plus the dummy-vision term. The same forward as
    :func:`response_logprobs` on a model whose head has one output (``models.value_head``)."""
    out, extra = response_logits(model, mb, vision_ids, packed)
    return out[..., 0].float(), extra


def last_token_scores(
    model: torch.nn.Module, mb: ModelInputs, vision_ids: VisionTokenIds
) -> tuple[torch.Tensor, torch.Tensor]:
    """A reward model's score of each sample [b] in fp32: its one-output head at the sample's last token (the last
    response token; the last prompt token for an empty response), as verl's token-classification reward model and
    TRL's sequence-classification one read it, plus the dummy-vision term (for training). Each distinct prompt runs
    once, its samples' responses continuing its KV cache (:func:`shared_prompt_logits`: the candidates a reward model
    compares share their prompt); with gradient checkpointing in training or images inside a response, each sample
    runs its whole sequence. Prompt image and video features are computed once per prompt."""
    feats, extra = _vision_features(model, mb)
    R = mb.responses.shape[1]
    lengths = mb.attention_mask[:, -R:].sum(-1)  # a response of n tokens ends at kept position n (below)
    if checkpointing_in_training(model) or mb.has_response_images:
        vision = _vision_of(mb, feats, [(p, row) for row, p in enumerate(mb.prompt_of.tolist())])
        # kept positions: the last prompt token, then response tokens 0..R-1
        out = forward_logits(model, mb.input_ids, mb.attention_mask, vision_ids, logits_to_keep=R + 1, vision=vision)
    else:  # one more (masked) response column, so that the output at the last of R response tokens is kept too
        order, rows, inv = distinct_prompts(mb)
        ids = torch.nn.functional.pad(mb.input_ids, (0, 1))
        mask = torch.nn.functional.pad(mb.attention_mask, (0, 1))
        out = shared_prompt_logits(
            model,
            ids,
            mask,
            R + 1,
            torch.tensor(rows),
            torch.tensor(inv),
            vision_ids,
            vision=_vision_of(mb, feats, [(p, None) for p in order]),
        )
    at = torch.arange(out.shape[0], device=out.device)
    return out[at, lengths.to(out.device), 0].float(), extra
