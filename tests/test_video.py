"""Video inputs in the model and the run: M-RoPE positions as vLLM computes them, engine-vs-trainer log-probs with vLLM
and HF on video and image+video prompts, the dummy vision pass on ranks without videos, what rewards see, and a tiny
training run that learns from video (preprocessing and the dataset: ``test_video_data.py``)."""

from __future__ import annotations

import datetime
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForImageTextToText
from utils import clip, expanded, noise, video_prompt

from runs import processes
from vlmrl.batch import RewardSample, RolloutBatch
from vlmrl.config import ActorRolloutRefConfig, RolloutConfig
from vlmrl.models import forward, qwen_vl
from vlmrl.models.inputs import build_inputs, process_images
from vlmrl.rollout.base import SamplingSpec
from vlmrl.rollout.hf import HFRollout

ROOT = Path(__file__).resolve().parents[1]


def lp_gap(model, processor, prompts, rb, fn=forward.shared_sample_logits) -> float:
    ids = qwen_vl.vision_token_ids(processor.tokenizer)
    x = build_inputs(prompts, rb, process_images(processor, prompts), processor.tokenizer.pad_token_id)
    with torch.no_grad():
        logits, extra = fn(model, x, ids)
        lp = forward.token_logprobs(logits, x.responses)
    assert float(extra) == 0.0
    return max(float((lp[i, : len(r)] - torch.tensor(r)).abs().max()) for i, r in enumerate(rb.logprobs) if r)


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    return AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def test_rope_index_is_transformers_for_images_and_vllm_for_videos(tiny_processor, hf_model):
    """qwen_vl.rope_index equals transformers' own positions on image prompts (left padding, two images), and on a
    video prompt starts the text after the video one past the video's largest position (temporal included), where
    transformers 5 starts it after the spatial extent only."""
    ids = qwen_vl.vision_token_ids(tiny_processor.tokenizer)
    prompts = [
        video_prompt(tiny_processor, "Two pictures.", [], 2.0, images=[noise(1), noise(2, (56, 112))]),
        video_prompt(tiny_processor, "One.", [], 2.0, images=[noise(3)]),
    ]
    rb = RolloutBatch(
        [expanded(tiny_processor, p) for p in prompts], [[5, 6], [7]], [[0.0] * 2, [0.0]], ["stop"] * 2, n=1
    )
    x = build_inputs(prompts, rb, process_images(tiny_processor, prompts), tiny_processor.tokenizer.pad_token_id)
    grid = torch.cat([im.image_grid_thw for im in x.images])
    mine = qwen_vl.rope_index(x.input_ids, x.attention_mask, ids, hf_model.config, grid)
    theirs = hf_model.model.get_rope_index(
        x.input_ids, qwen_vl.mm_token_type_ids(x.input_ids, ids), grid, attention_mask=x.attention_mask
    )[0]
    assert torch.equal(mine, theirs)

    p = video_prompt(tiny_processor, "What happens?", [clip(6)], fps=1.5)  # 3 temporal patches, 2 s each
    rb = RolloutBatch([expanded(tiny_processor, p)], [[5, 6]], [[0.0, 0.0]], ["stop"], n=1)
    x = build_inputs([p], rb, process_images(tiny_processor, [p]), tiny_processor.tokenizer.pad_token_id)
    v = x.images[0]
    pos = qwen_vl.rope_index(
        x.input_ids, x.attention_mask, ids, hf_model.config, None, v.video_grid_thw, v.second_per_grid_ts
    )
    pads = (x.input_ids[0] == ids.video_pad).nonzero().flatten()
    start, end = int(pads[0]), int(pads[-1])
    t_axis = pos[0, 0, start : end + 1].unique().tolist()
    s0 = int(pos[0, 0, start])
    assert [t - s0 for t in t_axis] == [0, 2, 5]  # trunc(k x 2 tokens/s x 1.333 s)
    assert int(pos[0, 0, end + 1]) == int(pos[:, 0, : end + 1].max()) + 1 == s0 + 6
    theirs = hf_model.model.get_rope_index(
        x.input_ids,
        qwen_vl.mm_token_type_ids(x.input_ids, ids),
        video_grid_thw=v.video_grid_thw,
        second_per_grid_ts=v.second_per_grid_ts,
        attention_mask=x.attention_mask,
    )[0]
    assert int(theirs[0, 0, end + 1]) < int(pos[0, 0, end + 1])  # why vlmrl builds its own


