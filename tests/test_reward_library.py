"""The reward library (rewards/, installed as vlmrl.rewards) on hand-made and hostile cases."""

from __future__ import annotations

import json
import math
import random
import re
import time

import pytest
from PIL import Image, ImageDraw

from vlmrl.batch import RewardSample
from vlmrl.rewards import accuracy, iou, length, recipes, similarity, synthetic, visual
from vlmrl.rewards import format as fmt

HUGE = "x" * 1_000_000
COLOUR_CHOICES = ["red", "green", "blue", "yellow"]
POSITIONS = ["left", "right", "top", "bottom", "top-left", "top-right", "center"]


def S(response: str, gt: object = "", ds: str = "test", **kw: object) -> RewardSample:
    return RewardSample(response=response, prompt="p", ground_truth=gt, data_source=ds, **kw)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------------------ format

VERL_GEO3K = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)


@pytest.mark.parametrize(
    "text",
    [
        "<think>a</think> so \\boxed{3}",
        "<think>a</think>\\boxed{3} trailing",
        " <think>a</think> \\boxed{3}",
        "<think>a \\boxed{3}",
        "\\boxed{3}<think>a</think>",
        "<think></think>\\boxed{}",
        "<think>a</think> \\boxed{3",
        "<think>\n</think>\n\\boxed{x}</think>",
        "",
    ],
)
def test_think_boxed_matches_verl_regex(text: str) -> None:
    assert fmt.has_think_boxed(text) == bool(VERL_GEO3K.fullmatch(text))


def test_extract_boxed_nested_last_and_malformed() -> None:
    assert fmt.extract_boxed("\\boxed{1} then \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert fmt.extract_boxed("x \\fbox{7}") == "7"
    assert fmt.extract_boxed("\\boxed{3") is None
    assert fmt.extract_boxed("\\boxed{2} and \\boxed{3") == "2"
    assert fmt.extract_boxed("no box") is None


def test_tags_and_answer_span() -> None:
    assert fmt.extract_tag("<answer> B </answer>", "answer") == "B"
    assert fmt.extract_tag("<answer>B", "answer") is None
    assert fmt.strip_think("<think>red?</think> blue") == "blue"
    assert fmt.strip_think("<think>never closed red") == ""
    assert fmt.answer_span("<think>t</think><answer>A</answer>") == "A"
    assert fmt.answer_span("<think>t</think> it is \\boxed{5}") == "5"
    assert fmt.answer_span("plain text") == "plain text"


def test_format_styles() -> None:
    good = "<think>reason</think>\n<answer>B</answer>"
    assert fmt.format_reward(S(good), style="think_answer") == 1.0
    assert fmt.format_reward(S(good + " extra"), style="think_answer") == 0.0
    assert fmt.format_reward(S(good + "<answer>C</answer>"), style="think_answer") == 0.0
    assert fmt.format_reward(S("<think>r</think> x <answer>B</answer>"), style="think_answer") == 0.0
    assert fmt.format_reward(S("<answer></answer>"), style="answer") == 0.0
    assert fmt.format_reward(S("\\boxed{4}"), style="boxed") == 1.0
    assert fmt.format_reward(S("<think>r</think>\\boxed{4}")) == 1.0
    assert fmt.format_reward(S("")) == 0.0
    with pytest.raises(ValueError, match="unknown format style"):
        fmt.format_reward(S("x"), style="xml")


def test_format_huge_and_unicode_are_fast() -> None:
    t0 = time.perf_counter()
    hostile = "<think>" + "</think>" * 100_000 + "\\boxed{" * 50_000
    assert fmt.has_think_boxed(hostile) is False
    assert fmt.has_think_boxed("<think>" + HUGE + "</think>\\boxed{1}") is True
    assert fmt.extract_boxed("\\boxed{" * 10_000) is None
    assert fmt.format_reward(S("<think>思考 🤔</think>\\boxed{答案}")) == 1.0
    assert time.perf_counter() - t0 < 2.0


# ---------------------------------------------------------------------------------------------------------- accuracy


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("so \\boxed{2\\sqrt{3}}", "2\\sqrt{3}", 1.0),
        ("\\boxed{2.5}", "\\frac{5}{2}", 1.0),
        ("\\boxed{60^\\circ}", "60", 1.0),
        ("\\boxed{x+1}", "1+x", 1.0),
        ("\\boxed{4}", "3", 0.0),
        ("", "3", 0.0),
        ("答案是 \\boxed{5}", "5", 1.0),
        ("\\boxed{" + "9" * 2000 + "}", "9", 0.0),
    ],
)
def test_math_reward(response: str, truth: str, expected: float) -> None:
    assert accuracy.math_reward(S(response, truth)) == expected


