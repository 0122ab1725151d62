"""End-to-end runs of ``python -m vlmrl.train`` as a user launches it: learning, exact resume after a kill -9 of the
driver, a worker dying mid-step, and a crash while a checkpoint is written.

Each run is a subprocess in its own session with its own Ray temp dir; every process it started is ended afterwards.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from runs import ENV, Run, base_args, make_colour_data, metrics, run_to_end, wait_for_step

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def colour_data(tmp_path_factory) -> Path:
    return make_colour_data(tmp_path_factory.mktemp("colour"))


def test_quickstart_config_learns(tiny_model_dir, colour_data, tmp_path):
    """The quick start's own config learns the colour task: well above chance (1/3) and above where it started."""
    out = tmp_path / "run"
    run_to_end(base_args(tiny_model_dir, colour_data, out, "trainer.val_before_train=true"), timeout=900)
    rows = metrics(out)
    first_val = next(r["val/reward/mean"] for r in rows if "val/reward/mean" in r)
    final_val = [r["val/reward/mean"] for r in rows if "val/reward/mean" in r][-1]
    train = [r["reward/mean"] for r in rows if "reward/mean" in r]
    assert first_val < 0.2, f"the random model should not know the task yet (val {first_val})"
    assert final_val >= 0.9, f"greedy validation reward {final_val} after {len(train)} steps"
    assert sum(train[-10:]) / 10 > sum(train[:10]) / 10 + 0.5, train
    assert (out / "reward_curve.png").stat().st_size > 1000
    assert list((out / "val_gallery").glob("step_*.html"))


def _compare_curves(a: list[dict], b: list[dict], keys: tuple[str, ...]) -> None:
    assert [r["step"] for r in a] == [r["step"] for r in b], ([r["step"] for r in a], [r["step"] for r in b])
    for ra, rb in zip(a, b):
        for k in keys:
            assert ra[k] == pytest.approx(rb[k], rel=1e-5, abs=1e-6), (ra["step"], k, ra[k], rb[k])


CURVE_KEYS = ("reward/mean", "actor/pg_loss", "actor/entropy", "response_length/mean", "actor/grad_norm")


def test_kill_driver_then_resume_matches_uninterrupted(tiny_model_dir, colour_data, tmp_path):
    """kill -9 of the driver after a checkpoint; ``resume_mode=auto`` continues with the same data order and RNG:
    the resumed run's curve equals an uninterrupted run's, step for step; the engines' log-probs equal the
    trainer's at every step (the weight push is exact)."""
    extra = ("trainer.total_training_steps=6", "trainer.save_freq=2", "data.val_files=null")
    ref_dir, cut_dir = tmp_path / "uninterrupted", tmp_path / "interrupted"
    run_to_end(base_args(tiny_model_dir, colour_data, ref_dir, *extra))
    drift = [r["rollout/logprob_diff"] for r in metrics(ref_dir)]
    assert len(drift) == 6 and max(drift) < 1e-3, drift

    cut = Run(base_args(tiny_model_dir, colour_data, cut_dir, *extra), ENV)
    try:
        wait_for_step(cut, cut_dir, 3, timeout=600)
        os.kill(cut.proc.pid, signal.SIGKILL)  # the driver, mid-run
    finally:
        cut.cleanup()
    resumed_from = int((cut_dir / "latest_checkpointed_iteration.txt").read_text())
    assert resumed_from in (2, 4)
    again = run_to_end(base_args(tiny_model_dir, colour_data, cut_dir, *extra))
    assert f"resumed from {cut_dir / f'global_step_{resumed_from}'} at step {resumed_from}" in again.output()
    _compare_curves(metrics(ref_dir), metrics(cut_dir), CURVE_KEYS)
    assert sorted(p.name for p in cut_dir.glob("global_step_*")) == ["global_step_2", "global_step_4", "global_step_6"]


