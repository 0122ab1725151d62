"""Workers as Ray actors, for clusters (``trainer.launcher=ray``, picked by ``auto`` when a cluster address is given
or ``trainer.nnodes`` > 1).

``trainer.nnodes`` machines, each with ``trainer.n_gpus_per_node`` GPU workers (nccl) or ``trainer.cpu_workers`` CPU
workers (gloo); a node's workers are one STRICT_PACK placement group (one machine), checked after placement. Ray's
token authentication stays on: a cluster vlmrl starts itself runs with ``RAY_AUTH_MODE=token`` and a fresh private
token; a cluster it joins must use the token in ``RAY_AUTH_TOKEN_PATH`` (README, "GPUs and clusters");
``RAY_AUTH_MODE=disabled`` is refused. Ray's processes listen on the node's interfaces: that is what a cluster is;
the token is what keeps others out.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from typing import Any

from vlmrl.config import VLMRLConfig
from vlmrl.config.network import ray_auth_problem
from vlmrl.config.plan import WorkerPlan, per_node, planned_device, ray_address, rollout_per_node
from vlmrl.startup import StartupFailure, failure_of
from vlmrl.timing import Timer
from vlmrl.workers.group import Pending, WorkerError, WorkerGroup, worker_env
from vlmrl.workers.rendezvous import new_secret, tcp_address


class StartupFailed(Exception):
    """Raised by a Ray worker's ``info()`` when the worker could not start; carries the ``StartupFailure``."""

    def __init__(self, failure: StartupFailure) -> None:
        super().__init__(failure)
        self.failure = failure

    def __str__(self) -> str:
        return f"{self.failure.what}: {self.failure.cause}"


@functools.cache
def _ray_worker_class() -> type:
    """``HybridWorker`` as Ray runs it: an exception while it starts is kept (described where it happened, with the
    step that failed) and raised by ``info()``, instead of killing the actor with only a text of it."""
    from vlmrl.workers.hybrid import HybridWorker

    class _RayHybridWorker(HybridWorker):
        def __init__(self, plan: WorkerPlan, rank: int, init_method: str) -> None:
            self._failure: StartupFailure | None = None
            try:
                super().__init__(plan, rank, init_method)
            except Exception as e:  # noqa: BLE001 - reported by info(), which the driver calls first
                who = "rollout worker" if plan.role == "rollout" else "worker"
                self._failure = failure_of(e, f"{who} {rank} could not start")

        def info(self) -> dict[str, Any]:
            if self._failure is not None:
                raise StartupFailed(self._failure)
            return super().info()

    # found by this module's __getattr__ (pickled by reference); Ray's log lines name it HybridWorker, as before
    _RayHybridWorker.__module__, _RayHybridWorker.__qualname__ = __name__, "_RayHybridWorker"
    _RayHybridWorker.__name__ = "HybridWorker"
    return _RayHybridWorker


