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
import re
import subprocess
import sys
import tempfile
import textwrap
import time
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


MEMBER = textwrap.dedent(
    """
    import datetime, sys, time
    import torch, torch.distributed as dist
    from vlmrl.workers.rendezvous import make_store
    rv = make_store(sys.argv[1], int(sys.argv[2]), 2, datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=rv.store, rank=int(sys.argv[2]), world_size=2)
    x = torch.tensor([float(sys.argv[2]) + 1])
    dist.all_reduce(x)
    print("SUM", float(x), flush=True)
    if sys.argv[2] == "0":  # the host stays up until the test has tried everything against it
        sys.stdin.readline()
        deadline = time.monotonic() + 10  # (the gate's thread may still be closing the intruder's connection)
        while not rv.refused and time.monotonic() < deadline:
            time.sleep(0.05)
        print("GATE REFUSED", rv.refused, flush=True)
    dist.destroy_process_group()
    """
)

INTRUDER = textwrap.dedent(
    """
    import datetime, socket, sys
    import torch.distributed as dist
    host, port = sys.argv[1], int(sys.argv[2])
    try:  # a TCPStore client, as an attacker would write one: read the keys, write one
        store = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=3))
        print("READ", store.list_keys(), flush=True)
        store.set("intruder", "1")
        print("WROTE", flush=True)
    except Exception as e:
        print("REFUSED", type(e).__name__, flush=True)
    """
)


class Netns:
    """A network namespace joined to this one by a veth pair: the host side at ``host``, the namespace's at
    ``other`` (a second machine's address, as far as the network can tell)."""

    def __init__(self, tag: str) -> None:
        self.name, n = f"vlmrl-{tag}", int(tag) % 200 + 20
        self.host, self.other = f"10.231.{n}.1", f"10.231.{n}.2"
        self.veth = (f"vh{tag}"[:15], f"vn{tag}"[:15])
        for cmd in (
            f"ip netns add {self.name}",
            f"ip link add {self.veth[0]} type veth peer name {self.veth[1]}",
            f"ip link set {self.veth[1]} netns {self.name}",
            f"ip addr add {self.host}/24 dev {self.veth[0]}",
            f"ip link set {self.veth[0]} up",
            f"ip netns exec {self.name} ip addr add {self.other}/24 dev {self.veth[1]}",
            f"ip netns exec {self.name} ip link set {self.veth[1]} up",
            f"ip netns exec {self.name} ip link set lo up",
        ):
            subprocess.run(cmd.split(), check=True, capture_output=True)

    def python(self, code: str, *args: str, env: dict[str, str]) -> subprocess.Popen:
        """``python -c code args`` inside the namespace."""
        cmd = ["ip", "netns", "exec", self.name, sys.executable, "-c", code, *args]
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def close(self) -> None:
        subprocess.run(["ip", "link", "del", self.veth[0]], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)


@pytest.mark.slow
def test_the_tcp_rendezvous_listens_on_the_cluster_address_only_and_admits_only_the_runs_members() -> None:
    """Issue 44 item 1, tried from a second address (a network namespace): the hosting rank's store listens on the
    address it was given and on loopback, nowhere else; a TCPStore client from the other address without the run's
    secret is refused (it reads no key and writes none, and the gate counts it); a member there with the secret
    joins, and the two ranks' gloo group reduces a tensor (the run goes on)."""
    import psutil

    from vlmrl.workers.rendezvous import gate_port_free, new_secret, tcp_address

    ns = Netns(str(os.getpid()))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    here, there = {**env, "GLOO_SOCKET_IFNAME": ns.veth[0]}, {**env, "GLOO_SOCKET_IFNAME": ns.veth[1]}
    try:
        port = gate_port_free(ns.host)
        init = tcp_address(ns.host, port, new_secret())
        host = subprocess.Popen(
            [sys.executable, "-c", MEMBER, init, "0"],
            env=here,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        deadline = time.monotonic() + 60
        listening: list = []
        while time.monotonic() < deadline and not any(c.laddr.port == port for c in listening):
            time.sleep(0.2)
            listening = [c for c in psutil.Process(host.pid).net_connections() if c.status == "LISTEN"]
        intruder = ns.python(INTRUDER, ns.host, str(port), env=there)
        member = ns.python(MEMBER, init, "1", env=there)  # (at the same time: the run goes on beside the intruder)
        out_intruder = intruder.communicate(timeout=60)[0]
        out_member = member.communicate(timeout=120)[0]
        out_host = host.communicate("\n", timeout=60)[0]
    finally:
        for p in ("host", "member", "intruder"):
            proc = locals().get(p)
            if proc is not None and proc.poll() is None:
                proc.kill()
        ns.close()
    addresses = {c.laddr.ip for c in listening}
    assert addresses <= {ns.host, "127.0.0.1"} and ns.host in addresses, listening
    assert "REFUSED" in out_intruder and "READ" not in out_intruder and "WROTE" not in out_intruder, out_intruder
    assert "SUM 3.0" in out_member and "SUM 3.0" in out_host, (out_member, out_host)
    refused = re.search(r"GATE REFUSED (\d+)", out_host)  # (the intruder's client retries until its timeout)
    assert "rendezvous: refused" in out_host and refused and int(refused.group(1)) >= 1, (out_host, out_intruder)


def test_a_tcp_rendezvous_needs_the_runs_secret() -> None:
    """The TCP rendezvous address carries the run's secret; one without (or with a short one) is refused before
    anything listens."""
    import datetime

    from vlmrl.workers.rendezvous import make_store, new_secret, tcp_address

    t = datetime.timedelta(seconds=5)
    for bad in ("tcp://127.0.0.1:29500", "tcp://127.0.0.1:29500?auth=short", "udp://127.0.0.1:1?auth=" + "a" * 64):
        with pytest.raises(ValueError, match=r"tcp://HOST:PORT\?auth=SECRET"):
            make_store(bad, 0, 2, t)
    assert len(new_secret()) == 64 and tcp_address("10.0.0.1", 7, "s") == "tcp://10.0.0.1:7?auth=s"
