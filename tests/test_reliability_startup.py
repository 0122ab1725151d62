"""A run that cannot start says so in one line and exits 2; a config file cannot set Hydra's own options.

Every case runs the command line as a user does (``python -m vlmrl.train ...``, or ``python -m vlmrl.run_verl``):

* start-up failures the user can fix (a model folder whose weights do not load, an engine that does not start, a tool
  file that does not import, Ray without authentication, a placement Ray cannot reserve) print exactly one line on
  stderr, ``vlmrl: ...`` naming what failed and the cause, no traceback, exit status 2; the tracebacks (the driver's
  and the failing worker's) are in the log file the line names;
* a failure once training runs still stops it with ``vlmrl: run stopped at step N`` (exit 1);
* verl's ``python3 -u -m verl.trainer.main_ppo`` (interpreter options before ``-m``) starts vlmrl's trainer;
* a ``--config-name`` file is settings: a key of it that would reach Hydra's own config (``hydra.callbacks``
  instantiates classes) is refused before Hydra starts, and nothing it names runs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from utils import synthetic_data

REPO = Path(__file__).resolve().parents[1]

SMALL_RUN = (
    "data.val_files=null",
    "actor_rollout_ref.rollout.name=hf",
    "data.train_batch_size=4",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "data.max_response_length=4",
    "trainer.logger=[jsonl]",
    "trainer.total_training_steps=1",
    "trainer.val_before_train=false",
    "trainer.cpu_workers=1",
)
"""One step of 4 prompts on one CPU worker, HF rollout: what a start-up test needs of a run."""


def clean_env(**extra: str) -> dict[str, str]:
    """The test's environment for a launch: this checkout first on the path, no Ray cluster or token inherited."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH") and k != "RAY_ADDRESS"}
    env.update(PYTHONPATH=str(REPO), **extra)
    return env


