"""The generative reward model: a VLM judge on its own engine (vLLM, or transformers' generate), in the driver.

For each response the judge gets the record's images (as the policy saw them) and ``reward_model.judge.
prompt_template`` filled with the question, the response and the ground truth, rendered in the judge's own chat
template; it writes a verdict (``reward_model.rollout.*`` sampling: greedy by default), which the documented rule
(:func:`parse_verdict`) or the user's ``judge.parse`` function turns into the score. A verdict that does not parse
leaves the sample without a score (``rm_error``): counted (``reward_model/parse_errors``) and then scored as a reward
error, never a silent zero. All of a step's samples go to the engine as one batch.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from typing import Any

from vlmrl.batch import PromptSample, RewardSample
from vlmrl.config.reward_model import RewardModelConfig, render_template
from vlmrl.config.schema import RolloutConfig
from vlmrl.models import qwen_vl
from vlmrl.rollout.base import SamplingSpec

_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
_WORDS = {"yes": 1.0, "correct": 1.0, "right": 1.0, "no": 0.0, "incorrect": 0.0, "wrong": 0.0}
_IMAGE = re.compile(r"<image>|<video>")


def parse_verdict(text: str) -> float:
    """The built-in rule: the last number the judge wrote (``"Score: 0.8"`` → 0.8; so ask for one number, not
    "7/10"); else its last word when it is yes / correct / right (1.0) or no / incorrect / wrong (0.0). ValueError
    when neither is there."""
    numbers = _NUMBER.findall(text)
    if numbers:
        value = float(numbers[-1])
        if math.isfinite(value):
            return value
    words = re.findall(r"[a-z]+", text.lower())
    if words and words[-1] in _WORDS:
        return _WORDS[words[-1]]
    raise ValueError(f"no number and no yes/no verdict in {text[:120]!r}")


def plain_text(text: str, tokenizer: Any) -> str:
    """``text`` with every special token's spelling broken (``<|image_pad|>`` → ``< |image_pad|>``): a response
    put into another prompt must not turn into control tokens there (an image pad without its image would fail the
    whole batch; an end of turn would cut the prompt)."""
    for tok in sorted(
        set(tokenizer.all_special_tokens) | {str(t) for t in tokenizer.added_tokens_decoder.values()},
        key=len,
        reverse=True,
    ):
        if tok and tok in text:
            text = text.replace(tok, tok[:1] + " " + tok[1:])
    return text


def question_text(prompt: PromptSample) -> str:
    """The prompt's user text without image or video placeholders (what the judge is told was asked)."""
    parts: list[str] = []
    for m in prompt.messages:
        if m.get("role") != "user":
            continue
        content = m.get("content")
        if isinstance(content, str):
            parts.append(content)
        else:
            parts += [str(c.get("text", "")) for c in content or [] if c.get("type") == "text"]
    return _IMAGE.sub("", "\n".join(parts)).strip()


def judge_prompt(processor: Any, template: str, response: str, ground_truth: Any, prompt: PromptSample) -> PromptSample:
    """The judge's prompt for one response: the record's images and videos, then ``template`` filled with the
    question, the response and the ground truth, in the judge's chat template (one pad per image, as every engine
    prompt)."""
    tok = processor.tokenizer
    values = {
        "question": plain_text(question_text(prompt), tok),
        "response": plain_text(response, tok),
        "ground_truth": plain_text(str(ground_truth), tok),
    }
    text = render_template(template, values)
    content = [{"type": "image"} for _ in prompt.images] + [{"type": "video"} for _ in prompt.videos]
    content.append({"type": "text", "text": text})
    messages = [{"role": "user", "content": content}]
    rendered = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = qwen_vl.engine_prompt_ids(processor.tokenizer, rendered, len(prompt.images), len(prompt.videos))
    return replace(prompt, messages=messages, prompt_text=rendered, prompt_ids=ids)


_PARSE: Any = None


def _build_parse(spec: str) -> None:
    """A parse worker's start-up: the user's function, loaded once."""
    global _PARSE
    from vlmrl.userfiles import load_callable

    _PARSE = load_callable(spec, "reward_model.judge.parse")


def _parse(text: str) -> Any:
    """One verdict through the user's function, in a parse worker."""
    return _PARSE(text)


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


