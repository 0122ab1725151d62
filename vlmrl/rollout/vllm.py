"""Qwen2.5-VL rollouts on an in-process vLLM engine: token-in prompts with images and videos, weight push, sleep/wake.

The engine core runs in the worker's own process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) next to the FSDP2 policy.
Its multimodal preprocessor cache is off for every modality, videos included (it grows host memory without bound
across RL steps: EasyR1 #159, vLLM #12973). A video goes in as its already sampled and resized frames with metadata
that makes the engine sample nothing again and derive the trainer's ``second_per_grid_ts``; the image and video
processors get their own pixel bounds (a flat ``size`` would resize the frames with the images' bounds). After a
weight push the prefix cache AND the engine-level encoder cache are reset: skipping either makes the engine reuse
stale KV / image features (wrong log-probs, or an ``Encoder cache miss`` followed by a spin).
"""

from __future__ import annotations

import dataclasses
import difflib
import gc
import os
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from vlmrl.batch import PromptSample, RolloutBatch
from vlmrl.config.checks import cache_kept_on
from vlmrl.models.inputs import VIDEO_AS_GIVEN
from vlmrl.models.qwen_vl import video_metadata, vision_token_ids
from vlmrl.rollout.base import SamplingSpec, TurnOutput, TurnRequest
from vlmrl.rollout.cpu_reload import direct_reload, repack_cpu_experts, unsupported_reason
from vlmrl.timing import Timer

# a bias no real logit survives; the engine applies it to raw logits before sampling
_NEVER = -1.0e4