def test_math_reward_huge_response_is_bounded() -> None:
    t0 = time.perf_counter()
    assert accuracy.math_reward(S(HUGE + " \\boxed{7}", "7")) == 1.0
    assert accuracy.math_reward(S(HUGE, "7")) == 0.0
    assert time.perf_counter() - t0 < 5.0


def test_choice_reward() -> None:
    assert accuracy.choice_reward(S("<answer>(B)</answer>", "B")) == 1.0
    assert accuracy.choice_reward(S("The answer is B.", "B")) == 1.0
    assert accuracy.choice_reward(S("\\boxed{C}", "B")) == 0.0
    assert accuracy.choice_reward(S("A or B", "B")) == 0.0  # hedging between letters scores nothing
    assert accuracy.choice_reward(S("", "B")) == 0.0
    with_text = S("<answer>B</answer>", "blue", extra_info={"choices": ["red", "blue"]})
    assert accuracy.choice_reward(with_text) == 1.0
    with pytest.raises(ValueError, match="not an option letter"):
        accuracy.choice_reward(S("B", "banana"))


def test_number_reward_and_parse() -> None:
    assert accuracy.parse_number("total: 1,234.5 units") == 1234.5
    assert accuracy.parse_number("3/4") == 0.75
    assert accuracy.parse_number("1e999") is None  # inf is not a number here
    assert accuracy.parse_number("0/0") is None
    assert accuracy.parse_number("none") is None
    assert accuracy.number_reward(S("<answer>12.00001</answer>", "12")) == 1.0
    assert accuracy.number_reward(S("<answer>12.1</answer>", "12")) == 0.0
    assert accuracy.number_reward(S("<answer>12.1</answer>", "12"), rel_tol=0.05) == 1.0
    assert accuracy.number_reward(S("nan", "12")) == 0.0


def test_accuracy_auto_modes() -> None:
    assert accuracy.accuracy_reward(S("\\boxed{B}", "B")) == 1.0
    assert accuracy.accuracy_reward(S("\\boxed{0.5}", "0.5")) == 1.0
    assert accuracy.accuracy_reward(S("\\boxed{\\frac{1}{2}}", "0.5")) == 1.0  # number with math fallback
    assert accuracy.accuracy_reward(S("\\boxed{\\pi}", "\\pi")) == 1.0
    assert accuracy.accuracy_reward(S("<answer>Paris.</answer>", "paris"), mode="exact") == 1.0
    with pytest.raises(ValueError, match="unknown accuracy mode"):
        accuracy.accuracy_reward(S("x", "y"), mode="fuzzy")


# --------------------------------------------------------------------------------------------------------------- iou


def test_box_iou_values_and_malformed() -> None:
    assert iou.box_iou((0, 0, 10, 10), (5, 0, 15, 10)) == pytest.approx(1 / 3)
    assert iou.box_iou((0, 0, 10, 10), (0, 0, 10, 10)) == 1.0
    assert iou.box_iou((0, 0, 10, 10), (20, 20, 30, 30)) == 0.0
    assert iou.box_iou((10, 0, 0, 10), (0, 0, 10, 10)) == 0.0  # x2 < x1
    assert iou.box_iou((0, 0, 0, 10), (0, 0, 10, 10)) == 0.0  # zero area
    assert iou.box_iou((0, 0, math.nan, 10), (0, 0, 10, 10)) == 0.0
    big = (0.0, 0.0, 1e308, 1e308)
    value = iou.box_iou(big, big)
    assert math.isfinite(value) and 0.0 <= value <= 1.0


