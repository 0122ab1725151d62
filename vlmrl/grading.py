"""Whether two math answers are equal: math-verify (LaTeX or plain expressions, ``0.5 == 1/2``), after a cheap exact
comparison of normalised text. Shared by the accuracy rewards (``rewards/accuracy.py``) and the ``geo3k_check`` tool.

Inputs are capped (an answer longer than ``MAX_ANSWER_CHARS`` is wrong), so a huge response cannot make sympy run for
minutes; in a process's main thread math-verify's own timeout (SIGALRM) applies too. Reward and tool calls run in
worker processes where their timeout ends the work, whatever sympy does (``vlmrl.supervise``).
"""

from __future__ import annotations

import re
import threading

MAX_ANSWER_CHARS = 1000
"""Longest answer text graded (longer ones score 0: no real answer is that long, and sympy on it is slow)."""


def _mv_timeout() -> int | None:
    # math-verify times out with SIGALRM, which exists only in the main thread; elsewhere the caller's timeout rules
    return 5 if threading.current_thread() is threading.main_thread() else None


def normalize_plain(text: str) -> str:
    """Answer text compared as written: no ``$``, ``\\text{}``, ``\\left``/``\\right`` or spaces; lower case."""
    text = text.strip().strip("$").strip()
    text = re.sub(r"\\text\{([^{}]*)\}", r"\1", text)
    text = text.replace("\\left", "").replace("\\right", "").replace("\\!", "").replace(" ", "")
    return text.rstrip(".").lower()


def grade_math(answer: str, truth: str) -> bool:
    """Whether ``answer`` equals ``truth`` mathematically (math-verify: LaTeX or plain expressions, 0.5 == 1/2)."""
    if not answer or not truth or len(answer) > MAX_ANSWER_CHARS:
        return False
    if normalize_plain(answer) == normalize_plain(truth):
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
