"""Warm start: teach a model a format by imitating a scripted policy, before reinforcement learning.

    python -m vlmrl.testing.warm_start --model MODEL_DIR --output OUT_DIR --data train.parquet \
        --teacher teacher.py:write_turn [--tools tools.yaml] [--steps 200] [--batch-size 16] [--lr 1e-3]

RL from a policy that never writes a tool call cannot learn to use a tool: nothing it samples is ever rewarded for
calling. Real runs start from an instruct model that already knows the hermes format (Qwen2.5-VL-Instruct), often
after a supervised "cold start" on tool-using demonstrations; a tiny random model knows nothing. This is that cold
start: a *teacher* function writes each assistant turn, the agent loop runs the real tools on it (so tool turns and
the images tools return are exactly what a rollout makes), and the model is trained by cross-entropy on the teacher's
tokens (the tool turns are masked out, as in RL). What the teacher shows is up to it: how a call is written, when it
calls, what it answers.

The teacher is plain Python, named like a reward function (``path/to/file.py:fn``)::

    def write_turn(turn: int, conversation: str, sample: PromptSample, rng: random.Random) -> str:
        # turn: 0 for the first assistant turn; conversation: the prompt and every turn so far, as text;
        # sample: the record (ground_truth, extra_info, images)
        return '<tool_call>\\n{"name": "image_zoom", "arguments": {"bbox_2d": [0, 0, 56, 56]}}\\n</tool_call>'

Writes an HF folder (model, processor, tokenizer) that ``actor_rollout_ref.model.path`` takes.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from vlmrl.config.schema import DataConfig, MultiTurnConfig
from vlmrl.data.dataset import RLDataset
from vlmrl.models import qwen_vl
from vlmrl.models.forward import response_logprobs
from vlmrl.models.inputs import build_inputs, process_images, process_response_images, to_device
from vlmrl.models.trainable import load_model
from vlmrl.rollout.base import SamplingSpec, TurnOutput, TurnRequest
from vlmrl.rollout.multi_turn import MultiTurnAgent, multi_turn_metrics
from vlmrl.timing import Timer
from vlmrl.tools.config import tool_schemas
from vlmrl.tools.runner import ToolRunner
from vlmrl.userfiles import load_callable

Teacher = Callable[[int, str, Any, random.Random], str]
"""``write_turn(turn, conversation, sample, rng) -> text`` of the assistant's next turn."""


class TeacherEngine:
    """An engine (``generate_turns``) whose samples are the teacher's texts: each turn is tokenised, ends with
    ``<|im_end|>`` and is cut at the request's token limit like a sample would be."""

    def __init__(self, teacher: Teacher, tokenizer: Any, seed: int = 0) -> None:
        self.teacher = teacher
        self.tokenizer = tokenizer
        self.rng = random.Random(seed)
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def generate_turns(self, requests: list[TurnRequest], spec: SamplingSpec) -> list[TurnOutput]:
        """The teacher's next turn for every request."""
        out = []
        for r in requests:
            conversation = self.tokenizer.decode(r.ids, skip_special_tokens=False)
            turn = conversation.count("<|im_start|>assistant") - 1
            text = self.teacher(turn, conversation, r.prompt, self.rng)
            if not isinstance(text, str):
                raise TypeError(f"the teacher returned {type(text).__name__}, not the turn's text")
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.end]
            finish = "length" if len(ids) > r.max_tokens else "stop"
            ids = ids[: r.max_tokens]
            out.append(TurnOutput(ids, [0.0] * len(ids), finish))
        return out


def _imitation_step(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    agent: MultiTurnAgent,
    processor: Any,
    prompts: list[Any],
    max_response_length: int,
    device: str,
) -> tuple[torch.Tensor, Any]:
    """One step on the teacher's trajectories of ``prompts`` (the tools run for real): the mean negative log-prob of
    the model's tokens; the loss and the rollout."""
    tokenizer = processor.tokenizer
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    rb = agent.generate(prompts, SamplingSpec(n=1, max_tokens=max_response_length))
    images = process_images(processor, prompts)
    x = to_device(build_inputs(prompts, rb, images, pad, process_response_images(processor, rb)), device)
    lp, _, extra = response_logprobs(model, x, qwen_vl.vision_token_ids(tokenizer))
    mask = x.response_mask.float()
    loss = -(lp * mask).sum() / mask.sum().clamp(min=1.0) + extra
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss, rb


