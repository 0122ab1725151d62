"""Behaviours the README states that no other test file checks (issue 30): each test names the README sentence it
checks and fails when the behaviour is gone.

* "GPUs and clusters": ``trainer.ray_address`` (or ``RAY_ADDRESS``, or ``trainer.nnodes`` > 1) makes the default
  launcher Ray; without them it is the local one.
* "Reliability": collectives are bounded by ``actor_rollout_ref.nccl_timeout``.
* "Running it for days", Export: a LoRA run's export merges the adapters; ``--dtype`` and ``--model``.
* "Video": multi-turn tool rollouts refuse video prompts (through the CLI, and in the dry run).
* ``vlmrl/workers/launch_local.py``: local worker processes are named ``vlmrl-worker-<rank>``.

(Every worker process ending with the driver is in ``test_train_e2e.py``, with the other ``kill -9`` runs.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from utils import inline_cfg, synthetic_data

from runs import cli_here, processes
from vlmrl.config import load

REPO = Path(__file__).resolve().parents[1]
BASE = ["data.train_files=x", "actor_rollout_ref.model.path=m"]


# ------------------------------------------------------------------------------------------- the default launcher


class _Started(Exception):
    """Raised by a stand-in worker group instead of starting workers: carries the launcher it stands for."""


def _stand_in(kind: str) -> type:
    class Group:
        def __init__(self, *args, **kwargs) -> None:
            raise _Started(kind)

    return Group


@pytest.mark.parametrize(
    ("env", "overrides", "launcher", "address"),
    [
        ({}, [], "local", None),
        ({"RAY_ADDRESS": ""}, [], "local", None),  # set but empty: no cluster
        ({"RAY_ADDRESS": "10.0.0.1:6379"}, [], "ray", "10.0.0.1:6379"),
        ({}, ["trainer.nnodes=2"], "ray", "auto"),  # joins the cluster this machine is part of, as verl's ray.init()
        ({}, ["trainer.ray_address=10.0.0.2:6379"], "ray", "10.0.0.2:6379"),
        ({"RAY_ADDRESS": "10.0.0.1:6379"}, ["trainer.ray_address=10.0.0.2:6379"], "ray", "10.0.0.2:6379"),
        ({"RAY_ADDRESS": "10.0.0.1:6379"}, ["trainer.launcher=local"], "local", "10.0.0.1:6379"),  # asked for
        ({}, ["trainer.nnodes=2", "trainer.launcher=inline"], "inline", "auto"),
    ],
    ids=[
        "nothing",
        "empty-env",
        "RAY_ADDRESS",
        "nnodes=2",
        "ray_address",
        "key-over-env",
        "explicit-local",
        "explicit-inline",
    ],
)
def test_a_cluster_address_or_several_nodes_make_the_default_launcher_ray(
    env: dict[str, str], overrides: list[str], launcher: str, address: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """README, "GPUs and clusters": ``trainer.ray_address`` (or ``RAY_ADDRESS``, or ``trainer.nnodes`` > 1) makes
    the default launcher Ray; without any of them it is local; an explicit ``trainer.launcher`` wins. Checked on
    ``launcher_of`` / ``ray_address`` and on the worker group ``make_worker_group`` actually starts (stand-ins that
    record which one)."""
    import vlmrl.workers.launch as launch
    from vlmrl.config.plan import launcher_of, ray_address, worker_plan

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    cfg = load(BASE + overrides)
    assert cfg.trainer.launcher == (launcher if any(o.startswith("trainer.launcher=") for o in overrides) else "auto")
    assert launcher_of(cfg) == launcher
    assert ray_address(cfg) == address
    monkeypatch.setattr(launch, "RayWorkerGroup", _stand_in("ray"))
    monkeypatch.setattr(launch, "ProcessWorkerGroup", _stand_in("local"))
    monkeypatch.setattr(launch, "InlineWorkerGroup", _stand_in("inline"))
    with pytest.raises(_Started) as started:
        launch.make_worker_group(cfg, worker_plan(cfg, 1, 1, 0))
    assert started.value.args == (launcher,)


@pytest.mark.parametrize(
    ("overrides", "driver_files", "env", "early"),
    [
        (["trainer.device=cpu"], True, {}, True),  # asked for: whatever the machine has
        (["trainer.device=auto"], False, {}, True),  # no GPU driver's files: auto is the CPU
        (["trainer.device=auto"], True, {}, False),  # the gate decides, with torch
        (["trainer.device=cuda"], False, {}, False),
        (["trainer.device=cpu", "trainer.nnodes=2"], False, {}, False),  # Ray
        (["trainer.device=cpu"], False, {"RAY_ADDRESS": "10.0.0.1:6379"}, False),
        (["trainer.device=cpu", "trainer.launcher=inline"], False, {}, False),
        (["trainer.device=cpu", "trainer.dry_run=True"], False, {}, False),
    ],
    ids=["cpu", "auto-no-gpu", "auto-gpu-driver", "cuda", "nnodes=2", "RAY_ADDRESS", "inline", "dry-run"],
)
def test_a_local_cpu_run_starts_its_workers_imports_before_the_config_checks(
    overrides: list[str], driver_files: bool, env: dict[str, str], early: bool, monkeypatch, tmp_path
) -> None:
    """``python -m vlmrl.train`` starts the forkserver its CPU workers fork from (their imports, ~20 s on one core)
    as soon as Hydra composed the config, before the checks import torch, where the composition says for sure that
    the workers are this machine's CPU processes (``config.plan.surely_local_cpu``): ``trainer.device=cpu``, or
    ``auto`` on a machine without NVIDIA's or ROCm's driver files, on the local launcher; vLLM's modules where the
    rollout is vLLM's. Nothing starts early for a dry run, a Ray or inline run, or a command line with problems."""
    import vlmrl.config.command as command
    import vlmrl.config.plan as plan
    import vlmrl.workers.launch_local as launch_local
    from vlmrl import train

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    present = tmp_path / "nvidiactl"
    present.touch()
    monkeypatch.setattr(plan, "GPU_DRIVER_FILES", (str(present) if driver_files else str(tmp_path / "none"),))
    events: list[object] = []
    monkeypatch.setattr(launch_local, "start_forkserver", lambda vllm, also=(): events.append(("forkserver", vllm)))
    build = command.build
    monkeypatch.setattr(command, "build", lambda raw: (events.append("checks"), build(raw))[1])
    for rollout in ("vllm", "hf"):
        events.clear()
        cmd = command.parse([*BASE, *overrides, f"actor_rollout_ref.rollout.name={rollout}"])
        command.compose(cmd, composed=train._start_workers_imports)
        assert events == ([("forkserver", rollout == "vllm")] if early else []) + ["checks"], events
    events.clear()  # a command line with a problem composes nothing early
    command.compose(command.parse([*BASE, *overrides, "trainer.no_such_key=1"]), composed=train._start_workers_imports)
    assert ("forkserver", True) not in events


