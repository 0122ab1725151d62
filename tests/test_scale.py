"""Scale: tensor-parallel rollout engines shared by groups of workers (vLLM's CPU build runs them here), the guard
that keeps an engine's workers sampling in step, and a real multi-node Ray cluster on this machine."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import psutil
import pytest

from runs import ENV, Run, base_args, make_colour_data, metrics, processes, run_here, run_to_end, wait_for_step

# runs alone in a parallel suite: a Ray cluster of its own and a whole-machine process check. Measured beside other
# tests (2026-11-29) the two cluster tests took 250 s and 141 s (107 s and 60 s alone) and slowed the tests beside
# them: the cluster's daemons keep using the CPU while it stands
pytestmark = pytest.mark.serial

# ----------------------------------------------------------------------------------- tensor-parallel engines


def _guard_rank(rank: int, rendezvous: str, drift: bool, out: dict) -> None:
    import torch
    import torch.distributed as dist

    from vlmrl.workers.hybrid import HybridWorker

    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=2)
    torch.manual_seed(7)  # as HybridWorker seeds an engine group
    if drift and rank == 1:
        torch.rand(1)  # something on one rank only draws a random number
    worker = types.SimpleNamespace(tp=2, world=2, engine_group=0, device="cpu")
    try:
        HybridWorker._check_engine_group_in_step(worker)  # type: ignore[arg-type]
        out[rank] = "ok"
    except RuntimeError as e:
        out[rank] = str(e)
    dist.destroy_process_group()


@pytest.mark.parametrize("drift", [False, True], ids=["in-step", "one-rank-drew"])
def test_an_engine_groups_workers_must_hold_the_same_random_state(tmp_path: Path, drift: bool) -> None:
    """vLLM samples from each process's torch generator: the workers sharing a tensor-parallel engine must hold the
    same state at every rollout, or each samples its own tokens into one forward. A rank that drew a random number
    the others did not is caught before the rollout, on every rank of the group."""
    ctx = processes()
    with ctx.Manager() as manager:
        out = manager.dict()
        procs = [ctx.Process(target=_guard_rank, args=(r, f"file://{tmp_path / 'rdv'}", drift, out)) for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
        results = dict(out)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    if drift:
        assert all("engine 0 hold different random states" in results[r] for r in range(2)), results
    else:
        assert results == {0: "ok", 1: "ok"}


@pytest.fixture(scope="module")
def colour_data(tmp_path_factory) -> Path:
    return make_colour_data(tmp_path_factory.mktemp("colour"))


def _val_responses(folder: Path, step: int) -> list[str]:
    lines = (folder / f"step_{step:06d}.jsonl").read_text().splitlines()
    return [json.loads(line)["response"] for line in lines]


@pytest.mark.slow
def test_tensor_parallel_engine_samples_and_trains_exactly(tiny_model_dir, colour_data, tmp_path: Path) -> None:
    """2 CPU workers sharing one vLLM engine of tensor-parallel size 2 (each holding half of it): greedy validation
    before training answers exactly as two engines of size 1 do, and after every weight push the engine's log-probs
    of what it sampled equal the trainer's (drift < 1e-3): the pushed full tensors land as the right shards. The
    engine's shared-memory segments are the run's own: those a killed run left under vLLM's fixed name do not stop
    it (they did: "create shm in SHMManager failed. errno: 17"), and it leaves none behind."""
    shm = Path("/dev/shm")
    stale = [shm / f"-tp:0-[0-1]-cpushm_{r}" for r in (0, 1)]
    made = [p for p in stale if not p.exists()]
    for p in made:
        p.write_bytes(b"\0" * 4096)
    before = {p.name for p in shm.glob("vlmrl-*cpushm*")}
    runs = {}
    try:
        runs = _tp_runs(tiny_model_dir, colour_data, tmp_path)
    finally:
        for p in made:
            p.unlink(missing_ok=True)
    assert {p.name for p in shm.glob("vlmrl-*cpushm*")} == before
    out2, log2 = runs[2]
    assert "2 hybrid worker(s) on cpu" in log2 and "1 vLLM engine(s) of tensor-parallel size 2" in log2, log2[-3000:]
    assert "2 vLLM engine(s) of tensor-parallel size 1" in runs[1][1]
    before = _val_responses(runs[1][0] / "val", 0)
    assert _val_responses(out2 / "val", 0) == before and len(set(before)) > 5
    rows = [r for r in metrics(out2) if "rollout/logprob_diff" in r]
    assert len(rows) == 3 and all(r["rollout/logprob_diff"] < 1e-3 for r in rows), rows
    assert all(r["actor/grad_norm"] > 0 for r in rows)


def _tp_runs(tiny_model_dir: str, colour_data: Path, tmp_path: Path) -> dict[int, tuple[Path, str]]:
    """3 steps with engines of tensor-parallel size 1, then 2: each run's folder and output."""
    runs = {}
    for tp in (1, 2):
        out = tmp_path / f"tp{tp}"
        run = run_here(
            base_args(
                tiny_model_dir,
                colour_data,
                out,
                "trainer.total_training_steps=3",
                "trainer.test_freq=3",
                "trainer.val_before_train=true",
                f"trainer.validation_data_dir={out / 'val'}",
                f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}",
            ),
            timeout=600,
        )
        runs[tp] = (out, run.output())
    return runs


