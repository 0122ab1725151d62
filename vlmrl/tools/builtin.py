"""Built-in tools: ``image_zoom`` (crop a box of the image and show it larger), ``geo3k_check`` (verl's geo3k answer
checker) and ``calculator`` (arithmetic, evaluated without ``eval``)."""

from __future__ import annotations

import ast
import math
import operator
from typing import Any

from vlmrl.grading import grade_math
from vlmrl.models.qwen_vl import resized_size
from vlmrl.tools.base import BaseTool, ToolResponse

# ----------------------------------------------------------------------------------------------------- zoom


class ImageZoomTool(BaseTool):
    """Crop ``bbox_2d = [x1, y1, x2, y2]`` and return the crop enlarged to the model's pixel budget, so small details
    become several image tokens. The box is in pixels of the image as the model sees it (the resized image: the
    coordinates Qwen2.5-VL reads and writes); the crop is cut from the image as decoded, before resizing, when the
    record has it (multi-turn runs keep it), so zooming shows what resizing had blurred away. A box is clamped to
    the image; one smaller than ``min_size`` pixels (28, verl's MIN_DIMENSION) of the image it is cut from is grown
    around its centre. verl's ``ImageZoomInTool`` config and schema load as this tool."""

    default_schema = {
        "type": "function",
        "function": {
            "name": "image_zoom",
            "description": "Zoom in on a region of the image: crop the box [x1, y1, x2, y2] (pixels), show it larger.",
            "parameters": {
                "type": "object",
                "properties": {
                    "bbox_2d": {
                        "type": "array",
                        "items": {"type": "number"},
                        "minItems": 4,
                        "maxItems": 4,
                        "description": "[x1, y1, x2, y2]: top-left and bottom-right corners in pixels.",
                    },
                    "label": {"type": "string", "description": "What is in the box (optional)."},
                },
                "required": ["bbox_2d"],
            },
        },
    }

    def __init__(self, config: dict[str, Any] | None = None, tool_schema: Any = None) -> None:
        super().__init__(config, tool_schema)
        self.min_size = int(self.config.get("min_size", 28))
        self.max_aspect = float(self.config.get("max_aspect_ratio", 100))

    def box(self, bbox: Any, width: int, height: int) -> tuple[float, float, float, float]:
        """``bbox`` clamped to a ``width`` x ``height`` image; ValueError saying what is wrong."""
        if not isinstance(bbox, (list, tuple)) or len(bbox) != 4:
            raise ValueError("bbox_2d must be a list of 4 numbers [x1, y1, x2, y2]")
        try:
            x1, y1, x2, y2 = (float(v) for v in bbox)
        except (TypeError, ValueError):
            raise ValueError("bbox_2d must be a list of 4 numbers [x1, y1, x2, y2]") from None
        if not all(math.isfinite(v) for v in (x1, y1, x2, y2)):
            raise ValueError("bbox_2d holds a number that is not finite")
        x1, y1, x2, y2 = max(0.0, x1), max(0.0, y1), min(float(width), x2), min(float(height), y2)
        if not (x1 < x2 and y1 < y2):
            raise ValueError(f"bbox_2d {list(bbox)} is empty inside the {width}x{height} image")
        if max(x2 - x1, y2 - y1) / min(x2 - x1, y2 - y1) > self.max_aspect:
            raise ValueError(f"bbox_2d {list(bbox)} is too thin (aspect ratio above {self.max_aspect:g})")
        return x1, y1, x2, y2

    def crop_box(self, box: tuple[float, float, float, float], width: int, height: int) -> tuple[int, int, int, int]:
        """Whole pixels of ``box`` (on a ``width`` x ``height`` image), grown around its centre to ``min_size``."""
        x1, y1, x2, y2 = box
        w, h = x2 - x1, y2 - y1
        side = min(self.min_size, width, height)
        if w < side or h < side:  # grow around the centre, then shift inside the image
            cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
            w, h = max(w, side), max(h, side)
            x1 = min(max(0.0, cx - w / 2), width - w)
            y1 = min(max(0.0, cy - h / 2), height - h)
            x2, y2 = x1 + w, y1 + h
        return math.floor(x1), math.floor(y1), math.ceil(x2), math.ceil(y2)

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        """The enlarged crop and a line saying which region it shows (in the model's pixels)."""
        state = self.instance(instance_id)
        image = state.get("image")
        if image is None:
            raise ValueError("image_zoom: this record has no image to zoom into")
        source = state.get("source_image") or image
        x1, y1, x2, y2 = self.box(parameters.get("bbox_2d"), image.width, image.height)
        sx, sy = source.width / image.width, source.height / image.height
        crop = source.crop(self.crop_box((x1 * sx, y1 * sy, x2 * sx, y2 * sy), source.width, source.height))
        bounds = state.get("image_bounds")
        if bounds is not None:  # enlarge to the model's pixel budget (then the agent loop's resize is the identity)
            factor, lo, hi = bounds
            scale = math.sqrt(hi / float(crop.width * crop.height))
            w, h = resized_size(max(1, round(crop.width * scale)), max(1, round(crop.height * scale)), factor, lo, hi)
            crop = crop.resize((w, h), resample=3)  # bicubic, as qwen-vl-utils
        label = parameters.get("label")
        region = [round(v) for v in (x1, y1, x2, y2)]
        text = f"Zoomed in on the region {region}" + (f" ({label})." if label else ".")
        area = (x2 - x1) * (y2 - y1) / float(image.width * image.height)
        return ToolResponse(text=text, image=[crop]), 0.0, {"zoom_area_frac": area}