def test_iou_reward_maps_resized_to_original() -> None:
    resp = '<answer>{"bbox_2d": [10, 20, 50, 60], "label": "cat"}</answer>'
    sample = S(resp, "[20, 40, 100, 120]", image_scales=[(0.5, 0.5)])
    assert iou.iou_reward(sample) == pytest.approx(1.0)
    assert iou.iou_reward(sample, coords="original") == pytest.approx(iou.box_iou((10, 20, 50, 60), (20, 40, 100, 120)))
    wide = S("[10, 20, 50, 60]", [20, 20, 100, 60], image_scales=[(0.5, 1.0)])
    assert iou.iou_reward(wide) == pytest.approx(iou.box_iou((20, 20, 100, 60), (20, 20, 100, 60)))


def test_iou_reward_multi_box_and_threshold() -> None:
    truth = json.dumps([[0, 0, 10, 10], [20, 20, 30, 30]])
    both = S("[0,0,10,10] [20,20,30,30]", truth)
    assert iou.iou_reward(both, coords="original") == 1.0
    one = S("[0,0,10,10]", truth)
    assert iou.iou_reward(one, coords="original") == 0.5
    spam = S("[0,0,10,10] " + "[50,50,60,60] " * 3, "[0,0,10,10]")
    assert iou.iou_reward(spam, coords="original") == 0.25  # extra boxes cost
    half = S("[5,0,15,10]", "[0,0,10,10]")
    assert iou.iou_reward(half, coords="original", threshold=0.5) == 0.0
    assert iou.iou_reward(half, coords="original", threshold=0.3) == 1.0


def test_iou_hostile_inputs() -> None:
    assert iou.iou_reward(S("", "[0,0,10,10]")) == 0.0
    assert iou.iou_reward(S("[1, 2, 3]", "[0,0,10,10]")) == 0.0
    assert iou.iou_reward(S("[nan, 0, 10, 10]", "[0,0,10,10]")) == 0.0
    assert iou.iou_reward(S("[1e400, 0, 1e401, 10]", "[0,0,10,10]")) == 0.0
    t0 = time.perf_counter()
    assert iou.iou_reward(S("[1, 2, 3, 4] " * 100_000, "[1,2,3,4]"), coords="original") == pytest.approx(0.01)
    assert time.perf_counter() - t0 < 3.0
    with pytest.raises(ValueError, match="no box"):
        iou.iou_reward(S("[0,0,1,1]", "a cat"))
    with pytest.raises(ValueError, match="must be positive"):
        iou.iou_reward(S("[0,0,1,1]", "[0,0,1,1]", image_scales=[(0.0, 1.0)]))


# -------------------------------------------------------------------------------------------------------- similarity


def _lcs_dp(a: list[str], b: list[str]) -> int:
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def test_bit_parallel_lcs_matches_dynamic_programming() -> None:
    rng = random.Random(0)
    for _ in range(200):
        a = [rng.choice("abcd") for _ in range(rng.randint(0, 12))]
        b = [rng.choice("abcd") for _ in range(rng.randint(0, 12))]
        assert similarity.lcs_length(a, b) == _lcs_dp(a, b)


def test_similarity_modes() -> None:
    assert similarity.exact_match("The Eiffel Tower!", "eiffel tower") == 1.0
    assert similarity.token_f1("a red big circle", "the red circle") == pytest.approx(0.8)
    # normalised: "red circle on left" vs "circle on left": LCS 3, precision 3/4, recall 1
    assert similarity.rouge_l("red circle on the left", "the circle on the left") == pytest.approx(6 / 7)
    assert similarity.rouge_l("left on circle", "circle on left") == pytest.approx(1 / 3)
    sample = S("<think>hmm</think><answer>a red circle</answer>", ["blue square", "red circle"])
    assert similarity.similarity_reward(sample, mode="exact") == 1.0
    assert similarity.similarity_reward(S("", "x"), mode="f1") == 0.0
    assert similarity.similarity_reward(S("ÉCOLE", "école"), mode="exact") == 1.0
    with pytest.raises(ValueError, match="unknown similarity mode"):
        similarity.similarity_reward(sample, mode="bleu")