# ------------------------------------------------------------------------------------------- rollout vs trainer


@pytest.mark.vllm
def test_vllm_video_and_image_video_logprobs_match_the_trainer(tiny_model_dir, tiny_processor, hf_model):
    from vlmrl.rollout.vllm import VLLMRollout

    vp, ip = tiny_processor.video_processor, tiny_processor.image_processor
    engine = VLLMRollout(
        tiny_model_dir,
        rollout_cfg=RolloutConfig(),
        max_model_len=512,
        limit_images=1,
        limit_videos=1,
        pixel_bounds=qwen_vl.pixel_bounds(ip),
        video_pixel_bounds=qwen_vl.pixel_bounds(vp),
    )
    mm = engine.llm.llm_engine.vllm_config.model_config.multimodal_config
    assert mm.mm_processor_cache_gb == 0 and mm.get_limit_per_prompt("video") == 1
    prompts = [
        video_prompt(tiny_processor, "What happens?", [clip(6)], fps=1.5, index=0),
        video_prompt(tiny_processor, "Picture and clip.", [clip(5, (56, 56), 30)], 3.0, images=[noise(3)], index=1),
    ]
    rb = engine.generate(prompts, SamplingSpec(n=4, max_tokens=12, temperature=1.0))
    assert len({tuple(r) for r in rb.response_ids}) > 2
    for k, p in enumerate(prompts):  # the engine expanded the single pads as the processor does
        enc = tiny_processor(
            text=[p.prompt_text],
            images=p.images or None,
            videos=[v.frames for v in p.videos],
            videos_kwargs={
                "video_metadata": [
                    {
                        k: x
                        for k, x in qwen_vl.video_metadata(len(v.frames), v.sample_fps).items()
                        if k != "do_sample_frames"
                    }
                    for v in p.videos
                ],
                "do_sample_frames": False,
                "cap_pixels_per_frame": False,
            },
            return_tensors="pt",
        )
        assert rb.prompt_ids[4 * k] == enc["input_ids"][0].tolist()
    for fn in (forward.shared_sample_logits, forward.full_sequence_logits):
        gap = lp_gap(hf_model, tiny_processor, prompts, rb, fn)
        print(f"{fn.__name__}: max |lp_vllm - lp_trainer| = {gap:.2e}")
        assert gap <= 1e-4
    # the same forward with transformers' own M-RoPE positions after the video disagrees: the check above can fail
    ids = qwen_vl.vision_token_ids(tiny_processor.tokenizer)
    x = build_inputs(
        prompts[:1],
        rb.select_groups([0]),
        process_images(tiny_processor, prompts[:1]),
        tiny_processor.tokenizer.pad_token_id,
    )
    v = x.images[0]
    with torch.no_grad():
        logits = hf_model(
            input_ids=x.input_ids,
            attention_mask=x.attention_mask,
            mm_token_type_ids=qwen_vl.mm_token_type_ids(x.input_ids, ids),
            pixel_values_videos=v.pixel_values_videos.repeat(4, 1),
            video_grid_thw=v.video_grid_thw.repeat(4, 1),
            second_per_grid_ts=v.second_per_grid_ts.repeat(4),
        ).logits
    R = x.responses.shape[1]
    lp = torch.log_softmax(logits[:, -R - 1 : -1].float(), -1).gather(-1, x.responses[..., None]).squeeze(-1)
    wrong = max(float((lp[i, : len(r)] - torch.tensor(r)).abs().max()) for i, r in enumerate(rb.logprobs[:4]))
    assert wrong > 1e-4, wrong


def test_hf_rollout_on_video_matches_the_trainer(tiny_processor, hf_model):
    torch.manual_seed(4)
    prompts = [
        video_prompt(tiny_processor, "What happens?", [clip(6)], fps=1.5, index=0),
        video_prompt(tiny_processor, "Picture and clip.", [clip(4, (56, 112), 20)], 3.0, images=[noise(3)], index=1),
        video_prompt(tiny_processor, "Text only: say hi.", [], 2.0, index=2),
    ]
    rb = HFRollout(hf_model, tiny_processor).generate(prompts, SamplingSpec(n=3, max_tokens=10))
    assert len(rb) == 9 and all(rb.response_ids)
    vpad = qwen_vl.vision_token_ids(tiny_processor.tokenizer).video_pad
    assert rb.prompt_ids[0].count(vpad) == 3 * 6 and rb.prompt_ids[3].count(vpad) == 2 * 8
    for fn in (forward.shared_sample_logits, forward.full_sequence_logits):
        assert lp_gap(hf_model, tiny_processor, prompts, rb, fn) <= 1e-5


