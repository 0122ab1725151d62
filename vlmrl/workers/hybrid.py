"""The hybrid worker: FSDP2 policy + reference + rollout engine in ONE process on the same device.

With ``actor_rollout_ref.hybrid_engine=False`` the same class runs in two pools (``WorkerPlan.role``): ``actor``
workers hold the policy, reference and critic and no engine; ``rollout`` workers hold only the engine (vLLM, or an HF
model for the HF rollout) and return their samples to the driver, which sends them to the training pool. Weights go
from the training pool to the engines through a process group spanning both (``vlmrl.workers.sync``).

It is told a :class:`vlmrl.config.plan.WorkerPlan` (its part of the config and what the driver derived) and does what
the driver's ``fit()`` calls, stage by stage:

1. ``generate(prompts)``: the engine samples n responses per prompt (engine awake). A training rollout is kept here
   (``RolloutStore``) until the update. With ``rollout.tensor_model_parallel_size`` k > 1, k consecutive ranks share
   one engine (each holds 1/k of it) and all k get the same prompts and return the same samples.
2. ``sleep_engine()``: on GPU the engine frees its KV cache and offloads its weights for the update (CPU: nothing).
3. ``update(shard)``: old/ref log-probs and the update on exactly the samples the shard names (groups this worker
   generated, taken from the store; groups from elsewhere sent with it). The store is emptied.
4. ``push_weights()``: the new weights into the engine one tensor at a time (GPU: wake weights, push, wake KV cache).
"""

from __future__ import annotations

import datetime
import hashlib
import os
import socket
import time
from typing import Any

import psutil
import torch
import torch.distributed as dist

from vlmrl.algorithms import load_plugins
from vlmrl.batch import PreparedShard, PromptSample, RolloutBatch, TrainShard
from vlmrl.config.plan import WorkerPlan
from vlmrl.models import qwen_vl
from vlmrl.models.families import family_of_processor
from vlmrl.models.inputs import build_inputs, process_images, process_response_images
from vlmrl.rollout.base import SamplingSpec, sampling_specs
from vlmrl.rollout.multi_turn import MultiTurnAgent
from vlmrl.rollout.stream import PromptStream, StreamGroup, StreamItem
from vlmrl.rollout.stream_turns import TrajectoryStream
from vlmrl.startup import stage
from vlmrl.timing import TimedIterator, Timer
from vlmrl.tools.runner import ToolGroup, ToolRunner
from vlmrl.workers.policy import PolicyWorker
from vlmrl.workers.rendezvous import make_store
from vlmrl.workers.sync import WeightMeta, WeightSync, meta_of


