"""Train a discriminative reward model from preference pairs (Bradley–Terry, as TRL's RewardTrainer).

    python -m vlmrl.reward_model.train --model BASE_DIR --data train.parquet --val-data test.parquet \
        --output RM_DIR [--steps 300] [--batch-size 16] [--lr 1e-3] [--label synthetic] [--overwrite]

The model is the base Qwen2.5-VL with a one-output score head in place of the language-model head, read at the
response's last token (``models.forward.last_token_scores``: the same forward the trainer's reward model runs); it
sees the images. Each step takes ``--batch-size`` records (``--pairs-per-record`` pairs each for labelled
candidates) and minimises ``-log sigmoid(score(chosen) -
score(rejected))``. Pairs come from the records (verl's parquet schema, read by the trainer's own dataset code):

- ``chosen`` / ``rejected`` string columns (TRL's preference format, the prompt and images being the record's), or
- labelled candidates: responses a policy might write (the right answer, another answer, either among random
  tokens, near-misses of an answer with a token dropped, replaced or repeated, several answers named, random tokens,
  one token repeated),
  labelled right or wrong by a reward function (``--label``, default ``synthetic``: the quick-start task's rule), one
  right and one wrong per pair, drawn anew each step. The labeller plays the human of RLHF: the reward model learns
  its judgement from examples, and the policy is then trained on the model alone.

Explicit pairs end with the end-of-turn token, as the policy's finished responses do. The held-out pair accuracy (share
of ``--val-data`` pairs whose chosen response scores higher; one fixed pair per record) is printed and written with
the losses to ``OUTPUT/vlmrl_reward_model.json``; OUTPUT is a folder ``reward_model.model.path`` takes (the head as
``score.weight`` / ``score.bias``, as verl's and transformers' classification models name it).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import torch

from vlmrl.batch import PromptSample, RolloutBatch
from vlmrl.config.schema import DataConfig
from vlmrl.data.dataset import RLDataset
from vlmrl.models import qwen_vl
from vlmrl.models.families import family_of_processor
from vlmrl.models.forward import last_token_scores
from vlmrl.models.inputs import build_inputs, expand_pads, process_images, to_device
from vlmrl.models.trainable import check_output_folder, load_model
from vlmrl.models.value_head import add_value_head, export_names
from vlmrl.timing import Timer


@dataclass
class Pairs:
    """Where a dataset's pairs come from: explicit columns, or candidates labelled by a reward function."""

    ds: RLDataset
    chosen: list[str] | None
    """Per source row: the ``chosen`` column (None: labelled candidates)."""
    rejected: list[str] | None
    tok: Any
    """The tokenizer (candidates are token sequences, as a policy writes them)."""
    label: Any = None
    """``label(sample) -> float``: the reward function that labels candidates (>= 0.5: right)."""

    def row(self, p: PromptSample) -> int:
        """The source row of a record (its uid is ``<file>:<row>``)."""
        return int(p.uid.rsplit(":", 1)[1])

    def ids(self, text: str) -> list[int]:
        """``text``'s token ids."""
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def word_ids(self, text: str) -> list[int]:
        """A candidate's words' token ids, memoised (candidates are drawn from a task's few answers thousands of times a
        run) for the first 4096 distinct phrases."""
        cache = self.__dict__.setdefault("_word_ids", {})
        ids = cache.get(text)
        if ids is None:
            ids = self.ids(text)
            if len(cache) < 4096:
                cache[text] = ids
        return list(ids)

    def pair(self, p: PromptSample, rng: random.Random) -> tuple[tuple[list[int], bool], tuple[list[int], bool]]:
        """((chosen ids, ends), (rejected ids, ends)) for one record; ``ends``: the response ends with the
        end-of-turn token (always for explicit pairs; a coin flip for candidates, so a cut-off answer is judged by
        what it says)."""
        if self.chosen is not None and self.rejected is not None:
            return (self.ids(self.chosen[self.row(p)]), True), (self.ids(self.rejected[self.row(p)]), True)
        right = wrong = None
        for _ in range(200):  # draw candidates until one of each label
            ids = self.candidate(p, rng, want_right=right is None)
            ok = self.is_right(p, ids)
            if ok and right is None:
                right = ids
            elif not ok and wrong is None:
                wrong = ids
            if right is not None and wrong is not None:
                return (right, rng.random() < 0.5), (wrong, rng.random() < 0.5)
        raise ValueError(f"{p.uid}: the label function found no right and wrong candidates in 200 draws")

    def plain_ids(self) -> list[int]:
        """Token ids a policy can write: every id but the special ones (end of turn, image and video pads)."""
        if not hasattr(self, "_plain"):
            special = set(self.tok.all_special_ids) | set(self.tok.added_tokens_decoder)
            self._plain = [i for i in range(len(self.tok)) if i not in special]
        return self._plain

    def is_right(self, p: PromptSample, ids: list[int]) -> bool:
        """The label function's verdict on a candidate (its decoded text)."""
        from vlmrl.batch import RewardSample

        text = self.tok.decode(ids, skip_special_tokens=True)
        sample = RewardSample(
            response=text,
            prompt=p.prompt_text,
            ground_truth=p.ground_truth,
            data_source=p.data_source,
            extra_info=p.extra_info,
            images=p.images,
        )
        from vlmrl.scoring.loading import normalize

        return normalize(self.label(sample))[0] >= 0.5

    def candidate(self, p: PromptSample, rng: random.Random, want_right: bool) -> list[int]:
        """One response a policy might write: the right answer (when ``want_right``, half the time; alone or said
        again and again), another answer, either with random tokens around it, near-misses of an answer (a token
        dropped or replaced, a piece of it repeated, pieces of two answers glued together), several answers named,
        random tokens, one token repeated; at most 12 tokens."""
        truth = str(p.ground_truth)
        answers = _choices(p) or [truth]
        plain = self.plain_ids()

        def noise(k: int) -> list[int]:
            if rng.random() < 0.5:
                return [rng.choice(plain) for _ in range(k)]
            return [rng.choice(plain)] * k

        word = truth if (want_right and rng.random() < 0.5) else rng.choice(answers)
        ids = self.word_ids(word if rng.random() < 0.5 else " " + word)
        kind = rng.random()
        if want_right and kind < 0.3:  # the answer alone, or said again and again
            ids = ids if rng.random() < 0.5 else self.word_ids(" ".join([word] * rng.randint(2, 6)))
        elif kind < 0.4:
            ids = noise(rng.randint(0, 3)) + self.word_ids(" " + word + " ") + noise(rng.randint(0, 3))
        elif kind < 0.65:  # a near-miss of the answer
            op = rng.randrange(5)
            k = rng.randrange(len(ids))
            if op == 0 and len(ids) > 1:
                ids = ids[:k] + ids[k + 1 :]
            elif op == 1:
                ids = ids[:k] + [rng.choice(plain)] + ids[k + 1 :]
            elif op == 2:  # a piece of it, repeated
                a = rng.randrange(len(ids))
                ids = ids[a : rng.randint(a + 1, len(ids))] * rng.randint(2, 8)
            elif op == 3:  # pieces of two answers glued together, repeated
                other = self.word_ids(rng.choice(answers))
                ids = (ids[rng.randrange(len(ids)) :] + other[rng.randrange(len(other)) :]) * rng.randint(1, 4)
            else:
                ids = noise(rng.randint(1, 3)) + ids
        elif kind < 0.88:
            ids = noise(rng.randint(1, 8))
        else:  # several answers named, one of them perhaps many times
            words = [rng.choice(answers) for _ in range(rng.randint(2, 8))]
            if len(answers) > 1 and len(set(words)) == 1:
                words[rng.randrange(len(words))] = rng.choice([a for a in answers if a != words[0]])
            ids = self.word_ids(" " + " ".join(words))
        return ids[:12]


