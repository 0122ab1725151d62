r"""Format rewards and the text helpers every other reward uses: ``<think>``/``<answer>`` tags and ``\boxed{}``.

All helpers scan with ``str.find``/``rfind`` (linear time, no backtracking), so a 1 MB response costs milliseconds.

Usable as ``reward.function=format`` (``style`` kwarg below), or imported: ``from vlmrl.rewards.format import
extract_boxed, answer_span``.
"""

from __future__ import annotations

import re
from typing import Any

STYLES = ("think_boxed", "think_answer", "answer", "boxed", "think")

_BOX_MACRO = re.compile(r"\\(?:boxed|fbox) *\{")
_BRACE = re.compile(r"[{}]")


def extract_boxed(text: str) -> str | None:
    r"""Content of the last ``\boxed{...}`` (or ``\fbox{...}``) with balanced braces; None when there is none.

    One pass over the braces after the first macro (linear time even for ``"\boxed{" * 10_000``).
    """
    opens: list[int] = []  # index of the "{" of each macro, in text order
    for m in _BOX_MACRO.finditer(text):
        opens.append(m.end() - 1)
    if not opens:
        return None
    wanted = set(opens)
    close_of: dict[int, int] = {}
    stack: list[int] = []
    for m in _BRACE.finditer(text, opens[0]):
        if m.group() == "{":
            stack.append(m.start())
        elif stack:
            start = stack.pop()
            if start in wanted:
                close_of[start] = m.start()
    for start in reversed(opens):
        if start in close_of:
            return text[start + 1 : close_of[start]].strip()
    return None


def extract_tag(text: str, tag: str) -> str | None:
    """Content of the last ``<tag>...</tag>``; None when there is no closed pair."""
    close = text.rfind(f"</{tag}>")
    if close < 0:
        return None
    start = text.rfind(f"<{tag}>", 0, close)
    if start < 0:
        return None
    return text[start + len(tag) + 2 : close].strip()


def strip_think(text: str) -> str:
    """The text without its ``<think>...</think>`` reasoning (an unclosed ``<think>`` leaves nothing after it)."""
    end = text.rfind("</think>")
    if end >= 0:
        return text[end + len("</think>") :].strip()
    start = text.find("<think>")
    return text[:start].strip() if start >= 0 else text.strip()


def answer_span(text: str) -> str:
    r"""Where the final answer is: the last ``<answer>`` content, else the last ``\boxed{}``, else the text after
    the reasoning (``</think>``)."""
    tagged = extract_tag(text, "answer")
    if tagged is not None:
        return tagged
    boxed = extract_boxed(text)
    if boxed is not None:
        return boxed
    return strip_think(text)


def has_think_boxed(text: str) -> bool:
    r"""verl's geo3k format: the text starts with ``<think>``, a ``</think>`` follows, then a ``\boxed{`` with a
    ``}`` after it (``re.fullmatch(r"<think>.*</think>.*\\boxed\{.*\}.*", text, re.DOTALL)`` without the
    regex's quadratic worst case)."""
    if not text.startswith("<think>"):
        return False
    close = text.find("</think>", len("<think>"))
    if close < 0:
        return False
    box = text.find("\\boxed{", close + len("</think>"))
    return box >= 0 and text.find("}", box + len("\\boxed{")) >= 0


def has_think_answer(text: str) -> bool:
    """R1 format: exactly ``<think>...</think>`` then ``<answer>...</answer>`` (whitespace around), one pair each."""
    t = text.strip()
    if not (t.startswith("<think>") and t.endswith("</answer>")):
        return False
    if any(t.count(tag) != 1 for tag in ("<think>", "</think>", "<answer>", "</answer>")):
        return False
    close = t.find("</think>")
    ans = t.find("<answer>")
    return close < ans and t[close + len("</think>") : ans].strip() == "" and bool(extract_tag(t, "answer"))


def check_format(text: str, style: str = "think_boxed") -> bool:
    """Whether ``text`` follows ``style`` (one of :data:`STYLES`)."""
    if style == "think_boxed":
        return has_think_boxed(text)
    if style == "think_answer":
        return has_think_answer(text)
    if style == "answer":
        return bool(extract_tag(text, "answer"))
    if style == "boxed":
        return bool(extract_boxed(text))
    if style == "think":
        return "</think>" in text and text.lstrip().startswith("<think>") and bool(strip_think(text))
    raise ValueError(f"unknown format style '{style}' (one of {STYLES})")


def format_reward(sample: Any, *, style: str = "think_boxed") -> float:
    r"""1.0 when the response follows ``style``, else 0.0.

    Styles: ``think_boxed`` (verl's geo3k: ``<think>...</think>`` then ``\boxed{}``), ``think_answer``
    (``<think>...</think><answer>...</answer>``, nothing else), ``answer`` (a non-empty ``<answer>`` pair),
    ``boxed`` (a non-empty ``\boxed{}``), ``think`` (closed reasoning followed by some answer text).
    """
    return 1.0 if check_format(sample.response, style) else 0.0


format_reward.needs_images = False  # type: ignore[attr-defined]
