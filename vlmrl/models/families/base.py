"""The fields a model family is described by (:class:`Family`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Family:
    """What one Qwen-VL model family does differently (see ``models.families``)."""

    name: str
    """Short name (``--family``): ``qwen2_5_vl``, ``qwen3_vl``, ``qwen3_vl_moe``."""
    label: str
    """How the README and errors name it."""
    model_types: tuple[str, ...]
    """The checkpoint ``model_type`` values it covers."""
    patch_size: int
    """Pixels per vision patch side; a token is ``merge_size`` x ``merge_size`` patches."""
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
    fused_experts: tuple[str, ...] = ()
    """Name endings of fused expert weights that transformers holds transposed from the checkpoint's layout (and
    vLLM's loader's): Qwen3-VL-MoE's ``experts.gate_up_proj`` [E, 2I, H] and ``experts.down_proj`` [E, H, I] in
    memory are [E, H, 2I] / [E, I, H] on disk; transformers 5.19 transposes them when loading but not when saving."""

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
