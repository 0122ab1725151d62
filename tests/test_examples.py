"""The shell pipelines in examples/: every GPU recipe's launch line is one vlmrl accepts, with the values it means,
and every pipeline runs end to end: in its smoke mode here (``SMOKE=1``: tiny model, stand-in data in the pipeline's
own input format through its own preprocess step, 2 CPU workers, 2 steps; every other flag as the GPU run sets it),
or whole in the test that checks what it learns (``FULL_RUNS``).

The launch-line tests run each script with ``VLMRL_DRY_RUN=1``: it prints its preprocess and train commands
(shell-quoted, one per line) instead of running them, so the test sees exactly the arguments the shell would pass,
variables substituted. The train overrides then go through ``vlmrl.config.load`` and ``check_config`` as
``python -m vlmrl.train`` would take them; the preprocess arguments through the preprocess script's own parser.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import shlex
import subprocess
import sys
import tempfile
import types
from collections.abc import Callable
from pathlib import Path

import pytest
from utils import verl_geo3k_launch_line

from vlmrl.config import VLMRLConfig, load, validate_overrides
from vlmrl.config.checks import check_config
from vlmrl.testing.smoke import OVERRIDES

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
ALL_SCRIPTS = sorted(EXAMPLES.glob("*.sh"))
GPU_SCRIPTS = [p for p in ALL_SCRIPTS if not p.name.endswith("_cpu.sh")]
GEO3K_SCRIPTS = [p for p in GPU_SCRIPTS if p.name.startswith("geo3k_")]
GEO3K_MODELS = {
    "geo3k_qwen2_5_vl_3b.sh": ("Qwen/Qwen2.5-VL-3B-Instruct", "qwen2_5_vl_3b_function_rm"),
    "geo3k_qwen2_5_vl_7b.sh": ("Qwen/Qwen2.5-VL-7B-Instruct", "qwen2_5_vl_7b_function_rm"),
    "geo3k_qwen3_vl_8b.sh": ("Qwen/Qwen3-VL-8B-Instruct", "qwen3_vl_8b_function_rm"),
}
"""Each geo3k pipeline's model and run name (everything else is verl's line, the same for all)."""

# environment variables the example scripts read: cleared so the caller's shell cannot change what the tests see
SCRIPT_VARS = (
    "DATA",
    "DATA_JSONL",
    "VAL_JSONL",
    "IMAGE_DIR",
    "IMAGE_FIELD",
    "QUESTION_FIELD",
    "BBOX_FIELD",
    "GEO3K",
    "MODEL",
    "GPUS",
    "NNODES",
    "RAY_ADDRESS",
    "LOGGER",
    "PROJECT",
    "EXPERIMENT",
    "PYTHON",
    "VLMRL_DRY_RUN",
    "SMOKE",
    "OUT",
    "CONFIG",
    "NO_TOOLS",
    "FAMILY",
    "MODEL_SIZE",
    "QUICKSTART_DATA",
)


def verl_geo3k_line(home: Path) -> dict[str, str]:
    """verl's own geo3k launch script (tests/verl_examples/run_qwen2_5_vl-7b.sh) as key -> value, keys without
    ``+``."""
    return as_dict(verl_geo3k_launch_line(home))


# where vlmrl's geo3k scripts deliberately differ from verl's line (None: the key is left out), and why
GEO3K_DIFFERENCES: dict[str, str | None] = {
    # one vLLM engine per GPU (a 3B/7B engine fits one): twice the engines of verl's TP=2, which vlmrl also runs
    "actor_rollout_ref.rollout.tensor_model_parallel_size": None,
    # a speed switch vlmrl has no use for (accepted with a notice on verl's line; not set in vlmrl's own)
    "actor_rollout_ref.model.use_fused_kernels": None,
    # jsonl keeps metrics.jsonl for vlmrl.trainer.tracking's plots
    "trainer.logger": "[console,jsonl,wandb]",
    "trainer.project_name": "vlmrl_grpo_example_geo3k",
}


# ----------------------------------------------------------------------------------------------------- helpers


def script_env(home: Path, **env: str) -> dict[str, str]:
    """The caller's environment less the scripts' variables, with HOME, dry-run mode and ``env`` set."""
    base = {k: v for k, v in os.environ.items() if k not in SCRIPT_VARS}
    return {**base, "HOME": str(home), "PYTHON": "python", "VLMRL_DRY_RUN": "1", **env}


def run_script(script: Path, home: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """``script`` run in dry-run mode (a hang bound, not a speed one: smoke mode's model lookup starts Python, ~15 s
    on a busy machine)."""
    return subprocess.run(
        ["bash", str(script), *args], env=script_env(home, **env), capture_output=True, text=True, timeout=180
    )


def dry_run(script: Path, home: Path, *args: str, **env: str) -> list[list[str]]:
    """The commands ``script`` would run, each as its argument list."""
    proc = run_script(script, home, *args, **env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [shlex.split(line) for line in proc.stdout.splitlines() if line.strip()]


def split_commands(cmds: list[list[str]]) -> tuple[list[str], list[list[str]]]:
    """(the overrides passed to ``python -m vlmrl.train``, the other commands); exactly one train command, last."""
    train = [i for i, c in enumerate(cmds) if c[1:3] == ["-m", "vlmrl.train"]]
    assert len(train) == 1 and train[0] == len(cmds) - 1, cmds
    assert cmds[-1][0] == "python"
    return cmds[-1][3:], cmds[:-1]


def as_dict(overrides: list[str]) -> dict[str, str]:
    """key -> value, the key without Hydra's ``+`` prefix; a key set twice is an error."""
    out: dict[str, str] = {}
    for ov in overrides:
        key, value = ov.split("=", 1)
        key = key.lstrip("+")
        assert key not in out, f"{key} is set twice"
        out[key] = value
    return out


