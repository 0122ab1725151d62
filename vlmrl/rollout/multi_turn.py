"""Multi-turn tool rollouts (verl's ``multi_turn``): generate → parse tool calls → run the tools → append the tool
turn (text and images) → generate again.

Two schedules (``multi_turn.schedule``):

- ``trajectory`` (the default; verl's agent loop): each trajectory on its own, its next turn queued in the engine as
  soon as its tool calls return while the others generate or wait on theirs, so neither the slowest generation nor
  the slowest tool call of a turn holds the batch. Needs an engine that streams turns (vLLM's ``start_turns`` /
  ``step_turns``), tool worker processes (``tool_workers`` >= 1) and a one-rank engine; each turn samples from its
  own seed where the engine can keep one per request (``VLLMRollout.seeded_turns``: CUDA, or chunked prefill off on
  CPU), so the trajectories do not depend on when their turns reach the engine.
- ``turn``: every trajectory's turn k together, then every call of turn k, then turn k + 1 (any engine with
  ``generate_turns``: the HF rollout, a tensor-parallel vLLM engine, whose ranks must take the same steps, and
  ``tool_workers=0``, where calls run one after another in this thread).

Token-in/token-out: each turn the engine gets the trajectory's ids (one image pad per image) and its images; the
policy's generated ids are kept as generated (never decoded and re-tokenised); only the tool turns are tokenised.
The response of a sample is every token after the prompt: policy turns (mask 1, engine log-probs) and tool turns
(mask 0, log-prob 0), image pads expanded to each image's token count.

Limits, as verl's agent loop: the trajectory's tokens (tool turns and their image tokens included) stay within
``data.max_response_length``: a tool turn that would reach it ends the trajectory instead; ``max_assistant_turns`` /
``max_user_turns`` end it after that many policy / tool turns; ``max_parallel_calls`` calls run per turn;
``max_tool_images`` images come from tools per trajectory (a turn's calls counted together, in order). A tool that
raises, times out, returns something that is not ``(ToolResponse, reward, metrics)`` or images that are not images,
or is unknown, gives the policy an error message as its result; the call is counted, the step goes on. Calls run in
worker processes (``vlmrl.tools.runner``), where a timeout ends them; a rollout whose calls keep timing out stops the
run. The tools' text is tokenised without special tokens (an echoed ``<|image_pad|>`` stays text).
"""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import torch
from PIL import Image

from vlmrl.batch import PromptSample, RolloutBatch, ToolCallRecord, Trajectory
from vlmrl.models import qwen_vl
from vlmrl.rollout.base import SamplingSpec, TurnOutput, TurnRequest
from vlmrl.supervise import BatchStopped, HangWatch
from vlmrl.timing import Timer
from vlmrl.tools import hermes
from vlmrl.tools.runner import AGENT_KWARGS, ToolOutcome, ToolRequest, ToolRunner


@dataclass
class TrajectoryState:
    """One trajectory while it runs (the agent's steps update it in place)."""

    prompt: PromptSample
    context: list[int]
    """Prompt + response so far, one image pad per image (what the engine takes)."""
    images: list[Image.Image]
    """Prompt images then tool images."""
    response: list[int] = field(default_factory=list)
    """Response ids with image pads expanded (what the trainer takes)."""
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    traj: Trajectory = field(default_factory=lambda: Trajectory([]))
    finish: str = "stop"


@dataclass
class ToolCallTask:
    """One tool call a turn made, and (after :meth:`MultiTurnAgent.run_calls`) what it gave."""

    state: TrajectoryState
    call: hermes.ToolCall
    turn: int
    record: ToolCallRecord | None = None
    images: list[Image.Image] = field(default_factory=list)


def truncate(text: str, limit: int, side: str) -> str:
    """verl's truncation of a long tool text: ``left`` keeps the start, ``right`` the end, ``middle`` both ends."""
    if len(text) <= limit:
        return text
    if side == "left":
        return text[:limit] + "...(truncated)"
    if side == "right":
        return "(truncated)..." + text[-limit:]
    half = limit // 2
    return text[:half] + "...(truncated)..." + text[-half:]