# ------------------------------------------------------------------------------------------------------- export


@pytest.fixture(scope="module")
def synth(tmp_path_factory: pytest.TempPathFactory):
    """The colour family: 56 px images, 16 train / 4 test records."""
    return synthetic_data(tmp_path_factory.mktemp("synth"))


class LoraRun:
    """A finished 2-step LoRA run (checkpoint at step 2), an image prompt and the trained policy's logits on it."""

    def __init__(self, run, enc: dict, want: torch.Tensor) -> None:
        self.run, self.enc, self.want = run, enc, want

    def logits(self, folder) -> torch.Tensor:
        from transformers import AutoModelForImageTextToText

        model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval()
        with torch.no_grad():
            return model(**self.enc).logits


def tensors(folder) -> dict[str, torch.Tensor]:
    """The tensors of an HF folder's model.safetensors, as stored."""
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open has no __iter__


@pytest.fixture(scope="module")
def lora_run(tiny_model_dir: str, synth, tmp_path_factory: pytest.TempPathFactory) -> LoraRun:
    """Two LoRA steps (rank 4, lr 1e-2) in this process, checkpointed at step 2; the policy's logits on a red image
    prompt read from the trained (adapted) module itself before the trainer closes."""
    from PIL import Image
    from transformers import AutoProcessor

    from vlmrl.trainer.grpo import Trainer

    run = tmp_path_factory.mktemp("lora") / "run"
    cfg = inline_cfg(
        tiny_model_dir,
        synth,
        run,
        "trainer.total_training_steps=2",
        "trainer.save_freq=2",
        "actor_rollout_ref.model.lora_rank=4",
        "actor_rollout_ref.model.lora_alpha=8",
        "actor_rollout_ref.actor.optim.lr=1e-2",
    )
    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour?"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) + "red green blue"
    enc = dict(processor(text=[text], images=[Image.new("RGB", (56, 56), (200, 30, 30))], return_tensors="pt"))
    t = Trainer(cfg)
    try:
        t.fit()
        policy = t.group.worker.policy.model
        assert any(".lora_A." in n for n, _ in policy.named_parameters())  # a LoRA run
        with torch.no_grad():
            want = policy(**enc, use_cache=False).logits
    finally:
        t.close()
    return LoraRun(run, enc, want)


