"""Streaming generation on a running vLLM engine: the rollout worker's side of the fully asynchronous trainer
(``async_training.mode=fully_async``; verl's ``fully_async_policy`` Rollouter).

Prompt groups go in one at a time (:meth:`PromptStream.add`: one request of ``n`` samples, vLLM's parallel sampling,
so the prompt and its images are processed once; its own seed where the engine keeps one); :meth:`PromptStream.step`
runs engine steps and hands back the groups whose ``n`` samples have all finished, in the order they finished.
Every generated token keeps the log-prob the engine gave it and the weight version that produced it.

At a weight sync with partial rollouts, :meth:`PromptStream.interrupt` aborts every unfinished sample, keeping what
it generated so far; once the new weights are loaded, :meth:`PromptStream.resume` continues each of them from where
it stopped (its prompt plus its tokens so far as the new request's prompt, the rest of its token budget as its
limit). The tokens before the sync keep their old log-probs (the behaviour policy that produced them), those after
get the new weights'. Without partial rollouts the driver stops adding groups and steps until the engine is empty.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from vlmrl.batch import PromptSample, RolloutBatch
from vlmrl.rollout.base import SamplingSpec


@dataclass
class StreamItem:
    """One prompt group to generate."""

    gid: int
    """The group's number in the stream (the order it was drawn in)."""
    prompt: PromptSample
    seed: int
    """The group's sampling seed (sample ``j`` samples from ``seed + j``, each continuation from a seed of its own)."""


@dataclass
class StreamGroup:
    """A finished group: its ``n`` samples as a rollout, and where their tokens came from."""

    gid: int
    rollout: RolloutBatch
    versions: list[list[int]]
    """Per sample, per token: the weight version (updates included) that generated it."""
    interrupted: int
    """Of its samples, how many were interrupted by a sync and continued."""
    start_time: float
    end_time: float
    version: int = -1
    """The engine's weight version when the group started."""

    @property
    def min_version(self) -> int:
        """The oldest weights that generated one of its tokens (its start's when it has none)."""
        return min((v for vs in self.versions for v in vs), default=self.version)

    @property
    def max_version(self) -> int:
        """The newest."""
        return max((v for vs in self.versions for v in vs), default=self.version)


@dataclass
class _Sample:
    """One sample of a group while it generates."""

    item: StreamItem
    j: int
    max_tokens: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    expanded_prompt: list[int] | None = None
    finish: str | None = None
    segments: int = 0
    """Requests it took (1 + its continuations)."""
    version: int = -1
    """The weights it started with."""


