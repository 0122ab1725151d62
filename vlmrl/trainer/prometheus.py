"""``trainer.logger=[..., prometheus]``: the step's metrics as Prometheus gauges on an HTTP endpoint.

Each metric ``a/b_c`` becomes the gauge ``vlmrl_a_b_c`` with the labels ``project`` and ``experiment``, plus
``vlmrl_step``. The endpoint listens on 127.0.0.1 unless ``trainer.prometheus.host`` says otherwise; a non-loopback
address needs ``trainer.prometheus.token_file`` and then answers only requests with ``Authorization: Bearer <token>``
(Prometheus: ``authorization: {credentials_file: ...}`` in the scrape config).

The token file must be a regular file that only its owner can write (``chmod 600``) holding at least
``MIN_TOKEN_CHARS`` printable characters. The server never lets a client hold the driver's threads or files: each
connection has ``request_timeout_s`` (default 5 s) to send its request and get its answer, at most
``max_connections`` (default 16) are served at once (more are closed at once, never queued as threads), and the token
is checked as soon as the request's headers are read, before anything else is done for it.
"""

from __future__ import annotations

import hmac
import math
import re
import socket
import socketserver
import sys
import threading
import time
from typing import Any
from wsgiref.simple_server import ServerHandler, WSGIRequestHandler, WSGIServer, make_server

from vlmrl.config import ConfigError
from vlmrl.config.network import prometheus_problems, read_token_file

_NAME = re.compile(r"[^a-zA-Z0-9_]")


def metric_name(key: str) -> str:
    """The Prometheus name of a vlmrl metric: ``reward/mean`` → ``vlmrl_reward_mean``."""
    return "vlmrl_" + _NAME.sub("_", key)


