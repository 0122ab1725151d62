"""The validation gallery: a self-contained, escaped HTML page with images, scores and components."""

from __future__ import annotations

import re
from pathlib import Path

from PIL import Image

from vlmrl.batch import RewardSample
from vlmrl.report.gallery import write_gallery

NAN = float("nan")


def _samples() -> tuple[list[RewardSample], list[float], dict[str, list[float]]]:
    red = Image.new("RGB", (640, 320), (255, 0, 0))
    blue = Image.new("RGB", (32, 48), (0, 0, 255))
    rgba = Image.new("RGBA", (20, 20), (0, 255, 0, 128))
    samples = [
        RewardSample(
            response="<script>alert(1)</script> Größe ≈ 3 — 答案",
            prompt="What is <b>shown</b>?",
            ground_truth="3",
            data_source="geo",
            images=[red, blue],
        ),
        RewardSample(response="no image here", prompt="plain text prompt", ground_truth=[1, 2], data_source="text"),
        RewardSample(
            response="third sample response",
            prompt="p3",
            ground_truth={"box": [1, 2, 3, 4]},
            data_source="geo",
            images=[rgba],
        ),
    ]
    scores = [1.0, 0.25, 0.5]
    components = {"accuracy": [1.0, 0.0, 0.5], "iou": [0.875, NAN, 0.125]}
    return samples, scores, components


def _cards(html: str) -> list[str]:
    return html.split("<div class='card'>")[1:]


def test_gallery_full(tmp_path: Path):
    samples, scores, components = _samples()
    out = write_gallery(tmp_path / "g" / "step_000007.html", 7, samples, scores, components)
    assert out == tmp_path / "g" / "step_000007.html" and out.is_file()
    assert [p.name for p in out.parent.iterdir()] == [out.name]  # no temp file left behind
    html = out.read_text(encoding="utf-8")

    # escaping: the response's script tag and the prompt's <b> are shown as text, never as markup
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<script" not in html.lower()
    assert "What is &lt;b&gt;shown&lt;/b&gt;?" in html
    assert "Größe ≈ 3 — 答案" in html
    # self-contained: no external references
    assert "http://" not in html and "https://" not in html and 'src="data:' in html

    cards = _cards(html)
    assert len(cards) == 3
    # one inlined <img> per image: two, none, one
    assert [c.count("<img") for c in cards] == [2, 0, 1]
    assert [c.count('src="data:image/') for c in cards] == [2, 0, 1]
    assert html.count("<img") == 3
    assert "data:image/png;base64," in cards[2] and "data:image/jpeg;base64," in cards[0]
    # thumbnails are downscaled: the 640x320 image becomes 256x128, small ones keep their size
    assert 'width="256" height="128"' in cards[0] and 'width="32" height="48"' in cards[0]

    # per-sample text, score and components (NaN as a dash)
    assert "plain text prompt" in cards[1] and "no image here" in cards[1] and "[1, 2]" in cards[1]
    assert "{&quot;box&quot;: [1, 2, 3, 4]}" in cards[2]
    assert "score 1.0000" in cards[0] and "score 0.2500" in cards[1]
    assert "<td>iou</td><td>0.8750</td>" in cards[0]
    assert "<td>iou</td><td>\u2013</td>" in cards[1]
    assert "<td>accuracy</td><td>0.0000</td>" in cards[1]
    assert "\u2013" not in cards[0] and "\u2013" not in cards[2]
    assert "· geo ·" in cards[0] and "· text ·" in cards[1]

    # header: step, count, means overall and per data_source
    assert "step 7" in html
    assert "samples: 3 (showing 3)" in html
    assert re.search(r"<b class='mean'>([^<]*)</b>", html).group(1) == f"{(1.0 + 0.25 + 0.5) / 3:.4f}"
    rows = dict(
        (m[0], (int(m[1]), m[2])) for m in re.findall(r"<tr><td>(\w+)</td><td>(\d+)</td><td>([^<]*)</td>", html)
    )
    assert rows == {"geo": (2, "0.7500"), "text": (1, "0.2500")}


