"""Model-free visual consistency: do the colours and shapes a response names match the picture?

Ground facts come from ``extra_info["objects"]`` (a list of ``{colour, shape, box}``, boxes in original pixels).
An object without a colour name gets one by looking at the image: the pixels in the middle of its box (mapped to
the resized image with ``image_scales``) are named by hue/saturation/value and the most common name wins. With no
annotations at all, the colours the response names are checked against the image's own palette.

The response's claims are colour words, shape words and "colour shape" pairs (``red circle``); each distinct claim
counts once (repeating a word cannot raise the score). Precision = claims true of some object; recall = objects
covered by a true claim; the reward is their F1 (``mode`` = f1 | precision | recall). No claim scores 0.

Registry name ``visual_consistency``.
"""

from __future__ import annotations

import colorsys
import re
from collections import Counter
from typing import Any

from vlmrl.rewards.format import answer_span

COLOURS = ("red", "orange", "yellow", "green", "cyan", "blue", "purple", "pink", "brown", "black", "white", "gray")
ALIASES = {
    "grey": "gray",
    "violet": "purple",
    "magenta": "purple",
    "indigo": "purple",
    "lime": "green",
    "olive": "green",
    "navy": "blue",
    "teal": "cyan",
    "turquoise": "cyan",
    "aqua": "cyan",
    "gold": "yellow",
    "golden": "yellow",
    "maroon": "brown",
    "silver": "gray",
}
SHAPES = ("circle", "square", "triangle", "rectangle", "star", "ellipse", "diamond", "pentagon", "hexagon", "cross")
SHAPE_ALIASES = {"oval": "ellipse", "rhombus": "diamond", "disk": "circle", "disc": "circle", "dot": "circle"}
MODES = ("f1", "precision", "recall")

_WORD = re.compile(r"[a-z]+")
MAX_TEXT_CHARS = 20000
"""Only this much of the answer is read (claims past it are ignored)."""


def colour_name(rgb: tuple[int, int, int]) -> str:
    """A basic colour name (one of :data:`COLOURS`) for an RGB triple, by hue, saturation and value."""
    r, g, b = (c / 255.0 for c in rgb[:3])
    h, s, v = colorsys.rgb_to_hsv(r, g, b)
    hue = h * 360
    if v < 0.2:
        return "black"
    if s < 0.2:
        return "white" if v > 0.85 else "gray"
    warm = hue < 15 or hue >= 345
    if warm and s < 0.6 and v > 0.7:
        return "pink"
    if (warm or hue < 45) and v < 0.7 and s > 0.3:
        return "brown"
    for upper, name in ((15, "red"), (45, "orange"), (70, "yellow"), (165, "green"), (195, "cyan"), (260, "blue")):
        if hue < upper:
            return name
    if hue < 315:
        return "purple"
    if hue < 345:
        return "pink"
    return "red"


def canonical_colour(word: str) -> str | None:
    """The canonical colour for a word ("Grey" -> "gray"), or None if it is not a colour."""
    w = str(word).strip().lower()
    w = ALIASES.get(w, w)
    return w if w in COLOURS else None


def canonical_shape(word: str, extra: set[str] | None = None) -> str | None:
    """The canonical shape for a word (plural allowed: "circles" -> "circle"), or None."""
    w = str(word).strip().lower()
    vocab = set(SHAPES) | (extra or set())
    for cand in (w, w[:-1] if w.endswith("s") else w, w[:-2] if w.endswith("es") else w):
        cand = SHAPE_ALIASES.get(cand, cand)
        if cand in vocab:
            return cand
    return None


def pixels(image: Any) -> Any:
    """The RGB tuples of an image (Pillow >= 12 ``get_flattened_data``, else ``getdata``)."""
    getter = getattr(image, "get_flattened_data", None) or image.getdata
    return getter()


def region_colour(image: Any, box: tuple[float, float, float, float]) -> str | None:
    """Most common colour name of the middle third of ``box`` (in this image's pixels); None if the box is empty."""
    x1, y1, x2, y2 = box
    w, h = x2 - x1, y2 - y1
    left, top = max(0, int(x1 + w / 3)), max(0, int(y1 + h / 3))
    right, bottom = min(image.width, int(x2 - w / 3) + 1), min(image.height, int(y2 - h / 3) + 1)
    if right <= left or bottom <= top:
        return None
    crop = image.convert("RGB").crop((left, top, right, bottom))
    crop.thumbnail((16, 16))
    counts = Counter(colour_name(px) for px in pixels(crop))
    return counts.most_common(1)[0][0] if counts else None