# ------------------------------------------------------------------------------------- ranks without videos


def _update_rank(rank: int, world: int, rendezvous: str, model_dir: str, groups: list[int], out: dict) -> None:
    import torch.distributed as dist
    from transformers import AutoProcessor

    from vlmrl.workers.policy import PolicyWorker

    # a collective the other rank never joins fails in a minute instead of hanging the test
    dist.init_process_group(
        "gloo", init_method=rendezvous, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60)
    )
    proc = AutoProcessor.from_pretrained(model_dir)
    every = [
        video_prompt(proc, "What happens?", [clip(6)], fps=1.5, index=0),  # the video group
        video_prompt(proc, "Text only, no video.", [], 2.0, index=1),  # the group without one
    ]
    prompts = [every[g] for g in groups]
    n = 4
    resp = [[10 + (3 * g + k) % 7, 20 + k, 30] for g in groups for k in range(n)]
    rb = RolloutBatch(
        [expanded(proc, p) for p in prompts for _ in range(n)],
        resp,
        [[0.0] * 3] * len(resp),
        ["length"] * len(resp),
        n=n,
    )
    x = build_inputs(prompts, rb, process_images(proc, prompts), proc.tokenizer.pad_token_id)
    arr = ActorRolloutRefConfig()
    arr.model.path = model_dir
    arr.model.enable_gradient_checkpointing = False
    arr.actor.optim.lr = 1e-2
    torch.manual_seed(0)
    ids = qwen_vl.vision_token_ids(proc.tokenizer)
    worker = PolicyWorker(arr, device="cpu", total_steps=2, vision_ids=ids, seed=1, max_response_length=3)
    adv = torch.tensor([1.0, -0.5, 0.25, 0.8] * len(groups))
    before = worker.logprobs(x)
    metrics = worker.update(x, adv, len(resp))
    out[(world, rank)] = {
        "before": before,
        "after": worker.logprobs(x),
        "grad_norm": metrics["actor/grad_norm"],
        "pg_loss": metrics["actor/pg_loss"],
        "pushed": sorted(name for name, _ in worker.engine_weights()),
    }
    dist.destroy_process_group()


def test_ranks_without_videos_run_the_dummy_vision_pass_and_train_alike(tiny_model_dir, tmp_path):
    """Two FSDP ranks, one with the video group and one with a text-only group (no video: the dummy vision pass keeps
    its collectives in step, in the same order), update exactly as one rank holding both: same loss, gradient norm
    and log-probs after the update. Before the fix this hung: the text-only rank reduce-scattered the root's
    gradients after the tower's, the video rank before."""
    ctx = processes()
    with ctx.Manager() as manager:
        out = manager.dict()
        runs = [(2, [[0], [1]]), (1, [[0, 1]])]
        for world, shards in runs:
            rdv = f"file://{tmp_path / f'rdv{world}'}"
            procs = [
                ctx.Process(target=_update_rank, args=(r, world, rdv, str(tiny_model_dir), shards[r], out))
                for r in range(world)
            ]
            for p in procs:
                p.start()
            for p in procs:
                p.join(240)
            assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
        results = dict(out)
    one, r0, r1 = results[(1, 0)], results[(2, 0)], results[(2, 1)]
    assert one["grad_norm"] > 1e-3 and abs(r0["grad_norm"] - one["grad_norm"]) <= 1e-5 * one["grad_norm"]
    assert abs(one["pg_loss"]) > 1e-2  # the workers' mean is the run's metric: each rank's part x world, averaged
    assert r0["grad_norm"] == r1["grad_norm"] and abs((r0["pg_loss"] + r1["pg_loss"]) / 2 - one["pg_loss"]) <= 1e-6
    both = torch.cat([r0["after"], r1["after"]])
    moved = float((one["after"] - one["before"]).abs().max())
    gap = float((both - one["after"][:, : both.shape[1]]).abs().max())
    assert moved > 1e-2 and gap <= 1e-4, (moved, gap)
    assert any("visual" in k for k in one["pushed"])