class Judge:
    """The judge's engine, processor and parse function; :meth:`score` fills ``rm_score`` / ``rm_text`` /
    ``rm_error`` on a batch of reward samples."""

    def __init__(
        self,
        cfg: RewardModelConfig,
        device: str,
        limit_images: int,
        limit_videos: int = 0,
        seed: int = 0,
        workers: int = 1,
        timeout_s: float = 30.0,
    ) -> None:
        """``workers`` / ``timeout_s``: the reward's (``reward.num_workers`` / ``reward.timeout_s``) for a user's
        parse function (0 workers: called in the driver, as rewards are)."""
        from transformers import AutoProcessor

        from vlmrl.userfiles import load_callable

        path = str(cfg.model.path)
        self.cfg = cfg
        ro = cfg.rollout
        self.processor = AutoProcessor.from_pretrained(path, trust_remote_code=cfg.model.trust_remote_code)
        self.tokenizer = self.processor.tokenizer
        self.parse = load_callable(cfg.judge.parse, "reward_model.judge.parse") if cfg.judge.parse else parse_verdict
        self.pool = None
        """A user's parse function runs in worker processes under ``reward.timeout_s``, as reward functions do
        (``vlmrl.supervise``): one that hangs is ended, and one that keeps hanging stops the batch by name."""
        if cfg.judge.parse and workers > 0:
            from vlmrl.supervise import SupervisedPool

            self.pool = SupervisedPool(
                f"the judge's parse function {cfg.judge.parse}",
                "reward.timeout_s",
                workers,
                timeout_s,
                initializer=_build_parse,
                initargs=(cfg.judge.parse,),
            )
        self.spec = SamplingSpec(
            n=1,
            max_tokens=ro.response_length,
            temperature=ro.temperature,
            top_p=ro.top_p,
            top_k=ro.top_k,
            greedy=ro.temperature <= 0.0,
        )
        self.max_prompt = int(ro.prompt_length)
        self.engine = self._engine(device, limit_images, limit_videos, seed)

    def _engine(self, device: str, limit_images: int, limit_videos: int, seed: int) -> Any:
        """The judge's engine: vLLM, or transformers' ``generate`` (``reward_model.rollout.name=hf``)."""
        cfg, ro = self.cfg, self.cfg.rollout
        path = str(cfg.model.path)
        if ro.name == "vllm":
            from vlmrl.rollout.vllm import VLLMRollout

            engine_cfg = replace(
                RolloutConfig(),
                gpu_memory_utilization=ro.gpu_memory_utilization,
                free_cache_engine=False,
                engine_kwargs={"vllm": {}},
            )
            return VLLMRollout(
                path,
                rollout_cfg=engine_cfg,
                max_model_len=ro.max_model_len or ro.prompt_length + ro.response_length,
                limit_images=max(1, limit_images),
                limit_videos=limit_videos,
                device=device,
                seed=seed,
                trust_remote_code=cfg.model.trust_remote_code,
            )
        from vlmrl.models.trainable import load_model
        from vlmrl.rollout.hf import HFRollout

        model = load_model(path, device, cfg.model.trust_remote_code, where=f"reward_model.model.path={path}")
        model.eval().requires_grad_(False)
        return HFRollout(model, self.processor)

    def prompt(self, sample: RewardSample, prompt: PromptSample) -> PromptSample:
        """The judge's prompt for one response (:func:`judge_prompt`)."""
        return judge_prompt(
            self.processor, self.cfg.judge.prompt_template, sample.response, sample.ground_truth, prompt
        )

    def score(self, prompts: list[PromptSample], n: int, samples: list[RewardSample]) -> dict[str, float]:
        """Judge every sample (sample i answers ``prompts[i // n]``) in one engine batch; metrics."""
        asks = [self.prompt(s, prompts[i // n]) for i, s in enumerate(samples)]
        too_long = {i for i, a in enumerate(asks) if len(a.prompt_ids) > self.max_prompt}
        batch = [a for i, a in enumerate(asks) if i not in too_long]
        texts = iter(
            self.tokenizer.batch_decode(self.engine.generate(batch, self.spec).response_ids, skip_special_tokens=True)
            if batch
            else []
        )
        judged = [i for i in range(len(samples)) if i not in too_long]
        for i in judged:
            samples[i].rm_text = next(texts)
        parsed = self._parse([samples[i].rm_text or "" for i in judged])
        failed = len(too_long)
        for i in too_long:
            samples[i].rm_score = None
            samples[i].rm_error = "the judge's prompt is longer than reward_model.rollout.prompt_length"
        for i, (value, why) in zip(judged, parsed):
            s = samples[i]
            if why is None and (value is None or isinstance(value, bool) or not _finite(value)):
                why = f"the parse function returned {value!r}"
            if why is None:
                s.rm_score, s.rm_error = float(value), None
            else:
                s.rm_score, s.rm_error = None, f"the judge's verdict did not parse ({why}): {s.rm_text[:200]!r}"
                failed += 1
        return {"reward_model/parse_errors": float(failed)}

    def _parse(self, texts: list[str]) -> list[tuple[Any, str | None]]:
        """(value, None) or (None, why) per verdict: the built-in rule here, a user's function in its workers."""
        if self.pool is not None:
            return [
                (r.value, None) if r.error is None else (None, r.message)
                for r in self.pool.map(_parse, [(t,) for t in texts])
            ]
        out: list[tuple[Any, str | None]] = []
        for t in texts:
            try:
                out.append((self.parse(t), None))
            except Exception as e:  # noqa: BLE001 - a verdict the rule or the user's function cannot read
                out.append((None, str(e)))
        return out

    def close(self) -> None:
        """Stop the engine and the parse function's workers."""
        if self.pool is not None:
            self.pool.close()
        close = getattr(self.engine, "close", None)
        if close is not None:
            close()
