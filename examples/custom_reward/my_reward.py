"""A user-written multimodal reward that looks at the image the model saw.

Task: the synthetic colour questions ("What colour is the circle?"). The reward checks two things:

* correct: the answer names exactly one colour and it is the ground truth;
* seen: the colour named is really in the picture, judged from the pixels inside the annotated objects' boxes
  (``extra_info["objects"]``, boxes in original pixels, mapped onto the resized image with ``image_scales``),
  or from the whole image when there are no annotations.

score = 0.8 * correct + 0.2 * seen. Plug it in with:

    python -m vlmrl.train --config-name tiny_cpu ... \\
        custom_reward_function.path=examples/custom_reward/my_reward.py custom_reward_function.name=compute_score

It uses only Pillow and the standard library, so it is easy to copy and change.
"""

from __future__ import annotations

import re

PALETTE = {
    "red": (220, 30, 30),
    "green": (30, 160, 60),
    "blue": (30, 60, 220),
    "yellow": (240, 220, 30),
    "orange": (250, 140, 20),
    "purple": (130, 40, 160),
    "pink": (250, 170, 200),
    "brown": (140, 80, 40),
    "black": (10, 10, 10),
    "white": (245, 245, 245),
    "gray": (128, 128, 128),
}


def nearest_colour(rgb: tuple[int, int, int]) -> str:
    """The PALETTE name closest to an RGB triple."""
    return min(PALETTE, key=lambda name: sum((a - b) ** 2 for a, b in zip(rgb, PALETTE[name])))


def _pixels(image):
    getter = getattr(image, "get_flattened_data", None) or image.getdata  # Pillow >= 12 renamed it
    return getter()


def colours_in_box(image, box) -> set[str]:
    """Colour names of the pixels in the middle of ``box`` (resized-image pixels)."""
    x1, y1, x2, y2 = box
    w, h = x2 - x1, y2 - y1
    crop = image.convert("RGB").crop((int(x1 + w / 4), int(y1 + h / 4), int(x2 - w / 4) + 1, int(y2 - h / 4) + 1))
    crop.thumbnail((8, 8))
    return {nearest_colour(px) for px in _pixels(crop)}


def seen_colours(sample) -> set[str]:
    """Colours present in the image: inside annotated objects, else anywhere in a small thumbnail."""
    if not sample.images:
        return set()
    image = sample.images[0]
    sx, sy = sample.image_scales[0] if sample.image_scales else (1.0, 1.0)
    objects = (sample.extra_info or {}).get("objects") or []
    if objects:
        seen: set[str] = set()
        for obj in objects:
            x1, y1, x2, y2 = obj["box"]
            seen |= colours_in_box(image, (x1 * sx, y1 * sy, x2 * sx, y2 * sy))
        return seen
    thumb = image.convert("RGB").copy()
    thumb.thumbnail((16, 16))
    return {nearest_colour(px) for px in _pixels(thumb)}


def compute_score(sample) -> dict[str, float]:
    """vlmrl's signature: one RewardSample in, a dict with the total under "score" out (the rest is logged)."""
    answer = sample.response.split("</think>")[-1].lower()
    named = {c for c in PALETTE if re.search(rf"\b{c}\b", answer)}
    correct = 1.0 if len(named) == 1 and str(sample.ground_truth).lower() in named else 0.0
    seen = 1.0 if named and named <= seen_colours(sample) else 0.0
    return {"score": 0.8 * correct + 0.2 * seen, "correct": correct, "seen": seen}