def launch(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 600) -> Any:
    """``python -m vlmrl.train *args`` as a user runs it; the ``subprocess.CompletedProcess``."""
    return subprocess.run(
        [sys.executable, "-m", "vlmrl.train", *args],
        cwd=cwd,
        env=env or clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def small_run(data: Path, model: str | Path, out: Path, *extra: str) -> list[str]:
    """The arguments of a one-step run of ``model`` on ``data`` into ``out`` (see ``SMALL_RUN``), then ``extra``."""
    return [
        "--config-name",
        "tiny_cpu",
        f"data.train_files={data}",
        f"actor_rollout_ref.model.path={model}",
        f"trainer.default_local_dir={out}",
        *SMALL_RUN,
        *extra,
    ]


def the_line(proc: subprocess.CompletedProcess, others_allowed: bool = False) -> str:
    """The run's one ``vlmrl:`` line on stderr (exit status 2, no traceback). ``others_allowed``: lines that a
    library prints while it imports (vLLM's, in a worker) may come before it."""
    out = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode == 2, out
    assert "Traceback" not in proc.stderr and "Error executing job" not in proc.stderr, out
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    ours = [line for line in lines if line.startswith("vlmrl:")]
    assert len(ours) == 1 and lines[-1] == ours[0], out
    if not others_allowed:
        assert lines == ours, out
    return ours[0]


def the_log(line: str) -> str:
    """The text of the log file the line names (``(traceback: PATH)`` at its end); it holds a traceback."""
    m = re.search(r"\(traceback: (.+)\)$", line)
    assert m, line
    log = Path(m.group(1))
    assert log.is_file(), line
    text = log.read_text()
    assert "Traceback (most recent call last)" in text, text[-2000:]
    return text


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthetic_data(tmp_path_factory.mktemp("synth"), train=8) / "train.parquet"


# ------------------------------------------------------------------------------------------- start-up failures


@pytest.mark.slow  # a worker process's or an inline worker's start, ~15 s
@pytest.mark.parametrize(
    "launcher,weights",
    [("local", b""), ("inline", b"\x10\x00\x00\x00\x00\x00\x00\x00{garbage")],
    ids=["empty", "corrupt"],
)
def test_a_model_whose_weights_do_not_load_is_one_line_naming_the_model_and_the_cause(
    launcher: str, weights: bytes, tiny_model_dir: str, data: Path, tmp_path: Path
) -> None:
    """An empty or corrupt model.safetensors beside a valid config and tokenizer: the driver reads the processor, the
    worker fails loading the weights (in its own process with ``local``, in the driver's with ``inline``)."""
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    (model / "model.safetensors").write_bytes(weights)
    out = tmp_path / "run"
    proc = launch(*small_run(data, model, out, f"trainer.launcher={launcher}"), cwd=tmp_path)
    line = the_line(proc)
    assert line.startswith(f"vlmrl: start-up failed: worker 0 could not load the model from {model}: "), line
    assert "SafetensorError" in line and "check actor_rollout_ref.model.path" in line, line
    assert line.endswith(f"(traceback: {out / 'startup_error.log'})"), line
    log = the_log(line)
    assert "The worker's traceback:" in log and "safe_open" in log and "vlmrl/workers/policy.py" in log, log[-3000:]


def test_an_inline_worker_that_fails_to_start_leaves_nothing_started_in_the_driver(
    tiny_model_dir: str, data: Path, tmp_path: Path
) -> None:
    """``trainer.launcher=inline`` in a driver that goes on (a notebook, a test): a worker that fails after joining
    the process group (corrupt weights) releases it, so the next run in this process starts from nothing."""
    import torch.distributed as dist
    from utils import inline_cfg

    from vlmrl.startup import StartupError
    from vlmrl.trainer.grpo import fit

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    (model / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{garbage")
    cfg = inline_cfg(str(model), data.parent, tmp_path / "run", "trainer.total_training_steps=1")
    with pytest.raises(StartupError, match="could not load the model"):
        fit(cfg)
    assert not dist.is_initialized()


@pytest.mark.slow  # a worker process and its vLLM engine's start, ~20 s
def test_an_engine_that_does_not_start_is_one_line_naming_the_engine_and_the_cause(
    tiny_model_dir: str, data: Path, tmp_path: Path
) -> None:
    """vLLM refuses a max_model_len above the model's 4096 positions when its engine starts in the worker."""
    out = tmp_path / "run"
    engine = ("actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.max_model_len=1000000")
    proc = launch(*small_run(data, tiny_model_dir, out, *engine), cwd=tmp_path)
    line = the_line(proc, others_allowed=True)  # vLLM's import in the worker prints torch's deprecation warnings
    assert line.startswith(f"vlmrl: start-up failed: worker 0 could not start the vLLM engine for {tiny_model_dir}: ")
    assert "max_model_len (1000000) is greater than" in line, line
    assert "or use actor_rollout_ref.rollout.name=hf" in line, line
    assert "vlmrl/rollout/vllm.py" in the_log(line)


TOOL_CONFIG = """
tools:
  - class_name: "{file}:Broken"
    config: {{type: native}}
    tool_schema: {{type: function, function: {{name: broken, description: a tool, parameters: {{type: object,
                   properties: {{}}}}}}}}
"""


@pytest.mark.slow  # a launch that starts its worker, ~13 s
def test_a_tool_file_that_does_not_import_is_one_line_naming_the_error_and_its_line(
    tiny_model_dir: str, data: Path, tmp_path: Path
) -> None:
    tools = tmp_path / "tools.py"
    tools.write_text("from vlmrl.tools.base import BaseTool\n\nclass Broken(BaseTool:\n    pass\n")
    config = tmp_path / "tools.yaml"
    config.write_text(TOOL_CONFIG.format(file=tools))
    out = tmp_path / "run"
    mt = (
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        "data.max_prompt_length=512",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={config}",
    )
    proc = launch(*small_run(data, tiny_model_dir, out, "trainer.launcher=inline", *mt), cwd=tmp_path)
    line = the_line(proc)
    assert "SyntaxError" in line and "(tools.py, line 3)" in line and str(config) in line, line
    assert "class Broken(BaseTool:" in the_log(line)  # a start-up failure (the config check does not import tools)


def test_ray_without_authentication_is_refused_in_one_line(tiny_model_dir: str, data: Path, tmp_path: Path) -> None:
    """``RAY_AUTH_MODE=disabled`` with a cluster address: refused when the config is checked, before anything starts
    or Ray is reached (nothing listens there), as a configuration of the machine (config error, exit 2)."""
    out = tmp_path / "run"
    proc = launch(
        *small_run(data, tiny_model_dir, out, "trainer.ray_address=127.0.0.1:1"),
        cwd=tmp_path,
        env=clean_env(RAY_AUTH_MODE="disabled"),
    )
    line = the_line(proc)
    assert line.startswith(
        "vlmrl: config error: RAY_AUTH_MODE=disabled: vlmrl does not run Ray without authentication"
    ), line
    assert "Unset it" in line
    assert not out.exists()  # nothing started


@pytest.mark.slow  # starts a Ray cluster, ~20 s
def test_a_placement_ray_cannot_reserve_is_refused_in_one_line(tiny_model_dir: str, data: Path, tmp_path: Path) -> None:
    """A GPU worker asked of the private Ray cluster of a machine without GPUs: refused at once (a cluster started
    here does not grow), naming what was asked and what the cluster has."""
    out = tmp_path / "run"
    ray = ("trainer.launcher=ray", "trainer.device=cuda", "trainer.n_gpus_per_node=1")
    ray_tmp = tempfile.mkdtemp(prefix="vs", dir="/tmp")  # short: Ray's socket paths have a length limit
    try:
        env = clean_env(CUDA_VISIBLE_DEVICES="", RAY_TMPDIR=ray_tmp)
        proc = launch(*small_run(data, tiny_model_dir, out, *ray), cwd=tmp_path, env=env, timeout=300)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    line = the_line(proc, others_allowed=True)  # Ray may warn about the machine (shared memory) while it starts
    assert "could not reserve 1 node(s) x 1 worker slot(s) of {'CPU': 1, 'GPU': 1} in the Ray cluster" in line, line
    assert "+ 0 GPU)" in line and "use trainer.device=cpu" in line, line
    assert "_start" in the_log(line)


FAILING_REWARD = """
def boom(data_source, solution_str, ground_truth, extra_info=None):
    raise ValueError("boom")
"""


@pytest.mark.slow  # trains up to its first step
def test_a_failure_while_training_still_stops_the_run_naming_the_step(
    tiny_model_dir: str, data: Path, tmp_path: Path
) -> None:
    """Not a start-up failure: a reward that always raises stops the run at step 1, exit 1, as before."""
    reward = tmp_path / "boom.py"
    reward.write_text(FAILING_REWARD)
    out = tmp_path / "run"
    fn = (f"custom_reward_function.path={reward}", "custom_reward_function.name=boom")
    proc = launch(*small_run(data, tiny_model_dir, out, "trainer.launcher=inline", *fn), cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "vlmrl: run stopped at step 1: " in proc.stderr and "start-up failed" not in proc.stderr
    assert not (out / "startup_error.log").exists()


# ------------------------------------------------------------------------------------------------- run_verl


SHIM_CASES = [
    (["-m", "verl.trainer.main_ppo", "a=1", "b c"], ["-m", "vlmrl.train", "a=1", "b c"]),
    (["-u", "-m", "verl.trainer.main_ppo", "a=1"], ["-u", "-m", "vlmrl.train", "a=1"]),
    (
        ["-u", "-B", "-X", "dev", "-W", "ignore", "-m", "verl.trainer.main_ppo", "x"],
        ["-u", "-B", "-X", "dev", "-W", "ignore", "-m", "vlmrl.train", "x"],
    ),
    (["-uB", "-mverl.trainer.main_ppo", "", "*"], ["-uB", "-m", "vlmrl.train", "", "*"]),
    (["-u", "-m", "other.module", "x"], ["-u", "-m", "other.module", "x"]),
    (["-c", "print(1)", "-m", "verl.trainer.main_ppo"], ["-c", "print(1)", "-m", "verl.trainer.main_ppo"]),
    (["script.py", "-m", "verl.trainer.main_ppo"], ["script.py", "-m", "verl.trainer.main_ppo"]),
]


@pytest.mark.parametrize(
    "args,expected", SHIM_CASES, ids=["plain", "-u", "options", "attached", "other-module", "-c", "script"]
)
def test_the_python_shim_hands_verls_trainer_to_vlmrl_keeping_interpreter_options(
    args: list[str], expected: list[str], tmp_path: Path
) -> None:
    """The shim's arguments to the real interpreter (a stand-in that prints them, one per line)."""
    from vlmrl.config.verl.scripts import write_shims

    fake = tmp_path / "python-real"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do printf "<%s>\\n" "$a"; done\n')
    fake.chmod(0o755)
    shims = write_shims(tmp_path / "bin", python=str(fake))
    for name in ("python3", "python"):
        got = subprocess.run([str(shims / name), *args], capture_output=True, text=True, timeout=30, check=True)
        assert re.findall(r"^<(.*)>$", got.stdout, re.M) == expected


@pytest.mark.slow  # two interpreters and a dry run, ~12 s
def test_run_verl_runs_a_script_that_starts_verl_unbuffered(tiny_model_dir: str, data: Path, tmp_path: Path) -> None:
    """verl's scripts write ``python3 -u -m verl.trainer.main_ppo`` too (unbuffered output): it is vlmrl's trainer
    that starts, here for a dry run."""
    script = tmp_path / "run_unbuffered.sh"
    script.write_text(
        "set -x\n"
        f"python3 -u -m verl.trainer.main_ppo data.train_files={data} data.val_files=null "
        f'actor_rollout_ref.model.path={tiny_model_dir} trainer.dry_run=True "$@"\n'
    )
    proc = subprocess.run(
        [sys.executable, "-m", "vlmrl.run_verl", str(script), *SMALL_RUN],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, out
    assert "[vlmrl dry run] OK: the run would start" in proc.stdout, out
    assert "No module named" not in proc.stderr, out


# ----------------------------------------------------------------------------------------- config files


MARKER = "callback_ran"


def callback(marker: Path) -> dict:
    """A Hydra callback that writes a file: proof that the config's class was instantiated (it runs code)."""
    return {"_target_": "shutil.copyfile", "_args_": [os.devnull, str(marker)]}


def verl_file(kind: str, marker: Path) -> dict:
    """A verl config file built on ppo_trainer that tries, by ``kind``, to set Hydra's own config."""
    doc: dict = {"defaults": ["ppo_trainer", "_self_"], "data": {"max_prompt_length": 256}}
    cb = callback(marker)
    if kind == "+hydra":
        doc["+hydra"] = {"callbacks": {"cb": cb}}
    elif kind == "+hydra.callbacks.cb":
        doc["+hydra.callbacks.cb"] = cb
    elif kind == "hydra.callbacks":
        doc["hydra"] = {"searchpath": ["file://verl/trainer/config"], "callbacks": {"cb": cb}}
    elif kind == "++hydra.job.env_set.X":
        doc["++hydra.job.env_set.X"] = "1"
    elif kind == "defaults: override hydra/job_logging":
        doc["defaults"] = ["ppo_trainer", {"override hydra/job_logging": "disabled"}, "_self_"]
    elif kind == "data.+x":
        doc["data"] = {"+x": 1}
    return doc


@pytest.mark.parametrize(
    "kind",
    [
        "+hydra",
        "+hydra.callbacks.cb",
        "hydra.callbacks",
        "++hydra.job.env_set.X",
        "defaults: override hydra/job_logging",
        "data.+x",
    ],
)
def test_a_verl_config_file_cannot_set_hydras_own_config(kind: str, tmp_path: Path) -> None:
    import yaml

    folder = tmp_path / "config"
    folder.mkdir()
    marker = tmp_path / MARKER
    (folder / "mine.yaml").write_text(yaml.safe_dump(verl_file(kind, marker)))
    proc = launch(
        f"--config-path={folder}",
        "--config-name=mine",
        "data.train_files=x",
        "actor_rollout_ref.model.path=m",
        cwd=tmp_path,
        timeout=120,
    )
    assert not marker.exists(), "the file's Hydra callback ran"
    line = the_line(proc)
    key = kind.split(": ", 1)[-1]
    assert line.startswith(f"vlmrl: config error: --config-name=mine ({folder / 'mine.yaml'}): "), line
    assert f"'{key}'" in line or f"'{key.split('.')[0]}'" in line, line
    assert (
        "would set Hydra's own config" in line
        or "names Hydra's own config" in line
        or "is not a setting's name" in line
    ), line


def test_verls_own_hydra_searchpath_is_still_ignored(tmp_path: Path) -> None:
    """verl's files point Hydra at verl's configs (``hydra: {searchpath: ...}``): vlmrl's grpo config stands for
    them, so the key is dropped and the rest of the file read."""
    import yaml

    folder = tmp_path / "config"
    folder.mkdir()
    doc = {
        "hydra": {"searchpath": ["file://verl/trainer/config"]},
        "defaults": ["ppo_trainer", "_self_"],
        "data": {"max_prompt_length": 256},
    }
    (folder / "mine.yaml").write_text(yaml.safe_dump(doc))
    proc = launch(
        f"--config-path={folder}",
        "--config-name=mine",
        "data.train_files=x",
        "actor_rollout_ref.model.path=m",
        "--cfg",
        "job",
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "read as 1 override(s)" in proc.stderr, proc.stderr[-3000:]
    assert "its hydra.searchpath points Hydra at verl's own configs" in proc.stderr, proc.stderr[-3000:]
    assert "Hydra's own config" not in proc.stdout + proc.stderr
    assert yaml.safe_load(proc.stdout)["data"]["max_prompt_length"] == 256  # the rest of the file was read


def test_hydras_own_config_on_the_command_line_is_refused_and_runs_nothing(tmp_path: Path) -> None:
    """``+hydra.callbacks...`` on the command line: refused as a config error (exit 2) before anything is composed,
    so the callback's class is never built (here ``logging.FileHandler``, which would create its file)."""
    marker = tmp_path / MARKER
    cb = "+hydra.callbacks.cb"
    proc = launch(
        "data.train_files=x",
        "actor_rollout_ref.model.path=m",
        f"{cb}._target_=logging.FileHandler",
        f"{cb}.filename={marker}",
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert not marker.exists(), "the command line's Hydra callback ran"
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("vlmrl: config error:")]
    assert f"'{cb}._target_=logging.FileHandler': Hydra's own config has no effect in vlmrl" in line, line
    assert "Traceback" not in proc.stderr


@pytest.mark.slow  # a launch with a dry run, ~13 s
def test_the_dry_run_lists_every_hydra_override_it_refuses(tmp_path: Path) -> None:
    """A dry run with Hydra's job settings and a ``hydra/`` config group on the command line lists each as a
    problem (exit 2)."""
    hydra = ("hydra.job.env_set.VLMRL_PROBE=1", "hydra/job_logging=disabled")
    proc = launch(
        "data.train_files=x",
        "actor_rollout_ref.model.path=m",
        "trainer.dry_run=True",
        *hydra,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    for override in hydra:
        assert f"'{override}': Hydra's own config has no effect in vlmrl" in proc.stdout, proc.stdout[-3000:]


@pytest.mark.parametrize("dry_run", [False, True])
@pytest.mark.parametrize("flags", ["--config-path", "--config-dir"])
def test_a_hydra_config_file_outside_vlmrls_configs_cannot_set_hydras_own_config(
    flags: str, dry_run: bool, tmp_path: Path
) -> None:
    """A config Hydra composes itself (not built on verl's ppo_trainer): any YAML file of the folder it is read from
    with a ``hydra:`` section is refused before Hydra starts, even for a dry run (which lists it with the rest)."""
    import yaml

    folder = tmp_path / "config"
    (folder / "group").mkdir(parents=True)
    marker = tmp_path / MARKER
    (folder / "mine.yaml").write_text(yaml.safe_dump({"defaults": [{"group": "evil"}, "_self_"]}))
    (folder / "group" / "evil.yaml").write_text(
        "# @package _global_\n" + yaml.safe_dump({"hydra": {"callbacks": {"cb": callback(marker)}}})
    )
    where = [f"--config-path={folder}"] if flags == "--config-path" else ["-cd", str(folder)]  # the search path
    where.append("--config-name=mine")
    proc = launch(
        *where,
        "data.train_files=x",
        "actor_rollout_ref.model.path=m",
        *(["trainer.dry_run=True"] if dry_run else []),
        cwd=tmp_path,
        timeout=120,
    )
    assert not marker.exists(), "the file's Hydra callback ran"
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    problem = f"{folder / 'group' / 'evil.yaml'}: 'hydra' would set Hydra's own config"
    if dry_run:
        assert problem in proc.stdout, proc.stdout[-3000:]
    else:
        assert the_line(proc).startswith(f"vlmrl: config error: {problem}")


@pytest.mark.parametrize("name", ["../elsewhere/mine", "/tmp/elsewhere/mine"])
def test_a_config_name_that_leaves_the_config_folders_is_refused(name: str, tmp_path: Path) -> None:
    """Hydra joins ``--config-name`` to its search path: a name with ``..`` or an absolute one would compose a file
    of any folder, which nothing checked."""
    proc = launch(f"--config-name={name}", "data.train_files=x", "actor_rollout_ref.model.path=m", cwd=tmp_path)
    line = the_line(proc)
    assert line.startswith(f"vlmrl: config error: --config-name={name}: name a config file inside --config-path"), line