def test_similarity_huge_response_is_fast() -> None:
    t0 = time.perf_counter()
    text = "word " * 200_000 + "red circle"
    value = similarity.similarity_reward(S(text, "red circle"), mode="rouge_l")
    assert 0.0 < value < 0.001
    assert time.perf_counter() - t0 < 3.0


# ------------------------------------------------------------------------------------------------------------ length


def test_length_penalty_dapo() -> None:
    def lp(n: int, **kw: object) -> float:
        return length.length_penalty(S("", response_length=n, max_response_length=100), **kw)  # type: ignore[arg-type]

    assert lp(80) == 0.0  # default buffer = 20
    assert lp(90) == pytest.approx(-0.5)
    assert lp(100) == pytest.approx(-1.0)
    assert lp(150) == pytest.approx(-1.0)
    assert lp(95, buffer_len=10, penalty_factor=0.5) == pytest.approx(-0.25)
    with pytest.raises(ValueError, match="length limit"):
        length.length_penalty(S("", response_length=10))


# --------------------------------------------------------------------------------------------------------- synthetic


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("red", "red", 1.0),
        ("It's Red.", "red", 1.0),
        ("<think>red or blue?</think><answer>blue</answer>", "blue", 1.0),
        ("<think>red or blue?</think>", "red", 0.0),
        ("red or blue", "red", 0.0),
        ("red green blue yellow", "red", 0.0),
        ("blue", "red", 0.0),
        ("reddish", "red", 0.0),
        ("", "red", 0.0),
        ("🔴 rouge, 红色", "red", 0.0),
    ],
)
def test_synthetic_colour(response: str, truth: str, expected: float) -> None:
    sample = S(response, truth, "synthetic/colour", extra_info={"choices": COLOUR_CHOICES})
    assert synthetic.synthetic_reward(sample) == expected


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("top-left", "top-left", 1.0),
        ("in the top left corner", "top-left", 1.0),
        ("top-left", "left", 0.0),
        ("left", "left", 1.0),
        ("left, no, right", "left", 0.0),
        ("Top_Left", "top-left", 1.0),
    ],
)
def test_synthetic_position_longest_label_wins(response: str, truth: str, expected: float) -> None:
    sample = S(response, truth, "synthetic/position", extra_info={"choices": POSITIONS})
    assert synthetic.synthetic_reward(sample) == expected


def test_synthetic_shape_plural_count_and_grounding() -> None:
    shapes = {"choices": ["circle", "square", "triangle"]}
    assert synthetic.synthetic_reward(S("two circles", "circle", "synthetic/shape", extra_info=shapes)) == 1.0
    assert synthetic.synthetic_reward(S("There are 3 shapes.", "3", "synthetic/count")) == 1.0
    assert synthetic.synthetic_reward(S("three", "3", "synthetic/count")) == 1.0
    assert synthetic.synthetic_reward(S("2 red and 3 blue", "3", "synthetic/count")) == 0.0
    assert synthetic.synthetic_reward(S("3.5", "3", "synthetic/count")) == 0.0
    assert synthetic.synthetic_reward(S("none", "3", "synthetic/count")) == 0.0
    listed = {"choices": ["1", "2", "3", "4"]}  # the generator lists candidate counts too: still first-integer rules
    assert synthetic.synthetic_reward(S("three, not 4", "3", "synthetic/count", extra_info=listed)) == 1.0
    assert synthetic.synthetic_reward(S("4 or 3", "3", "synthetic/count", extra_info=listed)) == 0.0
    np = pytest.importorskip("numpy")
    as_array = {"choices": np.array(["red", "blue"])}
    assert synthetic.synthetic_reward(S("blue", "blue", "synthetic/colour", extra_info=as_array)) == 1.0
    truth = "[40, 40, 120, 100]"
    g = S("The box is [20, 20, 60, 50] I think [0, 0, 1, 1]", truth, "synthetic/grounding", image_scales=[(0.5, 0.5)])
    assert synthetic.synthetic_reward(g) == pytest.approx(1.0)
    g2 = S("[20, 20, 60, 50]", truth, "synthetic/grounding", image_scales=[(1.0, 1.0)])
    assert synthetic.synthetic_reward(g2) == pytest.approx(iou.box_iou((20, 20, 60, 50), (40, 40, 120, 100)))
    assert synthetic.synthetic_reward(S("[60, 50, 20, 20]", truth, "synthetic/grounding")) == 0.0
    assert synthetic.synthetic_reward(S("no box", truth, "synthetic/grounding")) == 0.0


