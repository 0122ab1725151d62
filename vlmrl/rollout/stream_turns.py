"""Streamed multi-turn tool trajectories on a running vLLM engine: the rollout worker's side of the fully asynchronous
trainer with ``rollout.multi_turn`` (verl's ``fully_async_policy`` with its agent loop).

Prompt groups go in one at a time (:meth:`TrajectoryStream.add`), as :class:`~vlmrl.rollout.stream.PromptStream`
takes them; each of a group's ``n`` trajectories then runs on its own schedule, as the per-trajectory agent loop of
``rollout.multi_turn`` runs them: a turn is one engine request (the trajectory's context so far, one image pad per
image, and its images); a turn that ends in tool calls hands them to the agent's tool workers (``tool_workers``
processes; a thread here waits on each trajectory's calls) and the trajectory's next turn goes into the engine as
soon as they return, while the engine generates the others' turns. The turns, masks, limits and tool images are the
agent's (``MultiTurnAgent.after_turn`` / ``append_tool_turns``), so a streamed trajectory is built exactly as a
batch-rollout one. :meth:`TrajectoryStream.step` hands back the groups whose ``n`` trajectories have all ended, in
the order they ended.

At a weight sync with partial rollouts, :meth:`TrajectoryStream.interrupt` aborts every turn in the engine keeping
its tokens so far; :meth:`TrajectoryStream.resume` continues each turn with the new weights (its context plus its
tokens as the request's prompt, the rest of the turn's limit as its own). Tool calls running at the sync go on; the
turns after them start from the weights loaded then. Every policy token keeps the log-prob and the weight version it
was generated with; the tokens of a tool turn (mask 0) carry the version of the policy token before them.
"""

from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from vlmrl.rollout.base import SamplingSpec, TurnOutput, TurnRequest
from vlmrl.rollout.multi_turn import MultiTurnAgent, ToolCallTask, TrajectoryState
from vlmrl.rollout.stream import StreamGroup, StreamItem
from vlmrl.supervise import HangWatch

TOOL_POLL_S = 0.05
"""How long a step waits on tool calls when the engine has nothing to run (then it counts as one engine step)."""


@dataclass
class _Trajectory:
    """One trajectory of a streamed group."""

    item: StreamItem
    j: int
    state: TrajectoryState
    version: int
    """The weights it started with."""
    versions: list[int] = field(default_factory=list)
    """Per response token (``state.response``): the weight version that generated it."""
    turn_ids: list[int] = field(default_factory=list)
    """The running turn's tokens so far (an interrupted turn keeps them)."""
    turn_logprobs: list[float] = field(default_factory=list)
    turn_versions: list[int] = field(default_factory=list)
    turn_limit: int = 0
    """Tokens the running turn may generate in all."""
    requests: int = 0
    """Engine requests it took (its turns and their continuations)."""
    interrupted: bool = False
    """A turn of it was continued across a sync."""
    ended: bool = False
    calls_ran: list[tuple[float, float]] = field(default_factory=list)
    """When each of its turns' tool calls started and ended."""


