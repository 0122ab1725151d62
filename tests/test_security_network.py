"""Nothing a run starts can be reached from another machine without a key.

* A local run (the default launcher on one machine: worker processes, vLLM engines, the process group) listens on
  loopback only: tests/test_report.py's run A (30 steps with validation and the Prometheus exporter) lists the
  listening sockets of the driver and every process it started while it trains
  (``test_prometheus_publishes_the_step_metrics_live_on_loopback``).
* A Ray cluster vlmrl starts itself requires Ray's token: a client without it is refused; ``RAY_AUTH_MODE=disabled``
  is refused before anything starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


RAY_HEAD = textwrap.dedent(
    """
    import os, sys, time
    from vlmrl.config import load
    from vlmrl.workers.launch_ray import auth_env, init_ray
    cfg = load(["data.train_files=x", "actor_rollout_ref.model.path=m", "trainer.launcher=ray"])
    auth_env(cfg)
    init_ray(cfg, "cpu", 1)
    import ray
    print("TOKEN", os.environ["RAY_AUTH_TOKEN_PATH"], flush=True)
    print("GCS", ray.get_runtime_context().gcs_address, flush=True)
    time.sleep(240)
    """
)

RAY_CLIENT = textwrap.dedent(
    """
    import sys, ray
    try:
        ray.init(address=sys.argv[1], configure_logging=False, log_to_driver=False)
        print("CONNECTED", flush=True)
        print("RAN", ray.get(ray.remote(lambda: 6 * 7).remote(), timeout=120), flush=True)
    except Exception as e:
        print("REFUSED", type(e).__name__, str(e)[:500].replace("\\n", " "), flush=True)
    """
)


@pytest.mark.slow
def test_a_ray_cluster_vlmrl_starts_requires_its_token(tmp_path: Path) -> None:
    """README, Security: "a Ray cluster vlmrl starts requires a fresh private token (a client without it is
    refused)". The cluster's own token (read from the file vlmrl made, outside the home folder) lets a client connect
    and run a task (the positive control: the cluster is up and reachable); a client with no token (auth on or off on
    its side) or with another token is refused by authentication, its error saying so (not a connection failure)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH") and k != "RAY_ADDRESS"}
    env.update(PYTHONPATH=str(REPO), RAY_TMPDIR=tempfile.mkdtemp(prefix="vr", dir="/tmp"), HOME=str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    other = tmp_path / "other_token"
    other.write_text("0123456789abcdef" * 4)
    other.chmod(0o600)
    head = subprocess.Popen(
        [sys.executable, "-c", RAY_HEAD],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    clients = {}
    try:
        address = token = None
        for line in head.stdout:  # type: ignore[union-attr]
            if line.startswith("TOKEN "):
                token = line.split()[1]
            if line.startswith("GCS "):
                address = line.split()[1]
                break
        assert address and token, "the head did not start"
        assert not token.startswith(str(tmp_path / "home")) and oct(os.stat(token).st_mode & 0o777) == "0o600"
        cases = {
            "its token": {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": token},
            "no token": {"RAY_AUTH_MODE": "token"},
            "auth off": {"RAY_AUTH_MODE": "disabled"},
            "another token": {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(other)},
        }
        for name, extra in cases.items():
            client = subprocess.run(
                [sys.executable, "-c", RAY_CLIENT, address],
                capture_output=True,
                text=True,
                env={**env, **extra},
                timeout=180,
            )
            clients[name] = client.stdout + client.stderr[-2000:]
    finally:
        os.killpg(head.pid, 9)
        head.wait(timeout=30)
    assert "CONNECTED" in clients["its token"] and "RAN 42" in clients["its token"], clients["its token"]
    assert (
        "REFUSED AuthenticationError Token authentication is enabled but no authentication token was found"
        in (clients["no token"])
    )
    for name in ("no token", "auth off", "another token"):
        out = clients[name]
        assert out.startswith("REFUSED ") and "CONNECTED" not in out, (name, out[-3000:])
        # the server's answer (in the exception or the client's log), not a network failure
        assert "AuthenticationError" in out or "Unauthenticated: RPC error: InvalidAuthToken" in out, (name, out)
        assert "connection refused" not in out.lower() and "timed out" not in out.lower(), (name, out)
    assert not (tmp_path / "home" / ".ray" / "auth_token").exists(), "the token is private to the run, not the home"


def test_ray_without_authentication_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from vlmrl.config import load
    from vlmrl.workers.group import WorkerError
    from vlmrl.workers.launch_ray import auth_env

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    cfg = load(["data.train_files=x", "actor_rollout_ref.model.path=m", "trainer.launcher=ray"])
    with pytest.raises(WorkerError, match="does not run Ray without authentication"):
        auth_env(cfg)