def test_a_video_less_micro_batch_runs_the_dummy_pass_with_the_same_loss(tiny_processor, tiny_model_dir):
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32)
    ids = qwen_vl.vision_token_ids(tiny_processor.tokenizer)
    p = video_prompt(tiny_processor, "Text only.", [], 2.0)
    rb = RolloutBatch([expanded(tiny_processor, p)], [[10, 11, 12]], [[0.0] * 3], ["length"], n=1)
    x = build_inputs([p], rb, process_images(tiny_processor, [p]), tiny_processor.tokenizer.pad_token_id)
    lp, _, extra = forward.response_logprobs(model, x, ids)
    assert float(extra.detach()) == 0.0 and extra.requires_grad
    (-(lp.sum()) + extra).backward()
    grads = [q.grad for q in qwen_vl.vision_tower(model).parameters()]
    assert all(g is not None and float(g.abs().sum()) == 0.0 for g in grads)  # reached, and exactly zero


# ------------------------------------------------------------------------------------------------------ rewards


def test_rewards_receive_the_frames_and_timestamps_the_model_saw(tiny_processor, tmp_path):
    from vlmrl.config import RewardConfig
    from vlmrl.scoring import RewardManager

    p = video_prompt(tiny_processor, "Which colour comes second?", [clip(5, (56, 56), 40)], fps=2.5)
    rb = RolloutBatch([p.prompt_ids] * 2, [[10], [11]], [[0.0], [0.0]], ["stop"] * 2, n=2)
    samples = RewardSample.of_rollout([p], rb, tiny_processor.tokenizer, 8)
    (v,) = samples[0].videos
    assert v.frames is p.videos[0].frames and len(v.frames) == 6 and v.frames[0].size == (56, 56)
    assert v.timestamps == [0.0, 0.4, 0.8, 1.2, 1.6, 1.6] and v.sample_fps == 2.5
    fn = tmp_path / "seen.py"
    fn.write_text(
        "def seen(sample):\n"
        "    v = sample.videos[0]\n"
        "    return {'score': float(len(v.frames)) + v.timestamps[-1], 'width': float(v.frames[0].width)}\n"
    )
    with RewardManager(RewardConfig(function=f"{fn}:seen", num_workers=1)) as rm:  # in a worker process
        out = rm.score(samples)
    assert out.scores == [pytest.approx(7.6)] * 2


# ------------------------------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def video_colour_data(tmp_path_factory) -> Path:
    """The video colour task (1024 training and 48 held-out videos of 112 px), made once for both families."""
    from vlmrl.preprocess import synthetic

    data = tmp_path_factory.mktemp("video_colour")
    synthetic.main(
        [
            "--output-dir",
            str(data),
            "--families",
            "video_colour",
            "--image-size",
            "112",
            "--train-size",
            "1024",
            "--test-size",
            "48",
            "--seed",
            "0",
            "--no-progress",
        ]
    )
    return data


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen2_5_vl"])
def test_training_on_the_video_colour_family_learns_with_vllm(tiny_model_dir, video_colour_data, tmp_path, family):
    """The video colour task learns (validation >= 0.9 after 70 steps) with the tiny Qwen2.5-VL: the video feature's
    one end-to-end learning run. (Qwen3-VL's video path, its frames behind text timestamps, is checked exactly in
    tests/test_families.py, and its learning on images by the Qwen3-VL quick start; benchmarks/bench_families.py
    measures its video learning.)"""
    from runs import base_args, metrics, run_here
    from vlmrl.testing.tiny import FAMILY_SPECS, ensure_tiny_model

    model = tiny_model_dir if family == "qwen2_5_vl" else str(ensure_tiny_model(0, FAMILY_SPECS[family]))

    data = video_colour_data
    out = tmp_path / "run"
    run = run_here(base_args(model, data, out, "trainer.total_training_steps=70", "trainer.test_freq=70"), timeout=900)
    assert "videos/prompt 1" in run.output()
    rows = metrics(out)
    val = {r["step"]: r["val/reward/mean"] for r in rows if "val/reward/mean" in r}
    assert val[0] <= 0.2 and val[70] >= 0.9, val
    train = [r for r in rows if "reward/mean" in r and r.get("step", 0) > 0]
    # the sampled reward (temperature 1, an entropy bonus) rises too; a single step's batch is noisy (one of the last
    # 5 steps' was 0.47 in a run whose greedy validation reached 0.9), so 10-step means
    early, late = (np.mean([r["reward/mean"] for r in part]) for part in (train[:10], train[-10:]))
    assert late >= early + 0.3, (early, late)
    assert max(r["rollout/logprob_diff"] for r in train) < 1e-3  # the engine and the trainer agree after every push
