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
import threading
from fractions import Fraction
from typing import Any

from vlmrl.rewards.format import answer_span, extract_boxed, strip_think

MAX_ANSWER_CHARS = 1000
"""Longest answer text graded (longer ones score 0: no real answer is that long, and sympy on it is slow)."""

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


def _mv_timeout() -> int | None:
    # math-verify times out with SIGALRM, which exists only in the main thread; elsewhere the caller's timeout rules
    return 5 if threading.current_thread() is threading.main_thread() else None


def _normalize_plain(text: str) -> str:
    text = text.strip().strip("$").strip()
    text = re.sub(r"\\text\{([^{}]*)\}", r"\1", text)
    text = text.replace("\\left", "").replace("\\right", "").replace("\\!", "").replace(" ", "")
    return text.rstrip(".").lower()


def grade_math(answer: str, truth: str) -> bool:
    """Whether ``answer`` equals ``truth`` mathematically (math-verify: LaTeX or plain expressions, 0.5 == 1/2)."""
    if not answer or not truth or len(answer) > MAX_ANSWER_CHARS:
        return False
    if _normalize_plain(answer) == _normalize_plain(truth):
        return True
    from math_verify import parse, verify

    timeout = _mv_timeout()
    gold = parse("\\boxed{" + truth + "}", parsing_timeout=timeout)
    if not gold:
        gold = parse(truth, parsing_timeout=timeout)
    pred = parse("\\boxed{" + answer + "}", parsing_timeout=timeout)
    if not pred:
        pred = parse(answer, parsing_timeout=timeout)
    if not gold or not pred:
        return False
    return bool(verify(gold, pred, timeout_seconds=timeout))


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
        return 1.0 if _normalize_plain(strip_think(answer)) == _normalize_plain(truth) else 0.0
    raise ValueError(f"unknown accuracy mode '{mode}' (auto | math | choice | number | exact)")


for _fn in (math_reward, choice_reward, number_reward, accuracy_reward):
    _fn.needs_images = False  # type: ignore[attr-defined]