def _choices(p: PromptSample) -> list[str]:
    choices = (p.extra_info or {}).get("choices")
    return [str(c) for c in (choices.tolist() if hasattr(choices, "tolist") else choices or [])]


def load_pairs(path: str, processor: Any, label: str = "synthetic") -> Pairs:
    """A parquet file's records and where their pairs come from (``label``: the reward function, by registry name
    or ``file.py:fn``, that labels candidates when the file has no chosen / rejected columns)."""
    from vlmrl.scoring.loading import make_reward_fn

    ds = RLDataset(path, processor, DataConfig(train_files=path, max_prompt_length=4096), split="train")
    if len(ds) == 0:
        raise ValueError(f"{path}: no records to train or score on")
    names = pq.read_schema(path).names
    chosen = rejected = None
    if "chosen" in names and "rejected" in names:
        table = pq.read_table(path, columns=["chosen", "rejected"])
        chosen, rejected = table["chosen"].to_pylist(), table["rejected"].to_pylist()
        for row, (c, r) in enumerate(zip(chosen, rejected)):
            if c is None or r is None:
                raise ValueError(
                    f"{path} row {row}: {'chosen' if c is None else 'rejected'} is null; a preference "
                    "pair needs both responses (an empty string is an empty response)"
                )
            if str(c) == str(r):
                raise ValueError(
                    f"{path} row {row}: chosen and rejected are the same response: the pair teaches "
                    "nothing (its loss is log 2 whatever the model)"
                )
        chosen, rejected = [str(x) for x in chosen], [str(x) for x in rejected]
    elif "chosen" in names or "rejected" in names:
        raise ValueError(f"{path}: has one of the chosen / rejected columns; a preference pair needs both")
    return Pairs(ds, chosen, rejected, processor.tokenizer, None if chosen is not None else make_reward_fn(label))


