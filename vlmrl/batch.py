"""Typed containers passed between stages: the contract between data, rollout, reward and the workers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from PIL import Image

if TYPE_CHECKING:  # annotations only: the report (which reads this module) must not load torch
    import torch


@dataclass
class Video:
    """One video of a prompt: its sampled frames exactly as the model sees them, and when they were taken."""

    frames: list[Image.Image]
    """RGB frames, all of one size (resized with qwen-vl-utils' video rules), a whole number of pairs (an odd count
    is padded by repeating the last frame, as the processor would)."""
    timestamps: list[float]
    """Seconds of each frame in the source video (one per frame)."""
    sample_fps: float
    """Frames per second of the sampled frames: the processor's and the engine's ``second_per_grid_ts`` is
    ``temporal_patch_size / sample_fps``."""
    original_size: tuple[int, int] = (0, 0)
    """(width, height) of the source frames before resizing."""

    @property
    def scale(self) -> tuple[float, float]:
        """(sx, sy): resized = original * scale."""
        w, h = self.original_size
        return (self.frames[0].width / w, self.frames[0].height / h) if w and h else (1.0, 1.0)


@dataclass
class PromptSample:
    """One dataset record, ready for the rollout engine and the trainer."""

    index: int
    """Position of the record in the dataset (after filtering)."""
    uid: str
    """Stable id of the source record: ``<file>:<row>``."""
    data_source: str
    """The record's ``data_source`` (drives reward dispatch and per-source metrics)."""
    messages: list[dict[str, Any]]
    """The chat, with ``{"type": "image"}`` / ``{"type": "video"}`` parts where ``<image>`` / ``<video>`` stood."""
    prompt_text: str
    """The chat rendered by the chat template, generation prompt added (one image pad per image)."""
    prompt_ids: list[int]
    """Token ids of ``prompt_text`` with ONE image pad per image and ONE video pad per video (the engine expands
    them)."""
    images: list[Image.Image]
    """RGB images resized with Qwen's rules: exactly what the engine and the trainer see."""
    original_sizes: list[tuple[int, int]]
    """(width, height) of each image before resizing."""
    ground_truth: Any
    """``reward_model.ground_truth``."""
    extra_info: dict[str, Any] = field(default_factory=dict)
    """``extra_info`` of the record (split, index, answer, question, annotations...)."""
    source_images: list[Image.Image] = field(default_factory=list)
    """Multi-turn runs: each image as decoded, before resizing (the same object as in ``images`` when resizing did
    not change it), for tools that look closer than the model's pixel budget (``image_zoom``). Empty otherwise."""
    videos: list[Video] = field(default_factory=list)
    """The record's videos (``<video>`` parts, in order); their pads follow the images' rules: one per video."""

    @property
    def image_scales(self) -> list[tuple[float, float]]:
        """(sx, sy) per image: resized = original * scale (map box coordinates with it)."""
        return [(im.width / ow, im.height / oh) for im, (ow, oh) in zip(self.images, self.original_sizes)]


