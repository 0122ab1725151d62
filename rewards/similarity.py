"""Text similarity of the answer to the reference: normalised exact match, token F1 (SQuAD style), ROUGE-L F1.

ROUGE-L uses a bit-parallel LCS (one big-integer step per token of the longer text), so a 1 MB response against
a short reference costs well under a second. A list of references scores the best match.

Registry name ``similarity`` with ``mode`` = f1 (default) | exact | rouge_l.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from typing import Any

from vlmrl.rewards.format import answer_span

MODES = ("f1", "exact", "rouge_l")

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_text(text: str) -> str:
    """Lower-case, NFKC, punctuation and English articles removed, whitespace collapsed (SQuAD normalisation)."""
    text = unicodedata.normalize("NFKC", str(text)).lower().translate(_PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def tokens(text: str) -> list[str]:
    """Normalised whitespace tokens."""
    return normalize_text(text).split()


def exact_match(prediction: str, reference: str) -> float:
    """1.0 when the normalised texts are equal."""
    return 1.0 if normalize_text(prediction) == normalize_text(reference) else 0.0


def token_f1(prediction: str, reference: str) -> float:
    """Harmonic mean of token precision and recall (bag of normalised tokens)."""
    p, r = tokens(prediction), tokens(reference)
    if not p or not r:
        return 1.0 if p == r else 0.0
    common = sum((Counter(p) & Counter(r)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(p), common / len(r)
    return 2 * precision * recall / (precision + recall)


def lcs_length(a: list[str], b: list[str]) -> int:
    """Length of the longest common subsequence (Hyyro's bit-parallel algorithm, O(len(b)) big-int steps)."""
    if len(a) > len(b):
        a, b = b, a
    if not a:
        return 0
    masks: dict[str, int] = {}
    for i, tok in enumerate(a):
        masks[tok] = masks.get(tok, 0) | (1 << i)
    full = (1 << len(a)) - 1
    v = full
    for tok in b:
        u = v & masks.get(tok, 0)
        v = ((v + u) | (v - u)) & full
    return len(a) - bin(v).count("1")


def rouge_l(prediction: str, reference: str) -> float:
    """ROUGE-L F1 on normalised tokens."""
    p, r = tokens(prediction), tokens(reference)
    if not p or not r:
        return 1.0 if p == r else 0.0
    lcs = lcs_length(p, r)
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(p), lcs / len(r)
    return 2 * precision * recall / (precision + recall)


_SCORERS = {"exact": exact_match, "f1": token_f1, "rouge_l": rouge_l}


def similarity(prediction: str, references: Any, mode: str = "f1") -> float:
    """Best ``mode`` score of ``prediction`` against one reference or a list of them."""
    if mode not in _SCORERS:
        raise ValueError(f"unknown similarity mode '{mode}' (one of {MODES})")
    refs = references if isinstance(references, list | tuple) else [references]
    refs = [str(r) for r in refs if r is not None]
    if not refs:
        raise ValueError("similarity reward: the ground truth is empty")
    return max(_SCORERS[mode](prediction, r) for r in refs)


def similarity_reward(sample: Any, *, mode: str = "f1") -> float:
    """Similarity in [0, 1] between the response's answer span and ``ground_truth`` (a string or list of them)."""
    return similarity(answer_span(sample.response), sample.ground_truth, mode)


similarity_reward.needs_images = False  # type: ignore[attr-defined]
