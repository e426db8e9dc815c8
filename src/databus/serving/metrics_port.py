"""A process's own small listener for ``/metrics`` and health: the consumer commands'
``--metrics-port`` (``tail``, ``replicate``, ``publish``, ``binlog-server``) and programs
that embed the client library (``ClientConfig.metrics_port``).

Contract (docs/operations.md):

* :class:`MetricsServer` serves ``GET /metrics`` (``render()``, Prometheus's text
  format), ``/health`` and ``/health/live`` (200 while the process runs) and
  ``/health/ready`` (200 or 503 with ``checks()``, the same JSON as every server's:
  :mod:`databus.serving.health`); anything else is 404, and nothing but GET is
  answered. No token: it carries no row data and no secrets, and binds 127.0.0.1
  unless told another address.
* Port 0 takes a free port (:attr:`MetricsServer.port` says which; logged). A port in
  use is a :class:`~databus.core.errors.ConfigError` at :meth:`MetricsServer.start`.
* Its threads are daemons; :meth:`MetricsServer.stop` closes the socket. A scrape
  costs the consumer nothing: ``render`` and ``checks`` read counters on the
  listener's thread.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from databus.core.errors import ConfigError
from databus.serving.health import LIVE, READY, Check

log = logging.getLogger("databus.metrics")


class MetricsServer:
    """See the module docstring. ``service``: what ``/health*`` name (``tail``...)."""

    def __init__(self, service: str, render: Callable[[], bytes],
                 checks: Callable[[], list[Check]], *, port: int = 0,
                 host: str = "127.0.0.1") -> None:
        self.service, self.render, self.checks = service, render, checks
        self.host, self.port = host, port
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        try:
            server = ThreadingHTTPServer((self.host, self.port), _handler(self))
        except OSError as exc:
            raise ConfigError(f"metrics port {self.host}:{self.port}: {exc}") from exc
        server.daemon_threads = True
        self._server, self.port = server, server.server_address[1]
        self._thread = threading.Thread(target=server.serve_forever, args=(0.2,),
                                        name="databus-metrics", daemon=True)
        self._thread.start()
        log.info("%s serves /metrics and /health/ready on http://%s:%d", self.service,
                 self.host, self.port)

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()

    def __enter__(self) -> MetricsServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def answer(self, path: str) -> tuple[int, str, bytes]:
        """(status, content type, body) for a GET of ``path``."""
        path = path.split("?", 1)[0]
        if path == "/metrics":
            return 200, "text/plain; version=0.0.4; charset=utf-8", self.render()
        if path in ("/health", LIVE):
            status = "ok" if path == "/health" else "live"
            return 200, "application/json", json.dumps(
                {"status": status, "service": self.service}).encode()
        if path == READY:
            done = self.checks()
            ok = all(c.ok for c in done)
            body = {"status": "ready" if ok else "not_ready", "service": self.service,
                    "checks": [asdict(c) for c in done]}
            return 200 if ok else 503, "application/json", json.dumps(body).encode()
        return 404, "application/json", b'{"error": "NotFound"}'


def _handler(owner: MetricsServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            try:
                status, ctype, body = owner.answer(self.path)
            except Exception:  # broad: a failing collector answers 500, the listener goes on
                log.exception("serving %s failed", self.path)
                status, ctype, body = 500, "application/json", b'{"error": "Internal"}'
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # one line per scrape is noise

    return Handler
