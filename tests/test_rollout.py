"""Rollout engines on the tiny model: vLLM (CPU build, for real) and HF generate."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForImageTextToText
from utils import make_prompt, noise, solid

from vlmrl.config import RolloutConfig
from vlmrl.models import qwen_vl
from vlmrl.models.forward import response_logprobs
from vlmrl.models.inputs import build_inputs, process_images
from vlmrl.rollout.base import SamplingSpec
from vlmrl.rollout.hf import HFRollout

pytestmark = pytest.mark.vllm

GREEDY = SamplingSpec(n=1, max_tokens=12, greedy=True)


def _engine(path: str, limit_images: int = 2):
    from vlmrl.rollout.vllm import VLLMRollout

    return VLLMRollout(path, rollout_cfg=RolloutConfig(), max_model_len=512, limit_images=limit_images)


def _hf_logprob_gap(model, processor, prompts, rb) -> float:
    ids = qwen_vl.vision_token_ids(processor.tokenizer)
    x = build_inputs(prompts, rb, process_images(processor, prompts), processor.tokenizer.pad_token_id)
    with torch.no_grad():
        lp, _, _ = response_logprobs(model, x, ids)
    return max(float((lp[i, : len(r)] - torch.tensor(r)).abs().max()) for i, r in enumerate(rb.logprobs) if r)


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return _engine(tiny_model_dir)


@pytest.fixture(scope="module")
def hf(tiny_model_dir):
    return AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def test_translate_engine_kwargs_maps_verl_cache_flag_and_rejects_unknown():
    from vlmrl.rollout.vllm import default_cache_off, translate_engine_kwargs

    assert translate_engine_kwargs({"disable_mm_preprocessor_cache": True}) == {"mm_processor_cache_gb": 0}
    assert default_cache_off() == {"mm_processor_cache_gb": 0}
    assert translate_engine_kwargs({"enable_prefix_caching": False}) == {"enable_prefix_caching": False}
    with pytest.raises(ValueError, match="enable_prefix_caching"):
        translate_engine_kwargs({"enable_prefix_cachin": True})


def test_engine_runs_with_preprocessor_cache_off(engine):
    cfg = engine.llm.llm_engine.vllm_config.model_config.multimodal_config
    assert cfg.mm_processor_cache_gb == 0


def test_the_cpu_engine_counts_token_ranks_without_compiling(engine):
    """On CPU the sampler's rank count (vLLM compiles it through inductor: seconds of each engine's first generate)
    runs eagerly: the same counts, ties and -inf included."""
    from vllm.v1.sample import sampler
    from vllm.v1.sample.ops import logprobs

    from vlmrl.rollout.vllm import _count_at_least

    assert sampler.batched_count_greater_than is _count_at_least is logprobs.batched_count_greater_than
    x = torch.tensor([[0.0, -1.0, 2.0, float("-inf")], [3.0, 3.0, 3.0, 1.0], [-5.0, -4.0, -3.0, -2.0]])
    values = torch.tensor([[0.0], [3.0], [float("-inf")]])
    expected = [sum(int(v >= row_v) for v in row) for row, row_v in zip(x.tolist(), values[:, 0].tolist())]
    assert _count_at_least(x, values).tolist() == expected == [2, 3, 4]
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=4, temperature=0.0, logprobs=0, seed=0)
    out = engine.llm.generate(["a red"], params, use_tqdm=False)[0].outputs[0]
    assert [next(iter(lp.values())).rank for lp in out.logprobs] == [1] * len(out.token_ids)  # greedy: rank 1


def test_n_samples_with_one_and_two_images_match_hf_forward(engine, hf, tiny_processor):
    prompts = [
        make_prompt(tiny_processor, "What colour?", [solid((0, 0, 255))], 0),
        make_prompt(tiny_processor, "Which picture is brighter?", [noise(1), noise(2, (56, 112))], 1),
    ]
    rb = engine.generate(prompts, SamplingSpec(n=3, max_tokens=10))
    assert len(rb) == 6 and rb.n == 3
    pad = qwen_vl.vision_token_ids(tiny_processor.tokenizer).image_pad
    enc = tiny_processor(text=[prompts[1].prompt_text], images=prompts[1].images, return_tensors="pt")
    assert rb.prompt_ids[3] == enc["input_ids"][0].tolist()
    assert rb.prompt_ids[3].count(pad) == sum(qwen_vl.tokens_per_image(enc["image_grid_thw"], 2))
    assert set(rb.finish_reasons) <= {"stop", "length"}
    assert all(len(lp) == len(r) for lp, r in zip(rb.logprobs, rb.response_ids))
    gap = _hf_logprob_gap(hf, tiny_processor, prompts, rb)
    print(f"two-image prompt: max |lp_vllm - lp_hf| = {gap:.2e}")
    assert gap <= 1e-4


def test_a_groups_samples_share_their_prompts_kv_on_cpu(engine, tiny_processor):
    """The CPU engine's KV blocks are 32 tokens (``CPU_BLOCK_SIZE``; vLLM's CPU default 128 would hold no whole
    block of a short prompt): samples of one prompt that start together prefill its whole blocks once between them,
    each recomputing less than one block; ``engine_kwargs.vllm.block_size`` overrides the size."""
    from vllm import SamplingParams

    from vlmrl.rollout.vllm import CPU_BLOCK_SIZE, engine_args

    assert engine.llm.llm_engine.vllm_config.cache_config.block_size == CPU_BLOCK_SIZE == 32
    prompt = make_prompt(tiny_processor, "What colour is this picture, in one word?", [noise(3, (112, 84))], 0)
    assert len(prompt.prompt_ids) > CPU_BLOCK_SIZE
    engine.reset_caches()
    params = SamplingParams(n=1, max_tokens=2, logprobs=0)
    req = {"prompt_token_ids": list(prompt.prompt_ids), "multi_modal_data": {"image": prompt.images[0]}}
    outs = engine.llm.generate([req] * 6, params, use_tqdm=False)  # six samples that start together
    full = len(outs[0].prompt_token_ids)
    cached = sum(o.num_cached_tokens for o in outs)
    assert cached >= 5 * (full // CPU_BLOCK_SIZE * CPU_BLOCK_SIZE) > 0, (cached, full)
    args = dict(max_model_len=512, limit_images=1, limit_videos=0, seed=0, distributed=False)
    more = dict(tensor_parallel_size=1, trust_remote_code=False, pixel_bounds=None, video_pixel_bounds=None)
    cfg = RolloutConfig(engine_kwargs={"vllm": {"block_size": 64}})
    assert engine_args("m", cfg, device="cpu", **args, **more)["block_size"] == 64
    assert "block_size" not in engine_args("m", RolloutConfig(), device="cuda", **args, **more)


def test_greedy_hf_and_vllm_agree(engine, hf, tiny_processor):
    prompts = [make_prompt(tiny_processor, "Name the colour.", [solid((200, 30, 30))], i) for i in range(2)]
    prompts.append(make_prompt(tiny_processor, "Text only prompt.", [], 2))
    a = engine.generate(prompts, GREEDY)
    b = HFRollout(hf, tiny_processor).generate(prompts, GREEDY)
    assert a.response_ids == b.response_ids
    assert a.prompt_ids == b.prompt_ids


def _push(engine, model) -> float:
    return engine.update_weights((qwen_vl.engine_weight_name(n), p.detach()) for n, p in model.named_parameters())


def test_image_pad_is_never_generated_even_when_the_model_prefers_it(engine, tiny_model_dir, tiny_processor):
    """Weights whose head strongly prefers vision tokens still never sample one (logit bias / suppress_tokens)."""
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    original = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32)
    ids = qwen_vl.vision_token_ids(tiny_processor.tokenizer)
    with torch.no_grad():
        for t in ids.never_sample:
            model.lm_head.weight[t] = 3.0  # a huge logit for these ids at every position
    p = make_prompt(tiny_processor, "Hi", [solid((0, 255, 0))])
    with torch.no_grad():  # unconstrained, the model's greedy choice is a vision token
        enc = tiny_processor(text=[p.prompt_text], images=p.images, return_tensors="pt")
        assert model(**enc).logits[0, -1].argmax().item() in ids.never_sample
    hf_rb = HFRollout(model, tiny_processor).generate([p], SamplingSpec(n=4, max_tokens=8))
    try:
        _push(engine, model)
        v_rb = engine.generate([p], SamplingSpec(n=4, max_tokens=8))
    finally:
        _push(engine, original)
    for rb in (hf_rb, v_rb):
        flat = [t for r in rb.response_ids for t in r]
        assert flat and not set(flat) & set(ids.never_sample)


def test_weight_push_equals_fresh_weights_including_cache_traps(engine, tiny_model_dir, tiny_processor):
    """After pushes (LM change, then vision-only change) with the SAME prompt and image repeated, the running engine
    behaves exactly like the pushed weights: greedy samples equal HF generate on those weights and log-probs equal an
    HF forward (a fresh vLLM engine equals HF to ~5e-7, see test_models). Stale prefix KV or image features would
    show here."""
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    original = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32)
    prompt = make_prompt(tiny_processor, "What colour is the shape?", [noise(11)], 0)
    before = engine.generate([prompt], GREEDY)  # fills prefix + encoder caches with the old weights

    def perturb(pred, scale):
        g = torch.Generator().manual_seed(7)
        with torch.no_grad():
            for n, p in model.named_parameters():
                if pred(n):
                    p.add_(torch.randn(p.shape, generator=g) * scale * (p.std() if p.numel() > 1 else 1.0))

    pushed = []
    try:
        for pred, scale in ((lambda n: "visual" not in n, 0.5), (lambda n: "visual" in n, 2.0)):
            perturb(pred, scale)
            assert _push(engine, model) > 0
            got = engine.generate([prompt], GREEDY)
            sampled = engine.generate([prompt], SamplingSpec(n=4, max_tokens=12))
            ref = HFRollout(model, tiny_processor).generate([prompt], GREEDY)
            assert got.response_ids == ref.response_ids
            assert _hf_logprob_gap(model, tiny_processor, [prompt], got) <= 1e-4
            assert _hf_logprob_gap(model, tiny_processor, [prompt], sampled) <= 1e-4
            pushed.append(got)
    finally:
        _push(engine, original)
    assert pushed[0].logprobs != before.logprobs, "the push changed nothing"
    assert pushed[1].logprobs != pushed[0].logprobs, "the vision-only push was not seen (stale encoder cache)"


def test_the_preprocessor_cache_cannot_be_turned_back_on() -> None:
    """README: vlmrl always runs vLLM with its multimodal preprocessor cache off (it grows host memory without bound
    across RL steps); an engine kwarg that would turn it on is refused when the config is composed."""
    from vlmrl.config import ConfigError, load

    base = ["data.train_files=x", "actor_rollout_ref.model.path=m"]
    for kw in ("disable_mm_preprocessor_cache=False", "mm_processor_cache_gb=4"):
        with pytest.raises(ConfigError, match="keeps vLLM's multimodal preprocessor cache off"):
            load([*base, f"+actor_rollout_ref.rollout.engine_kwargs.vllm.{kw}"])
    ok = load([*base, "+actor_rollout_ref.rollout.engine_kwargs.vllm.disable_mm_preprocessor_cache=True"])
    assert ok.actor_rollout_ref.rollout.engine_kwargs["vllm"] == {"disable_mm_preprocessor_cache": True}


def test_direct_cpu_push_equals_vllms_reload_bit_for_bit(engine, tiny_model_dir, tiny_processor):
    """The CPU engine takes pushes straight into its layers (cpu_reload.direct_reload); the result is exactly what
    vLLM's own ``reload_weights`` gives for the same weights: the same greedy tokens and the same log-probs, to the
    bit, on sampled and greedy runs; pushing the original weights back restores the original outputs exactly."""
    from vlmrl.rollout.cpu_reload import direct_reload

    assert engine.direct_push_unsupported is None  # the CPU engine uses the direct path
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    original = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.3 * (p.std() if p.numel() > 1 else 1.0))
    prompts = [make_prompt(tiny_processor, "What colour is the shape?", [noise(5)], 0)]
    prompts.append(make_prompt(tiny_processor, "Which picture is brighter?", [noise(6), noise(7, (56, 112))], 1))

    def weights(m):
        return [(qwen_vl.engine_weight_name(n), p.detach().clone()) for n, p in m.named_parameters()]

    def outputs():
        torch.manual_seed(0)  # vLLM samples from this process's generator
        sampled = engine.generate(prompts, SamplingSpec(n=3, max_tokens=10))
        greedy = engine.generate(prompts, GREEDY)
        return sampled.response_ids, sampled.logprobs, greedy.response_ids, greedy.logprobs

    base = outputs()
    try:
        engine.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights(model))})
        engine.reset_caches()
        by_vllm = outputs()
        _push(engine, original)
        assert outputs() == base
        assert _push(engine, model) > 0
        assert outputs() == by_vllm
        assert by_vllm != base
        with pytest.raises(RuntimeError, match="got no weights from the trainer"):
            engine.llm.collective_rpc(direct_reload, args=(iter(weights(model)[1:]),))
    finally:
        _push(engine, original)
    assert outputs() == base


def _per_token_logprobs(model, processor, prompts, rb) -> list[torch.Tensor]:
    """The trainer's log-prob of every response token (one row per sample)."""
    ids = qwen_vl.vision_token_ids(processor.tokenizer)
    x = build_inputs(prompts, rb, process_images(processor, prompts), processor.tokenizer.pad_token_id)
    with torch.no_grad():
        lp, _, _ = response_logprobs(model, x, ids)
    return [lp[i, : len(r)] for i, r in enumerate(rb.response_ids)]


