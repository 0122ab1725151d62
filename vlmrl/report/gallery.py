"""Validation gallery: one self-contained HTML page of sample generations (images inlined, no external assets)."""

from __future__ import annotations

import base64
import io
import json
import math
import os
from html import escape
from pathlib import Path
from typing import Any

from PIL import Image

from vlmrl.batch import RewardSample, Trajectory, Video

_THUMB = 256  # max side of an inlined image, pixels
_FRAME = 128  # max side of an inlined video frame
_DASH = "\u2013"  # shown for NaN (a component that does not apply)

_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;background:#fafafa;color:#222}
.card{background:#fff;border:1px solid #ddd;border-radius:6px;padding:1em;margin:1em 0}
.card img{max-width:256px;max-height:256px;margin:0 .5em .5em 0;border:1px solid #ccc}
pre{white-space:pre-wrap;word-break:break-word;background:#f3f3f3;padding:.5em;margin:.2em 0 .8em}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2em .6em;text-align:left}
.meta{color:#555}
.turn{border-left:3px solid #88a;padding-left:.6em;margin:.4em 0}.turn.tool{border-color:#a86}
.turn .meta,.video .meta{display:block}
.frame{display:inline-block;margin:0 .3em .3em 0;text-align:center}.frame img{max-width:128px;margin:0}
.frame figcaption{font-size:.8em;color:#555}
"""


def _fmt(x: float) -> str:
    """A score for display: 4 decimals, ``–`` for NaN / missing."""
    return _DASH if x is None or math.isnan(x) else f"{x:.4f}"


def _mean(xs: list[float]) -> float:
    """Mean of the non-NaN values (NaN when there are none)."""
    vals = [x for x in xs if not math.isnan(x)]
    return math.fsum(vals) / len(vals) if vals else float("nan")


def _img_tag(im: Image.Image, side: int = _THUMB) -> str:
    """An ``<img>`` with the image as a base64 data URI, downscaled so its longer side is at most ``side``."""
    im = im.copy()
    im.thumbnail((side, side))
    buf = io.BytesIO()
    if im.mode in ("RGB", "L"):
        im.save(buf, format="JPEG", quality=85)
        mime = "jpeg"
    else:
        im.save(buf, format="PNG")
        mime = "png"
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f'<img src="data:image/{mime};base64,{data}" width="{im.width}" height="{im.height}" alt="image">'


def _text(x: Any) -> str:
    """Any value as escaped display text (non-strings as JSON, falling back to ``str``)."""
    if not isinstance(x, str):
        x = json.dumps(x, ensure_ascii=False, default=str)
    return escape(x)


def videos_html(videos: list[Video]) -> str:
    """Each video as a strip of its sampled frames (what the model saw), each captioned with its time in seconds."""
    parts = []
    for k, v in enumerate(videos):
        frames = "".join(
            f"<figure class='frame'>{_img_tag(im, _FRAME)}<figcaption>{t:.2f} s</figcaption></figure>"
            for im, t in zip(v.frames, v.timestamps)
        )
        parts.append(
            f"<div class='video'><span class='meta'>video {k + 1}: {len(v.frames)} frames at "
            f"{v.sample_fps:g} fps</span><div>{frames}</div></div>"
        )
    return "".join(parts)


def turns_html(traj: Trajectory) -> str:
    """A multi-turn sample's response turn by turn: each policy turn, and each tool turn with the images the tools
    returned in it (the calls of policy turn k answer in the tool turn that follows it)."""
    parts = []
    images = iter(traj.images)
    assistant = -1
    for role, text in traj.turn_texts:
        shown = ""
        if role == "assistant":
            assistant += 1
        else:
            n = sum(c.images for c in traj.calls if c.turn == assistant and c.error is None)
            shown = "".join(_img_tag(im) for im in (next(images, None) for _ in range(n)) if im is not None)
        label = f"turn {assistant + 1}: policy" if role == "assistant" else "tool"
        parts.append(
            f"<div class='turn {escape(role)}'><span class='meta'>{label}</span>{shown}<pre>{_text(text)}</pre></div>"
        )
    return "".join(parts)


def reward_model_html(s: RewardSample) -> str:
    """The reward model's part of a card: its score (or why it has none) and a judge's verdict."""
    rm_score, rm_text, rm_error = s.rm_score, s.rm_text, s.rm_error
    if rm_score is None and rm_text is None and rm_error is None:
        return ""
    out = f"<b>reward model</b> <span class='meta'>score {_fmt(rm_score) if rm_score is not None else '–'}</span>"
    if rm_text is not None:
        out += f"<b>judge's verdict</b><pre>{_text(rm_text)}</pre>"
    if rm_error:
        out += f"<pre class='meta'>{_text(rm_error)}</pre>"
    return out


def write_gallery(
    path: str | Path,
    step: int,
    samples: list[RewardSample],
    scores: list[float],
    components: dict[str, list[float]],
    limit: int = 16,
    summary: list[tuple[str, float]] | None = None,
) -> Path:
    """Write an HTML gallery of validation samples to ``path`` (atomically) and return the path.

    The header summarises all ``samples`` (count, mean score overall and per data_source); cards are drawn for
    the first ``limit`` of them: images, video frames with their times, prompt, response (turn by turn, with the
    tools' images, for multi-turn samples), ground truth, the reward model's score and a judge's verdict (when a
    reward model ran), data_source, total score and every reward component (NaN,
    i.e. "does not apply", shown as ``–``). All sample text is HTML-escaped.
    ``scores[i]`` and ``components[name][i]`` belong to ``samples[i]``. ``summary`` — (data_source, score) of every
    validation sample — replaces ``samples`` in the header when only the shown samples were kept in memory.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    scores = [float(s) for s in scores[: len(samples)]]
    every = summary if summary is not None else [(s.data_source, sc) for s, sc in zip(samples, scores)]
    by_src: dict[str, list[float]] = {}
    for src, sc in every:
        by_src.setdefault(src, []).append(float(sc))
    src_rows = "".join(
        f"<tr><td>{escape(src)}</td><td>{len(v)}</td><td>{_fmt(_mean(v))}</td></tr>"
        for src, v in sorted(by_src.items())
    )
    shown = samples[: max(0, limit)]
    parts = [
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>Validation step {step}</title>"
        f"<style>{_CSS}</style></head><body>",
        f"<h1>Validation gallery \u2014 step {step}</h1>",
        f"<p class='meta'>samples: {len(every)} (showing {len(shown)}) \u00b7 "
        f"mean score: <b class='mean'>{_fmt(_mean([sc for _, sc in every]))}</b></p>",
        f"<table><tr><th>data_source</th><th>n</th><th>mean score</th></tr>{src_rows}</table>",
    ]
    for i, s in enumerate(shown):
        comp_rows = "".join(
            f"<tr><td>{escape(k)}</td><td>{_fmt(v[i] if i < len(v) else float('nan'))}</td></tr>"
            for k, v in sorted(components.items())
        )
        score = scores[i] if i < len(scores) else float("nan")
        response = turns_html(s.trajectory) if s.trajectory is not None else f"<pre>{_text(s.response)}</pre>"
        parts.append(
            f"<div class='card'><h3>#{i} \u00b7 {escape(s.data_source)} \u00b7 score {_fmt(score)}</h3>"
            f"<div>{''.join(_img_tag(im) for im in s.images)}</div>{videos_html(s.videos)}"
            f"<b>prompt</b><pre>{_text(s.prompt)}</pre>"
            f"<b>response</b> <span class='meta'>({s.response_length} tokens, {escape(s.finish_reason)})</span>"
            f"{response}"
            f"<b>ground truth</b><pre>{_text(s.ground_truth)}</pre>{reward_model_html(s)}"
            f"<table><tr><th>component</th><th>value</th></tr>{comp_rows}</table></div>"
        )
    parts.append("</body></html>\n")
    return write_atomically(path, "".join(parts))


def write_atomically(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file renamed over it: a reader (a browser, the report) sees
    the old page or the new one, never half of it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