def __getattr__(name: str) -> Any:
    """``_RayHybridWorker`` is made on first use (it imports torch); Ray's workers find it by this name."""
    if name == "_RayHybridWorker":
        return _ray_worker_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _rendezvous() -> tuple[str, int]:
    """This node's address (as Ray sees it) and a free port on it: where rank 0's gated TCP store
    (``vlmrl.workers.rendezvous``) listens, on that interface only."""
    import ray

    from vlmrl.workers.rendezvous import gate_port_free

    addr = ray.util.get_node_ip_address()
    return addr, gate_port_free(addr)


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
    problem = ray_auth_problem()
    if problem:
        raise WorkerError(problem)
    os.environ["RAY_AUTH_MODE"] = "token"
    if not ray_address(cfg) and not (os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")):
        os.environ["RAY_AUTH_TOKEN_PATH"] = new_token_file()


def init_ray(cfg: VLMRLConfig, device: str, n_workers: int) -> None:
    """Join the cluster at ``trainer.ray_address`` / ``RAY_ADDRESS``, or start a local one (temp dir from
    ``RAY_TMPDIR``); ``auth_env`` must have run before ``ray`` was imported."""
    import ray

    if ray.is_initialized():
        return
    address = ray_address(cfg)
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
    try:
        ray.init(**kwargs)
    except (ConnectionError, RuntimeError) as e:
        if not address:
            raise
        raise WorkerError(
            f"could not join the Ray cluster at {address!r} ({type(e).__name__}: {e}). Start it first with token "
            "authentication (README, GPUs and clusters: RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=<the cluster's token "
            "file> in the environment of ray start and of this launch), or run on one machine with trainer.nnodes=1"
        ) from None


def _fits(nodes: list[dict[str, float]], bundle: dict[str, int], per: int) -> int:
    """How many groups of ``per`` bundles, each group on one machine, the nodes' total resources hold."""
    return sum(int(min(r.get(k, 0) // (v * per) for k, v in bundle.items())) for r in nodes)


class RayWorkerGroup(WorkerGroup):
    """Hybrid workers as Ray actors; results come back in rank order."""

    def __init__(self, cfg: VLMRLConfig, plan: WorkerPlan) -> None:
        """Join or start the cluster, reserve the slots, start the workers; the device is the cluster's (GPU when it
        has GPUs and ``trainer.device`` allows), which the plan the workers get says."""
        auth_env(cfg)
        import ray

        both = cfg.trainer.cpu_workers + (cfg.rollout.cpu_workers if not cfg.actor_rollout_ref.hybrid_engine else 0)
        init_ray(cfg, "cuda" if cfg.trainer.device == "cuda" else "cpu", both)
        cuda = ray.cluster_resources().get("GPU", 0) > 0
        self.device = planned_device(cfg, cuda_available=cuda)
        self.role = plan.role
        self.who = "rollout worker" if plan.role == "rollout" else "worker"
        self.prefix = "rollout." if plan.role == "rollout" else "trainer."
        """Where this pool's sizes are set: ``trainer.*``, or ``rollout.*`` for the rollout pool."""
        self.nnodes = cfg.rollout.nnodes if plan.role == "rollout" else cfg.trainer.nnodes
        self.world = self.nnodes * (rollout_per_node(cfg, cuda) if plan.role == "rollout" else per_node(cfg, cuda))
        plan = dataclasses.replace(plan, device=self.device, world=self.world)
        self.timeout_s = float(cfg.trainer.worker_timeout_s)
        self.startup_timeout_s = float(cfg.trainer.worker_startup_timeout_s)
        self.workers: list[Any] = []
        self.pgs: list[Any] = []
        self._pending: Pending | None = None
        sw = Timer.start()
        try:
            self._start(cfg, plan)
        except BaseException:
            self.shutdown(grace_s=1.0)  # the slots and the workers that did start
            raise
        self.startup_s = sw.elapsed

    def _start(self, cfg: VLMRLConfig, plan: WorkerPlan) -> None:
        """Reserve a placement group per node, start the workers in it and wait until every one is ready."""
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        nodes, per = self.nnodes, self.world // self.nnodes
        bundle = {"CPU": 1, "GPU": 1} if self.device == "cuda" else {"CPU": 1}
        have = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive", True)]
        shown = ", ".join(f"{r.get('CPU', 0):g} CPU + {r.get('GPU', 0):g} GPU" for r in have) or "none"
        problem = (
            f"could not reserve {nodes} node(s) x {per} worker slot(s) of {bundle} in the Ray cluster (its node(s): "
            f"{shown}); lower {self.prefix}nnodes / {self.prefix}"
            + ("n_gpus_per_node" if self.device == "cuda" else "cpu_workers")
            + (", use trainer.device=cpu" if self.device == "cuda" and not any(r.get("GPU") for r in have) else "")
            + ", or add machines"
        )
        if not ray_address(cfg) and _fits(have, bundle, per) < nodes:  # a cluster started here does not grow
            raise WorkerError(problem)
        # one placement group per node, STRICT_PACK: a node's workers (an engine's tensor-parallel group among them)
        # share one machine; rank r is bundle r % per of group r // per
        self.pgs = [placement_group([bundle] * per, strategy="STRICT_PACK") for _ in range(nodes)]
        try:
            ray.get([pg.ready() for pg in self.pgs], timeout=120)
        except Exception as e:  # noqa: BLE001
            raise WorkerError(problem + " (waited 120 s)") from e
        self.node_ids = self._placement(per)

        def strategy(rank: int) -> PlacementGroupSchedulingStrategy:
            return PlacementGroupSchedulingStrategy(
                placement_group=self.pgs[rank // per], placement_group_bundle_index=rank % per
            )

        gpus = 1 if self.device == "cuda" else 0
        self._first = strategy(0)
        master = ray.remote(num_cpus=0)(_rendezvous).options(scheduling_strategy=self._first)
        addr, port = ray.get(master.remote())
        init = tcp_address(addr, port, new_secret())  # the secret travels over Ray's authenticated channel
        remote = ray.remote(_ray_worker_class())
        self.workers = [
            remote.options(num_cpus=1, num_gpus=gpus, scheduling_strategy=strategy(i), max_concurrency=1).remote(
                plan, i, init
            )
            for i in range(self.world)
        ]
        futures = [w.info.remote() for w in self.workers]
        self.infos = self._collect("startup", futures, time.monotonic() + self.startup_timeout_s)
        ip = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
        for info, node in zip(self.infos, self.node_ids):
            info["node"] = f"{ip.get(node, '?')}/{node[:8]}"  # Ray's node: machines may share a host name

    def sync_rendezvous(self) -> str:
        """A TCP store address on rank 0's node, where the weight-sync group of two pools meets."""
        import ray

        addr, port = ray.get(ray.remote(num_cpus=0)(_rendezvous).options(scheduling_strategy=self._first).remote())
        return tcp_address(addr, port, new_secret())

    def _placement(self, per: int) -> list[str]:
        """Each rank's Ray node id, read back from the cluster; a node's group spread over machines (what
        STRICT_PACK promises) is an error, not an assumption."""
        import ray

        node_ids = []
        for k, pg in enumerate(self.pgs):
            table = ray.util.placement_group_table(pg)["bundles_to_node_id"]
            ids = [table[i] for i in range(per)]
            if len(set(ids)) != 1:
                raise WorkerError(f"the workers of node {k} were placed on {len(set(ids))} machines: {ids}")
            node_ids += ids
        return node_ids

    def submit(self, stage: str, method: str, args: list[tuple]) -> Pending:
        """Start ``method(*args[i])`` on worker i; ``result()`` gives the results in rank order. The first failure,
        or no answer within ``trainer.worker_timeout_s`` (counted from now), raises ``WorkerError`` naming the
        worker and stage."""
        if self._pending is not None and not self._pending.waited:
            raise RuntimeError(f"{method} sent while the previous call's answers are not collected")
        futures = [getattr(w, method).remote(*a) for w, a in zip(self.workers, args)]
        deadline = time.monotonic() + self.timeout_s
        self._pending = Pending(lambda: self._collect(stage, futures, deadline))
        return self._pending

    def _collect(self, stage: str, futures: list[Any], deadline: float) -> list[Any]:
        import ray

        rank_of = {f: i for i, f in enumerate(futures)}
        pending = list(futures)
        while pending:
            wait_s = max(0.0, min(5.0, deadline - time.monotonic()))
            ready, pending = ray.wait(pending, num_returns=1, timeout=wait_s)
            for f in ready:
                try:
                    ray.get(f)
                except Exception as e:  # noqa: BLE001
                    raise self._explain(rank_of[f], stage, e) from e
            if pending and time.monotonic() > deadline:
                ranks = sorted(rank_of[f] for f in pending)
                startup = stage == "startup"
                raise WorkerError(
                    f"{self.who}(s) {ranks} did not answer within "
                    f"{self.startup_timeout_s if startup else self.timeout_s:.0f} s during {stage} (trainer."
                    f"{'worker_startup_timeout_s' if startup else 'worker_timeout_s'}): frozen, or waiting in a "
                    "collective for a worker that is"
                )
        return ray.get(futures)

    def _explain(self, rank: int, stage: str, error: Exception, wait_s: float = 30.0) -> WorkerError:
        """The error to report for worker ``rank``'s failure. When it looks like a lost peer (an actor that died, a
        connection a collective lost), wait up to ``wait_s`` for Ray to mark a node dead (its heartbeats stop: ~15 s)
        and name the workers that were on it: a machine that left the cluster is reported like a dead worker, not
        as the survivor whose collective broke."""
        import ray

        failure = getattr(error, "failure", None) or getattr(getattr(error, "cause", None), "failure", None)
        if isinstance(failure, StartupFailure):  # the worker raised while starting (_RayHybridWorker.info)
            return WorkerError(f"{self.who} {rank} failed during {stage}: {failure.cause}", failure=failure)
        text = f"{type(error).__name__}: {error}"
        died = isinstance(error, ray.exceptions.RayActorError) and not error.actor_init_failed
        peer_lost = died or any(
            s in text for s in ("Connection closed by peer", "Connection reset", "Broken pipe", "Socket Timeout")
        )
        deadline = time.monotonic() + (wait_s if peer_lost else 0.0)
        while True:
            dead = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if not n.get("Alive", True)}
            lost = [r for r, node in enumerate(self.node_ids) if node in dead]
            if lost or time.monotonic() >= deadline:
                break
            time.sleep(0.5)
        if not lost:
            return WorkerError(f"{self.who} {rank} failed during {stage}: {text}")
        nodes = sorted({f"{dead[self.node_ids[r]]}/{self.node_ids[r][:8]}" for r in lost})
        first = text.splitlines()[0][:300] if text else ""
        return WorkerError(
            f"{self.who}(s) {lost} lost during {stage}: their node {', '.join(nodes)} left the Ray cluster (its raylet "
            f"stopped answering; {self.who} {rank} then failed: {first})"
        )

    def shutdown(self, grace_s: float = 10.0) -> None:
        """End the workers and release their slots (only what this group started; Ray kills actors at once)."""
        import ray
        from ray.util.placement_group import remove_placement_group

        for w in self.workers:
            try:
                ray.kill(w)
            except Exception:  # noqa: BLE001
                pass
        for pg in self.pgs:
            try:
                remove_placement_group(pg)
            except Exception:  # noqa: BLE001
                pass