@dataclasses.dataclass
class Launch:
    """One dry run of a script with the default environment and EXTRA appended."""

    home: Path
    overrides: list[str]
    other_commands: list[list[str]]
    cfg: VLMRLConfig


EXTRA = ["trainer.device=cuda", "trainer.val_before_train=True"]


@pytest.fixture(scope="module")
def launches(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Path], Launch]:
    """``launch(script)``: the script's default launch, dry-run and loaded once per module (composing a config takes
    a while on a busy machine); a script whose line does not load fails its own tests only."""
    cache: dict[str, Launch] = {}

    def launch(script: Path) -> Launch:
        if script.name not in cache:
            tmp = tmp_path_factory.mktemp(script.stem)
            (tmp / "refs.jsonl").write_text("")
            home = tmp / "home"
            overrides, other = split_commands(dry_run(script, home, *EXTRA, DATA_JSONL=str(tmp / "refs.jsonl")))
            cache[script.name] = Launch(home, overrides, other, load(overrides))
        return cache[script.name]

    return launch


@pytest.fixture
def jsonl_env(tmp_path: Path) -> dict[str, str]:
    """DATA_JSONL naming a real (empty) file, for the scripts that need one; the others ignore it."""
    f = tmp_path / "refs.jsonl"
    f.write_text("")
    return {"DATA_JSONL": str(f)}


# ------------------------------------------------------------------------------------------------------ syntax


def test_there_are_gpu_examples() -> None:
    names = {p.name for p in GPU_SCRIPTS}
    assert {"geo3k_qwen2_5_vl_3b.sh", "geo3k_qwen2_5_vl_7b.sh", "geo3k_qwen3_vl_8b.sh", "grounding.sh"} <= names, names


@pytest.mark.parametrize("script", ALL_SCRIPTS, ids=lambda p: p.name)
def test_script_is_executable_and_parses(script: Path) -> None:
    assert os.access(script, os.X_OK), f"chmod +x {script.relative_to(REPO)}"
    text = script.read_text()
    assert text.startswith("#!/usr/bin/env bash\n") and "set -euo pipefail" in text
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr


# -------------------------------------------------------------------------------------------------- launch lines