def set_engine_env(on_cpu: bool) -> None:
    """Environment vLLM reads at import/engine start: in-process engine core; small KV cache on shared CPUs."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if on_cpu:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


def _count_at_least(x: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """vLLM's ``batched_count_greater_than`` (how many entries of each row of ``x`` are >= that row's value: a token's
    rank among the log-probs), run eagerly."""
    return (x >= values).sum(-1)


def skip_rank_compile() -> None:
    """On CPU: vLLM's sampler counts each returned token's rank with a one-line function it compiles through inductor
    (a C++ build: ~4 s of every engine's first generate on 2 cores, and a recompile when a batch of one comes). The
    same count eagerly is one comparison and a sum, the same integers. A vLLM without the function is left as it is."""
    from vllm.v1.sample import sampler
    from vllm.v1.sample.ops import logprobs

    for module in (logprobs, sampler):
        if hasattr(module, "batched_count_greater_than"):
            module.batched_count_greater_than = _count_at_least


_SHM_RUN = ""
"""This run's part of the names of the CPU engines' shared-memory segments (:func:`per_run_shm_names`)."""


def _shm_group_name(communicator: Any) -> str:
    """vLLM's name for a CPU engine group's shared memory (the group's name and ranks), with this run's token."""
    ranks = "-".join(str(r) for r in communicator.ranks)
    return f"vlmrl-{_SHM_RUN}-{communicator.unique_name}-[{ranks}]-cpushm"


def per_run_shm_names() -> None:
    """On CPU the ranks of a tensor-parallel engine meet in shared memory (/dev/shm) under a name vLLM builds from
    the distributed init method, which inside the trainer's process group (``env://``) is the same for every run:
    two runs on one machine would share the segments, and those a killed run leaves behind stop every later
    tensor-parallel engine on the machine from starting ("create shm in SHMManager failed. errno: 17"). The names get
    a token rank 0 draws and broadcasts over the trainer's process group: the same on every rank, new each run. Once
    every rank of a group has mapped the group's segments, their names are removed (:func:`_unlink_group_shm`): the
    memory lives on while mapped and goes with the last process that maps it, however the run ends (vLLM's own
    clean-up runs at a normal interpreter exit only, which worker processes do not take). Called by every rank (a
    collective)."""
    global _SHM_RUN
    import secrets

    import torch.distributed as dist
    from vllm.distributed.device_communicators import cpu_communicator

    token = torch.tensor([secrets.randbits(40) if dist.get_rank() == 0 else 0], dtype=torch.int64)
    dist.broadcast(token, src=0)
    _SHM_RUN = f"{int(token):010x}"
    shm = getattr(cpu_communicator, "_CPUSHMDistributed", None)
    if shm is not None and hasattr(shm, "make_group_name"):
        shm.make_group_name = staticmethod(_shm_group_name)
    init = getattr(shm, "_init_cpu_shm", None)
    if init is not None and not getattr(init, "vlmrl_unlinks", False):

        def init_then_unlink(self: Any) -> int:
            handle = init(self)  # ends with a barrier of the group: every rank has mapped every segment
            _unlink_group_shm(self.group_name)
            return handle

        init_then_unlink.vlmrl_unlinks = True  # type: ignore[attr-defined]
        shm._init_cpu_shm = init_then_unlink


def _unlink_group_shm(group_name: str, folder: str = "/dev/shm") -> list[str]:
    """Remove the names of a CPU engine group's shared-memory segments (``<group name>_<rank>``, one per rank; any
    rank may remove all: a name already gone is skipped); the names removed."""
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        if name.startswith(f"{group_name}_") and name[len(group_name) + 1 :].isdigit():
            try:
                os.unlink(os.path.join(folder, name))
                removed.append(name)
            except FileNotFoundError:
                pass
    return removed


def translate_engine_kwargs(user: dict[str, Any]) -> dict[str, Any]:
    """Map user engine kwargs (``engine_kwargs.vllm.*``) to what the installed vLLM accepts.

    verl's ``disable_mm_preprocessor_cache=True`` becomes ``mm_processor_cache_gb=0`` where the engine no longer has the
    old argument (decided by inspecting ``EngineArgs``, not by version). An unknown argument is an error naming the
    nearest valid one.
    """
    from vllm import EngineArgs

    valid = {f.name for f in dataclasses.fields(EngineArgs)}
    out: dict[str, Any] = {}
    problem = cache_kept_on(user or {})
    if problem:
        raise ValueError(problem)
    for key, value in (user or {}).items():
        if key == "disable_mm_preprocessor_cache" and key not in valid:
            if "mm_processor_cache_gb" in valid:
                out["mm_processor_cache_gb"] = 0 if value else 4
                continue
        if key not in valid:
            near = difflib.get_close_matches(key, sorted(valid), n=1)
            hint = f" Did you mean '{near[0]}'?" if near else ""
            raise ValueError(f"actor_rollout_ref.rollout.engine_kwargs.vllm.{key}: not an argument of vLLM.{hint}")
        out[key] = value
    return out


def default_cache_off() -> dict[str, Any]:
    """Engine kwargs that turn the multimodal preprocessor cache off in the installed vLLM."""
    return translate_engine_kwargs({"disable_mm_preprocessor_cache": True})


def _mm_processor_kwargs(
    limit_videos: int,
    pixel_bounds: tuple[int, int] | None,
    video_pixel_bounds: tuple[int, int] | None,
    frames: int = 1,
) -> dict[str, Any] | None:
    """The engine's multimodal processor sizes: the data's pixel bounds (per modality when videos come); an image's
    area bounds times the ``frames`` its processor counts an image as (``Family.pixel_frames``)."""
    if pixel_bounds is not None:
        pixel_bounds = (pixel_bounds[0] * frames, pixel_bounds[1] * frames)
    if limit_videos > 0:
        # per modality: vLLM drops a flat ``size`` that a scope also sets, and a flat ``size`` alone resizes the
        # frames with the images' bounds (both seen: 32 video tokens instead of 128, or the images' size lost)
        # frames come sampled and resized already: the engine's video processor takes them as they are, as the
        # trainer's does (Qwen3-VL's would resize them again: it bounds a whole video's pixels)
        mm: dict[str, Any] = {"videos_kwargs": {k: v for k, v in VIDEO_AS_GIVEN.items() if k != "do_sample_frames"}}
        if pixel_bounds is not None:
            mm["images_kwargs"] = {"size": {"shortest_edge": pixel_bounds[0], "longest_edge": pixel_bounds[1]}}
        if video_pixel_bounds is not None:
            mm["videos_kwargs"]["size"] = {
                "shortest_edge": video_pixel_bounds[0],
                "longest_edge": video_pixel_bounds[1],
            }
        return mm
    if pixel_bounds is not None:  # the engine's processor resizes with the data's bounds (a no-op on our images)
        lo, hi = pixel_bounds
        return {"size": {"shortest_edge": lo, "longest_edge": hi}}
    return None


def refuse_on_cpu(model_path: str, trust_remote_code: bool = False) -> None:
    """A ValueError for a model whose family vLLM's CPU attention cannot run as transformers does: Gemma 3's image
    tokens attend to each other both ways (vLLM's ``mm_prefix``, which its CPU backend lacks: it would attend
    causally without a word, and sample from other log-probs than the trainer's)."""
    from transformers import AutoConfig

    from vlmrl.models.families import family_of

    fam = family_of(AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code))
    if fam.bidirectional_images:
        raise ValueError(
            f"{model_path}: {fam.label}'s image tokens attend to each other both ways, which vLLM's CPU attention "
            "does not do (it would attend causally, and its log-probs would not be the trainer's); on CPU roll "
            f"{fam.label} out with actor_rollout_ref.rollout.name=hf."
        )


def _pixel_frames(model_path: str, trust_remote_code: bool) -> int:
    """The frames the model's family's image processor counts an image as (``Family.pixel_frames``)."""
    from transformers import AutoConfig

    from vlmrl.models.families import family_of

    return family_of(AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)).pixel_frames