def image_palette(image: Any, min_share: float = 0.02) -> set[str]:
    """Colour names covering at least ``min_share`` of the image."""
    small = image.convert("RGB").copy()
    small.thumbnail((48, 48))
    counts = Counter(colour_name(px) for px in pixels(small))
    total = sum(counts.values()) or 1
    return {name for name, c in counts.items() if c / total >= min_share}


def annotated_objects(sample: Any, image_index: int = 0) -> list[tuple[str | None, str | None]]:
    """(colour, shape) per annotated object; a missing colour is read from the image at the object's box."""
    objects = (sample.extra_info or {}).get("objects")
    objects = [] if objects is None else list(objects.tolist() if hasattr(objects, "tolist") else objects)
    images = list(getattr(sample, "images", None) or [])
    scales = list(getattr(sample, "image_scales", None) or [])
    out: list[tuple[str | None, str | None]] = []
    for obj in objects:
        if not isinstance(obj, dict):
            continue
        colour = canonical_colour(obj.get("colour") or obj.get("color") or "")
        shape = str(obj["shape"]).strip().lower() if obj.get("shape") else None
        shape = SHAPE_ALIASES.get(shape, shape) if shape else None
        box = obj.get("box") or obj.get("bbox")
        if colour is None and box is not None and image_index < len(images):
            sx, sy = scales[image_index] if image_index < len(scales) else (1.0, 1.0)
            x1, y1, x2, y2 = (float(v) for v in box)
            colour = region_colour(images[image_index], (x1 * sx, y1 * sy, x2 * sx, y2 * sy))
        out.append((colour, shape))
    return out


def extract_claims(text: str, shapes: set[str] | None = None) -> set[tuple[str | None, str | None]]:
    """Distinct (colour, shape) claims: pairs ("red circle", "red big circle"), else (colour, None) / (None, shape)."""
    words = _WORD.findall(text[:MAX_TEXT_CHARS].lower())
    colours = [canonical_colour(w) for w in words]
    found_shapes = [canonical_shape(w, shapes) for w in words]
    claims: set[tuple[str | None, str | None]] = set()
    paired_shapes: set[int] = set()
    for i, c in enumerate(colours):
        if c is None:
            continue
        j = next((k for k in range(i + 1, min(i + 3, len(words))) if found_shapes[k] or colours[k]), None)
        if j is not None and found_shapes[j]:
            claims.add((c, found_shapes[j]))
            paired_shapes.add(j)
        else:
            claims.add((c, None))
    for i, s in enumerate(found_shapes):
        if s is not None and i not in paired_shapes:
            claims.add((None, s))
    return claims


def _claim_true(claim: tuple[str | None, str | None], obj: tuple[str | None, str | None]) -> bool:
    colour, shape = claim
    return (colour is None or colour == obj[0]) and (shape is None or shape == obj[1])


def consistency(
    claims: set[tuple[str | None, str | None]], objects: list[tuple[str | None, str | None]], mode: str
) -> float:
    """F1 / precision / recall of claims against objects (see module docstring)."""
    if mode not in MODES:
        raise ValueError(f"unknown mode '{mode}' (one of {MODES})")
    if not claims or not objects:
        return 0.0
    true_claims = [c for c in claims if any(_claim_true(c, o) for o in objects)]
    precision = len(true_claims) / len(claims)
    covered = sum(any(_claim_true(c, o) for c in true_claims) for o in objects)
    recall = covered / len(objects)
    if mode == "precision":
        return precision
    if mode == "recall":
        return recall
    return 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)


def visual_consistency(sample: Any, *, mode: str = "f1", image_index: int = 0) -> float:
    """Agreement in [0, 1] between the colours/shapes named in the answer and the annotated (or seen) objects."""
    text = answer_span(sample.response)
    objects = annotated_objects(sample, image_index)
    if objects:
        shapes = {o[1] for o in objects if o[1]}
        return consistency(extract_claims(text, shapes), objects, mode)
    images = list(getattr(sample, "images", None) or [])
    if image_index >= len(images):
        raise ValueError("visual_consistency needs extra_info['objects'] annotations or an image")
    palette = image_palette(images[image_index])
    colours = {c for c, _ in extract_claims(text) if c is not None}
    if not colours:
        return 0.0
    return len(colours & palette) / len(colours)
