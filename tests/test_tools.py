"""Tools for multi-turn rollouts: the hermes format, the built-ins, verl's tool configs (no engine needed)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from PIL import Image
from utils import VERL_EXAMPLES

from vlmrl.tools import hermes
from vlmrl.tools.builtin import CalculatorTool, Geo3kCheckTool, ImageZoomTool, calculate
from vlmrl.tools.config import ToolConfigError, build_tools, tool_schemas


def run(coro):
    return asyncio.run(coro)


# ------------------------------------------------------------------------------------------------------ hermes


def test_parse_reads_calls_in_order_and_reports_bad_ones() -> None:
    text = (
        'Let me look. <tool_call>\n{"name": "image_zoom", "arguments": {"bbox_2d": [1, 2, 30, 40]}}\n</tool_call>'
        '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"1+2\\"}"}</tool_call>'
        "<tool_call>{not json}</tool_call>"
        '<tool_call>{"arguments": {}}</tool_call>'
        '<tool_call>{"name": "calculator", "arguments": [1, 2]}</tool_call>'
        "<tool_call> unterminated"
    )
    calls = hermes.parse(text)
    assert [c.name for c in calls] == ["image_zoom", "calculator", "", "", "calculator"]
    assert calls[0].arguments == {"bbox_2d": [1, 2, 30, 40]} and calls[0].error is None
    assert calls[1].arguments == {"expression": "1+2"}  # arguments written as a JSON string are read too
    assert "invalid tool call JSON" in calls[2].error
    assert "needs" in calls[3].error and "must be a JSON object" in calls[4].error
    assert hermes.parse("no calls here") == []


def test_system_prompt_and_tool_turn_follow_qwen25_hermes_template() -> None:
    schema = ImageZoomTool().get_openai_tool_schema().model_dump()
    sys_text = hermes.system_prompt([schema], "Be brief.")
    assert sys_text.startswith("Be brief.\n\n# Tools\n\n")
    assert "<tools>\n" + json.dumps(schema) + "\n</tools>" in sys_text
    assert sys_text.endswith('{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')
    turn = hermes.tool_turn_text([("Zoomed.", 1), ("3", 0)])
    assert turn == (
        "\n<|im_start|>user\n<tool_response>\n<|vision_start|><|image_pad|><|vision_end|>Zoomed.\n</tool_response>"
        "\n<tool_response>\n3\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


# --------------------------------------------------------------------------------------------------- built-ins


def test_calculator_evaluates_arithmetic_and_refuses_everything_else() -> None:
    assert calculate("(3 + 4) * 2") == 14 and calculate("2^10") == 1024 and calculate("sqrt(16) + pi") > 7.14
    for bad in (
        "__import__('os').system('true')",
        "().__class__",
        "x + 1",
        "open('f')",
        "9 ** 9 ** 9",
        "1/0",
        "10 ** 1000",
        "",
        "a" * 300,
        "lambda: 1",
        "[1, 2]",
    ):
        with pytest.raises(ValueError):
            calculate(bad)
    resp, reward, _ = run(CalculatorTool().execute("x", {"expression": "7 * 6"}))
    assert resp.text == "42" and reward == 0.0


def test_zoom_crops_in_model_coordinates_and_enlarges_to_the_pixel_budget() -> None:
    img = Image.new("RGB", (224, 112), "white")
    img.paste((255, 0, 0), (150, 40, 170, 60))  # a 20x20 red square
    tool = ImageZoomTool()
    iid, _ = run(tool.create(create_kwargs={"image": "ignored"}, image=img, image_bounds=(28, 3136, 224 * 224)))
    resp, reward, metrics = run(tool.execute(iid, {"bbox_2d": [150, 40, 170, 60], "label": "square"}))
    crop = resp.image[0]
    assert crop.width % 28 == 0 and crop.height % 28 == 0 and crop.width * crop.height > 20 * 20 * 50
    assert crop.getpixel((crop.width // 2, crop.height // 2)) == (255, 0, 0)  # the small box, now large
    assert "square" in resp.text and reward == 0.0 and 0 < metrics["zoom_area_frac"] < 0.05
    assert tool.box([-10, -10, 5, 5], 224, 112) == (0, 0, 5, 5)  # clamped
    assert tool.crop_box((0, 0, 5, 5), 224, 112) == (0, 0, 28, 28)  # grown to 28 px of the image it is cut from
    for bad in ([1, 2, 3], [10, 10, 5, 5], ["a", 1, 2, 3], [0, 0, 224, 1.5]):
        with pytest.raises(ValueError):
            tool.box(bad, 224, 112)
    run(tool.release(iid))
    assert tool.instance(iid) == {}


def test_zoom_cuts_from_the_image_before_resizing() -> None:
    """The box is in the model's pixels; the crop comes from the image as decoded, so a detail that resizing blurred
    away (a 4-pixel dot in an 896-pixel image shown at 112) is plain in the zoomed view."""
    from vlmrl.models import qwen_vl

    source = Image.new("RGB", (896, 896), "white")
    source.paste((0, 0, 255), (446, 446, 450, 450))  # a 4x4 blue dot at the centre
    bounds = (28, 28 * 28 * 4, 28 * 28 * 16)
    seen = qwen_vl.resize_image(source, *bounds)
    assert seen.size == (112, 112) and min(seen.getpixel((56, 56))) > 150  # blurred into the white
    tool = ImageZoomTool()
    iid, _ = run(tool.create(image=seen, source_image=source, image_bounds=bounds))
    resp, _, metrics = run(tool.execute(iid, {"bbox_2d": [54, 54, 58, 58]}))  # 4x4 model pixels = 32x32 source
    crop = resp.image[0]
    assert crop.size == (112, 112) and crop.getpixel((56, 56)) == (0, 0, 255)  # the dot fills the middle
    assert resp.text == "Zoomed in on the region [54, 54, 58, 58]." and metrics["zoom_area_frac"] == 16 / 112**2
    iid, _ = run(tool.create(image=seen, image_bounds=bounds))  # no source: the model's own image, enlarged
    assert min(run(tool.execute(iid, {"bbox_2d": [54, 54, 58, 58]}))[0].image[0].getpixel((56, 56))) > 150


def test_geo3k_check_grades_against_the_ground_truth_with_verls_penalty() -> None:
    tool = Geo3kCheckTool()
    iid, _ = run(tool.create(create_kwargs={"ground_truth": "12"}, ground_truth="ignored"))
    resp, reward, _ = run(tool.execute(iid, {"answer": "11"}))
    assert "reward=0.0" in resp.text and reward == -0.05  # no improvement: verl's penalty
    resp, reward, _ = run(tool.execute(iid, {"answer": "12"}))
    assert "reward=1.0" in resp.text and reward == 0.0


# ------------------------------------------------------------------------------------------------- tool config


def test_verls_geo3k_tool_config_loads_unchanged() -> None:
    tools = build_tools(VERL_EXAMPLES / "sglang_multiturn/config/tool_config/geo3k_tool_config.yaml")
    assert list(tools) == ["calc_geo3k_reward"] and isinstance(tools["calc_geo3k_reward"], Geo3kCheckTool)
    schema = tool_schemas(tools)[0]
    assert schema["function"]["parameters"]["required"] == ["answer"]


def test_tool_config_accepts_builtins_and_files_and_names_bad_entries(tmp_path: Path) -> None:
    (tmp_path / "mytool.py").write_text(
        "from vlmrl.tools.base import BaseTool, ToolResponse\n"
        "class Echo(BaseTool):\n"
        "    default_schema = {'type': 'function', 'function': {'name': 'echo', 'parameters': {}}}\n"
        "    async def execute(self, iid, params, **kw):\n"
        "        return ToolResponse(text=str(params)), 0.0, {}\n"
    )
    cfg = tmp_path / "tools.yaml"
    cfg.write_text(
        f"tools:\n  - class_name: image_zoom\n  - class_name: calculator\n  - class_name: {tmp_path}/mytool.py:Echo\n"
    )
    assert list(build_tools(cfg)) == ["image_zoom", "calculator", "echo"]
    cases = {
        "tools:\n  - class_name: nope\n": "not a built-in tool",
        "tools:\n  - class_name: verl.tools.mcp_search_tool.MCPSearchTool\n": "MCP servers",
        "tools:\n  - class_name: calculator\n    config: {type: mcp}\n": "native tools only",
        "tools:\n  - class_name: calculator\n  - class_name: calculator\n": "two tools are named 'calculator'",
        "tools: []\n": "non-empty list",
        "tools: [\n": "not valid YAML",
        "tools:\n  - config: {}\n": "needs a class_name",
    }
    for text, msg in cases.items():
        cfg.write_text(text)
        with pytest.raises(ToolConfigError, match=msg) as e:
            build_tools(cfg)
        assert str(cfg) in str(e.value)
    with pytest.raises(ToolConfigError, match="is not a file"):
        build_tools(tmp_path / "missing.yaml")


def test_verls_image_zoom_class_and_schema_load_as_the_builtin(tmp_path: Path) -> None:
    cfg = tmp_path / "zoom.yaml"
    cfg.write_text(
        "tools:\n  - class_name: verl.tools.image_zoom_in_tool.ImageZoomInTool\n"
        "    config: {num_workers: 20, rate_limit: 50, timeout: 30, type: native}\n"
        "    tool_schema:\n      type: function\n      function:\n        name: image_zoom_in_tool\n"
        "        description: Zoom in.\n        parameters: {type: object, properties: {bbox_2d: {type: array}}}\n"
    )
    tools = build_tools(cfg)
    assert isinstance(tools["image_zoom_in_tool"], ImageZoomTool)
    assert tool_schemas(tools)[0]["function"]["description"] == "Zoom in."


def test_a_template_that_lists_tools_renders_them_as_the_hermes_system_message_does(tiny_processor) -> None:
    """verl's multi-turn chat template (its geo3k config's ``custom_chat_template``) renders the tools itself, from
    the ``tools`` it is given; Qwen2.5-VL's own template cannot, so vlmrl writes them into the system message. Both
    give the same prompt text, with and without a system message in the record."""
    import yaml

    from vlmrl.config.schema import DataConfig
    from vlmrl.data.template import ChatRenderer
    from vlmrl.tools import hermes

    doc = yaml.safe_load((VERL_EXAMPLES / "sglang_multiturn/config/geo3k_multiturn_grpo.yaml").read_text())
    verl_template = doc["actor_rollout_ref"]["model"]["custom_chat_template"]
    schemas = tool_schemas(build_tools(VERL_EXAMPLES / "sglang_multiturn/config/tool_config/geo3k_tool_config.yaml"))
    verl, own = ChatRenderer(tiny_processor, verl_template), ChatRenderer(tiny_processor)
    assert verl.takes_tools and not own.takes_tools and DataConfig().custom_chat_template is None
    user = {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Find x."}]}
    for system in ("You are a math expert.", None):
        chat = ([{"role": "system", "content": system}] if system else []) + [user]
        stuffed = [{"role": "system", "content": hermes.system_prompt(schemas, *([system] if system else []))}, user]
        text = verl.render(chat, schemas)
        assert text == own.render(stuffed) and '"name": "calc_geo3k_reward"' in text
        assert verl.render(chat) != text  # without tools verl's template drops a leading system message
