"""Model inputs for the policy's forward passes, built from prompts and a rollout batch.

Layout (verl's): prompts left-padded to P columns, responses right-padded to R columns, so every response occupies the
same trailing columns and the head runs only there (``logits_to_keep``). Image pixels and video frames are processed
once per prompt; their features are computed once per prompt in each micro-batch and shared by the prompt's samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from vlmrl.batch import PromptSample, RolloutBatch, Video
from vlmrl.models import qwen_vl, tiles
from vlmrl.models.families import family_of_processor


@dataclass
class PromptImages:
    """Processor output for one prompt's images and videos (empty for text-only prompts)."""

    pixel_values: torch.Tensor | None
    image_grid_thw: torch.Tensor | None
    pixel_values_videos: torch.Tensor | None = None
    """The videos' frame patches (the video processor's output)."""
    video_grid_thw: torch.Tensor | None = None
    """(t, h, w) patch grid of each video."""
    second_per_grid_ts: torch.Tensor | None = None
    """Seconds per temporal patch of each video (float32, as the processor gives it)."""
    video_fps: list[float] | None = None
    """The rate each video's frames were sampled at (Qwen3-VL writes timestamps from it)."""
    tiled: tiles.Tiled | None = None
    """The images as a tiled family's processor tiles them (``Family.tiles``: tiles, feature rows and what the
    layout needs per image); ``image_grid_thw`` is then None and ``pixel_values`` is the tiles' tensor."""

    @property
    def num_images(self) -> int:
        """Images of the prompt."""
        if self.tiled is not None:
            return int(self.tiled.tiles.shape[0])
        return 0 if self.image_grid_thw is None else int(self.image_grid_thw.shape[0])

    @property
    def num_videos(self) -> int:
        """Videos of the prompt."""
        return 0 if self.video_grid_thw is None else int(self.video_grid_thw.shape[0])


@dataclass
class ModelInputs:
    """A batch of samples as tensors."""

    input_ids: torch.Tensor
    """[B, P+R] left-padded prompt + right-padded response."""
    attention_mask: torch.Tensor
    """[B, P+R]."""
    responses: torch.Tensor
    """[B, R] response ids (pad after the end)."""
    response_mask: torch.Tensor
    """[B, R] 1 on response tokens."""
    prompt_of: torch.Tensor
    """[B] index into ``images`` of each sample's prompt."""
    images: list[PromptImages]
    """Per prompt: processed pixels."""
    rollout_logprobs: torch.Tensor | None = None
    """[B, R] log-probs the rollout engine reported for the sampled tokens (a drift diagnostic)."""
    sample_images: list[PromptImages] | None = None
    """Per sample (multi-turn): the images tools returned inside its response, after its prompt's images."""

    @property
    def has_response_images(self) -> bool:
        """True when some sample's response holds images (tool results): positions then need the full sequence."""
        return self.sample_images is not None and any(im.num_images for im in self.sample_images)

    @property
    def batch_size(self) -> int:
        """Samples."""
        return int(self.input_ids.shape[0])

    def select(self, rows: torch.Tensor | list[int]) -> ModelInputs:
        """A sub-batch (a micro-batch or a rank's shard); trims padding columns no row uses."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        ids, attn = self.input_ids[rows], self.attention_mask[rows]
        resp, rmask = self.responses[rows], self.response_mask[rows]
        plen = self.input_ids.shape[1] - self.responses.shape[1]
        used_p = attn[:, :plen].sum(0).nonzero()
        p0 = int(used_p[0]) if len(used_p) else plen
        used_r = attn[:, plen:].sum(0).nonzero()
        r1 = int(used_r[-1]) + 1 if len(used_r) else 1
        keep = torch.cat([torch.arange(p0, plen), torch.arange(plen, plen + r1)])
        rlp = None if self.rollout_logprobs is None else self.rollout_logprobs[rows][:, :r1]
        extra = None if self.sample_images is None else [self.sample_images[int(r)] for r in rows]
        return ModelInputs(
            ids[:, keep], attn[:, keep], resp[:, :r1], rmask[:, :r1], self.prompt_of[rows], self.images, rlp, extra
        )


def process_videos(processor: Any, videos: list[Video]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pixel_values_videos, video_grid_thw, second_per_grid_ts) of videos whose frames are already sampled and
    resized (the video processor only patchifies: nothing is sampled or resized again), as the engine's processor
    makes them."""
    vp = processor.video_processor
    enc = vp(videos=[v.frames for v in videos], return_tensors="pt", **VIDEO_AS_GIVEN)
    tps = int(getattr(vp, "temporal_patch_size", qwen_vl.FRAME_FACTOR))
    seconds = torch.tensor([qwen_vl.second_per_grid_ts(v.sample_fps, tps) for v in videos], dtype=torch.float32)
    return enc["pixel_values_videos"], enc["video_grid_thw"], seconds


VIDEO_AS_GIVEN: dict[str, Any] = {"do_sample_frames": False, "do_resize": False, "cap_pixels_per_frame": False}
"""Video processor arguments for frames vlmrl sampled and resized itself (the dataset's video rules): the trainer's
processor and the engine's take them as they are (Qwen3-VL's video processor bounds a whole video's pixels, so
resizing again would shrink frames the rules sized one by one)."""


