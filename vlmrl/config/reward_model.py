"""The schema of rewards from a model (``reward_model.*``, verl's keys): a discriminative reward model run on the
workers, or a generative judge (a VLM on its own engine) run by the driver. Their score reaches the reward as the
``reward_model`` component (``rewards/model.py``), next to rule rewards in the composite."""

from __future__ import annotations

import dataclasses
import json
import os
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_JUDGE_TEMPLATE = (
    "Question: {question}\nAnswer: {response}\nIs the answer correct for the image? Reply with a score from 0 to 1."
)
"""The judge's default prompt: the record's images come first, then this text."""
JUDGE_FIELDS = ("question", "response", "ground_truth")
"""The fields a judge template may name."""


def template_problems(template: str, where: str = "reward_model.judge.prompt_template") -> list[str]:
    """Why ``template`` cannot be a judge's prompt: it must name only ``JUDGE_FIELDS``, each bare (no attribute or
    index access, no format spec or conversion: data never becomes a spec), and name ``{response}``."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:
        return [f"{where}: not a format string ({e}; double a literal brace: {{{{ }}}})."]
    fields = [(f, spec, conv) for _, f, spec, conv in parsed if f is not None]
    bad = sorted({f for f, _, _ in fields if f not in JUDGE_FIELDS})
    if bad:
        return [
            f"{where} names {bad}: use {{question}}, {{response}} and {{ground_truth}}, bare (no attributes, "
            "indexes or positions; double a literal brace: {{ }})."
        ]
    dressed = sorted({f"{{{f}{'!' + c if c else ''}{':' + s if s else ''}}}" for f, s, c in fields if s or c})
    if dressed:
        return [f"{where}: {', '.join(dressed)}: a field takes no format spec or conversion (write it bare)."]
    if not any(f == "response" for f, _, _ in fields):
        return [f"{where} has no {{response}}: the judge would never see the answer."]
    return []


def render_template(template: str, values: dict[str, str]) -> str:
    """``template`` with each bare field replaced by its value as text; nothing else of the template is evaluated
    (the caller checked it with :func:`template_problems`)."""
    out = []
    for literal, name, spec, conv in string.Formatter().parse(template):
        out.append(literal)
        if name is not None:
            if name not in values or spec or conv:
                raise ValueError(f"judge template field {{{name}}} is not one of {list(values)}, bare")
            out.append(str(values[name]))
    return "".join(out)


@dataclass
class RewardModelFSDPConfig:
    param_offload: bool = False
    """Keep the reward model's parameters in host memory between uses (FSDP2 CPUOffloadPolicy; GPU only)."""
    dtype: str = "auto"
    """Compute dtype: auto (bfloat16 on GPU, float32 on CPU) | bfloat16 | float16 | float32."""


@dataclass
class RewardModelModelConfig:
    path: str | None = None
    """HF folder or hub id of the reward model. Discriminative: a Qwen2.5-VL checkpoint with a one-output score head
    (``score.weight``, as verl's token-classification reward models, TRL's sequence-classification ones and
    ``python -m vlmrl.reward_model.train`` save it); it sees the images. Generative: a Qwen2.5-VL chat model."""
    input_tokenizer: str | None = None
    """verl's key: set (to the policy's tokenizer, any value) when the reward model has another chat template or
    processor: each conversation is decoded and re-rendered in the reward model's own template and processor. None:
    the reward model reads the policy's token ids and image inputs as they are (same tokenizer and template)."""
    trust_remote_code: bool = False
    """Passed to transformers' loader (only ever from the launch command)."""
    fsdp_config: RewardModelFSDPConfig = field(default_factory=RewardModelFSDPConfig)
    """The discriminative model's FSDP2 settings on the workers."""


@dataclass
class JudgeConfig:
    """How a generative reward model is asked and how its answer becomes a score."""

    prompt_template: str = DEFAULT_JUDGE_TEMPLATE
    """The user turn after the record's images; ``{question}`` (the prompt's text without image placeholders),
    ``{response}`` and ``{ground_truth}`` are filled in."""
    parse: str | None = None
    """A function ``fn(text) -> float`` (``path/to/file.py:fn`` or ``module:fn``) turning the judge's text into the
    score; raising, or returning None or a non-number, counts a parse error. None: the built-in rule (the last
    number in the text; else a last word yes / correct = 1, no / incorrect = 0)."""


@dataclass
class JudgeRolloutConfig:
    """The judge's own engine and sampling (verl's ``reward_model.rollout.*``)."""

    name: str = "vllm"
    """vllm | hf (transformers' generate)."""
    temperature: float = 0.0
    """0 = greedy verdicts."""
    top_p: float = 1.0
    """Nucleus sampling."""
    top_k: int = -1
    """Top-k (-1 = off)."""
    response_length: int = 64
    """The longest verdict, in tokens."""
    prompt_length: int = 2048
    """The longest judge prompt, in tokens (with the image tokens); the engine's context is this plus
    response_length unless max_model_len is set."""
    max_model_len: int | None = None
    """The engine's context length."""
    gpu_memory_utilization: float = 0.3
    """vLLM's share of the driver's GPU for the judge (GPU only)."""


@dataclass
class RewardModelConfig:
    enable: bool = False
    """Score every response with a reward model; its score is the ``reward_model`` reward component (the whole
    reward when reward.function, reward.components and custom_reward_function.path are unset)."""
    style: str = "discriminative"
    """discriminative (a score head read at the response's last token, on the workers, batched, no gradient) |
    generative (a VLM judge writes a verdict, parsed into the score; in the driver, on its own engine)."""
    model: RewardModelModelConfig = field(default_factory=RewardModelModelConfig)
    micro_batch_size_per_gpu: int = 8
    """Samples per forward of the discriminative model on one worker."""
    max_length: int | None = None
    """Longest sequence (prompt + response tokens) the discriminative model reads; a longer response is cut from the
    right (``reward_model/truncated`` counts them). None: no limit."""
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    rollout: JudgeRolloutConfig = field(default_factory=JudgeRolloutConfig)