def _finite(v: Any) -> bool:
    """Whether ``v`` is a finite real number (not a bool; an integer beyond the float range is not)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    """One daemon thread per connection, at most ``max_connections`` at once (more are closed at once); a
    connection still open ``request_timeout_s`` after it was accepted is shut down by the serving loop."""

    daemon_threads = True
    request_queue_size = 64  # connections the kernel holds until accepted (no thread, no file of ours)
    request_timeout_s = 5.0
    max_connections = 16
    token: str | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._active: dict[socket.socket, float] = {}
        self._active_lock = threading.Lock()
        super().__init__(*args, **kwargs)

    def verify_request(self, request: Any, client_address: Any) -> bool:
        with self._active_lock:
            if len(self._active) >= self.max_connections:
                return False  # closed at once by the caller
            self._active[request] = time.monotonic() + self.request_timeout_s
            return True

    def shutdown_request(self, request: Any) -> None:
        with self._active_lock:
            self._active.pop(request, None)
        super().shutdown_request(request)

    def service_actions(self) -> None:
        """Shut down connections past their deadline (a client that sends slowly; its thread then ends)."""
        now = time.monotonic()
        with self._active_lock:
            for conn, deadline in self._active.items():
                if now > deadline:
                    self._active[conn] = math.inf  # once
                    try:
                        conn.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

    def drop_all(self) -> None:
        """Shut down every open connection (at close)."""
        with self._active_lock:
            for conn in self._active:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away or timed out is not an error worth a traceback on the run's console."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class _Handler(WSGIRequestHandler):
    """Reads the request with the server's timeout and answers 401 before anything else when the bearer token is
    missing or wrong."""

    def setup(self) -> None:
        self.timeout = self.server.request_timeout_s  # each read and write of the socket
        super().setup()

    def handle(self) -> None:
        try:
            self.raw_requestline = self.rfile.readline(65537)
            if len(self.raw_requestline) > 65536:
                self.requestline = self.request_version = self.command = ""
                self.send_error(414)
                return
            if not self.parse_request():  # an error was sent (or the client sent nothing)
                return
            token = self.server.token
            if token is not None:
                sent = self.headers.get("Authorization", "")
                if not hmac.compare_digest(sent.encode("utf-8", "replace"), f"Bearer {token}".encode()):
                    body = b"bearer token required\n"
                    self.send_response(401)
                    self.send_header("Content-Type", "text/plain")
                    self.send_header("WWW-Authenticate", "Bearer")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
            handler = ServerHandler(self.rfile, self.wfile, self.get_stderr(), self.get_environ(), multithread=False)
            handler.request_handler = self
            handler.run(self.server.get_app())
        except OSError:  # timed out, reset, shut down at the deadline
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


class PrometheusExporter:
    """Serves the latest step's metrics; ``publish`` after each step, ``close`` at the end. A setting it cannot
    start with (no token off loopback, a token file that :func:`read_token_file` refuses, a port in use) raises
    ``ConfigError`` (exit 2). ``request_timeout_s``: the time a connection has to send its request and read the
    answer; ``max_connections``: connections served at once (more are closed at once)."""

    def __init__(
        self,
        host: str,
        port: int,
        project: str,
        experiment: str,
        token_file: str | None = None,
        request_timeout_s: float = 5.0,
        max_connections: int = 16,
    ) -> None:
        from prometheus_client import CollectorRegistry, Gauge, make_wsgi_app

        if not request_timeout_s > 0 or max_connections < 1:
            raise ValueError(f"request_timeout_s={request_timeout_s} and max_connections={max_connections}: need > 0")
        problems = prometheus_problems(host, port, token_file)  # the config's own check, kept here as a guard
        if problems:
            raise ConfigError(" ".join(problems))
        self._token = read_token_file(token_file) if token_file else None
        self._Gauge = Gauge
        self.registry = CollectorRegistry()
        self._labels = {"project": project, "experiment": experiment}
        self._gauges: dict[str, Any] = {}
        self._names: set[str] = set()
        self._lock = threading.Lock()
        app = make_wsgi_app(self.registry)

        def guarded(environ: dict[str, Any], start_response: Any) -> Any:
            # (the handler answered 401 already to a request without the token)
            with self._lock:  # a scrape sees one whole step, never half of the next
                return app(environ, start_response)

        try:
            self._server = make_server(host, port, guarded, server_class=_Server, handler_class=_Handler)
        except OSError as e:
            raise ConfigError(
                f"trainer.prometheus: cannot listen on {host}:{port} ({e.strerror or e}); another run may hold the "
                "port: set trainer.prometheus.port to a free one (0: any free port, printed at start-up)"
            ) from e
        # set before serving starts (a connection made meanwhile waits in the kernel's queue)
        self._server.request_timeout_s = float(request_timeout_s)
        self._server.max_connections = int(max_connections)
        self._server.token = self._token
        self.port = int(self._server.server_address[1])
        self.url = f"http://{host if ':' not in host else f'[{host}]'}:{self.port}/metrics"
        poll = min(0.5, request_timeout_s / 4)  # how often deadlines are checked
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(poll,), name="vlmrl-prometheus", daemon=True
        )
        self._thread.start()

    def _gauge(self, key: str) -> Any:
        g = self._gauges.get(key)
        if g is None:
            name, i = metric_name(key), 2
            while name in self._names:  # two keys that differ only in punctuation: keep both
                name, i = f"{metric_name(key)}_{i}", i + 1
            self._names.add(name)
            g = self._Gauge(name, f"vlmrl metric {key}", list(self._labels), registry=self.registry)
            self._gauges[key] = g
        return g

    def publish(self, metrics: dict[str, Any], step: int) -> None:
        """Set every finite numeric metric of this step (metrics not logged this step keep their last value)."""
        with self._lock:
            for key, v in metrics.items():
                if _finite(v):
                    self._gauge(key).labels(**self._labels).set(v)
            self._gauge("step").labels(**self._labels).set(step)

    def close(self) -> None:
        """Stop serving, drop open connections and free the port."""
        self._server.shutdown()
        self._server.drop_all()
        self._server.server_close()
        self._thread.join(timeout=5)