# ---------------------------------------------------------------------------------------------------- geo3k


class Geo3kCheckTool(BaseTool):
    """verl's geo3k checker (``verl.tools.geo3k_tool.Geo3kTool``): the policy submits ``answer``; the result says
    whether it equals the record's ground truth (math-verify); a step reward of -0.05 when a submission does not
    improve on the previous one (verl's penalty)."""

    default_schema = {
        "type": "function",
        "function": {
            "name": "calc_geo3k_reward",
            "description": "Check an answer to the geometry problem (1.0 if correct, 0.0 otherwise).",
            "parameters": {
                "type": "object",
                "properties": {"answer": {"type": "string", "description": "The answer, a number or expression."}},
                "required": ["answer"],
            },
        },
    }

    def __init__(self, config: dict[str, Any] | None = None, tool_schema: Any = None) -> None:
        super().__init__(config, tool_schema)
        self.best: dict[str, float] = {}

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        """Grade the answer against the ground truth."""
        answer = parameters.get("answer", "")
        answer = answer if isinstance(answer, str) else str(answer)
        state = self.instance(instance_id)
        state["answer"] = answer
        reward = await self.calc_reward(instance_id)
        previous = float(state.get("reward", 0.0))
        state["reward"] = reward
        return (
            ToolResponse(text=f"Current parsed answer={answer!r} reward={reward}"),
            (0.0 if reward > previous else -0.05),
            {"correct": reward},
        )

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        """1.0 when the submitted answer equals the ground truth (math-verify), else 0.0."""
        state = self.instance(instance_id)
        truth = state.get("ground_truth")
        if truth is None:
            raise ValueError("geo3k_check: no ground_truth (tools_kwargs.<name>.create_kwargs.ground_truth)")
        return 1.0 if grade_math(str(state.get("answer", "")), str(truth)) else 0.0


# ----------------------------------------------------------------------------------------------- calculator

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCS = {
    "sqrt": math.sqrt,
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
    "asin": math.asin,
    "acos": math.acos,
    "atan": math.atan,
    "log": math.log,
    "exp": math.exp,
    "abs": abs,
    "round": round,
    "floor": math.floor,
    "ceil": math.ceil,
    "radians": math.radians,
    "degrees": math.degrees,
}
_CONSTS = {"pi": math.pi, "e": math.e}
MAX_EXPRESSION = 200
MAX_MAGNITUDE = 1e100


def calculate(expression: str) -> float:
    """The value of an arithmetic expression (numbers, + - * / // % **, parentheses, ``sqrt`` ``sin`` ... ``pi``):
    parsed with ``ast`` and walked, never ``eval``-ed; ValueError for anything else or a result out of range."""
    if not isinstance(expression, str) or not expression.strip():
        raise ValueError("expression must be a non-empty string")
    if len(expression) > MAX_EXPRESSION:
        raise ValueError(f"expression longer than {MAX_EXPRESSION} characters")
    try:
        tree = ast.parse(expression.replace("^", "**"), mode="eval")
    except SyntaxError:
        raise ValueError(f"cannot parse {expression!r}") from None

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.Name) and node.id in _CONSTS:
            return _CONSTS[node.id]
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](ev(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and (abs(right) > 100 or abs(left) > 1e6):
                raise ValueError("exponent too large")
            out = _BINARY[type(node.op)](left, right)
            if isinstance(out, complex) or abs(out) > MAX_MAGNITUDE:
                raise ValueError("result out of range")
            return out
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _FUNCS
            and not node.keywords
            and 1 <= len(node.args) <= 2
        ):
            return _FUNCS[node.func.id](*(ev(a) for a in node.args))
        raise ValueError(f"unsupported element {type(node).__name__} in {expression!r}")

    try:
        value = ev(tree)
    except ZeroDivisionError:
        raise ValueError("division by zero") from None
    except (OverflowError, ValueError) as e:
        raise ValueError(str(e) or "math domain error") from None
    return float(value)


class CalculatorTool(BaseTool):
    """Evaluate an arithmetic expression (``calculate``): the policy reads the number."""

    default_schema = {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression, e.g. '(3 + 4) * sqrt(2)'.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "The expression."}},
                "required": ["expression"],
            },
        },
    }

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        """The expression's value, as text."""
        value = calculate(parameters.get("expression", ""))
        text = str(int(value)) if value.is_integer() and abs(value) < 1e15 else f"{value:.10g}"
        return ToolResponse(text=text), 0.0, {}


BUILTIN: dict[str, type[BaseTool]] = {
    "image_zoom": ImageZoomTool,
    "geo3k_check": Geo3kCheckTool,
    "calculator": CalculatorTool,
}
"""Built-in tools by short name (``class_name: image_zoom`` in a tool config)."""

VERL_CLASSES: dict[str, type[BaseTool]] = {
    "verl.tools.image_zoom_in_tool.ImageZoomInTool": ImageZoomTool,
    "verl.tools.geo3k_tool.Geo3kTool": Geo3kCheckTool,
}
"""verl's tool classes that load as vlmrl's built-ins (their YAML, schema and config unchanged)."""