class PromptStream:
    """Streamed prompt groups on one :class:`~vlmrl.rollout.vllm.VLLMRollout` (the module's docstring)."""

    def __init__(self, engine: Any, spec: SamplingSpec) -> None:
        self.engine, self.spec = engine, spec
        self.running: dict[str, list[_Sample]] = {}
        """Requests in the engine, by request id: a group's ``n`` samples (one request, vLLM's parallel sampling:
        the prompt and its image processed once), or one continued sample."""
        self.stopped: list[_Sample] = []
        """Samples interrupted by :meth:`interrupt`, waiting for :meth:`resume`."""
        self.groups: dict[int, list[_Sample]] = {}
        """Groups not yet handed back, by ``gid``."""
        self.started: dict[int, float] = {}
        self.complete: list[int] = []
        """Groups whose last samples finished in :meth:`resume` (out of budget), for the next :meth:`step`."""
        self.version = -1

    @property
    def unfinished(self) -> int:
        """Samples generating or interrupted."""
        return sum(s.finish is None for ss in self.running.values() for s in ss) + len(self.stopped)

    def _request(self, rid: str, samples: list[_Sample], seed: int) -> None:
        """Queue one request for ``samples``: a whole group from its prompt, or one sample from its prompt plus its
        tokens so far with the rest of its budget. Each step's new tokens are reported (kept here as they come, so an
        interrupted sample keeps what it generated)."""
        from vllm.sampling_params import RequestOutputKind

        from vlmrl.rollout.vllm import engine_prompt

        first = samples[0]
        left = first.max_tokens - len(first.tokens)
        sp = self.engine.sampling_params(dataclasses.replace(self.spec, n=len(samples), max_tokens=left))
        if self.engine.seeded_turns:  # (vLLM gives the i-th sample of a request seed + i)
            sp.seed = seed % 2**31
        sp.output_kind = RequestOutputKind.DELTA
        self.engine.llm.llm_engine.add_request(rid, engine_prompt(first.item.prompt, first.tokens), sp)
        for x in samples:
            x.segments += 1
        self.running[rid] = samples

    def add(self, items: list[StreamItem], version: int) -> None:
        """Start generating ``items`` (``spec.n`` samples each) with the engine's weights (``version`` updates)."""
        self.version = version
        for it in items:
            samples = [_Sample(it, j, self.spec.max_tokens, version=version) for j in range(self.spec.n)]
            self.groups[it.gid] = samples
            self.started[it.gid] = time.time()
            self._request(f"stream-{it.gid}", samples, it.seed)

    def step(self, steps: int) -> list[StreamGroup]:
        """Engine steps until a group finishes, at most ``steps`` (fewer when the engine runs dry); the groups that
        finished, in order."""
        llm = self.engine.llm.llm_engine
        done = [self._finished(g) for g in self.complete]
        self.complete = []
        for _ in range(steps):
            if not self.running or done:
                break
            if not llm.has_unfinished_requests():
                raise RuntimeError(f"vLLM holds no unfinished request while {len(self.running)} streamed ones run")
            for out in llm.step():
                samples = self.running.get(out.request_id)
                if samples is None:
                    continue
                for c in out.outputs:
                    s = samples[c.index]
                    if s.expanded_prompt is None and out.prompt_token_ids is not None:
                        # the engine expands each image pad; a continued sample's earlier tokens follow the prompt
                        prompt = list(out.prompt_token_ids)
                        s.expanded_prompt = prompt[: len(prompt) - len(s.tokens)]
                    ids = list(c.token_ids)
                    s.tokens += ids
                    s.logprobs += [float(d[t].logprob) for t, d in zip(ids, c.logprobs or [])]
                    s.versions += [self.version] * len(ids)
                    if c.finish_reason is not None:
                        s.finish = "length" if c.finish_reason == "length" else "stop"
                        if self._all_done(s.item.gid):
                            done.append(self._finished(s.item.gid))
                if out.finished:
                    del self.running[out.request_id]
        return done

    def _all_done(self, gid: int) -> bool:
        return all(s.finish is not None for s in self.groups[gid])

    def _finished(self, gid: int) -> StreamGroup:
        group = self.groups.pop(gid)
        started = self.started.pop(gid)
        rb = RolloutBatch([], [], [], [], n=len(group))
        for s in group:
            if len(s.logprobs) != len(s.tokens):
                raise RuntimeError(f"group {gid}: {len(s.tokens)} tokens but {len(s.logprobs)} log-probs")
            rb.prompt_ids.append(list(s.expanded_prompt or s.item.prompt.prompt_ids))
            rb.response_ids.append(s.tokens)
            rb.logprobs.append(s.logprobs)
            rb.finish_reasons.append(s.finish or "stop")
        now = time.time()
        rb.timing |= {"generate_s": now - started, "start_time": started, "end_time": now}
        return StreamGroup(
            gid, rb, [s.versions for s in group], sum(s.segments > 1 for s in group), started, now, group[0].version
        )

    def interrupt(self) -> int:
        """Abort every running request, keeping each sample's tokens so far for :meth:`resume`; samples stopped."""
        if self.running:
            self.engine.llm.llm_engine.abort_request(list(self.running))
        self.stopped += [s for ss in self.running.values() for s in ss if s.finish is None]
        self.running.clear()
        return len(self.stopped)

    def resume(self, version: int) -> int:
        """Continue the interrupted samples with the engine's weights now (``version``), each as a request of its
        own; samples continued. A sample whose budget ran out exactly at the interruption finishes as ``length``."""
        self.version = version
        stopped, self.stopped = self.stopped, []
        go = 0
        for s in stopped:
            if len(s.tokens) >= s.max_tokens:  # (vLLM reports it finished in the same step: not seen here)
                s.finish = "length"
                if self._all_done(s.item.gid):
                    self.complete.append(s.item.gid)
                continue
            seed = s.item.seed + 1_000_003 * (s.j + 1) + 7_919 * s.segments
            self._request(f"stream-{s.item.gid}.{s.j}.{s.segments}", [s], seed)
            go += 1
        return go
