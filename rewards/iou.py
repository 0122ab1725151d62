"""Box rewards: parse boxes from a response, map them between resized and original image coordinates, score IoU.

Qwen2.5-VL answers grounding questions in absolute pixel coordinates of the image it SAW (the resized image), e.g.
``{"bbox_2d": [x1, y1, x2, y2], "label": "cat"}``. Datasets store boxes in ORIGINAL image pixels. ``RewardSample``
carries ``image_scales`` (resized = original * scale), so a predicted box maps back with ``x / sx, y / sy``.

Registry name ``iou``: continuous IoU, or a hit rate with ``threshold``; several ground-truth boxes are matched
one-to-one (greedy by IoU) and extra predicted boxes lower the score, so listing many boxes cannot game it.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from vlmrl.rewards.format import check_format, extract_tag, strip_think

Box = tuple[float, float, float, float]

MAX_BOXES = 100
"""Boxes read from one response at most (the rest are ignored, and count as extra predictions via the cap)."""

_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_BOX = re.compile(rf"[\[\(]\s*({_NUM})\s*,\s*({_NUM})\s*,\s*({_NUM})\s*,\s*({_NUM})\s*[\]\)]")


def valid_box(box: Any) -> bool:
    """Four finite numbers with x1 < x2 and y1 < y2 (anything else is malformed and scores 0)."""
    if not isinstance(box, list | tuple) or len(box) != 4:
        return False
    try:
        x1, y1, x2, y2 = (float(v) for v in box)
    except (TypeError, ValueError):
        return False
    return all(math.isfinite(v) for v in (x1, y1, x2, y2)) and x1 < x2 and y1 < y2


def parse_boxes(text: str, limit: int = MAX_BOXES) -> list[Box]:
    """Every ``[x1, y1, x2, y2]`` / ``(x1, y1, x2, y2)`` in ``text``, in order (malformed ones included as parsed)."""
    out: list[Box] = []
    for m in _BOX.finditer(text):
        try:
            out.append(tuple(float(g) for g in m.groups()))  # type: ignore[arg-type]
        except (ValueError, OverflowError):
            continue
        if len(out) >= limit:
            break
    return out


def parse_truth_boxes(ground_truth: Any) -> list[Box]:
    """Ground-truth boxes from a JSON string, a box, a list of boxes, or a dict with ``bbox``/``bbox_2d``/``box``."""
    gt = ground_truth
    if isinstance(gt, str):
        try:
            gt = json.loads(gt)
        except json.JSONDecodeError:
            boxes = parse_boxes(gt)
            if not boxes:
                raise ValueError(f"ground truth {ground_truth!r} holds no box") from None
            return boxes
    if isinstance(gt, dict):
        for key in ("bbox_2d", "bbox", "box", "boxes"):
            if key in gt:
                return parse_truth_boxes(gt[key])
        raise ValueError(f"ground truth dict {sorted(gt)} has no bbox/bbox_2d/box/boxes key")
    if hasattr(gt, "tolist"):
        gt = gt.tolist()
    if isinstance(gt, list | tuple) and len(gt) == 4 and all(isinstance(v, int | float) for v in gt):
        return [tuple(float(v) for v in gt)]  # type: ignore[list-item]
    if (
        isinstance(gt, list | tuple)
        and gt
        and all(isinstance(b, list | tuple | dict) or hasattr(b, "tolist") for b in gt)
    ):
        return [b for item in gt for b in parse_truth_boxes(item)]
    raise ValueError(f"ground truth {ground_truth!r} is not a box [x1, y1, x2, y2] or a list of boxes")


def to_original(box: Box, scale: tuple[float, float]) -> Box:
    """Map a box from resized-image pixels to original-image pixels (resized = original * scale)."""
    sx, sy = scale
    return (box[0] / sx, box[1] / sy, box[2] / sx, box[3] / sy)


def to_resized(box: Box, scale: tuple[float, float]) -> Box:
    """Map a box from original-image pixels to resized-image pixels."""
    sx, sy = scale
    return (box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy)


def box_iou(a: Box, b: Box) -> float:
    """Intersection over union in [0, 1]; 0 for a malformed or degenerate box (never NaN)."""
    if not (valid_box(a) and valid_box(b)):
        return 0.0
    iw = min(a[2], b[2]) - max(a[0], b[0])
    ih = min(a[3], b[3]) - max(a[1], b[1])
    if iw <= 0 or ih <= 0:
        return 0.0
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    value = inter / union if union > 0 else 0.0
    return min(1.0, max(0.0, value)) if math.isfinite(value) else 0.0


def match_boxes(pred: list[Box], truth: list[Box], threshold: float | None = None) -> float:
    """One-to-one greedy matching by IoU: sum of matched IoUs (or hits >= threshold) / max(#pred, #truth)."""
    if not pred or not truth:
        return 0.0
    pairs = sorted(
        ((box_iou(p, t), i, j) for i, p in enumerate(pred) for j, t in enumerate(truth)), key=lambda x: -x[0]
    )
    used_p: set[int] = set()
    used_t: set[int] = set()
    total = 0.0
    for iou, i, j in pairs:
        if iou <= 0 or i in used_p or j in used_t:
            continue
        used_p.add(i)
        used_t.add(j)
        total += (1.0 if iou >= threshold else 0.0) if threshold is not None else iou
    return total / max(len(pred), len(truth))


def response_boxes(sample: Any, coords: str = "resized", image_index: int = 0) -> list[Box]:
    """Boxes of the response's answer (``<answer>`` if present, else the text after ``</think>``), in ORIGINAL
    pixels. ``coords`` says what the model wrote: ``resized`` (Qwen2.5-VL) or ``original``."""
    text = extract_tag(sample.response, "answer")
    if text is None:
        text = strip_think(sample.response)
    boxes = parse_boxes(text)
    if coords == "original":
        return boxes
    if coords != "resized":
        raise ValueError(f"unknown coords '{coords}' (resized | original)")
    scales = list(getattr(sample, "image_scales", None) or [])
    scale = scales[image_index] if image_index < len(scales) else (1.0, 1.0)
    if not (scale[0] > 0 and scale[1] > 0):
        raise ValueError(f"image scale {scale} must be positive")
    return [to_original(b, scale) for b in boxes]


def iou_reward(sample: Any, *, threshold: float | None = None, coords: str = "resized", image_index: int = 0) -> float:
    """IoU of the response's boxes against ``ground_truth`` boxes (original pixels), in [0, 1].

    ``threshold`` None: continuous IoU; else the fraction of ground-truth boxes hit with IoU >= threshold. Boxes
    are matched one-to-one; extra predictions count against the score (divided by max(#pred, #truth)).
    """
    truth = parse_truth_boxes(sample.ground_truth)
    pred = response_boxes(sample, coords=coords, image_index=image_index)
    return match_boxes(pred, truth, threshold)


def box_format_reward(sample: Any, *, style: str = "think_answer", coords: str = "resized") -> float:
    """1.0 when the response follows ``style`` (``rewards.format.check_format``) and its answer holds at least one
    well-formed box, else 0.0 (the format term of the ``grounding`` recipe)."""
    ok = check_format(sample.response, style) and any(valid_box(b) for b in response_boxes(sample, coords=coords))
    return 1.0 if ok else 0.0


iou_reward.needs_images = False  # type: ignore[attr-defined]
box_format_reward.needs_images = False  # type: ignore[attr-defined]
