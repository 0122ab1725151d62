"""``trainer.dry_run=True``: every check that needs no accelerator, every problem at once, the plan, nothing started."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from utils import synthetic_data

from vlmrl import dry_run
from vlmrl.config import load

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthetic_data(tmp_path_factory.mktemp("synth"), train=32, test=8)


def cfg_of(model: str, data: Path, tmp: Path, *extra: str):
    return load(
        [
            f"data.train_files={data / 'train.parquet'}",
            f"data.val_files={data / 'test.parquet'}",
            f"actor_rollout_ref.model.path={model}",
            f"trainer.default_local_dir={tmp / 'run'}",
            *extra,
        ],
        config_name="tiny_cpu",
    )


def test_a_good_run_prints_its_plan_and_exits_0(tiny_model_dir, data, tmp_path, capsys) -> None:
    rc = dry_run.run(cfg_of(tiny_model_dir, data, tmp_path), [], [])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "workers: 2 CPU hybrid worker(s)" in out and "qwen2_5_vl" in out
    assert "data.train: 32 rows -> 32 prompts" in out and "data.val: 8 rows -> 8 prompts" in out
    assert "reward: " in out and "synthetic" in out
    assert "steps: 120 (trainer.total_training_steps)" in out
    assert "batch: 16 prompts x n=8 = 128 samples per step" in out
    assert "rollout: vLLM" in out and "mm_processor_cache_gb" in out
    assert "OK: the run would start" in out
    assert not (tmp_path / "run").exists(), "a dry run creates nothing"


def test_every_problem_is_listed_not_only_the_first(tiny_model_dir, data, tmp_path, capsys) -> None:
    no_prompt = tmp_path / "no_prompt.parquet"
    pq.write_table(pq.read_table(data / "train.parquet").drop_columns(["prompt"]), no_prompt)
    cfg = cfg_of(tiny_model_dir, data, tmp_path, "reward.function=no_such_reward", "data.max_prompt_length=40")
    cfg.data.val_files = [str(no_prompt), str(tmp_path / "missing.parquet")]
    rc = dry_run.run(cfg, ["'some.key': from translating the overrides"], [])
    out = capsys.readouterr().out
    assert rc == 2
    problems = out.split("problem(s); the run would not start:")[1]
    assert "'some.key': from translating the overrides" in problems
    assert "missing.parquet' does not exist" in problems
    assert "reward: RewardConfigError: unknown reward function 'no_such_reward'" in problems
    assert "data.train_files: no prompt survives the overlong filter" in problems  # 40 tokens: every prompt is longer


def test_missing_column_and_data_source_without_a_reward(tiny_model_dir, data, tmp_path, capsys) -> None:
    import pyarrow as pa

    no_prompt = tmp_path / "no_prompt.parquet"
    pq.write_table(pq.read_table(data / "test.parquet").drop_columns(["prompt"]), no_prompt)
    mystery = tmp_path / "mystery.parquet"
    t = pq.read_table(data / "train.parquet")
    pq.write_table(
        t.set_column(t.schema.get_field_index("data_source"), "data_source", pa.array(["mystery"] * len(t))), mystery
    )
    cfg = cfg_of(tiny_model_dir, data, tmp_path, "reward.function=null")
    cfg.data.train_files, cfg.data.val_files = str(mystery), str(no_prompt)
    assert dry_run.run(cfg, [], []) == 2
    out = capsys.readouterr().out
    assert f"{no_prompt}: no column 'prompt' (data.prompt_key)" in out
    assert "no reward function for data_source 'mystery'" in out


def test_a_hub_id_not_in_the_cache_is_a_note_offline_a_problem(data, tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    cfg = cfg_of("Qwen/Qwen2.5-VL-3B-Instruct", data, tmp_path)
    assert dry_run.run(cfg, [], []) == 0
    out = capsys.readouterr().out
    assert "not in the local Hugging Face cache: the run downloads it at start" in out
    assert "data.train: 32 rows (the overlong filter is counted once the model is available)" in out
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert dry_run.run(cfg, [], []) == 2
    assert "and HF_HUB_OFFLINE is set" in capsys.readouterr().out


def test_gpus_this_machine_lacks_are_a_note(tiny_model_dir, data, tmp_path, capsys) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("the machine has CUDA: the note is about machines without it")
    cfg = cfg_of(tiny_model_dir, data, tmp_path, "trainer.device=cuda", "trainer.n_gpus_per_node=8")
    assert dry_run.run(cfg, [], []) == 0
    out = capsys.readouterr().out
    assert "workers: 1 node(s) x 8 GPU(s) = 8 hybrid worker(s)" in out
    assert "note: this machine has 0 CUDA GPU(s); the run asks for 8 per node" in out


def test_dry_run_through_the_cli_lists_key_and_value_problems_together(tiny_model_dir, data, tmp_path) -> None:
    """``python -m vlmrl.train ... trainer.dry_run=True`` (its ``main``, here: tests/runs.cli_here) lists a misspelt
    key, a bad value and a verl feature vlmrl lacks together, and still checks the data (exit 2); the same line
    without them passes (exit 0) and creates nothing."""
    from runs import cli_here

    base = [
        "--config-name",
        "tiny_cpu",
        f"data.train_files={data / 'train.parquet'}",
        f"actor_rollout_ref.model.path={tiny_model_dir}",
        f"trainer.default_local_dir={tmp_path / 'run'}",
        "trainer.dry_run=True",
    ]
    code, out, err = cli_here(
        [
            *base,
            "actor_rollout_ref.rollout.temprature=1",
            "actor_rollout_ref.actor.optim.lr=0",
            "+actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
        ]
    )
    assert code == 2, out[-3000:] + err[-3000:]
    assert "Did you mean 'actor_rollout_ref.rollout.temperature'?" in out
    assert "actor_rollout_ref.actor.optim.lr=0" in out and "the Megatron-LM backend" in out
    assert "data.train: 32 rows -> 32 prompts" in out  # the data was still checked
    code, out, err = cli_here(base)
    assert code == 0 and "OK: the run would start" in out, out[-3000:] + err[-3000:]
    assert not (tmp_path / "run").exists()


def test_the_plan_of_a_fully_async_run_names_its_window_sync_and_partial_rollouts(
    tiny_model_dir, data, tmp_path, capsys
) -> None:
    """``async_training.mode=fully_async``: the pool's line says how groups stream, when the weights sync, the window
    staleness_threshold allows and what a sync does to the generations in flight; rollout.total_rollout_steps caps
    the steps (verl's rule)."""
    pools = ("actor_rollout_ref.hybrid_engine=False", "trainer.cpu_workers=1", "rollout.cpu_workers=1")
    fully = (
        *pools,
        "async_training.mode=fully_async",
        "data.train_batch_size=0",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    )
    cfg = cfg_of(tiny_model_dir, data, tmp_path, *fully, "async_training.trigger_parameter_sync_step=2")
    assert dry_run.run(cfg, [], []) == 0
    out = capsys.readouterr().out
    assert "fully asynchronous): 1 node(s) x 1 CPU rollout worker(s) = 1; prompt groups streamed" in out, out
    assert "a step trains on the first 4 that finish; weights synced by a collective every 2 step(s)" in out
    assert "at most 8 groups started between two syncs (staleness_threshold=0.1), at most 8 generating at once" in out
    assert "interrupted and continued with the new weights (partial rollouts)" in out
    tools = Path(__file__).resolve().parents[1] / "examples" / "tool_config" / "zoom.yaml"
    multi = (
        "actor_rollout_ref.rollout.multi_turn.enable=True",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools}",
        "data.max_prompt_length=1024",
        "actor_rollout_ref.rollout.max_model_len=1200",
    )
    assert dry_run.run(cfg_of(tiny_model_dir, data, tmp_path, *fully, *multi), [], []) == 0
    assert "per trajectory, streamed group by group" in capsys.readouterr().out
    cfg = cfg_of(
        tiny_model_dir,
        data,
        tmp_path,
        *fully,
        "async_training.partial_rollout=False",
        "trainer.total_training_steps=null",
        "trainer.total_epochs=2",
        "rollout.total_rollout_steps=20",
    )
    assert dry_run.run(cfg, [], []) == 0
    out = capsys.readouterr().out
    assert "generations in flight at a sync finish first (partial_rollout=False)" in out
    assert "steps: 5 (rollout.total_rollout_steps=20 prompts)" in out, out