CPU_BLOCK_SIZE = 32
"""The CPU engine's KV block size (vLLM's CPU default is 128; its CPU attention takes multiples of 32). A GRPO group's
``n`` samples of a prompt start together, and vLLM shares their prompt's KV through its prefix cache in whole blocks
only: with 128-token blocks a prompt under 128 tokens is prefilled once per sample. With 32 each sample recomputes
less than one block (benchmarks/README.md, "vLLM CPU settings"); ``engine_kwargs.vllm.block_size`` overrides it."""


def engine_args(
    model_path: str,
    rollout_cfg: Any,
    max_model_len: int,
    limit_images: int,
    limit_videos: int,
    device: str,
    seed: int,
    distributed: bool,
    tensor_parallel_size: int,
    trust_remote_code: bool,
    pixel_bounds: tuple[int, int] | None,
    video_pixel_bounds: tuple[int, int] | None,
) -> dict[str, Any]:
    """``vllm.LLM``'s arguments for a rollout engine (``VLLMRollout`` documents the parameters): the rollout's
    settings, the media limits and processor sizes of the data, vLLM's multimodal cache off, ``engine_kwargs.vllm``."""
    dtype = rollout_cfg.dtype
    if dtype == "auto":
        dtype = "bfloat16" if device == "cuda" else "float32"
    kwargs: dict[str, Any] = dict(
        model=model_path,
        dtype=dtype,
        enforce_eager=rollout_cfg.enforce_eager,
        max_model_len=max_model_len,
        limit_mm_per_prompt={"image": max(1, limit_images), "video": max(0, limit_videos)},
        seed=seed,
        trust_remote_code=trust_remote_code,
        tensor_parallel_size=tensor_parallel_size,
        enable_prefix_caching=True,
        load_format=rollout_cfg.load_format,
    )
    frames = _pixel_frames(model_path, trust_remote_code) if pixel_bounds is not None else 1
    mm = _mm_processor_kwargs(limit_videos, pixel_bounds, video_pixel_bounds, frames)
    if mm is not None:
        kwargs["mm_processor_kwargs"] = mm
    if device == "cuda":
        kwargs["gpu_memory_utilization"] = rollout_cfg.gpu_memory_utilization
        kwargs["enable_sleep_mode"] = bool(rollout_cfg.free_cache_engine)
    else:
        kwargs["block_size"] = CPU_BLOCK_SIZE
    if rollout_cfg.max_num_batched_tokens:
        kwargs["max_num_batched_tokens"] = rollout_cfg.max_num_batched_tokens
    if rollout_cfg.enable_chunked_prefill is not None:
        kwargs["enable_chunked_prefill"] = rollout_cfg.enable_chunked_prefill
    if distributed:
        # inside the torch.distributed world the trainer built: one engine per group of tensor_parallel_size
        # consecutive ranks (vLLM's external data parallelism across the groups), every rank of a group calls
        # it with the same prompts and seed
        kwargs["distributed_executor_backend"] = "external_launcher"
    elif tensor_parallel_size != 1:
        raise ValueError("a tensor-parallel engine runs inside the trainer's process group (distributed=True)")
    kwargs.update(default_cache_off())
    kwargs.update(translate_engine_kwargs(dict((rollout_cfg.engine_kwargs or {}).get("vllm") or {})))
    return kwargs


