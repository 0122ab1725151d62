"""The Ray worker group: one hybrid worker per device, placed with a placement group, driven by the single controller.

CPU: ``trainer.cpu_workers`` processes (gloo). GPU: ``trainer.nnodes`` x ``trainer.n_gpus_per_node`` workers (nccl).
More machines join an existing cluster with ``ray start --address=HEAD:6379`` and the launch sets
``trainer.ray_address=auto``. A worker that dies or raises stops the driver with an error naming the worker and the
stage, instead of leaving the others waiting in a collective.
"""

from __future__ import annotations

import os
import time
from typing import Any

from vlmrl.config import VLMRLConfig


class WorkerError(RuntimeError):
    """A worker failed; the message names its rank and the stage."""


def worker_env(device: str) -> dict[str, str]:
    """Environment every worker process starts with."""
    env = {
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "ERROR"),
        "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled"),
    }
    if device == "cpu":
        env.update(
            OMP_NUM_THREADS=os.environ.get("VLMRL_WORKER_THREADS", "1"),
            VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
            VLLM_CPU_OMP_THREADS_BIND="nobind",
        )
    for k in ("VLMRL_CACHE", "HF_HOME", "HF_HUB_OFFLINE", "PYTHONPATH"):
        if k in os.environ:
            env[k] = os.environ[k]
    return env


def init_ray(cfg: VLMRLConfig, device: str, n_workers: int) -> None:
    """Start or join Ray (temp dir from RAY_TMPDIR; token auth off for local clusters)."""
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    kwargs: dict[str, Any] = dict(
        include_dashboard=False,
        log_to_driver=True,
        runtime_env={"env_vars": worker_env(device)},
        configure_logging=False,
    )
    address = cfg.trainer.ray_address or os.environ.get("RAY_ADDRESS")
    if address:  # join a running cluster (ray start --head / --address=...)
        kwargs["address"] = address
    else:
        kwargs["num_cpus"] = max(os.cpu_count() or 1, n_workers)
        if os.environ.get("RAY_TMPDIR"):
            kwargs["_temp_dir"] = os.environ["RAY_TMPDIR"]
    ray.init(**kwargs)


def cluster_has_gpus() -> bool:
    """True when the Ray cluster offers GPUs."""
    import ray

    return ray.cluster_resources().get("GPU", 0) > 0


class WorkerGroup:
    """Hybrid workers on Ray; methods run on every worker and results come back in rank order."""

    def __init__(self, cfg: VLMRLConfig, total_steps: int, limit_images: int) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from vlmrl.workers.hybrid import HybridWorker, find_master

        req = cfg.trainer.device
        cpu_n = cfg.trainer.cpu_workers
        init_ray(cfg, "cuda" if req == "cuda" else "cpu", cpu_n)
        self.device = req if req != "auto" else ("cuda" if cluster_has_gpus() else "cpu")
        if self.device == "cuda":
            self.world = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
            bundles = [{"CPU": 1, "GPU": 1} for _ in range(self.world)]
        else:
            self.world = cpu_n
            bundles = [{"CPU": 1} for _ in range(self.world)]
        t0 = time.perf_counter()
        self.pg = placement_group(bundles, strategy="PACK")
        try:
            ray.get(self.pg.ready(), timeout=120)
        except Exception as e:  # noqa: BLE001
            raise WorkerError(
                f"could not reserve {self.world} worker slot(s) {bundles[0]} in the Ray cluster "
                f"(resources: {ray.cluster_resources()}); lower trainer.cpu_workers / n_gpus_per_node or add nodes"
            ) from e

        def strategy(i: int) -> PlacementGroupSchedulingStrategy:
            return PlacementGroupSchedulingStrategy(placement_group=self.pg, placement_group_bundle_index=i)

        gpus = 1 if self.device == "cuda" else 0
        master = ray.remote(num_cpus=0)(find_master).options(scheduling_strategy=strategy(0))
        addr, port = ray.get(master.remote())
        cfg.trainer.device = self.device
        Remote = ray.remote(HybridWorker)
        self.workers = [
            Remote.options(num_cpus=1, num_gpus=gpus, scheduling_strategy=strategy(i), max_concurrency=1).remote(
                cfg, i, self.world, addr, port, total_steps, limit_images
            )
            for i in range(self.world)
        ]
        self.infos = self.run("startup", "info", [()] * self.world)
        self.startup_s = time.perf_counter() - t0

    def run(self, stage: str, method: str, args: list[tuple], timeout_s: float | None = None) -> list[Any]:
        """Call ``method(*args[i])`` on worker i; return results in rank order. The first failure raises
        ``WorkerError`` naming the worker and stage (the others are not waited for)."""
        import ray

        futures = [getattr(w, method).remote(*a) for w, a in zip(self.workers, args)]
        rank_of = {f: i for i, f in enumerate(futures)}
        pending = list(futures)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while pending:
            wait_s = 5.0 if deadline is None else max(0.0, min(5.0, deadline - time.monotonic()))
            ready, pending = ray.wait(pending, num_returns=1, timeout=wait_s)
            for f in ready:
                try:
                    ray.get(f)
                except Exception as e:  # noqa: BLE001
                    raise WorkerError(f"worker {rank_of[f]} failed during {stage}: {type(e).__name__}: {e}") from e
            if deadline is not None and time.monotonic() > deadline and pending:
                ranks = sorted(rank_of[f] for f in pending)
                raise WorkerError(f"worker(s) {ranks} did not finish {stage} within {timeout_s:.0f} s")
        return ray.get(futures)

    def shutdown(self) -> None:
        """End the workers and release their slots (only what this group started)."""
        import ray
        from ray.util.placement_group import remove_placement_group

        for w in self.workers:
            try:
                ray.kill(w)
            except Exception:  # noqa: BLE001
                pass
        try:
            remove_placement_group(self.pg)
        except Exception:  # noqa: BLE001
            pass


class LocalWorkerGroup:
    """One hybrid worker in the driver's own process (``trainer.use_ray=false``): the same calls as
    :class:`WorkerGroup` without Ray, for a single device, debugging and machines without Ray installed."""

    def __init__(self, cfg: VLMRLConfig, total_steps: int, limit_images: int) -> None:
        import torch

        from vlmrl.workers.hybrid import HybridWorker, free_port

        req = cfg.trainer.device
        self.device = req if req != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        cfg.trainer.device = self.device
        self.world = 1
        for k, v in worker_env(self.device).items():
            os.environ.setdefault(k, v)
        t0 = time.perf_counter()
        self.workers = [HybridWorker(cfg, 0, 1, "127.0.0.1", free_port(), total_steps, limit_images)]
        self.infos = [self.workers[0].info()]
        self.startup_s = time.perf_counter() - t0

    def run(self, stage: str, method: str, args: list[tuple], timeout_s: float | None = None) -> list[Any]:
        """Call ``method(*args[0])`` on the worker; a failure raises ``WorkerError`` naming the stage."""
        try:
            return [getattr(self.workers[0], method)(*args[0])]
        except Exception as e:
            raise WorkerError(f"worker 0 failed during {stage}: {type(e).__name__}: {e}") from e

    def shutdown(self) -> None:
        """Release the worker's process group."""
        self.workers[0].shutdown()


def make_worker_group(cfg: VLMRLConfig, total_steps: int, limit_images: int) -> WorkerGroup | LocalWorkerGroup:
    """The worker group the config asks for: Ray (default) or one in-process worker (``trainer.use_ray=false``)."""
    if cfg.trainer.use_ray:
        return WorkerGroup(cfg, total_steps, limit_images)
    return LocalWorkerGroup(cfg, total_steps, limit_images)