def test_worker_death_stops_driver_and_resume_works(tiny_model_dir, colour_data, tmp_path):
    """A worker killed mid-run: the driver stops with an error naming the worker and the stage (no hang), the last
    checkpoint stays intact and the run resumes from it; a half-written checkpoint is ignored and removed."""
    extra = ("trainer.total_training_steps=5", "trainer.save_freq=2", "data.val_files=null",
             "actor_rollout_ref.rollout.name=hf")  # fmt: skip
    out = tmp_path / "run"
    run = Run(base_args(tiny_model_dir, colour_data, out, *extra), ENV)
    try:
        wait_for_step(run, out, 2, timeout=600)
        victims = run.workers()
        assert len(victims) == 2, [p.cmdline() for p in run.descendants()]
        victims[1].kill()
        t0 = time.monotonic()
        rc = run.wait(timeout=120)
        took = time.monotonic() - t0
    finally:
        run.cleanup()
    text = run.output()
    assert rc != 0
    assert took < 90, f"driver took {took:.0f} s to notice the dead worker"
    assert "vlmrl: run stopped at step" in text and "worker 1 died during" in text, text[-3000:]
    assert "(killed by SIGKILL)" in text and "last complete checkpoint:" in text and "Traceback" not in text
    assert any(f"during {stage}" in text for stage in ("rollout", "update", "checkpoint save")), text[-3000:]
    last = int((out / "latest_checkpointed_iteration.txt").read_text())
    assert last >= 2
    # a crash while writing the next checkpoint leaves only a .tmp folder behind
    partial = out / f"global_step_{last + 1}.tmp" / "actor"
    partial.mkdir(parents=True)
    (partial / "__0_0.distcp").write_bytes(b"\0" * 100)
    again = run_to_end(base_args(tiny_model_dir, colour_data, out, *extra))
    assert f"resumed from {out / f'global_step_{last}'} at step {last}" in again.output()
    assert not partial.parent.exists()
    steps = [r["step"] for r in metrics(out)]
    assert steps == list(range(1, 6)), steps


def test_export_checkpoint_loads_in_transformers_and_vllm(tiny_model_dir, colour_data, tmp_path):
    """``python -m vlmrl.export`` turns a run's latest checkpoint into an HF folder: transformers loads it with the
    trained (changed) weights, and vLLM serves it."""
    import torch
    from transformers import AutoModelForImageTextToText

    out = tmp_path / "run"
    run_to_end(base_args(tiny_model_dir, colour_data, out, "trainer.total_training_steps=3", "trainer.save_freq=3",
                         "data.val_files=null", "actor_rollout_ref.rollout.name=hf",
                         "actor_rollout_ref.actor.optim.lr=1e-2"))  # fmt: skip
    exported = tmp_path / "exported"
    cli = subprocess.run(
        [sys.executable, "-m", "vlmrl.export", "--checkpoint", str(out), "--output", str(exported)],
        capture_output=True, text=True, env={**os.environ, **ENV},
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr[-3000:]
    assert "global_step_3" in cli.stdout or (out / "global_step_3").is_dir()
    new = AutoModelForImageTextToText.from_pretrained(exported).state_dict()
    base = AutoModelForImageTextToText.from_pretrained(tiny_model_dir).state_dict()
    assert new.keys() == base.keys()
    changed = [k for k in new if not torch.equal(new[k], base[k])]
    assert len(changed) > len(new) // 2, f"training changed only {len(changed)} of {len(new)} tensors"
    code = (
        "import sys; from vllm import LLM, SamplingParams; "
        "llm = LLM(model=sys.argv[1], dtype='float32', max_model_len=256, enforce_eager=True, "
        "limit_mm_per_prompt={'image': 1, 'video': 0}); "
        "o = llm.generate([{'prompt_token_ids': [1, 2, 3]}], SamplingParams(max_tokens=4, temperature=0)); "
        "print('TOKENS', len(o[0].outputs[0].token_ids))"
    )
    served = subprocess.run([sys.executable, "-c", code, str(exported)], capture_output=True, text=True,
                            env={**os.environ, **ENV}, timeout=300)  # fmt: skip
    assert served.returncode == 0 and "TOKENS" in served.stdout, served.stderr[-3000:]
    bad = subprocess.run([sys.executable, "-m", "vlmrl.export", "--checkpoint", str(tmp_path / "nothing"),
                          "--output", str(tmp_path / "x")], capture_output=True, text=True)  # fmt: skip
    assert bad.returncode == 2 and "nothing" in bad.stderr
