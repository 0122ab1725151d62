"""Nothing a run starts can be reached from another machine without a key.

* A local run (the default launcher on one machine: worker processes, vLLM engines, the process group) listens on
  loopback only: the test lists the listening sockets of the driver and every process it started while it trains.
* A Ray cluster vlmrl starts itself requires Ray's token: a client without it is refused; ``RAY_AUTH_MODE=disabled``
  is refused before anything starts.
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[1]


def listening(pids: set[int]) -> set[tuple[str, int, str]]:
    """(address, port, process name) of every listening TCP socket of these processes."""
    out = set()
    for c in psutil.net_connections(kind="inet"):
        if c.status == psutil.CONN_LISTEN and c.pid in pids:
            try:
                name = psutil.Process(c.pid).name()
            except psutil.Error:
                name = "?"
            out.add((c.laddr.ip, c.laddr.port, name))
    return out


def family(proc: subprocess.Popen) -> set[int]:
    try:
        root = psutil.Process(proc.pid)
        return {proc.pid} | {p.pid for p in root.children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


@pytest.mark.slow
def test_a_local_run_listens_on_loopback_only(tiny_model_dir: str, tmp_path: Path) -> None:
    from vlmrl.preprocess.synthetic import main as synthetic

    synthetic(["--output-dir", str(tmp_path / "data"), "--families", "colour", "--image-size", "56",
               "--train-size", "64", "--test-size", "8", "--seed", "0", "--no-progress"])  # fmt: skip
    out = tmp_path / "run"
    args = [sys.executable, "-m", "vlmrl.train", "--config-name", "tiny_cpu",
            f"data.train_files={tmp_path / 'data/train.parquet'}", f"data.val_files={tmp_path / 'data/test.parquet'}",
            f"actor_rollout_ref.model.path={tiny_model_dir}", f"trainer.default_local_dir={out}",
            "trainer.total_training_steps=40", "trainer.logger=[jsonl]", "trainer.save_freq=20"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("RAY_ADDRESS", None)
    log = open(tmp_path / "log.txt", "w+")  # noqa: SIM115
    proc = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    seen: set[tuple[str, int, str]] = set()
    processes: set[int] = set()
    try:
        deadline = time.monotonic() + 600
        while proc.poll() is None and time.monotonic() < deadline:
            pids = family(proc)
            processes |= pids
            seen |= listening(pids)
            time.sleep(0.2)
        assert proc.wait(timeout=60) == 0, Path(log.name).read_text()[-4000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
    assert len(processes) >= 3, "the driver and its two worker processes"
    assert seen, "the workers' process group talks over loopback sockets: none were seen"
    exposed = {s for s in seen if not ipaddress.ip_address(s[0]).is_loopback}
    assert not exposed, f"listening on a network interface: {sorted(exposed)}"


RAY_HEAD = textwrap.dedent(
    """
    import os, sys, time
    from vlmrl.config import load
    from vlmrl.workers.launch_ray import auth_env, init_ray
    cfg = load(["data.train_files=x", "actor_rollout_ref.model.path=m", "trainer.launcher=ray"])
    auth_env(cfg)
    init_ray(cfg, "cpu", 1)
    import ray
    print("GCS", ray.get_runtime_context().gcs_address, flush=True)
    time.sleep(120)
    """
)

RAY_CLIENT = textwrap.dedent(
    """
    import sys, ray
    try:
        ray.init(address=sys.argv[1], configure_logging=False, log_to_driver=False)
        print("CONNECTED", ray.cluster_resources(), flush=True)
    except Exception as e:
        print("REFUSED", type(e).__name__, str(e)[:300], flush=True)
    """
)


@pytest.mark.slow
def test_a_ray_cluster_vlmrl_starts_requires_its_token(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH") and k != "RAY_ADDRESS"}
    env.update(PYTHONPATH=str(REPO), RAY_TMPDIR=tempfile.mkdtemp(prefix="vr", dir="/tmp"), HOME=str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    head = subprocess.Popen([sys.executable, "-c", RAY_HEAD], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)  # fmt: skip
    try:
        address = None
        for line in head.stdout:  # type: ignore[union-attr]
            if line.startswith("GCS "):
                address = line.split()[1]
                break
        assert address, "the head did not start"
        for mode in ("token", "disabled"):  # a stranger without the token, with auth on or off on his side
            client = subprocess.run([sys.executable, "-c", RAY_CLIENT, address], capture_output=True, text=True,
                                    env={**env, "RAY_AUTH_MODE": mode}, timeout=120)  # fmt: skip
            out = client.stdout
            assert "REFUSED" in out and "CONNECTED" not in out, out + client.stderr[-2000:]
    finally:
        os.killpg(head.pid, 9)
        head.wait(timeout=30)
    assert not (tmp_path / "home" / ".ray" / "auth_token").exists(), "the token is private to the run, not the home"


def test_ray_without_authentication_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from vlmrl.config import load
    from vlmrl.workers.group import WorkerError
    from vlmrl.workers.launch_ray import auth_env

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    cfg = load(["data.train_files=x", "actor_rollout_ref.model.path=m", "trainer.launcher=ray"])
    with pytest.raises(WorkerError, match="does not run Ray without authentication"):
        auth_env(cfg)