class TrajectoryStream:
    """Streamed multi-turn groups on one :class:`~vlmrl.rollout.vllm.VLLMRollout` (the module's docstring); the
    interface of :class:`~vlmrl.rollout.stream.PromptStream`."""

    def __init__(self, engine: Any, agent: MultiTurnAgent, spec: SamplingSpec) -> None:
        """``agent``: the rollout worker's multi-turn agent (its tools, limits and image bounds)."""
        if agent.tools.pool is None:
            raise ValueError(
                "streamed multi-turn rollouts run tool calls in worker processes: set "
                "actor_rollout_ref.rollout.multi_turn.tool_workers >= 1"
            )
        self.engine, self.agent, self.spec = engine, agent, spec
        self.running: dict[str, _Trajectory] = {}
        """Turns in the engine, by request id."""
        self.stopped: list[_Trajectory] = []
        """Trajectories whose turn :meth:`interrupt` stopped, waiting for :meth:`resume`."""
        self.calling: dict[Future, tuple[_Trajectory, list[ToolCallTask]]] = {}
        """Tool calls running, one future per trajectory's turn."""
        self.groups: dict[int, list[_Trajectory]] = {}
        """Groups not yet handed back, by ``gid``."""
        self.watches: dict[int, HangWatch | None] = {}
        """Each group's timeout policy (a group is one rollout's worth of calls to it)."""
        self.started: dict[int, float] = {}
        self.done: list[int] = []
        """Groups that ended and are not handed back yet."""
        self.version = -1
        self.pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="vlmrl-stream-tools")

    @property
    def unfinished(self) -> int:
        """Trajectories not ended (generating, waiting on their tools, or interrupted)."""
        return sum(not t.ended for ts in self.groups.values() for t in ts)

    # ------------------------------------------------------------------------------------------------ turns
    def add(self, items: list[StreamItem], version: int) -> None:
        """Start ``items`` (``spec.n`` trajectories each) with the engine's weights (``version`` updates)."""
        self.version = version
        for it in items:
            states = self.agent.new_states(it.prompt, self.spec.n)
            group = [_Trajectory(it, j, s, version) for j, s in enumerate(states)]
            self.groups[it.gid] = group
            self.watches[it.gid] = self.agent.tools.new_watch()
            self.started[it.gid] = time.time()
            for t in group:
                self._start_turn(t)

    def _start_turn(self, t: _Trajectory) -> None:
        """Queue ``t``'s next turn, or the rest of its interrupted one. Each step's new tokens are reported (kept
        here as they come, so an interrupted turn keeps what it generated)."""
        from vllm.sampling_params import RequestOutputKind

        if not t.turn_ids:
            t.turn_limit = self.agent.turn_request(t.state).max_tokens
        req = TurnRequest(t.state.context + t.turn_ids, t.state.images, t.turn_limit - len(t.turn_ids), t.state.prompt)
        seed = t.item.seed + 1_000_003 * (t.j + 1) + 7_919 * t.requests
        prompts, params = self.engine.turn_requests(
            [req], self.spec, [seed % 2**31] if self.engine.seeded_turns else None
        )
        params[0].output_kind = RequestOutputKind.DELTA
        rid = f"turns-{t.item.gid}.{t.j}.{t.requests}"
        self.engine.llm.llm_engine.add_request(rid, prompts[0], params[0])
        t.requests += 1
        self.running[rid] = t

    def _end_turn(self, t: _Trajectory, finish: str) -> None:
        """``t``'s turn is done: it joins the trajectory; its tool calls start, or the trajectory ends."""
        out = TurnOutput(t.turn_ids, t.turn_logprobs, finish)
        versions = t.turn_versions
        t.turn_ids, t.turn_logprobs, t.turn_versions = [], [], []
        calls = self.agent.after_turn(t.state, out)
        t.versions += versions
        if calls:
            watch = self.watches[t.item.gid]
            self.calling[self.pool.submit(self._run_calls, t, calls, watch)] = (t, calls)
        else:
            self._ended(t)

    def _run_calls(self, t: _Trajectory, calls: list[ToolCallTask], watch: HangWatch | None) -> None:
        start = time.perf_counter()
        try:
            self.agent.run_calls(calls, watch)
        finally:
            t.calls_ran.append((start, time.perf_counter()))

    def _ended(self, t: _Trajectory) -> None:
        t.ended = True
        if all(x.ended for x in self.groups[t.item.gid]):
            self.done.append(t.item.gid)

    def _collect_calls(self) -> None:
        """Trajectories whose tool calls returned: their tool turns appended, their next turns queued (or they
        end: a limit reached). A call that hangs stops the stream (``HangError``), the other calls stopped."""
        for future in [f for f in self.calling if f.done()]:
            t, calls = self.calling.pop(future)
            if future.exception() is not None:
                for w in self.watches.values():
                    if w is not None:
                        w.stop("another trajectory's tool calls stopped the streamed rollout")
                raise future.exception()  # type: ignore[misc]
            going = self.agent.append_tool_turns(calls)
            tail = t.versions[-1] if t.versions else t.version
            t.versions += [tail] * (len(t.state.response) - len(t.versions))
            if going:
                self._start_turn(t)
            else:
                self._ended(t)

    def step(self, steps: int) -> list[StreamGroup]:
        """Engine steps (and waits on tool calls when the engine has nothing to run) until a group ends, at most
        ``steps``; the groups that ended, in order."""
        llm = self.engine.llm.llm_engine
        for _ in range(steps):
            self._collect_calls()
            if self.done:
                break
            if not self.running:
                if not self.calling:
                    break
                wait(list(self.calling), timeout=TOOL_POLL_S, return_when=FIRST_COMPLETED)
                continue
            if not llm.has_unfinished_requests():
                raise RuntimeError(f"vLLM holds no unfinished request while {len(self.running)} streamed turns run")
            for out in llm.step():
                t = self.running.get(out.request_id)
                if t is None:
                    continue
                c = out.outputs[0]
                ids = list(c.token_ids)
                t.turn_ids += ids
                t.turn_logprobs += [float(d[i].logprob) for i, d in zip(ids, c.logprobs or [])]
                t.turn_versions += [self.version] * len(ids)
                if out.finished:
                    del self.running[out.request_id]
                if c.finish_reason is not None:
                    self._end_turn(t, "length" if c.finish_reason == "length" else "stop")
        done, self.done = self.done, []
        return [self._finished(g) for g in done]

    def _finished(self, gid: int) -> StreamGroup:
        group = self.groups.pop(gid)
        self.watches.pop(gid, None)
        started = self.started.pop(gid)
        rb = self.agent.rollout_of([t.state for t in group], len(group))
        for t in group:
            if not (len(t.versions) == len(t.state.response) == len(t.state.logprobs)):
                raise RuntimeError(
                    f"group {gid}: {len(t.state.response)} response tokens, {len(t.state.logprobs)} log-probs and "
                    f"{len(t.versions)} versions"
                )
        now = time.time()
        rb.timing |= {
            "generate_s": now - started,
            "start_time": started,
            "end_time": now,
            "tool_s": _covered([span for t in group for span in t.calls_ran]),
        }
        return StreamGroup(
            gid, rb, [t.versions for t in group], sum(t.interrupted for t in group), started, now, group[0].version
        )

    # ------------------------------------------------------------------------------------------------ syncs
    def interrupt(self) -> int:
        """Abort every turn in the engine, keeping each one's tokens so far for :meth:`resume`; turns stopped."""
        if self.running:
            self.engine.llm.llm_engine.abort_request(list(self.running))
        self.stopped += list(self.running.values())
        self.running.clear()
        return len(self.stopped)

    def resume(self, version: int) -> int:
        """Continue the interrupted turns with the engine's weights now (``version``); turns continued. A turn
        whose limit ran out exactly at the interruption ends as ``length``."""
        self.version = version
        stopped, self.stopped = self.stopped, []
        go = 0
        for t in stopped:
            t.interrupted = True
            if len(t.turn_ids) >= t.turn_limit:  # (vLLM reports it finished in the same step: not seen here)
                self._end_turn(t, "length")
                continue
            self._start_turn(t)
            go += 1
        return go

    def close(self) -> None:
        """Stop the tool calls still running (their watches end them within a poll) and the threads waiting."""
        for w in self.watches.values():
            if w is not None:
                w.stop("the streamed rollout closed")
        self.pool.shutdown(wait=True, cancel_futures=True)


def _covered(spans: list[tuple[float, float]]) -> float:
    """Seconds during which at least one of the (start, end) spans ran."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total
