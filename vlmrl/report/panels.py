"""The report's panels: which metrics each one draws, and drawing them (matplotlib, PNG) for one or several runs."""

from __future__ import annotations

import io
import re
import statistics
from dataclasses import dataclass

from vlmrl.report.data import RunData, ema, finite

STEP_STAGES = (
    "timing/data_s",
    "timing/rollout_s",
    "timing/wait_prev_gen_s",
    "timing/param_sync_s",
    "timing/reward_model_s",
    "timing/reward_s",
    "timing/sleep_s",
    "timing/advantages_s",
    "timing/input_prep_s",
    "timing/old_ref_logprob_s",
    "timing/critic_values_s",
    "timing/critic_update_s",
    "timing/update_s",
    "timing/push_s",
)
"""The parts of ``timing/step_s``: the driver's stages of ``fit()`` and, inside its calls to the workers, their
input preparation, log-probs, the critic's values and update, and the policy's update; what is left is shown as
"other" (the driver, the calls to the workers)."""


@dataclass(frozen=True)
class Panel:
    """A chart: ``keys`` are metric names or regular expressions (full match) drawn on the left axis, ``twin`` on a
    right-hand axis. ``kind="stages"`` is the stacked bar of the step's time."""

    name: str
    title: str
    keys: tuple[str, ...] = ()
    ylabel: str = ""
    twin: tuple[str, ...] = ()
    twin_label: str = ""
    kind: str = "lines"
    about: str = ""


