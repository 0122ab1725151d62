"""GPU paths: CUDA FSDP2 with bf16 compute over fp32 master weights, the HF rollout on CUDA, checkpoint/resume on
CUDA, and vLLM sleep/wake. Marked ``gpu``: skipped where CUDA is absent (CI), run with ``pytest -m gpu`` on a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def colour_data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("colour")
    subprocess.run(
        [
            sys.executable,
            "preprocess/synthetic.py",
            "--output-dir",
            str(out),
            "--families",
            "colour",
            "--image-size",
            "112",
            "--train-size",
            "256",
            "--test-size",
            "16",
            "--no-progress",
        ],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )
    return out


def _train(model: str, data: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "vlmrl.train",
        "--config-name",
        "tiny_cpu",
        f"data.train_files={data / 'train.parquet'}",
        f"data.val_files={data / 'test.parquet'}",
        f"actor_rollout_ref.model.path={model}",
        f"trainer.default_local_dir={out}",
        "trainer.logger=[jsonl]",
        "trainer.device=cuda",
        "trainer.launcher=inline",
        "actor_rollout_ref.rollout.name=hf",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        *extra,
    ]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_cuda_training_checkpoint_and_resume(tiny_model_dir, colour_data, tmp_path):
    """The real entry point on CUDA (one in-process worker, HF rollout): finite metrics, peak memory logged, a
    checkpoint written and resumed with an identical curve."""
    ref, cut = tmp_path / "ref", tmp_path / "cut"
    a = _train(tiny_model_dir, colour_data, ref, "trainer.total_training_steps=4", "trainer.save_freq=2")
    assert a.returncode == 0, a.stdout[-3000:] + a.stderr[-3000:]
    b = _train(tiny_model_dir, colour_data, cut, "trainer.total_training_steps=2", "trainer.save_freq=2")
    assert b.returncode == 0, b.stderr[-3000:]
    # continue the 2-step run to 4 steps (constant LR: the schedule does not depend on the total)
    c = _train(tiny_model_dir, colour_data, cut, "trainer.total_training_steps=4", "trainer.save_freq=2")
    assert c.returncode == 0, c.stderr[-3000:]
    assert "resumed from" in c.stdout + c.stderr
    rows_a = [json.loads(x) for x in (ref / "metrics.jsonl").read_text().splitlines()]
    rows_c = [json.loads(x) for x in (cut / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows_a] == [r["step"] for r in rows_c] == [1, 2, 3, 4]
    for ra, rc in zip(rows_a, rows_c):
        assert torch.isfinite(torch.tensor(ra["actor/pg_loss"]))
        assert ra["perf/max_memory_allocated_gb"] > 0
        assert ra["reward/mean"] == pytest.approx(rc["reward/mean"], abs=1e-6), (ra["step"], ra, rc)


def test_cuda_ppo_critic_offloaded_checkpoint_and_resume(tiny_model_dir, colour_data, tmp_path):
    """Actor-critic PPO on CUDA with the critic's parameters and optimizer state offloaded to the CPU (FSDP2's
    CPUOffloadPolicy): finite critic metrics every step, and a run cut at step 2 and resumed (critic checkpoint
    included) follows the uninterrupted one."""
    ppo = [
        "algorithm.adv_estimator=gae",
        "critic.optim.lr=2e-3",
        "critic.fsdp.param_offload=true",
        "critic.fsdp.optimizer_offload=true",
        "trainer.save_freq=2",
    ]
    ref, cut = tmp_path / "ref", tmp_path / "cut"
    a = _train(tiny_model_dir, colour_data, ref, "trainer.total_training_steps=4", *ppo)
    assert a.returncode == 0, a.stdout[-3000:] + a.stderr[-3000:]
    b = _train(tiny_model_dir, colour_data, cut, "trainer.total_training_steps=2", *ppo)
    assert b.returncode == 0, b.stderr[-3000:]
    assert (cut / "global_step_2" / "critic").is_dir()
    c = _train(tiny_model_dir, colour_data, cut, "trainer.total_training_steps=4", *ppo)
    assert c.returncode == 0, c.stderr[-3000:]
    rows_a = [json.loads(x) for x in (ref / "metrics.jsonl").read_text().splitlines()]
    rows_c = [json.loads(x) for x in (cut / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows_a] == [r["step"] for r in rows_c] == [1, 2, 3, 4]
    for ra, rc in zip(rows_a, rows_c):
        for key in ("critic/vf_loss", "critic/vpred_mean", "critic/grad_norm", "actor/pg_loss"):
            assert torch.isfinite(torch.tensor(ra[key])), (ra["step"], key, ra[key])
        assert ra["reward/mean"] == pytest.approx(rc["reward/mean"], abs=1e-6), ra["step"]
        assert ra["critic/vf_loss"] == pytest.approx(rc["critic/vf_loss"], rel=1e-3, abs=1e-5), ra["step"]


def test_fsdp2_bf16_compute_fp32_master_and_hf_rollout(tiny_model_dir, colour_data, tmp_path):
    """The policy keeps fp32 master weights sharded as DTensors on the GPU and computes in bf16; the HF rollout's
    log-probs match a training forward of the same tokens within bf16 precision."""
    from vlmrl.batch import TrainShard
    from vlmrl.config import load
    from vlmrl.config.plan import worker_plan
    from vlmrl.data import RLDataset
    from vlmrl.models.forward import response_logprobs
    from vlmrl.models.inputs import build_inputs, process_images, to_device
    from vlmrl.workers.hybrid import HybridWorker

    cfg = load(
        [
            f"data.train_files={colour_data / 'train.parquet'}",
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            "trainer.device=cuda",
            "trainer.launcher=inline",
            "actor_rollout_ref.rollout.name=hf",
            "actor_rollout_ref.rollout.n=4",
            "data.max_response_length=8",
        ],
        config_name="tiny_cpu",
    )
    w = HybridWorker(worker_plan(cfg, 4, 1, 0, cuda_available=True), 0, f"file://{tmp_path / 'rendezvous'}")
    try:
        p = next(iter(w.policy.model.parameters()))
        assert p.device.type == "cuda" and p.dtype == torch.float32 and hasattr(p, "full_tensor")
        ds = RLDataset(str(colour_data / "train.parquet"), w.processor, cfg.data, split="train")
        prompts = ds.get_batch([0, 1])
        rb = w.generate(prompts)
        assert len(rb) == 8 and all(len(r) > 0 for r in rb.response_ids)
        x = build_inputs(prompts, rb, process_images(w.processor, prompts), w.pad_id)
        lp, _, _ = response_logprobs(w.policy.model, to_device(x, "cuda"), w.vision_ids, 1.0)
        eng = x.rollout_logprobs.to(lp.device)
        gap = ((lp.float() - eng).abs() * x.response_mask.to(lp.device)).sum() / x.response_mask.sum()
        assert gap < 0.05, f"HF rollout vs training forward log-prob gap {gap:.4f}"
        shard = TrainShard(
            stored=[(rid, g) for _, rid, g in rb.origins],
            sent=None,
            advantages=[1.0, -1.0, 0.5, -0.5] * 2,
            mini_batch_samples=8,
        )
        metrics = w.update(shard)
        assert metrics["perf/max_memory_allocated_gb"] > 0 and metrics["actor/grad_norm"] > 0
    finally:
        w.shutdown()


def test_vllm_sleep_frees_memory_and_wake_restores(tiny_model_dir):
    """On GPU the engine sleeps while the trainer runs (KV cache freed, weights offloaded) and behaves the same after
    waking."""
    pytest.importorskip("vllm")
    from transformers import AutoProcessor
    from utils import make_prompt, solid

    from vlmrl.config import RolloutConfig
    from vlmrl.rollout.base import SamplingSpec
    from vlmrl.rollout.vllm import VLLMRollout

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    rc = RolloutConfig(gpu_memory_utilization=0.3, free_cache_engine=True)
    eng = VLLMRollout(tiny_model_dir, rollout_cfg=rc, max_model_len=256, limit_images=1, device="cuda")
    proc = AutoProcessor.from_pretrained(tiny_model_dir)
    prompts = [make_prompt(proc, "What colour?", [solid((200, 0, 0))])]
    spec = SamplingSpec(n=1, temperature=0.0, top_p=1.0, top_k=-1, max_tokens=6)
    before = eng.generate(prompts, spec).response_ids
    free0 = torch.cuda.mem_get_info()[0]
    eng.sleep()
    assert torch.cuda.mem_get_info()[0] > free0, "sleep freed no GPU memory"
    eng.wake()
    assert eng.generate(prompts, spec).response_ids == before


def test_packed_forward_on_cuda_equals_the_padded_one_in_bf16(tiny_model_dir, tiny_processor):
    """``use_remove_padding=True`` on CUDA under bf16 autocast (flash-attention's varlen kernel where ``flash_attn`` is
    installed, the masked blocks otherwise): the same log-probs as the padded forward within bf16 precision, and
    gradients flow."""
    from transformers import AutoModelForImageTextToText
    from utils import make_prompt, noise, solid

    from vlmrl.models import forward, packing, qwen_vl
    from vlmrl.models.inputs import build_inputs, process_images, to_device
    from vlmrl.rollout.base import SamplingSpec
    from vlmrl.rollout.hf import HFRollout

    model = AutoModelForImageTextToText.from_pretrained(
        tiny_model_dir, dtype=torch.float32, attn_implementation=packing.VARLEN
    ).cuda()
    prompts = [
        make_prompt(tiny_processor, "What colour is the shape?", [solid((0, 200, 0))], 0),
        make_prompt(tiny_processor, "Two pictures here.", [noise(5), noise(6, (56, 112))], 1),
    ]
    rb = HFRollout(model.eval(), tiny_processor).generate(prompts, SamplingSpec(n=3, max_tokens=9))
    x = to_device(build_inputs(prompts, rb, process_images(tiny_processor, prompts), 0), "cuda")
    ids = qwen_vl.vision_token_ids(tiny_processor.tokenizer)
    out = {}
    for packed in (False, True):
        model.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            lp, _, extra = forward.response_logprobs(model.train(), x, ids, packed=packed)
        ((lp * x.response_mask).sum() + extra).backward()
        out[packed] = (
            lp.detach().float() * x.response_mask,
            sum(float(p.grad.abs().sum()) for p in model.parameters() if p.grad is not None),
        )
    gap = ((out[True][0] - out[False][0]).abs().sum() / x.response_mask.sum()).item()
    assert gap < 0.05, gap
    assert out[True][1] > 0 and abs(out[True][1] - out[False][1]) / out[False][1] < 0.05
