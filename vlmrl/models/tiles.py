"""Images of a tiled family (``Family.tiles``): the processor cuts each image into tiles of one size (as many as the
image's aspect ratio takes, plus a thumbnail or a global view), each tile becomes ``seq`` tokens, and the prompt's one
pad per image becomes the family's layout of those tokens (the processor's and the engine's). ``models.qwen_vl``
holds the patch-grid families' side.

Two layouts, one class each: :class:`Tiling` (InternVL: ``<img>`` + tiles x ``seq`` pads + ``</img>``) and
:class:`GridTiling` (SmolVLM / Idefics3: each tile of a ``rows x cols`` grid behind ``<fake_token_around_image>``
and its ``<row_r_col_c>`` token, a newline after each row, then the global view behind ``<global-img>``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Tiled:
    """A prompt's images as tiles: ``pixel_values`` [tiles, 3, H, W] (every image's tiles in order), ``tiles`` [n]
    per image, and ``grid`` [n, 2] (rows, cols) per image where the layout needs it (else None)."""

    pixel_values: torch.Tensor
    tiles: torch.Tensor
    grid: torch.Tensor | None = None


class Tiling:
    """InternVL's tiles (``GotOcr2ImageProcessor``): up to ``max_patches`` tiles by aspect ratio plus a thumbnail,
    ``image_seq_length`` tokens a tile, each image ``<img>`` + pads + ``</img>``; features from the model's
    ``get_image_features`` with its config's feature layer."""

    bounded_by = "max_patches"
    """The image processor's settings that bound an image's tiles (what a user changes instead of pixel bounds)."""

    def process(self, processor: Any, images: list[Any]) -> Tiled:
        """A prompt's images as the engine's processor tiles them."""
        enc = processor.image_processor(images=images, return_tensors="pt")
        return Tiled(enc["pixel_values"], torch.as_tensor(enc["num_patches"], dtype=torch.long).reshape(-1))

    def seq(self, processor: Any) -> int:
        """Tokens per tile, from the processor."""
        return int(processor.image_seq_length)

    def seq_of_config(self, config: Any) -> int:
        """Tokens per tile, from the model's config."""
        return int(config.image_seq_length)

    def layouts(self, tiled: Tiled, processor: Any, pads: Any) -> list[list[int]]:
        """The ids each image's single pad becomes (``pads``: ``qwen_vl.VisionTokenIds``)."""
        seq = self.seq(processor)
        return [[pads.vision_start] + [pads.image_pad] * (int(t) * seq) + [pads.vision_end] for t in tiled.tiles]

    def image_tokens(self, processor: Any, width: int, height: int) -> int:
        """The ids one image's pad becomes in the prompt, from its size alone (the dataset's prompt-length count)."""
        return 2 + self.seq(processor) * int(processor.image_processor.get_number_of_image_patches(height, width, {}))

    def features(self, inner: Any, pixel_values: torch.Tensor) -> torch.Tensor:
        """The projected features of a batch of tiles, one row per pad ([tiles x seq, hidden]), as the model's own
        forward computes them."""
        cfg = inner.config
        out = inner.get_image_features(
            pixel_values=pixel_values,
            vision_feature_layer=cfg.vision_feature_layer,
            vision_feature_select_strategy=cfg.vision_feature_select_strategy,
        )
        return out.pooler_output.reshape(-1, out.pooler_output.shape[-1])

    def encoder_outputs(self, image_embeds: torch.Tensor, config: Any) -> dict[str, Any]:
        """Precomputed features as the model's forward takes them (``mm_encoder_outputs``: one tensor of rows)."""
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        return {"image": BaseModelOutputWithPooling(pooler_output=image_embeds)}

    def generate_pixels(self, parts: list[torch.Tensor | None]) -> torch.Tensor | None:
        """``generate``'s ``pixel_values`` for a batch of rows (each row's tiles, None without images)."""
        kept = [p for p in parts if p is not None]
        return torch.cat(kept) if kept else None

    def plan(self, config: Any) -> str:
        """The dry run's words for the layout."""
        return f"{tile_size(config)}-px tiles of {self.seq_of_config(config)} tokens, 1-D positions"