# ------------------------------------------------------------------------------------------- a Ray cluster


class RayCluster:
    """The README's multi-node recipe on this machine, node by node: a private token file, ``ray start --head`` and
    ``ray start --address`` (one CPU each, so the two workers must land on different nodes), both with
    ``RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH``. Its processes are told apart by its own temp dir; only they are
    ended."""

    def __init__(self) -> None:
        self.tmp = tempfile.mkdtemp(prefix="vc", dir="/tmp")  # short: Ray's socket paths have a length limit
        token = Path(self.tmp) / "token"
        make_token = f'(umask 077; "{sys.executable}" -c "import secrets; print(secrets.token_hex(32))" > {token})'
        subprocess.run(["bash", "-c", make_token], check=True)  # the README's line
        assert oct(token.stat().st_mode & 0o777) == "0o600"
        self.env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token), "RAY_TMPDIR": self.tmp}
        ray = str(Path(sys.executable).with_name("ray"))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        common = ["--num-cpus=1", "--disable-usage-stats"]
        self._start([ray, "start", "--head", f"--port={port}", "--include-dashboard=false", *common])
        self.head = self.pids()
        self._start([ray, "start", f"--address=127.0.0.1:{port}", *common])
        self.second = self.pids() - self.head

    def _start(self, cmd: list[str]) -> None:
        proc = subprocess.run(cmd, env={**os.environ, **self.env}, capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]

    def pids(self) -> set[int]:
        """This cluster's processes: those whose command line names its temp dir, and their children."""
        found: set[int] = set()
        for p in psutil.process_iter(["cmdline"]):
            try:
                if self.tmp in " ".join(p.info["cmdline"] or []):
                    found |= {p.pid, *(c.pid for c in p.children(recursive=True))}
            except psutil.Error:
                pass
        return found

    def kill(self, pids: set[int]) -> None:
        for pid in pids:
            try:
                for c in psutil.Process(pid).children(recursive=True):
                    c.kill()
                os.kill(pid, signal.SIGKILL)
            except (psutil.Error, ProcessLookupError):
                pass

    def stop(self) -> None:
        self.kill(self.pids())

    def second_node_id(self) -> str:
        """The Ray node id of the second machine, read off its raylet's command line (``--node_id=...``)."""
        for pid in self.second:
            try:
                for arg in psutil.Process(pid).cmdline():
                    if arg.startswith("--node_id="):
                        return arg.split("=", 1)[1]
            except psutil.Error:
                pass
        raise AssertionError("the second node's raylet was not found")


@pytest.fixture(scope="module")
def ray_cluster():
    """One 2-node cluster for the module: the pools test runs first, the two-node test (which ends by killing the
    second node) last."""
    cluster = RayCluster()
    try:
        yield cluster
    finally:
        cluster.stop()


def _nodes(log: str) -> list[str]:
    line = next(x for x in log.splitlines() if "hybrid worker(s) on" in x and "rank@node:" in x)
    return re.findall(r"(\d+)@(\S+?)[,)]", line.split("rank@node:")[1])


