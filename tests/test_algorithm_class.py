"""An algorithm class of your own (``algorithm.name``, ``vlmrl.algorithms.RLAlgorithm``): its parameters from the
unknown keys under ``algorithm`` (command line and config file), its hooks where the docs say (the rewards it
reshapes reach the advantages; the state ``before_train_step`` sets is what every worker's ``compute_loss`` sees in
the same step; its metrics logged; its state checkpointed), failures named with the class, hook and step, and the
length-aware example's effect: response lengths move into the window on a task where length is otherwise free."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runs import base_args, make_colour_data, metrics, run_example, run_here, train_here, train_here_to_end
from vlmrl.config import ConfigError, load

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "algorithms" / "length_aware.py"

SPY = """
import json, os
from pathlib import Path

import torch

from vlmrl.algorithms import RLAlgorithm


class Spy(RLAlgorithm):
    def __init__(self, scale=1.0, fail_at=0, nan_at=0):
        super().__init__()
        self.scale, self.fail_at, self.nan_at = scale, fail_at, nan_at
        self.marker = -1
        self.after = []

    def before_train_step(self, step, data):
        if step == self.fail_at:
            raise RuntimeError("planned failure")
        self.marker = step  # the workers must see this step's value in this step's compute_loss
        self.seen_mean = float(data["rewards"].mean())
        data["rewards"] *= self.scale

    def compute_loss(self, data):
        out = super().compute_loss(data)
        with Path(__file__).with_name("losses.jsonl").open("a") as f:
            r = data["rewards"]
            f.write(json.dumps({"pid": os.getpid(), "marker": self.marker, "shape": list(data["log_probs"].shape),
                                "rewards_shape": list(r.shape), "one_per_row": bool(((r != 0).sum(-1) <= 1).all()),
                                "rewards_sum": float(r.sum())}) + "\\n")
        if self.marker == self.nan_at:
            out["loss"] = out["loss"] * float("nan")
        out["marker"] = torch.tensor(float(self.marker))
        return out

    def after_train_step(self, step, metrics):
        self.after.append([step, metrics["reward/mean"]])

    def get_metrics(self):
        return {"marker": self.marker, "after_calls": len(self.after)}
