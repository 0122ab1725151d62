"""verl's own Qwen2.5-VL launch scripts, run unchanged through ``python -m vlmrl.run_verl`` (their
``python3 -m verl.trainer.main_ppo`` starts ``vlmrl.train``), on data made by verl's own Geometry3K preprocessing.

The scripts are verl's files byte for byte (tests/verl_examples/, checked against their SHA-256). Only what a verl
user changes locally differs: ``$HOME`` holds the data (a stand-in in Geometry3K's hub layout, preprocessed by verl's
``examples/data_preprocess/geo3k.py``) and the model path is the tiny Qwen2.5-VL, appended as the scripts' ``$@``.
The vLLM + FSDP scripts pass ``trainer.dry_run=True``; the others are refused with a line naming the feature; two of
them also train for real at tiny scale.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import utils

REPO = Path(__file__).resolve().parents[1]
VERL = REPO / "tests" / "verl_examples"

# script -> None (passes the dry run) or the line that names why it is refused
SCRIPTS: dict[str, str | None] = {
    "run_qwen2_5_vl-7b.sh": None,
    "run_qwen2_5_vl-7b_freeze_vision.sh": None,
    "run_qwen2_5_vl-7b_lora.sh": None,
    "run_qwen2_5_vl_3b_npu.sh": None,
    "run_qwen2_5_vl_7b_npu.sh": None,
    "run_qwen2_5_vl_32b_npu.sh": None,
    "run_qwen2_5_vl-7b_seq_balance.sh": None,
    "run_qwen2_5_vl-7b-sglang.sh": "the SGLang rollout is not implemented in vlmrl",
    "run_qwen2_5_vl-7b-megatron.sh": "not implemented in vlmrl: the Megatron-LM backend",
    "run_qwen3_vl-8b-megatron.sh": "not implemented in vlmrl: the Megatron-LM backend",
    "run_qwen3_vl-30b-megatron.sh": "not implemented in vlmrl: expert parallelism for mixture-of-experts models",
    "run_qwen3_vl-235b-megatron.sh": "not implemented in vlmrl: expert parallelism for mixture-of-experts models",
    "run_qwen2.5-3b_geo3k_multiturn.sh": "the SGLang rollout is not implemented in vlmrl",
}
PLAN_LINES = {
    "run_qwen2_5_vl-7b_lora.sh": (
        "LoRA rank 64",
        "lr 3e-06",
        "KL loss on (low_var_kl)",
        "512 prompts x n=5 = 2560 samples per step",
        "15 epoch(s)",
    ),
    "run_qwen2_5_vl-7b_freeze_vision.sh": (
        "vision tower frozen",
        "LoRA rank 0",
        "512 prompts x n=5 = 2560 samples per step",
        "15 epoch(s)",
    ),
}
"""Lines of a script's dry-run plan that show its own settings."""
QWEN3_VL = ["run_qwen3_vl-8b-megatron.sh", "run_qwen3_vl-30b-megatron.sh", "run_qwen3_vl-235b-megatron.sh"]
"""verl's Qwen3-VL scripts (all Megatron): refused as they are; their FSDP version (:func:`fsdp_version`) runs."""
MULTI_TURN = "run_qwen2.5-3b_geo3k_multiturn.sh"
LORA = "run_qwen2_5_vl-7b_lora.sh"
"""verl's multi-turn geo3k script: SGLang as shipped; with ``actor_rollout_ref.rollout.name=vllm`` appended (its
``$@``) it runs on vlmrl, its ``--config-name`` file (built on verl's ppo_trainer) read as overrides."""


def manifest() -> dict[str, str]:
    """file -> sha256, from tests/verl_examples/README.md."""
    rows = re.findall(r"^\| (\S+) \| \S+ \| ([0-9a-f]{64}) \|$", (VERL / "README.md").read_text(), re.M)
    return dict(rows)


def test_the_verl_files_are_verls_byte_for_byte() -> None:
    files = {str(p.relative_to(VERL)) for p in VERL.rglob("*") if p.is_file() and p.name != "README.md"}
    table = manifest()
    assert files == set(table), files ^ set(table)
    for name, digest in table.items():
        assert hashlib.sha256((VERL / name).read_bytes()).hexdigest() == digest, f"{name} was edited"
    assert set(SCRIPTS) <= files