def pair_inputs(prompts: list[PromptSample], pairs: list[list[Any]], processor: Any, eos: int, pad: int) -> Any:
    """Model inputs of each prompt's pairs (the same number for every prompt), each pair its chosen then its rejected
    response (``(ids, ends)``: ending with ``eos`` when ``ends``): one prompt, its image processed once, for all of
    its candidates."""
    k = len(pairs[0])
    if any(len(group) != k for group in pairs):
        raise ValueError("pair_inputs: every prompt needs the same number of pairs")
    responses = [list(ids) + [eos] * ends for group in pairs for pair in group for ids, ends in pair]
    images = process_images(processor, prompts)
    family = family_of_processor(processor)
    prompt_ids = []
    for p, v in zip(prompts, images):
        ids = expand_pads(list(p.prompt_ids), v, processor, family)  # images and videos, as the engine expands them
        prompt_ids += [ids] * (2 * k)
    rb = RolloutBatch(prompt_ids, responses, [[] for _ in responses], ["stop"] * len(responses), n=2 * k)
    return build_inputs(prompts, rb, images, pad)


def pair_scores(model: torch.nn.Module, x: Any, vision_ids: Any, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores [pairs, 2] (chosen, rejected), the pairs in input order, and the dummy-vision term."""
    s, extra = last_token_scores(model, to_device(x, device), vision_ids)
    return s.view(-1, 2), extra


@torch.no_grad()
def pair_accuracy(
    model: torch.nn.Module,
    pairs: Pairs,
    processor: Any,
    eos: int,
    pad: int,
    device: str,
    seed: int = 1,
    batch: int = 32,
) -> float:
    """Share of held-out pairs (one per record, fixed by ``seed``) whose chosen response scores higher."""
    model.eval()
    rng = random.Random(seed)
    vision_ids = qwen_vl.vision_token_ids(processor.tokenizer)
    right = total = 0
    for start in range(0, len(pairs.ds), batch):
        prompts = pairs.ds.get_batch(list(range(start, min(start + batch, len(pairs.ds)))))
        x = pair_inputs(prompts, [[pairs.pair(p, rng)] for p in prompts], processor, eos, pad)
        s, _ = pair_scores(model, x, vision_ids, device)
        right += int((s[:, 0] > s[:, 1]).sum())
        total += s.shape[0]
    model.train()
    return right / max(1, total)


def optimise(
    model: torch.nn.Module,
    step_loss: Callable[[random.Random], tuple[torch.Tensor, dict[str, float]]],
    *,
    steps: int,
    lr: float,
    seed: int,
    tag: str,
    log_every: int,
) -> dict[str, float]:
    """``steps`` AdamW steps (gradients clipped at 1) on ``step_loss(rng)``'s loss, which also returns metrics to
    keep; the figures: first loss, last loss and the mean of the last 20, the metrics, seconds."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    sw = Timer.start()
    out: dict[str, float] = {"steps": float(steps)}
    recent: list[float] = []
    for step in range(1, steps + 1):
        loss, metrics = step_loss(rng)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        out.setdefault("first_loss", loss.item())
        recent = (recent + [loss.item()])[-20:]
        out |= {"loss": loss.item(), "loss_last_20_mean": sum(recent) / len(recent), **metrics}
        if step % log_every == 0 or step in (1, steps):
            shown = "".join(f" {k} {v:.2f}" for k, v in metrics.items())
            print(f"[{tag}] step {step}/{steps} loss {loss.item():.4f}{shown} ({sw.elapsed:.0f} s)", flush=True)
    out["train_seconds"] = sw.elapsed
    return out


def train_reward_model(
    model_path: str,
    data: str,
    output: str | Path,
    *,
    val_data: str | None = None,
    steps: int = 300,
    batch_size: int = 16,
    lr: float = 1e-3,
    seed: int = 0,
    label: str = "synthetic",
    pairs_per_record: int = 3,
    log_every: int = 50,
    overwrite: bool = False,
) -> dict[str, float]:
    """Train a reward model on ``data``'s pairs, save it to ``output`` and return its figures (first and last loss,
    train and held-out pair accuracy, seconds). ``pairs_per_record``: labelled candidates drawn per record and step
    (explicit pairs: 1)."""
    from transformers import AutoProcessor

    check_output_folder(output, overwrite)
    torch.manual_seed(seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    processor = AutoProcessor.from_pretrained(model_path)
    tok = processor.tokenizer
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    train = load_pairs(data, processor, label)
    val = load_pairs(val_data, processor, label) if val_data else None
    model = load_model(model_path, device, where=f"--model {model_path}")
    add_value_head(model, model_path)
    model.train()
    vision_ids = qwen_vl.vision_token_ids(tok)

    def step_loss(rng: random.Random) -> tuple[torch.Tensor, dict[str, float]]:
        prompts = train.ds.get_batch(rng.sample(range(len(train.ds)), min(batch_size, len(train.ds))))
        k = pairs_per_record if train.chosen is None else 1
        drawn = [[train.pair(p, rng) for p in prompts] for _ in range(k)]  # round by round, each record's k pairs
        x = pair_inputs(prompts, [[drawn[r][i] for r in range(k)] for i in range(len(prompts))], processor, eos, pad)
        s, extra = pair_scores(model, x, vision_ids, device)
        loss = -torch.nn.functional.logsigmoid(s[:, 0] - s[:, 1]).mean() + extra
        return loss, {"train_pair_accuracy_last_batch": float((s[:, 0] > s[:, 1]).float().mean())}

    out = optimise(model, step_loss, steps=steps, lr=lr, seed=seed, tag="reward_model", log_every=log_every)
    if val is not None:
        accuracy = pair_accuracy(model, val, processor, eos, pad, device)
        out.update(heldout_pair_accuracy=accuracy, heldout_pairs=float(len(val.ds)))
        print(f"[reward_model] held-out pair accuracy {accuracy:.3f} ({len(val.ds)} pairs)", flush=True)
    info = {
        "base": str(model_path),
        "data": str(data),
        "val_data": None if val_data is None else str(val_data),
        "batch_size": batch_size,
        "lr": lr,
        "label": label,
        "pairs_per_record": pairs_per_record,
        **out,
    }
    _save(model, processor, Path(output), info)
    return out


def _save(model: torch.nn.Module, processor: Any, folder: Path, info: dict[str, Any]) -> None:
    """The reward model's folder: its config, the weights with the score head (hub names), the processor and
    ``vlmrl_reward_model.json`` (how it was trained, its figures)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    model.eval().to("cpu")
    model.config.save_pretrained(folder)
    tensors = {k: v.detach().contiguous() for k, v in export_names(model.state_dict()).items()}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    processor.save_pretrained(folder)
    (folder / "vlmrl_reward_model.json").write_text(json.dumps(info, indent=2))


def check_arguments(ap: argparse.ArgumentParser, a: argparse.Namespace, counts: tuple[str, ...]) -> None:
    """The trainers' numbers before anything loads: each of ``counts`` >= 1, ``--lr`` a finite number > 0 (argparse's
    usage error, exit 2)."""
    for flag in counts:
        if getattr(a, flag) < 1:
            ap.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(a, flag)}")
    if not (math.isfinite(a.lr) and a.lr > 0):
        ap.error(f"--lr must be a finite number > 0, got {a.lr}")


def main(argv: list[str] | None = None) -> int:
    """Command line: see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="the base Qwen2.5-VL folder")
    ap.add_argument("--data", required=True, help="training records (parquet)")
    ap.add_argument("--val-data", help="held-out records (parquet): their pair accuracy is reported")
    ap.add_argument("--output", required=True, help="the reward model's folder")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch-size", type=int, default=16, help="records per step")
    ap.add_argument("--pairs-per-record", type=int, default=3, help="labelled candidate pairs per record and step")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--label",
        default="synthetic",
        help="the reward function that labels candidate responses (registry name or file.py:fn)",
    )
    ap.add_argument("--overwrite", action="store_true", help="replace a model already in --output")
    a = ap.parse_args(argv)
    check_arguments(ap, a, ("steps", "batch_size", "pairs_per_record"))
    try:
        train_reward_model(
            a.model,
            a.data,
            a.output,
            val_data=a.val_data,
            steps=a.steps,
            batch_size=a.batch_size,
            lr=a.lr,
            seed=a.seed,
            label=a.label,
            pairs_per_record=a.pairs_per_record,
            overwrite=a.overwrite,
        )
    except (ValueError, FileNotFoundError, FileExistsError) as e:
        print(f"vlmrl.reward_model.train: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    from vlmrl.procs import lean_exit

    lean_exit()
    sys.exit(main())
