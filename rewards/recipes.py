r"""Ready-made task rewards built from the library: ``geo3k``, ``grounding``, ``text_visual``.

Each returns ``{"score": total, <component>: value, ...}`` so every part is logged (``reward/<name>/mean``).

Gating: a gated term counts only when the format check passed. ``grounding`` gates IoU on format by default (a
box outside the requested ``<answer>`` tags earns nothing, so the policy cannot skip the format); ``geo3k`` keeps
verl's ungated sum by default so its reward curves match verl's, and ``gate=True`` turns gating on.
"""

from __future__ import annotations

from typing import Any

from vlmrl.rewards.accuracy import grade_math
from vlmrl.rewards.format import answer_span, check_format, extract_boxed, has_think_boxed
from vlmrl.rewards.iou import match_boxes, parse_truth_boxes, response_boxes, valid_box
from vlmrl.rewards.similarity import similarity
from vlmrl.rewards.visual import visual_consistency


def geo3k(sample: Any, *, format_score: float = 0.1, gate: bool = False) -> dict[str, float]:
    r"""verl's geo3k reward: ``(1 - format_score) * accuracy + format_score * format``.

    format: the response starts with ``<think>``, closes it, then has a ``\boxed{}`` (verl's regex). accuracy: the
    last ``\boxed{}`` equals the ground truth per math-verify (verl uses mathruler; math-verify accepts the same
    answers and more equivalent forms). ``gate=True`` counts accuracy only when the format is right.
    """
    response = sample.response
    fmt = 1.0 if has_think_boxed(response) else 0.0
    answer = extract_boxed(response)
    truth = str(sample.ground_truth[0] if isinstance(sample.ground_truth, list | tuple) else sample.ground_truth)
    acc = 1.0 if answer is not None and grade_math(answer, truth.strip()) else 0.0
    counted = acc if (not gate or fmt >= 1.0) else 0.0
    return {"score": (1.0 - format_score) * counted + format_score * fmt, "accuracy": acc, "format": fmt}


def grounding(
    sample: Any,
    *,
    format_weight: float = 0.1,
    threshold: float | None = None,
    coords: str = "resized",
    style: str = "think_answer",
    gate: bool = True,
) -> dict[str, float]:
    """Box grounding: ``(1 - format_weight) * IoU + format_weight * format``, IoU gated on format by default.

    format: the response follows ``style`` (default ``<think>...</think><answer>...</answer>``) and its answer holds
    at least one well-formed box. IoU: the answer's boxes (``coords`` = resized, as Qwen2.5-VL writes them, or
    original) mapped to original pixels and matched one-to-one with the ground truth (extra boxes lower it);
    ``threshold`` turns it into a hit rate.
    """
    boxes = response_boxes(sample, coords=coords)
    fmt = 1.0 if check_format(sample.response, style) and any(valid_box(b) for b in boxes) else 0.0
    iou = match_boxes(boxes, parse_truth_boxes(sample.ground_truth), threshold)
    counted = iou if (not gate or fmt >= 1.0) else 0.0
    return {"score": (1.0 - format_weight) * counted + format_weight * fmt, "iou": iou, "format": fmt}


def text_visual(
    sample: Any, *, text_weight: float = 0.7, mode: str = "f1", visual_mode: str = "f1"
) -> dict[str, float]:
    """``text_weight * similarity + (1 - text_weight) * visual_consistency`` (0.7 / 0.3 by default).

    similarity: ``mode`` (f1 | exact | rouge_l) of the answer against the reference text; visual consistency:
    the model-free check of named colours/shapes against ``extra_info["objects"]`` or the image.
    """
    sim = similarity(answer_span(sample.response), sample.ground_truth, mode)
    vis = visual_consistency(sample, mode=visual_mode)
    return {"score": text_weight * sim + (1.0 - text_weight) * vis, "similarity": sim, "visual": vis}


geo3k.needs_images = False  # type: ignore[attr-defined]
grounding.needs_images = False  # type: ignore[attr-defined]
