"""Images of a tiled family (``Family.tiles``): the processor cuts each image into tiles of one size (as many as the
image's aspect ratio takes, plus a thumbnail or a global view), each tile becomes ``seq`` tokens, and the prompt's one
pad per image becomes the family's layout of those tokens (the processor's and the engine's). ``models.qwen_vl``
holds the patch-grid families' side.

Four layouts, one class each: :class:`Tiling` (InternVL: ``<img>`` + tiles x ``seq`` pads + ``</img>``),
:class:`GridTiling` (SmolVLM / Idefics3: each tile of a ``rows x cols`` grid behind ``<fake_token_around_image>``
and its ``<row_r_col_c>`` token, a newline after each row, then the global view behind ``<global-img>``),
:class:`AnyresTiling` (LLaVA-OneVision: a base view and anyres patches, as many pads as the processor counts, nothing
around them), and :class:`GemmaTiling` (Gemma 3: one square image, its newlines merged with the prompt's).
A micro-batch's tiles go through the tower in one pass (every FSDP rank runs the same collectives)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Tiled:
    """A prompt's images as tiles: ``pixel_values`` [tiles, 3, H, W] (every image's tiles in order), ``tiles`` [n]
    per image, ``rows`` [n]: the feature rows (pads) of each image, and ``grid`` [n, 2] per image where the layout
    or the features need it (SmolVLM: rows, cols of tiles; LLaVA-OneVision: the image's height, width), else None."""

    pixel_values: torch.Tensor
    tiles: torch.Tensor
    rows: torch.Tensor
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
        tiles = torch.as_tensor(enc["num_patches"], dtype=torch.long).reshape(-1)
        return Tiled(enc["pixel_values"], tiles, tiles * self.seq(processor))

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

    def join(self, ids: list[int], processor: Any) -> list[int]:
        """A prompt's ids once its pads are replaced by their layouts, as the processor's tokenizer writes the whole
        text (every family but Gemma 3: as they are)."""
        return ids

    def image_tokens(self, processor: Any, width: int, height: int) -> int:
        """The ids one image's pad becomes in the prompt, from its size alone (the dataset's prompt-length count)."""
        return 2 + self.seq(processor) * int(processor.image_processor.get_number_of_image_patches(height, width, {}))

    def features(self, inner: Any, parts: list[Tiled], device: torch.device) -> torch.Tensor:
        """The projected features of several prompts' tiles in ONE pass of the tower, one row per pad, as the model's
        own forward computes them."""
        pixel_values = torch.cat([p.pixel_values for p in parts]).to(device)
        cfg = inner.config
        out = inner.get_image_features(
            pixel_values=pixel_values,
            vision_feature_layer=cfg.vision_feature_layer,
            vision_feature_select_strategy=cfg.vision_feature_select_strategy,
        )
        return out.pooler_output.reshape(-1, out.pooler_output.shape[-1])

    def dummy_features(self, inner: Any, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """The features of one constant tile (a micro-batch without images runs the tower on it): ones, not zeros,
        since Idefics3 drops a tile of zeros as its batches' padding."""
        cfg = inner.config.vision_config
        size = tile_size(inner.config)
        pixels = torch.ones(1, int(getattr(cfg, "num_channels", 3)), size, size, device=device, dtype=dtype)
        one = torch.ones(1, dtype=torch.long)
        return self.features(inner, [Tiled(pixels, one, one)], device)

    def encoder_outputs(self, image_embeds: torch.Tensor, config: Any) -> dict[str, Any]:
        """Precomputed features as the model's forward takes them (``mm_encoder_outputs``: one tensor of rows)."""
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        return {"image": BaseModelOutputWithPooling(pooler_output=image_embeds)}

    def generate_inputs(self, parts: list[Tiled | None]) -> dict[str, Any]:
        """``generate``'s image inputs for a batch of rows (each row's tiles, None without images)."""
        kept = [p.pixel_values for p in parts if p is not None]
        return {"pixel_values": torch.cat(kept)} if kept else {}

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
        return Tiled(pv, tiles, tiles * self.seq(processor), grid)

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

    def features(self, inner: Any, parts: list[Tiled], device: torch.device) -> torch.Tensor:
        # the model's batch of one row of tiles; it drops tiles whose pixels are all exactly 0 (its padding), which
        # a normalised 8-bit image never is (0 lies between two pixel values)
        pixel_values = torch.cat([p.pixel_values for p in parts]).to(device)
        out = inner.get_image_features(pixel_values=pixel_values[None])
        return out.pooler_output.reshape(-1, out.pooler_output.shape[-1])

    def encoder_outputs(self, image_embeds: torch.Tensor, config: Any) -> dict[str, Any]:
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        rows = image_embeds.reshape(-1, self.seq_of_config(config), image_embeds.shape[-1])  # [tiles, seq, hidden]
        return {"image": BaseModelOutputWithPooling(pooler_output=rows)}

    def generate_inputs(self, parts: list[Tiled | None]) -> dict[str, Any]:
        # the processor's batch layout: [rows, most tiles, 3, H, W], zero tiles after a row's own (the model drops
        # them), so generate's repeat of each row for its samples repeats its tiles with it
        kept = [p.pixel_values for p in parts if p is not None]
        if not kept:
            return {}
        width = max(p.shape[0] for p in kept)
        out = kept[0].new_zeros((len(parts), width, *kept[0].shape[1:]))
        for i, p in enumerate(parts):
            if p is not None:
                out[i, : p.pixel_values.shape[0]] = p.pixel_values
        return {"pixel_values": out}

    def plan(self, config: Any) -> str:
        return (
            f"{tile_size(config)}-px tiles of {self.seq_of_config(config)} tokens in a grid of row/column tokens "
            "with a global view, 1-D positions"
        )


class AnyresTiling(Tiling):
    """LLaVA-OneVision's tiles (``LlavaOnevisionImageProcessor``, "anyres"): a base view of the whole image plus the
    image cut into ``size`` patches at the best of ``image_grid_pinpoints`` for its aspect ratio; the patches'
    features are unpadded back to the image's aspect ratio, pooled when over ``vision_aspect_ratio``'s patches, and
    followed by an ``image_newline`` row per feature row. Every image gets its patches, also in a prompt of several
    images: the engine hands a prompt's images to the processor as a flat list, which transformers treats as one
    image per sample (``batch_num_images`` of ones; a nested list would keep only the base view of each), and vlmrl
    trains what the engine samples. Its pads are one token each, nothing around them; the processor counts them
    (``replace_image_token``)."""

    bounded_by = "image_grid_pinpoints and vision_aspect_ratio"

    def process(self, processor: Any, images: list[Any]) -> Tiled:
        from transformers.models.llava_onevision.modeling_llava_onevision import image_size_to_num_patches

        ip = processor.image_processor
        enc = ip(images=list(images), return_tensors="pt")  # flat: each image patched, as the engine's processor does
        sizes = torch.as_tensor(enc["image_sizes"], dtype=torch.long).reshape(-1, 2)
        side = int(enc["pixel_values"].shape[-1])
        tiles = torch.tensor(
            [image_size_to_num_patches(s.tolist(), ip.image_grid_pinpoints, side) for s in sizes], dtype=torch.long
        )
        pv = torch.cat([enc["pixel_values"][i, : int(t)] for i, t in enumerate(tiles)])
        inputs = {"image_sizes": sizes, "pixel_values": enc["pixel_values"], "batch_num_images": [1] * len(images)}
        rows = torch.tensor([self._count(processor, inputs, i) for i in range(len(images))], dtype=torch.long)
        return Tiled(pv, tiles, rows, sizes)

    @staticmethod
    def _count(processor: Any, inputs: dict[str, Any], i: int) -> int:
        return processor.replace_image_token(inputs, i).count(processor.image_token)

    def seq(self, processor: Any) -> int:
        return int(processor.num_image_tokens)

    def seq_of_config(self, config: Any) -> int:
        vc = config.vision_config
        return (int(vc.image_size) // int(vc.patch_size)) ** 2

    def layouts(self, tiled: Tiled, processor: Any, pads: Any) -> list[list[int]]:
        return [[pads.image_pad] * int(n) for n in tiled.rows]

    def image_tokens(self, processor: Any, width: int, height: int) -> int:
        side = int(processor.image_processor.size["height"])
        shape_only = torch.empty(1, 1, 0, side, side)  # the processor reads the patches' size off the pixel values
        inputs = {"image_sizes": [[height, width]], "pixel_values": shape_only, "batch_num_images": [1]}
        return self._count(processor, inputs, 0)

    def features(self, inner: Any, parts: list[Tiled], device: torch.device) -> torch.Tensor:
        cfg = inner.config
        out = inner.get_image_features(
            pixel_values=torch.cat([p.pixel_values for p in parts]).to(device),
            image_sizes=torch.cat([p.grid for p in parts]).to(device),  # type: ignore[misc]
            vision_feature_layer=cfg.vision_feature_layer,
            vision_feature_select_strategy=cfg.vision_feature_select_strategy,
            vision_aspect_ratio=cfg.vision_aspect_ratio,
            batch_num_images=[1] * sum(len(p.tiles) for p in parts),
        )
        rows = out.pooler_output  # each image's packed rows, newlines included (a list in transformers 5.19)
        return torch.cat(list(rows)) if isinstance(rows, (list, tuple)) else rows

    def dummy_features(self, inner: Any, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        # one square image of one tile's size: its base view and the patches its pinpoint takes
        from transformers.models.llava_onevision.modeling_llava_onevision import image_size_to_num_patches

        cfg = inner.config.vision_config
        size = tile_size(inner.config)
        n = image_size_to_num_patches([size, size], inner.config.image_grid_pinpoints, size)
        pixels = torch.ones(n, int(getattr(cfg, "num_channels", 3)), size, size, device=device, dtype=dtype)
        grid = torch.tensor([[size, size]], dtype=torch.long)
        return self.features(inner, [Tiled(pixels, torch.tensor([n]), torch.tensor([0]), grid)], device)

    def encoder_outputs(self, image_embeds: torch.Tensor, config: Any) -> dict[str, Any]:
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        return {"image": BaseModelOutputWithPooling(pooler_output=(image_embeds,))}

    def generate_inputs(self, parts: list[Tiled | None]) -> dict[str, Any]:
        kept = [p for p in parts if p is not None]
        if not kept:
            return {}
        return {
            "pixel_values": torch.cat([p.pixel_values for p in kept]),
            "image_sizes": torch.cat([p.grid for p in kept]),  # type: ignore[misc]
            "batch_num_images": torch.ones(sum(len(p.tiles) for p in kept), dtype=torch.long),
        }

    def plan(self, config: Any) -> str:
        return (
            f"a {tile_size(config)}-px base view and anyres patches of {self.seq_of_config(config)} tokens with "
            "newline rows, 1-D positions"
        )


class GemmaTiling(Tiling):
    """Gemma 3's images (``Gemma3ImageProcessor``, pan-and-scan off): each image resized to one square of the tower's
    ``image_size``, ``mm_tokens_per_image`` tokens after the projector's pooling, written as the processor's
    ``full_image_sequence``: ``\\n\\n<start_of_image>`` + pads + ``<end_of_image>\\n\\n``. Gemma's vocabulary has
    runs of newlines as single tokens, so the processor's text tokenizes the layout's newlines together with the
    prompt's own around it (``\\n`` + ``\\n\\n`` is one ``\\n\\n\\n``): :meth:`join` merges them as the tokenizer
    does (vLLM's Gemma 3 processor merges the same pairs)."""

    bounded_by = "size (one square image; pan-and-scan crops are not trained)"

    def process(self, processor: Any, images: list[Any]) -> Tiled:
        enc = processor.image_processor(images=list(images), return_tensors="pt")
        crops = [int(c) for c in torch.as_tensor(enc.get("num_crops", [0] * len(images))).reshape(-1).tolist()]
        if any(crops):
            raise ValueError(
                "the Gemma 3 image processor made pan-and-scan crops (do_pan_and_scan=True): vlmrl trains one square "
                "image per image; set do_pan_and_scan to false in the checkpoint's preprocessor_config.json"
            )
        n = enc["pixel_values"].shape[0]
        tiles = torch.ones(n, dtype=torch.long)
        return Tiled(enc["pixel_values"], tiles, tiles * self.seq(processor))

    def seq(self, processor: Any) -> int:
        return int(processor.image_seq_length)

    def seq_of_config(self, config: Any) -> int:
        return int(config.mm_tokens_per_image)

    def layout(self, processor: Any) -> list[int]:
        """The ids of one image: the processor's own text for it, tokenized alone."""
        return list(processor.tokenizer(processor.full_image_sequence, add_special_tokens=False)["input_ids"])

    def layouts(self, tiled: Tiled, processor: Any, pads: Any) -> list[list[int]]:
        return [self.layout(processor)] * len(tiled.tiles)

    def join(self, ids: list[int], processor: Any) -> list[int]:
        """Each run of two or more newline tokens (the layout's beside the prompt's) as the tokenizer writes that
        many newlines."""
        tok = processor.tokenizer
        newlines = newline_tokens(tok)
        out: list[int] = []
        run = 0  # newlines in the run of newline tokens at the end of `out`
        count = 0  # tokens in it
        for t in [*ids, -1]:
            k = newlines.get(t, 0)
            if k:
                out.append(t)
                run, count = run + k, count + 1
                continue
            if count > 1:
                del out[-count:]
                out.extend(tok("\n" * run, add_special_tokens=False)["input_ids"])
            run = count = 0
            if t >= 0:
                out.append(t)
        return out

    def image_tokens(self, processor: Any, width: int, height: int) -> int:
        # an upper bound: the layout's outer newlines may merge into the prompt's (one token fewer on each side)
        return len(self.layout(processor))

    def features(self, inner: Any, parts: list[Tiled], device: torch.device) -> torch.Tensor:
        pixel_values = torch.cat([p.pixel_values for p in parts]).to(device)
        out = inner.get_image_features(pixel_values=pixel_values)
        return out.pooler_output.reshape(-1, out.pooler_output.shape[-1])

    def plan(self, config: Any) -> str:
        return (
            f"one {tile_size(config)}-px image of {self.seq_of_config(config)} tokens (no pan-and-scan), attending "
            "both ways inside each image, 1-D positions"
        )


_NEWLINES: dict[tuple[str, int], dict[int, int]] = {}


def newline_tokens(tokenizer: Any) -> dict[int, int]:
    """{token id: newlines} of the tokens that are a run of newlines alone in this tokenizer (Gemma's: 1 to 31)."""
    key = (str(getattr(tokenizer, "name_or_path", "")), len(tokenizer))
    if key not in _NEWLINES:
        found = {}
        for k in range(1, 33):
            ids = tokenizer("\n" * k, add_special_tokens=False)["input_ids"]
            if len(ids) == 1:
                found[int(ids[0])] = k
        _NEWLINES[key] = found
    return _NEWLINES[key]


def tile_size(config: Any) -> int:
    """Pixels a side of a tile (the vision tower's input size)."""
    size = config.vision_config.image_size
    return int(size[0] if isinstance(size, (list, tuple)) else size)


INTERNVL = Tiling()
GRID = GridTiling()
ANYRES = AnyresTiling()
GEMMA = GemmaTiling()