def test_export_of_a_lora_run_merges_the_adapters(lora_run: LoraRun, tiny_model_dir: str, tmp_path) -> None:
    """README, Export: ``python -m vlmrl.export --checkpoint RUN_DIR --output OUT`` writes an HF folder with LoRA
    merged: the base model's tensor names and no ``lora_`` tensor, and the trained policy's logits on an image prompt
    (to 1e-5), where the base model's are far off (the adapters matter)."""
    from pathlib import Path

    from vlmrl.export import main as export

    assert export(["--checkpoint", str(lora_run.run), "--output", str(tmp_path / "hf")]) == 0
    merged, base = tensors(tmp_path / "hf"), tensors(Path(tiny_model_dir))
    assert not [k for k in merged if "lora" in k] and merged.keys() == base.keys()
    assert sum(not torch.equal(merged[k], base[k]) for k in base) >= 14  # every adapted projection, merged
    got, want = lora_run.logits(tmp_path / "hf"), lora_run.want
    assert (lora_run.logits(tiny_model_dir) - want).abs().max() > 1e-3
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5), (got - want).abs().max()


def test_export_dtype_bfloat16_stores_bf16_tensors(lora_run: LoraRun, tmp_path) -> None:
    """``--dtype bfloat16``: every stored tensor is bf16, the float32 export's values rounded (nothing else
    changes), and the folder's config says so."""
    import json

    from vlmrl.export import main as export

    assert export(["--checkpoint", str(lora_run.run), "--output", str(tmp_path / "fp32")]) == 0
    assert export(["--checkpoint", str(lora_run.run), "--output", str(tmp_path / "bf16"), "--dtype", "bfloat16"]) == 0
    full, half = tensors(tmp_path / "fp32"), tensors(tmp_path / "bf16")
    assert {v.dtype for v in full.values()} == {torch.float32} and {v.dtype for v in half.values()} == {torch.bfloat16}
    assert half.keys() == full.keys() and all(torch.equal(half[k], full[k].to(torch.bfloat16)) for k in full)
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"


def _moved_base(lora_run: LoraRun, tmp_path):
    """A copy of the run's checkpoint whose config names a base model folder that no longer exists."""
    import shutil

    ckpt = tmp_path / "copy" / "global_step_2"
    shutil.copytree(lora_run.run / "global_step_2", ckpt)
    gone = tmp_path / "gone_model"
    cfg = ckpt / "config.yaml"
    text = cfg.read_text()
    old = next(line for line in text.splitlines() if line.strip().startswith("path: ") and "tiny" in line)
    cfg.write_text(text.replace(old, old.split("path: ")[0] + f"path: {gone}"))
    return ckpt, gone


