"""Teach a VLM to judge: supervised fine-tuning on verdicts, for ``reward_model.style=generative``.

    python -m vlmrl.reward_model.train_judge --model BASE_DIR --data train.parquet --val-data test.parquet \
        --output JUDGE_DIR [--steps 600] [--batch-size 16] [--lr 1e-3] [--label synthetic] [--overwrite]

A real judge is an instruct VLM that already answers "is this right?"; a tiny random model is not, so this makes one
the way a judge is fine-tuned: from examples. Each step takes ``--batch-size`` records and, for each, one candidate
answer labelled right and one labelled wrong (the same candidates and labeller as ``vlmrl.reward_model.train``); the
judge's prompt is exactly what the trainer sends it (the record's images, then ``reward_model.judge.prompt_template``
filled with the question, the candidate and the ground truth: ``judge.judge_prompt``), and the target is the verdict
``1`` or ``0`` followed by the end of turn, which the built-in rule parses (the last number). The loss is the
cross-entropy of the verdict's tokens. The held-out verdict accuracy (share of ``--val-data``'s candidates, one right
and one wrong per record, whose right verdict is the likelier) is printed and written to
``OUTPUT/vlmrl_judge.json``; OUTPUT is a chat-model folder ``reward_model.model.path`` takes.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

import torch

from vlmrl.batch import PromptSample, RolloutBatch
from vlmrl.config.reward_model import DEFAULT_JUDGE_TEMPLATE, template_problems
from vlmrl.models import qwen_vl
from vlmrl.models.families import family_of_processor
from vlmrl.models.forward import response_logprobs
from vlmrl.models.inputs import build_inputs, expand_pads, process_images, to_device
from vlmrl.models.trainable import check_output_folder, load_model
from vlmrl.reward_model.judge import judge_prompt
from vlmrl.reward_model.train import Pairs, check_arguments, load_pairs, optimise

VERDICTS = ("0", "1")
"""The verdicts taught: wrong, right."""


def verdict_inputs(
    prompts: list[PromptSample],
    pairs: Pairs,
    processor: Any,
    template: str,
    rng: random.Random,
    verdicts: tuple[str, str] = VERDICTS,
) -> tuple[Any, list[int]]:
    """The judge's inputs for each record's right and wrong candidate, each followed by both verdicts (4 samples
    per record: right+"0", right+"1", wrong+"0", wrong+"1"), and the index of the true verdict's sample in each
    pair of them."""
    tok = processor.tokenizer
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    asks: list[PromptSample] = []
    truth: list[int] = []
    for p in prompts:
        (right, _), (wrong, _) = pairs.pair(p, rng)
        for ids, label in ((right, 1), (wrong, 0)):
            asks.append(judge_prompt(processor, template, tok.decode(ids, skip_special_tokens=True), p.ground_truth, p))
            truth.append(label)
    images = process_images(processor, asks)
    prompt_ids, responses = [], []
    family = family_of_processor(processor)
    for a, v in zip(asks, images):
        ids = expand_pads(list(a.prompt_ids), v, processor, family)  # images and videos, as the engine expands them
        for verdict in verdicts:
            prompt_ids.append(ids)
            responses.append(tok(verdict, add_special_tokens=False)["input_ids"] + [eos])
    rb = RolloutBatch(prompt_ids, responses, [[] for _ in responses], ["stop"] * len(responses), n=len(verdicts))
    return build_inputs(asks, rb, images, pad), truth


def verdict_logprobs(model: torch.nn.Module, x: Any, vision_ids: Any, device: str) -> tuple[torch.Tensor, Any]:
    """Each verdict's summed log-prob [A, 2] (A candidates; columns "0", "1") and the dummy-vision term."""
    xd = to_device(x, device)
    lp, _, extra = response_logprobs(model, xd, vision_ids)
    total = (lp * xd.response_mask.to(lp.dtype)).sum(-1)
    return total.view(-1, len(VERDICTS)), extra