class MultiTurnAgent:
    """Runs multi-turn trajectories on an engine with the configured tools."""

    def __init__(
        self,
        engine: Any,
        tools: ToolRunner,
        cfg: Any,
        tokenizer: Any,
        image_bounds: tuple[int, int, int],
        max_response_length: int,
        max_images: int,
    ) -> None:
        """``tools``: where the calls run; ``cfg``: ``actor_rollout_ref.rollout.multi_turn``; ``image_bounds``:
        (patch factor, min_pixels, max_pixels) every image is resized with; ``max_images``: images the engine takes
        per request (prompt and tool images together)."""
        self.engine = engine
        self.tools = tools
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.vision = qwen_vl.vision_token_ids(tokenizer)
        self.bounds = image_bounds
        self.budget = int(max_response_length)
        self.max_images = int(max_images)

    # ------------------------------------------------------------------------------------------------- loop
    def per_trajectory(self) -> bool:
        """Whether rollouts run per trajectory (``multi_turn.schedule=trajectory`` on an engine that streams turns,
        with tool worker processes and a one-rank engine); else turn by turn."""
        return (
            getattr(self.cfg, "schedule", "trajectory") == "trajectory"
            and hasattr(self.engine, "start_turns")
            and self.tools.pool is not None
            and self.tools.group is None
        )

    def generate(self, prompts: list[PromptSample], spec: SamplingSpec) -> RolloutBatch:
        """``spec.n`` trajectories per prompt, grouped by prompt."""
        timer = Timer()
        states = [s for p in prompts for s in self.new_states(p, spec.n)]
        watch = self.tools.new_watch()  # the rollout's timeouts, counted across its turns
        per_trajectory = self.per_trajectory()
        if per_trajectory:
            self._run_per_trajectory(states, spec, timer, watch)
        else:
            self._run_turn_by_turn(states, spec, timer, watch)
        batch = self.rollout_of(states, spec.n)
        batch.timing["generate_s"] = timer.elapsed
        batch.timing["tool_s"] = timer["tool"]
        batch.timing["tool_wait_s"] = timer["tool_wait"] if per_trajectory else timer["tool"]
        return batch

    def new_states(self, prompt: PromptSample, n: int) -> list[TrajectoryState]:
        """``n`` trajectories of a prompt, before their first turn."""
        return [TrajectoryState(prompt, list(prompt.prompt_ids), list(prompt.images)) for _ in range(n)]

    def rollout_of(self, states: list[TrajectoryState], n: int) -> RolloutBatch:
        """Ended trajectories as a rollout of ``n`` samples per prompt (grouped by prompt): each prompt's image pads
        expanded, the responses with their masks and log-probs."""
        batch = RolloutBatch([], [], [], [], n=n)
        for s in states:
            counts = [self._image_tokens(im) for im in s.prompt.images]
            batch.prompt_ids.append(qwen_vl.expand_image_pads(s.prompt.prompt_ids, self.vision.image_pad, counts))
            batch.response_ids.append(s.response)
            batch.logprobs.append(s.logprobs)
            batch.finish_reasons.append(s.finish)
            s.traj.response_mask = s.mask
            batch.trajectories.append(s.traj)
        return batch

    def _run_turn_by_turn(
        self, states: list[TrajectoryState], spec: SamplingSpec, timer: Timer, watch: HangWatch | None
    ) -> None:
        """Every trajectory's turn k generates together, then every call of turn k runs, then turn k + 1."""
        active = list(states)
        while active:
            outs = self.engine.generate_turns([self.turn_request(s) for s in active], spec)
            calls = [c for s, o in zip(active, outs) for c in self.after_turn(s, o)]
            with timer("tool"):
                self.run_calls(calls, watch)
            active = self.append_tool_turns(calls)

    def _run_per_trajectory(
        self, states: list[TrajectoryState], spec: SamplingSpec, timer: Timer, watch: HangWatch | None
    ) -> None:
        """Each trajectory on its own schedule: its next turn goes into the engine as soon as its tool calls return,
        while the others generate or wait on theirs (the engine's scheduler runs up to ``max_num_seqs`` at once, the
        tool workers ``tool_workers`` calls). Each turn gets its own seed (drawn from torch's generator once per
        rollout, then fixed by the trajectory and the turn; the engine samples from it where it can), so the
        trajectories do not depend on the order the turns reach the engine in. ``timer`` gets ``tool`` (seconds
        during which some call ran) and ``tool_wait`` (of those, the seconds the engine sat idle, every trajectory
        waiting on its tools)."""
        base = int(torch.randint(0, 2**31 - 1, (1,)))
        index = {id(s): k for k, s in enumerate(states)}
        in_engine: dict[str, tuple[int, TrajectoryState]] = {}
        running: dict[Future, list[ToolCallTask]] = {}

        def start(batch: list[tuple[int, TrajectoryState]]) -> None:
            seeds = [(base + 1_000_003 * k + 7919 * s.traj.assistant_turns) % 2**31 for k, s in batch]
            ids = self.engine.start_turns([self.turn_request(s) for _, s in batch], spec, seeds)
            in_engine.update(zip(ids, batch))

        pool = ThreadPoolExecutor(max_workers=max(1, min(len(states), 64)), thread_name_prefix="vlmrl-tool-calls")
        busy_since = 0.0  # when calls began running with none before
        try:
            start(list(enumerate(states)))
            while in_engine or running:
                if in_engine:
                    for rid, out in self.engine.step_turns():
                        if rid not in in_engine:
                            raise RuntimeError(f"the engine finished a request it was not given here ({rid!r})")
                        _, s = in_engine.pop(rid)
                        calls = self.after_turn(s, out)
                        if calls:
                            if not running:
                                busy_since = time.perf_counter()
                            running[pool.submit(self.run_calls, calls, watch)] = calls
                else:
                    with timer("tool_wait"):
                        wait(list(running), return_when=FIRST_COMPLETED)
                ready: list[tuple[int, TrajectoryState]] = []
                for future in [f for f in running if f.done()]:
                    if future.exception() is not None:  # a tool that hangs stops the rollout (HangError)
                        raise _first_error(running, watch)
                    calls = running.pop(future)
                    ready += [(index[id(s)], s) for s in self.append_tool_turns(calls)]
                if busy_since and not running:
                    timer.add("tool", time.perf_counter() - busy_since)
                    busy_since = 0.0
                if ready:
                    start(ready)
        except BaseException as e:
            if watch is not None:  # the other trajectories' calls end now, not at their timeouts
                watch.stop(f"the rollout stopped ({type(e).__name__})")
            self.engine.abort_turns(list(in_engine))
            for future in running:
                future.cancel()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def turn_request(self, s: TrajectoryState) -> TurnRequest:
        """A trajectory's next turn: its whole context, and what is left of its token budget (or one turn's)."""
        left = self.budget - len(s.response)
        per_turn = self.cfg.max_tokens_per_turn
        return TurnRequest(s.context, s.images, min(left, per_turn) if per_turn else left, s.prompt)

    def after_turn(self, s: TrajectoryState, o: TurnOutput) -> list[ToolCallTask]:
        """Append a generated turn to its trajectory; the tool calls it makes (none: the trajectory has ended)."""
        s.context += o.ids
        s.response += o.ids
        s.mask += [1] * len(o.ids)
        s.logprobs += list(o.logprobs) + [0.0] * (len(o.ids) - len(o.logprobs))
        s.finish = o.finish
        turn = s.traj.assistant_turns
        s.traj.assistant_turns += 1
        text = self.tokenizer.decode(o.ids, skip_special_tokens=True)
        s.traj.turn_texts.append(("assistant", text))
        if o.finish == "length" or len(s.response) >= self.budget:
            return []
        if self.cfg.max_assistant_turns and s.traj.assistant_turns >= self.cfg.max_assistant_turns:
            return []
        if self.cfg.max_user_turns and s.traj.user_turns >= self.cfg.max_user_turns:
            return []
        return [ToolCallTask(s, c, turn) for k, c in enumerate(hermes.parse(text)) if k < self.cfg.max_parallel_calls]

    def _image_tokens(self, image: Image.Image) -> int:
        factor, lo, hi = self.bounds
        return qwen_vl.num_image_tokens(image.width, image.height, factor, lo, hi)

    def append_tool_turns(self, calls: list[ToolCallTask]) -> list[TrajectoryState]:
        """Append each trajectory's tool turn (its calls' results in order); the trajectories that go on."""
        by_state: dict[int, list[ToolCallTask]] = {}
        for c in calls:
            by_state.setdefault(id(c.state), []).append(c)
        going = []
        for group in by_state.values():
            s = group[0].state
            results = [(c.record.text if c.record else "", len(c.images)) for c in group]
            ids = [
                i
                for text, is_tool_text in hermes.tool_turn_pieces(results)
                for i in self.tokenizer(text, add_special_tokens=False, split_special_tokens=is_tool_text)["input_ids"]
            ]
            images = [im for c in group for im in c.images]
            expanded = qwen_vl.expand_image_pads(ids, self.vision.image_pad, [self._image_tokens(im) for im in images])
            for c in group:
                s.traj.calls.append(c.record)  # type: ignore[arg-type]
            if len(s.response) + len(expanded) >= self.budget:
                for c in group:  # the turn does not fit: the trajectory ends here (verl's rule)
                    if c.record is not None and c.record.error is None:
                        c.record.error = "budget: the tool turn would exceed data.max_response_length"
                continue
            s.context += ids
            s.images += images
            s.traj.images += images
            s.response += expanded
            s.mask += [0] * len(expanded)
            s.logprobs += [0.0] * len(expanded)
            s.traj.user_turns += 1
            s.traj.turn_texts.append(("tool", "\n".join(r[0] for r in results)))
            going.append(s)
        return going

    # ------------------------------------------------------------------------------------------------ tools
    def run_calls(self, calls: list[ToolCallTask], watch: HangWatch | None) -> None:
        """Run a turn's calls (``vlmrl.tools.runner``: in worker processes, ``tool_timeout_s`` each) and record what
        each gave, in order; the images of a trajectory's calls count together against its limits."""
        run: list[ToolCallTask] = []
        for c in calls:
            if c.call.error is not None:
                c.record = self._error(c, "parse", c.call.error)
            elif c.call.name not in self.tools.names:
                msg = f"no tool named {c.call.name!r} (tools: {', '.join(self.tools.names)})"
                c.record = self._error(c, "unknown_tool", msg)
            else:
                run.append(c)
        outcomes = self.tools.run([self._request(c) for c in run], watch)
        added: dict[int, int] = {}  # images accepted this turn, per trajectory
        for c, out in zip(run, outcomes):
            c.record, c.images = self._record(c, out, added.get(id(c.state), 0))
            added[id(c.state)] = added.get(id(c.state), 0) + len(c.images)

    def _request(self, c: ToolCallTask) -> ToolRequest:
        """What the tool gets: the policy's arguments, the record's ``create_kwargs`` (data: never the image, the
        source image or the pixel bounds, which are the agent's), the record's first image and answer."""
        p = c.state.prompt
        kwargs = (p.extra_info.get("tools_kwargs") or {}).get(c.call.name) or {}
        create_kwargs = kwargs.get("create_kwargs") if isinstance(kwargs, dict) else None
        data = {k: v for k, v in dict(create_kwargs or {}).items() if k not in AGENT_KWARGS}
        return ToolRequest(
            c.call.name,
            dict(c.call.arguments),
            data,
            image=p.images[0] if p.images else None,
            source_image=p.source_images[0] if p.source_images else None,
            image_bounds=self.bounds,
            ground_truth=p.ground_truth,
        )

    def _error(self, c: ToolCallTask, kind: str, msg: str, seconds: float = 0.0) -> ToolCallRecord:
        """A failed call: the policy reads ``Error: ...`` (cut to ``max_tool_response_length``), the record keeps
        the kind and the message."""
        text = truncate(f"Error: {msg}", int(self.cfg.max_tool_response_length), self.cfg.tool_response_truncate_side)
        return ToolCallRecord(c.call.name, c.call.arguments, text, error=f"{kind}: {msg}", seconds=seconds, turn=c.turn)

    def _record(self, c: ToolCallTask, out: ToolOutcome, added: int) -> tuple[ToolCallRecord, list[Image.Image]]:
        """The record and resized images of a call's outcome; ``added``: tool images this trajectory already took in
        this turn. Images over ``max_tool_images`` (tool images per trajectory) or over what the engine takes per
        request make the call an error."""
        if out.error is not None:
            return self._error(c, out.error, out.message, out.seconds), []
        n = len(out.images)
        used = len(c.state.traj.images) + added
        if n and used + n > int(self.cfg.max_tool_images):
            msg = (
                f"{n} more image(s) would exceed max_tool_images={self.cfg.max_tool_images} (tool images per "
                f"trajectory; {used} already)"
            )
            return self._error(c, "bad_result", msg, out.seconds), []
        if n and len(c.state.images) + added + n > self.max_images:
            msg = f"{n} more image(s) would exceed the {self.max_images} images per trajectory the engine takes"
            return self._error(c, "bad_result", msg, out.seconds), []
        factor, lo, hi = self.bounds
        try:
            images = [qwen_vl.resize_image(im, factor, lo, hi) for im in out.images]
        except ValueError as e:
            return self._error(c, "bad_result", f"an image cannot be shown to the model: {e}", out.seconds), []
        text = truncate(out.text, int(self.cfg.max_tool_response_length), self.cfg.tool_response_truncate_side)
        return ToolCallRecord(
            c.call.name, c.call.arguments, text, images=len(images), reward=out.reward, seconds=out.seconds, turn=c.turn
        ), images