def _imitate(
    model: torch.nn.Module,
    agent: MultiTurnAgent,
    ds: RLDataset,
    processor: Any,
    *,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    max_response_length: int,
    device: str,
    log_every: int,
) -> dict[str, float]:
    """The imitation steps on the teacher's trajectories; the last step's figures."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    sw = Timer.start()
    last: dict[str, float] = {}
    first_loss = float("nan")
    for step in range(1, steps + 1):
        prompts = ds.get_batch(rng.sample(range(len(ds)), min(batch_size, len(ds))))
        loss, rb = _imitation_step(model, opt, agent, processor, prompts, max_response_length, device)
        mtm = multi_turn_metrics(rb.trajectories)
        first_loss = loss.item() if step == 1 else first_loss
        last = {
            "step": step,
            "first_loss": first_loss,
            "loss": loss.item(),
            "called_share": mtm.get("multi_turn/called_share", 0.0),
            "tool_errors": mtm.get("multi_turn/tool_errors", 0.0),
            "seconds": sw.elapsed,
        }
        if step % log_every == 0 or step in (1, steps):
            print(
                f"[warm_start] step {step}/{steps} loss {last['loss']:.4f} called {last['called_share']:.2f} "
                f"tool errors {last['tool_errors']:.0f} ({last['seconds']:.0f} s)",
                flush=True,
            )
    return last


def warm_start(
    model_path: str,
    output: str | Path,
    data: str | list[str],
    teacher: Teacher,
    *,
    tool_config: str | None = None,
    steps: int = 200,
    batch_size: int = 16,
    lr: float = 1e-3,
    max_response_length: int = 256,
    max_assistant_turns: int = 2,
    seed: int = 0,
    log_every: int = 20,
) -> dict[str, float]:
    """Train ``model_path`` for ``steps`` steps on the teacher's trajectories over prompts of ``data``; save it to
    ``output`` and return the last step's figures (its loss and the first step's, the share of trajectories that
    called a tool, seconds)."""
    from transformers import AutoProcessor

    torch.manual_seed(seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    processor = AutoProcessor.from_pretrained(model_path)
    tokenizer = processor.tokenizer
    model = load_model(model_path, device, where=f"--model {model_path}")
    model.train()
    mt = MultiTurnConfig(enable=True, tool_config_path=tool_config, max_assistant_turns=max_assistant_turns)
    tools = ToolRunner(tool_config, mt.tool_workers, mt.tool_timeout_s)
    try:
        data_cfg = DataConfig(train_files=data, max_prompt_length=4096, max_response_length=max_response_length)
        schemas = tool_schemas(tools.tools) if tools.tools else None
        ds = RLDataset(data, processor, data_cfg, split="train", tools=schemas)
        bounds = (qwen_vl.patch_factor(processor.image_processor), *ds.pixel_bounds)
        engine = TeacherEngine(teacher, tokenizer, seed)
        max_images = ds.max_images_per_prompt + mt.max_tool_images
        agent = MultiTurnAgent(engine, tools, mt, tokenizer, bounds, max_response_length, max_images=max_images)
        last = _imitate(
            model,
            agent,
            ds,
            processor,
            steps=steps,
            batch_size=batch_size,
            lr=lr,
            seed=seed,
            max_response_length=max_response_length,
            device=device,
            log_every=log_every,
        )
    finally:
        tools.close()  # its worker processes, also when a step fails
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    qwen_vl.save_pretrained(model.eval().to("cpu"), out)  # the hub's layout, which vLLM loads
    processor.save_pretrained(out)
    (out / "vlmrl_warm_start.json").write_text(json.dumps({"base": model_path, "data": data, **last}, indent=2))
    return last


def main(argv: list[str] | None = None) -> int:
    """Command line (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="HF folder of the model to start from")
    ap.add_argument("--output", required=True, help="folder to write the warm-started model to")
    ap.add_argument("--data", required=True, nargs="+", help="parquet file(s) whose prompts the teacher answers")
    ap.add_argument("--teacher", required=True, help="path/to/file.py:function writing each assistant turn")
    ap.add_argument("--tools", default=None, help="tool config (verl's YAML) whose tools the trajectories call")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--max-response-length", type=int, default=256, help="tokens per trajectory, tool turns included")
    ap.add_argument("--max-assistant-turns", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    try:
        teacher = load_callable(a.teacher, what="--teacher")
    except (FileNotFoundError, ValueError, AttributeError, ModuleNotFoundError) as e:
        print(f"vlmrl.testing.warm_start: {e}", file=sys.stderr)
        return 2
    data = a.data if len(a.data) > 1 else a.data[0]
    warm_start(
        a.model,
        a.output,
        data,
        teacher,
        tool_config=a.tools,
        steps=a.steps,
        batch_size=a.batch_size,
        lr=a.lr,
        max_response_length=a.max_response_length,
        max_assistant_turns=a.max_assistant_turns,
        seed=a.seed,
    )
    print(f"[warm_start] wrote {a.output} (trained on {torch.get_num_threads()} thread(s))")
    return 0


if __name__ == "__main__":
    from vlmrl.procs import lean_exit

    lean_exit()
    sys.exit(main())
