"""GRPO step time and time-to-learn: vlmrl (vLLM rollout, 2 CPU worker processes x 1 thread) against TRL's
``GRPOTrainer`` (HF ``generate``, one process x 2 threads) on the same tiny Qwen2.5-VL and synthetic colour task.

    python benchmarks/bench_trl.py [--rounds 2] [--steps 12] [--learn-budget-s 240] [--image-size 112]
    python benchmarks/bench_trl.py --model-size tiny,20m,100m    # the same at three sizes: bench_trl_sizes.py

TRL runs in its own environment, made here idempotently: ``pip install --target .cache/trl-pkgs --no-deps trl==X``
(TRL's other dependencies are already vlmrl's), used as ``PYTHONPATH`` over vlmrl's interpreter so torch and
transformers are exactly vlmrl's; vlmrl's virtual environment is never modified.

Both sides: 16 prompts per step x 8 samples, 16 completion tokens, KL off, one optimizer step per batch (on-policy,
no old-log-prob pass), lr 2e-3, AdamW (wd 0), grad clip 1, clip 0.2, token-mean loss, group-std advantages.

1. Step time, equal lengths (vlmrl ``rollout.ignore_eos=True``; TRL ``min_new_tokens=16``): alternating runs
   TRL, vlmrl, TRL, vlmrl...; the first ``--warmup`` steps of each run are dropped; medians per run, then over runs.
2. Time-to-learn (EOS allowed): steps and training seconds until the 5-step moving average of the reward reaches
   0.9, each run capped at ``--learn-budget-s`` seconds of training; vlmrl keeps the quick start's entropy bonus
   (``configs/tiny_cpu.yaml``), which TRL's ``GRPOTrainer`` has no equivalent of (step-time runs set it to 0).

Each run holds the shared CPU lock (``$VLMRL_CPU_LOCK``); do not wrap this script in ``flock`` on the same file.
Writes ``benchmarks/results/trl.json`` and the ``## GRPO step time vs TRL`` section of ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

TRL_VERSION = "1.16.0"
TRL_DIR = common.ROOT / ".cache" / "trl-pkgs"
SECTION = "GRPO step time vs TRL"


# ----------------------------------------------------------------------------------------------- TRL env


def trl_env() -> dict[str, str]:
    """Environment of a TRL subprocess: vlmrl's interpreter with TRL's packages first on the path."""
    env = common.bench_env(threads=2)
    env["PYTHONPATH"] = f"{TRL_DIR}:{env['PYTHONPATH']}"
    return env


def ensure_trl(version: str = TRL_VERSION) -> str:
    """Install TRL into ``.cache/trl-pkgs`` once (no dependencies: vlmrl's environment has them) and check that it
    imports with vlmrl's torch/transformers; returns the imported version."""
    marker = TRL_DIR / f".installed-trl-{version}"
    if not marker.exists():
        import shutil

        shutil.rmtree(TRL_DIR, ignore_errors=True)
        cmd = [common.PY, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(TRL_DIR), f"trl=={version}"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"could not install trl=={version} into {TRL_DIR}:\n{proc.stderr[-3000:]}")
        marker.write_text(version)
    probe = "import trl, transformers, torch; from trl import GRPOTrainer; print(trl.__version__)"
    proc = subprocess.run([common.PY, "-c", probe], capture_output=True, text=True, env=trl_env())
    if proc.returncode != 0:
        raise RuntimeError(
            f"TRL {version} does not import with vlmrl's packages (a dependency vlmrl lacks?):\n{proc.stderr[-3000:]}"
        )
    return proc.stdout.strip().splitlines()[-1]


def run_trl(model: Path, data: Path, out: Path, args: list[str], timeout_s: float) -> dict[str, Any]:
    """One TRL run (``trl_runner.py``) under the CPU lock; returns its JSON plus the process wall time."""
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [common.PY, str(common.HERE / "trl_runner.py"), "--model", str(model), "--data", str(data), "--out", str(out)]
    out.unlink(missing_ok=True)
    run = common.run_locked(
        cmd + args, env=trl_env(), log=out.with_suffix(".log"), timeout_s=timeout_s, what=f"trl {out.stem}"
    )
    if run["returncode"] != 0 or not out.exists():
        log = Path(run["log"])
        raise RuntimeError(f"TRL run failed (exit {run['returncode']}); log {log}:\n{log.read_text()[-4000:]}")
    res = json.loads(out.read_text())
    res["process_wall_s"] = run["wall_s"]
    res["foreign_cpu_frac"] = run["foreign_cpu_frac"]
    return res


# ---------------------------------------------------------------------------------------------- summaries


def trl_breakdown(steps: list[dict[str, float]]) -> dict[str, float]:
    """Median seconds per stage of TRL's measured steps."""
    keys = ("step_s", "generate_s", "reward_s", "generate_and_score_s", "loss_forward_s", "backward_s")
    med = {k: common.median([s.get(k, 0.0) for s in steps]) for k in keys}
    rest_gen = [s["generate_and_score_s"] - s["generate_s"] - s.get("reward_s", 0) for s in steps]
    other = [s["step_s"] - s["generate_and_score_s"] - s["loss_forward_s"] - s["backward_s"] for s in steps]
    return {
        "step_s": med["step_s"],
        "rollout_s": med["generate_s"],
        "reward_s": med["reward_s"],
        "inputs_advantages_s": common.median(rest_gen),
        "loss_forward_s": med["loss_forward_s"],
        "backward_s": med["backward_s"],
        "optimizer_other_s": common.median(other),
    }


def vlmrl_breakdown(rows: list[dict[str, float]]) -> dict[str, float]:
    """Median seconds per stage of vlmrl's measured steps (from metrics.jsonl)."""

    def med(key: str) -> float:
        return common.median([r.get(key, 0.0) for r in rows])

    # the driver's train stage is the workers' input prep, old/ref log-probs and update plus the call's round trip;
    # the push is its own stage (the workers' push time; its round trip counts as the driver's own time)
    rpc = [
        r["timing/train_s"]
        - r.get("timing/update_s", 0)
        - r.get("timing/input_prep_s", 0)
        - r.get("timing/old_ref_logprob_s", 0)
        for r in rows
    ]
    other = [
        r["timing/step_s"]
        - r["timing/rollout_s"]
        - r["timing/reward_s"]
        - r["timing/train_s"]
        - r.get("timing/push_s", 0)
        - r.get("timing/data_s", 0)
        for r in rows
    ]
    return {
        "step_s": med("timing/step_s"),
        "data_s": med("timing/data_s"),
        "rollout_s": med("timing/rollout_s"),
        "reward_s": med("timing/reward_s"),
        "input_prep_s": med("timing/input_prep_s"),
        "old_ref_logprob_s": med("timing/old_ref_logprob_s"),
        "update_s": med("timing/update_s"),
        "push_s": med("timing/push_s"),
        "rpc_sync_s": common.median(rpc),
        "driver_other_s": common.median(other),
    }


def startup_s(log: str) -> float | None:
    """Worker start-up time printed by vlmrl's trainer."""
    m = re.search(r"ready in ([\d.]+) s", Path(log).read_text(errors="replace"))
    return float(m.group(1)) if m else None


# ----------------------------------------------------------------------------------------------- markdown


def markdown(res: dict[str, Any]) -> str:
    """The README section from the results."""
    c, st, ln = res["config"], res["step_time"], res["learning"]
    short = (1 - st["vlmrl_mean_response_length"] / c["max_tokens"]) * 100
    ratio = st["ratio_vlmrl_over_trl"]
    verdict = "met" if ratio <= 0.5 else "NOT met"
    lines = [
        f"`python benchmarks/bench_trl.py --rounds {c['rounds']} --steps {c['steps']} --learn-budget-s "
        f"{c['learn_budget_s']:.0f} --image-size {c['image_size']}` ({res['date']}). Tiny Qwen2.5-VL "
        f"({c['model_params']:,} parameters), synthetic "
        f"colour task ({c['image_size']}x{c['image_size']} images), {c['prompts']} prompts x {c['n']} samples x "
        f"{c['max_tokens']} tokens per step, KL off, one optimizer step per batch. vlmrl: vLLM rollout, "
        f"{c['vlmrl_workers']} worker processes x 1 thread. TRL {res['versions']['trl']}: `GRPOTrainer`, HF `generate` "
        f"(`use_vllm=False`), one process x {c['trl_threads']} threads, {c['trl_micro']} samples per micro-batch.",
        "",
        f"**Step time** (equal lengths: `ignore_eos` / `min_new_tokens`; first {c['warmup']} steps of each run "
        f"dropped; median per run, runs alternate TRL, vlmrl, ...):",
        "",
    ]
    rows = []
    fo = st["foreign_cpu_frac"]
    hf = st.get("vlmrl_hf_run_medians_s")
    for i, (t, v) in enumerate(zip(st["trl_run_medians_s"], st["vlmrl_run_medians_s"])):
        others = f"{fo['trl'][i]:.0%} / {fo['vlmrl'][i]:.0%}" + (f" / {fo['vlmrl_hf'][i]:.0%}" if hf else "")
        extra = [f"{hf[i]:.3f} ({hf[i] / t:.2f}x)"] if hf else []
        rows.append([f"round {i + 1}", f"{t:.3f}", f"{v:.3f}", f"{v / t:.2f}", *extra, others])
    med = [f"**{st['trl_median_s']:.3f}**", f"**{st['vlmrl_median_s']:.3f}**", f"**{ratio:.2f}**"]
    if hf:
        med.append(f"{st['vlmrl_hf_median_s']:.3f} ({st['vlmrl_hf_median_s'] / st['trl_median_s']:.2f}x)")
    rows.append(["**median**", *med, ""])
    header = ["", "TRL s/step", "vlmrl s/step", "vlmrl / TRL"]
    header += ["vlmrl, `rollout.name=hf` (/ TRL)"] if hf else []
    header += ["CPU used by other processes (TRL / vlmrl" + (" / vlmrl-hf)" if hf else ")")]
    lines.append(common.table(header, rows))
    lines += [
        "",
        f"Mean response length: vlmrl {st['vlmrl_mean_response_length']:.2f} of {c['max_tokens']} tokens, TRL exactly "
        f"{c['max_tokens']}" + (f" (vlmrl generated ~{short:.0f} % fewer tokens)." if short > 0.5 else "."),
        "",
        f"Goal vlmrl <= 0.5x TRL per step: **{verdict}** ({ratio:.2f}x). Start-up (not in the step time): vlmrl "
        f"{st['vlmrl_startup_s']:.0f} s (2 worker processes + FSDP2 + vLLM engines), TRL {st['trl_startup_s']:.0f} s "
        "(process start to first step).",
        "",
        *gap_note(st),
        "**Where the time goes** (median seconds per step over all measured steps):",
        "",
    ]
    t = st["trl_breakdown"]
    vs = [st["vlmrl_breakdown"]] + ([st["vlmrl_hf_breakdown"]] if "vlmrl_hf_breakdown" in st else [])

    def cols(fn: Any) -> list[str]:
        return [f"{fn(v):.3f}" for v in vs]

    stage_rows = [
        ["rollout (generate)", f"{t['rollout_s']:.3f}", *cols(lambda v: v["rollout_s"]), "TRL: processor + generate"],
        ["scoring (reward)", f"{t['reward_s']:.3f}", *cols(lambda v: v["reward_s"]), ""],
        [
            "inputs / advantages",
            f"{t['inputs_advantages_s']:.3f}",
            *cols(lambda v: v["input_prep_s"] + v["data_s"]),
            "vlmrl: data batch + processor inputs",
        ],
        ["old/ref log-probs", "0", *cols(lambda v: v["old_ref_logprob_s"]), "on-policy, beta=0: skipped by both"],
        [
            "update (fwd + bwd + optim)",
            f"{t['loss_forward_s'] + t['backward_s'] + t['optimizer_other_s']:.3f}",
            *cols(lambda v: v["update_s"]),
            f"TRL: fwd {t['loss_forward_s']:.3f} + bwd {t['backward_s']:.3f} + optim/other "
            f"{t['optimizer_other_s']:.3f}",
        ],
        ["weight sync (push to engine)", "0", *cols(lambda v: v["push_s"]), "TRL generates with the trained module"],
        [
            "worker calls / driver / other",
            "-",
            *cols(lambda v: v["rpc_sync_s"] + v["driver_other_s"]),
            "vlmrl: " + ", ".join(f"rpc {v['rpc_sync_s']:.3f} + driver {v['driver_other_s']:.3f}" for v in vs),
        ],
        ["**step**", f"**{t['step_s']:.3f}**", *[f"**{c}**" for c in cols(lambda v: v["step_s"])], ""],
    ]
    header = ["stage", "TRL s", "vlmrl s"] + (["vlmrl (hf rollout) s"] if len(vs) > 1 else []) + ["note"]
    lines.append(common.table(header, stage_rows, "l" + "r" * (len(header) - 2) + "l"))
    if not ln:
        lines += ["", "Time to learn: not run (`--skip-learn`).", "", common.machine_line(res)]
        return "\n".join(lines + ["Raw numbers: `benchmarks/results/trl.json`."])
    lines += [
        "",
        f"**Time to learn** (EOS allowed; 5-step moving average of the reward >= {c['learn_threshold']}; each run "
        f"capped at {c['learn_budget_s']:.0f} s of training; each tool with the quick start's recipe: lr 2e-3, "
        f"temperature 1, KL off, vlmrl with its entropy bonus {c.get('vlmrl_learn_entropy_coeff', 0)} "
        "(`configs/tiny_cpu.yaml`), which TRL's `GRPOTrainer` does not offer):",
        "",
    ]
    lrows = []
    sec = c["learn_secondary"]
    for name in ("trl", "vlmrl"):
        r = ln[name]
        hit, hit2 = r["reached_step"], r["secondary_step"]
        lrows.append(
            [
                name,
                str(hit) if hit else f"not reached in {r['steps_run']} steps",
                f"{r['reached_train_s']:.0f}" if hit else f"> {r['train_s']:.0f}",
                f"{hit2} steps, {r['secondary_train_s']:.0f} s" if hit2 else "not reached",
                f"{r['best_ma5']:.2f} / {r['final_ma5']:.2f}",
                f"{r['startup_s']:.0f}",
                f"{r['foreign_cpu_frac']:.0%}",
            ]
        )
    header = ["", "steps to target", "training s to target", f"to 5-step mean >= {sec}", "best / last 5-step mean"]
    header += ["start-up s", "CPU used by others"]
    lines.append(common.table(header, lrows))
    if not ln["trl"]["reached_step"] and not ln["vlmrl"]["reached_step"]:
        lines += [
            "",
            f"Neither run reached {c['learn_threshold']} within the cap. Both climb to about 0.3-0.45 and stay there: "
            "near the 1/3 a policy earns by always naming the same one of the three colours, which suggests (not "
            "checked against the samples) that neither reads the image yet at this model size, token budget and cap.",
        ]
    lines += ["", common.machine_line(res), "Raw numbers: `benchmarks/results/trl.json`."]
    return "\n".join(lines)


def gap_note(st: dict[str, Any]) -> list[str]:
    """What separates vlmrl from the 0.5x goal, from the measured stages."""
    target = 0.5 * st["trl_median_s"]
    gap = st["vlmrl_median_s"] - target
    if gap <= 0:
        return []
    v = st["vlmrl_breakdown"]
    trl_roll = st["trl_breakdown"].get("rollout_s")
    roll = (
        f"The rollout ({v['rollout_s']:.3f} s"
        + (f"; TRL's generate {trl_roll:.3f} s" if trl_roll is not None else "")
        + ") is the other large part: at this tiny shape per-call engine overhead (scheduling, the image encoder, "
        "sampling) rather than arithmetic dominates it, so vLLM's advantage over HF `generate` is small "
        "(Rollout engines table)."
    )
    return [
        f"To meet the goal vlmrl needs {target:.3f} s/step, {gap:.3f} s less than now. The weight push alone is "
        f"{v['push_s']:.3f} s per step, constant in batch size (see Scaling) and absent in TRL, which samples from "
        "the module it trains; of it, vLLM's own `update_weights` on this model is ~35 ms (see Rollout engines), the "
        f"rest is FSDP2 gathering the parameters (one all-gather per FSDP unit) and the copy. {roll}",
        "",
    ]


# ---------------------------------------------------------------------------------------------------- main


def vlmrl_step_run(
    out: Path, data: Path, model: Path, a: argparse.Namespace, over: list[str], what: str
) -> dict[str, Any]:
    """One vlmrl step-time run (equal lengths), re-run when contended; ``kept`` = the steps after warm-up."""
    vr = common.uncontended(
        lambda: common.vlmrl_train(out, data, model, a.steps, [*over, "actor_rollout_ref.rollout.ignore_eos=True"]),
        what,
        a.retries,
    )
    vr["kept"] = vr["rows"][a.warmup :]
    if len(vr["kept"]) < a.steps - a.warmup:
        raise RuntimeError(f"{what}: stopped after {len(vr['rows'])} of {a.steps} steps; log {vr['log']}")
    return vr


def learn_summary(rewards: list[float], step_times: list[float], threshold: float, secondary: float) -> dict[str, Any]:
    """Steps and training seconds until the 5-step moving average reaches ``threshold`` (and ``secondary``)."""
    hit = common.moving_average_hit(rewards, 5, threshold)
    hit2 = common.moving_average_hit(rewards, 5, secondary)
    ma = sum(rewards[-5:]) / min(5, len(rewards)) if rewards else 0.0
    ma_all = [sum(rewards[i - 5 : i]) / 5 for i in range(5, len(rewards) + 1)]
    return {
        "reached_step": hit,
        "reached_train_s": sum(step_times[:hit]) if hit else None,
        "secondary_step": hit2,
        "secondary_train_s": sum(step_times[:hit2]) if hit2 else None,
        "best_ma5": max(ma_all, default=ma),
        "steps_run": len(rewards),
        "train_s": sum(step_times),
        "final_ma5": ma,
        "rewards": rewards,
    }


def time_to_learn(
    model: Path, data: Path, work: Path, trl_args: list[str], vlmrl_over: list[str], a: argparse.Namespace
) -> tuple[dict[str, Any], dict[str, Any]]:
    """TRL then vlmrl (EOS allowed), each until the 5-step mean reward reaches ``a.learn_threshold`` or
    ``a.learn_budget_s`` seconds of training: ``{"trl": learn_summary, "vlmrl": ...}`` (with start-up and
    contention) and the two runs' raw results (TRL's JSON, vlmrl's metrics rows)."""
    learning: dict[str, Any] = {}
    print("[bench_trl] time to learn: TRL", flush=True)
    big = 100000
    tr = run_trl(
        model,
        data,
        work / "trl_learn.json",
        trl_args
        + ["--steps", str(big), "--time-budget-s", str(a.learn_budget_s)]
        + ["--stop-reward", str(a.learn_threshold)],
        timeout_s=a.learn_budget_s + 300,
    )
    learning["trl"] = learn_summary(
        tr["rewards"], [s["step_s"] for s in tr["steps"]], a.learn_threshold, a.learn_secondary
    )
    learning["trl"]["startup_s"] = tr["process_wall_s"] - tr["train_wall_s"]
    learning["trl"]["foreign_cpu_frac"] = tr["foreign_cpu_frac"]
    print("[bench_trl] time to learn: vlmrl", flush=True)

    def done(rows: list[dict[str, Any]]) -> bool:
        rw = [x["reward/mean"] for x in rows]
        return sum(x["timing/step_s"] for x in rows) > a.learn_budget_s or (
            common.moving_average_hit(rw, 5, a.learn_threshold) is not None
        )

    vr = common.vlmrl_train(
        work / "vlmrl_learn", data, model, big, vlmrl_over, timeout_s=a.learn_budget_s + 300, stop_when=done
    )
    rows = vr["rows"]
    learning["vlmrl"] = learn_summary(
        [x["reward/mean"] for x in rows], [x["timing/step_s"] for x in rows], a.learn_threshold, a.learn_secondary
    )
    learning["vlmrl"]["startup_s"] = startup_s(vr["log"]) or float("nan")
    learning["vlmrl"]["foreign_cpu_frac"] = vr["foreign_cpu_frac"]
    return learning, {"trl": tr, "vlmrl": vr}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run both parts, write the results file and the README section; ``--model-size`` other than ``tiny``: the
    size sweep (``bench_trl_sizes.py``, its own arguments and ``results/trl_sizes.json``)."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--model-size", default="tiny")
    if pre.parse_known_args(argv)[0].model_size != "tiny":
        import bench_trl_sizes

        return bench_trl_sizes.main(argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--model-size",
        default="tiny",
        help="tiny (this comparison); a list such as tiny,20m,100m runs the size sweep, see bench_trl_sizes.py --help",
    )
    p.add_argument("--rounds", type=int, default=2, help="alternating (TRL, vlmrl) step-time rounds")
    p.add_argument("--steps", type=int, default=12, help="steps per step-time run")
    p.add_argument("--warmup", type=int, default=2, help="steps dropped at the start of each run")
    p.add_argument("--learn-budget-s", type=float, default=240, help="training-time cap of each time-to-learn run")
    p.add_argument("--learn-threshold", type=float, default=0.9)
    p.add_argument("--learn-secondary", type=float, default=0.3, help="a lower level also reported (first progress)")
    p.add_argument("--retries", type=int, default=1, help="re-runs of a run during which others used > 10%% CPU")
    p.add_argument(
        "--no-hf-variant",
        dest="hf_variant",
        action="store_false",
        help="skip the extra vlmrl runs with actor_rollout_ref.rollout.name=hf",
    )
    p.add_argument("--skip-learn", action="store_true", help="only the step-time part")
    p.add_argument("--image-size", type=int, default=112, help="synthetic image side in pixels (the quick start's)")
    p.add_argument("--work", default=str(common.ROOT / ".cache" / "bench" / "trl"), help="scratch folder")
    a = p.parse_args(argv)
    if a.steps <= a.warmup:
        p.error("--steps must exceed --warmup")
    work = Path(a.work)
    trl_version = ensure_trl()
    model = common.tiny_model(seed=0)
    data = common.synthetic_data(work / f"data{a.image_size}", train=4096, test=32, image_size=a.image_size)
    prompts, n, tokens = 16, 8, 16
    common_over = [f"data.train_batch_size={prompts}", f"actor_rollout_ref.rollout.n={n}"]
    common_over += [f"data.max_response_length={tokens}", "actor_rollout_ref.actor.ppo_mini_batch_size=16"]
    # the step-time runs compute TRL's loss (no entropy bonus); the time-to-learn runs keep tiny_cpu's recipe
    step_over = [*common_over, "actor_rollout_ref.actor.entropy_coeff=0"]
    trl_args = ["--prompts", str(prompts), "--n", str(n), "--max-tokens", str(tokens), "--threads", "2"]

    # 1. step time, alternating
    trl_med, vl_med, trl_steps, vl_rows, trl_start, vl_start = [], [], [], [], [], []
    foreign: dict[str, list[float]] = {"trl": [], "vlmrl": [], "vlmrl_hf": []}
    hf_med: list[float] = []
    hf_rows: list[dict[str, Any]] = []
    for r in range(a.rounds):
        print(f"[bench_trl] round {r + 1}/{a.rounds}: TRL", flush=True)
        tr = common.uncontended(
            lambda r=r: run_trl(
                model, data, work / f"trl_step_{r}.json", trl_args + ["--steps", str(a.steps), "--equal-lengths"], 600
            ),
            f"TRL round {r + 1}",
            a.retries,
        )
        foreign["trl"].append(tr["foreign_cpu_frac"])
        kept = tr["steps"][a.warmup :]
        trl_med.append(common.median([s["step_s"] for s in kept]))
        trl_steps += kept
        trl_start.append(tr["process_wall_s"] - tr["train_wall_s"])
        print(f"[bench_trl]   TRL median {trl_med[-1]:.3f} s/step; vlmrl", flush=True)
        vr = vlmrl_step_run(work / f"vlmrl_step_{r}", data, model, a, step_over, f"vlmrl round {r + 1}")
        foreign["vlmrl"].append(vr["foreign_cpu_frac"])
        vl_med.append(common.median([x["timing/step_s"] for x in vr["kept"]]))
        vl_rows += vr["kept"]
        vl_start.append(startup_s(vr["log"]) or float("nan"))
        print(f"[bench_trl]   vlmrl median {vl_med[-1]:.3f} s/step", flush=True)
        if a.hf_variant:
            over = [*step_over, "actor_rollout_ref.rollout.name=hf"]
            hr = vlmrl_step_run(work / f"vlmrl_hf_step_{r}", data, model, a, over, f"vlmrl-hf round {r + 1}")
            foreign["vlmrl_hf"].append(hr["foreign_cpu_frac"])
            hf_med.append(common.median([x["timing/step_s"] for x in hr["kept"]]))
            hf_rows += hr["kept"]
            print(f"[bench_trl]   vlmrl (rollout.name=hf) median {hf_med[-1]:.3f} s/step", flush=True)
    step_time = {
        "trl_run_medians_s": trl_med,
        "vlmrl_run_medians_s": vl_med,
        "trl_median_s": common.median(trl_med),
        "vlmrl_median_s": common.median(vl_med),
        "trl_breakdown": trl_breakdown(trl_steps),
        "vlmrl_breakdown": vlmrl_breakdown(vl_rows),
        "trl_startup_s": common.median(trl_start),
        "vlmrl_startup_s": common.median(vl_start),
        "foreign_cpu_frac": foreign,
        "vlmrl_mean_response_length": sum(x["response_length/mean"] for x in vl_rows) / len(vl_rows),
    }
    if hf_med:
        step_time["vlmrl_hf_run_medians_s"] = hf_med
        step_time["vlmrl_hf_median_s"] = common.median(hf_med)
        step_time["vlmrl_hf_breakdown"] = vlmrl_breakdown(hf_rows)
    step_time["ratio_vlmrl_over_trl"] = step_time["vlmrl_median_s"] / step_time["trl_median_s"]

    # 2. time to learn
    learning = {} if a.skip_learn else time_to_learn(model, data, work, trl_args, common_over, a)[0]
    res = {
        **common.result_head("trl", trl=trl_version),
        "config": {
            "rounds": a.rounds,
            "steps": a.steps,
            "warmup": a.warmup,
            "learn_budget_s": a.learn_budget_s,
            "learn_threshold": a.learn_threshold,
            "learn_secondary": a.learn_secondary,
            "prompts": prompts,
            "n": n,
            "max_tokens": tokens,
            "image_size": a.image_size,
            "vlmrl_learn_entropy_coeff": 0.03,
            "model_params": common.safetensors_params(model),
            "vlmrl_workers": 2,
            "trl_threads": 2,
            "trl_micro": 64,
            "lr": 2e-3,
        },
        "step_time": step_time,
        "learning": learning,
    }
    path = common.write_result("trl", res)
    common.write_readme_section(SECTION, markdown(res))
    print(f"[bench_trl] wrote {path}", flush=True)
    print(json.dumps({k: v for k, v in step_time.items() if not k.endswith("breakdown")}, indent=2))
    return res


if __name__ == "__main__":
    main()
