"""One TRL ``GRPOTrainer`` run on the tiny Qwen2.5-VL and the synthetic colour task, timed step by step.

Started by ``benchmarks/bench_trl.py`` in TRL's own environment (``PYTHONPATH=.cache/trl-pkgs`` over vlmrl's
interpreter, so torch and transformers are exactly vlmrl's). Not meant to be run by hand, but it can be:

    PYTHONPATH=.cache/trl-pkgs .venv/bin/python benchmarks/trl_runner.py --model DIR --data DIR --out result.json

Timing: wall time per optimizer step (callback), and where it goes: TRL's methods are wrapped to time generation
(``_generate``: processor + HF ``generate``), scoring (``_calculate_rewards``), the whole generate-and-score stage,
the loss forward (``compute_loss``), the backward pass (``accelerator.backward``) and the rest (optimizer, logging);
and what the loss forwards ran (non-padding tokens, padding positions, vision patches) for the FLOP accounting.
With ``--val-every N``: the greedy held-out accuracy on the data's ``test.parquet`` before training and every N
steps, its time not counted as training (``benchmarks/bench_learn_size.py --trl``: TRL beside vlmrl's curves).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any


def load_records(data_dir: Path, limit: int | None = None, split: str = "train") -> dict[str, list[Any]]:
    """The verl-schema parquet (``split``.parquet) as TRL columns: conversational ``prompt`` (text, TRL inserts the
    image), ``image``, ``ground_truth`` and ``choices`` (passed to the reward function)."""
    import io

    import pandas as pd
    from PIL import Image

    df = pd.read_parquet(data_dir / f"{split}.parquet")
    if limit:
        df = df.iloc[:limit]
    cols: dict[str, list[Any]] = {"prompt": [], "image": [], "ground_truth": [], "choices": []}
    for _, row in df.iterrows():
        msgs = [dict(m) for m in row["prompt"]]
        images = list(row["images"])
        if len(images) != 1:
            raise ValueError(f"the TRL benchmark expects one image per record, got {len(images)}")
        for m in msgs:
            m["content"] = str(m["content"]).replace("<image>", "").strip()
        cols["prompt"].append(msgs)
        cols["image"].append(Image.open(io.BytesIO(images[0]["bytes"])).convert("RGB"))
        cols["ground_truth"].append(str(row["reward_model"]["ground_truth"]))
        extra = row["extra_info"] or {}
        choices = extra.get("choices")
        cols["choices"].append([str(c) for c in (choices.tolist() if hasattr(choices, "tolist") else choices or [])])
    return cols


def colour_reward(prompts: list, completions: list, ground_truth: list, choices: list, **_: Any) -> list[float]:
    """vlmrl's synthetic-task reward (label families: exactly one candidate named and it is the truth)."""
    from vlmrl.rewards.format import answer_span
    from vlmrl.rewards.synthetic import label_score

    out = []
    for comp, truth, labels in zip(completions, ground_truth, choices, strict=True):
        text = comp[0]["content"] if isinstance(comp, list) else str(comp)
        out.append(label_score(answer_span(text), truth, list(labels)))
    return out


def greedy_accuracy(model: Any, processor: Any, cols: dict[str, list[Any]], max_tokens: int, batch: int = 32) -> float:
    """Greedy held-out accuracy: each prompt as TRL's trainer renders it (the image first in the user's turn), HF
    ``generate`` without sampling, scored by :func:`colour_reward` (vlmrl's validation: greedy, the same reward)."""
    import torch

    was_training = model.training
    model.eval()
    scores: list[float] = []
    try:
        for i in range(0, len(cols["prompt"]), batch):
            texts, images = [], []
            for msgs, image in zip(cols["prompt"][i : i + batch], cols["image"][i : i + batch], strict=True):
                turns = [dict(m) for m in msgs]
                user = next(k for k, m in enumerate(turns) if m["role"] == "user")
                turns[user] = {
                    "role": "user",
                    "content": [{"type": "image"}, {"type": "text", "text": turns[user]["content"]}],
                }
                texts.append(processor.apply_chat_template(turns, add_generation_prompt=True, tokenize=False))
                images.append([image])
            enc = processor(text=texts, images=images, padding=True, padding_side="left", return_tensors="pt")
            with torch.no_grad():
                out = model.generate(**enc, max_new_tokens=max_tokens, do_sample=False)
            done = processor.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
            n = len(done)
            scores += colour_reward([None] * n, done, cols["ground_truth"][i : i + n], cols["choices"][i : i + n])
    finally:
        model.train(was_training)
    return sum(scores) / len(scores)


