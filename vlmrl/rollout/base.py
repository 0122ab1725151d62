"""The rollout protocol shared by the vLLM and HF engines, and the sampling settings they take."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from vlmrl.batch import PromptSample, RolloutBatch


@dataclass(frozen=True)
class SamplingSpec:
    """How to sample one batch of responses."""

    n: int = 1
    """Samples per prompt."""
    max_tokens: int = 16
    """Longest response in tokens."""
    temperature: float = 1.0
    """Temperature; 0 (or greedy=True) = greedy."""
    top_p: float = 1.0
    """Nucleus sampling."""
    top_k: int = -1
    """Top-k (-1 = off)."""
    greedy: bool = False
    """Greedy decoding (validation)."""
    ignore_eos: bool = False
    """Always generate max_tokens (benchmarks)."""

    @property
    def is_greedy(self) -> bool:
        """True when decoding is greedy."""
        return self.greedy or self.temperature <= 0.0


def sampling_specs(rollout_cfg, max_response_length: int) -> tuple[SamplingSpec, SamplingSpec]:
    """(training, validation) sampling settings from ``actor_rollout_ref.rollout``."""
    train = SamplingSpec(
        n=rollout_cfg.n,
        max_tokens=max_response_length,
        temperature=rollout_cfg.temperature,
        top_p=rollout_cfg.top_p,
        top_k=rollout_cfg.top_k,
        ignore_eos=rollout_cfg.ignore_eos,
    )
    v = rollout_cfg.val_kwargs
    val = SamplingSpec(
        n=v.n,
        max_tokens=max_response_length,
        temperature=v.temperature if v.do_sample else 0.0,
        top_p=v.top_p,
        top_k=v.top_k,
        greedy=not v.do_sample,
        ignore_eos=rollout_cfg.ignore_eos,
    )
    return train, val


@dataclass
class TurnRequest:
    """One generation of a multi-turn trajectory: the whole context so far, token-in."""

    ids: list[int]
    """Context ids with ONE image pad per image (the engine expands them)."""
    images: list[Any]
    """The context's images in order (prompt images, then tool images), resized as the model sees them."""
    max_tokens: int
    """Tokens this turn may generate."""
    prompt: Any = None
    """The trajectory's ``PromptSample`` (engines ignore it; a scripted policy may read its record)."""


@dataclass
class TurnOutput:
    """What one turn generated."""

    ids: list[int]
    """Generated ids (EOS included when generated)."""
    logprobs: list[float]
    """Engine log-prob of each generated id."""
    finish: str
    """stop | length."""


class Rollout(Protocol):
    """A rollout engine: generates responses for prompts with images, and takes new policy weights."""

    def generate(self, prompts: list[PromptSample], spec: SamplingSpec) -> RolloutBatch:
        """``spec.n`` samples per prompt, grouped by prompt; engine-expanded prompt ids, response ids, logprobs."""
        ...

    def generate_turns(self, requests: list[TurnRequest], spec: SamplingSpec) -> list[TurnOutput]:
        """One sample per request (``spec.n`` is ignored), each with its own ``max_tokens``: a multi-turn step."""
        ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> float:
        """Load new weights (HF names) into the running engine; returns seconds taken."""
        ...

    def sleep(self) -> None:
        """Free engine memory while the trainer runs (GPU); a no-op elsewhere."""
        ...

    def wake(self) -> None:
        """Undo ``sleep`` before the next weight push and rollout."""
        ...