def reward_model_problems(cfg: Any) -> list[str]:
    """Problems of ``reward_model.*`` values, and of a reward that reads a reward model that is off (or ignores one
    that is on); every one says how to fix it."""
    rm, p = cfg.reward_model, []
    used = uses_reward_model(cfg.reward, cfg.custom_reward_function)
    if not rm.enable:
        if used:
            p.append(
                "reward.function / reward.components use reward_model, but reward_model.enable is False: set "
                "reward_model.enable=True and reward_model.model.path."
            )
        return p
    if not rm.model.path:
        p.append("reward_model.enable=True needs reward_model.model.path (the reward model's folder or hub id).")
    if used is False and (cfg.reward.function or cfg.reward.components or cfg.reward.dispatch):
        p.append(
            "reward_model.enable=True, but the configured reward does not use its score: add "
            "{function: reward_model, name: rm, weight: 1.0} to reward.components (or leave reward.* unset: "
            "the model's score is then the whole reward)."
        )
    if rm.model.input_tokenizer is not None and cfg.actor_rollout_ref.rollout.multi_turn.enable:
        p.append(
            "reward_model.model.input_tokenizer re-renders single-turn conversations only: a multi-turn run's "
            "reward model reads the policy's own ids (unset input_tokenizer)."
        )
    if rm.micro_batch_size_per_gpu < 1:
        p.append(f"reward_model.micro_batch_size_per_gpu={rm.micro_batch_size_per_gpu}: must be >= 1.")
    if rm.max_length is not None and rm.max_length < 2:
        p.append(f"reward_model.max_length={rm.max_length}: must be >= 2 (or null: no limit).")
    if rm.style == "generative":
        p += template_problems(rm.judge.prompt_template)
        ro = rm.rollout
        if ro.response_length < 1 or ro.prompt_length < 1:
            p.append("reward_model.rollout.response_length and prompt_length must be >= 1.")
        if rm.judge.parse:
            from vlmrl.userfiles import load_callable

            try:
                load_callable(rm.judge.parse, "reward_model.judge.parse")
            except Exception as e:  # noqa: BLE001 - any import failure is the setting's problem
                p.append(f"reward_model.judge.parse={rm.judge.parse!r}: {type(e).__name__}: {e}")
    return p


def reward_model_environment(cfg: Any) -> list[str]:
    """Problems of the reward model's folder on this machine: it must load as what ``reward_model.style`` says (a
    discriminative model needs its score head). A hub id is left to the start-up."""
    rm = cfg.reward_model
    path = rm.model.path
    if not rm.enable or not path:
        return []
    if not os.path.isdir(path):
        if path.startswith((".", "/", "~")) or path.count("/") != 1:
            return [f"reward_model.model.path={path!r} does not exist: give a local folder or a hub id."]
        return []
    from vlmrl.models.qwen_vl import SUPPORTED_MODEL_TYPES

    cfg_file = Path(path) / "config.json"
    try:
        mt = json.loads(cfg_file.read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError) as e:
        return [f"reward_model.model.path={path!r}: cannot read {cfg_file.name} ({type(e).__name__}: {e})."]
    if mt not in SUPPORTED_MODEL_TYPES:
        return [
            f"reward_model.model.path={path!r} is a {mt!r} model; reward models are {', '.join(SUPPORTED_MODEL_TYPES)}."
        ]
    if rm.style == "discriminative":
        from vlmrl.models.value_head import require_score_head

        try:
            require_score_head(path)
        except Exception as e:  # noqa: BLE001 - unreadable weights are the folder's problem too
            return [str(e)]
    return []


def uses_reward_model(reward_cfg: Any, custom_cfg: Any) -> bool | None:
    """Whether the configured reward reads the model's score: True when a component or the function is
    ``reward_model``, None when a custom function decides (it may read ``sample.rm_score``), False otherwise."""
    if custom_cfg is not None and custom_cfg.path:
        return None
    entries = list(reward_cfg.components or [])
    for spec in (reward_cfg.dispatch or {}).values():
        if isinstance(spec, str):
            entries.append({"function": spec})
        elif isinstance(spec, dict) or hasattr(spec, "get"):
            entries += list(spec.get("components") or []) or [spec]
    names = [reward_cfg.function] + [e.get("function") if hasattr(e, "get") else e for e in entries]
    return "reward_model" in names


def reward_unset(reward_cfg: Any, custom_cfg: Any) -> bool:
    """No reward function, component, dispatch or custom function was configured."""
    return not (reward_cfg.function or reward_cfg.components or reward_cfg.dispatch or (custom_cfg and custom_cfg.path))


def effective_reward(cfg: Any) -> Any:
    """``cfg.reward``, or, with a reward model and no reward configured, the reward model's score alone (verl's
    behaviour: the model's score is the reward) as the component ``rm``."""
    if not cfg.reward_model.enable or not reward_unset(cfg.reward, cfg.custom_reward_function):
        return cfg.reward
    components = [{"function": "reward_model", "name": "rm", "weight": 1.0}]
    if dataclasses.is_dataclass(cfg.reward):
        return dataclasses.replace(cfg.reward, components=components)
    from omegaconf import OmegaConf

    return OmegaConf.merge(cfg.reward, {"components": components})