def test_export_model_takes_the_base_from_that_path(lora_run: LoraRun, tiny_model_dir: str, tmp_path) -> None:
    """``--model BASE``: a checkpoint whose recorded base model folder is gone does not export without it, and with
    ``--model`` exports from the folder given: the same merged weights as from the run itself, the processor of that
    folder."""
    from transformers import AutoProcessor

    from vlmrl.export import main as export

    ckpt, gone = _moved_base(lora_run, tmp_path)
    assert export(["--checkpoint", str(ckpt), "--output", str(tmp_path / "none")]) == 2
    assert not (tmp_path / "none" / "model.safetensors").exists()
    assert export(["--checkpoint", str(ckpt), "--output", str(tmp_path / "rebased"), "--model", tiny_model_dir]) == 0
    assert export(["--checkpoint", str(lora_run.run), "--output", str(tmp_path / "own")]) == 0
    rebased, own = tensors(tmp_path / "rebased"), tensors(tmp_path / "own")
    assert rebased.keys() == own.keys() and all(torch.equal(rebased[k], own[k]) for k in own)
    vocab = AutoProcessor.from_pretrained(tmp_path / "rebased").tokenizer.get_vocab()
    assert vocab == AutoProcessor.from_pretrained(tiny_model_dir).tokenizer.get_vocab()