class GridTiling(Tiling):
    """SmolVLM's and Idefics3's tiles (``SmolVLMImageProcessor`` / ``Idefics3ImageProcessor``): the image scaled to
    the processor's ``size`` and cut into a ``rows x cols`` grid of ``max_image_size`` tiles plus a global view (one
    tile, ``rows = cols = 0``, for an image that fits one), ``image_seq_len`` tokens a tile (pixel shuffle by the
    config's ``scale_factor``). Each tile sits behind ``<fake_token_around_image><row_r_col_c>``, each row ends with
    a newline, and the global view follows behind ``<fake_token_around_image><global-img>`` (the processor's own
    ``replace_image_token``: the layout is text, so it is tokenized as the processor tokenizes it)."""

    bounded_by = "size's longest_edge and max_image_size"

    def process(self, processor: Any, images: list[Any]) -> Tiled:
        enc = processor.image_processor(images=[images], return_tensors="pt", return_row_col_info=True)
        pv, mask = enc["pixel_values"][0], enc.get("pixel_attention_mask")
        if mask is not None and not bool(mask.all()):
            raise ValueError(
                "the SmolVLM image processor padded a tile (pixel_attention_mask not all ones): vlmrl passes whole "
                "tiles only; keep do_image_splitting and max_image_size as the checkpoint's processor has them"
            )
        grid = torch.tensor([[r, c] for r, c in zip(enc["rows"][0], enc["cols"][0])], dtype=torch.long)
        tiles = torch.where(grid[:, 0] * grid[:, 1] > 0, grid[:, 0] * grid[:, 1] + 1, 1)
        if int(tiles.sum()) != pv.shape[0]:
            raise ValueError(f"the image processor made {pv.shape[0]} tiles for grids {grid.tolist()}")
        return Tiled(pv, tiles, grid)

    def seq(self, processor: Any) -> int:
        return int(processor.image_seq_len)

    def seq_of_config(self, config: Any) -> int:
        vc = config.vision_config
        return int((int(vc.image_size) // int(vc.patch_size)) ** 2 // int(config.scale_factor) ** 2)

    def layout(self, processor: Any, rows: int, cols: int) -> list[int]:
        """The ids of one image of a ``rows x cols`` grid (0 x 0: a single tile): the processor's own text for it
        (``replace_image_token``), tokenized."""
        text = processor.replace_image_token({"rows": [[rows]], "cols": [[cols]]}, 0)
        return list(processor.tokenizer(text, add_special_tokens=False)["input_ids"])

    def layouts(self, tiled: Tiled, processor: Any, pads: Any) -> list[list[int]]:
        assert tiled.grid is not None
        return [self.layout(processor, int(r), int(c)) for r, c in tiled.grid.tolist()]

    def image_tokens(self, processor: Any, width: int, height: int) -> int:
        _, rows, cols = processor.image_processor.get_number_of_image_patches(height, width, {})
        return len(self.layout(processor, int(rows), int(cols)))

    def features(self, inner: Any, pixel_values: torch.Tensor) -> torch.Tensor:
        # the model's batch of one row of tiles; it drops tiles whose pixels are all exactly 0 (its padding), which
        # a normalised 8-bit image never is (0 lies between two pixel values)
        out = inner.get_image_features(pixel_values=pixel_values[None])
        return out.pooler_output.reshape(-1, out.pooler_output.shape[-1])

    def encoder_outputs(self, image_embeds: torch.Tensor, config: Any) -> dict[str, Any]:
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        rows = image_embeds.reshape(-1, self.seq_of_config(config), image_embeds.shape[-1])  # [tiles, seq, hidden]
        return {"image": BaseModelOutputWithPooling(pooler_output=rows)}

    def generate_pixels(self, parts: list[torch.Tensor | None]) -> torch.Tensor | None:
        # the processor's batch layout: [rows, most tiles, 3, H, W], zero tiles after a row's own (the model drops
        # them), so generate's repeat of each row for its samples repeats its tiles with it
        kept = [p for p in parts if p is not None]
        if not kept:
            return None
        width = max(p.shape[0] for p in kept)
        out = kept[0].new_zeros((len(parts), width, *kept[0].shape[1:]))
        for i, p in enumerate(parts):
            if p is not None:
                out[i, : p.shape[0]] = p
        return out

    def plan(self, config: Any) -> str:
        return (
            f"{tile_size(config)}-px tiles of {self.seq_of_config(config)} tokens in a grid of row/column tokens "
            "with a global view, 1-D positions"
        )


def tile_size(config: Any) -> int:
    """Pixels a side of a tile (the vision tower's input size)."""
    size = config.vision_config.image_size
    return int(size[0] if isinstance(size, (list, tuple)) else size)


def tokens_per_image(tiles: torch.Tensor, seq: int) -> list[int]:
    """Feature rows (pads) of each image."""
    return [int(t) * seq for t in tiles.tolist()]


def dummy_pixels(inner: Any, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """One constant tile of the tower's input size (a micro-batch without images runs the tower on it): ones, not
    zeros, since Idefics3 drops a tile of zeros as its batches' padding."""
    cfg = inner.config.vision_config
    size = tile_size(inner.config)
    return torch.ones(1, int(getattr(cfg, "num_channels", 3)), size, size, device=device, dtype=dtype)


INTERNVL = Tiling()
GRID = GridTiling()
