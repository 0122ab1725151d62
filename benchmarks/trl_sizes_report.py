"""The README section of ``bench_trl_sizes.py`` (``## GRPO step time vs TRL by model size``) from its results."""

from __future__ import annotations

from typing import Any

import common

GROUPS = (
    "matmul / conv",
    "attention",
    "softmax / log-softmax",
    "elementwise / norm",
    "copy / index / layout",
    "optimizer + clip",
    "autograd engine",
    "other",
    "untraced",
)


def _m(n: float) -> str:
    return f"{n / 1e6:.1f} M"


def _g(rate: float | None) -> str:
    return "-" if rate is None else f"{rate / 1e9:.1f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _achieved(e: dict[str, Any]) -> str:
    """A side's update GFLOP/s and share of its matmul reference, or why there is none."""
    if "missing" in e:
        return "metric missing"
    return f"{_g(e['achieved_flops_per_s'])} ({_pct(e.get('of_matmul'))})"


def _padding(e: dict[str, Any]) -> str:
    return "metric missing" if "missing" in e else f"{e['padding_share']:.1%}"


def _learn(r: dict[str, Any] | None) -> list[str]:
    if not r:
        return ["not run", "-"]
    hit = r["reached_step"]
    reached = (
        f"{hit} steps, {r['reached_train_s']:.0f} s"
        if hit
        else f"not reached within budget ({r['steps_run']} step{'s' * (r['steps_run'] != 1)}, {r['train_s']:.0f} s)"
    )
    return [reached, f"{r['best_ma5']:.2f} / {r['final_ma5']:.2f}"]


def markdown(res: dict[str, Any]) -> str:
    """The README section."""
    c, sizes = res["config"], res["sizes"]
    script = "bench_trl_sizes.py" if c["sizes"] == ["tiny"] else "bench_trl.py"  # bench_trl.py: tiny is its own
    cmd = f"python benchmarks/{script} " + " ".join(c["argv"] or ["--model-size", ",".join(c["sizes"])])
    lines = [
        f"`{cmd}` ({res['date']}). Random-weight Qwen2.5-VL presets (`vlmrl.testing.tiny.SIZES`: the tiny tokenizer, "
        f"language model and vision tower grown together), synthetic colour task ({c['image_size']}x"
        f"{c['image_size']} images), KL off, one optimizer step per batch, lr {c['lr']:g}. vlmrl: vLLM rollout, "
        f"{c['vlmrl_workers']} worker processes x 1 thread, padded (default) and packed (`{c['packed_override']}`). "
        f"TRL {res['versions']['trl']}: `GRPOTrainer`, HF `generate`, one process x {c['trl_threads']} threads. "
        "Each size's workload is the same for both sides:",
        "",
    ]
    rows = []
    for size, r in sizes.items():
        p, pl = r["params"], r["plan"]
        rows.append(
            [
                size,
                _m(p["total"]),
                f"{_m(p['language_model'])} / {_m(p['vision_tower'])}",
                f"{pl['prompts']} x {pl['n']} x {pl['max_tokens']}",
                r["trl_micro"],
                f"{pl['steps']} ({pl['warmup']} dropped) x {pl['rounds']}",
                f"{pl['learn_budget_s']:.0f}",
            ]
        )
    header = [
        "size",
        "parameters",
        "language model / vision tower",
        "prompts x samples x tokens",
        "TRL micro-batch",
        "steps per run x rounds",
        "learn budget s",
    ]
    lines += [common.table(header, rows), "", "**Step time** (equal lengths; median per run, then over runs):", ""]
    rows = []
    for size, r in sizes.items():
        st = r["step_time"]
        tb = st["trl_breakdown"]
        vb, pb = st["vlmrl_breakdown"], st["vlmrl_packed_breakdown"]
        fo = max(x for v in st["foreign_cpu_frac"].values() for x in v)
        rows.append(
            [
                size,
                f"{st['trl_median_s']:.3f}",
                f"{st['vlmrl_median_s']:.3f} ({st['ratio_vlmrl_over_trl']:.2f}x)",
                f"{st['vlmrl_packed_median_s']:.3f} ({st['ratio_vlmrl_packed_over_trl']:.2f}x)",
                f"{st['ratio_packed_over_padded']:.2f}",
                f"{tb['update_s']:.3f} / {vb['update_s']:.3f} / {pb['update_s']:.3f}",
                f"{st['trl_startup_s']:.0f} / {st['vlmrl_startup_s']:.0f}",
                _pct(fo),
            ]
        )
    header = [
        "size",
        "TRL s/step",
        "vlmrl s/step (/ TRL)",
        "vlmrl packed s/step (/ TRL)",
        "packed / padded",
        "update s (TRL / vlmrl / packed)",
        "start-up s (TRL / vlmrl)",
        "CPU used by others (max)",
    ]
    lines += [common.table(header, rows), "", "**Where the time goes** (median seconds per step):", ""]
    rows = []
    for size, r in sizes.items():
        st = r["step_time"]
        t = st["trl_breakdown"]
        rows.append(
            [
                size,
                "TRL",
                f"{t['rollout_s']:.3f}",
                f"{t['reward_s']:.3f}",
                f"{t['inputs_advantages_s']:.3f}",
                f"{t['update_s']:.3f}",
                "0",
                "-",
                f"**{t['step_s']:.3f}**",
            ]
        )
        for arm, label in (("vlmrl", "vlmrl"), ("vlmrl_packed", "vlmrl packed")):
            v = st[f"{arm}_breakdown"]
            rows.append(
                [
                    size,
                    label,
                    f"{v['rollout_s']:.3f}",
                    f"{v['reward_s']:.3f}",
                    f"{v['input_prep_s'] + v['data_s']:.3f}",
                    f"{v['update_s']:.3f}",
                    f"{v['push_s']:.3f}",
                    f"{v['rpc_sync_s'] + v['driver_other_s'] + v['old_ref_logprob_s']:.3f}",
                    f"**{v['step_s']:.3f}**",
                ]
            )
    header = [
        "size",
        "side",
        "rollout",
        "reward",
        "inputs / advantages",
        "update (fwd + bwd + optim)",
        "weight push",
        "calls / driver / other",
        "step",
    ]
    lines += [common.table(header, rows, "ll" + "r" * 7), ""]
    if any(r["learning"] for r in sizes.values()):
        lines += [
            f"**Time to learn** (EOS allowed; 5-step mean reward >= {c['learn_threshold']}; training seconds; "
            f"vlmrl with the quick start's entropy bonus {c['vlmrl_learn_entropy_coeff']}):",
            "",
        ]
        rows = [
            [
                size,
                f"{r['plan']['learn_budget_s']:.0f}",
                *_learn(r["learning"].get("trl")),
                *_learn(r["learning"].get("vlmrl")),
            ]
            for size, r in sizes.items()
        ]
        header = [
            "size",
            "budget s",
            "TRL: to target",
            "TRL best / last 5-step mean",
            "vlmrl: to target",
            "vlmrl best / last 5-step mean",
        ]
        lines += [common.table(header, rows), ""]
    lines += efficiency_lines(sizes)
    lines += ["", common.machine_line(res), "Raw numbers: `benchmarks/results/trl_sizes.json`."]
    return "\n".join(lines)