PANELS: tuple[Panel, ...] = (
    Panel(
        "reward",
        "Reward: total, per component, per data source, validation",
        (
            "reward/mean",
            r"reward/(?!source/)[^/]+/mean",
            r"reward/source/.+/mean",
            "val/reward/mean",
            r"val/(?!reward/).+/reward",
        ),
        "reward",
        about="Train reward per step (mean over the batch), each reward component, each data_source when a batch "
        "mixes several, and validation (markers).",
    ),
    Panel(
        "response_length",
        "Response length and clip ratio",
        ("response_length/mean", "response_length/max"),
        "tokens",
        ("response_length/clip_ratio",),
        "share cut at max_response_length",
        about="A clip ratio near 1 means responses run into data.max_response_length.",
    ),
    Panel(
        "entropy",
        "Entropy of the policy's tokens",
        ("actor/entropy",),
        "nats / token",
        about="A fall to near 0 is entropy collapse: the policy stops exploring.",
    ),
    Panel(
        "kl_clip",
        "KL and clip fraction",
        ("actor/kl_loss", "actor/ppo_kl"),
        "KL",
        ("actor/pg_clipfrac",),
        "clip fraction",
        about="KL to the reference (kl_loss, when use_kl_loss) and to the rollout policy "
        "(ppo_kl); the share of tokens whose ratio was clipped.",
    ),
    Panel("grad_norm", "Gradient norm (before clipping)", ("actor/grad_norm", "critic/grad_norm"), "L2 norm"),
    Panel(
        "critic",
        "Critic: value loss, values and returns, explained variance",
        ("critic/vf_loss", "critic/values/mean", "critic/returns/mean"),
        "loss / value",
        ("critic/vf_explained_var", "critic/vf_clipfrac"),
        "explained variance / clip fraction",
        about="PPO with a critic: the clipped value loss, the mean value and return of the generated tokens, the "
        "share of the returns' variance the values explain (1: all; <= 0: no better than their mean) and the "
        "share of tokens whose value was clipped.",
    ),
    Panel(
        "reward_kl",
        "KL in the reward",
        ("reward/kl_penalty",),
        "KL per token",
        ("reward/kl_coef",),
        "coefficient",
        about="algorithm.use_kl_in_reward: the KL to the reference subtracted from the token "
        "rewards (times the coefficient, which the adaptive controller moves towards target_kl).",
    ),
    Panel(
        "algorithm",
        "Your algorithm's metrics",
        (r"algorithm/.+",),
        "value",
        about="What algorithm.name's class returns from get_metrics (logged under algorithm/).",
    ),
    Panel(
        "rollout_corr",
        "Rollout correction",
        ("rollout_corr/rollout_is_mean", "rollout_corr/kl", "rollout_corr/k3_kl"),
        "weight / KL",
        (r"rollout_corr/rollout_rs(_seq)?_masked_fraction", "rollout_corr/rollout_is_ratio_fraction_high"),
        "share of tokens / sequences",
        about="algorithm.rollout_correction: the mean importance weight (trainer's old over the engine's "
        "probabilities), the KL between them, and the shares beyond the bounds or rejected.",
    ),
    Panel(
        "overlap",
        "One-step off-policy: generation, training and waiting",
        ("timing/gen_s", "timing/train_s", "timing/wait_prev_gen_s", "timing/param_sync_s"),
        "seconds",
        ("async/staleness",),
        "staleness (updates)",
        about="actor_rollout_ref.hybrid_engine=False: per step, the rollout pool's generation of the next batch "
        "(overlapping the training), the update, the time the step waited for the batch it trains on, and the "
        "weight sync into the engines; staleness: updates between the weights that generated a batch and the "
        "ones it trains (1, or 0 on the first step, after a resume and after a fallback).",
    ),
    Panel(
        "stream",
        "Fully asynchronous: waiting, syncs, the queue and staleness",
        ("timing/wait_rollout_s", "timing/train_s", "timing/sync_s", "async/rollouter_idle_s"),
        "seconds",
        ("async/staleness_mean", "async/staleness_max", "async/queue_depth", "async/partial_groups"),
        "updates / groups",
        about="async_training.mode=fully_async: per step, how long it waited for its groups, the update, the "
        "pause and weight sync after it, and how long the Rollouter waited on the staleness bound; the trained "
        "groups' staleness (updates between the oldest weights that generated a token of a group and the ones it "
        "trains), the groups queued when the step took its own, and the groups continued across a sync.",
    ),
    Panel(
        "reward_model",
        "Reward model: its score next to the reward",
        ("reward_model/score/mean", "reward/mean", r"reward/(?!rm/|source/)[^/]+/mean", "val/reward_model/score/mean"),
        "score",
        ("reward_model/errors", "reward_model/parse_errors"),
        "samples without a score",
        about="reward_model.enable: the model's mean score of the batch's responses beside the total reward and "
        "each rule component (a weight-0 rule component shows what the model's score is worth by a checkable "
        "measure: a score that rises while the rule stays flat is the policy exploiting the model), and the "
        "samples it could not score (a failed forward, a judge's verdict that did not parse).",
    ),
    Panel(
        "drift",
        "Engine vs trainer log-prob drift",
        ("rollout/logprob_diff",),
        "mean |diff| per token",
        about="Mean |log p_engine - log p_trainer| of the sampled tokens; it should stay near 0 (bf16: ~1e-2).",
    ),
    Panel(
        "zero_variance",
        "Groups without reward variance",
        ("advantages/zero_variance_share",),
        "share of groups",
        about="Prompts whose samples all scored alike: their advantages are 0 and they teach nothing.",
    ),
    Panel(
        "step_time",
        "Step time by stage",
        kind="stages",
        ylabel="seconds",
        about="Median seconds per stage (first step, the warm-up, left out); several runs: one bar each.",
    ),
    Panel(
        "throughput",
        "Throughput and step time",
        ("throughput/tokens_per_s",),
        "tokens / s",
        ("timing/step_s",),
        "s / step",
    ),
    Panel(
        "memory",
        "Memory",
        (r"perf/.+_gb",),
        "GiB",
        about="Peak device memory per step (GPU) and the workers' resident memory (largest worker).",
    ),
)


def matching(panel_keys: tuple[str, ...], available: set[str]) -> list[str]:
    """The available metrics each key (name or pattern) matches, in the panel's order."""
    out: list[str] = []
    for k in panel_keys:
        rx = re.compile(k)
        out += [m for m in sorted(available) if rx.fullmatch(m) and m not in out]
    return out


def has_data(panel: Panel, runs: list[RunData]) -> bool:
    """Whether any run logged a metric of this panel."""
    if panel.kind == "stages":
        return any("timing/step_s" in r.keys() for r in runs)
    return any(matching(panel.keys + panel.twin, r.keys()) for r in runs)


_STYLES = ("-", "--", ":", "-.")


def plain_text(text: str) -> str:
    """``text`` as matplotlib shows it literally: a ``$`` is escaped (two of them would start mathtext, which fails
    to parse most names), and a leading ``_`` (which hides a legend entry) is kept visible with a space."""
    text = text.replace("$", r"\$")
    return " " + text if text.startswith("_") else text


def _seconds(row: dict, key: str) -> float:
    """A stage's seconds in a row: a finite number, else 0 (the report counted and skipped anything else)."""
    return finite(row.get(key)) or 0.0


