"""The reward model's score as a reward component (registry name ``reward_model``).

With ``reward_model.enable=True`` every response is scored by the model before the reward functions run
(``vlmrl.reward_model``: a discriminative model on the workers, or a generative judge whose verdict is parsed) and the
score travels on the sample as ``sample.rm_score`` (the judge's text as ``sample.rm_text``). This component returns
it, so the model's score combines with rule rewards like any other component::

    reward:
      components:
        - {function: reward_model, name: rm, weight: 1.0}
        - {function: format, weight: 0.2}
        - {function: synthetic, name: rule, weight: 0.0}   # logged (reward/rule/mean), not rewarded

A custom reward function can read ``sample.rm_score`` itself. A sample the model could not score (its forward
failed, the judge's verdict did not parse) raises here: the reward manager counts it as an error
(``reward/errors``) and gives it ``reward.fallback_score``; never a silent zero.
"""

from __future__ import annotations

from typing import Any


def reward_model_score(sample: Any, scale: float = 1.0, shift: float = 0.0) -> float:
    """``scale * sample.rm_score + shift`` (a reward model's logits have an arbitrary offset and scale)."""
    score = getattr(sample, "rm_score", None)
    if score is None:
        why = getattr(sample, "rm_error", None) or "reward_model.enable is False"
        raise ValueError(f"the reward model gave this sample no score: {why}")
    return float(scale) * float(score) + float(shift)


reward_model_score.needs_images = False  # type: ignore[attr-defined]