class VLLMRollout:
    """The vLLM rollout engine of a hybrid worker."""

    def __init__(
        self,
        model_path: str,
        *,
        rollout_cfg: Any,
        max_model_len: int,
        limit_images: int,
        limit_videos: int = 0,
        device: str = "cpu",
        seed: int = 0,
        distributed: bool = False,
        tensor_parallel_size: int = 1,
        trust_remote_code: bool = False,
        pixel_bounds: tuple[int, int] | None = None,
        video_pixel_bounds: tuple[int, int] | None = None,
    ) -> None:
        set_engine_env(on_cpu=device == "cpu")
        from vllm import LLM

        if device == "cpu":
            refuse_on_cpu(model_path, trust_remote_code)
            skip_rank_compile()
            if distributed:
                per_run_shm_names()

        self.device = device
        self.sleep_enabled = device == "cuda" and bool(rollout_cfg.free_cache_engine)
        kwargs = engine_args(
            model_path,
            rollout_cfg,
            max_model_len,
            limit_images,
            limit_videos,
            device,
            seed,
            distributed,
            tensor_parallel_size,
            trust_remote_code,
            pixel_bounds,
            video_pixel_bounds,
        )
        sw = Timer.start()
        gc.freeze()  # vLLM collects garbage several times while it starts: the objects that exist now are not garbage
        self.llm = LLM(**kwargs)
        self.start_s = sw.elapsed
        self.tokenizer = self.llm.get_tokenizer()
        self.vision_ids = vision_token_ids(self.tokenizer)
        self.eos_ids = _eos_ids(model_path, self.tokenizer)
        self.asleep = False
        # the weight push: on CPU straight into the layers and repacked (cpu_reload), else vLLM's in-place reload
        self.direct_push_unsupported = "not a CPU engine" if device != "cpu" else unsupported_reason(self.llm)
        chunked = bool(self.llm.llm_engine.vllm_config.scheduler_config.enable_chunked_prefill)
        self.seeded_turns = device != "cpu" or not chunked
        """Streamed turns sample from their own seeds (:meth:`start_turns`). vLLM rewinds a seeded request's generator
        after a partial (chunked) prefill with ``Generator.set_offset``, which CPU generators lack (the engine step
        fails), so a CPU engine with chunked prefill on (vLLM's default) samples them from its shared generator."""
        if device == "cpu" and self.direct_push_unsupported:
            print(f"[vlmrl] weight push through vLLM's reload_weights: {self.direct_push_unsupported}", flush=True)

    # ----------------------------------------------------------------------------------------------- generation
    def sampling_params(self, spec: SamplingSpec):
        """vLLM ``SamplingParams`` for a spec: sampled-token log-probs, vision tokens blocked."""
        from vllm import SamplingParams

        greedy = spec.is_greedy
        return SamplingParams(
            n=spec.n,
            max_tokens=spec.max_tokens,
            temperature=0.0 if greedy else spec.temperature,
            top_p=1.0 if greedy else spec.top_p,
            top_k=-1 if greedy else spec.top_k,
            logprobs=0,
            logit_bias={t: _NEVER for t in self.vision_ids.never_sample},
            ignore_eos=spec.ignore_eos,
            stop_token_ids=[] if spec.ignore_eos else self.eos_ids,  # vLLM stops on these even with ignore_eos
            skip_special_tokens=True,
            detokenize=False,
        )

    def generate(self, prompts: list[PromptSample], spec: SamplingSpec) -> RolloutBatch:
        """``spec.n`` samples per prompt. Prompts go in as ids with ONE image pad per image and ONE video pad per
        video (the engine expands them)."""
        sw = Timer.start()
        requests = [engine_prompt(p) for p in prompts]
        outs = self.llm.generate(requests, self.sampling_params(spec), use_tqdm=False)
        batch = RolloutBatch([], [], [], [], n=spec.n)
        for out in outs:
            if len(out.outputs) != spec.n:
                raise RuntimeError(f"engine returned {len(out.outputs)} samples for a prompt, expected {spec.n}")
            for c in out.outputs:
                ids = list(c.token_ids)
                batch.prompt_ids.append(list(out.prompt_token_ids))
                batch.response_ids.append(ids)
                batch.logprobs.append([float(d[t].logprob) for t, d in zip(ids, c.logprobs or [])])
                batch.finish_reasons.append("length" if c.finish_reason == "length" else "stop")
        batch.timing["generate_s"] = sw.elapsed
        return batch

    def turn_requests(
        self, requests: list[TurnRequest], spec: SamplingSpec, seeds: list[int] | None = None
    ) -> tuple[list[dict[str, Any]], list[Any]]:
        """The engine's prompts and sampling parameters of multi-turn requests (one sample each, its own token
        limit; ``seeds``: one sampling seed per request)."""
        engine_requests = []
        params = []
        for k, r in enumerate(requests):
            req: dict[str, Any] = {"prompt_token_ids": list(r.ids)}
            if r.images:
                req["multi_modal_data"] = {"image": list(r.images) if len(r.images) > 1 else r.images[0]}
            engine_requests.append(req)
            p = self.sampling_params(dataclasses.replace(spec, n=1, max_tokens=max(1, r.max_tokens)))
            if seeds is not None:
                p.seed = int(seeds[k])
            params.append(p)
        return engine_requests, params

    @staticmethod
    def _turn_output(out: Any) -> TurnOutput:
        """A finished request's one sample as a :class:`TurnOutput`."""
        c = out.outputs[0]
        ids = list(c.token_ids)
        lps = [float(d[t].logprob) for t, d in zip(ids, c.logprobs or [])]
        return TurnOutput(ids, lps, "length" if c.finish_reason == "length" else "stop")

    def generate_turns(self, requests: list[TurnRequest], spec: SamplingSpec) -> list[TurnOutput]:
        """One sample per request with its own token limit (a multi-turn step; prefix caching reuses each
        trajectory's earlier turns)."""
        engine_requests, params = self.turn_requests(requests, spec)
        outs = self.llm.generate(engine_requests, params, use_tqdm=False)
        return [self._turn_output(out) for out in outs]

    # ------------------------------------------------------------------- streaming turns (the agent loop)
    def start_turns(self, requests: list[TurnRequest], spec: SamplingSpec, seeds: list[int]) -> list[str]:
        """Queue multi-turn requests in the running engine without waiting for them (the per-trajectory agent loop:
        ``rollout.multi_turn``); their ids, which :meth:`step_turns` reports them under. ``seeds``: each request's
        own sampling seed, so what it samples does not depend on what else the engine runs beside it (where
        :attr:`seeded_turns`; else the engine's shared generator)."""
        engine_requests, params = self.turn_requests(requests, spec, seeds if self.seeded_turns else None)
        added = self.llm.enqueue(engine_requests, params, use_tqdm=False)
        # vLLM names a request ``<its id>-<random suffix>`` inside the engine and reports and aborts it by its id
        return [str(i).rsplit("-", 1)[0] for i in added]

    def step_turns(self) -> list[tuple[str, TurnOutput]]:
        """One engine step over every queued request (vLLM's scheduler batches them: at most ``max_num_seqs`` run
        at once); the requests that finished in it, by id. Called while turns are queued: an engine with none left
        unfinished lost them (an error, not a wait that never ends)."""
        if not self.llm.llm_engine.has_unfinished_requests():
            raise RuntimeError("vLLM holds no unfinished request while the agent loop waits on queued turns")
        return [(o.request_id, self._turn_output(o)) for o in self.llm.llm_engine.step() if o.finished]

    def abort_turns(self, request_ids: list[str]) -> None:
        """Drop queued or running requests (a rollout that stops on an error leaves nothing in the engine)."""
        if request_ids:
            self.llm.llm_engine.abort_request(list(request_ids))

    # --------------------------------------------------------------------------------------------- weight push
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> float:
        """Reload weights into the running engine (one tensor at a time from the iterator), then reset the prefix
        and encoder caches so the engine behaves exactly like a fresh one started from the new weights. On CPU the
        weights go straight into the layers, which are packed again (``cpu_reload.direct_reload``: the same result as
        vLLM's ``reload_weights``, faster); elsewhere through ``reload_weights``."""
        sw = Timer.start()
        if self.direct_push_unsupported is None:
            self.llm.collective_rpc(direct_reload, args=(iter(named_tensors),))
        else:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(named_tensors)})
            if self.device == "cpu":  # vLLM's reload leaves its CPU MoE kernel's experts unpacked
                self.llm.collective_rpc(repack_cpu_experts)
        self.reset_caches()
        return sw.elapsed

    def reset_caches(self) -> None:
        """Drop KV blocks and image features computed with old weights (an unfreed block would keep stale KV alive:
        that is an error, never silently ignored)."""
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM could not reset its prefix cache (blocks still in use); stale KV would be reused")
        self.llm.llm_engine.reset_encoder_cache()

    def close(self) -> None:
        """Shut the engine down while the process group it joined still exists (it tears its own groups down)."""
        client = getattr(self.llm.llm_engine, "engine_core", None)
        if client is not None:
            client.shutdown()

    # ----------------------------------------------------------------------------------------------- sleep/wake
    def sleep(self) -> None:
        """GPU: offload weights and free the KV cache while the trainer runs. CPU: nothing to free."""
        if self.sleep_enabled and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake(self, tags: list[str] | None = None) -> None:
        """GPU: bring weights (then the KV cache) back before the next push/rollout."""
        if self.sleep_enabled and self.asleep:
            self.llm.wake_up(tags=tags)
            if tags is None or "kv_cache" in tags:
                self.asleep = False