def test_a_streamed_group_continues_across_a_weight_push_with_each_tokens_own_logprob(
    engine, tiny_model_dir, tiny_processor
):
    """Partial rollouts (``async_training.partial_rollout``): groups streamed into the running engine are interrupted
    after a few engine steps, the engine takes new weights, and every sample continues from where it stopped. Each
    token's log-prob is the one of the weights that generated it (the old weights' before the push, the new ones'
    after: both equal the trainer's forward on those weights), the tokens carry their version, the groups come back
    whole, and nothing stays in the engine."""
    from vlmrl.rollout.stream import PromptStream, StreamItem

    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    original = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    prompts = [
        make_prompt(tiny_processor, "What colour is the shape?", [noise(3)], 0),
        make_prompt(tiny_processor, "Two of them?", [noise(4, (56, 84)), solid((200, 0, 0))], 1),
        make_prompt(tiny_processor, "No image at all", [], 2),
    ]
    stream = PromptStream(engine, SamplingSpec(n=2, max_tokens=24, ignore_eos=True))
    stream.add([StreamItem(g, p, seed=10 + g) for g, p in enumerate(prompts)], version=0)
    early = stream.step(3)  # the prefill and two decode steps: nothing is done yet
    assert early == [] and stream.unfinished == 6
    assert stream.interrupt() == 6 and not engine.llm.llm_engine.has_unfinished_requests()
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "visual" not in n:
                p.add_(torch.randn(p.shape, generator=g) * 0.3 * (p.std() if p.numel() > 1 else 1.0))
    try:
        _push(engine, model)
        assert stream.resume(version=1) == 6
        done = []
        while stream.unfinished:
            done += stream.step(4)
    finally:
        _push(engine, original)
    assert sorted(d.gid for d in done) == [0, 1, 2] and not stream.groups
    assert not engine.llm.llm_engine.has_unfinished_requests()
    for d in done:
        p = prompts[d.gid]
        rb = d.rollout
        assert rb.n == 2 and len(rb) == 2 and d.interrupted == 2
        assert d.min_version == 0 and d.max_version == 1
        old = _per_token_logprobs(original, tiny_processor, [p], rb)
        new = _per_token_logprobs(model, tiny_processor, [p], rb)
        for k in range(2):
            v = torch.tensor(d.versions[k])
            assert len(rb.response_ids[k]) == 24 == len(v) and 0 < int((v == 0).sum()) < 24
            want = torch.where(v == 0, old[k], new[k])
            assert float((want - torch.tensor(rb.logprobs[k])).abs().max()) <= 1e-4
            # the other weights' log-probs differ: each token's own version is what matched
            assert float((torch.where(v == 0, new[k], old[k]) - want).abs().max()) > 1e-3


def test_a_cpu_engine_groups_shared_memory_names_are_removed_once_mapped(tmp_path) -> None:
    """A tensor-parallel CPU engine's segments (``<group name>_<rank>``) lose their names once every rank mapped them
    (``vllm._unlink_group_shm``, run after vLLM's set-up barrier): a killed run leaves nothing in /dev/shm. Only that
    group's names go: another run's group, whose name this one's starts, stays."""
    from vlmrl.rollout.vllm import _unlink_group_shm

    group = "vlmrl-0123456789-tp:0-[0-1]-cpushm"
    for name in (f"{group}_0", f"{group}_1", f"{group}_x", f"{group}-other_0", "vlmrl-9-tp:0-[0-1]-cpushm_0"):
        (tmp_path / name).write_bytes(b"\0")
    assert sorted(_unlink_group_shm(group, str(tmp_path))) == [f"{group}_0", f"{group}_1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"{group}_x", f"{group}-other_0", "vlmrl-9-tp:0-[0-1]-cpushm_0"]
    )
    assert _unlink_group_shm(group, str(tmp_path)) == []  # already gone: nothing to do, no error
