"""Where the workers of several machines meet: a TCP store that listens only on the interface the cluster reaches it
at and admits only members that know the run's secret.

torch's ``TCPStore`` listens on every interface and authenticates nobody: any host that can reach the port can read
and write the keys a process group (or the weight-sync group of two pools) rendezvous through. Here the hosting rank
runs the store on loopback, on a socket it binds itself (``master_listen_fd``), behind a gate bound to the address
the driver gave it (``tcp://HOST:PORT?auth=SECRET``): a connection must answer an HMAC-SHA256 challenge keyed by the
run's secret within ``GATE_TIMEOUT_S`` before the gate relays its bytes to the store; any other connection is closed
and counted. Every other member reaches the store through a relay on its own loopback that answers the challenge for
each connection its ``TCPStore`` client opens. The driver makes the secret per run (``secrets.token_hex``) and hands
it to the workers with their start-up arguments, over Ray's token-authenticated channel; it is never printed.
``file://`` rendezvous (one machine) listen on nothing and are used as they are.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import secrets
import socket
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

if TYPE_CHECKING:
    import torch.distributed as dist


GATE_TIMEOUT_S = 5.0
"""Seconds a connection to the gate has to answer its challenge."""
_HELLO = b"vlmrl-rendezvous-1"
_NONCE, _MAC = 32, 32


def tcp_address(host: str, port: int, secret: str) -> str:
    """The rendezvous address the driver hands the workers."""
    return f"tcp://{host}:{port}?auth={secret}"


def new_secret() -> str:
    """A fresh run secret (256 bits)."""
    return secrets.token_hex(32)


@dataclass
class Rendezvous:
    """A store for ``torch.distributed`` and what serves it (closed with :meth:`close`)."""

    store: dist.Store
    refused: int = 0
    """Connections the gate refused, on the hosting rank (the first is named on stderr)."""
    _sockets: list[socket.socket] = field(default_factory=list)

    def close(self) -> None:
        """Stop accepting connections (the relays of open ones end with them)."""
        for s in self._sockets:
            try:
                s.close()
            except OSError:
                pass


def make_store(init: str, rank: int, world: int, timeout: datetime.timedelta, host_rank: int = 0) -> Rendezvous:
    """The store of ``init`` for member ``rank`` of ``world`` (``host_rank`` hosts a TCP one): ``file://PATH``, or
    ``tcp://HOST:PORT?auth=SECRET`` served through the gate (see the module docstring)."""
    import torch.distributed as dist  # (here: the driver imports this module for tcp_address without torch)

    if init.startswith("file://"):
        return Rendezvous(dist.FileStore(init.removeprefix("file://"), world))
    url = urlsplit(init)
    secret = (parse_qs(url.query).get("auth") or [""])[0]
    if url.scheme != "tcp" or not url.hostname or not url.port or len(secret) < 32:
        raise ValueError("rendezvous: expected file://PATH or tcp://HOST:PORT?auth=SECRET (a secret of 32+ characters)")
    key = secret.encode()
    if rank == host_rank:
        return _host(url.hostname, url.port, key, world, timeout)
    return _member(url.hostname, url.port, key, world, timeout)


def _listener(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port))
    s.listen(128)
    return s


def _host(host: str, port: int, key: bytes, world: int, timeout: datetime.timedelta) -> Rendezvous:
    """The hosting rank: the store on loopback, the gate on ``host:port``."""
    import torch.distributed as dist

    inner = _listener("127.0.0.1", 0)
    local_port = inner.getsockname()[1]
    store = dist.TCPStore(
        "127.0.0.1",
        local_port,
        world,
        is_master=True,
        timeout=timeout,
        wait_for_workers=False,
        master_listen_fd=inner.fileno(),
    )
    gate = _listener(host, port)
    rv = Rendezvous(store, _sockets=[gate, inner])

    def admit(conn: socket.socket, peer: str) -> None:
        try:
            conn.settimeout(GATE_TIMEOUT_S)
            nonce = secrets.token_bytes(_NONCE)
            conn.sendall(_HELLO + nonce)
            answer = _recv_exactly(conn, _MAC)
            if not hmac.compare_digest(answer, hmac.new(key, nonce, hashlib.sha256).digest()):
                raise PermissionError("wrong answer")
            conn.settimeout(None)
        except OSError as e:  # (PermissionError included)
            rv.refused += 1
            if rv.refused == 1:
                why = f"no valid answer with the run's secret: {e}"
                print(f"[vlmrl] rendezvous: refused {peer} ({why})", file=sys.stderr, flush=True)
            conn.close()
            return
        try:
            store_side = socket.create_connection(("127.0.0.1", local_port))
        except OSError:  # the store is gone (the run is ending)
            conn.close()
            return
        _relay(conn, store_side)

    _serve(gate, admit)
    return rv


def _member(host: str, port: int, key: bytes, world: int, timeout: datetime.timedelta) -> Rendezvous:
    """Another member: a relay on loopback that answers the gate's challenge for each of its connections."""
    import torch.distributed as dist

    relay = _listener("127.0.0.1", 0)

    def forward(local: socket.socket, _peer: str) -> None:
        try:
            remote = socket.create_connection((host, port), timeout=timeout.total_seconds())
            hello = _recv_exactly(remote, len(_HELLO) + _NONCE)
            if not hello.startswith(_HELLO):
                raise ConnectionError(f"{host}:{port} is not a vlmrl rendezvous")
            remote.sendall(hmac.new(key, hello[len(_HELLO) :], hashlib.sha256).digest())
            remote.settimeout(None)
            _relay(local, remote)
        except OSError:
            local.close()  # the store client reports the failure (and retries) itself

    _serve(relay, forward)
    store = dist.TCPStore("127.0.0.1", relay.getsockname()[1], world, is_master=False, timeout=timeout)
    return Rendezvous(store, _sockets=[relay])


def _serve(listener: socket.socket, handle: Callable[[socket.socket, str], None]) -> None:
    """Accept connections on ``listener`` in a daemon thread, each handled in its own."""

    def loop() -> None:
        while True:
            try:
                conn, addr = listener.accept()
            except OSError:  # closed
                return
            peer = f"{addr[0]}:{addr[1]}"
            threading.Thread(target=handle, args=(conn, peer), daemon=True, name="vlmrl-rendezvous").start()

    threading.Thread(target=loop, daemon=True, name="vlmrl-rendezvous-accept").start()


def _recv_exactly(conn: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = conn.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed during the handshake")
        out += chunk
    return out


def _relay(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways between ``a`` and ``b`` until either side closes."""

    def pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    threading.Thread(target=pump, args=(b, a), daemon=True, name="vlmrl-relay").start()
    pump(a, b)
    a.close()
    b.close()


def gate_port_free(host: str) -> int:
    """A free port on ``host``'s interface (the driver's choice for the gate: bound there, not on every interface)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