def test_synthetic_is_fast_on_batches_and_huge_text() -> None:
    sample = S("I am sure it is the red one. " * 3, "red", "synthetic/colour", extra_info={"choices": COLOUR_CHOICES})
    t0 = time.perf_counter()
    for _ in range(1280):
        synthetic.synthetic_reward(sample)
    assert (time.perf_counter() - t0) / 10 < 0.05  # per 128 samples
    huge = S(HUGE + " red", "red", "synthetic/colour", extra_info={"choices": COLOUR_CHOICES})
    assert synthetic.synthetic_reward(huge) == 1.0


# ------------------------------------------------------------------------------------------------------------ visual


@pytest.mark.parametrize(
    ("rgb", "name"),
    [
        ((255, 0, 0), "red"),
        ((0, 128, 0), "green"),
        ((0, 255, 0), "green"),
        ((0, 0, 255), "blue"),
        ((255, 255, 0), "yellow"),
        ((255, 165, 0), "orange"),
        ((128, 0, 128), "purple"),
        ((255, 192, 203), "pink"),
        ((165, 42, 42), "brown"),
        ((0, 0, 0), "black"),
        ((255, 255, 255), "white"),
        ((128, 128, 128), "gray"),
        ((0, 255, 255), "cyan"),
    ],
)
def test_colour_name(rgb: tuple[int, int, int], name: str) -> None:
    assert visual.colour_name(rgb) == name


OBJECTS = [
    {"colour": "red", "shape": "circle", "box": [10, 10, 50, 50]},
    {"colour": "blue", "shape": "square", "box": [60, 60, 90, 90]},
]


def test_visual_consistency_with_annotations() -> None:
    def vc(text: str, **kw: object) -> float:
        return visual.visual_consistency(S(text, extra_info={"objects": OBJECTS}), **kw)  # type: ignore[arg-type]

    assert vc("A red circle and a blue square.") == 1.0
    assert vc("a blue circle") == 0.0  # the pair is wrong even though both words occur
    assert vc("Red!") == pytest.approx(2 * 1 * 0.5 / 1.5)
    assert vc("Red!", mode="precision") == 1.0
    assert vc("red red red red red circle", mode="recall") == 0.5
    assert vc("a green triangle and a red circle", mode="precision") == 0.5
    assert vc("") == 0.0
    assert vc(HUGE) == 0.0
    assert vc("a grey circle") == 0.0
    with pytest.raises(ValueError, match="unknown mode"):
        vc("red", mode="iou")


def _picture(scale: float = 1.0) -> tuple[Image.Image, list[tuple[float, float]]]:
    img = Image.new("RGB", (100, 100), "white")
    draw = ImageDraw.Draw(img)
    draw.ellipse((10, 10, 50, 50), fill=(0, 160, 0))
    draw.rectangle((60, 60, 90, 90), fill=(255, 200, 0))
    if scale != 1.0:
        img = img.resize((int(100 * scale), int(100 * scale)))
    return img, [(scale, scale)]


def test_visual_consistency_reads_colours_from_the_image() -> None:
    img, scales = _picture(scale=0.5)
    objects = [{"shape": "circle", "box": [10, 10, 50, 50]}, {"shape": "square", "box": [60, 60, 90, 90]}]
    sample = S("a green circle and a yellow square", extra_info={"objects": objects}, images=[img], image_scales=scales)
    assert visual.visual_consistency(sample) == 1.0
    swapped = S("a yellow circle", extra_info={"objects": objects}, images=[img], image_scales=scales)
    assert visual.visual_consistency(swapped) == 0.0


