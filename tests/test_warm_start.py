"""The warm start (``vlmrl.testing.warm_start``): imitation of a scripted teacher through the real agent loop and
tools, and the tiny model made for tool demos (Qwen2.5's ``<tool_call>`` tokens)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForImageTextToText, AutoProcessor

from vlmrl.testing.tiny import TOOL_DEMO, TinySpec, ensure_tiny_model
from vlmrl.tools import hermes

REPO = Path(__file__).resolve().parents[1]
CALL = '<tool_call>\n{"name": "image_zoom", "arguments": {"bbox_2d": [53, 53, 59, 59]}}\n</tool_call>'


@pytest.fixture(scope="module")
def tool_model_dir() -> str:
    return str(ensure_tiny_model(0, TOOL_DEMO))


def test_the_tool_demo_model_has_qwens_tool_call_tokens(tool_model_dir: str) -> None:
    """``<tool_call>`` / ``</tool_call>`` are single tokens that decoding keeps (as in Qwen2.5, they are not special),
    so the hermes parser reads a sampled call; a call is a few dozen tokens; every id decodes to something and the
    output head starts small (a near-uniform policy)."""
    proc = AutoProcessor.from_pretrained(tool_model_dir)
    tok = proc.tokenizer
    ids = tok(CALL, add_special_tokens=False)["input_ids"]
    assert ids[0] == tok.convert_tokens_to_ids("<tool_call>") and ids[-1] == tok.convert_tokens_to_ids("</tool_call>")
    assert len(ids) < 40
    (call,) = hermes.parse(tok.decode(ids, skip_special_tokens=True))
    assert call.name == "image_zoom" and call.arguments == {"bbox_2d": [53, 53, 59, 59]}
    model = AutoModelForImageTextToText.from_pretrained(tool_model_dir, dtype=torch.float32)
    assert model.config.text_config.vocab_size == len(tok) and model.lm_head.weight.std() < 0.05
    default_vocab = len(AutoProcessor.from_pretrained(ensure_tiny_model(0)).tokenizer)
    assert TinySpec().tool_tokens is False and default_vocab == 512  # the default model's vocabulary is as it was


TEACHER = """
import json
def write_turn(turn, conversation, sample, rng):
    if turn == 0:
        call = {"name": "image_zoom", "arguments": {"bbox_2d": [53, 53, 59, 59]}}
        return "<tool_call>\\n" + json.dumps(call) + "\\n</tool_call>"
    assert "Zoomed in on the region [53, 53, 59, 59]." in conversation  # the real tool's turn
    return sample.ground_truth
"""


@pytest.mark.slow  # a 40-step warm start in its own interpreter, ~25 s
def test_warm_start_teaches_the_teachers_turns_through_the_real_tools(tool_model_dir: str, tmp_path: Path) -> None:
    """``python -m vlmrl.testing.warm_start``: the teacher's calls run through the agent loop (its second turn reads the
    tool's result), the loss on the teacher's tokens falls, and the written folder is a model whose greedy first
    turn is now the teacher's call."""
    from vlmrl.preprocess import synthetic

    synthetic.main(
        [
            "--output-dir",
            str(tmp_path / "data"),
            "--families",
            "zoom",
            "--image-size",
            "448",
            "--train-size",
            "16",
            "--test-size",
            "0",
            "--no-progress",
        ]
    )
    (tmp_path / "teacher.py").write_text(TEACHER)
    out = tmp_path / "warm"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "vlmrl.testing.warm_start",
            "--model",
            tool_model_dir,
            "--output",
            str(out),
            "--data",
            str(tmp_path / "data" / "train.parquet"),
            "--teacher",
            f"{tmp_path / 'teacher.py'}:write_turn",
            "--tools",
            str(REPO / "examples" / "tool_config" / "zoom.yaml"),
            "--steps",
            "40",
            "--lr",
            "3e-3",
            "--batch-size",
            "8",
            "--max-response-length",
            "128",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "vlmrl_warm_start.json").read_text())
    assert summary["called_share"] == 1.0 and summary["tool_errors"] == 0
    assert summary["loss"] < 0.3 * summary["first_loss"], summary
    from vlmrl.config.schema import DataConfig
    from vlmrl.data.dataset import RLDataset
    from vlmrl.tools.config import build_tools, tool_schemas

    warm = AutoProcessor.from_pretrained(out)
    tools = tool_schemas(build_tools(REPO / "examples" / "tool_config" / "zoom.yaml"))
    ds = RLDataset(
        str(tmp_path / "data" / "train.parquet"), warm, DataConfig(train_files="x"), tools=tools, verbose=False
    )
    sample = ds[0]
    model = AutoModelForImageTextToText.from_pretrained(out, dtype=torch.float32).eval()
    enc = warm(text=[sample.prompt_text], images=sample.images, return_tensors="pt")
    with torch.no_grad():
        gen = model.generate(**enc, max_new_tokens=40, do_sample=False)
    text = warm.tokenizer.decode(gen[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    assert text.startswith(CALL), text


def test_a_teacher_that_returns_no_text_is_named(tool_model_dir: str) -> None:
    from vlmrl.rollout.base import SamplingSpec, TurnRequest
    from vlmrl.testing.warm_start import TeacherEngine

    tok = AutoProcessor.from_pretrained(tool_model_dir).tokenizer
    engine = TeacherEngine(lambda turn, conv, sample, rng: 42, tok)
    with pytest.raises(TypeError, match="the teacher returned int"):
        engine.generate_turns([TurnRequest(tok("<|im_start|>assistant\n")["input_ids"], [], 10)], SamplingSpec())
    engine = TeacherEngine(lambda turn, conv, sample, rng: f"turn {turn}", tok, seed=1)
    out = engine.generate_turns([TurnRequest(tok("<|im_start|>assistant\n")["input_ids"], [], 3)], SamplingSpec())
    assert out[0].finish == "length" and len(out[0].ids) == 3  # cut at the request's limit, like a sample