"""


@pytest.fixture(scope="module")
def colour_data(tmp_path_factory) -> Path:
    return make_colour_data(tmp_path_factory.mktemp("colour"))


def _spy(tmp_path: Path) -> Path:
    f = tmp_path / "spy_algo.py"
    f.write_text(SPY)
    return f


def test_parameters_come_from_unknown_algorithm_keys(colour_data: Path, tmp_path: Path) -> None:
    base = [f"data.train_files={colour_data / 'train.parquet'}", f"actor_rollout_ref.model.path={tmp_path}"]
    spec = f"{EXAMPLE}:LengthAware"
    cfg = load(
        [*base, f"algorithm.name={spec}", "+algorithm.min_length=2", "algorithm.max_length=9"], config_name="tiny_cpu"
    )
    assert cfg.algorithm.name == spec and dict(cfg.algorithm.params) == {"min_length": 2, "max_length": 9}
    # a config file's algorithm block (Hydra's config dir, as a user's own preset)
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "mine.yaml").write_text(
        f"defaults:\n  - tiny_cpu\n  - _self_\nalgorithm:\n  name: {spec}\n  min_length: 3\n  penalty: 0.25\n"
    )
    from vlmrl.config.command import compose

    composed = compose(["--config-dir", str(tmp_path / "conf"), "--config-name", "mine", *base])
    assert not composed.problems, composed.problems
    assert dict(composed.cfg.algorithm.params) == {"min_length": 3, "penalty": 0.25}


@pytest.mark.parametrize(
    "extra,message",
    [
        (["+algorithm.min_lenght=3"], "Unknown config key 'algorithm.min_lenght'"),
        (["algorithm.adv_estimater=grpo"], "Did you mean 'algorithm.adv_estimator'?"),
        (
            [f"algorithm.name={EXAMPLE}:LengthAware", "+algorithm.min_lenght=3"],
            "its constructor does not take these parameters (min_lenght)",
        ),
        ([f"algorithm.name={EXAMPLE}:NoSuchClass"], "has no function 'NoSuchClass'"),
        (["algorithm.name=vlmrl.algorithms.losses.LossConfig"], "is not a subclass of vlmrl.algorithms.RLAlgorithm"),
        ([f"algorithm.name={EXAMPLE}:LengthAware", "+algorithm.min_length=9"], "need 0 < min_length <= max_length"),
    ],
)
def test_bad_classes_and_parameters_are_config_problems(colour_data: Path, tmp_path: Path, extra, message) -> None:
    base = [f"data.train_files={colour_data / 'train.parquet'}", f"actor_rollout_ref.model.path={tmp_path}"]
    with pytest.raises(ConfigError) as e:
        load([*base, *extra], config_name="tiny_cpu")
    assert message in str(e.value), str(e.value)


@pytest.mark.slow
def test_hooks_state_and_metrics_through_the_launch_command(tiny_model_dir, colour_data: Path, tmp_path: Path) -> None:
    """The quick start's launch (2 CPU worker processes): the state set in ``before_train_step`` is what both workers'
    ``compute_loss`` see in the same step; the hooks' metrics are logged; the state is in the checkpoint."""
    spy = _spy(tmp_path)
    out = tmp_path / "run"
    run_here(
        base_args(
            tiny_model_dir,
            colour_data,
            out,
            "trainer.total_training_steps=3",
            "data.val_files=null",
            f"algorithm.name={spy}:Spy",
            "+algorithm.scale=2.0",
            "trainer.save_freq=3",
        )
    )
    calls = [json.loads(x) for x in (tmp_path / "losses.jsonl").read_text().splitlines()]
    assert len({c["pid"] for c in calls}) == 2  # both workers ran the class's compute_loss
    assert all(c["rewards_shape"] == c["shape"] and c["one_per_row"] for c in calls)  # scores on last tokens
    rows = metrics(out)
    for r in rows:  # the rewards compute_loss gets are the hook's: doubled (scale 2), 16 prompts x 8 samples
        total = sum(c["rewards_sum"] for c in calls if c["marker"] == r["step"])
        assert total == pytest.approx(2 * r["reward/mean"] * 128, abs=1e-3), (r["step"], total)
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r["algorithm/marker"] == r["step"] and r["actor/marker"] == r["step"], r  # same step, every worker
        assert r["algorithm/after_calls"] == r["step"]
    state = json.loads((out / "global_step_3" / "trainer_state.json").read_text())["algorithm"]
    assert state["marker"] == 3 and state["scale"] == 2.0 and [s for s, _ in state["after"]] == [1, 2, 3]


@pytest.mark.slow
@pytest.mark.parametrize(
    "where,message",
    [
        ("fail_at", "Spy.before_train_step failed at step 2: RuntimeError: planned failure"),
        ("nan_at", "Spy.compute_loss at step 2: 'loss' is not finite"),
    ],
)
def test_a_failing_class_stops_the_run_naming_it(tiny_model_dir, colour_data, tmp_path, where, message) -> None:
    spy = _spy(tmp_path)
    out = tmp_path / "run"
    code, log = train_here(
        base_args(
            tiny_model_dir,
            colour_data,
            out,
            "trainer.total_training_steps=4",
            "data.val_files=null",
            "trainer.launcher=inline",
            "actor_rollout_ref.rollout.name=hf",
            f"algorithm.name={spy}:Spy",
            f"+algorithm.{where}=2",
            "trainer.save_freq=1",
        )
    )
    assert code == 1 and message in log, log[-3000:]
    assert "last complete checkpoint:" in log and (out / "global_step_1" / "trainer_state.json").is_file()