@dataclass
class RewardSample:
    """What a reward function sees for one response (vlmrl's signature ``fn(sample)``)."""

    response: str
    """The decoded response text (special tokens removed)."""
    prompt: str
    """The rendered prompt text."""
    ground_truth: Any
    """``reward_model.ground_truth`` of the record."""
    data_source: str = ""
    """The record's data_source."""
    extra_info: dict[str, Any] = field(default_factory=dict)
    """The record's extra_info."""
    images: list[Image.Image] = field(default_factory=list)
    """The images exactly as the model saw them (resized)."""
    image_scales: list[tuple[float, float]] = field(default_factory=list)
    """(sx, sy) per image: resized = original * scale."""
    videos: list[Video] = field(default_factory=list)
    """The videos exactly as the model saw them: ``frames`` (resized) and their ``timestamps`` in seconds."""
    response_length: int = 0
    """Response length in tokens."""
    max_response_length: int = 0
    """The run's response length limit in tokens (for overlong penalties)."""
    finish_reason: str = "stop"
    """stop | length."""
    trajectory: Trajectory | None = None
    """Multi-turn samples: the turns (``turn_texts``), tool calls and the images tools returned (None otherwise).
    ``response`` is then the whole response, tool turns included (as verl decodes it), and ``extra_info`` also holds
    verl's ``tool_rewards`` (each call's step reward) and ``turn_scores``."""
    rm_score: float | None = None
    """The reward model's score of this response (``reward_model.enable``; the ``reward_model`` component returns
    it); None without a reward model, or where it failed on this sample (``rm_error`` says why)."""
    rm_text: str | None = None
    """A generative judge's verdict, as it wrote it."""
    rm_error: str | None = None
    """Why the reward model has no score for this sample."""

    @staticmethod
    def of_rollout(
        prompts: list[PromptSample], rollout: RolloutBatch, tokenizer: Any, max_response_length: int
    ) -> list[RewardSample]:
        """What the reward functions see for each sample of a rollout (responses decoded here, once per step)."""
        texts = tokenizer.batch_decode(rollout.response_ids, skip_special_tokens=True)
        out = []
        for i, text in enumerate(texts):
            p = prompts[i // rollout.n]
            traj = rollout.trajectories[i] if rollout.trajectories else None
            info = p.extra_info
            if traj is not None:
                info = {**p.extra_info, "tool_rewards": [c.reward for c in traj.calls], "turn_scores": []}
            out.append(
                RewardSample(
                    response=text,
                    prompt=p.prompt_text,
                    ground_truth=p.ground_truth,
                    data_source=p.data_source,
                    extra_info=info,
                    images=p.images,
                    image_scales=p.image_scales,
                    videos=p.videos,
                    response_length=len(rollout.response_ids[i]),
                    max_response_length=max_response_length,
                    finish_reason=rollout.finish_reasons[i],
                    trajectory=traj,
                )
            )
        return out


@dataclass
class ToolCallRecord:
    """One tool call of a multi-turn trajectory, as the policy wrote it and as the tool answered."""

    name: str
    """The tool called ("" when the call could not be parsed)."""
    arguments: dict[str, Any]
    """The parsed arguments."""
    text: str
    """What the policy read back (the tool's text, or the error message)."""
    images: int = 0
    """Images the tool returned."""
    error: str | None = None
    """None on success; else the kind (parse | unknown_tool | exception | timeout | bad_result | budget) and why."""
    reward: float = 0.0
    """The tool's step reward."""
    seconds: float = 0.0
    """Wall time of create + execute + release."""
    turn: int = 0
    """The policy turn (0-based) that made the call."""


@dataclass
class Trajectory:
    """What a multi-turn sample did besides its tokens: turns, tool calls, the images tools returned."""

    response_mask: list[int]
    """Per response token (as in ``RolloutBatch.response_ids``): 1 = the policy's, 0 = a tool turn's."""
    images: list[Image.Image] = field(default_factory=list)
    """Images the tools returned, in order (resized as the model saw them)."""
    calls: list[ToolCallRecord] = field(default_factory=list)
    """Every tool call, in order."""
    assistant_turns: int = 0
    """Policy turns."""
    user_turns: int = 0
    """Tool turns appended."""
    turn_texts: list[tuple[str, str]] = field(default_factory=list)
    """(role, text) of each turn of the response: ``assistant`` (the policy's) or ``tool`` (what it read)."""

    @property
    def tool_reward(self) -> float:
        """Sum of the calls' step rewards (verl's ``tool_rewards``)."""
        return float(sum(c.reward for c in self.calls))


GroupOrigin = tuple[int, int, int]
"""Where a prompt group's samples were generated: (engine group: the worker's rank // tensor_model_parallel_size,
the workers' rollout id, group index in it); every worker of that engine group keeps them."""


@dataclass
class RolloutBatch:
    """Output of ``Rollout.generate``: ``n`` samples per prompt, grouped: sample ``i`` belongs to prompt ``i // n``."""

    prompt_ids: list[list[int]]
    """Per sample: prompt ids as the engine expanded them (one pad per image token)."""
    response_ids: list[list[int]]
    """Per sample: generated token ids (EOS included when generated)."""
    logprobs: list[list[float]]
    """Per sample: log-probability of each generated token under the engine."""
    finish_reasons: list[str]
    """Per sample: ``stop`` or ``length``."""
    n: int
    """Samples per prompt."""
    timing: dict[str, float] = field(default_factory=dict)
    """Seconds spent, by stage."""
    origins: list[GroupOrigin] = field(default_factory=list)
    """Per prompt group: the engine group that generated it and where its workers keep it (set for training
    rollouts, which the workers keep until the update that names them)."""
    trajectories: list[Trajectory] = field(default_factory=list)
    """Per sample, for multi-turn rollouts (empty otherwise): the policy-token mask, tool images and calls. Tool
    turns are part of ``response_ids`` (their image pads expanded) with log-prob 0."""

    def __len__(self) -> int:
        return len(self.response_ids)

    @property
    def num_groups(self) -> int:
        """Prompt groups (prompts) in the batch."""
        return len(self.response_ids) // self.n if self.n else 0

    def select_groups(self, groups: list[int]) -> RolloutBatch:
        """The samples of the given prompt groups (prompt ``g`` owns samples ``g*n .. g*n+n-1``), in that order."""
        rows = [g * self.n + j for g in groups for j in range(self.n)]
        return RolloutBatch(
            [self.prompt_ids[i] for i in rows],
            [self.response_ids[i] for i in rows],
            [self.logprobs[i] for i in rows],
            [self.finish_reasons[i] for i in rows],
            n=self.n,
            timing=dict(self.timing),
            origins=[self.origins[g] for g in groups] if self.origins else [],
            trajectories=[self.trajectories[i] for i in rows] if self.trajectories else [],
        )

    @staticmethod
    def concat(parts: list[RolloutBatch]) -> RolloutBatch:
        """The batches one after the other (the workers' in rank order, or groups chosen from several rollouts);
        timings are the slowest part's (its wall-clock span: the first ``start_time``, the last ``end_time``)."""
        if not parts:
            raise ValueError("RolloutBatch.concat needs at least one part")
        out = RolloutBatch([], [], [], [], n=parts[0].n)
        for p in parts:
            if p.n != out.n:
                raise ValueError(f"cannot concatenate rollouts of n={out.n} and n={p.n}")
            out.prompt_ids += p.prompt_ids
            out.response_ids += p.response_ids
            out.logprobs += p.logprobs
            out.finish_reasons += p.finish_reasons
            out.origins += p.origins
            out.trajectories += p.trajectories
        if out.trajectories and len(out.trajectories) != len(out.response_ids):
            raise ValueError("cannot concatenate multi-turn and single-turn rollouts")
        span = {"start_time": min}
        out.timing = {k: span.get(k, max)(p.timing.get(k, 0.0) for p in parts) for k in parts[0].timing}
        return out


@dataclass
class TrainShard:
    """What one worker trains on in one update: exactly these samples, in this order, nothing else.

    Groups this worker generated are named (``stored``: its rollout id and group index; the prompts and samples stay
    on the worker, images included); groups another worker generated travel as data (``sent``), which happens only
    when dynamic sampling moved groups between workers. ``advantages`` follow that order: stored groups first."""

    stored: list[tuple[int, int]]
    """(rollout id, group index) of this worker's own rollouts."""
    sent: tuple[list[PromptSample], RolloutBatch] | None
    """Prompt groups generated elsewhere, as data."""
    advantages: list[float]
    """One per sample, in order (empty when ``token_advantages`` holds them)."""
    mini_batch_samples: int
    """Samples per optimizer step on this worker."""
    samples: list[int] = field(default_factory=list)
    """The step's index of each sample, in order."""
    token_advantages: torch.Tensor | None = None
    """[b, R] per-token advantages (PPO with a critic or the in-reward KL), rows in order. Such a shard was prepared
    (``WorkerGroup.prepare``): the worker kept its inputs, log-probs and values, and the update uses them."""
    returns: torch.Tensor | None = None
    """[b, R] the critic's value targets (None: no critic update)."""
    critic_mini_batch_samples: int = 0
    """Samples per critic optimizer step on this worker."""
    update_actor: bool = True
    """False during trainer.critic_warmup: only the critic learns."""
    rewards: list[float] = field(default_factory=list)
    """Each sample's score as the advantages saw it (after ``before_train_step``), in order: ``compute_loss``'s
    token-level ``rewards``."""
    algorithm_state: dict[str, Any] | None = None
    """The algorithm class's state after this step's ``before_train_step`` (``algorithm.name``), for the workers'
    instances."""


@dataclass
class PreparedShard:
    """What a worker computed on its shard before the advantages (PPO path): [b, R] tensors, rows in the shard's
    order, columns aligned with the responses (R: this shard's longest)."""

    response_mask: torch.Tensor
    """1 on the tokens the policy generated (0: padding, tool responses)."""
    old_logprobs: torch.Tensor | None
    """The policy's log-probs before the update (for the in-reward KL; None when not needed)."""
    ref_logprobs: torch.Tensor | None
    """The reference's log-probs (None without a reference)."""
    values: torch.Tensor | None
    """The critic's values (None without a critic)."""
    sum_pi_squared: torch.Tensor | None = None
    """The policy's sum over the vocabulary of squared token probabilities (optimal-token-baseline estimators)."""


def split_even(items: list[Any], parts: int) -> list[list[Any]]:
    """Split into ``parts`` contiguous chunks of equal size (one more item in each of the first ``len(items) %
    parts`` chunks when they do not divide evenly; some chunks are empty when there are fewer items than parts)."""
    k, r = divmod(len(items), parts)
    bounds = [i * k + min(i, r) for i in range(parts + 1)]
    return [items[bounds[i] : bounds[i + 1]] for i in range(parts)]