def efficiency_lines(sizes: dict[str, Any]) -> list[str]:
    """The compute-efficiency and profile tables with their notes."""
    lines = [
        "**Compute efficiency of the update** (GFLOP/s; achieved = 6 x (language-model parameters less the input "
        "embedding x non-padding tokens + vision-tower parameters x patches) / update s, per step, median; in "
        "brackets its share of `torch.mm`'s fp32 FLOP/s at the model's shapes measured in the same run: vlmrl "
        "against 2 processes x 1 thread at once, TRL against 1 process x 2 threads at its own batch shape):",
        "",
    ]
    rows = []
    for size, r in sizes.items():
        e, mm = r["efficiency"], r["efficiency"]["matmul"]
        learn = e.get("learn_runs", {})
        rows.append(
            [
                size,
                f"{_g(mm['1x1']['mix_flops_per_s'])} / {_g(mm['2x1']['mix_flops_per_s'])} / "
                f"{_g(mm['1x2']['mix_flops_per_s'])} / {_g(mm['trl_1x2']['mix_flops_per_s'])}",
                _achieved(e["vlmrl"]),
                _achieved(e["vlmrl_packed"]),
                _achieved(e["trl"]),
                f"{_padding(e['vlmrl'])} / {_padding(e['vlmrl_packed'])} / {_padding(e['trl'])}",
                " / ".join(_padding(learn[k]) for k in ("vlmrl", "trl")) if learn else "-",
            ]
        )
    header = [
        "size",
        "matmul: 1 thread / 2 x 1 thread / 1 x 2 threads / TRL shape 1 x 2",
        "vlmrl update",
        "vlmrl packed update",
        "TRL update",
        "padding share, step runs (vlmrl / packed / TRL)",
        "padding share, learn runs (vlmrl / TRL)",
    ]
    lines += [common.table(header, rows), ""]
    if any(r["profile"] for r in sizes.values()):
        lines += [
            "**Where one worker's update goes** (`torch.profiler`, one process x 1 thread, no FSDP: one "
            "worker's share of the batch; self CPU time by op group, share of the update's wall time; "
            "`untraced` = time no op accounts for: Python, the autograd engine between ops):",
            "",
        ]
        rows = []
        for size, r in sizes.items():
            for arm, pr in r["profile"].items():
                if "unavailable" in pr:
                    rows.append([size, arm, pr["unavailable"], *[""] * (len(GROUPS) + 2)])
                    continue
                share = pr["profile"]["groups_share"]
                rows.append(
                    [
                        size,
                        arm,
                        f"{pr['update_s']:.3f}",
                        _g(pr["achieved_flops_per_s"]),
                        *[_pct(share.get(g, 0.0)) for g in GROUPS],
                        _g(pr["profile"]["matmul_flops_per_s"]),
                    ]
                )
        header = ["size", "arm", "update s", "GFLOP/s", *GROUPS, "GFLOP/s inside matmul ops"]
        lines += [common.table(header, rows, "ll" + "r" * (len(header) - 2))]
    return lines