@pytest.mark.slow
def test_length_aware_example_moves_lengths_into_its_window(tiny_model_dir, colour_data: Path, tmp_path) -> None:
    """The quick start's task, where a response's length does not change its reward: without the class responses
    stay near the length cap of 8 tokens (the control: the quick start's own 120-step run,
    tests/test_train_e2e.py::test_the_quick_start_script_learns_as_the_readme_says); with it (``bash
    examples/length_aware_cpu.sh``: window 1-5 tokens) most land inside within 50 steps. One worker in one process
    with the HF rollout, no validation."""
    fast = (
        "trainer.launcher=inline",
        "actor_rollout_ref.rollout.name=hf",
        "data.val_files=null",
        "trainer.total_training_steps=50",
    )
    shaped = tmp_path / "shaped"
    log = run_example("length_aware_cpu.sh", shaped, *fast, QUICKSTART_DATA=str(colour_data))
    tail = lambda rows, key: sum(r[key] for r in rows[-5:]) / 5  # noqa: E731
    shaped_rows = metrics(shaped)
    assert shaped_rows[0]["response_length/mean"] > 6.5, shaped_rows[0]  # it starts near the cap
    assert shaped_rows[0]["algorithm/in_window"] < 0.2 and tail(shaped_rows, "algorithm/in_window") >= 0.8
    assert tail(shaped_rows, "response_length/mean") < 5.0
    # the script's parameters reach the class (and its metrics the actor's lines), the quick start's pipeline ends
    # with the reward curve and the report
    assert all(
        0.0 <= r["algorithm/in_window"] <= 1.0 and r["algorithm/max_length"] == 5.0 and r["actor/max_length"] == 5.0
        for r in shaped_rows
    )
    assert "[quickstart] tiny model:" in log and (shaped / "report.html").is_file()
    assert (shaped / "reward_curve.png").is_file()


def test_the_dry_run_loads_the_class_and_lists_its_parameters(tiny_model_dir, colour_data: Path) -> None:
    """``python -m vlmrl.train ... trainer.dry_run=true`` (its ``main``, here) names the class and each parameter's
    value, the defaults marked."""
    from runs import cli_here

    code, out, err = cli_here(
        [
            "--config-name",
            "tiny_cpu",
            f"data.train_files={colour_data / 'train.parquet'}",
            "data.val_files=null",
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            "trainer.dry_run=true",
            f"algorithm.name={EXAMPLE}:LengthAware",
            "+algorithm.max_length=7",
        ]
    )
    assert code == 0 and (
        f"algorithm class: {EXAMPLE}:LengthAware(min_length=4 (default), max_length=7, penalty=0.5 (default), "
        "patience=3 (default))" in out
    ), out[-3000:] + err[-2000:]


@pytest.mark.slow
def test_the_class_state_resumes_from_the_checkpoint(tiny_model_dir, colour_data: Path, tmp_path: Path) -> None:
    """A run cut after step 2 and resumed: the instance's state (here the list ``after_train_step`` appends to) comes
    back from the checkpoint, so step 3 counts 3 calls as an uncut run does; a constructor parameter the resuming
    command line sets anew is the command line's, with a notice."""
    spy = _spy(tmp_path)
    out = tmp_path / "run"
    fast = (
        "trainer.launcher=inline",
        "actor_rollout_ref.rollout.name=hf",
        "data.val_files=null",
        f"algorithm.name={spy}:Spy",
        "trainer.save_freq=2",
    )
    train_here_to_end(base_args(tiny_model_dir, colour_data, out, "trainer.total_training_steps=2", *fast))
    # the command line changes a constructor parameter on resume: it wins over the checkpoint's (issue 44 item 4)
    log = train_here_to_end(
        base_args(tiny_model_dir, colour_data, out, "trainer.total_training_steps=3", "+algorithm.scale=0.5", *fast)
    )
    step3 = [r for r in metrics(out) if r["step"] == 3]
    assert step3 and step3[-1]["algorithm/after_calls"] == 3 and step3[-1]["algorithm/marker"] == 3, step3
    assert "resume: algorithm.scale=0.5 (the config's; the checkpoint had 1.0)" in log
    # a run with nothing left to do logs no step: it prints no health summary (the previous run's was printed as its
    # own, issue 44 item 11)
    assert "[vlmrl] health:" in log
    again = train_here_to_end(base_args(tiny_model_dir, colour_data, out, "trainer.total_training_steps=3", *fast))
    assert "resumed from" in again and "[vlmrl] health:" not in again


def test_the_report_shows_the_algorithm_and_rollout_correction_metrics(tmp_path: Path) -> None:
    from vlmrl.report import build_report

    rows = [
        {
            "step": s,
            "reward/mean": 0.1 * s,
            "algorithm/in_window": 0.2 * s,
            "rollout_corr/rollout_is_mean": 1.0,
            "rollout_corr/kl": 0.001,
            "rollout_corr/rollout_rs_masked_fraction": 0.05,
        }
        for s in range(1, 4)
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    html = Path(build_report([str(tmp_path)], str(tmp_path / "report.html"))).read_text()
    assert "id='panel-algorithm'" in html and "id='panel-rollout_corr'" in html
    assert "algorithm/in_window" in html