def check_device(device: str) -> str:
    """The device the driver resolved (``config.plan.planned_device``), checked against this worker's view."""
    if device not in ("cpu", "cuda"):
        raise ValueError(f"a worker's device is resolved by the driver to cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("trainer.device=cuda but no CUDA device is visible to this worker")
    return device


class RolloutStore:
    """Training rollouts a worker keeps between ``generate`` and ``update``, under ids it hands out."""

    def __init__(self) -> None:
        self._kept: dict[int, tuple[list[PromptSample], RolloutBatch]] = {}
        self._next = 0

    def put(self, prompts: list[PromptSample], rollout: RolloutBatch) -> int:
        """Keep a rollout; returns its id."""
        rid, self._next = self._next, self._next + 1
        self._kept[rid] = (prompts, rollout)
        return rid

    def take(self, refs: list[tuple[int, int]], rank: int) -> tuple[list[PromptSample], list[RolloutBatch]]:
        """The prompts and one-group batches of ``refs`` ((rollout id, group) pairs); everything kept is dropped."""
        kept, self._kept = self._kept, {}
        prompts, parts = [], []
        for rid, g in refs:
            if rid not in kept:
                raise RuntimeError(f"worker {rank}: rollout {rid} is not (or no longer) kept here")
            p, rb = kept[rid]
            prompts.append(p[g])
            parts.append(rb.select_groups([g]))
        return prompts, parts


class HybridWorker:
    """Policy, reference and engine of one rank. Driven by a worker group (a local process, a Ray actor, or the
    driver's own process) or directly in tests."""

    stream: PromptStream | TrajectoryStream | None = None
    """The rollout pool's streamed groups (``async_training.mode=fully_async``; made at the first ``stream_*``)."""

    def __init__(self, plan: WorkerPlan, rank: int, init_method: str) -> None:
        """``init_method``: the process group's rendezvous (``file://`` on one machine: nothing listens on the
        network; ``tcp://host:port`` across machines). Each start-up step is a ``vlmrl.startup.stage``: a failure
        says what failed and what to check. A failure shuts down what had started (tool workers, the engine, the
        process group) before it propagates, so a driver that goes on (the inline launcher) holds nothing of it."""
        self.engine: Any = None
        self.agent: Any = None
        self.sync: Any = None
        self._rendezvous: Any = None
        try:
            self._start(plan, rank, init_method)
        except BaseException:
            self.shutdown()
            raise

    def _start(self, plan: WorkerPlan, rank: int, init_method: str) -> None:
        """The start-up's stages (see ``__init__``)."""
        sw = Timer.start()
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(plan.world), LOCAL_RANK="0")
        arr, path = plan.arr, plan.arr.model.path
        self.plan, self.rank, self.world, self.tp = plan, rank, plan.world, plan.tp
        self.role = plan.role
        who = f"{'rollout worker' if self.role == 'rollout' else 'worker'} {rank}"
        engine, policy = self.role != "actor", self.role != "rollout"  # what this worker holds
        self.engine_group = rank // self.tp  # the ranks rank // tp * tp ... + tp - 1 share one engine
        self._join(plan, rank, init_method, who)
        with stage(f"{who} could not load the model's processor from {path}", "check actor_rollout_ref.model.path"):
            self._load_processor(plan)
        if arr.rollout.name == "vllm" and engine:
            with stage(
                f"{who} could not start the vLLM engine for {path}",
                "check actor_rollout_ref.rollout's engine settings (max_model_len, gpu_memory_utilization, "
                "engine_kwargs.vllm) against the model and this machine, or use "
                "actor_rollout_ref.rollout.name=hf",
            ):
                self.engine = self._vllm_engine(plan)
        # vLLM reseeds the process at start: seed after it. vLLM samples from this process's torch generator, so the
        # ranks sharing a tensor-parallel engine must hold the same state at every rollout (else each samples its
        # own tokens and the engine's forward mixes them): one seed per engine group, checked before each rollout
        torch.manual_seed(plan.seed + self.engine_group)
        with stage(f"{who} could not import algorithm.plugins", "check each file or module it lists"):
            load_plugins(plan.plugins)
        self._load_models(plan, who, policy)
        self._prepared: tuple[Any, Any, Any, dict[str, float]] | None = None
        if arr.rollout.name == "hf" and engine:
            from vlmrl.rollout.hf import HFRollout

            self.engine = HFRollout(self.policy.model if policy else self.hf_model, self.processor)
        self.train_spec, self.val_spec = sampling_specs(arr.rollout, plan.max_response_length)
        mt = arr.rollout.multi_turn
        if mt.enable and engine:
            hint = "fix the tool file it names, or actor_rollout_ref.rollout.multi_turn.tool_config_path"
            with stage(f"{who} could not load the tools of {mt.tool_config_path}", hint):
                self.agent = self._agent(plan)
        self.rollouts = RolloutStore()
        self.startup_s = sw.elapsed
        self.ready_at = time.time()

    def _join(self, plan: WorkerPlan, rank: int, init_method: str, who: str) -> None:
        """The device, and the workers' process group (gloo on CPU, NCCL on GPU)."""
        arr = plan.arr
        self.device = check_device(plan.device)
        if self.device == "cuda":
            torch.cuda.set_device(0)  # Ray gives each worker one GPU (CUDA_VISIBLE_DEVICES)
        else:
            torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        if not dist.is_initialized():  # a collective waiting longer than nccl_timeout fails instead of hanging
            with stage(
                f"{who} could not join the workers' process group",
                "another process may hold the rendezvous, or a firewall separates the nodes (README, GPUs and "
                "clusters)",
            ):
                timeout = datetime.timedelta(seconds=arr.nccl_timeout)
                backend = "nccl" if self.device == "cuda" else "gloo"
                if init_method.startswith("tcp://"):  # across machines: the gated store (workers/rendezvous.py)
                    self._rendezvous = make_store(init_method, rank, plan.world, timeout)
                    store = self._rendezvous.store
                    dist.init_process_group(backend, store=store, rank=rank, world_size=plan.world, timeout=timeout)
                else:
                    dist.init_process_group(
                        backend, init_method=init_method, rank=rank, world_size=plan.world, timeout=timeout
                    )

    def _load_models(self, plan: WorkerPlan, who: str, policy: bool) -> None:
        """The models this worker holds: the policy and reference (or a rollout worker's own HF copy), the critic,
        the reward model."""
        arr, path = plan.arr, plan.arr.model.path
        self.policy: Any = None
        model_sw = Timer.start()
        with stage(
            f"{who} could not load the model from {path}",
            "check actor_rollout_ref.model.path (a complete Qwen-VL folder or hub id: config.json and every "
            "*.safetensors file it lists)",
        ):
            if policy:
                self.policy = PolicyWorker(
                    arr,
                    device=self.device,
                    total_steps=plan.total_steps,
                    vision_ids=self.vision_ids,
                    seed=plan.seed,
                    max_response_length=plan.max_response_length,
                    reference=plan.reference,
                    rollout_correction=plan.rollout_correction,
                    algorithm=plan.algorithm,
                )
            elif arr.rollout.name == "hf":  # a rollout worker's own copy of the model, generating only
                from vlmrl.models.trainable import load_model

                self.hf_model = load_model(path, self.device, arr.model.trust_remote_code).eval()
                self.hf_model.requires_grad_(False)
        self.model_s = model_sw.elapsed
        self.critic = None
        if plan.critic is not None:
            with stage(
                f"{who} could not load the critic from {plan.critic.path}",
                "check critic.model.path (a Qwen2.5-VL folder, or a critic checkpoint with its value "
                "head; unset: the actor's path)",
            ):
                from vlmrl.workers.critic import CriticWorker

                self.critic = CriticWorker(
                    plan.critic,
                    device=self.device,
                    total_steps=plan.total_steps,
                    vision_ids=self.vision_ids,
                    seed=plan.seed,
                    max_response_length=plan.max_response_length,
                )
        self.reward_model = None
        if plan.reward_model is not None and policy:
            rmp = plan.reward_model
            with stage(
                f"{who} could not load the reward model from {rmp.path}",
                "check reward_model.model.path (a Qwen2.5-VL folder with a score head: python -m "
                "vlmrl.reward_model.train writes one)",
            ):
                from vlmrl.reward_model.discriminative import RewardModelWorker

                self.reward_model = RewardModelWorker(rmp, self.device, self.processor)

    def _load_processor(self, plan: WorkerPlan) -> None:
        from transformers import AutoProcessor

        model = plan.arr.model
        self.processor = AutoProcessor.from_pretrained(model.path, trust_remote_code=model.trust_remote_code)
        self.tokenizer = self.processor.tokenizer
        self.image_bounds: tuple[int, int] | None = None
        self.video_bounds: tuple[int, int] | None = None
        if not family_of_processor(self.processor).tiles:  # a tiled family's processor bounds its tiles itself
            self.image_bounds = qwen_vl.pixel_bounds(self.processor.image_processor, *plan.image_bounds)
            qwen_vl.apply_pixel_bounds(self.processor.image_processor, *self.image_bounds)
            vp = self.processor.video_processor
            self.video_bounds = qwen_vl.pixel_bounds(vp, *plan.video_bounds)
            qwen_vl.apply_pixel_bounds(vp, *self.video_bounds)  # the frames the dataset resized pass through unchanged
        self.vision_ids = qwen_vl.vision_token_ids(self.tokenizer)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    def _vllm_engine(self, plan: WorkerPlan) -> Any:
        from vlmrl.rollout.vllm import VLLMRollout

        arr = plan.arr
        return VLLMRollout(
            arr.model.path,
            rollout_cfg=arr.rollout,
            max_model_len=plan.max_model_len,
            limit_images=plan.limit_images,
            limit_videos=plan.limit_videos,
            device=self.device,
            seed=arr.rollout.seed + self.engine_group,  # the same within an engine's group: same samples
            distributed=True,  # inside the trainer's process group: one engine per tensor-parallel group
            tensor_parallel_size=self.tp,
            trust_remote_code=arr.model.trust_remote_code,
            pixel_bounds=self.image_bounds,
            video_pixel_bounds=self.video_bounds,
        )

    def _agent(self, plan: WorkerPlan) -> Any:
        mt = plan.arr.rollout.multi_turn
        factor = qwen_vl.patch_factor(self.processor.image_processor)
        group = None
        if self.tp > 1:  # every rank creates every engine's group, in the same order (a collective)
            groups = [
                dist.new_group(list(range(g * self.tp, (g + 1) * self.tp)), backend="gloo")
                for g in range(self.world // self.tp)
            ]
            leader = self.engine_group * self.tp
            group = ToolGroup(groups[self.engine_group], leader, self.rank == leader)
        tools = ToolRunner(mt.tool_config_path, mt.tool_workers, mt.tool_timeout_s, group)
        return MultiTurnAgent(
            self.engine,
            tools,
            mt,
            self.tokenizer,
            (factor, *self.image_bounds),
            plan.max_response_length,
            max_images=plan.limit_images,
        )

    # ----------------------------------------------------------------------------------------------- rollout
    def generate(self, prompts: list[PromptSample], validate: bool = False, seed: int | None = None) -> RolloutBatch:
        """Sample responses for this rank's prompts (the same on every rank of a tensor-parallel group). A hybrid
        worker's training rollout is kept in the store, its groups named in the returned batch's ``origins`` with
        this rank's engine group, until the next ``update`` (which names what it uses, then drops them all); a rollout
        worker's goes to the driver only. ``seed``: sample from this seed (plus the engine group), so that a batch
        is the same whatever came before it (the rollout pool's batches: a resumed run regenerates the batch that was
        in flight)."""
        spec: SamplingSpec = self.val_spec if validate else self.train_spec
        if not prompts:
            return RolloutBatch([], [], [], [], n=spec.n)
        if self.stream is not None and self.stream.running:
            raise RuntimeError(f"{len(self.stream.running)} streamed samples are generating: interrupt them first")
        if getattr(self.engine, "asleep", False):  # asleep for the reward model (GPU): its weights kept in host memory
            self.engine.wake()
        if seed is not None:
            torch.manual_seed(seed + self.engine_group)
        if self.tp > 1:
            self._check_engine_group_in_step()
        started = time.time()
        rb = (self.agent or self.engine).generate(prompts, spec)
        rb.timing |= {"start_time": started, "end_time": time.time()}  # wall clock: the overlap of the two pools
        if not validate and self.role == "hybrid":
            rid = self.rollouts.put(prompts, rb)
            rb.origins = [(self.engine_group, rid, g) for g in range(len(prompts))]
        return rb

    # -------------------------------------------------------------- streamed groups (async_training fully_async)
    def _stream(self) -> PromptStream | TrajectoryStream:
        if self.stream is None:
            if self.agent is not None:  # multi-turn: each trajectory's turns on its own schedule
                self.stream = TrajectoryStream(self.engine, self.agent, self.train_spec)
            else:
                self.stream = PromptStream(self.engine, self.train_spec)
        return self.stream

    def stream_add(self, items: list[StreamItem], version: int) -> int:
        """Rollout pool: start generating ``items`` (one group each) with the engine's weights (``version``
        updates); samples generating or interrupted."""
        stream = self._stream()
        stream.add(items, version)
        return stream.unfinished

    def stream_step(self, steps: int) -> tuple[list[StreamGroup], int]:
        """Up to ``steps`` engine steps: the groups that finished and the samples still unfinished."""
        stream = self._stream()
        return stream.step(steps), stream.unfinished

    def stream_interrupt(self) -> int:
        """Stop every streamed sample where it is (a sync with partial rollouts); samples stopped."""
        return self._stream().interrupt()

    def stream_resume(self, version: int) -> int:
        """Continue the stopped samples with the engine's weights now (``version``); samples continued."""
        return self._stream().resume(version)

    def score_rewards(
        self, prompts: list[PromptSample], rollout: RolloutBatch, n_micro: int
    ) -> tuple[list[float] | None, str | None, int]:
        """The reward model's scores of these samples in ``n_micro`` forwards (the same on every rank), or the error
        that stopped it (the driver counts the samples as reward errors), and how many responses ``max_length``
        cut."""
        if self.reward_model is None:
            raise RuntimeError(f"worker {self.rank} holds no reward model")
        if self.engine is not None:  # GPU: the engine's memory to the reward model first, as verl does (CPU: no-op);
            self.engine.sleep()  # the next rollout, or the weight push, wakes it
        try:
            x, cut = self.reward_model.inputs(prompts, rollout)
            return self.reward_model.score(x, n_micro).tolist(), None, cut
        except Exception as e:  # noqa: BLE001 - reported per batch, as a rule reward's failure is
            return None, f"{type(e).__name__}: {e}", 0

    def sleep_engine(self) -> float:
        """The engine gives its device memory to the update (GPU: KV cache freed, weights offloaded); seconds."""
        sw = Timer.start()
        if self.engine is not None:
            self.engine.sleep()
        return sw.elapsed

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

    # ------------------------------------------------------------------------------------------------ update
    def _shard_inputs(self, shard: TrainShard) -> tuple[Any, dict[str, float]]:
        """The model inputs of exactly the samples ``shard`` names (this worker's stored groups, then the groups
        sent with it), and the time taken. The stored rollouts are dropped either way."""
        prompts, parts = self.rollouts.take(shard.stored, self.rank)
        if shard.sent is not None:
            prompts += shard.sent[0]
            parts.append(shard.sent[1])
        if not parts:
            raise RuntimeError(f"worker {self.rank}: an update with no samples")
        rb = RolloutBatch.concat(parts)
        timer = Timer()
        with timer("input_prep"):
            x = build_inputs(
                prompts,
                rb,
                process_images(self.processor, prompts),
                self.pad_id,
                process_response_images(self.processor, rb),
            )
        return x, timer.metrics()

    def prepare(self, shard: TrainShard, need_old: bool, need_pi2: bool = False) -> PreparedShard:
        """Before the advantages (PPO with a critic, or the in-reward KL): the shard's old log-probs (``need_old``,
        or when the update needs them anyway), reference log-probs and values. The inputs and these stay here for
        the ``update`` of the same shard."""
        x, timing = self._shard_inputs(shard)
        timer = Timer()
        pi2 = None
        with timer("old_ref_logprob"):
            if need_pi2:  # the optimal-token-baseline estimators: old log-probs and sum_a pi(a)^2, one forward
                old, pi2 = self.policy.old_logprobs_and_pi2(x)
                given = (old, self.policy.logprobs(x, "ref") if self.policy.ref is not None else None)
            else:
                given = self.policy.old_and_ref(x, shard.mini_batch_samples, need_old)
        values = None
        if self.critic is not None:
            with timer("critic_values"):
                values = self.critic.values(x)
        self._prepared = (x, given, values, timing | timer.metrics())
        return PreparedShard(x.response_mask.float(), given[0], given[1], values, pi2)

    def update(self, shard: TrainShard) -> dict[str, float]:
        """Update on exactly the samples ``shard`` names: the critic towards ``shard.returns`` (when given), then the
        policy (unless ``shard.update_actor`` is False: trainer.critic_warmup). A shard with per-token advantages was
        prepared: it uses the inputs and log-probs ``prepare`` kept."""
        started = time.time()
        given = values = None
        if shard.token_advantages is not None:  # a prepared shard
            if self._prepared is None:
                raise RuntimeError(f"worker {self.rank}: an update of a prepared shard that was not prepared here")
            (x, given, values, metrics), self._prepared = self._prepared, None
            adv = shard.token_advantages
        else:
            x, metrics = self._shard_inputs(shard)
            adv = torch.tensor(shard.advantages, dtype=torch.float32)
        if adv.shape[0] != x.batch_size:
            raise ValueError(f"worker {self.rank}: {adv.shape[0]} advantages for {x.batch_size} samples")
        if self.critic is not None and shard.returns is not None:
            assert values is not None, "a critic update needs the values of prepare"
            metrics |= self.critic.update(x, shard.returns, values, shard.critic_mini_batch_samples)
        if shard.algorithm_state is not None:
            self.policy.algorithm.load_state_dict(shard.algorithm_state)
        if shard.update_actor:
            rewards = torch.tensor(shard.rewards, dtype=torch.float32) if shard.rewards else None
            metrics |= self.policy.update(x, adv, shard.mini_batch_samples, given, rewards)
        if self.device == "cuda":  # verl's names; peak since the previous step
            metrics["perf/max_memory_allocated_gb"] = torch.cuda.max_memory_allocated() / 2**30
            metrics["perf/max_memory_reserved_gb"] = torch.cuda.max_memory_reserved() / 2**30
            torch.cuda.reset_peak_memory_stats()
        metrics["perf/cpu_memory_rss_gb"] = self.rss_bytes() / 2**30
        metrics |= {"timeline/update_start": started, "timeline/update_end": time.time()}  # wall clock
        return metrics

    def push_weights(self) -> dict[str, float]:
        """Full weights → engine, one tensor at a time (GPU: wake weights first, KV cache after). ``gather``: the
        seconds of the push spent producing the weights (FSDP's gathers, LoRA merges, the checkpoint's layout); the
        rest is the engine's (its loading and, on CPU, the repacking of its layers; the driver times the whole push).
        Nothing without an engine."""
        if self.plan.arr.rollout.name == "hf" or self.engine is None:
            return {}  # the HF rollout generates with the policy module itself; a training pool has no engine
        self.engine.wake(tags=["weights"])
        weights = TimedIterator(self.policy.engine_weights())
        self.engine.update_weights(weights)
        self.engine.wake(tags=["kv_cache"])
        if self.device == "cuda":
            torch.cuda.empty_cache()
        return {"gather": weights.seconds}

    # ------------------------------------------------------------------------- weight sync (two pools)
    def weight_meta(self) -> list[WeightMeta]:
        """Training pool, every rank (the full tensors are gathered: a collective): the tensors a sync sends, in
        order."""
        return meta_of(self.policy.engine_weights())

    def join_sync(self, init: str, meta: list[WeightMeta], world: int) -> float:
        """Join the weight-sync group of ``world`` members (``vlmrl.workers.sync``): the training pool's rank 0 as
        its sender (rank 0), rollout worker r as rank r + 1; the other training ranks take no part in it. Seconds
        taken."""
        sw = Timer.start()
        if self.role == "rollout":
            rank = self.rank + 1
        elif self.rank == 0:
            rank = 0
        else:
            return 0.0
        self.sync = WeightSync(init, rank, world, self.device, meta, float(self.plan.arr.nccl_timeout))
        return sw.elapsed

    def send_weights(self) -> tuple[float, int, float]:
        """Training pool, every rank: the full weights (each FSDP2 unit gathered once, a collective) broadcast by
        rank 0 to every engine; (seconds, bytes sent, seconds in the broadcasts)."""
        sw = Timer.start()
        weights = self.policy.engine_weights()
        if self.sync is None:  # a rank that only takes part in the gather
            for _ in weights:
                pass
            return sw.elapsed, 0, 0.0
        sent = self.sync.send(weights)
        return sw.elapsed, sent, self.sync.broadcast_s

    def receive_weights(self) -> float:
        """Rollout pool: receive the weights into the engine without a restart (vLLM: the same reload as the hybrid
        push; HF rollout: copied into the model); seconds."""
        sw = Timer.start()
        received = self.sync.receive()
        if self.plan.arr.rollout.name == "hf":
            family = qwen_vl.family_of(qwen_vl.inner_model(self.hf_model).config)
            params = {qwen_vl.engine_weight_name(n, family): p for n, p in self.hf_model.named_parameters()}
            with torch.no_grad():
                for name, t in received:  # sent in the checkpoint's layout: back to the model's
                    params[name].copy_(family.checkpoint_tensor(name, t))
        else:
            self.engine.update_weights(received)
        return sw.elapsed

    # ------------------------------------------------------------------------------------------- checkpoints
    def save_checkpoint(self, folder: str) -> float:
        """Policy + optimizer shards, scheduler and RNG states into ``folder``/actor (the critic's into
        ``folder``/critic); returns seconds taken."""
        sw = Timer.start()
        actor = os.path.join(folder, "actor")
        os.makedirs(actor, exist_ok=True)
        self.policy.save(actor)
        if self.critic is not None:
            critic = os.path.join(folder, "critic")
            os.makedirs(critic, exist_ok=True)
            self.critic.save(critic)
        if dist.is_initialized():
            dist.barrier()
        return sw.elapsed

    def load_checkpoint(self, folder: str) -> float:
        """Restore a checkpoint and push its weights into the engine; returns seconds taken."""
        sw = Timer.start()
        self.policy.load(os.path.join(folder, "actor"))
        if self.critic is not None:
            critic = os.path.join(folder, "critic")
            if not os.path.isdir(critic):
                raise FileNotFoundError(f"{critic} missing: the checkpoint was written by a run without a critic")
            self.critic.load(critic)
        self.push_weights()
        return sw.elapsed

    # ------------------------------------------------------------------------------------------------- misc
    def info(self) -> dict[str, Any]:
        """Where this worker runs."""
        return {
            "rank": self.rank,
            "device": self.device,
            "pid": os.getpid(),
            "node": socket.gethostname(),
            "startup_s": self.startup_s,
            "process_s": self.ready_at - psutil.Process().create_time(),
            "engine_s": float(getattr(self.engine, "start_s", 0.0)),
            "model_s": self.model_s,
        }

    def rss_bytes(self) -> int:
        """Resident memory of this process."""
        return int(psutil.Process().memory_info().rss)

    def shutdown(self) -> None:
        """Shut the tool workers and the engine down, then release the process groups (which the engine may have
        torn down already)."""
        if self.sync is not None:
            self.sync.close()
        if isinstance(self.stream, TrajectoryStream):
            self.stream.close()
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
        if self._rendezvous is not None:
            self._rendezvous.close()