def _timed(rows: list[dict]) -> list[dict]:
    """The rows with a finite ``timing/step_s``."""
    return [r for r in rows if finite(r.get("timing/step_s")) is not None]


def _lines(ax: object, panel: Panel, keys: tuple[str, ...], runs: list[RunData], smooth: float) -> list[object]:
    """Draw the keys of every run on ``ax``; returns the line handles."""
    handles = []
    colours = [f"C{i % 10}" for i in range(32)]
    for ri, run in enumerate(runs):
        for ki, key in enumerate(matching(keys, run.keys())):
            xs, ys = run.series(key)
            if not xs:
                continue
            colour = colours[ri] if len(runs) > 1 else colours[(ki + (3 if keys is panel.twin else 0)) % 10]
            style = _STYLES[ki % len(_STYLES)] if len(runs) > 1 else "-"
            label = plain_text(f"{run.name}: {key}" if len(runs) > 1 else key)
            marker = "o" if key.startswith("val/") else None
            if smooth and len(xs) > 2 and marker is None:
                ax.plot(xs, ys, color=colour, linestyle=style, alpha=0.25, linewidth=1)
                ys = ema(ys, smooth)
            (h,) = ax.plot(xs, ys, color=colour, linestyle=style, marker=marker, markersize=4, label=label)
            handles.append(h)
    return handles


def stage_medians(run: RunData) -> dict[str, float]:
    """Median seconds of each stage and of "other" over the run's steps (the first, a warm-up, left out when there
    are more)."""
    rows = _timed(run.rows)
    rows = rows[1:] if len(rows) > 1 else rows
    if not rows:
        return {}
    out = {k.split("/")[1][:-2]: statistics.median(_seconds(r, k) for r in rows) for k in STEP_STAGES}
    step = statistics.median(_seconds(r, "timing/step_s") for r in rows)
    out["other"] = max(0.0, step - sum(out.values()))
    return out


def _stages(ax: object, runs: list[RunData]) -> None:
    """Stacked bars: one per run, or one per step for a single run (at most 60, evenly picked)."""
    if len(runs) == 1:
        rows = _timed(runs[0].rows)
        rows = rows[:: max(1, len(rows) // 60)]
        labels = [str(r["step"]) for r in rows]
        parts = {k.split("/")[1][:-2]: [_seconds(r, k) for r in rows] for k in STEP_STAGES}
        parts["other"] = [
            max(0.0, _seconds(r, "timing/step_s") - sum(_seconds(r, k) for k in STEP_STAGES)) for r in rows
        ]
        ax.set_xlabel("step")
    else:
        meds = [stage_medians(r) for r in runs]
        labels = [plain_text(r.name) for r in runs]
        names = [k.split("/")[1][:-2] for k in STEP_STAGES] + ["other"]
        parts = {n: [m.get(n, 0.0) for m in meds] for n in names}
    bottom = [0.0] * len(labels)
    for i, (name, vals) in enumerate(parts.items()):
        if not any(vals):
            continue
        ax.bar(range(len(labels)), vals, bottom=bottom, label=name, color=f"C{i % 10}")
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(
        labels,
        rotation=45 if len(labels) > 8 else 0,
        ha="right" if len(labels) > 8 else "center",
        fontsize=7 if len(labels) > 20 else 9,
    )


def draw(panel: Panel, runs: list[RunData], smooth: float = 0.0) -> object:
    """The panel as a matplotlib figure (the caller closes it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.2))
    ax.set_title(panel.title)
    ax.grid(alpha=0.3)
    ax.set_ylabel(panel.ylabel)
    if panel.kind == "stages":
        _stages(ax, runs)
        handles, labels = ax.get_legend_handles_labels()
    else:
        ax.set_xlabel("step")
        handles = _lines(ax, panel, panel.keys, runs, smooth)
        if panel.twin:
            ax2 = ax.twinx()
            ax2.set_ylabel(panel.twin_label)
            handles += _lines(ax2, panel, panel.twin, runs, smooth)
        labels = [h.get_label() for h in handles]
    if handles:
        ax.legend(handles, labels, fontsize=7, loc="best", ncol=2 if len(handles) > 6 else 1)
    fig.tight_layout()
    return fig


def render(panel: Panel, runs: list[RunData], smooth: float = 0.0) -> bytes:
    """The panel as PNG bytes."""
    import matplotlib.pyplot as plt

    fig = draw(panel, runs, smooth)
    try:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=90)
        return buf.getvalue()
    finally:
        plt.close(fig)