def train_judge(
    model_path: str,
    data: str,
    output: str | Path,
    *,
    val_data: str | None = None,
    steps: int = 600,
    batch_size: int = 16,
    lr: float = 1e-3,
    seed: int = 0,
    label: str = "synthetic",
    template: str = DEFAULT_JUDGE_TEMPLATE,
    log_every: int = 100,
    overwrite: bool = False,
) -> dict[str, float]:
    """Fine-tune ``model_path`` to judge ``data``'s candidates; save it to ``output``; its figures."""
    from transformers import AutoProcessor

    problems = template_problems(template, "--template")
    if problems:
        raise ValueError(problems[0])
    check_output_folder(output, overwrite)
    torch.manual_seed(seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    processor = AutoProcessor.from_pretrained(model_path)
    vid = qwen_vl.vision_token_ids(processor.tokenizer)
    train = load_pairs(data, processor, label)
    val = load_pairs(val_data, processor, label) if val_data else None
    model = load_model(model_path, device, where=f"--model {model_path}").train()

    def step_loss(rng: random.Random) -> tuple[torch.Tensor, dict[str, float]]:
        prompts = train.ds.get_batch(rng.sample(range(len(train.ds)), min(batch_size, len(train.ds))))
        x, truth = verdict_inputs(prompts, train, processor, template, rng)
        lp, extra = verdict_logprobs(model, x, vid, device)
        return -lp[torch.arange(len(truth)), torch.tensor(truth)].mean() + extra, {}

    out = optimise(model, step_loss, steps=steps, lr=lr, seed=seed, tag="judge", log_every=log_every)
    if val is not None:
        out["heldout_verdict_accuracy"] = verdict_accuracy(model, val, processor, template, device)
        out["heldout_candidates"] = float(2 * len(val.ds))
        print(f"[judge] held-out verdict accuracy {out['heldout_verdict_accuracy']:.3f}", flush=True)
    folder = Path(output)
    folder.mkdir(parents=True, exist_ok=True)
    qwen_vl.save_pretrained(model.eval().to("cpu"), folder)  # the hub's layout: vLLM serves the judge
    processor.save_pretrained(folder)
    info = {"base": model_path, "data": data, "val_data": val_data, "label": label, "template": template, **out}
    (folder / "vlmrl_judge.json").write_text(json.dumps(info, indent=2))
    return out


@torch.no_grad()
def verdict_accuracy(
    model: torch.nn.Module, pairs: Pairs, processor: Any, template: str, device: str, seed: int = 1, batch: int = 16
) -> float:
    """Share of held-out candidates (a right and a wrong one per record, fixed by ``seed``) whose true verdict is
    the likelier."""
    model.eval()
    rng = random.Random(seed)
    vid = qwen_vl.vision_token_ids(processor.tokenizer)
    right = total = 0
    for start in range(0, len(pairs.ds), batch):
        prompts = pairs.ds.get_batch(list(range(start, min(start + batch, len(pairs.ds)))))
        x, truth = verdict_inputs(prompts, pairs, processor, template, rng)
        lp, _ = verdict_logprobs(model, x, vid, device)
        right += int((lp.argmax(-1) == torch.tensor(truth)).sum())
        total += len(truth)
    model.train()
    return right / max(1, total)


def main(argv: list[str] | None = None) -> int:
    """Command line: see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="the base Qwen2.5-VL folder")
    ap.add_argument("--data", required=True, help="training records (parquet)")
    ap.add_argument("--val-data", help="held-out records (parquet): their verdict accuracy is reported")
    ap.add_argument("--output", required=True, help="the judge's folder")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch-size", type=int, default=16, help="records per step (2 candidates each)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--label", default="synthetic", help="the reward function that labels candidates")
    ap.add_argument("--template", default=DEFAULT_JUDGE_TEMPLATE, help="reward_model.judge.prompt_template")
    ap.add_argument("--overwrite", action="store_true", help="replace a model already in --output")
    a = ap.parse_args(argv)
    check_arguments(ap, a, ("steps", "batch_size"))
    try:
        train_judge(
            a.model,
            a.data,
            a.output,
            val_data=a.val_data,
            steps=a.steps,
            batch_size=a.batch_size,
            lr=a.lr,
            seed=a.seed,
            label=a.label,
            template=a.template,
            overwrite=a.overwrite,
        )
    except (ValueError, FileNotFoundError, FileExistsError) as e:
        print(f"vlmrl.reward_model.train_judge: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    from vlmrl.procs import lean_exit

    lean_exit()
    sys.exit(main())
