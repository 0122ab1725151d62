"""Experiment tracking: console, JSON lines, TensorBoard, Weights & Biases, Prometheus; and the reward curve as a
PNG."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from vlmrl.config.schema import LOGGERS, PrometheusConfig
from vlmrl.trainer.prometheus import PrometheusExporter


class Tracker:
    """Sends each step's metrics to the configured backends. ``metrics.jsonl`` gets one JSON line per step."""

    def __init__(
        self,
        loggers: list[str],
        out_dir: str | os.PathLike,
        project: str,
        experiment: str,
        config: Any,
        fresh: bool = False,
        prometheus: PrometheusConfig | None = None,
    ):
        """``fresh``: this run does not continue the log in ``out_dir`` (no resume); an existing ``metrics.jsonl`` is
        moved aside to ``metrics.<time>.jsonl`` when the first line is written (not before: a run that fails during
        start-up leaves the folder as it was). ``prometheus``: where the exporter listens (``trainer.prometheus``)."""
        bad = [x for x in loggers if x not in LOGGERS]
        if bad:
            raise ValueError(f"trainer.logger: unknown backend(s) {bad}; choose from {list(LOGGERS)}")
        self.loggers = list(loggers)
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl_path = self.out_dir / "metrics.jsonl"
        self._jsonl: Any = None
        self._fresh = fresh
        self.logged = 0
        """Steps this tracker logged (a run that logged none has no curve or health of its own to show)."""
        self._tb = None
        if "tensorboard" in self.loggers:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.out_dir / "tensorboard"))
        self._wandb = None
        if "wandb" in self.loggers:
            try:
                import wandb
            except ImportError as e:
                raise ImportError("trainer.logger includes wandb but it is not installed: pip install wandb") from e
            self._wandb = wandb.init(project=project, name=experiment, config=config, dir=str(self.out_dir))
        self.prometheus = None
        if "prometheus" in self.loggers:
            pc = prometheus or PrometheusConfig()
            self.prometheus = PrometheusExporter(pc.host, pc.port, project, experiment, pc.token_file)
            print(f"[vlmrl] Prometheus metrics at {self.prometheus.url}", flush=True)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        """Record one step's metrics everywhere."""
        clean = {k: _plain(v) for k, v in metrics.items()}
        self.logged += 1
        if self._jsonl is None and "jsonl" in self.loggers:
            if self._fresh and self.jsonl_path.exists() and self.jsonl_path.stat().st_size:
                old = self.jsonl_path.with_name(f"metrics.{time.strftime('%Y%m%d-%H%M%S')}.jsonl")
                os.replace(self.jsonl_path, old)
                print(f"[vlmrl] a new run: the previous metrics.jsonl was moved to {old}", flush=True)
            self._jsonl = open(self.jsonl_path, "a", encoding="utf-8")  # noqa: SIM115
        if self._jsonl is not None:
            self._jsonl.write(json.dumps({"step": step, **clean}) + "\n")
            self._jsonl.flush()
        if self._tb is not None:
            for k, v in clean.items():
                if isinstance(v, (int, float)) and math.isfinite(v):
                    self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log(clean, step=step)
        if self.prometheus is not None:
            self.prometheus.publish(clean, step)
        if "console" in self.loggers:
            print(console_line(step, clean), flush=True)

    def close(self) -> None:
        """Flush and close the backends."""
        if self._jsonl is not None:
            self._jsonl.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
        if self.prometheus is not None:
            self.prometheus.close()


def _plain(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float):
        return round(v, 6) if math.isfinite(v) else v
    return v


_CONSOLE_KEYS = (
    ("reward/mean", "reward"),
    ("val/reward/mean", "val"),
    ("response_length/mean", "len"),
    ("actor/entropy", "ent"),
    ("actor/pg_clipfrac", "clip"),
    ("actor/kl_loss", "kl"),
    ("actor/grad_norm", "gnorm"),
    ("rollout/logprob_diff", "lp_diff"),
    ("timing/step_s", "step_s"),
    ("timing/rollout_s", "gen_s"),
    ("timing/update_s", "upd_s"),
    ("timing/push_s", "push_s"),
)


def console_line(step: int, m: dict[str, Any]) -> str:
    """One compact line per step."""
    parts = [f"step {step}"]
    for key, short in _CONSOLE_KEYS:
        if key in m and isinstance(m[key], (int, float)):
            parts.append(f"{short}={m[key]:.3f}")
    return " | ".join(parts)


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """All JSON object lines of a metrics file, in order (a partial last line from a crash, and lines that are not
    JSON objects or that JSON cannot read, nested too deep or with a number too long, are skipped)."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                row = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if isinstance(row, dict):
                rows.append(row)
    return rows


def plot_curve(
    jsonl_path: str | os.PathLike, png_path: str | os.PathLike, keys: tuple[str, ...] = ("reward/mean",)
) -> Path:
    """Write the reward (and validation) curve of a metrics.jsonl as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(jsonl_path)
    fig, ax = plt.subplots(figsize=(7, 4))
    for key in (*keys, "val/reward/mean"):
        pts = [
            (r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float)) and isinstance(r.get("step"), int)
        ]
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker="o" if key.startswith("val/") else None, label=key)
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.set_ylim(-0.05, 1.05) if all(0 <= r.get("reward/mean", 0) <= 1 for r in rows) else None
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out = Path(png_path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> None:
    """``python -m vlmrl.trainer.tracking METRICS.jsonl OUT.png``: draw a curve on demand."""
    import argparse

    ap = argparse.ArgumentParser(description="Plot (PNG) and print the reward curve of a metrics.jsonl")
    ap.add_argument("metrics")
    ap.add_argument("png")
    a = ap.parse_args(argv)
    print(ascii_curve(a.metrics))
    print(f"curve written to {plot_curve(a.metrics, a.png)}")


def ascii_curve(jsonl_path: str | os.PathLike, key: str = "reward/mean", width: int = 60) -> str:
    """The curve of ``key`` as text rows (step, value, bar) — what the quick start prints at the end."""
    rows = [
        r for r in read_metrics(jsonl_path) if isinstance(r.get(key), (int, float)) and isinstance(r.get("step"), int)
    ]
    if not rows:
        return f"(no {key} in {jsonl_path})"
    stride = max(1, len(rows) // 20)
    lines = [f"{key} by step"]
    for r in rows[::stride] + ([rows[-1]] if (len(rows) - 1) % stride else []):
        v = float(r[key])
        lines.append(f"  step {r['step']:>5}  {v:6.3f}  " + "#" * int(round(max(0.0, min(1.0, v)) * width)))
    return "\n".join(lines)


if __name__ == "__main__":
    from vlmrl.procs import lean_exit

    lean_exit()
    main()
