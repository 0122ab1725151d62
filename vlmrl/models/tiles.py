"""Images of a tiled family (``Family.tiles``: InternVL): the processor cuts each image into tiles of its ``size``
(as many as the image's aspect ratio takes, within ``min_patches`` / ``max_patches``, plus a thumbnail), each tile
becomes ``image_seq_length`` tokens, and the prompt's one pad per image becomes the vision start, the tiles' pads and
the vision end (the processor's and the engine's layout). ``models.qwen_vl`` holds the patch-grid families' side."""

from __future__ import annotations

from typing import Any

import torch


def process(image_processor: Any, images: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """(pixel_values [tiles, 3, H, W], tiles per image [n]) of a prompt's images, as the engine's processor makes
    them."""
    enc = image_processor(images=images, return_tensors="pt")
    return enc["pixel_values"], torch.as_tensor(enc["num_patches"], dtype=torch.long).reshape(-1)


def image_seq_length(processor_or_config: Any) -> int:
    """Tokens per tile (the processor's and the model config's ``image_seq_length``)."""
    return int(processor_or_config.image_seq_length)


def pad_layouts(tiles: torch.Tensor, seq: int, pad: int, start: int, end: int) -> list[list[int]]:
    """The ids each image's single pad becomes: ``start``, ``tiles x seq`` pads, ``end``."""
    return [[start] + [pad] * (int(t) * seq) + [end] for t in tiles.tolist()]


def tokens_per_image(tiles: torch.Tensor, seq: int) -> list[int]:
    """Feature rows (pads) of each image."""
    return [int(t) * seq for t in tiles.tolist()]


def image_tokens(image_processor: Any, seq: int, width: int, height: int) -> int:
    """The ids one image's pad becomes in the prompt (start and end included), from its size alone (the dataset's
    prompt-length count)."""
    return 2 + seq * int(image_processor.get_number_of_image_patches(height, width, {}))


def image_features(inner: Any, pixel_values: torch.Tensor) -> torch.Tensor:
    """The projected features of a batch of tiles, one row per pad ([tiles x seq, hidden]), as the model's own
    forward computes them (its config's feature layer and selection)."""
    cfg = inner.config
    out = inner.get_image_features(
        pixel_values=pixel_values,
        vision_feature_layer=cfg.vision_feature_layer,
        vision_feature_select_strategy=cfg.vision_feature_select_strategy,
    )
    return out.pooler_output.reshape(-1, out.pooler_output.shape[-1])


def dummy_pixels(inner: Any, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """One blank tile of the tower's input size (a micro-batch without images runs the tower on it)."""
    cfg = inner.config.vision_config
    size = cfg.image_size if isinstance(cfg.image_size, (list, tuple)) else (cfg.image_size, cfg.image_size)
    return torch.zeros(1, int(getattr(cfg, "num_channels", 3)), int(size[0]), int(size[1]), device=device, dtype=dtype)


def encoder_outputs(image_embeds: torch.Tensor) -> dict[str, Any]:
    """Precomputed features as the model's forward takes them (``mm_encoder_outputs``: one tensor of rows)."""
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    return {"image": BaseModelOutputWithPooling(pooler_output=image_embeds)}