class Timers:
    """Accumulates seconds per named stage (and the update's token counts) within the current optimizer step."""

    def __init__(self) -> None:
        self.current: dict[str, float] = defaultdict(float)

    def wrap(self, obj: Any, name: str, key: str) -> None:
        """Replace ``obj.name`` with a timed version adding to ``key``."""
        fn: Callable[..., Any] = getattr(obj, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.current[key] += time.perf_counter() - t0

        setattr(obj, name, timed)

    def count_update_inputs(self, trainer: Any) -> None:
        """Add what each loss forward runs to the step's row (compute efficiency, ``compute_efficiency.py``):
        ``update_tokens`` (prompt + completion mask sums), ``update_padding_tokens`` (the other positions of its
        padded ``[prompt | completion]`` batch) and ``update_vision_patches`` (rows of its ``pixel_values``)."""
        fn: Callable[..., Any] = trainer.compute_loss

        def counted(model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
            masks = (inputs["prompt_mask"], inputs["completion_mask"])
            real = float(sum(m.sum() for m in masks))
            self.current["update_tokens"] += real
            self.current["update_padding_tokens"] += sum(m.numel() for m in masks) - real
            pixels = inputs.get("pixel_values")
            self.current["update_vision_patches"] += float(pixels.shape[0]) if pixels is not None else 0.0
            return fn(model, inputs, *args, **kwargs)

        trainer.compute_loss = counted

    def take(self) -> dict[str, float]:
        """This step's totals, then reset."""
        out = dict(self.current)
        self.current = defaultdict(float)
        return out


def main(argv: list[str] | None = None) -> None:
    """Train with TRL's GRPOTrainer and write per-step timings and rewards as JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True, help="result JSON")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--time-budget-s", type=float, default=0, help="stop after this much training time (0 = none)")
    ap.add_argument("--stop-reward", type=float, default=0, help="stop once the 5-step mean reward reaches this")
    ap.add_argument("--prompts", type=int, default=16, help="prompts per optimizer step")
    ap.add_argument("--n", type=int, default=8, help="samples per prompt")
    ap.add_argument("--micro", type=int, default=64, help="samples per forward/backward (per_device_train_batch_size)")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--equal-lengths", action="store_true", help="min_new_tokens = max tokens (ignore_eos)")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup-steps", type=int, default=0, help="linear warm-up steps, then constant")
    ap.add_argument("--val-every", type=int, default=0, help="greedy held-out accuracy every N steps (0: none)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)

    import torch

    torch.set_num_threads(a.threads)
    import datasets
    import trl
    from transformers import AutoModelForImageTextToText, AutoProcessor, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    samples = a.prompts * a.n
    if samples % a.micro:
        raise SystemExit(f"--micro {a.micro} must divide prompts x n = {samples}")
    accum = samples // a.micro
    cols = load_records(Path(a.data))
    feats = datasets.Features(
        {
            "prompt": [{"role": datasets.Value("string"), "content": datasets.Value("string")}],
            "image": datasets.Image(),
            "ground_truth": datasets.Value("string"),
            "choices": datasets.List(datasets.Value("string")),
        }
    )
    ds = datasets.Dataset.from_dict(cols, features=feats)
    processor = AutoProcessor.from_pretrained(a.model)
    model = AutoModelForImageTextToText.from_pretrained(a.model, dtype=torch.float32, attn_implementation="sdpa")
    gen_kwargs = {"min_new_tokens": a.max_tokens} if a.equal_lengths else None
    out_dir = Path(a.out).with_suffix(".trainer")
    args = GRPOConfig(
        output_dir=str(out_dir),
        use_cpu=True,
        per_device_train_batch_size=a.micro,
        gradient_accumulation_steps=accum,
        num_generations=a.n,
        max_completion_length=a.max_tokens,
        beta=0.0,
        num_iterations=1,
        epsilon=0.2,
        loss_type="dapo",
        scale_rewards="group",
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        learning_rate=a.lr,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        max_grad_norm=1.0,
        lr_scheduler_type="constant_with_warmup" if a.warmup_steps else "constant",
        warmup_steps=a.warmup_steps,
        max_steps=a.steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=a.seed,
        bf16=False,
        fp16=False,
        dataloader_num_workers=0,
        generation_kwargs=gen_kwargs,
        disable_tqdm=True,
        log_completions=False,
    )
    trainer = GRPOTrainer(
        model=model, reward_funcs=colour_reward, args=args, train_dataset=ds, processing_class=processor
    )
    timers = Timers()
    timers.wrap(trainer, "_generate", "generate_s")
    timers.wrap(trainer, "_calculate_rewards", "reward_s")
    timers.wrap(trainer, "_generate_and_score_completions", "generate_and_score_s")
    timers.wrap(trainer, "compute_loss", "loss_forward_s")
    timers.wrap(trainer, "training_step", "training_step_s")
    timers.wrap(trainer.accelerator, "backward", "backward_s")
    timers.count_update_inputs(trainer)

    steps: list[dict[str, Any]] = []
    rewards: list[float] = []
    lengths: list[float] = []
    val_cols = load_records(Path(a.data), split="test") if a.val_every else None
    curve: list[dict[str, float]] = []  # (step, training seconds, greedy held-out accuracy)

    def validate(step: int) -> float:
        """One validation; its seconds (not counted as training)."""
        t = time.perf_counter()
        assert val_cols is not None
        acc = greedy_accuracy(model, processor, val_cols, a.max_tokens)
        curve.append({"step": step, "train_s": sum(r["step_s"] for r in steps), "val": acc})
        print(f"[trl_runner] step {step}: held-out {acc:.3f}", flush=True)
        return time.perf_counter() - t

    class StepClock(TrainerCallback):
        """Wall time between optimizer steps, the stage timers, and the logged reward of each step."""

        def __init__(self) -> None:
            self.t_last = time.perf_counter()
            self.t_first = self.t_last

        def on_train_begin(self, *_: Any, **__: Any) -> None:
            if a.val_every:
                validate(0)
            self.t_last = self.t_first = time.perf_counter()

        def on_step_end(self, _args: Any, state: Any, control: Any, **__: Any) -> None:
            t = time.perf_counter()
            row = {"step": state.global_step, "step_s": t - self.t_last, **timers.take()}
            self.t_last = t
            steps.append(row)
            elapsed = t - self.t_first
            at_val = bool(a.val_every) and state.global_step % a.val_every == 0
            if at_val:
                spent = validate(state.global_step)  # outside the step's time and the budget
                self.t_last += spent
                self.t_first += spent
            # past the budget: stop (with validation, at the first validation after it, as bench_learn_size's runs)
            if a.time_budget_s and elapsed > a.time_budget_s and (at_val or not a.val_every):
                control.should_training_stop = True

        def on_log(self, _args: Any, _state: Any, control: Any, logs: dict | None = None, **__: Any) -> None:
            if logs and "reward" in logs:
                rewards.append(float(logs["reward"]))
                lengths.append(float(logs.get("completions/mean_length", float("nan"))))
            if a.stop_reward and len(rewards) >= 5 and sum(rewards[-5:]) / 5 >= a.stop_reward:
                control.should_training_stop = True

    trainer.add_callback(StepClock())
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    result = {
        "trl_version": trl.__version__,
        "threads": a.threads,
        "config": {
            "prompts": a.prompts,
            "n": a.n,
            "micro": a.micro,
            "gradient_accumulation_steps": accum,
            "max_tokens": a.max_tokens,
            "equal_lengths": a.equal_lengths,
            "lr": a.lr,
            "warmup_steps": a.warmup_steps,
        },
        "val_curve": curve,
        "steps": steps,
        "rewards": rewards,
        "mean_lengths": lengths,
        "train_wall_s": wall,
        "pid": os.getpid(),
    }
    Path(a.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