def _first_error(running: dict[Future, list[ToolCallTask]], watch: HangWatch | None) -> BaseException:
    """The error that stops a per-trajectory rollout: the other trajectories' calls are stopped (their batches end
    within a poll) and waited for; the first real error wins over the :class:`BatchStopped` it caused."""
    if watch is not None:
        watch.stop("another trajectory's tool calls stopped the rollout")
    wait(list(running))
    errors = [e for f in running if (e := f.exception()) is not None]
    real = [e for e in errors if not isinstance(e, BatchStopped)]
    return (real or errors)[0]


def multi_turn_metrics(trajectories: list[Trajectory], tool_names: list[str] | None = None) -> dict[str, float]:
    """``multi_turn/*`` metrics of a batch: turns and calls per trajectory, per-tool calls and errors (counts per
    step), error kinds, tool time."""
    if not trajectories:
        return {}
    n = len(trajectories)
    calls = [c for t in trajectories for c in t.calls]
    out = {
        "multi_turn/turns/mean": sum(t.assistant_turns for t in trajectories) / n,
        "multi_turn/turns/max": float(max(t.assistant_turns for t in trajectories)),
        "multi_turn/tool_calls/mean": len(calls) / n,
        "multi_turn/tool_calls/max": float(max(len(t.calls) for t in trajectories)),
        "multi_turn/called_share": sum(1 for t in trajectories if t.calls) / n,
        "multi_turn/tool_errors": float(sum(1 for c in calls if c.error)),
        "multi_turn/tool_s/mean": (sum(c.seconds for c in calls) / len(calls)) if calls else 0.0,
        "multi_turn/tool_reward/mean": sum(t.tool_reward for t in trajectories) / n,
        "multi_turn/policy_tokens/mean": sum(sum(t.response_mask) for t in trajectories) / n,
    }
    names = Counter(c.name or "<unparsed>" for c in calls)
    for name in set(tool_names or []) | set(names):
        out[f"multi_turn/calls/{name}"] = float(names.get(name, 0))
        out[f"multi_turn/errors/{name}"] = float(sum(1 for c in calls if (c.name or "<unparsed>") == name and c.error))
    kinds = Counter(c.error.split(":", 1)[0] for c in calls if c.error)
    for kind, k in kinds.items():
        out[f"multi_turn/error_kind/{kind}"] = float(k)
    return out