@pytest.mark.slow
def test_one_step_off_policy_pools_on_two_nodes(tiny_model_dir, colour_data, tmp_path, ray_cluster) -> None:
    """``actor_rollout_ref.hybrid_engine=False`` on the 2-node cluster (one CPU each): the training worker and the
    rollout worker land on different nodes, the weight sync meets through a TCP store on the training node and
    the engine holds exactly the trainer's weights (first step: log-probs equal); the second step trains the batch
    generated meanwhile (staleness 1)."""
    out = tmp_path / "async"
    args = base_args(
        tiny_model_dir,
        colour_data,
        out,
        "trainer.total_training_steps=2",
        "trainer.val_before_train=false",
        "actor_rollout_ref.hybrid_engine=False",
        "trainer.cpu_workers=1",
        "rollout.cpu_workers=1",
        "trainer.ray_address=auto",
    )
    run = run_to_end(args, env=ray_cluster.env)
    line = next(x for x in run.output().splitlines() if "one-step off-policy:" in x)
    train, pool = (re.search(r"0@(\S+?)\)", part).group(1) for part in line.split(" and ")[:2])
    assert train != pool, line
    rows = metrics(out)
    assert [r["async/staleness"] for r in rows] == [0.0, 1.0]
    assert rows[0]["rollout/logprob_diff"] <= 1e-5 and rows[0]["timing/param_sync_s"] > 0


@pytest.mark.slow
def test_two_node_ray_cluster_trains_like_one_machine(tiny_model_dir, colour_data, tmp_path, ray_cluster) -> None:
    """A 2-node Ray cluster started as the README says (token authentication on): 3 steps with trainer.nnodes=2
    trainer.cpu_workers=1 trainer.ray_address=auto put one worker on each node (the start-up line names them) and
    give the same metrics as 2 worker processes on one machine with the same seed. Then losing a node mid-run is
    reported like a dead worker: the run stops, exit 1, naming the worker and the checkpoint to resume from."""
    from test_train_e2e import CURVE_KEYS, _compare_curves

    steps = ("trainer.total_training_steps=3", "trainer.val_before_train=false")
    one = tmp_path / "one"
    run_here(base_args(tiny_model_dir, colour_data, one, *steps, "trainer.cpu_workers=2"))
    two = tmp_path / "two"
    cluster_args = ("trainer.nnodes=2", "trainer.cpu_workers=1", "trainer.ray_address=auto")
    run = run_to_end(base_args(tiny_model_dir, colour_data, two, *steps, *cluster_args), env=ray_cluster.env)
    nodes = dict(_nodes(run.output()))
    assert set(nodes) == {"0", "1"} and nodes["0"] != nodes["1"], run.output()[-3000:]
    _compare_curves(metrics(one), metrics(two), CURVE_KEYS)

    lost = tmp_path / "lost"
    args = base_args(
        tiny_model_dir,
        colour_data,
        lost,
        "trainer.total_training_steps=200",
        "trainer.save_freq=1",
        "trainer.val_before_train=false",
        *cluster_args,
    )
    victim = Run(args, {**ENV, **ray_cluster.env})
    try:
        wait_for_step(victim, lost, 2, timeout=300)
        # Ray decides which node gets which placement group: the rank on the second machine is read, not assumed
        second = ray_cluster.second_node_id()[:8]
        on_second = [rank for rank, node in _nodes(victim.output()) if node.endswith("/" + second)]
        assert len(on_second) == 1, (second, _nodes(victim.output()))
        t0 = time.monotonic()
        ray_cluster.kill(ray_cluster.second)  # the second machine goes away: its raylet and the worker on it
        rc = victim.wait(timeout=240)
        took = time.monotonic() - t0
    finally:
        victim.cleanup()
    out = victim.output()
    assert rc == 1, out[-3000:]
    pattern = rf"step \d+: worker\(s\) \[{on_second[0]}\] lost during \w+: their node \S+/{second} left the Ray cluster"
    stop = re.search(pattern, out)
    assert stop, out[-3000:]  # the worker that was on the lost machine, not the survivor whose collective broke
    resume = r"last complete checkpoint: \S*global_step_\d+ \(trainer.resume_mode=auto continues from it\)"
    assert re.search(resume, out), out[-3000:]
    print(f"lost node reported {took:.1f} s after the kill: {stop.group(0)}")