def test_gallery_limit_and_overwrite(tmp_path: Path):
    samples, scores, components = _samples()
    path = tmp_path / "step.html"
    path.write_text("old contents")
    write_gallery(str(path), 3, samples, scores, components, limit=1)
    html = path.read_text(encoding="utf-8")
    assert "old contents" not in html
    cards = _cards(html)
    assert len(cards) == 1
    assert html.count("<img") == 2  # only the first sample's two images
    assert "no image here" not in html and "third sample response" not in html
    assert "samples: 3 (showing 1)" in html  # header still summarises everything passed
    assert "step 3" in html


def test_a_multi_turn_sample_is_shown_turn_by_turn_with_the_tools_images(tmp_path: Path):
    """Each policy turn and each tool turn is its own block; a tool turn shows the images its calls returned (the
    failed call's turn none, and a call whose turn did not fit the budget adds nothing)."""
    from vlmrl.batch import ToolCallRecord, Trajectory

    zoom_a, zoom_b = Image.new("RGB", (56, 28), (0, 200, 0)), Image.new("RGB", (28, 56), (200, 0, 200))
    traj = Trajectory(
        response_mask=[1, 0, 1],
        images=[zoom_a, zoom_b],
        calls=[
            ToolCallRecord("image_zoom", {"bbox_2d": [0, 0, 9, 9]}, "Zoomed in.", images=1, turn=0),
            ToolCallRecord("image_zoom", {}, "Error: bbox_2d must be ...", error="exception: bbox", turn=1),
            ToolCallRecord("image_zoom", {"bbox_2d": [1, 1, 5, 5]}, "Zoomed in again.", images=1, turn=2),
            ToolCallRecord("image_zoom", {"bbox_2d": [2, 2, 5, 5]}, "", images=1, error="budget: ...", turn=3),
        ],
        assistant_turns=4,
        user_turns=3,
        turn_texts=[
            ("assistant", "<tool_call>one</tool_call>"),
            ("tool", "Zoomed in."),
            ("assistant", "<tool_call>bad</tool_call>"),
            ("tool", "Error: bbox_2d must be ..."),
            ("assistant", "<tool_call>two</tool_call>"),
            ("tool", "Zoomed in again."),
            ("assistant", "<tool_call>three</tool_call>"),
        ],
    )
    sample = RewardSample(response="everything", prompt="p", ground_truth="green", images=[zoom_b], trajectory=traj)
    html = write_gallery(tmp_path / "g.html", 1, [sample], [1.0], {}).read_text(encoding="utf-8")
    blocks = re.findall(r"<div class='turn (\w+)'><span class='meta'>([^<]*)</span>(.*?)</div>", html, re.S)
    assert [(role, label) for role, label, _ in blocks] == [
        ("assistant", "turn 1: policy"),
        ("tool", "tool"),
        ("assistant", "turn 2: policy"),
        ("tool", "tool"),
        ("assistant", "turn 3: policy"),
        ("tool", "tool"),
        ("assistant", "turn 4: policy"),
    ]
    assert [body.count("<img") for _, _, body in blocks] == [0, 1, 0, 0, 0, 1, 0]
    assert 'width="56" height="28"' in blocks[1][2] and 'width="28" height="56"' in blocks[5][2]
    assert "&lt;tool_call&gt;two&lt;/tool_call&gt;" in blocks[4][2] and "everything" not in html


def test_a_video_is_shown_as_its_frames_with_their_times(tmp_path: Path):
    from vlmrl.batch import Video

    frames = [Image.new("RGB", (224, 112), c) for c in ((255, 0, 0), (0, 255, 0), (0, 0, 255), (0, 0, 255))]
    video = Video(frames, [0.0, 0.5, 1.0, 1.5], 2.0)
    sample = RewardSample(response="blue", prompt="p", ground_truth="blue", videos=[video], images=[frames[0]])
    html = write_gallery(tmp_path / "g.html", 1, [sample], [1.0], {}).read_text(encoding="utf-8")
    strip = html.split("<div class='video'>")[1]
    assert "video 1: 4 frames at 2 fps" in strip and strip.count("<figure class='frame'>") == 4
    assert [f"{t:.2f} s" in strip for t in (0.0, 0.5, 1.0, 1.5)] == [True] * 4
    assert strip.count('width="128" height="64"') == 4  # frames downscaled to 128 px, the prompt image to 256
    assert html.count('width="224" height="112"') == 1 and html.count("<img") == 5