@pytest.mark.parametrize("script", GPU_SCRIPTS, ids=lambda p: p.name)
def test_launch_line_is_accepted_by_the_config_and_check_config(
    script: Path, launches: Callable[[Path], Launch], tmp_path: Path
) -> None:
    run = launches(script)
    assert run.overrides[-len(EXTRA) :] == EXTRA, 'extra arguments must reach vlmrl.train last ("$@")'
    own = as_dict(run.overrides[: -len(EXTRA)])  # no key set twice by the script itself
    validate_overrides(run.overrides)  # every key is in the schema (or an open engine_kwargs dict)
    for cmd in run.other_commands:  # the steps before training are preprocess/ scripts their own parser accepts
        parsed_preprocess(cmd)
    cfg = copy.deepcopy(run.cfg)  # load() passed: every value fits the schema's types and UNSUPPORTED_VALUES
    assert cfg.trainer.val_before_train is True and cfg.trainer.device == "cuda"
    assert own["actor_rollout_ref.rollout.name"] == "vllm" and cfg.actor_rollout_ref.rollout.name == "vllm"
    # the data the preprocess step writes is where training reads it; then the start-up checks pass
    # (divisibility of the batch sizes over nnodes x n_gpus_per_node workers included)
    for f in [cfg.data.train_files, cfg.data.val_files]:
        if f:
            Path(f).parent.mkdir(parents=True, exist_ok=True)
            Path(f).write_bytes(b"PAR1")
    cfg.trainer.default_local_dir = str(tmp_path / "ckpt")
    check_config(cfg)


