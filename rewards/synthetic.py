"""The quick-start reward for the synthetic shapes task (``preprocess/synthetic.py``): fast and lenient about
surrounding text, strict about hedging.

Task families, from ``data_source = synthetic/<family>``:

* label families (``colour``, ``shape``, ``position``; any other record with ``extra_info["choices"]``): 1.0 when the
  answer names exactly one of the candidate labels (case-insensitive whole words; ``top left`` = ``top-left``; a
  plural ``s`` is fine) and it is the ground truth. Naming two or more candidates scores 0, so listing every label
  cannot game it. Longer labels win over labels they contain (``top-left`` is not also ``left``).
* ``count``: the first integer (digits or an English number word up to twenty) equals the ground truth.
* ``grounding``: IoU of the first box in the answer, written in the resized image's pixels (what the model saw)
  and mapped to original pixels with ``image_scales``, against the ground-truth box (original pixels).

The answer is the ``<answer>`` content or ``\\boxed{}`` when present, else the text after ``</think>``.
Registry name ``synthetic``; also the default for every ``synthetic/*`` data source.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from vlmrl.rewards.format import answer_span
from vlmrl.rewards.iou import box_iou, parse_truth_boxes, response_boxes

NUMBER_WORDS = {
    w: i
    for i, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
        "seventeen eighteen nineteen twenty".split()
    )
}
_FIRST_INT = re.compile(r"(?<![\w.])(\d+)(?!\w|\.\d)|\b(" + "|".join(NUMBER_WORDS) + r")\b", re.IGNORECASE)
_SEP = re.compile(r"[\s_\-]+")


def _norm_label(label: str) -> str:
    return " ".join(_SEP.split(str(label).strip().lower()))


@lru_cache(maxsize=512)
def _label_pattern(labels: tuple[str, ...]) -> re.Pattern[str]:
    alts = sorted({_norm_label(c) for c in labels if _norm_label(c)}, key=len, reverse=True)
    body = "|".join(r"[\s_\-]+".join(re.escape(w) for w in a.split()) for a in alts)
    return re.compile(rf"(?<![a-z0-9])({body})(?:e?s)?(?![a-z0-9])", re.IGNORECASE)


def named_labels(text: str, labels: list[str]) -> set[str]:
    """The distinct candidate labels (normalised) that ``text`` names as whole words."""
    if not labels:
        return set()
    return {_norm_label(m.group(1)) for m in _label_pattern(tuple(labels)).finditer(text)}


def label_score(text: str, truth: str, labels: list[str]) -> float:
    """1.0 when ``text`` names exactly one candidate label and it is ``truth``."""
    named = named_labels(text, labels)
    return 1.0 if len(named) == 1 and _norm_label(truth) in named else 0.0


def first_integer(text: str) -> int | None:
    """The first whole number in ``text`` (digits, or a number word up to twenty); None if there is none."""
    m = _FIRST_INT.search(text)
    if m is None:
        return None
    if m.group(1) is not None:
        return int(m.group(1))
    return NUMBER_WORDS[m.group(2).lower()]


def _choices(sample: Any) -> list[str]:
    choices = (sample.extra_info or {}).get("choices")
    if choices is None:
        return []
    if hasattr(choices, "tolist"):  # a numpy array (extra_info read through pandas)
        choices = choices.tolist()
    return [str(c) for c in choices]


def _family(sample: Any) -> str:
    ds = str(sample.data_source or "")
    family = ds.split("/", 1)[1] if ds.startswith("synthetic/") else str((sample.extra_info or {}).get("task", ""))
    if family in ("grounding", "count"):  # checked first: count records also list their candidate numbers
        return family
    if _choices(sample):
        return "label"
    truth = str(sample.ground_truth).strip()
    if truth.startswith("["):
        return "grounding"
    if truth.isdigit():
        return "count"
    raise ValueError(f"synthetic reward: record of '{ds}' has no extra_info['choices'] and is neither count nor box")


def synthetic_reward(sample: Any) -> float:
    """Reward in [0, 1] for one synthetic-task response (see the module docstring for each family)."""
    family = _family(sample)
    if family == "grounding":
        boxes = response_boxes(sample, coords="resized")
        if not boxes:
            return 0.0
        return box_iou(boxes[0], parse_truth_boxes(sample.ground_truth)[0])
    text = answer_span(sample.response)
    if family == "count":
        got = first_integer(text)
        return 1.0 if got is not None and got == int(str(sample.ground_truth).strip()) else 0.0
    return label_score(text, str(sample.ground_truth), _choices(sample))


synthetic_reward.needs_images = False  # type: ignore[attr-defined]
