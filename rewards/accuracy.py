r"""Answer accuracy: math expressions (graded with math-verify), multiple-choice letters, numbers with tolerance.

The answer is read from the response's answer span (``<answer>``, else the last ``\boxed{}``, else the text after
``</think>``; see :func:`vlmrl.rewards.format.answer_span`). Inputs are capped (an answer longer than
``MAX_ANSWER_CHARS`` is wrong), so a huge response cannot make sympy run for minutes.

Registry names: ``accuracy`` (picks by the ground truth: a letter -> choice, a plain number -> number with a
math-verify fallback, anything else -> math), ``math``, ``choice``, ``number``.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any

from vlmrl.grading import MAX_ANSWER_CHARS, grade_math, normalize_plain
from vlmrl.rewards.format import answer_span, extract_boxed, strip_think

__all__ = ["MAX_ANSWER_CHARS", "accuracy_reward", "choice_reward", "grade_math", "math_reward", "number_reward"]

LETTERS = "ABCDEFGHIJ"

_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?|[-+]?\.\d+")
_STANDALONE = re.compile(r"(?<![A-Za-z])([A-J])(?![A-Za-z])")
_CHOICE_PATTERNS = (
    re.compile(r"^\(?([A-J])\)?(?:[.:)]|\s|$)"),  # "B", "(B)", "B.", "B) text"
    re.compile(r"(?:answer|option|choice)\s*(?:is|:)?\s*\(?([A-J])\)?(?![A-Za-z])", re.IGNORECASE),
)


def _truth_text(ground_truth: Any) -> str:
    if isinstance(ground_truth, list | tuple) and ground_truth:
        ground_truth = ground_truth[0]
    return str(ground_truth).strip()


def _final_answer(response: str, use_boxed: bool) -> str:
    if use_boxed:
        boxed = extract_boxed(response)
        if boxed is not None:
            return boxed
    return answer_span(response)


def math_reward(sample: Any, *, use_boxed: bool = True, boxed_only: bool = False) -> float:
    r"""1.0 when the final answer (last ``\boxed{}`` when ``use_boxed``, else the answer span) equals the ground
    truth per math-verify, else 0.0. ``boxed_only``: a response without ``\boxed{}`` scores 0 (verl's geo3k)."""
    if boxed_only:
        answer = extract_boxed(sample.response) or ""
    else:
        answer = _final_answer(sample.response, use_boxed)
    return 1.0 if grade_math(answer, _truth_text(sample.ground_truth)) else 0.0


def extract_choice(text: str, letters: str = LETTERS) -> str | None:
    """The single option letter a text commits to ("B", "(B)", "Answer: B", "B. text"); None if none or ambiguous.

    A short text (up to 30 characters) must name exactly one standalone letter ("A or B" commits to nothing);
    a longer one is read for "answer/option/choice is X", then for a leading "X." / "(X)".
    """
    span = text.strip()
    if len(span) > MAX_ANSWER_CHARS:
        span = span[-MAX_ANSWER_CHARS:]
    if len(span) <= 30:
        found = {m.upper() for m in _STANDALONE.findall(span) if m.upper() in letters}
        if found:
            return found.pop() if len(found) == 1 else None
    for pattern in _CHOICE_PATTERNS[::-1]:
        found = {m.group(1).upper() for m in pattern.finditer(span) if m.group(1).upper() in letters}
        if found:
            return found.pop() if len(found) == 1 else None
    return None


def choice_reward(sample: Any, *, letters: str = LETTERS) -> float:
    """1.0 when the response commits to exactly one option letter and it is the ground truth's, else 0.0.

    The ground truth is a letter (``"B"``, ``"(B)"``), or the option's text when ``extra_info["choices"]`` lists the
    options in letter order.
    """
    truth = _truth_text(sample.ground_truth)
    letter = extract_choice(truth, letters)
    if letter is None:
        choices = (sample.extra_info or {}).get("choices")
        choices = [] if choices is None else list(choices)
        norm = [str(c).strip().lower() for c in choices]
        if truth.lower() in norm and norm.index(truth.lower()) < len(letters):
            letter = letters[norm.index(truth.lower())]
    if letter is None:
        raise ValueError(f"choice reward: ground truth {truth!r} is not an option letter")
    picked = extract_choice(answer_span(sample.response), letters)
    return 1.0 if picked == letter else 0.0


def parse_number(text: str) -> float | None:
    """The last number in ``text`` ("1,234.5", "-3", "2.5e3", "3/4", "50%" -> 0.5 is NOT applied); None if none."""
    if len(text) > MAX_ANSWER_CHARS:
        text = text[-MAX_ANSWER_CHARS:]
    matches = _NUMBER.findall(text)
    if not matches:
        return None
    token = matches[-1].replace(",", "").replace(" ", "")
    try:
        if "/" in token:
            num, den = token.split("/")
            value = float(Fraction(num)) / float(Fraction(den))
        else:
            value = float(token)
    except (ValueError, ZeroDivisionError, OverflowError):
        return None
    return value if math.isfinite(value) else None


def grade_number(answer: str, truth: str, rel_tol: float = 1e-4, abs_tol: float = 1e-8) -> bool:
    """Whether the last number in ``answer`` equals the number ``truth`` within the tolerances."""
    expected = parse_number(truth)
    got = parse_number(answer)
    if expected is None or got is None:
        return False
    return math.isclose(got, expected, rel_tol=rel_tol, abs_tol=abs_tol)


def number_reward(sample: Any, *, rel_tol: float = 1e-4, abs_tol: float = 1e-8) -> float:
    """1.0 when the last number of the answer span equals the ground truth within tolerance, else 0.0."""
    return (
        1.0 if grade_number(answer_span(sample.response), _truth_text(sample.ground_truth), rel_tol, abs_tol) else 0.0
    )


def _is_plain_number(text: str) -> bool:
    return bool(re.fullmatch(r"\s*[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?\s*", text))


def accuracy_reward(sample: Any, *, mode: str = "auto", rel_tol: float = 1e-4) -> float:
    """Answer accuracy in {0, 1}; ``mode`` = auto | math | choice | number | exact.

    ``auto`` chooses by the ground truth: a single option letter -> choice; a plain number -> number within
    ``rel_tol`` (math-verify as fallback, so ``\\frac{1}{2}`` matches ``0.5``); anything else -> math-verify, then
    a normalized exact match.
    """
    truth = _truth_text(sample.ground_truth)
    if mode == "auto":
        if re.fullmatch(r"\(?[A-J]\)?", truth):
            mode = "choice"
        elif _is_plain_number(truth):
            mode = "number"
        else:
            mode = "math"
    if mode == "choice":
        return choice_reward(sample)
    answer = _final_answer(sample.response, True)
    if mode == "number":
        if grade_number(answer, truth, rel_tol=rel_tol):
            return 1.0
        return 1.0 if grade_math(answer, truth) else 0.0
    if mode == "math":
        return 1.0 if grade_math(answer, truth) else 0.0
    if mode == "exact":
        return 1.0 if normalize_plain(strip_think(answer)) == normalize_plain(truth) else 0.0
    raise ValueError(f"unknown accuracy mode '{mode}' (auto | math | choice | number | exact)")


for _fn in (math_reward, choice_reward, number_reward, accuracy_reward):
    _fn.needs_images = False  # type: ignore[attr-defined]
