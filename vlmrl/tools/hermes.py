"""The hermes tool-calling format, as Qwen2.5's chat template renders it (verl's ``multi_turn.format=hermes``).

- the tools' signatures go into the system message (:func:`system_prompt`);
- the policy calls a tool with ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` (:func:`parse`);
- results come back as one user turn of ``<tool_response>`` blocks (:func:`tool_turn_pieces`), with a vision placeholder
  per returned image.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from vlmrl.models.qwen_vl import IMAGE_PAD, VISION_END, VISION_START

FORMATS = ("hermes",)

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

TOOLS_INTRO = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_OUTRO = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>"
)


@dataclass
class ToolCall:
    """One call the policy wrote: the tool's name and its arguments, or why it could not be read."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    """Set when the block was not a valid call (bad JSON, no name, arguments not an object): the tool is not run and
    the policy reads this message as the result."""


def system_prompt(tools: list[dict[str, Any]], system: str = "You are a helpful assistant.") -> str:
    """The system message text listing ``tools`` (OpenAI function schemas), as Qwen2.5's template writes it."""
    lines = "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools)
    return system + TOOLS_INTRO + lines + TOOLS_OUTRO


def parse(text: str) -> list[ToolCall]:
    """The tool calls in a generated turn, in order. A block that is not a JSON object with a string ``name`` and
    object ``arguments`` becomes a call with ``error`` set (the policy is told what was wrong)."""
    calls = []
    for m in _CALL.finditer(text):
        body = m.group(1).strip()
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as e:
            calls.append(ToolCall("", error=f"invalid tool call JSON ({e.msg} at char {e.pos})"))
            continue
        except (ValueError, RecursionError) as e:  # a number too long to convert, nesting too deep
            why = "nested too deeply" if isinstance(e, RecursionError) else str(e)[:200]
            calls.append(ToolCall("", error=f"invalid tool call JSON ({why})"))
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
            calls.append(ToolCall("", error='a tool call needs {"name": <string>, "arguments": {...}}'))
            continue
        args = obj.get("arguments", {})
        if isinstance(args, str):  # some models write the arguments as a JSON string
            try:
                args = json.loads(args)
            except (ValueError, RecursionError):
                pass
        if not isinstance(args, dict):
            calls.append(ToolCall(obj["name"], error=f"the arguments of {obj['name']!r} must be a JSON object"))
            continue
        calls.append(ToolCall(obj["name"], args))
    return calls


def tool_turn_pieces(results: list[tuple[str, int]]) -> list[tuple[str, bool]]:
    """The text that follows a policy turn ending in ``<|im_end|>``, as (text, is_tool_text) pieces: one user turn
    holding a ``<tool_response>`` per (result text, number of images) and then the next assistant turn's header. Each
    image is one ``<|vision_start|><|image_pad|><|vision_end|>`` (the engine expands the pad). The tools' own text
    is marked so it is tokenised without special tokens: a tool that echoes ``<|image_pad|>`` (or ``<|im_end|>``)
    adds characters, never a pad or a turn boundary."""
    pieces: list[tuple[str, bool]] = [("\n<|im_start|>user", False)]
    for text, n_images in results:
        pieces.append(("\n<tool_response>\n" + (VISION_START + IMAGE_PAD + VISION_END) * n_images, False))
        pieces.append((text, True))
        pieces.append(("\n</tool_response>", False))
    pieces.append(("<|im_end|>\n<|im_start|>assistant\n", False))
    return pieces


def tool_turn_text(results: list[tuple[str, int]]) -> str:
    """:func:`tool_turn_pieces` as one string (what a chat template renders)."""
    return "".join(text for text, _ in tool_turn_pieces(results))