def test_export_without_its_base_model_says_so_and_names_the_model_flag(lora_run: LoraRun, tmp_path, capsys) -> None:
    """``vlmrl.export`` refuses its own errors with one line and exit status 2 (as for a missing checkpoint): a base
    model folder that is gone should be one of them, naming the folder and ``--model``."""
    from vlmrl.export import main as export

    ckpt, gone = _moved_base(lora_run, tmp_path)
    assert export(["--checkpoint", str(ckpt), "--output", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert str(gone) in err and "--model" in err


# -------------------------------------------------------------------------------------- multi-turn and videos


@pytest.fixture(scope="module")
def video_data(tmp_path_factory: pytest.TempPathFactory):
    """The video colour family: 8 training records of 4 frames, one ``<video>`` each."""
    return synthetic_data(tmp_path_factory.mktemp("video"), "video_colour", train=8, test=0)


def video_multi_turn_args(model: str, data, out, *extra: str) -> list[str]:
    """Overrides of ``tiny_cpu``: multi-turn with the zoom tool on the video data, 4 prompts a step."""
    tools = REPO / "examples" / "tool_config" / "zoom.yaml"
    return [
        f"data.train_files={data / 'train.parquet'}",
        "data.val_files=null",
        f"actor_rollout_ref.model.path={model}",
        f"trainer.default_local_dir={out}",
        "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "trainer.logger=[jsonl]",
        "data.max_prompt_length=1024",
        "actor_rollout_ref.rollout.max_model_len=1200",
        "actor_rollout_ref.rollout.multi_turn.enable=True",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools}",
        *extra,
    ]


def dry_run_of(overrides: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str]:
    """``trainer.dry_run=True`` on ``tiny_cpu`` with ``overrides``, in this process: (exit status, what it printed)."""
    from vlmrl import dry_run

    capsys.readouterr()
    code = dry_run.run(load(overrides, config_name="tiny_cpu"), [], [])
    return code, capsys.readouterr().out


REFUSAL = "actor_rollout_ref.rollout.multi_turn.enable=True with video prompts: multi-turn tool rollouts take"


def test_multi_turn_on_video_prompts_is_refused_through_the_cli(
    tiny_model_dir: str, video_data, tmp_path, capsys
) -> None:
    """README, Video: "multi-turn tool rollouts refuse video prompts". ``python -m vlmrl.train`` (its ``main``, here:
    tests/runs.cli_here) with multi-turn on
    and a video dataset exits 2 with the refusal as a config error, before any worker starts (no metrics, no
    checkpoint); the same line with multi-turn off passes the dry run (the data and the rest of the line are fine:
    the refusal is about the combination)."""
    out = tmp_path / "run"
    args = video_multi_turn_args(tiny_model_dir, video_data, out, "trainer.total_training_steps=1")
    code, stdout, stderr = cli_here(["--config-name", "tiny_cpu", *args])
    assert code == 2, stdout[-2000:] + stderr[-3000:]
    assert f"vlmrl: config error: {REFUSAL}" in stderr, stderr[-3000:]
    assert "Traceback" not in stderr and "hybrid worker(s)" not in stdout
    assert not (out / "metrics.jsonl").exists() and not list(out.glob("global_step_*"))
    code, printed = dry_run_of([*args, "actor_rollout_ref.rollout.multi_turn.enable=False"], capsys)
    assert code == 0 and "max videos/prompt 1" in printed, printed


def test_the_dry_run_reports_multi_turn_on_video_prompts(tiny_model_dir: str, video_data, tmp_path, capsys) -> None:
    """README: the dry run "exits 0 when the run would start ..., else 2 listing every problem"; a multi-turn run on
    video prompts does not start (see above), so its dry run must exit 2 listing the refusal."""
    code, printed = dry_run_of(video_multi_turn_args(tiny_model_dir, video_data, tmp_path / "run"), capsys)
    assert "multi-turn: tools image_zoom" in printed and "max videos/prompt 1" in printed  # it read tools and data
    assert code == 2, printed
    assert REFUSAL in printed


# -------------------------------------------------------------------------------------------------- nccl_timeout


def _rank_in_a_collective(rank: int, rendezvous: str, model: str, data: str, results) -> None:
    """One of two HybridWorkers (CPU, gloo) built as a worker process builds it; rank 0 then enters an all-reduce
    that rank 1 never joins (rank 1 waits instead) and records how it ended and after how long."""
    import time

    import torch
    import torch.distributed as dist

    from vlmrl.config.plan import worker_plan
    from vlmrl.workers.hybrid import HybridWorker

    overrides = [
        f"data.train_files={data}",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.rollout.name=hf",
    ]
    cfg = load([*overrides, "actor_rollout_ref.nccl_timeout=3", "trainer.cpu_workers=2"], config_name="tiny_cpu")
    worker = HybridWorker(worker_plan(cfg, 1, 1, 0, cuda_available=False), rank, rendezvous)
    if rank == 1:
        results["ready"] = True
        time.sleep(90)  # never joins: a worker frozen or busy elsewhere
        return
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1))
        results["outcome"] = "returned"
    except Exception as e:  # noqa: BLE001 - the point: the collective fails instead of waiting forever
        results["outcome"] = f"{type(e).__name__}: {e}"
    results["seconds"] = time.monotonic() - t0
    del worker


@pytest.mark.slow  # 12 s measured (tests/durations.json)
@pytest.mark.serial  # a bound on elapsed time
def test_a_collective_a_worker_never_joins_fails_after_nccl_timeout(tiny_model_dir: str, synth, tmp_path) -> None:
    """README, Reliability: a worker stuck in a collective is reported after ``actor_rollout_ref.nccl_timeout``. Two
    HybridWorkers (the process group they create themselves, gloo on CPU) with ``nccl_timeout=3``: rank 0's
    all-reduce, which rank 1 never joins, raises a timeout after about 3 s (not the 30 minutes of the default), so
    the worker can report it instead of hanging."""

    ctx = processes()
    with ctx.Manager() as manager:
        results = manager.dict()
        procs = [
            ctx.Process(
                target=_rank_in_a_collective,
                args=(r, f"file://{tmp_path / 'rdv'}", tiny_model_dir, str(synth / "train.parquet"), results),
            )
            for r in range(2)
        ]
        for p in procs:
            p.start()
        try:
            procs[0].join(120)
            got = dict(results)
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
                p.join(10)
    assert got.get("ready"), got
    assert "outcome" in got, f"rank 0 still waited in the collective after 120 s: {got}"
    assert got["outcome"] != "returned" and "timed out" in got["outcome"].lower(), got
    assert 2.5 <= got["seconds"] < 20, got


