"""verl's own reward files, as published in the verl package (0.9.1, installed --no-deps by scripts/install.sh), named
with ``custom_reward_function.path`` exactly as a verl user names them: each loads (its imports, e.g. mathruler, are
installed), is called in its own form (by keyword with the names it accepts, or as verl's ``default_compute_score``
calls its modules) and scores a right answer above a wrong one."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from vlmrl.batch import RewardSample
from vlmrl.config import CustomRewardFunctionConfig, RewardConfig
from vlmrl.scoring import RewardManager


def verl_reward_dir() -> Path:
    """``verl/utils/reward_score`` of the installed verl (located, never imported: vlmrl does not run verl's code)."""
    spec = importlib.util.find_spec("verl")
    assert spec is not None and spec.submodule_search_locations, "verl is not installed: bash scripts/install.sh"
    return Path(next(iter(spec.submodule_search_locations))) / "utils" / "reward_score"


# file, its calling convention, (response, ground truth, expected score) cases: right, wrong, and partial credit
CASES = {
    "geo3k.py": (
        "verl-module",  # compute_score(predict_str, ground_truth, use_boxed=True, format_score=0.1)
        [
            ("<think>angles add up</think> The answer is \\boxed{30}", "30", 1.0),
            ("<think>guess</think> \\boxed{45}", "30", 0.1),  # format only
            ("\\boxed{30}", "30", 0.9),  # right answer, no <think>
        ],
    ),
    "gsm8k.py": (
        "verl",  # compute_score(solution_str, ground_truth, method="strict", format_score=0.0, score=1.0)
        [("so she pays 18 dollars.\n#### 18", "18", 1.0), ("#### 17", "18", 0.0), ("18", "18", 0.0)],
    ),
    "math_reward.py": (
        "verl",  # compute_score(solution_str, ground_truth)
        [("thus \\boxed{\\frac{1}{2}}", "\\frac{1}{2}", 1.0), ("\\boxed{2}", "\\frac{1}{2}", 0.0)],
    ),
    "math_dapo.py": (
        "verl",  # returns {"score": +-1, "acc", "pred"}
        [("Answer: 42", "42", 1.0), ("Answer: 41", "42", -1.0)],
    ),
    "math_verify.py": (
        "verl-module",  # compute_score(model_output, ground_truth, timeout_score=0, timeout=30.0); spawns a pool
        [("The result is $\\frac{2}{4}$", "\\frac{1}{2}", 1.0), ("The result is $3$", "\\frac{1}{2}", 0.0)],
    ),
    "search_r1_like_qa_em.py": (
        "verl",  # ground truth {"target": [...]}
        [("<answer>Paris</answer>", {"target": ["Paris"]}, 1.0), ("<answer>Rome</answer>", {"target": ["Paris"]}, 0.0)],
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_verl_reward_file_runs_unchanged(name: str) -> None:
    path = verl_reward_dir() / name
    assert path.is_file(), path
    style, cases = CASES[name]
    samples = [
        RewardSample(response=r, prompt="p", ground_truth=gt, data_source="hiyouga/geometry3k") for r, gt, _ in cases
    ]
    with RewardManager(RewardConfig(), CustomRewardFunctionConfig(path=str(path), name="compute_score")) as rm:
        assert rm.scorer.describe().split("(")[1].startswith(style), rm.scorer.describe()
        out = rm.score(samples)
    assert out.errors == [None] * len(cases), out.metrics
    assert out.scores == pytest.approx([expected for _, _, expected in cases])


def test_rlla_reward_gets_extra_info_by_keyword() -> None:
    """rlla.py's ``compute_score(data_source, solution_str, ground_truth, extra_info, step=0)`` reads
    ``extra_info['experiment_name']``: it only works when extra_info reaches it by name."""
    path = verl_reward_dir() / "rlla.py"
    truth = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    response = f"<think>need the weather</think>\n{truth}"
    with RewardManager(RewardConfig(), CustomRewardFunctionConfig(path=str(path), name="compute_score")) as rm:
        good, bad = rm.score(
            [
                RewardSample(
                    response=response,
                    prompt="p",
                    ground_truth=truth,
                    data_source="rlla",
                    extra_info={"experiment_name": "qwen_tools"},
                ),
                RewardSample(
                    response="<think>no</think>\nIt is sunny.",
                    prompt="p",
                    ground_truth=truth,
                    data_source="rlla",
                    extra_info={"experiment_name": "qwen_tools"},
                ),
            ]
        ).scores
    assert good > bad
