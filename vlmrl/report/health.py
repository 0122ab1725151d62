"""Health checks of a run's metrics: the patterns that usually mean an RL run has stopped learning or is broken.

Each finding names the metric, the step where the pattern started and what usually fixes it. The report prints them;
a training run prints them when it ends.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from vlmrl.report.data import as_number, finite

STAGES = {
    "timing/rollout_s": "generation: fewer or shorter responses (rollout.n, data.max_response_length), a larger "
    "rollout.gpu_memory_utilization, tensor parallelism for a big model",
    "timing/wait_prev_gen_s": "waiting for the batch the rollout pool generated meanwhile (one-step off-policy): "
    "more rollout workers (rollout.cpu_workers / rollout.n_gpus_per_node) and fewer training workers",
    "timing/update_s": "the update: model.use_remove_padding=True (no padding computed), actor.use_dynamic_bsz=True "
    "with a token budget, a larger micro-batch, gradient checkpointing off when memory allows, fewer ppo_epochs",
    "timing/push_s": "the weight push: it is fixed per step, so a larger batch per step amortises it",
    "timing/reward_s": "the reward: more reward.num_workers, a faster reward function (the driver waits for it)",
    "timing/data_s": "data loading: smaller images (data.max_pixels) or images stored as bytes, not paths",
    "timing/input_prep_s": "building the trainer's inputs: smaller images (data.max_pixels)",
    "timing/old_ref_logprob_s": "old/reference log-probs: log_prob_use_dynamic_bsz=True, a larger "
    "log_prob_micro_batch_size_per_gpu, or the reference kept on the device (ref.fsdp_config.param_offload=False)",
}
"""Stages of ``timing/step_s`` and what makes each one cheaper."""


@dataclass(frozen=True)
class Finding:
    """One health problem of one run."""

    check: str
    metric: str
    step: int
    """The step where the pattern started."""
    message: str
    fix: str
    severity: str = "warning"
    """warning (probably wrong) | info (worth knowing: e.g. a task already learned)."""

    def line(self) -> str:
        """One printable line."""
        return f"{self.severity}: {self.check} ({self.metric}, from step {self.step}): {self.message}. Fix: {self.fix}"


def _series(rows: list[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    out = []
    for r in rows:
        v = as_number(r.get(key))  # a string, a list, null or a bool is no value
        if v is not None and v == v:
            out.append((int(r["step"]), v))
    return out


def _first_stretch(points: list[tuple[int, float]], bad: Any, length: int) -> tuple[int, int] | None:
    """(start step, number of steps) of the first stretch of consecutive points where ``bad(value)`` that lasts
    ``length`` steps or more and either runs to the last point (the run is still in it) or covers half the run or
    more; a short spell that passed (zero reward for the first steps of a run that then learns) is not a finding."""
    stretches: list[tuple[int, int, bool]] = []
    start, count = None, 0
    for i, (step, v) in enumerate(points):
        if bad(v):
            start = step if count == 0 else start
            count += 1
        elif count:
            stretches.append((start, count, False))
            count = 0
        if count and i == len(points) - 1:
            stretches.append((start, count, True))
    for first, n, to_end in stretches:
        if n >= length and (to_end or 2 * n >= len(points)):
            return first, n
    return None


def check_health(
    rows: list[dict[str, Any]],
    window: int = 5,
    drift_threshold: float = 0.05,
    dominant_share: float = 0.6,
) -> list[Finding]:
    """The findings for one run's rows (sorted by step). ``window``: consecutive steps a pattern must last;
    ``drift_threshold``: largest acceptable mean |engine - trainer| log-prob gap; ``dominant_share``: the share of
    the step time above which one stage is said to dominate."""
    found: list[Finding] = []
    _entropy(rows, window, found)
    rew = _series(rows, "reward/mean")
    _reward(rew, window, found)
    _learning_signal(rows, rew, window, found)
    _no_gradient(rows, window, found)
    _drift(rows, drift_threshold, found)
    _stages(rows, window, dominant_share, found)
    return found


def _entropy(rows: list[dict[str, Any]], window: int, found: list[Finding]) -> None:
    # entropy collapse: the policy stopped exploring
    ent = _series(rows, "actor/entropy")
    if len(ent) >= window:
        base = statistics.median(v for _, v in ent[:3])
        s = _first_stretch(ent, lambda v: v < 0.1 * base, window) if base > 0 else None
        if s:
            found.append(
                Finding(
                    "entropy collapse",
                    "actor/entropy",
                    s[0],
                    f"entropy fell below 10% of its start ({base:.3g}) and stayed there for {s[1]} steps",
                    "a larger actor.entropy_coeff, a lower learning rate, clip-higher (actor.clip_ratio_high above "
                    "clip_ratio_low), a higher rollout.temperature",
                )
            )


def _reward(rew: list[tuple[int, float]], window: int, found: list[Finding]) -> None:
    # the reward gives no signal: every sample scores 0, or every sample scores the maximum (``rew``: reward/mean)
    if len(rew) >= window:
        zero = _first_stretch(rew, lambda v: v <= 0.01, window)
        if zero:
            found.append(
                Finding(
                    "reward flat at 0",
                    "reward/mean",
                    zero[0],
                    f"the mean reward stayed at 0 for {zero[1]} steps: no sample scores, so no advantage is non-zero",
                    "look at a few samples (the validation gallery) against the reward function: a format the reward "
                    "does not parse, a ground truth in another form, a task too hard for the model; more samples per "
                    "prompt (rollout.n) make a first success likelier",
                )
            )
        one = _first_stretch(rew, lambda v: v >= 0.99, window)
        if one:
            found.append(
                Finding(
                    "reward flat at 1",
                    "reward/mean",
                    one[0],
                    f"every sample scored the maximum for {one[1]} steps: the task is learned and steps teach nothing",
                    "stop here (a checkpoint is the model), or train on harder data",
                    severity="info",
                )
            )


def _learning_signal(
    rows: list[dict[str, Any]], rew: list[tuple[int, float]], window: int, found: list[Finding]
) -> None:
    # groups whose samples all scored the same: no gradient from them
    # (groups that all scored alike because the model solves them, reward >= 0.9, are a learned task, not a problem)
    mean_at = dict(rew)
    # (with a critic, GAE's advantages of equal rewards differ: no finding there)
    critic = any("critic/vf_explained_var" in r for r in rows)
    zv = (
        []
        if critic
        else [(step, (v, mean_at.get(step, 0.0))) for step, v in _series(rows, "advantages/zero_variance_share")]
    )
    if len(zv) >= window:
        s = _first_stretch(zv, lambda v: v[0] >= 0.5 and v[1] < 0.9, window)
        if s:
            found.append(
                Finding(
                    "groups without reward variance",
                    "advantages/zero_variance_share",
                    s[0],
                    f"half or more of the prompts' sample groups scored alike for {s[1]} steps "
                    "(their advantages are 0)",
                    "more samples per prompt (rollout.n), an entropy bonus, dynamic sampling "
                    "(algorithm.filter_groups.enable=True), data of the difficulty the model can sometimes solve",
                )
            )
    # PPO: the critic's values explain none of the returns' variance (on a task not yet learned)
    ev = [(step, (v, mean_at.get(step, 0.0))) for step, v in _series(rows, "critic/vf_explained_var")]
    if len(ev) >= window:
        s = _first_stretch(ev, lambda v: v[0] <= 0 and v[1] < 0.9, window)
        if s:
            found.append(
                Finding(
                    "critic explains nothing",
                    "critic/vf_explained_var",
                    s[0],
                    "the critic's values explained none of the returns' variance (explained variance <= 0) "
                    f"for {s[1]} steps: GAE's advantages are then mostly the critic's noise",
                    "a larger critic.optim.lr or critic.ppo_epochs, trainer.critic_warmup steps before the actor "
                    "learns, rewards of a scale the value head can reach (normalised), algorithm.lam below 1",
                )
            )


def _no_gradient(rows: list[dict[str, Any]], window: int, found: list[Finding]) -> None:
    # the update's gradient was exactly zero while the advantages were not: the loss does not reach the parameters
    adv = dict(_series(rows, "advantages/abs_mean"))
    gn = [(step, (v, adv.get(step, 0.0))) for step, v in _series(rows, "actor/grad_norm")]
    if len(gn) >= window:
        s = _first_stretch(gn, lambda v: v[0] == 0 and v[1] > 0, window)
        if s:
            found.append(
                Finding(
                    "no gradient",
                    "actor/grad_norm",
                    s[0],
                    f"the policy's gradient norm was 0 for {s[1]} steps whose advantages were not: the update "
                    "changed no weight",
                    "a loss computed from the policy's log-probs (a custom loss or algorithm class returning a "
                    "constant or a detached value), trainable parameters (LoRA targets, freeze_vision_tower), an "
                    "lr > 0",
                )
            )


def _drift(rows: list[dict[str, Any]], drift_threshold: float, found: list[Finding]) -> None:
    # engine vs trainer log-probs of the same tokens (the one-step off-policy trainer's batches come from the weights
    # one update back: only its on-policy steps, async/staleness 0, say whether the engine matches the trainer)
    stale = {step for step, v in _series(rows, "async/staleness") if v > 0}
    drift = [(step, v) for step, v in _series(rows, "rollout/logprob_diff") if step not in stale]
    high = [(step, v) for step, v in drift if v > drift_threshold]
    if high:
        found.append(
            Finding(
                "log-prob drift",
                "rollout/logprob_diff",
                high[0][0],
                f"the engine's and the trainer's log-probs of the same tokens differ by {high[0][1]:.3g} on average "
                f"(above {drift_threshold}; {len(high)} of {len(drift)} steps)",
                "the engine samples from other weights or inputs than the trainer scores: rollout.dtype against the "
                "actor's (bf16 vs fp32), a weight push that failed, an image processed differently (data.max_pixels); "
                "on-policy importance correction (an old-log-prob pass) hides but does not fix it",
            )
        )


def _stages(rows: list[dict[str, Any]], window: int, dominant_share: float, found: list[Finding]) -> None:
    # one stage takes most of every step (the first step is the warm-up: not counted)
    # (a timing value that is not a finite number counts as 0: the report says how many it skipped)
    timed = [r for r in rows if (finite(r.get("timing/step_s")) or 0.0) > 0][1:]
    if len(timed) >= window:
        for key, fix in STAGES.items():
            shares = [(int(r["step"]), (finite(r.get(key)) or 0.0) / float(r["timing/step_s"])) for r in timed]
            med = statistics.median(v for _, v in shares)
            if med > dominant_share:
                start = next(step for step, v in shares if v > dominant_share)
                found.append(
                    Finding(
                        "one stage dominates the step",
                        key,
                        start,
                        f"{key.split('/')[1][:-2]} takes {med:.0%} of the step time (median)",
                        fix,
                        severity="info",
                    )
                )


def health_summary(rows: list[dict[str, Any]], **kw: Any) -> str:
    """The findings as printable lines (or a line saying there are none)."""
    found = check_health(rows, **kw)
    if not found:
        return f"health: no problems found in {len(rows)} step(s)"
    return "\n".join(["health:"] + ["  " + f.line() for f in found])