# ---------------------------------------------------------------------------------------------- worker processes


NAMES = """
import sys, psutil
from vlmrl.config import load
from vlmrl.config.plan import worker_plan
from vlmrl.workers.launch_local import ProcessWorkerGroup
cfg = load(sys.argv[1:], config_name="tiny_cpu")
group = ProcessWorkerGroup(cfg, worker_plan(cfg, 1, 1, 0))
try:
    print("CMDLINE", psutil.Process(group.procs[0].pid).cmdline()[0], flush=True)
finally:
    group.shutdown(grace_s=5.0)
"""


@pytest.mark.slow  # an interpreter that starts a worker process, ~12 s
def test_local_worker_processes_are_named_by_rank(tiny_model_dir: str, synth, tmp_path) -> None:
    """vlmrl/workers/launch_local.py: the worker processes are "each named vlmrl-worker-<rank>" (what ``ps`` shows,
    and how the end-to-end tests find a worker to kill or freeze), also when the run is launched as
    ``OMP_NUM_THREADS=1 python -m vlmrl.train ...`` (bash puts the command's own variables first in its
    environment): a started worker's command line is its name."""
    args = [
        f"data.train_files={synth / 'train.parquet'}",
        "data.val_files=null",
        f"actor_rollout_ref.model.path={tiny_model_dir}",
        f"trainer.default_local_dir={tmp_path / 'run'}",
        "trainer.launcher=local",
        "trainer.cpu_workers=1",
        "actor_rollout_ref.rollout.name=hf",
    ]
    rest = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "RAY_ADDRESS")}
    env = {"OMP_NUM_THREADS": "1", **rest, "PYTHONPATH": str(REPO)}  # in this order: the first variable is rewritten
    proc = subprocess.run(
        [sys.executable, "-c", NAMES, *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    line = [x for x in proc.stdout.splitlines() if x.startswith("CMDLINE ")]
    assert proc.returncode == 0 and line, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert line[0] == "CMDLINE vlmrl-worker-0", line[0]


def test_dataloader_num_workers_builds_a_batch_on_that_many_threads(tiny_model_dir: str, synth, tmp_path) -> None:
    """``data.dataloader_num_workers`` (the schema: threads that decode and resize a batch's images) reaches the
    dataset: a training step and a validation build their prompts on that many threads (the key was read by nothing
    before), with the same prompts as in the calling thread."""
    from vlmrl.trainer.grpo import Trainer

    cfg = load(
        [
            f"data.train_files={synth / 'train.parquet'}",
            f"data.val_files={synth / 'test.parquet'}",
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            f"trainer.default_local_dir={tmp_path / 'run'}",
            "trainer.launcher=inline",
            "actor_rollout_ref.rollout.name=hf",
            "data.train_batch_size=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.rollout.n=2",
            "data.max_response_length=4",
            "trainer.logger=[jsonl]",
            "trainer.val_before_train=true",
            "trainer.total_training_steps=1",
            "data.dataloader_num_workers=3",
        ],
        config_name="tiny_cpu",
    )
    trainer = Trainer(cfg)
    try:
        trainer.fit()
        pools = (trainer.train_ds._pool, trainer.val_ds._pool)
        assert all(p is not None and p._max_workers == 3 for p in pools)
        threaded = trainer.train_ds.get_batch([0, 1, 2], 3)
        plain = trainer.train_ds.get_batch([0, 1, 2], 0)
        assert [p.prompt_ids for p in threaded] == [p.prompt_ids for p in plain]
    finally:
        trainer.close(grace_s=1.0, quiet=True)
