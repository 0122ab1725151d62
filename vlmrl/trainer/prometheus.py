"""``trainer.logger=[..., prometheus]``: the step's metrics as Prometheus gauges on an HTTP endpoint.

Each metric ``a/b_c`` becomes the gauge ``vlmrl_a_b_c`` with the labels ``project`` and ``experiment``, plus
``vlmrl_step``. The endpoint listens on 127.0.0.1 unless ``trainer.prometheus.host`` says otherwise; a non-loopback
address needs ``trainer.prometheus.token_file`` and then answers only requests with ``Authorization: Bearer <token>``
(Prometheus: ``authorization: {credentials_file: ...}`` in the scrape config).
"""

from __future__ import annotations

import hmac
import ipaddress
import math
import re
import socketserver
import threading
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

_NAME = re.compile(r"[^a-zA-Z0-9_]")


def metric_name(key: str) -> str:
    """The Prometheus name of a vlmrl metric: ``reward/mean`` → ``vlmrl_reward_mean``."""
    return "vlmrl_" + _NAME.sub("_", key)


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


class PrometheusExporter:
    """Serves the latest step's metrics; ``publish`` after each step, ``close`` at the end. A setting it cannot
    start with (no token off loopback, an unreadable token file, a port in use) raises ``ConfigError`` (exit 2)."""

    def __init__(self, host: str, port: int, project: str, experiment: str, token_file: str | None = None) -> None:
        from prometheus_client import CollectorRegistry, Gauge, make_wsgi_app

        from vlmrl.config import ConfigError

        self._token: str | None = None
        if token_file:
            try:
                self._token = Path(token_file).read_text(encoding="utf-8").strip()
            except OSError as e:
                raise ConfigError(f"trainer.prometheus.token_file: cannot read {token_file}: {e}") from e
            if not self._token:
                raise ConfigError(f"trainer.prometheus.token_file: {token_file} is empty")
        elif not is_loopback(host):
            raise ConfigError(
                f"trainer.prometheus.host={host} accepts connections from other machines: set "
                "trainer.prometheus.token_file (a file holding a secret; scrapers send it as a bearer token), or keep "
                "the default 127.0.0.1"
            )
        self._Gauge = Gauge
        self.registry = CollectorRegistry()
        self._labels = {"project": project, "experiment": experiment}
        self._gauges: dict[str, Any] = {}
        self._names: set[str] = set()
        self._lock = threading.Lock()
        app = make_wsgi_app(self.registry)

        def guarded(environ: dict[str, Any], start_response: Any) -> Any:
            if self._token is not None:
                sent = environ.get("HTTP_AUTHORIZATION", "")
                if not hmac.compare_digest(sent.encode(), f"Bearer {self._token}".encode()):
                    start_response("401 Unauthorized", [("Content-Type", "text/plain"),
                                                        ("WWW-Authenticate", "Bearer")])  # fmt: skip
                    return [b"bearer token required\n"]
            with self._lock:  # a scrape sees one whole step, never half of the next
                return app(environ, start_response)

        try:
            self._server = make_server(host, port, guarded, server_class=_Server, handler_class=_Quiet)
        except OSError as e:
            raise ConfigError(
                f"trainer.prometheus: cannot listen on {host}:{port} ({e.strerror or e}); another run may hold the "
                "port: set trainer.prometheus.port to a free one (0: any free port, printed at start-up)"
            ) from e
        self.port = int(self._server.server_address[1])
        self.url = f"http://{host if ':' not in host else f'[{host}]'}:{self.port}/metrics"
        self._thread = threading.Thread(target=self._server.serve_forever, name="vlmrl-prometheus", daemon=True)
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
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    self._gauge(key).labels(**self._labels).set(v)
            self._gauge("step").labels(**self._labels).set(step)

    def close(self) -> None:
        """Stop serving and free the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
