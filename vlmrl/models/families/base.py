"""The fields a model family is described by (:class:`Family`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from vlmrl.models.tiles import Tiling


@dataclass(frozen=True)
class Family:
    """What one model family does differently (see ``models.families``)."""

    name: str
    """Short name (``--family``): ``qwen2_5_vl``, ``qwen3_vl``, ``qwen3_vl_moe``, ``glm4v``."""
    label: str
    """How the README and errors name it."""
    model_types: tuple[str, ...]
    """The checkpoint ``model_type`` values it covers."""
    patch_size: int
    """Pixels per vision patch side; a token is ``merge_size`` x ``merge_size`` patches."""
    vision_tokens: tuple[str, str, str, str] = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")
    """Its tokenizer's image pad, video pad, vision start and vision end tokens (a prompt holds one pad per image
    or video; the processor and the engine expand it)."""
    never_sample: tuple[str, ...] = ()
    """Further special tokens a rollout must never generate (beside the four ``vision_tokens``)."""
    image_processor_classes: tuple[str, ...] = ("Qwen2VLImageProcessor", "Qwen2VLImageProcessorFast")
    """Its image processors' class names (``families.pixel_frames``)."""
    pixel_frames: int = 1
    """Frames the image processor's ``size`` bounds count an image as: its ``shortest_edge`` / ``longest_edge`` are
    ``pixel_frames`` x an image's pixel area (GLM-4.1V's processor bounds t x h x w with an image as t = 2 frames);
    vlmrl's ``data.min_pixels`` / ``max_pixels`` are always one image's area."""
    videos: bool = True
    """vlmrl trains it on videos (else ``rollout.limit_videos`` is refused at the config gate and a record with a
    video by the dataset, each naming the family)."""
    tool_turns: bool = True
    """Multi-turn tool rollouts (their turns are written in Qwen's hermes format; else refused at the gate)."""
    hf_repeat_prompts: bool = False
    """``generate``'s ``num_return_sequences`` repeats a multi-image prompt's image features out of order (transformers
    5.19's GLM-4.1V: ``[A, A, B, B]`` for ``[A, B, A, B]``), so the HF rollout repeats such prompts itself."""
    config_requires: tuple[tuple[str, object], ...] = ()
    """(dotted config key, value) pairs a checkpoint's config must hold for the engine to build the model that
    transformers builds (GLM-4.1V: ``text_config.attention_bias`` true, or vLLM leaves out the q/k/v biases that
    transformers always has, and drops them from every push without a word)."""
    processor_classes: tuple[str, ...] = ()
    """Its processors' class names (the dataset, which has the processor and no model, reads the prompt layout from
    them: ``families.family_of_processor``)."""
    video_timestamps: bool = False
    """Each temporal patch of a video is ``<t seconds>`` text + its own vision start / pads / end, positioned like
    an image (Qwen3-VL); else one run of pads with temporal positions scaled by ``tokens_per_second``."""
    deepstack: bool = False
    """The vision tower's early-block features are added to the decoder's first layers (Qwen3-VL)."""
    moe: bool = False
    """The language model is a mixture of experts."""
    moe_not_implemented: tuple[str, ...] = ()
    """MoE training features vlmrl does not implement (the dry run's plan names them; verl's keys for them are
    refused by ``config.verl.rules``)."""
    mrope: bool = True
    """The decoder's positions are 3-D M-RoPE over the vision grid (``qwen_vl.rope_index``); else one position per
    token, counted over the real tokens (InternVL's Qwen2 decoder)."""
    tiles: Tiling | None = None
    """The image processor cuts each image into tiles of one size (plus a thumbnail or a global view), each tile
    becomes ``seq`` pads, and the prompt's one pad per image becomes the family's layout of them (``models.tiles``:
    InternVL's ``<img>`` + pads + ``</img>``; SmolVLM's grid of row / column tokens; LLaVA-OneVision's base view and
    anyres patches, as many pads as its processor counts); None: Qwen's patch grid, the pad
    expanding to ``image_grid_thw``'s merged tokens inside the template's start and end. The dataset hands a tiled
    family's images to the processor as they are (the processor bounds the tiles)."""
    bidirectional_images: bool = False
    """The decoder attends both ways inside each image's tokens (Gemma 3: an image token sees its whole image, the
    rest is causal); every forward marks the image tokens (``token_type_ids``, as transformers' Gemma 3 takes them),
    and an engine whose attention cannot do it is refused (vLLM's CPU attention)."""
    vision_modules: tuple[str, ...] = ("visual",)
    """The inner model's modules that image features run through outside the language model (FSDP shards each as a
    unit, since features are computed by calling them directly; ``freeze_vision_tower`` freezes them)."""
    text_model: str = "language_model"
    """The inner model's decoder module (SmolVLM's: ``text_model``): its layers are FSDP units and LoRA's targets."""
    root_vision_params: bool = False
    """The image features use parameters of the inner model itself, outside ``vision_modules`` (LLaVA-OneVision's
    ``image_newline``): under FSDP they belong to the root's unit, which is gathered for the feature pass."""
    vision_blocks: str = "visual.blocks"
    """The vision tower's list of blocks under the inner model (FSDP shards each block)."""
    renames: tuple[tuple[str, str], ...] = ()
    """(old, new) parts of parameter names that transformers writes and holds differently from the hub's
    checkpoints, which the engine's loader reads (LLaVA-OneVision: transformers 5.19 drops the SigLIP tower's
    ``vision_model.`` level); checkpoints and pushes carry the hub's names."""
    fused_experts: tuple[str, ...] = ()
    """Name endings of fused expert weights that transformers holds transposed from the checkpoint's layout (and
    vLLM's loader's): Qwen3-VL-MoE's ``experts.gate_up_proj`` [E, 2I, H] and ``experts.down_proj`` [E, H, I] in
    memory are [E, H, 2I] / [E, I, H] on disk; transformers 5.19 transposes them when loading but not when saving."""

    def config_problem(self, config: object) -> str | None:
        """What a model config lacks of ``config_requires`` (None when nothing)."""
        for key, want in self.config_requires:
            value: object = config
            for part in key.split("."):
                value = value.get(part) if isinstance(value, dict) else getattr(value, part, None)
            if value != want:
                return (
                    f"its config has {key}={value!r}; {self.label} checkpoints have {want!r} there (vLLM builds the "
                    "model from it, transformers does not read it: the two would differ)"
                )
        return None

    def checkpoint_name(self, name: str) -> str:
        """A parameter's name as the checkpoint (and the engine's loader) has it: ``renames`` applied (once)."""
        for old, new in self.renames:
            if new not in name:
                name = name.replace(old, new)
        return name

    def checkpoint_tensor(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """A parameter as the checkpoint (and the engine's loader) lays it out: fused experts transposed back, any
        other tensor as it is (a view, no copy)."""
        if self.fused_experts and name.endswith(self.fused_experts):
            return tensor.transpose(-1, -2)
        return tensor

    def video_placeholder(
        self, grid: tuple[int, int, int], sample_fps: float, tokens: dict[str, int], encode: Callable[[str], list[int]]
    ) -> list[int]:
        """The ids one video's single pad becomes (the processor's and the engine's layout): its ``t x h x w`` grid
        (merged) of pads, or per temporal patch ``<t seconds>`` + vision start + ``h x w`` pads + vision end.

        ``grid`` is the video's merged (t, h, w) token grid, ``sample_fps`` the rate its frames were sampled at (the
        metadata vlmrl gives the engine), ``tokens`` holds ``video_pad`` / ``vision_start`` / ``vision_end`` ids and
        ``encode`` tokenizes text."""
        t, h, w = grid
        if not self.video_timestamps:
            return [tokens["video_pad"]] * (t * h * w)
        out: list[int] = []
        for k in range(t):
            out += encode(f"<{video_timestamp(k, sample_fps):.1f} seconds>")
            out += [tokens["vision_start"]] + [tokens["video_pad"]] * (h * w) + [tokens["vision_end"]]
        return out


def video_timestamp(k: int, fps: float) -> float:
    """Qwen3-VL's timestamp of a video's k-th temporal patch: the processor's ``_calculate_timestamps`` for frames
    ``0..n-1`` at ``fps`` (vlmrl's metadata of sampled frames), the mean time of the patch's two frames, in the
    processor's arithmetic (the ``.1f`` text it becomes must match to the digit)."""
    return ((2 * k) / fps + (2 * k + 1) / fps) / 2