@pytest.fixture(scope="module")
def verl_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of :func:`cached_verl_home` (tests add files to it: the one-step script's model)."""
    import shutil

    home = tmp_path_factory.mktemp("home")
    shutil.copytree(utils.cached_verl_home(), home, dirs_exist_ok=True)
    return home


def _verl_checkout(cwd: str) -> None:
    """A folder laid out like verl's checkout (the multi-turn script reads
    ``$PWD/examples/sglang_multiturn/config``)."""
    (Path(cwd) / "examples").mkdir()
    (Path(cwd) / "examples" / "sglang_multiturn").symlink_to(VERL / "sglang_multiturn")


def _script_args(script: str, args: tuple[str, ...]) -> list[str]:
    text = (VERL / script).read_text()
    return [*(["vllm"] if "ENGINE=${1:-vllm}" in text else []), *args]  # the scripts' own first argument


def run_script(
    script: str, home: Path, *args: str, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``python -m vlmrl.run_verl tests/verl_examples/<script> [vllm] *args`` with HOME=home, from a folder laid out
    like verl's checkout; ``script`` may be a path elsewhere (an FSDP version)."""
    with tempfile.TemporaryDirectory(prefix="verl-checkout-") as cwd:
        _verl_checkout(cwd)
        full = {**os.environ, "HOME": str(home), "PYTHONPATH": str(REPO), "WANDB_MODE": "offline", **(env or {})}
        return subprocess.run(
            [sys.executable, "-m", "vlmrl.run_verl", str(VERL / script), *_script_args(script, args)],
            cwd=cwd,
            env=full,
            capture_output=True,
            text=True,
            timeout=timeout,
        )


def script_here(script: str, home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """:func:`run_script` with the test process as the driver: bash runs the script as ``run_verl`` does (its
    shims, HOME, the checkout's layout) with the trainer's command recorded (``vlmrl.config.verl.scripts.commands``),
    then ``vlmrl.train`` runs it in this process (tests/runs.cli_here) with the variables the script exported: a dry
    run, a refusal, or training whose workers fork from the session's forkserver (tests/runs.run_here), without a
    new interpreter's imports (about 40 s of a run's start on 2 busy cores). ``run_verl``'s own process trains in
    ``test_verl_script_trains_at_tiny_scale[LoRA]`` and the fully-async test. The exit status is the trainer's, or
    bash's when the script goes on after the trainer's command and fails (verl's 30B script)."""
    from runs import cli_here
    from vlmrl.config.verl.scripts import commands

    with tempfile.TemporaryDirectory(prefix="verl-checkout-") as cwd:
        _verl_checkout(cwd)
        full = {**os.environ, "HOME": str(home), "PYTHONPATH": str(REPO), "WANDB_MODE": "offline", **(env or {})}
        rec = commands(VERL / script, _script_args(script, args), env=full, cwd=cwd)
        assert len(rec.commands) == 1, rec
        here = os.getcwd()
        os.chdir(cwd)
        try:
            # the trainer's environment as run_verl's process would have it: HOME, wandb offline, what the script
            # exported
            here_env = {"HOME": str(home), "WANDB_MODE": "offline", **(env or {}), **rec.commands[0].exported}
            code, out, err = cli_here(rec.commands[0].argv, env=here_env)
        finally:
            os.chdir(here)
    rc = code if rec.returncode == 0 else rec.returncode
    return subprocess.CompletedProcess(["script_here", script], rc, rec.stdout + out, rec.stderr + err)


def fsdp_version(script: str, folder: Path, pass_args: bool = False) -> Path:
    """verl's Megatron ``script`` as a verl user runs it on FSDP: the same lines with verl's FSDP config
    (``ppo_trainer.yaml``, ``fully_async_ppo_trainer.yaml``), ``strategy=fsdp2`` for actor and reference, and the
    Megatron-only lines (``*.megatron.*``, the Megatron optimizer's offload overrides and ``lr_decay_steps``) left out;
    written into ``folder``. ``pass_args``: the command also ends with ``"$@"`` (a script that passes nothing on, as
    verl's fully-async ones, takes no scale-down otherwise)."""
    lines = (VERL / script).read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(("python3 -m", "python -m")))
    # verl's 30B script has a comment line inside its command (verl #4103), which ends the command there: the lines
    # after it, $@ included, never reach the trainer; its FSDP version leaves the comment out
    keep = [ln for i, ln in enumerate(lines) if not (i > start and ln.lstrip().startswith("#"))]
    megatron = (".megatron.", "override_optimizer_config", "optim.lr_decay_steps")  # (the last: Megatron's optimizer)
    keep = [ln for ln in keep if not any(m in ln for m in megatron)]
    text = "\n".join(keep).replace("ppo_megatron_trainer.yaml'", "ppo_trainer.yaml'")
    text = text.replace(
        "algorithm.adv_estimator=grpo \\",
        "algorithm.adv_estimator=grpo \\\n    actor_rollout_ref.actor.strategy=fsdp2 \\\n"
        "    actor_rollout_ref.ref.strategy=fsdp2 \\",
    )
    assert "strategy=fsdp2" in text and ".megatron." not in text and "ppo_megatron_trainer" not in text
    if pass_args:
        text = text.rstrip() + ' \\\n    "$@"'
    out = folder / Path(script).name.replace("megatron", "fsdp2")
    out.write_text(text + "\n")
    return out


@pytest.mark.parametrize("script", QWEN3_VL)
def test_verls_qwen3_vl_scripts_on_fsdp_pass_the_dry_run(script: str, verl_home: Path, tmp_path: Path) -> None:
    """The same lines with FSDP and the tiny Qwen3-VL (the 8B script) or Qwen3-VL-MoE (the 30B-A3B and 235B-A22B
    ones): the plan names the family, its 32-px image tokens and, for the MoE, what it trains without; the MoE
    scripts' expert-parallel settings were Megatron lines (gone)."""
    from vlmrl.testing.tiny import TINY_QWEN3_VL, TINY_QWEN3_VL_MOE, ensure_tiny_model

    moe = "8b" not in script
    model = ensure_tiny_model(0, TINY_QWEN3_VL_MOE if moe else TINY_QWEN3_VL)
    path = fsdp_version(script, tmp_path)
    args = ("trainer.dry_run=True", f"actor_rollout_ref.model.path={model}")
    if script == "run_qwen3_vl-235b-megatron.sh":
        # its engines span 16 GPUs of 8-GPU nodes; vlmrl's engine runs within one node, so the dry run names it, and
        # passes with the engine size a vlmrl user picks (the script's GEN_TP)
        proc = script_here(str(path), verl_home, *args)
        assert proc.returncode == 2 and "tensor_model_parallel_size=16 must divide trainer.n_gpus_per_node=8" in (
            proc.stdout
        ), proc.stdout[-3000:]
    proc = script_here(str(path), verl_home, *args, env={"GEN_TP": "8"} if "235b" in script else None)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "OK: the run would start" in proc.stdout and "Traceback" not in out
    assert "data.train: 1200 rows -> 1200 prompts" in proc.stdout
    family = "Qwen3-VL (32-px image tokens, DeepStack, timestamped video frames)"
    if moe:
        family = family.replace("Qwen3-VL", "Qwen3-VL-MoE").replace(
            ")",
            ", mixture of experts, trained without expert parallelism, routing replay or the router's "
            "load-balancing loss)",
        )
    assert f"model family: {family}" in proc.stdout, proc.stdout[-3000:]


@pytest.mark.slow
def test_verls_qwen3_vl_script_on_fsdp_trains_at_tiny_scale(verl_home: Path, tmp_path: Path) -> None:
    """verl's Qwen3-VL-8B script with the same lines on FSDP2, really training the tiny Qwen3-VL: 2 steps on 2 CPU
    workers (the smoke scale-down appended, ``GEN_TP=2`` for the script's engine size as a user sets it for 2 GPUs),
    validation before and after, its KL loss and token-budget (dynamic) batch sizes."""
    from vlmrl.testing.smoke import OVERRIDES
    from vlmrl.testing.tiny import TINY_QWEN3_VL, ensure_tiny_model

    model = ensure_tiny_model(0, TINY_QWEN3_VL)
    out = tmp_path / "run"
    proc = script_here(
        str(fsdp_version("run_qwen3_vl-8b-megatron.sh", tmp_path)),
        verl_home,
        *OVERRIDES,
        f"actor_rollout_ref.model.path={model}",
        f"trainer.default_local_dir={out}",
        "trainer.logger=[console,jsonl,wandb]",
        env={"GEN_TP": "2"},
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 3 and '"val/reward/mean"' in lines[0] and '"actor/kl_loss"' in lines[1]
    assert "1 vLLM engine(s) of tensor-parallel size 2" in proc.stdout, proc.stdout[-3000:]
    steps = [json.loads(line) for line in lines[1:]]
    assert all(s["rollout/logprob_diff"] < 1e-3 for s in steps), steps


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_verl_script_dry_run(script: str, verl_home: Path, tiny_model_dir: str) -> None:
    proc = script_here(script, verl_home, "trainer.dry_run=True", f"actor_rollout_ref.model.path={tiny_model_dir}")
    out = proc.stdout + proc.stderr
    refused = SCRIPTS[script]
    if refused is None:
        assert proc.returncode == 0, out[-4000:]
        assert "OK: the run would start" in proc.stdout and "Traceback" not in out
        assert "data.train: 1200 rows -> 1200 prompts" in proc.stdout  # verl's preprocessing output, read as is
        assert "reward: " in proc.stdout and "hiyouga/geometry3k -> geo3k" in proc.stdout
        for line in PLAN_LINES.get(script, ()):  # the plan carries the script's own settings
            assert line in proc.stdout, (line, proc.stdout[-3000:])
    else:
        # verl's 30B script: a comment line inside its command (verl #4103) ends the command; the trainer refuses what
        # reached it (exit 2) and bash then runs the remaining lines as a command of their own (exit 127)
        assert proc.returncode == (127 if script == "run_qwen3_vl-30b-megatron.sh" else 2), out[-4000:]
        assert refused in out, out[-4000:]
        if script in QWEN3_VL:  # README: the Megatron backend is named too, beside expert parallelism
            assert "not implemented in vlmrl: the Megatron-LM backend" in out, out[-4000:]
        assert "Did you mean" not in out and "Traceback" not in out and "Error parsing override" not in out


GLM41V = "run_glm41v_9b.sh"
"""verl's GLM-4.1V script (geo3k, vLLM, tensor-parallel 2, packed, KL loss)."""


def test_verls_glm41v_script_passes_the_dry_run_with_the_tiny_glm4v(verl_home: Path) -> None:
    """verl's GLM-4.1V script as shipped, its model pointed at the tiny GLM-4.1V: its geo3k records (verl's
    preprocessing) render through GLM's chat template and processor, and the plan names the family and the
    script's settings; the quick start's GLM-4.1V run is its learning test (tests/test_train_e2e.py)."""
    from vlmrl.testing.tiny import FAMILY_SPECS, ensure_tiny_model

    model = ensure_tiny_model(0, FAMILY_SPECS["glm4v"])
    proc = script_here(GLM41V, verl_home, "trainer.dry_run=True", f"actor_rollout_ref.model.path={model}")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "OK: the run would start" in proc.stdout, out[-4000:]
    for line in (
        "model family: GLM-4.1V (28-px image tokens, its own vision tokens <|image|>, trained without videos or "
        "multi-turn tool rollouts)",
        "data.train: 1200 rows -> 1200 prompts",
        "512 prompts x n=5 = 2560 samples per step",
        "KL loss on (low_var_kl)",
        "15 epoch(s)",
    ):
        assert line in proc.stdout, (line, proc.stdout[-3000:])
    assert "Traceback" not in out


def test_verls_multi_turn_script_runs_on_vllm(verl_home: Path, tiny_model_dir: str) -> None:
    """The multi-turn geo3k script with ``actor_rollout_ref.rollout.name=vllm``: its config file's settings apply
    (multi-turn on, 5 assistant turns, verl's chat template, which lists the tool itself), the command line's win over
    them (the prompt and response lengths), and the prompts carry the tool's schema."""
    base = ("trainer.dry_run=True", f"actor_rollout_ref.model.path={tiny_model_dir}")
    proc = script_here(MULTI_TURN, verl_home, *base, "actor_rollout_ref.rollout.name=vllm")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "OK: the run would start" in proc.stdout, out[-4000:]
    assert "geo3k_multiturn_grpo.yaml read as 10 override(s)" in out and "Traceback" not in out
    plan = proc.stdout
    assert "multi-turn: tools calc_geo3k_reward (hermes), at most 5 assistant turn(s)" in plan, plan
    tools_len = int(re.search(r"data.train: 1200 rows -> 1200 prompts; prompt length max (\d+)", plan).group(1))
    plain = script_here("run_qwen2_5_vl-7b.sh", verl_home, *base, "actor_rollout_ref.rollout.multi_turn.enable=False")
    plain_len = int(re.search(r"prompt length max (\d+)", plain.stdout).group(1))
    assert tools_len > plain_len + 300  # the record's system message and the tool's schema


@pytest.mark.slow
@pytest.mark.parametrize("script", [LORA, MULTI_TURN, GLM41V])
def test_verl_script_trains_at_tiny_scale(script: str, verl_home: Path, tiny_model_dir: str, tmp_path: Path) -> None:
    """The same scripts, really training: 2 steps on 2 CPU workers (vlmrl.testing.smoke's scale-down appended, as a
    verl user appends overrides), validation before and after, the checkpoint at the last step. Their
    ``tensor_model_parallel_size=2`` makes the two workers share one vLLM engine; the LoRA script pushes merged
    adapters into it; the multi-turn one runs its agent loop (vLLM); the GLM-4.1V one trains the tiny GLM-4.1V with
    its KL loss, packing and gradient checkpointing. verl's plain 7B script trains under
    ``test_verls_ppo_launch_line_trains_at_tiny_scale`` (the same lines and the critic's); its seq-balance script's
    token budgets (``use_dynamic_bsz``) train under the Qwen3-VL one (actor, reference and rollout log-prob
    budgets) and pass the dry run here. The LoRA script runs through ``python -m vlmrl.run_verl`` in its own
    process, as a user runs it; the other two through :func:`script_here`."""
    from vlmrl.testing.smoke import OVERRIDES
    from vlmrl.testing.tiny import FAMILY_SPECS, ensure_tiny_model

    out = tmp_path / "run"
    engine = ["actor_rollout_ref.rollout.name=vllm"] if script == MULTI_TURN else []
    model = ensure_tiny_model(0, FAMILY_SPECS["glm4v"]) if script == GLM41V else tiny_model_dir
    runner = run_script if script == LORA else script_here  # the LoRA one through run_verl's own process
    proc = runner(
        script,
        verl_home,
        *OVERRIDES,
        *engine,
        f"actor_rollout_ref.model.path={model}",
        f"trainer.default_local_dir={out}",
        "trainer.logger=[console,jsonl,wandb]",
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    if script == MULTI_TURN:  # its trainer.save_freq=-1: no checkpoint
        assert not list(out.glob("global_step_*"))
    else:
        assert (out / "global_step_2" / "actor" / ".metadata").is_file()
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 3 and '"val/reward/mean"' in lines[0] and '"actor/kl_loss"' in lines[1]
    assert "1 vLLM engine(s) of tensor-parallel size 2" in proc.stdout, proc.stdout[-3000:]
    if script == MULTI_TURN:
        assert all('"multi_turn/turns/mean"' in line for line in lines[1:])
    # the scripts' use_remove_padding=True: the update ran packed rows, not one padding position
    steps = [json.loads(line) for line in lines[1:]]
    assert all(s["work/update_padding_tokens"] == 0 and s["work/update_tokens"] > 0 for s in steps), steps


def verl_ppo_lines(model: str) -> list[str]:
    """The critic and KL lines of verl's own PPO example (examples/ppo_trainer/run_qwen2.5-3b_seq_balance.sh, in
    verl's repository), its model paths pointed at ``model``, plus the adaptive in-reward KL of verl's PPO
    documentation; appended to verl's GRPO Qwen2.5-VL script with ``algorithm.adv_estimator=gae``."""
    return [
        "algorithm.adv_estimator=gae",
        "critic.optim.lr=1e-5",
        "critic.model.use_remove_padding=True",
        f"critic.model.path={model}",
        "critic.model.enable_gradient_checkpointing=True",
        "critic.ppo_max_token_len_per_gpu=12288",
        "critic.model.fsdp_config.param_offload=False",
        "critic.model.fsdp_config.grad_offload=False",
        "critic.model.fsdp_config.optimizer_offload=False",
        "algorithm.kl_ctrl.kl_coef=0.001",
        "trainer.critic_warmup=0",
        "algorithm.use_kl_in_reward=True",
        "algorithm.kl_ctrl.type=adaptive",
    ]


def test_verls_ppo_launch_line_passes_the_dry_run(verl_home: Path, tiny_model_dir: str) -> None:
    """verl's GRPO Qwen2.5-VL script with verl's PPO critic lines: the dry run shows the critic, GAE, the adaptive
    in-reward KL and the memory of actor, reference, critic and engine."""
    proc = script_here(
        "run_qwen2_5_vl-7b.sh",
        verl_home,
        "trainer.dry_run=True",
        f"actor_rollout_ref.model.path={tiny_model_dir}",
        *verl_ppo_lines(tiny_model_dir),
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "OK: the run would start" in proc.stdout, out[-4000:]
    assert "algorithm: gae (gamma 1, lambda 1), in-reward KL kl, adaptive coefficient 0.001" in proc.stdout
    assert "critic: from the actor's checkpoint, value head per token; lr 1e-05" in proc.stdout
    assert re.search(r"memory per worker .*actor .*reference .*critic .*engine weights", proc.stdout), proc.stdout


@pytest.mark.slow
def test_verls_ppo_launch_line_trains_at_tiny_scale(verl_home: Path, tiny_model_dir: str, tmp_path: Path) -> None:
    """The same line, really training 2 steps at tiny scale on 2 CPU workers: the critic's and the in-reward KL's
    metrics in each step, the critic saved beside the actor; and what the plain script's own lines do (one shared
    engine of tensor-parallel size 2, packed updates, validation before training, the actor's checkpoint)."""
    from vlmrl.testing.smoke import OVERRIDES

    out = tmp_path / "run"
    proc = script_here(
        "run_qwen2_5_vl-7b.sh",
        verl_home,
        *OVERRIDES,
        f"actor_rollout_ref.model.path={tiny_model_dir}",
        *verl_ppo_lines(tiny_model_dir),
        f"trainer.default_local_dir={out}",
        "trainer.logger=[console,jsonl]",
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2] and "val/reward/mean" in rows[0]
    for r in rows[1:]:
        assert {
            "critic/vf_loss",
            "critic/vf_explained_var",
            "reward/kl_penalty",
            "reward/kl_coef",
            "actor/kl_loss",
        } <= set(r)
    assert (out / "global_step_2" / "critic" / ".metadata").is_file()
    # verl's plain 7B script's own lines: its engine size, the actor's checkpoint, packed updates (use_remove_padding)
    assert "1 vLLM engine(s) of tensor-parallel size 2" in proc.stdout, proc.stdout[-3000:]
    assert (out / "global_step_2" / "actor" / ".metadata").is_file()
    assert all(r["work/update_padding_tokens"] == 0 and r["work/update_tokens"] > 0 for r in rows[1:]), rows


# ------------------------------------------------------------------------------ verl's one-step off-policy scripts

ONE_STEP = "one_step_off_policy/grpo_3b_gsm8k_fsdp2_2_6.sh"
"""verl's one-step off-policy GRPO script (``python3 -m verl.experimental.one_step_off_policy.main_ppo``, Qwen2.5-3B
on gsm8k, 6 training + 2 rollout GPUs, ``actor_rollout_ref.hybrid_engine=False``)."""
ONE_STEP_REFUSED = {  # verl's other one-step scripts: refused naming the feature they need
    "one_step_off_policy/dapo_7b_math_fsdp2_4_12.sh": "Ulysses sequence parallelism",
    "one_step_off_policy/dapo_7b_math_fsdp2_64_64_ris.sh": "Ulysses sequence parallelism",
    "one_step_off_policy/dapo_7b_math_megatron_4_12.sh": "the Megatron-LM backend",
}


def text_model(home: Path, tiny_model_dir: str) -> Path:
    """A stand-in of the script's Qwen2.5-3B-Instruct where it looks for it (a text-only Qwen2 config and the tiny
    model's tokenizer files): what a verl user of this script has."""
    import shutil

    from transformers import Qwen2Config

    folder = home / "verl" / "models" / "Qwen" / "Qwen2.5-3B-Instruct"
    Qwen2Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
    ).save_pretrained(folder)
    for f in Path(tiny_model_dir).glob("tokenizer*"):
        shutil.copy(f, folder / f.name)
    return folder


def one_step_env(home: Path, model: str | None = None) -> dict[str, str]:
    """The script's own variables, as a user sets them: the data (verl's geo3k preprocessing output), the model."""
    env = {
        "TRAIN_FILE": str(home / "data" / "geo3k" / "train.parquet"),
        "TEST_FILE": str(home / "data" / "geo3k" / "test.parquet"),
    }
    return env | ({"MODEL_PATH": model} if model else {})


def test_verls_one_step_scripts_are_refused_only_for_their_model_or_a_named_feature(
    verl_home: Path, tiny_model_dir: str
) -> None:
    """As shipped (Qwen2.5-3B-Instruct, a text model) the GRPO script's only problem is its model; with a
    Qwen2.5-VL in MODEL_PATH the same line passes the dry run: two pools, the rollout pool's tensor-parallel engine,
    verl's bypass mode (its one-step config's default). The DAPO ones are refused naming what they need."""
    text_model(verl_home, tiny_model_dir)
    proc = script_here(ONE_STEP, verl_home, "trainer.dry_run=True", env=one_step_env(verl_home))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-4000:]
    assert "Qwen2.5-3B-Instruct' is a 'qwen2' model; vlmrl trains qwen2_5_vl" in out, out[-4000:]
    assert (
        "internvl, smolvlm, idefics3, llava_onevision, gemma3 (the closest: Qwen2.5-VL / Qwen2-VL, 'qwen2_vl', a "
        "different" in out
    ), out[-4000:]
    assert "1 problem(s); the run would not start" in out, out[-4000:]
    assert "Traceback" not in out and "Did you mean" not in out and "not implemented in vlmrl" not in out

    vl = script_here(
        ONE_STEP, verl_home, "trainer.dry_run=True", "trainer.device=cuda", env=one_step_env(verl_home, tiny_model_dir)
    )
    plan = vl.stdout
    assert vl.returncode == 0 and "OK: the run would start" in plan, (vl.stdout + vl.stderr)[-4000:]
    assert "workers: 1 node(s) x 6 GPU(s) = 6 training worker(s)" in plan, plan
    assert (
        "rollout pool (actor_rollout_ref.hybrid_engine=False, one-step off-policy): 1 node(s) x 2 GPU rollout" in plan
    )
    assert "bypass mode (the engine's log-probs as the old ones, ppo_clip loss)" in plan
    for script, feature in ONE_STEP_REFUSED.items():
        proc = script_here(script, verl_home, "trainer.dry_run=True", f"actor_rollout_ref.model.path={tiny_model_dir}")
        assert proc.returncode == 2 and feature in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-3000:]


@pytest.mark.slow
def test_verls_one_step_script_trains_at_tiny_scale(verl_home: Path, tiny_model_dir: str, tmp_path: Path) -> None:
    """The Qwen2.5-VL line of the same script, really training 2 steps on CPU (the scale-down appended; its
    rollout pool of 2 workers shares one vLLM engine, its tensor_model_parallel_size=2): the first step on-policy,
    the second one update stale, bypass mode's ratio against the engine's log-probs."""
    from vlmrl.testing.smoke import OVERRIDES

    out = tmp_path / "run"
    proc = script_here(
        ONE_STEP,
        verl_home,
        *OVERRIDES,
        "trainer.cpu_workers=1",
        "rollout.cpu_workers=2",
        f"trainer.default_local_dir={out}",
        "trainer.logger=[console,jsonl]",
        env=one_step_env(verl_home, tiny_model_dir),
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "1 training worker(s)" in proc.stdout and "2 rollout worker(s)" in proc.stdout, proc.stdout[-3000:]
    assert "1 vLLM engine(s) of tensor-parallel size 2" in proc.stdout
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]  # validation before training, then 2 steps
    assert [r["async/staleness"] for r in rows[1:]] == [0.0, 1.0]
    assert all("actor/kl_loss" in r for r in rows[1:])  # the script's use_kl_loss=True


def test_run_verl_print_shows_the_trainer_command_a_script_would_run(
    verl_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """``python -m vlmrl.run_verl --print SCRIPT ARGS``: the script runs in bash with its trainer command printed (as
    ``vlmrl.train`` gets it, the script's own arguments expanded and ARGS appended) instead of started."""
    import shlex

    from vlmrl.run_verl import main

    monkeypatch.setenv("HOME", str(verl_home))
    code = main(["--print", str(VERL / "run_qwen2_5_vl-7b.sh"), "vllm", "trainer.total_epochs=1"])
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert code == 0 and line.startswith("python -m vlmrl.train "), line
    args = shlex.split(line)[3:]
    assert args == utils.verl_script_overrides("run_qwen2_5_vl-7b.sh", verl_home, "vllm", "trainer.total_epochs=1")
    assert f"data.train_files={verl_home}/data/geo3k/train.parquet" in args and args[-1] == "trainer.total_epochs=1"
    assert main(["--print", str(verl_home / "missing.sh")]) == 2


# ------------------------------------------------------------------------------- verl's fully-async scripts

FULLY_ASYNC_VL = "fully_async_policy/geo3k_qwen25vl_7b_megatron_4_4.sh"
"""verl's fully-async Qwen2.5-VL script (``python -m verl.experimental.fully_async_policy.fully_async_main``,
Megatron, geo3k, 4 training + 4 rollout GPUs, staleness 0.1, a sync every 4 steps, partial rollouts)."""
FULLY_ASYNC_DAPO = "fully_async_policy/dapo_7b_math_fsdp2_4_4.sh"
"""verl's fully-async DAPO script on FSDP2 (Qwen2.5-Math-7B)."""


def test_verls_fully_async_scripts_are_refused_by_name_or_pass_the_dry_run_on_fsdp(
    verl_home: Path, tiny_model_dir: str, tmp_path: Path
) -> None:
    """As shipped the Qwen2.5-VL script is refused for its Megatron config and the DAPO one for DAPO's reward manager
    (nothing starts). The Qwen2.5-VL script's lines on FSDP pass the dry run: verl's fully-async keys become the
    plan's two pools, its window ((1 + 0.1) x 4 x 2 x 128 groups) and partial rollouts; total_rollout_steps caps the
    steps (51200 prompts / 256 a step)."""
    env = {"HF_MODEL_PATH": tiny_model_dir}
    proc = script_here(FULLY_ASYNC_VL, verl_home, env=env)
    assert proc.returncode == 2 and "the Megatron-LM backend" in proc.stdout + proc.stderr, proc.stdout[-3000:]
    dapo = {"MODEL_PATH": tiny_model_dir, **one_step_env(verl_home)}
    proc = script_here(FULLY_ASYNC_DAPO, verl_home, env=dapo)
    assert proc.returncode == 2 and "other reward managers" in proc.stdout + proc.stderr, proc.stdout[-3000:]
    fsdp = fsdp_version(FULLY_ASYNC_VL, tmp_path, pass_args=True)
    proc = script_here(str(fsdp), verl_home, "trainer.dry_run=True", "trainer.device=cuda", env=env)
    out = proc.stdout
    assert proc.returncode == 0 and "OK: the run would start" in out, (proc.stdout + proc.stderr)[-4000:]
    assert "workers: 1 node(s) x 4 GPU(s) = 4 training worker(s)" in out, out
    assert "fully asynchronous): 1 node(s) x 4 GPU rollout worker(s) = 4; prompt groups streamed" in out, out
    assert "a step trains on the first 256 that finish; weights synced by a collective every 4 step(s)" in out
    assert "at most 1126 groups started between two syncs (staleness_threshold=0.1), at most 64 generating" in out
    assert "steps: 200 (rollout.total_rollout_steps=51200 prompts)" in out, out


@pytest.mark.slow
def test_verls_fully_async_qwen2_5_vl_script_on_fsdp_trains_at_tiny_scale(
    verl_home: Path, tiny_model_dir: str, tmp_path: Path
) -> None:
    """The same lines on FSDP through ``python -m vlmrl.run_verl``, really training the tiny Qwen2.5-VL: 1 training
    worker and 2 rollout workers sharing one vLLM engine (tensor_model_parallel_size=2, as verl's fully-async DAPO
    scripts set gen_tp) on CPU, the smoke scale-down (steps of require_batches 2 x 2 prompts), the groups streamed to
    both workers of the engine, the script's KL loss, the engine's log-probs as the old ones (its
    use_rollout_log_probs)."""
    from vlmrl.testing.smoke import OVERRIDES

    out = tmp_path / "run"
    proc = run_script(
        str(fsdp_version(FULLY_ASYNC_VL, tmp_path, pass_args=True)),
        verl_home,
        *OVERRIDES,
        "trainer.cpu_workers=1",
        "rollout.cpu_workers=2",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
        "actor_rollout_ref.rollout.max_model_len=1024",  # (the script's 32768 is over the tiny model's 4096)
        f"trainer.default_local_dir={out}",
        "trainer.logger=[console,jsonl]",
        timeout=600,
        env={"HF_MODEL_PATH": tiny_model_dir},
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "fully-async: 1 training worker(s)" in proc.stdout, proc.stdout[-3000:]
    assert "2 rollout worker(s)" in proc.stdout and "1 vLLM engine(s) of tensor-parallel size 2" in proc.stdout
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().split("\n") if line]
    assert [r["step"] for r in rows] == [1, 2], rows
    assert all("actor/kl_loss" in r and "async/staleness_max" in r for r in rows)
    assert rows[0]["async/staleness_max"] == 0.0 and rows[0]["rollout/logprob_diff"] <= 1e-5