def test_visual_consistency_without_annotations_uses_palette() -> None:
    img, _ = _picture()
    assert visual.visual_consistency(S("green and yellow on white", images=[img])) == 1.0
    assert visual.visual_consistency(S("a purple thing and a green one", images=[img])) == 0.5
    with pytest.raises(ValueError, match="needs extra_info"):
        visual.visual_consistency(S("red"))


# ----------------------------------------------------------------------------------------------------------- recipes


def test_geo3k_recipe() -> None:
    good = recipes.geo3k(S("<think>t</think> \\boxed{3}", "3"))
    assert good == {"score": 1.0, "accuracy": 1.0, "format": 1.0}
    assert recipes.geo3k(S("\\boxed{3}", "3"))["score"] == pytest.approx(0.9)
    assert recipes.geo3k(S("\\boxed{3}", "3"), gate=True)["score"] == 0.0
    assert recipes.geo3k(S("<think>t</think> \\boxed{4}", "3"))["score"] == pytest.approx(0.1)
    assert recipes.geo3k(S("", "3"))["score"] == 0.0


def test_grounding_recipe_gates_iou_on_format() -> None:
    truth = "[20, 40, 100, 120]"
    good = S("<think>look</think><answer>[10, 20, 50, 60]</answer>", truth, image_scales=[(0.5, 0.5)])
    assert recipes.grounding(good) == pytest.approx({"score": 1.0, "iou": 1.0, "format": 1.0})
    bare = S("[10, 20, 50, 60]", truth, image_scales=[(0.5, 0.5)])
    out = recipes.grounding(bare)
    assert out["iou"] == pytest.approx(1.0) and out["format"] == 0.0 and out["score"] == 0.0
    assert recipes.grounding(bare, gate=False)["score"] == pytest.approx(0.9)
    broken = S("<think>x</think><answer>[50, 60, 10, 20]</answer>", truth)
    assert recipes.grounding(broken)["format"] == 0.0


def test_text_visual_recipe() -> None:
    sample = S("a red circle", "red circle", extra_info={"objects": OBJECTS})
    out = recipes.text_visual(sample)
    assert out["similarity"] == 1.0
    assert out["visual"] == pytest.approx(2 * 1 * 0.5 / 1.5)
    assert out["score"] == pytest.approx(0.7 * 1.0 + 0.3 * out["visual"])


@pytest.mark.parametrize(
    "recipe, components, samples",
    [
        (
            "geo3k",
            recipes.geo3k_components(),
            [
                ("<think>t</think> \\boxed{3}", "3"),
                ("\\boxed{3}", "3"),
                ("<think>t</think> \\boxed{4}", "3"),
                ("no answer", "3"),
            ],
        ),
        (
            "grounding",
            recipes.grounding_components(),
            [
                ("<think>l</think><answer>[10, 20, 50, 60]</answer>", "[20, 40, 100, 120]"),
                ("[10, 20, 50, 60]", "[20, 40, 100, 120]"),
                ("<answer>[0, 0, 5, 5]</answer>", "[20, 40, 100, 120]"),
            ],
        ),
        ("text_visual", recipes.text_visual_components(), [("a red circle", "red circle"), ("blue", "red circle")]),
    ],
)
def test_a_recipe_is_its_component_list_in_a_config(recipe, components, samples) -> None:
    """``reward.function=<recipe>`` and ``reward.components=<recipe>_components()`` score every sample the same,
    components included: the recipe is nothing but that composite."""
    from vlmrl.config import CustomRewardFunctionConfig, RewardConfig
    from vlmrl.scoring import RewardManager

    batch = [S(r, gt, image_scales=[(0.5, 0.5)], extra_info={"objects": OBJECTS}) for r, gt in samples]
    with RewardManager(RewardConfig(function=recipe, num_workers=0, timeout_s=0), CustomRewardFunctionConfig()) as rm:
        by_name = rm.score(batch)
    cfg = RewardConfig(components=components, num_workers=0, timeout_s=0)
    with RewardManager(cfg, CustomRewardFunctionConfig()) as rm:
        by_list = rm.score(batch)
    assert by_name.scores == by_list.scores
    assert by_name.components == by_list.components
    assert len(set(by_name.scores)) > 1  # the samples are told apart
