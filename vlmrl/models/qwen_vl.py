"""What the Qwen-VL families share (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE), and GLM-4.1V with them (Qwen2-VL's
vision side), in one place; where they differ, the code here reads the model's
:class:`~vlmrl.models.families.Family` (``models.families``).

- special tokens (image/video pads, each family's own) and the ids a rollout must never sample;
- image resizing with qwen-vl-utils' rules and the number of image tokens an image becomes;
- video frame sampling and frame resizing with qwen-vl-utils' ``fetch_video`` rules, the tokens a video becomes and
  its ``second_per_grid_ts``;
- prompt ids with ONE image pad per image and ONE video pad per video (what a rollout engine takes) and their
  expansion to the processor's layout (what the trainer's forward takes);
- M-RoPE positions as Qwen2.5-VL's reference (and vLLM) computes them (``rope_index``: transformers 5 starts the text
  after a video too early), vision features of images and videos from one tower pass and the form the model's forward
  takes them in, and a dummy vision-tower pass for micro-batches without images or videos (the forward passes that
  use them are in ``models.forward``);
- parameter-name mapping between transformers and the rollout engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from PIL import Image

from vlmrl.models.families import (  # noqa: F401  (callers look them up here)
    SUPPORTED_MODEL_TYPES,
    Family,
    family_of,
    pixel_frames,
)

IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
VISION_PAD = "<|vision_pad|>"


# prefixes that wrappers (FSDP1, activation checkpointing, torch.compile, peft) put in front of parameter names
_WRAPPER_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.", "base_model.model.")


NO_TOKEN = -1
"""The id of a vision token a tokenizer does not have (Idefics3's video pad): no token id equals it."""


@dataclass(frozen=True)
class VisionTokenIds:
    """Token ids of a tokenizer's vision special tokens (its family's ``Family.vision_tokens``)."""

    image_pad: int
    video_pad: int
    vision_start: int
    vision_end: int
    extra: tuple[int, ...] = ()
    """Further ids a rollout must never generate (``Family.never_sample``: GLM-4.1V's video start / end)."""

    @property
    def never_sample(self) -> list[int]:
        """Ids a rollout must never generate: a sampled pad breaks the next training forward
        (token/feature count mismatch, EasyR1 #110)."""
        ids = [self.image_pad, self.video_pad, self.vision_start, self.vision_end, *self.extra]
        return list(dict.fromkeys(i for i in ids if i >= 0))


def _token_id(tokenizer: Any, tok: str) -> int | None:
    i = tokenizer.convert_tokens_to_ids(tok)
    return None if i is None or i == getattr(tokenizer, "unk_token_id", None) else int(i)


def vision_token_ids(tokenizer: Any) -> VisionTokenIds:
    """The vision token ids of a tokenizer of a supported family; a clear error when it has no family's. The family
    is the one whose processor the tokenizer's own config names (``processor_class``, which a processor's
    ``save_pretrained`` writes), when it has that family's tokens; else the first family whose vision tokens it has,
    the family whose tokens say the most first."""
    from vlmrl.models.families import FAMILIES

    named = tokenizer_processor_class(tokenizer)
    # without a processor class: SmolVLM's grid tokens before LLaVA-OneVision's lone <image>, which SmolVLM's
    # tokenizer holds too; then a tiled family, as InternVL's tokenizer (Qwen2.5's) holds Qwen's tokens too
    order = sorted(
        FAMILIES.values(),
        key=lambda f: (named not in f.processor_classes, -len({*f.vision_tokens, *f.never_sample}), not f.tiles),
    )
    for fam in order:
        ids = [_token_id(tokenizer, t) for t in fam.vision_tokens]
        if ids[1] is None and not fam.videos:  # a family vlmrl trains without videos may lack the video pad
            ids[1] = NO_TOKEN
        extra = [_token_id(tokenizer, t) for t in fam.never_sample]
        if all(i is not None for i in ids + extra):
            return VisionTokenIds(*ids, extra=tuple(extra))  # type: ignore[arg-type]
    names = "; ".join(f"{f.label}: {' '.join(f.vision_tokens)}" for f in FAMILIES.values())
    raise ValueError(f"the tokenizer has no vision tokens of a supported family ({names})")


def tokenizer_processor_class(tokenizer: Any) -> str | None:
    """The processor class a tokenizer's config names (``tokenizer_config.json``'s ``processor_class``), if any."""
    name = (getattr(tokenizer, "init_kwargs", None) or {}).get("processor_class")
    return name if isinstance(name, str) else None


def check_model_type(config: Any, where: str) -> Family:
    """The family of a checkpoint's config; a checkpoint of no supported family is refused, naming where it came
    from."""
    try:
        family = family_of(config)
    except ValueError as e:
        raise ValueError(f"{where}: {e}. Point actor_rollout_ref.model.path at such a checkpoint.") from None
    problem = family.config_problem(config)
    if problem:
        raise ValueError(f"{where}: {problem}")
    return family


# ------------------------------------------------------------------------------------------------------ images


def patch_factor(image_processor: Any) -> int:
    """Pixels per merged image token along one side (patch_size * merge_size; 28 for Qwen2.5-VL, 32 for
    Qwen3-VL)."""
    return int(getattr(image_processor, "patch_size", 14)) * int(getattr(image_processor, "merge_size", 2))


def pixel_bounds(image_processor: Any, min_pixels: int | None = None, max_pixels: int | None = None) -> tuple[int, int]:
    """min/max pixel area of one image: the given values, else the processor's (its ``size`` divided by the frames
    an image counts as there: ``Family.pixel_frames``)."""
    size = getattr(image_processor, "size", None) or {}
    frames = pixel_frames(image_processor)
    lo = min_pixels or getattr(image_processor, "min_pixels", None) or _per_frame(size.get("shortest_edge"), frames)
    hi = max_pixels or getattr(image_processor, "max_pixels", None) or _per_frame(size.get("longest_edge"), frames)
    if lo is None or hi is None:
        raise ValueError("image processor has no min_pixels/max_pixels; set data.min_pixels and data.max_pixels")
    return int(lo), int(hi)


def _per_frame(bound: int | None, frames: int) -> int | None:
    return None if bound is None else int(bound) // frames


def processor_size(image_processor: Any, min_pixels: int, max_pixels: int) -> dict[str, int]:
    """The processor's ``size`` for one image's area bounds (``Family.pixel_frames`` x the area)."""
    frames = pixel_frames(image_processor)
    return {"shortest_edge": int(min_pixels) * frames, "longest_edge": int(max_pixels) * frames}


def apply_pixel_bounds(image_processor: Any, min_pixels: int, max_pixels: int) -> None:
    """Make the image processor resize with the data's bounds (``data.min_pixels``/``data.max_pixels``), so images the
    dataset already resized pass through unchanged and their token counts match the prompt's."""
    if hasattr(image_processor, "min_pixels"):
        image_processor.min_pixels = int(min_pixels)
    if hasattr(image_processor, "max_pixels"):
        image_processor.max_pixels = int(max_pixels)
    size = dict(getattr(image_processor, "size", None) or {})
    size.update(processor_size(image_processor, min_pixels, max_pixels))
    image_processor.size = size


MAX_ASPECT_RATIO = 200
"""qwen-vl-utils refuses images whose long/short side ratio is above this."""

QWEN25_VL_PIXELS = (3136, 12845056)
"""Qwen2.5-VL's processor's default (min_pixels, max_pixels)."""


def resized_size(width: int, height: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(width, height) an image is resized to by qwen-vl-utils' ``smart_resize``.

    ValueError (saying why) for an image that cannot be resized within these bounds: an aspect ratio above
    ``MAX_ASPECT_RATIO``, or a side that shrinks below one patch (a 2000x10 image under a small max_pixels): the one
    check preprocessing, the dataset and the rollout share, so an image that passes it never fails later."""
    from qwen_vl_utils.vision_process import smart_resize

    if min(width, height) < 1:
        raise ValueError(f"{width}x{height}: an image needs both sides of at least 1 pixel")
    h, w = smart_resize(height, width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)
    if min(h, w) < factor:
        raise ValueError(
            f"{width}x{height} resizes to {w}x{h} under max_pixels={max_pixels}: a side below one {factor}-pixel patch "
            f"(too thin for these bounds; raise max_pixels or crop the image)"
        )
    return int(w), int(h)


def num_image_tokens(width: int, height: int, factor: int, min_pixels: int, max_pixels: int) -> int:
    """How many ``<|image_pad|>`` tokens an image of this size becomes in the prompt."""
    w, h = resized_size(width, height, factor, min_pixels, max_pixels)
    return (w // factor) * (h // factor)


def resize_image(image: Image.Image, factor: int, min_pixels: int, max_pixels: int) -> Image.Image:
    """Convert to RGB and resize with qwen-vl-utils' rules. The result is what both the engine and the trainer see:
    resizing it again with the same bounds is the identity, so the processor leaves it as is."""
    from qwen_vl_utils import fetch_image

    return fetch_image(
        {"image": image, "min_pixels": min_pixels, "max_pixels": max_pixels}, image_patch_size=factor // 2
    )


# ------------------------------------------------------------------------------------------------------ videos

FRAME_FACTOR = 2
"""Frames go in pairs: the vision tower's temporal patch covers two consecutive frames (``temporal_patch_size``), so
a video's frame count is a multiple of it (qwen-vl-utils' FRAME_FACTOR)."""

VIDEO_TOTAL_TOKENS = 128000
"""qwen-vl-utils' MODEL_SEQ_LEN: a video's default pixel budget is 90% of this many tokens' worth of pixels, shared by
its frames."""


@dataclass(frozen=True)
class FrameSampling:
    """How frames are sampled from a decoded video (qwen-vl-utils' ``fetch_video`` keys and defaults)."""

    fps: float = 2.0
    """Frames sampled per second of video."""
    min_frames: int = 4
    """Fewest frames sampled (rounded up to a pair)."""
    max_frames: int = 768
    """Most frames sampled (rounded down to a pair)."""
    nframes: int | None = None
    """Sample exactly this many frames (rounded to a pair) instead of by fps."""


def num_sampled_frames(total_frames: int, video_fps: float, sampling: FrameSampling) -> int:
    """How many frames qwen-vl-utils' ``smart_nframes`` samples from a video of ``total_frames`` at ``video_fps``.

    ValueError (saying why) when the rule gives fewer than two frames or more than the video has."""
    import math

    if total_frames < 1:
        raise ValueError("the video has no frames")
    if sampling.nframes is not None:
        n = round(sampling.nframes / FRAME_FACTOR) * FRAME_FACTOR
    else:
        if not video_fps or video_fps <= 0 or not math.isfinite(video_fps):
            raise ValueError(f"the video's frame rate is {video_fps!r}: frames cannot be sampled by fps")
        lo = math.ceil(sampling.min_frames / FRAME_FACTOR) * FRAME_FACTOR
        hi = math.floor(min(sampling.max_frames, total_frames) / FRAME_FACTOR) * FRAME_FACTOR
        n = min(max(total_frames / video_fps * sampling.fps, lo), hi, total_frames)
        n = math.floor(n / FRAME_FACTOR) * FRAME_FACTOR
    if not FRAME_FACTOR <= n <= total_frames:
        raise ValueError(
            f"{total_frames} frame(s) give {n} sampled frames; a video needs at least {FRAME_FACTOR} (Qwen's temporal "
            f"patch takes frames in pairs)"
        )
    return int(n)


def sample_frame_indices(total_frames: int, video_fps: float, sampling: FrameSampling) -> list[int]:
    """Indices of the frames qwen-vl-utils samples: ``num_sampled_frames`` evenly spaced from the first to the last
    frame (``linspace(0, total - 1, n).round()``)."""
    n = num_sampled_frames(total_frames, video_fps, sampling)
    return torch.linspace(0, total_frames - 1, n).round().long().tolist()


def video_pixel_cap(nframes: int, factor: int, min_pixels: int, max_pixels: int, total_pixels: int | None) -> int:
    """The largest frame area of a video of ``nframes`` frames (qwen-vl-utils' ``fetch_video``): ``max_pixels``, lowered
    to an even share of ``total_pixels`` (None: 90% of ``VIDEO_TOTAL_TOKENS`` tokens) per pair of frames, never below
    1.05 x ``min_pixels`` (nor above ``max_pixels``)."""
    total = total_pixels if total_pixels is not None else VIDEO_TOTAL_TOKENS * factor * factor * 0.9
    cap = max(min(max_pixels, total / max(1, nframes) * FRAME_FACTOR), int(min_pixels * 1.05))
    return int(min(cap, max_pixels))  # never above max_pixels: the processor would resize the frames again


def video_frame_size(
    width: int, height: int, nframes: int, factor: int, min_pixels: int, max_pixels: int, total_pixels: int | None
) -> tuple[int, int]:
    """(width, height) every frame of a video is resized to (``resized_size`` under ``video_pixel_cap``); ValueError
    for frames these bounds cannot resize, as for images."""
    cap = video_pixel_cap(nframes, factor, min_pixels, max_pixels, total_pixels)
    return resized_size(width, height, factor, min_pixels, cap)


def num_video_tokens(
    nframes: int, width: int, height: int, factor: int, min_pixels: int, max_pixels: int, total_pixels: int | None
) -> int:
    """How many ``<|video_pad|>`` tokens a video of ``nframes`` frames of this size becomes (frames padded to a
    pair; one token per merged patch per pair)."""
    w, h = video_frame_size(width, height, nframes, factor, min_pixels, max_pixels, total_pixels)
    pairs = -(-nframes // FRAME_FACTOR)
    return pairs * (w // factor) * (h // factor)


def resize_frames(frames: list[Image.Image], size: tuple[int, int]) -> list[Image.Image]:
    """Frames as 8-bit RGB of ``size`` (bicubic, as qwen-vl-utils resizes), padded to a whole number of pairs by
    repeating the last frame (as qwen-vl-utils and the processor do): exactly what the engine and the trainer see."""
    out = [
        f if f.size == size and f.mode == "RGB" else f.convert("RGB").resize(size, Image.Resampling.BICUBIC)
        for f in frames
    ]
    while len(out) % FRAME_FACTOR:
        out.append(out[-1])
    return out


def second_per_grid_ts(sample_fps: float, temporal_patch_size: int = FRAME_FACTOR) -> float:
    """Seconds one temporal patch of a video spans (the processor's ``second_per_grid_ts``): M-RoPE spaces a video's
    temporal positions by ``tokens_per_second`` x this."""
    return temporal_patch_size / sample_fps


def video_metadata(num_frames: int, sample_fps: float) -> dict[str, Any]:
    """Metadata of already-sampled frames for vLLM and the processor: their sampled fps is ``sample_fps`` (so both
    derive the same ``second_per_grid_ts``) and nothing is sampled again."""
    return {
        "fps": float(sample_fps),
        "total_num_frames": int(num_frames),
        "frames_indices": list(range(num_frames)),
        "duration": num_frames / sample_fps,
        "video_backend": "vlmrl",
        "do_sample_frames": False,
    }


# ------------------------------------------------------------------------------------------------------ tokens


def count_image_pads(ids: list[int], pad_id: int) -> int:
    """Number of image pad tokens in a list of ids."""
    return sum(1 for t in ids if t == pad_id)


def engine_prompt_ids(tokenizer: Any, prompt_text: str, num_images: int, num_videos: int = 0) -> list[int]:
    """Token ids of a rendered chat prompt with ONE image pad per image and ONE video pad per video: what vLLM takes
    (it expands the pads itself; already-expanded ids would be silently expanded again)."""
    ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    vision = vision_token_ids(tokenizer)
    n = count_image_pads(ids, vision.image_pad)
    if n != num_images:
        raise ValueError(f"prompt has {n} image pad tokens for {num_images} images: {prompt_text[:200]!r}")
    v = count_image_pads(ids, vision.video_pad)
    if v != num_videos:
        raise ValueError(f"prompt has {v} video pad tokens for {num_videos} videos: {prompt_text[:200]!r}")
    return list(ids)


def replace_pads(ids: list[int], pad_id: int, layouts: list[list[int]], what: str) -> list[int]:
    """Replace the i-th ``pad_id`` in ``ids`` by ``layouts[i]``; a ValueError when pads and items (``what``: image or
    video) do not pair up."""
    out: list[int] = []
    k = 0
    for t in ids:
        if t == pad_id:
            if k >= len(layouts):
                raise ValueError(f"more {what} pads than {what}s ({len(layouts)})")
            out.extend(layouts[k])
            k += 1
        else:
            out.append(t)
    if k != len(layouts):
        raise ValueError(f"{k} {what} pads for {len(layouts)} {what}s")
    return out


def expand_image_pads(ids: list[int], pad_id: int, tokens_per_image: list[int]) -> list[int]:
    """Replace the i-th single image pad by ``tokens_per_image[i]`` pads (the processor's layout)."""
    return replace_pads(ids, pad_id, [[pad_id] * n for n in tokens_per_image], "image")


def video_layout(tokenizer: Any, family: Family, grid: tuple[int, int, int], sample_fps: float) -> list[int]:
    """The ids one video's single pad becomes (``Family.video_placeholder``) for its merged (t, h, w) token grid and
    the rate its frames were sampled at, with this tokenizer's vision ids and text."""
    vision = vision_token_ids(tokenizer)
    tokens = {"video_pad": vision.video_pad, "vision_start": vision.vision_start, "vision_end": vision.vision_end}
    return family.video_placeholder(
        grid, float(sample_fps), tokens, lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]
    )


def expand_video_pads(
    ids: list[int],
    tokenizer: Any,
    family: Family,
    video_grid_thw: torch.Tensor,
    sample_fps: list[float],
    merge_size: int,
) -> list[int]:
    """Replace the i-th single video pad by its layout (``Family.video_placeholder``: a run of pads, or Qwen3-VL's
    timestamped frames); ``sample_fps[i]`` is the rate its frames were sampled at."""
    grids = [(int(t), int(h) // merge_size, int(w) // merge_size) for t, h, w in video_grid_thw.tolist()]
    layouts = [video_layout(tokenizer, family, g, fps) for g, fps in zip(grids, sample_fps, strict=True)]
    return replace_pads(ids, vision_token_ids(tokenizer).video_pad, layouts, "video")


def tokens_per_image(image_grid_thw: torch.Tensor, merge_size: int) -> list[int]:
    """Image tokens of each image from the processor's ``image_grid_thw``."""
    return [int(t * h * w) // (merge_size**2) for t, h, w in image_grid_thw.tolist()]


# ----------------------------------------------------------------------------------------------------- forward


def mm_token_type_ids(input_ids: torch.Tensor, ids: VisionTokenIds) -> torch.Tensor:
    """1 on image tokens, 2 on video tokens, 0 elsewhere, over prompt AND response (responses never hold pads)."""
    out = torch.zeros_like(input_ids)
    out[input_ids == ids.image_pad] = 1
    out[input_ids == ids.video_pad] = 2
    return out


def inner_model(model: torch.nn.Module) -> torch.nn.Module:
    """The family's inner model (``Qwen2_5_VLModel``, ``Qwen3VLModel``...) inside a ``...ForConditionalGeneration``
    (through a peft wrapper too)."""
    m = model
    for attr in ("base_model", "model"):
        if hasattr(m, "get_base_model"):
            m = m.get_base_model()
        if hasattr(m, "visual") or hasattr(m, "language_model") or hasattr(m, "text_model"):
            return m
        m = getattr(m, attr, m)
    if hasattr(m, "visual"):
        return m
    raise TypeError(f"{type(model).__name__} is not a Qwen-VL model (no vision tower found)")


def vision_tower(model: torch.nn.Module) -> torch.nn.Module:
    """The vision tower module."""
    return inner_model(model).visual


def vision_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules image features run through outside the language model (``Family.vision_modules``: Qwen's
    ``visual``, InternVL's ``vision_tower`` and ``multi_modal_projector``)."""
    inner = inner_model(model)
    return [getattr(inner, name) for name in family_of(inner.config).vision_modules]


def vision_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The vision tower's blocks (``Family.vision_blocks``)."""
    inner = inner_model(model)
    m: Any = inner
    for part in family_of(inner.config).vision_blocks.split("."):
        m = getattr(m, part)
    return list(m)


def image_embeddings(model: torch.nn.Module, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> torch.Tensor:
    """Merged vision features, one row per image (or video) token, for all items in order. Images and videos go
    through the same tower the same way (a video's rows are its ``pixel_values_videos`` and ``video_grid_thw``), so
    one call covers a micro-batch's images and videos together. With DeepStack (Qwen3-VL) each row also carries the
    early blocks' features, concatenated after the main ones (``[N, hidden x (1 + levels)]``, vLLM's layout), so rows
    split, gather and concatenate as one tensor; :func:`encoder_outputs` takes them apart."""
    inner = inner_model(model)
    out = inner.get_image_features(pixel_values=pixel_values, image_grid_thw=image_grid_thw)
    main = torch.cat(list(out.pooler_output), dim=0)  # one tensor per image
    deep = getattr(out, "deepstack_features", None)
    if not deep:
        return main
    return torch.cat([main, *(torch.cat(list(level), dim=0) for level in deep)], dim=-1)


def vision_levels(model: torch.nn.Module) -> int:
    """Feature blocks per vision row: 1, plus one per DeepStack level (Qwen3-VL)."""
    cfg = inner_model(model).config.vision_config
    return 1 + len(getattr(cfg, "deepstack_visual_indexes", None) or ())


def encoder_outputs(
    image_embeds: torch.Tensor | None, video_embeds: torch.Tensor | None = None, levels: int = 1
) -> dict[str, Any]:
    """Precomputed image (and video) features in the form the model's forward takes them (``mm_encoder_outputs``), so
    features computed once per prompt serve all of its samples. ``levels`` > 1: each row holds the main features and
    ``levels - 1`` DeepStack levels side by side (:func:`image_embeddings`)."""
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    def one(x: torch.Tensor) -> BaseModelOutputWithPooling:
        if levels == 1:
            return BaseModelOutputWithPooling(pooler_output=(x,))
        from transformers.models.qwen3_vl.modeling_qwen3_vl import BaseModelOutputWithDeepstackFeatures

        main, *deep = x.chunk(levels, dim=-1)
        return BaseModelOutputWithDeepstackFeatures(pooler_output=(main,), deepstack_features=[(d,) for d in deep])

    out: dict[str, Any] = {}
    if image_embeds is not None:
        out["image"] = one(image_embeds)
    if video_embeds is not None:
        out["video"] = one(video_embeds)
    return out


def _row_positions(
    b: int, kinds: list[int], grids: dict[int, Any], seconds: Any, merge: int, tps: float | None
) -> list[Any]:
    """One row's positions, piece by piece ([3, n] arrays): text runs, then each vision item's (t, h, w) grid
    (``kinds``: 0 text, 1 image pad, 2 video pad, of the row's real tokens; ``grids``: each kind's grid rows)."""
    import numpy as np

    pieces: list[np.ndarray] = []
    nxt, i = 0, 0
    while i < len(kinds):
        kind = kinds[i]
        if kind == 0:
            j = i
            while j < len(kinds) and kinds[j] == 0:
                j += 1
            pieces.append(np.broadcast_to(np.arange(j - i), (3, j - i)) + nxt)
            nxt += j - i
            i = j
            continue
        try:
            t, h, w = next(grids[kind])
        except StopIteration:
            raise ValueError(f"row {b}: more {('image', 'video')[kind - 1]} pads than grid rows") from None
        h, w = h // merge, w // merge
        grid = np.indices((t, h, w)).reshape(3, -1)
        if kind == 2 and tps is not None:
            factor = next(seconds, 1.0) * tps
            grid[0] = (np.arange(t) * factor).astype(np.int64).repeat(h * w)
        if kinds[i : i + t * h * w] != [kind] * (t * h * w):
            raise ValueError(f"row {b}: a vision item of {t * h * w} tokens does not match its pads")
        pieces.append(grid + nxt)
        nxt = int(pieces[-1].max()) + 1
        i += t * h * w
    return pieces


def rope_index(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    vision: VisionTokenIds,
    config: Any,
    image_grid_thw: torch.Tensor | None = None,
    video_grid_thw: torch.Tensor | None = None,
    second_per_grid_ts: torch.Tensor | None = None,
) -> torch.Tensor:
    """3-D M-RoPE position ids [3, B, T] of a padded batch, as the family's reference implementation and vLLM build
    them (padding gets 0).

    Text continues one past the largest position of what precedes it, on all three axes; an image or a video takes a
    (t, h, w) grid starting there, a video's temporal index scaled by ``tokens_per_second x second_per_grid_ts`` and
    truncated (vLLM's arithmetic: the float32 seconds times the tokens per second, in float64). transformers 5's own
    ``get_rope_index`` starts the text after a video at the largest SPATIAL position only: with a temporal extent
    beyond it the trainer's log-probs drift from the engine's (6e-4 on the tiny model), hence this function.
    Qwen3-VL (``Family.video_timestamps``) writes each temporal patch of a video as its own item behind a text
    timestamp: each is positioned like an image (temporal index 0), as its reference and vLLM do.
    ``image_grid_thw`` / ``video_grid_thw`` list each row's items in order, row after row."""
    import numpy as np

    merge = int(config.vision_config.spatial_merge_size)
    tps = getattr(config.vision_config, "tokens_per_second", None)
    if video_grid_thw is not None and family_of(config).video_timestamps:
        video_grid_thw = video_grid_thw.repeat_interleave(video_grid_thw[:, 0], dim=0)
        video_grid_thw[:, 0] = 1
        tps, second_per_grid_ts = None, None
    grids = {
        1: iter((image_grid_thw if image_grid_thw is not None else torch.zeros(0, 3)).tolist()),
        2: iter((video_grid_thw if video_grid_thw is not None else torch.zeros(0, 3)).tolist()),
    }
    seconds = iter(
        [] if second_per_grid_ts is None else torch.as_tensor(second_per_grid_ts, dtype=torch.float32).tolist()
    )
    types = mm_token_type_ids(input_ids, vision).cpu()
    mask = attention_mask.bool().cpu()
    out = torch.zeros(3, *input_ids.shape, dtype=torch.long)
    for b in range(input_ids.shape[0]):
        pieces = _row_positions(b, types[b][mask[b]].tolist(), grids, seconds, merge, tps)
        if pieces:
            out[:, b, mask[b]] = torch.from_numpy(np.concatenate(pieces, axis=1).astype(np.int64))
    return out.to(input_ids.device)


def dummy_vision_features(model: torch.nn.Module) -> torch.Tensor:
    """The vision tower's features of one tiny dummy image (one merged token).

    A micro-batch without images or videos runs the tower on this so every FSDP rank runs the tower's all-gathers and
    reduce-scatters: without it, a text-only rank waits on collectives the others never join (a hang). It covers
    ranks without videos the same way: videos go through the same tower. The features must also reach the model's
    forward as an input (``dummy_link``), as real features do, or the FSDP root's post-backward (its reduce-scatter)
    runs after the tower's backward on that rank and before it on the others: a hang again (seen with two CPU ranks,
    one with a video or an image, one without)."""
    visual = vision_tower(model)
    cfg = visual.config
    patch = int(cfg.patch_size)
    merge = int(cfg.spatial_merge_size)
    tps = int(getattr(cfg, "temporal_patch_size", 2))
    chans = int(getattr(cfg, "in_channels", getattr(cfg, "in_chans", 3)))
    grid = torch.tensor([[1, merge, merge]], device=device_of(visual))
    n_patches = merge * merge
    pixel = torch.zeros(n_patches, chans * tps * patch * patch, device=grid.device, dtype=dtype_of(visual))
    return image_embeddings(model, pixel, grid)


def dummy_vision_loss(model: torch.nn.Module) -> torch.Tensor:
    """``0 * sum(dummy_vision_features)``: added to a micro-batch's loss, it gives every vision parameter a (zero)
    gradient on a rank without images or videos."""
    return dummy_vision_loss_of(dummy_vision_features(model))


def dummy_vision_loss_of(feats: torch.Tensor) -> torch.Tensor:
    """The zero loss term of dummy features."""
    return feats.float().sum() * 0.0


def dummy_link(feats: torch.Tensor) -> torch.Tensor:
    """Zero rows of the dummy features: passed to the model's forward as its (empty) image features, so their
    gradient flows through the forward's inputs as real features' does (no pad token takes them)."""
    return feats[:0]


def device_of(m: torch.nn.Module) -> torch.device:
    """The device of a module's parameters (an FSDP2 shard's local one)."""
    p = next(m.parameters())
    return p.device if not hasattr(p, "to_local") else p.to_local().device


def dtype_of(m: torch.nn.Module) -> torch.dtype:
    """The dtype of a module's parameters."""
    return next(m.parameters()).dtype


# ------------------------------------------------------------------------------------------------------ weights


def engine_weight_name(name: str, family: Family | None = None) -> str:
    """Map a trainer parameter name to the name the rollout engine's loader takes.

    vLLM's Qwen-VL loaders (Qwen2.5-VL's, Qwen3-VL's) accept transformers' checkpoint names in both layouts
    (``model.language_model.*`` / ``model.visual.*`` of transformers >= 4.52 and the older ``model.*`` /
    ``visual.*``), so only wrapper prefixes and peft's LoRA base-layer infix are removed here, and the ``family``'s
    renames applied (``Family.checkpoint_name``; the tensors' layout: ``Family.checkpoint_tensor``).
    """
    for p in _WRAPPER_PREFIXES:
        name = name.replace(p, "")
    name = name.replace(".base_layer.", ".")
    return family.checkpoint_name(name) if family is not None else name


def is_lora_param(name: str) -> bool:
    """True for peft adapter tensors, which the engine never receives (merged weights are pushed instead)."""
    return ".lora_" in name or "lora_embedding" in name


def save_pretrained(model: Any, out: Any, **kwargs: Any) -> None:
    """``model.save_pretrained(out)`` in the checkpoint layout every reader takes: for a family with fused expert
    weights (Qwen3-VL-MoE) transformers 5.19 writes them as it holds them, transposed from the hub's layout, which
    vLLM then loads transposed again (silently, when the expert's two sizes are equal); they are written back in the
    hub's layout here (transformers reads either), and so are the names of a family with ``renames``."""
    from pathlib import Path

    from safetensors.torch import load_file, save_file

    model.save_pretrained(out, **kwargs)
    family = family_of(inner_model(model).config)
    if not family.fused_experts and not family.renames:
        return
    for f in sorted(Path(out).glob("*.safetensors")):
        tensors = load_file(str(f))
        fixed = {family.checkpoint_name(k): family.checkpoint_tensor(k, t).contiguous() for k, t in tensors.items()}
        save_file(fixed, str(f), metadata={"format": "pt"})
    index = Path(out) / "model.safetensors.index.json"
    if family.renames and index.exists():  # a sharded checkpoint's index names the tensors too
        import json

        meta = json.loads(index.read_text())
        meta["weight_map"] = {family.checkpoint_name(k): v for k, v in meta["weight_map"].items()}
        index.write_text(json.dumps(meta, indent=2))
