"""The scripted policy of the zoom demo's warm start (``python -m vlmrl.testing.warm_start --teacher
examples/tool_zoom/teacher.py:write_turn``), a cold start like those real tool-use RL runs begin with: how an
``image_zoom`` call is written (on the centre of the image, where the question points), and, after a zoom, the
square's colour (the record's answer, which the zoomed view shows). It calls the tool on one first turn in four and
answers the other three at once with a colour drawn at random (the small image does not show it). So the
warm-started policy zooms a quarter of the time and answers near chance: that zooming first pays, for every record,
is what reinforcement learning finds."""

from __future__ import annotations

import json
import random
from typing import Any

COLOURS = ("red", "green", "blue")
CENTRE = [53, 53, 59, 59]
"""The box the teacher zooms into: the centre of the image in the pixels the tiny model sees (112 x 112)."""
CALL_SHARE = 0.25
"""The share of first turns that call the tool."""


def write_turn(turn: int, conversation: str, sample: Any, rng: random.Random) -> str:
    """The teacher's assistant turn ``turn`` (0 = the first)."""
    if turn == 0:
        if rng.random() < CALL_SHARE:
            return (
                "<tool_call>\n"
                + json.dumps({"name": "image_zoom", "arguments": {"bbox_2d": CENTRE}})
                + "\n</tool_call>"
            )
        return rng.choice(COLOURS)
    return str(sample.ground_truth)  # after the zoom: the colour it shows