@pytest.mark.parametrize("script", GEO3K_SCRIPTS, ids=lambda p: p.name)
def test_geo3k_script_mirrors_verls_launch_line(script: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    overrides, _ = split_commands(dry_run(script, home))
    ours = as_dict(overrides)
    verl = verl_geo3k_line(home)
    expected = {**verl, **GEO3K_DIFFERENCES}
    expected["actor_rollout_ref.model.path"], expected["trainer.experiment_name"] = GEO3K_MODELS[script.name]
    expected = {k: v for k, v in expected.items() if v is not None}
    assert ours == expected
    # verl's cache flag is written with the + of older verl scripts (both forms load)
    assert "+actor_rollout_ref.rollout.engine_kwargs.vllm.disable_mm_preprocessor_cache=True" in overrides


@pytest.mark.parametrize("script", GEO3K_SCRIPTS, ids=lambda p: p.name)
def test_geo3k_values_round_trip(script: Path, launches: Callable[[Path], Launch]) -> None:
    run = launches(script)
    home, cfg = run.home, run.cfg
    arr, data, tr = cfg.actor_rollout_ref, cfg.data, cfg.trainer
    assert cfg.algorithm.adv_estimator == "grpo"
    assert (data.train_files, data.val_files) == (f"{home}/data/geo3k/train.parquet", f"{home}/data/geo3k/test.parquet")
    assert (data.train_batch_size, data.max_prompt_length, data.max_response_length) == (512, 1024, 2048)
    assert data.filter_overlong_prompts is True and data.image_key == "images" and data.truncation == "error"
    assert arr.model.path == GEO3K_MODELS[script.name][0]
    assert arr.model.enable_gradient_checkpointing is True
    assert arr.actor.optim.lr == pytest.approx(1e-6)
    assert (arr.actor.ppo_mini_batch_size, arr.actor.ppo_micro_batch_size_per_gpu) == (128, 10)
    assert arr.actor.use_kl_loss is True and arr.actor.kl_loss_coef == pytest.approx(0.01)
    assert arr.actor.kl_loss_type == "low_var_kl" and arr.actor.entropy_coeff == 0.0
    ro = arr.rollout
    assert ro.n == 5 and ro.name == "vllm" and ro.gpu_memory_utilization == pytest.approx(0.6)
    assert ro.tensor_model_parallel_size == 1 and ro.free_cache_engine is True and ro.enforce_eager is False
    assert ro.enable_chunked_prefill is False
    assert ro.log_prob_micro_batch_size_per_gpu == 20 and arr.ref.log_prob_micro_batch_size_per_gpu == 20
    assert ro.engine_kwargs["vllm"] == {"disable_mm_preprocessor_cache": True}
    assert arr.ref.fsdp_config.param_offload is True
    assert tr.logger == ["console", "jsonl", "wandb"] and tr.project_name == "vlmrl_grpo_example_geo3k"
    assert (tr.n_gpus_per_node, tr.nnodes, tr.save_freq, tr.test_freq, tr.total_epochs) == (8, 1, 20, 5, 15)
    assert tr.ray_address is None
    # no reward key: the records' data_source (hiyouga/geometry3k) selects the built-in geo3k reward
    assert cfg.reward.function is None and cfg.custom_reward_function.path is None


@pytest.mark.parametrize("old_vllm", [True, False], ids=["disable_mm_preprocessor_cache", "mm_processor_cache_gb"])
def test_cache_flag_is_translated_for_the_installed_vllm(
    old_vllm: bool, launches: Callable[[Path], Launch], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scripts' ``disable_mm_preprocessor_cache=True`` reaches vLLM as the argument the installed version has."""
    from vlmrl.rollout.vllm import translate_engine_kwargs

    name = "disable_mm_preprocessor_cache" if old_vllm else "mm_processor_cache_gb"
    fake = types.ModuleType("vllm")
    fake.EngineArgs = dataclasses.make_dataclass("EngineArgs", [("model", str, ""), (name, int, 4)])  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", fake)
    for script in GPU_SCRIPTS:
        out = translate_engine_kwargs(dict(launches(script).cfg.actor_rollout_ref.rollout.engine_kwargs["vllm"]))
        assert out == ({name: True} if old_vllm else {name: 0}), (script.name, out)


# --------------------------------------------------------------------------------------------- environment knobs


@pytest.mark.parametrize("script", GPU_SCRIPTS, ids=lambda p: p.name)
def test_environment_knobs_and_multi_node(script: Path, tmp_path: Path, jsonl_env: dict[str, str]) -> None:
    env = {**jsonl_env, "MODEL": "/models/qwen-vl", "GPUS": "4", "NNODES": "2", "LOGGER": "[console]"}
    cfg = load(split_commands(dry_run(script, tmp_path / "home", **env))[0])
    tr = cfg.trainer
    assert cfg.actor_rollout_ref.model.path == "/models/qwen-vl"
    assert (tr.n_gpus_per_node, tr.nnodes, tr.logger) == (4, 2, ["console"])
    assert tr.ray_address == "auto", "a multi-node launch must join the running Ray cluster"
    env = {**jsonl_env, "RAY_ADDRESS": "10.0.0.1:6379", "PROJECT": "p", "EXPERIMENT": "e"}
    ours = as_dict(split_commands(dry_run(script, tmp_path / "home", **env))[0])
    assert ours["trainer.ray_address"] == "10.0.0.1:6379" and ours["trainer.nnodes"] == "1"
    assert (ours["trainer.project_name"], ours["trainer.experiment_name"]) == ("p", "e")


# ---------------------------------------------------------------------------------------------------- preprocess


def parsed_preprocess(cmd: list[str]):
    """The namespace the preprocess script's own parser makes of ``cmd`` (``python preprocess/NAME.py ...``)."""
    import importlib

    assert cmd[0] == "python" and cmd[1].startswith("preprocess/") and (REPO / cmd[1]).is_file(), cmd
    module = importlib.import_module("vlmrl.preprocess." + Path(cmd[1]).stem)
    return Path(cmd[1]).stem, module.parse_args(cmd[2:])


@pytest.mark.parametrize("script", GEO3K_SCRIPTS, ids=lambda p: p.name)
def test_geo3k_preprocesses_unless_the_parquet_exists(script: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    _, pre = split_commands(dry_run(script, home))
    assert len(pre) == 1
    name, args = parsed_preprocess(pre[0])
    assert name == "geo3k" and args.input == "hiyouga/geometry3k" and args.output_dir == str(home / "data/geo3k")
    assert args.splits == "train,test"  # the two files the launch line reads
    data = tmp_path / "geo"
    _, pre = split_commands(dry_run(script, home, DATA=str(data), GEO3K="/copies/geometry3k"))
    assert parsed_preprocess(pre[0])[1].input == "/copies/geometry3k"
    data.mkdir()
    (data / "train.parquet").write_bytes(b"PAR1")
    assert len(split_commands(dry_run(script, home, DATA=str(data)))[1]) == 1, "test.parquet is still missing"
    (data / "test.parquet").write_bytes(b"PAR1")
    overrides, pre = split_commands(dry_run(script, home, DATA=str(data)))
    assert pre == [] and f"data.train_files={data}/train.parquet" in overrides


def test_grounding_line_format_preprocess_and_reward_fit_together(tmp_path: Path) -> None:
    """The documented JSONL line → the printed preprocess command (run for real) → a record the configured
    ``grounding`` reward scores: a right box in the asked-for format earns 1, the same box without it 0."""
    from PIL import Image

    from vlmrl.batch import RewardSample
    from vlmrl.preprocess import jsonl
    from vlmrl.scoring.composite import build_scorer, make_spec

    (tmp_path / "images").mkdir()
    Image.new("RGB", (64, 48), (200, 30, 30)).save(tmp_path / "images" / "0001.png")
    header = (EXAMPLES / "grounding.sh").read_text()
    line = '{"image": "images/0001.png", "question": "Where is the red mug?", "bbox": [4, 6, 40, 30]}'
    assert '"image": "images/0001.jpg", "question": ' in header and '"bbox": [' in header  # the documented format
    refs = tmp_path / "refs.jsonl"
    refs.write_text(line + "\n")
    home = tmp_path / "home"
    cmds = dry_run(EXAMPLES / "grounding.sh", home, DATA_JSONL=str(refs), VAL_JSONL=str(refs))
    overrides, pre = split_commands(cmds)
    assert [parsed_preprocess(c)[1].split for c in pre] == ["train", "test"]
    for c in pre:
        jsonl.main([*c[2:], "--no-progress"])
    data = home / "data/grounding/refs"
    cfg = load(overrides)
    assert cfg.data.train_files == f"{data}/train.parquet" and cfg.data.val_files == f"{data}/test.parquet"
    assert cfg.reward.function == "grounding"
    assert cfg.actor_rollout_ref.model.path == "Qwen/Qwen2.5-VL-3B-Instruct" and cfg.trainer.n_gpus_per_node == 8
    ro, actor = cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.actor
    assert ro.n >= 2 and ro.engine_kwargs["vllm"] == {"disable_mm_preprocessor_cache": True}
    assert actor.use_kl_loss is True and actor.kl_loss_type == "low_var_kl"

    import pyarrow.parquet as pq

    (row,) = pq.read_table(data / "train.parquet").to_pylist()
    prompt = row["prompt"][0]["content"]
    assert prompt.startswith("<image>Where is the red mug?") and "<answer>" in prompt and "[x1, y1, x2, y2]" in prompt
    assert row["extra_info"]["boxes"] == [[4.0, 6.0, 40.0, 30.0]]
    scorer = build_scorer(make_spec(cfg.reward, cfg.custom_reward_function))

    def score(response: str) -> float:
        sample = RewardSample(
            response=response,
            prompt=prompt,
            ground_truth=row["reward_model"]["ground_truth"],
            data_source=row["data_source"],
            extra_info=row["extra_info"],
            image_scales=[(1.0, 1.0)],
        )
        return scorer(sample)["score"]

    assert score("<think>top left, red</think><answer>[4, 6, 40, 30]</answer>") == pytest.approx(1.0)
    assert score("[4, 6, 40, 30]") == pytest.approx(0.0)


def test_grounding_rebuilds_the_parquet_only_when_the_jsonl_is_newer(tmp_path: Path) -> None:
    refs = tmp_path / "refs.jsonl"
    refs.write_text("")
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.parquet").write_bytes(b"PAR1")
    os.utime(refs, (1_000_000, 1_000_000))  # older than the parquet
    run = lambda: split_commands(dry_run(EXAMPLES / "grounding.sh", tmp_path, DATA_JSONL=str(refs), DATA=str(data)))
    overrides, pre = run()
    assert pre == [] and f"data.train_files={data}/train.parquet" in overrides
    assert not any(o.startswith("data.val_files=") for o in overrides), "no VAL_JSONL: no validation set"
    os.utime(refs)  # now newer
    assert len(run()[1]) == 1


def test_grounding_without_data_jsonl_fails_naming_it(tmp_path: Path) -> None:
    env = script_env(tmp_path)
    del env["VLMRL_DRY_RUN"]  # a real run: it must stop before anything starts
    proc = subprocess.run(["bash", str(EXAMPLES / "grounding.sh")], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0
    assert "DATA_JSONL" in proc.stderr and "bbox" in proc.stderr and proc.stdout == ""
    proc = run_script(EXAMPLES / "grounding.sh", tmp_path, DATA_JSONL=str(tmp_path / "nope.jsonl"))
    assert proc.returncode != 0 and "nope.jsonl: no such file" in proc.stderr and proc.stdout == ""


# ---------------------------------------------------------------------------------------------------- smoke mode


FULL_RUNS = {
    "quickstart_cpu.sh": "tests/test_train_e2e.py::test_the_quick_start_script_learns_as_the_readme_says",
    "ppo_cpu.sh": "tests/test_ppo_train.py::test_the_ppo_example_learns_the_quick_start_task",
    "length_aware_cpu.sh": "tests/test_algorithm_class.py::test_length_aware_example_moves_lengths_into_its_window",
    "reward_model_cpu.sh": (
        "tests/test_reward_model_train.py::test_grpo_on_a_learned_reward_alone_learns_the_colour_task"
    ),
    "real_images_cpu.sh": "tests/test_real_images.py::test_grpo_raises_the_held_out_accuracy_over_the_warm_start",
}
"""CPU pipelines a test runs whole, as the README's figures were made (``bash examples/<script>``: the model, the
data, the training and the report), in the slow tier; the quick start's smoke mode is also the contributor tier's
one end-to-end run (``test_the_quick_start_runs_end_to_end_in_smoke_mode``; three of the others run its commands)."""
SAME_AS_3B = ("geo3k_qwen2_5_vl_7b.sh", "geo3k_qwen3_vl_8b.sh")
"""geo3k pipelines whose smoke-mode commands are the 3B script's but for the model (the tiny one of the model's
family) and the run name (``test_the_7b_smoke_run_is_the_3b_pipeline``,
``test_the_qwen3_vl_pipeline_is_the_3b_one_with_qwen3_vl``); the tiny Qwen3-VL trains in tests/test_train_e2e.py and
under verl's Qwen3-VL script in tests/test_verl_scripts.py."""
SMOKE_SCRIPTS = [p for p in ALL_SCRIPTS if p.name not in FULL_RUNS and p.name not in SAME_AS_3B]


def test_every_pipeline_runs_in_a_test() -> None:
    """Each script in examples/ runs end to end in a test: in smoke mode here, or whole in the test FULL_RUNS names
    (which exists and launches that script)."""
    assert {p.name for p in SMOKE_SCRIPTS} | set(FULL_RUNS) | set(SAME_AS_3B) == {p.name for p in ALL_SCRIPTS}
    assert {p.stem for p in SMOKE_SCRIPTS} == {"geo3k_qwen2_5_vl_3b", "grounding", "tool_zoom_cpu"}
    import ast

    for script, test in FULL_RUNS.items():
        path, name = test.split("::")
        src = (REPO / path).read_text()
        (func,) = [n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == name]
        assert f'"{script}"' in ast.get_source_segment(src, func), (script, test)  # it launches the script itself


def test_the_7b_smoke_run_is_the_3b_pipeline(tmp_path: Path) -> None:
    import sys

    env = dict(SMOKE="1", DATA=str(tmp_path / "data"), OUT=str(tmp_path / "run"), PYTHON=sys.executable)
    three = dry_run(EXAMPLES / "geo3k_qwen2_5_vl_3b.sh", tmp_path / "home", **env)
    seven = dry_run(EXAMPLES / "geo3k_qwen2_5_vl_7b.sh", tmp_path / "home", **env)
    assert len(three) == 2 and "trainer.experiment_name=qwen2_5_vl_7b_function_rm" in seven[-1]
    assert seven == [[a.replace("qwen2_5_vl_3b_", "qwen2_5_vl_7b_") for a in cmd] for cmd in three]


def test_the_qwen3_vl_pipeline_is_the_3b_one_with_qwen3_vl(tmp_path: Path) -> None:
    """examples/geo3k_qwen3_vl_8b.sh: the 3B pipeline with Qwen3-VL-8B and its run name; in smoke mode it trains the
    tiny Qwen3-VL (FAMILY=qwen3_vl) where the 3B one trains the tiny Qwen2.5-VL."""
    import sys

    env = dict(SMOKE="1", DATA=str(tmp_path / "data"), OUT=str(tmp_path / "run"), PYTHON=sys.executable)
    three = dry_run(EXAMPLES / "geo3k_qwen2_5_vl_3b.sh", tmp_path / "home", **env)
    eight = dry_run(EXAMPLES / "geo3k_qwen3_vl_8b.sh", tmp_path / "home", **env)
    path = [a for a in eight[-1] if a.startswith("actor_rollout_ref.model.path=")]
    assert len(path) == 1 and "/tiny-qwen3vl-" in path[0], path
    assert (
        [a for a in three[-1] if a.startswith("actor_rollout_ref.model.path=")][0]
        .split("/")[-1]
        .startswith("tiny-qwen25vl-")
    )
    assert "trainer.experiment_name=qwen3_vl_8b_function_rm" in eight[-1]


def test_the_quick_start_runs_end_to_end_in_smoke_mode(tmp_path: Path) -> None:
    """``SMOKE=1 bash examples/quickstart_cpu.sh`` (the contributor tier's one end-to-end run, tests/
    test_suite_tiers.py): the tiny model, the data, 2 GRPO steps on 2 worker processes with the vLLM rollout and
    validation before and after, the start-up's stages printed and logged, the health line, the reward curve and the
    report; a run with multi-turn off logs no multi_turn metrics and its gallery shows no tools."""
    from runs import metrics, run_example

    out = tmp_path / "run"
    log = run_example("quickstart_cpu.sh", out, SMOKE="1")
    rows = metrics(out)
    assert [r["step"] for r in rows] == [0, 1, 2], rows
    assert "val/reward/mean" in rows[0] and "val/reward/mean" in rows[2] and "actor/entropy" in rows[1]
    assert "[vlmrl] start-up: " in log and rows[1]["timing/startup_s"] > 0 and "timing/startup_s" not in rows[2]
    assert all(0 < r["timing/push_gather_s"] < r["timing/push_s"] for r in rows[1:])  # the push's own part
    assert "2 hybrid worker(s) on cpu" in log and "2 vLLM engine(s)" in log and "[vlmrl] health:" in log
    assert (out / "reward_curve.png").is_file() and (out / "report.html").is_file()
    assert not any(k.startswith("multi_turn/") for r in rows for k in r)
    gallery = sorted((out / "val_gallery").glob("step_*.html"))[-1].read_text()
    assert "# Tools" not in gallery and "<div class='turn" not in gallery


def test_the_quick_start_refuses_a_data_folder_without_its_parquet_files(tmp_path: Path) -> None:
    """``QUICKSTART_DATA`` names a folder an earlier run drew; one without ``test.parquet`` stops the script before
    training (exit status 2), naming the folder and the file (docs/quickstart.md)."""
    import sys

    data = tmp_path / "data"
    data.mkdir()
    (data / "train.parquet").write_bytes(b"")
    env = script_env(
        tmp_path / "home",
        QUICKSTART_DATA=str(data),
        OUT=str(tmp_path / "run"),
        VLMRL_VENV=str(Path(sys.executable).parents[1]),
    )
    proc = subprocess.run(
        ["bash", str(EXAMPLES / "quickstart_cpu.sh")], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"QUICKSTART_DATA={data} holds no test.parquet" in proc.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.slow
@pytest.mark.parametrize("script", SMOKE_SCRIPTS, ids=lambda p: p.name)
def test_pipeline_runs_end_to_end_in_smoke_mode(script: Path, tmp_path: Path) -> None:
    """``SMOKE=1 bash examples/<script>``: the pipeline's own preprocess step on its stand-in data, then 2 training
    steps with validation before and after, the checkpoint and the metrics; the flags the GPU run sets reach the run
    unchanged (read back from the checkpoint's resolved config)."""
    import sys

    import yaml

    run_dir = tmp_path / "run"
    env = script_env(
        tmp_path / "home",
        SMOKE="1",
        DATA=str(tmp_path / "data"),
        OUT=str(run_dir),
        PYTHON=sys.executable,
        RAY_TMPDIR=tempfile.mkdtemp(prefix="vr", dir="/tmp"),
    )
    del env["VLMRL_DRY_RUN"]
    args = [] if script.name == "tool_zoom_cpu.sh" else [f"trainer.default_local_dir={run_dir}"]
    proc = subprocess.run(["bash", str(script), *args], env=env, capture_output=True, text=True, timeout=900)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-5000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2], rows
    assert "val/reward/mean" in rows[0] and "val/reward/mean" in rows[2] and "actor/entropy" in rows[1]
    assert (run_dir / "reward_curve.png").is_file() and list((run_dir / "val_gallery").glob("step_*.html"))
    if script.name == "tool_zoom_cpu.sh":  # model, data, warm start, multi-turn GRPO, the report
        assert "[warm_start] step 5/5" in log and (run_dir / "warm_start" / "model.safetensors").is_file()
        assert all("multi_turn/tool_calls/mean" in r and "multi_turn/called_share" in r for r in rows[1:])
        gallery = sorted((run_dir / "val_gallery").glob("step_*.html"))[-1].read_text()
        assert "<div class='turn assistant'>" in gallery  # shown turn by turn
        assert (run_dir / "report.html").is_file() and "[vlmrl] health:" in log
        return
    ckpt = run_dir / "global_step_2"
    assert (ckpt / "actor" / ".metadata").is_file()
    cfg = yaml.safe_load((ckpt / "config.yaml").read_text())
    arr, tr = cfg["actor_rollout_ref"], cfg["trainer"]
    assert tr["device"] == "cpu" and tr["cpu_workers"] == 2 and tr["total_training_steps"] == 2
    # the GPU run's flags, untouched by smoke mode
    assert arr["model"]["enable_gradient_checkpointing"] is True
    assert arr["actor"]["use_kl_loss"] is True and arr["actor"]["kl_loss_type"] == "low_var_kl"
    assert arr["ref"]["fsdp_config"]["param_offload"] is True
    assert arr["rollout"]["free_cache_engine"] is True  # (enforce_eager: smoke mode's, vlmrl.testing.smoke)
    assert arr["rollout"]["enforce_eager"] is True and "actor_rollout_ref.rollout.enforce_eager=True" in OVERRIDES
    assert arr["rollout"]["engine_kwargs"]["vllm"] == {"disable_mm_preprocessor_cache": True}
    assert tr["logger"] == ["console", "jsonl", "wandb"] and list((run_dir / "wandb").glob("offline-run-*"))
    assert tr["val_before_train"] is True and tr["save_freq"] > 2  # the last step's checkpoint, not a periodic one


def test_no_tools_is_the_tool_zoom_pipeline_with_multi_turn_off(tmp_path: Path) -> None:
    """``NO_TOOLS=1 bash examples/tool_zoom_cpu.sh`` (the README's policy that never zooms, for comparison): the same
    data, warm start, reward curve and report commands, and the same training command with the tool off
    (``actor_rollout_ref.rollout.multi_turn.enable=false``); that a run with multi-turn off logs no multi_turn metrics
    and shows no tools is asserted on the quick start's smoke run (``test_the_quick_start_runs_end_to_end_in_smoke_
    mode``)."""
    env = dict(SMOKE="1", OUT=str(tmp_path / "run"), VLMRL_VENV=str(Path(sys.executable).parents[1]))
    with_tool = dry_run(EXAMPLES / "tool_zoom_cpu.sh", tmp_path / "home", **env)
    without = dry_run(EXAMPLES / "tool_zoom_cpu.sh", tmp_path / "home", NO_TOOLS="1", **env)
    train = [i for i, c in enumerate(with_tool) if c[1:3] == ["-m", "vlmrl.train"]]
    assert len(with_tool) == len(without) == 5 and train == [2], with_tool
    off = "actor_rollout_ref.rollout.multi_turn.enable=false"
    assert off not in with_tool[2] and [a for a in without[2] if a != off] == with_tool[2]
    assert [c for i, c in enumerate(without) if i != 2] == [c for i, c in enumerate(with_tool) if i != 2]
    assert load(with_tool[2][5:], config_name="tool_zoom_cpu").actor_rollout_ref.rollout.multi_turn.enable
    assert not load(without[2][5:], config_name="tool_zoom_cpu").actor_rollout_ref.rollout.multi_turn.enable