def process_images(processor: Any, prompts: list[PromptSample]) -> list[PromptImages]:
    """Run the image and video processors once per prompt (images and frames are already resized, so they only
    patchify)."""
    tiling = family_of_processor(processor).tiles
    out = []
    for p in prompts:
        item = PromptImages(None, None)
        if p.images and tiling:
            item.tiled = tiling.process(processor, p.images)
            item.pixel_values = item.tiled.pixel_values
        elif p.images:
            enc = processor.image_processor(images=p.images, return_tensors="pt")
            item.pixel_values, item.image_grid_thw = enc["pixel_values"], enc["image_grid_thw"]
        if p.videos:
            item.pixel_values_videos, item.video_grid_thw, item.second_per_grid_ts = process_videos(processor, p.videos)
            item.video_fps = [float(v.sample_fps) for v in p.videos]
        out.append(item)
    return out


def expand_pads(ids: list[int], v: PromptImages, processor: Any, family: qwen_vl.Family) -> list[int]:
    """A prompt's ids with one pad per image and video, each pad expanded as the processor and the engine expand it
    (image pads to their token count; videos to the family's layout, Qwen3-VL's timestamps included): what
    ``build_inputs`` and ``generate`` take."""
    merge = int(getattr(processor.image_processor, "merge_size", 2))
    pads = qwen_vl.vision_token_ids(processor.tokenizer)
    if v.tiled is not None:
        if family.tiles is None:
            raise ValueError(f"expand_pads: tiled images for {family.label}, whose images are not tiled")
        layouts = family.tiles.layouts(v.tiled, processor, pads)
        ids = family.tiles.join(qwen_vl.replace_pads(ids, pads.image_pad, layouts, "image"), processor)
    elif v.num_images:
        ids = qwen_vl.expand_image_pads(ids, pads.image_pad, qwen_vl.tokens_per_image(v.image_grid_thw, merge))
    if v.num_videos:
        if v.video_fps is None:
            raise ValueError("expand_pads: the videos' sample rates are missing (process_images sets video_fps)")
        ids = qwen_vl.expand_video_pads(ids, processor.tokenizer, family, v.video_grid_thw, v.video_fps, merge)
    return list(ids)


def process_response_images(processor: Any, rollout: RolloutBatch) -> list[PromptImages] | None:
    """The processor's output for the images tools returned in each multi-turn sample (None for a single-turn
    rollout)."""
    if not rollout.trajectories:
        return None
    out = []
    for t in rollout.trajectories:
        if not t.images:
            out.append(PromptImages(None, None))
            continue
        enc = processor.image_processor(images=t.images, return_tensors="pt")
        out.append(PromptImages(enc["pixel_values"], enc["image_grid_thw"]))
    return out


def build_inputs(
    prompts: list[PromptSample],
    rollout: RolloutBatch,
    images: list[PromptImages],
    pad_id: int,
    response_images: list[PromptImages] | None = None,
) -> ModelInputs:
    """Tensors for ``len(rollout)`` samples; sample i belongs to prompt ``i // rollout.n``. Multi-turn samples
    (``rollout.trajectories``) mask their tool turns out of ``response_mask``; ``response_images`` are their tool
    images (:func:`process_response_images`)."""
    n = rollout.n
    B = len(rollout)
    if B != len(prompts) * n:
        raise ValueError(f"{B} samples for {len(prompts)} prompts x n={n}")
    P = max(len(p) for p in rollout.prompt_ids)
    R = max(1, max(len(r) for r in rollout.response_ids))
    input_ids = torch.full((B, P + R), pad_id, dtype=torch.long)
    attn = torch.zeros((B, P + R), dtype=torch.long)
    responses = torch.full((B, R), pad_id, dtype=torch.long)
    rmask = torch.zeros((B, R), dtype=torch.long)
    rlp = torch.zeros((B, R), dtype=torch.float32)
    for i, (pids, rids) in enumerate(zip(rollout.prompt_ids, rollout.response_ids)):
        input_ids[i, P - len(pids) : P] = torch.tensor(pids)
        attn[i, P - len(pids) : P] = 1
        if rids:
            input_ids[i, P : P + len(rids)] = torch.tensor(rids)
            attn[i, P : P + len(rids)] = 1
            responses[i, : len(rids)] = torch.tensor(rids)
            if rollout.trajectories:
                mask = rollout.trajectories[i].response_mask
                if len(mask) != len(rids):
                    raise ValueError(f"sample {i}: a response mask of {len(mask)} for {len(rids)} tokens")
                rmask[i, : len(rids)] = torch.tensor(mask, dtype=torch.long)
            else:
                rmask[i, : len(rids)] = 1
            lps = rollout.logprobs[i] if i < len(rollout.logprobs) else []
            if len(lps) == len(rids):
                rlp[i, : len(rids)] = torch.tensor(lps)
    prompt_of = torch.arange(B) // n
    return ModelInputs(input_ids, attn, responses, rmask, prompt_of, images, rlp, response_images)


def to_device(x: ModelInputs, device: torch.device | str) -> ModelInputs:
    """Move the tensors of a batch (images move lazily, per micro-batch)."""
    return ModelInputs(
        x.input_ids.to(device),
        x.attention_mask.to(device),
        x.responses.to(device),
        x.response_mask.to(device),
        x.prompt_of,
        x.images,
        x.rollout_logprobs,
        x.sample_images,
    )