def engine_prompt(p: PromptSample, generated: list[int] | None = None) -> dict[str, Any]:
    """A prompt as the engine takes it: its ids (one pad per image and per video: the engine expands them), then
    ``generated`` (a continued response's tokens so far), and its images and videos."""
    req: dict[str, Any] = {"prompt_token_ids": list(p.prompt_ids) + list(generated or [])}
    mm: dict[str, Any] = {}
    if p.images:
        mm["image"] = p.images if len(p.images) > 1 else p.images[0]
    if p.videos:
        items = [
            (np.stack([np.asarray(f) for f in v.frames]), video_metadata(len(v.frames), v.sample_fps)) for v in p.videos
        ]
        mm["video"] = items if len(items) > 1 else items[0]
    if mm:
        req["multi_modal_data"] = mm
    return req


def _eos_ids(model_path: str, tokenizer: Any) -> list[int]:
    """End-of-sequence ids from the generation config (Qwen lists <|im_end|> and <|endoftext|>)."""
    ids: list[int] = []
    try:
        from transformers import GenerationConfig

        eos = GenerationConfig.from_pretrained(model_path).eos_token_id
        ids = [eos] if isinstance(eos, int) else list(eos or [])
    except OSError:
        pass
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(int(tokenizer.eos_token_id))
    return ids
