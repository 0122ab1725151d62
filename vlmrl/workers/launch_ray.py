"""Workers as Ray actors, for clusters (``trainer.launcher=ray``, picked by ``auto`` when a cluster address is given).

GPU: ``trainer.nnodes`` x ``trainer.n_gpus_per_node`` workers (nccl); CPU: ``trainer.cpu_workers`` (gloo). Workers of
one node are packed together (a PACK placement group). Ray's token authentication stays on: a cluster vlmrl starts
itself runs with ``RAY_AUTH_MODE=token``, and joining a cluster whose processes run without it is refused unless
the environment says so explicitly (README, "GPUs and clusters"). Ray's processes listen on the node's interfaces:
that is what a cluster is; the token is what keeps others out.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from vlmrl.config import VLMRLConfig
from vlmrl.config.checks import planned_device
from vlmrl.workers.group import WorkerError, WorkerGroup, worker_env


def _rendezvous() -> tuple[str, int]:
    """This node's address (as Ray sees it) and a free port: rank 0's TCP rendezvous."""
    import ray

    with socket.socket() as s:
        s.bind(("", 0))
        port = int(s.getsockname()[1])
    return ray.util.get_node_ip_address(), port


def new_token_file() -> str:
    """A fresh random Ray token in a file only this user can read (removed when the driver exits)."""
    import atexit
    import secrets
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="vlmrl-ray-token-")  # mode 0700
    path = os.path.join(folder, "auth_token")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    atexit.register(shutil.rmtree, folder, True)
    return path


def auth_env(cfg: VLMRLConfig) -> None:
    """Set Ray's authentication environment before ``ray`` is imported (Ray reads it at import): token mode, and
    for a cluster started here a fresh token unless the user gave one. ``RAY_AUTH_MODE=disabled`` is refused."""
    if os.environ.get("RAY_AUTH_MODE") == "disabled":
        raise WorkerError(
            "RAY_AUTH_MODE=disabled: vlmrl does not run Ray without authentication (anyone who reaches the cluster's "
            "ports could run code as you). Unset it: Ray then uses token authentication (README, GPUs and clusters)"
        )
    os.environ["RAY_AUTH_MODE"] = "token"
    joining = cfg.trainer.ray_address or os.environ.get("RAY_ADDRESS")
    if not joining and not (os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")):
        os.environ["RAY_AUTH_TOKEN_PATH"] = new_token_file()


def init_ray(cfg: VLMRLConfig, device: str, n_workers: int) -> None:
    """Join the cluster at ``trainer.ray_address`` / ``RAY_ADDRESS``, or start a local one (temp dir from
    ``RAY_TMPDIR``); ``auth_env`` must have run before ``ray`` was imported."""
    import ray

    if ray.is_initialized():
        return
    address = cfg.trainer.ray_address or os.environ.get("RAY_ADDRESS")
    kwargs: dict[str, Any] = dict(
        include_dashboard=False,
        log_to_driver=True,
        runtime_env={"env_vars": worker_env(device)},
        configure_logging=False,
    )
    if address:
        kwargs["address"] = address
    else:
        kwargs["num_cpus"] = max(os.cpu_count() or 1, n_workers)
        if os.environ.get("RAY_TMPDIR"):
            kwargs["_temp_dir"] = os.environ["RAY_TMPDIR"]
    ray.init(**kwargs)


class RayWorkerGroup(WorkerGroup):
    """Hybrid workers as Ray actors; results come back in rank order."""

    def __init__(self, cfg: VLMRLConfig, total_steps: int, limit_images: int) -> None:
        auth_env(cfg)
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from vlmrl.workers.hybrid import HybridWorker

        init_ray(cfg, "cuda" if cfg.trainer.device == "cuda" else "cpu", cfg.trainer.cpu_workers)
        self.device = planned_device(cfg, cuda_available=ray.cluster_resources().get("GPU", 0) > 0)  # the cluster's
        self.timeout_s = float(cfg.trainer.worker_timeout_s)
        if self.device == "cuda":
            self.world = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
            bundles = [{"CPU": 1, "GPU": 1} for _ in range(self.world)]
        else:
            self.world = cfg.trainer.cpu_workers
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
        master = ray.remote(num_cpus=0)(_rendezvous).options(scheduling_strategy=strategy(0))
        addr, port = ray.get(master.remote())
        remote = ray.remote(HybridWorker)
        self.workers = [
            remote.options(num_cpus=1, num_gpus=gpus, scheduling_strategy=strategy(i), max_concurrency=1).remote(
                cfg, i, self.world, f"tcp://{addr}:{port}", self.device, total_steps, limit_images
            )
            for i in range(self.world)
        ]
        self.infos = self.call("startup", "info", [()] * self.world)
        self.startup_s = time.perf_counter() - t0

    def call(self, stage: str, method: str, args: list[tuple]) -> list[Any]:
        """``method(*args[i])`` on worker i; results in rank order. The first failure, or no answer within
        ``trainer.worker_timeout_s``, raises ``WorkerError`` naming the worker and stage."""
        import ray

        futures = [getattr(w, method).remote(*a) for w, a in zip(self.workers, args)]
        rank_of = {f: i for i, f in enumerate(futures)}
        pending = list(futures)
        deadline = time.monotonic() + self.timeout_s
        while pending:
            wait_s = max(0.0, min(5.0, deadline - time.monotonic()))
            ready, pending = ray.wait(pending, num_returns=1, timeout=wait_s)
            for f in ready:
                try:
                    ray.get(f)
                except Exception as e:  # noqa: BLE001
                    raise WorkerError(f"worker {rank_of[f]} failed during {stage}: {type(e).__name__}: {e}") from e
            if pending and time.monotonic() > deadline:
                ranks = sorted(rank_of[f] for f in pending)
                raise WorkerError(
                    f"worker(s) {ranks} did not answer within {self.timeout_s:.0f} s during {stage} "
                    "(trainer.worker_timeout_s): frozen, or waiting in a collective for a worker that is"
                )
        return ray.get(futures)

    def shutdown(self, grace_s: float = 10.0) -> None:
        """End the workers and release their slots (only what this group started; Ray kills actors at once)."""
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
