"""The hybrid worker: FSDP2 policy + reference + rollout engine in ONE process on the same device.

One step, as the driver calls it:
1. ``generate(prompts)``: the engine samples n responses per prompt (engine awake); on GPU it then sleeps. With
   ``rollout.tensor_model_parallel_size`` k > 1, k consecutive ranks share one engine (each holds 1/k of it) and all
   k get the same prompts and return the same samples.
2. ``train(shard)``: old/ref log-probs and the update on exactly the samples the shard names (groups this worker
   generated, kept here under their rollout id; groups from elsewhere sent with it), then the new weights go into the
   engine one tensor at a time (on GPU: wake weights, push, wake KV cache). Nothing is kept between steps.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import time
from typing import Any

import torch
import torch.distributed as dist

from vlmrl.batch import PromptSample, RolloutBatch, TrainShard
from vlmrl.config import VLMRLConfig
from vlmrl.config.checks import tp_size
from vlmrl.models import qwen_vl
from vlmrl.models.inputs import build_inputs, process_images, process_response_images
from vlmrl.rollout.base import SamplingSpec, sampling_specs
from vlmrl.workers.policy import PolicyWorker


def check_device(device: str) -> str:
    """The device the driver resolved (``config.checks.planned_device``), checked against this worker's view."""
    if device not in ("cpu", "cuda"):
        raise ValueError(f"a worker's device is resolved by the driver to cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("trainer.device=cuda but no CUDA device is visible to this worker")
    return device


class HybridWorker:
    """Policy, reference and engine of one rank. Driven by a worker group (a local process, a Ray actor, or the
    driver's own process) or directly in tests."""

    def __init__(
        self,
        cfg: VLMRLConfig,
        rank: int,
        world: int,
        init_method: str,
        device: str,
        total_steps: int,
        limit_images: int,
        limit_videos: int = 0,
    ) -> None:
        """``init_method``: the process group's rendezvous (``file://`` on one machine: nothing listens on the
        network; ``tcp://host:port`` across machines). ``device``: cpu or cuda, resolved once by the driver."""
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0")
        self.cfg = cfg
        self.rank = rank
        self.world = world
        self.device = check_device(device)
        if self.device == "cuda":
            torch.cuda.set_device(0)  # Ray gives each worker one GPU (CUDA_VISIBLE_DEVICES)
        else:
            torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        if not dist.is_initialized():  # a collective waiting longer than nccl_timeout fails instead of hanging
            dist.init_process_group(
                "nccl" if self.device == "cuda" else "gloo",
                init_method=init_method,
                rank=rank,
                world_size=world,
                timeout=datetime.timedelta(seconds=cfg.actor_rollout_ref.nccl_timeout),
            )
        from transformers import AutoProcessor

        arr = cfg.actor_rollout_ref
        t0 = time.perf_counter()
        self.processor = AutoProcessor.from_pretrained(arr.model.path, trust_remote_code=arr.model.trust_remote_code)
        self.tokenizer = self.processor.tokenizer
        bounds = qwen_vl.pixel_bounds(self.processor.image_processor, cfg.data.min_pixels, cfg.data.max_pixels)
        qwen_vl.apply_pixel_bounds(self.processor.image_processor, *bounds)
        vp = self.processor.video_processor
        video_bounds = qwen_vl.pixel_bounds(vp, cfg.data.video_min_pixels, cfg.data.video_max_pixels)
        qwen_vl.apply_pixel_bounds(vp, *video_bounds)  # the frames the dataset resized pass through unchanged
        self.vision_ids = qwen_vl.vision_token_ids(self.tokenizer)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        max_len = arr.rollout.max_model_len or (cfg.data.max_prompt_length + cfg.data.max_response_length)
        self.engine: Any
        mt = arr.rollout.multi_turn
        image_limit = (arr.rollout.limit_images or limit_images) + (mt.max_tool_images if mt.enable else 0)
        video_limit = arr.rollout.limit_videos if arr.rollout.limit_videos is not None else limit_videos
        self.tp = tp_size(cfg)
        self.engine_group = rank // self.tp  # the ranks rank // tp * tp ... + tp - 1 share one engine
        if arr.rollout.name == "vllm":
            from vlmrl.rollout.vllm import VLLMRollout

            self.engine = VLLMRollout(
                arr.model.path,
                rollout_cfg=arr.rollout,
                max_model_len=max_len,
                limit_images=image_limit,
                limit_videos=video_limit,
                device=self.device,
                seed=arr.rollout.seed + self.engine_group,  # the same within an engine's group: same samples
                distributed=True,  # inside the trainer's process group: one engine per tensor-parallel group
                tensor_parallel_size=self.tp,
                trust_remote_code=arr.model.trust_remote_code,
                pixel_bounds=bounds,
                video_pixel_bounds=video_bounds,
            )
        # vLLM reseeds the process at start: seed after it. vLLM samples from this process's torch generator, so the
        # ranks sharing a tensor-parallel engine must hold the same state at every rollout (else each samples its
        # own tokens and the engine's forward mixes them): one seed per engine group, checked before each rollout
        torch.manual_seed(cfg.trainer.seed + self.engine_group)
        self.policy = PolicyWorker(
            arr,
            device=self.device,
            total_steps=total_steps,
            vision_ids=self.vision_ids,
            seed=cfg.trainer.seed,
            max_response_length=cfg.data.max_response_length,
        )
        if arr.rollout.name == "hf":
            from vlmrl.rollout.hf import HFRollout

            self.engine = HFRollout(self.policy.model, self.processor)
        elif arr.rollout.name != "vllm":
            raise ValueError(f"actor_rollout_ref.rollout.name={arr.rollout.name!r}: use vllm | hf")
        self.train_spec, self.val_spec = sampling_specs(arr.rollout, cfg.data.max_response_length)
        self.agent = None
        if mt.enable:
            from vlmrl.rollout.multi_turn import MultiTurnAgent
            from vlmrl.tools.runner import ToolRunner

            factor = qwen_vl.patch_factor(self.processor.image_processor)
            tools = ToolRunner(mt.tool_config_path, mt.tool_workers, mt.tool_timeout_s)
            self.agent = MultiTurnAgent(
                self.engine, tools, mt, self.tokenizer, (factor, *bounds), cfg.data.max_response_length,
                max_images=image_limit,
            )  # fmt: skip
        self.startup_s = time.perf_counter() - t0
        self._rollouts: dict[int, tuple[list[PromptSample], RolloutBatch]] = {}
        self._next_rollout = 0

    # ----------------------------------------------------------------------------------------------- rollout
    def generate(self, prompts: list[PromptSample], validate: bool = False) -> RolloutBatch:
        """Sample responses for this rank's prompts (the same on every rank of a tensor-parallel group). A training
        rollout is kept here under an id, recorded in the returned batch's ``origins`` with this rank's engine group,
        until the next ``train`` (which names what it uses, then drops them all)."""
        spec: SamplingSpec = self.val_spec if validate else self.train_spec
        if not prompts:
            return RolloutBatch([], [], [], [], n=spec.n)
        if self.tp > 1:
            self._check_engine_group_in_step()
        self.engine.wake()  # a no-op unless a second rollout of the same step follows a sleep (filter_groups)
        rb = (self.agent or self.engine).generate(prompts, spec)
        if not validate:
            rid = self._next_rollout
            self._next_rollout += 1
            rb.origins = [(self.engine_group, rid, g) for g in range(len(prompts))]
            self._rollouts[rid] = (prompts, rb)
            t0 = time.perf_counter()
            self.engine.sleep()
            rb.timing["sleep_s"] = time.perf_counter() - t0
        return rb

    def _check_engine_group_in_step(self) -> None:
        """All ranks: raise (on every rank of the group) when the ranks of this rank's tensor-parallel engine hold
        different random states, which would make them sample different tokens."""
        state = torch.get_rng_state().numpy().tobytes()
        if self.device == "cuda":
            state += torch.cuda.get_rng_state().numpy().tobytes()
        digest = int.from_bytes(hashlib.blake2b(state, digest_size=7).digest(), "little")
        dev = "cuda" if self.device == "cuda" else "cpu"
        mine = torch.tensor([digest], dtype=torch.int64, device=dev)
        every = [torch.zeros_like(mine) for _ in range(self.world)]
        dist.all_gather(every, mine)
        group = [int(t.item()) for t in every[self.engine_group * self.tp : (self.engine_group + 1) * self.tp]]
        if len(set(group)) > 1:
            raise RuntimeError(
                f"the ranks of tensor-parallel engine {self.engine_group} hold different random states before a "
                "rollout (something drew random numbers on one rank only); they would sample different tokens"
            )

    # ------------------------------------------------------------------------------------------------- train
    def train(self, shard: TrainShard) -> dict[str, float]:
        """Update the policy on exactly the samples ``shard`` names (this worker's stored groups, then the groups sent
        with it), then push the new weights into the engine. The stored rollouts are dropped either way."""
        stored, self._rollouts = self._rollouts, {}
        prompts: list[PromptSample] = []
        parts: list[RolloutBatch] = []
        for rid, g in shard.stored:
            if rid not in stored:
                raise RuntimeError(f"worker {self.rank}: rollout {rid} is not (or no longer) kept here")
            p, rb = stored[rid]
            prompts.append(p[g])
            parts.append(rb.select_groups([g]))
        if shard.sent is not None:
            prompts += shard.sent[0]
            parts.append(shard.sent[1])
        if not parts:
            raise RuntimeError(f"worker {self.rank}: an update with no samples")
        rb = RolloutBatch.concat(parts)
        t0 = time.perf_counter()
        x = build_inputs(
            prompts, rb, process_images(self.processor, prompts), self.pad_id,
            process_response_images(self.processor, rb),
        )  # fmt: skip
        t_prep = time.perf_counter() - t0
        adv = torch.tensor(shard.advantages, dtype=torch.float32)
        if adv.shape[0] != x.batch_size:
            raise ValueError(f"worker {self.rank}: {adv.shape[0]} advantages for {x.batch_size} samples")
        metrics = self.policy.update(x, adv, shard.mini_batch_samples)
        metrics["timing/input_prep_s"] = t_prep
        metrics["timing/push_s"] = self.push_weights()
        if self.device == "cuda":  # verl's names; peak since the previous step
            metrics["perf/max_memory_allocated_gb"] = torch.cuda.max_memory_allocated() / 2**30
            metrics["perf/max_memory_reserved_gb"] = torch.cuda.max_memory_reserved() / 2**30
            torch.cuda.reset_peak_memory_stats()
        metrics["perf/cpu_memory_rss_gb"] = self.rss_bytes() / 2**30
        return metrics

    def push_weights(self) -> float:
        """Full weights → engine, one tensor at a time (GPU: wake weights first, KV cache after)."""
        t0 = time.perf_counter()
        if self.cfg.actor_rollout_ref.rollout.name == "hf":
            return 0.0  # the HF rollout generates with the policy module itself
        self.engine.wake(tags=["weights"])
        self.engine.update_weights(self.policy.engine_weights())
        self.engine.wake(tags=["kv_cache"])
        if self.device == "cuda":
            torch.cuda.empty_cache()
        return time.perf_counter() - t0

    # ------------------------------------------------------------------------------------------- checkpoints
    def save_checkpoint(self, folder: str) -> float:
        """Policy + optimizer shards, scheduler and RNG states into ``folder``/actor; returns seconds taken."""
        t0 = time.perf_counter()
        actor = os.path.join(folder, "actor")
        os.makedirs(actor, exist_ok=True)
        self.policy.save(actor)
        if dist.is_initialized():
            dist.barrier()
        return time.perf_counter() - t0

    def load_checkpoint(self, folder: str) -> float:
        """Restore a checkpoint and push its weights into the engine; returns seconds taken."""
        t0 = time.perf_counter()
        self.policy.load(os.path.join(folder, "actor"))
        self.push_weights()
        return time.perf_counter() - t0

    # ------------------------------------------------------------------------------------------------- misc
    def info(self) -> dict[str, Any]:
        """Where this worker runs."""
        import socket

        return {
            "rank": self.rank, "device": self.device, "pid": os.getpid(), "node": socket.gethostname(),
            "startup_s": self.startup_s,
        }  # fmt: skip

    def rss_bytes(self) -> int:
        """Resident memory of this process."""
        import psutil

        return int(psutil.Process().memory_info().rss)

    def shutdown(self) -> None:
        """Shut the tool workers and the engine down, then release the process group (which the engine may have
        torn down already)."""
        if self.agent is not None:
            self.agent.tools.close()
        close = getattr(self.engine, "close", None)
        if close is not None:
            close()
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - vLLM's external launcher may have destroyed it
                pass
