"""The lifecycle of a server: :class:`HttpService` runs an ASGI app under uvicorn
beside worker threads of its own.

Contract:

* **Start**: the tokens are read when the service is built; a service bound beyond
  loopback (:func:`databus.serving.loopback.is_loopback`) without a token file is a
  :class:`~databus.core.errors.ConfigError` unless ``insecure``, which warns at every
  start. :meth:`HttpService.serve` binds the socket itself before serving (port 0
  works; connections queue from the moment :meth:`HttpService.start` returns), with
  ``TCP_NODELAY``; a port in use, an address not here or an unusable TLS file is a
  one-line ConfigError. The subclass's workers start once the socket listens
  (:meth:`HttpService.on_listening`).
* **Serving**: the app runs behind the :class:`~databus.serving.guard.Guard`, under
  uvicorn with the connection protocol of :mod:`databus.serving.direct` (the
  request-head deadline, and the GET routes an app answers on the connection itself,
  :class:`~databus.serving.direct.DirectRoutes`), with the connection limit,
  keep-alive timeout and TLS (mutual with a client CA) of its
  :class:`~databus.serving.config.HttpServerConfig`; in the caller's event loop
  (:meth:`~HttpService.serve`, :meth:`~HttpService.run`) or on a thread of its own
  (:meth:`~HttpService.start`, :meth:`~HttpService.stop`, ``with``).
* **Stop**: :meth:`HttpService.request_exit` (a signal, another thread) first tells
  the subclass (:meth:`HttpService.on_exit_requested`: long polls end there), lets
  requests in progress finish for at most 2 seconds, then runs
  :meth:`HttpService.on_shutdown` (also when binding failed) and closes every
  connection still open.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
import threading
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Self

import uvicorn
from starlette.types import ASGIApp

from databus.auth import Authenticator
from databus.core.errors import ConfigError
from databus.serving.config import HttpServerConfig
from databus.serving.direct import DirectH11, DirectRoutes, protocol_class
from databus.serving.guard import Guard
from databus.serving.loopback import is_loopback

log = logging.getLogger("databus.serving")


async def _close_connections(server: uvicorn.Server, grace: float = 1.0) -> None:
    """Close the connections uvicorn's shutdown left open, waiting up to ``grace``
    seconds for answers still being written, then cutting the rest.

    uvicorn closes idle connections and waits for its request tasks, but a direct
    answer (``databus.serving.direct``: no task) closes only once it is written, and
    a connection accepted just before shutdown may not be idle yet: the event loop
    then ended with their sockets open (ResourceWarning; the client saw no close).
    """
    conns = list(server.server_state.connections)
    for conn in conns:
        if not conn.transport.is_closing():
            conn.transport.close()
    deadline = asyncio.get_running_loop().time() + grace
    while any(c in server.server_state.connections for c in conns):
        if asyncio.get_running_loop().time() >= deadline:
            for conn in list(server.server_state.connections):
                conn.transport.abort()
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0)  # the transports' connection_lost callbacks close the sockets


class HttpService(ABC):
    """A process part that serves HTTP beside worker threads of its own.

    Subclasses give the app (:meth:`build_app`), start their workers once the
    socket listens (:meth:`on_listening`) and stop them and close what they hold
    after serving ended (:meth:`on_shutdown`, which also runs when binding failed).
    Shutdown first tells the subclass (:meth:`on_exit_requested`, where long polls
    end at once with what they have), then lets requests in progress finish for at
    most 2 seconds; their clients retry elsewhere or later.
    """

    open_paths: ClassVar[frozenset[str]] = frozenset({"/health", "/health/live",
                                                      "/health/ready", "/metrics",
                                                      "/openapi.json"})
    """Paths readable without a token (they carry no row data and no secrets)."""
    admin_paths: ClassVar[frozenset[str]] = frozenset()
    """Paths (and everything below them) that need an admin token."""

    def __init__(self, http: HttpServerConfig, name: str) -> None:
        self.http = http
        self.host = http.host
        self.name = name
        self._bind_port = http.port
        self._port: int | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._listening = False
        self._failed: BaseException | None = None
        self.auth = self._authenticator()

    def _authenticator(self) -> Authenticator | None:
        """The token checker, or None; refuses an open server beyond loopback."""
        http = self.http
        if http.token_file is not None:
            auth = Authenticator(http.token_file)
            log.info("%s: bearer tokens from %s (%d)", self.name, http.token_file, len(auth))
            return auth
        if not is_loopback(http.host):
            if not http.insecure:
                raise ConfigError(
                    f"{self.name} would serve {http.host} without authentication: give a"
                    " token file (--token-file, http.token_file) or pass --insecure")
            log.warning("%s serves %s WITHOUT AUTHENTICATION (--insecure): anyone who reaches"
                        " the port reads every table", self.name, http.host)
        return None

    def reload_tokens(self) -> None:
        """Read the token file again (SIGHUP); nothing without one."""
        if self.auth is not None:
            self.auth.reload()

    @abstractmethod
    def build_app(self) -> ASGIApp:
        """The ASGI app to serve (built once per :meth:`serve`)."""

    def on_listening(self) -> None:  # noqa: B027 - optional hook
        """Runs in the event loop once the socket listens, before the first request."""

    async def on_exit_requested(self) -> None:  # noqa: B027 - optional hook
        """Runs in the event loop as soon as an exit was asked for (a signal,
        :meth:`request_exit`), before requests in progress are waited for: end long
        polls here, so shutdown never has to cancel them."""

    async def on_shutdown(self) -> None:  # noqa: B027 - optional hook
        """Runs in the event loop after serving ended (or failed to start)."""

    def _uvicorn_config(self) -> uvicorn.Config:
        http = self.http
        app = Guard(self.build_app(), auth=self.auth, config=http, open_paths=self.open_paths,
                     admin_paths=self.admin_paths, name=self.name)
        tls: dict[str, Any] = {}
        if http.tls is not None:
            http.tls.server_context()  # each file checked first: an error names the file
            tls = {"ssl_certfile": str(http.tls.cert_file), "ssl_keyfile": str(http.tls.key_file)}
            if http.tls.client_ca_file is not None:
                tls |= {"ssl_ca_certs": str(http.tls.client_ca_file),
                        "ssl_cert_reqs": ssl.CERT_REQUIRED}
        config = uvicorn.Config(
            app, log_level="warning", lifespan="on", access_log=False,
            timeout_graceful_shutdown=2, limit_concurrency=http.max_connections,
            http=protocol_class(
                DirectH11, read_timeout=http.read_timeout, send_timeout=http.send_timeout,
                max_head=http.max_header_bytes, server_name=self.name, gate=app,
                direct=app.app.direct_get if isinstance(app.app, DirectRoutes) else {}),
            timeout_keep_alive=int(max(1, http.idle_timeout)),
            h11_max_incomplete_event_size=http.max_header_bytes, **tls)
        try:
            config.load()  # builds the TLS context: a bad file is a start-up error
        except (OSError, ssl.SSLError) as exc:
            what = getattr(exc, "filename", None) or (http.tls.cert_file if http.tls else "")
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise ConfigError(f"{self.name}: TLS files unusable ({what}): {why}") from exc
        return config

    async def _watch_exit(self, server: uvicorn.Server) -> None:
        # uvicorn sets should_exit from its own signal handlers too: polling sees both
        while not server.should_exit:
            await asyncio.sleep(0.05)
        await self.on_exit_requested()

    async def serve(self) -> None:
        """Serve until :meth:`request_exit`; then :meth:`on_shutdown`."""
        try:
            server = uvicorn.Server(self._uvicorn_config())
            self._server = server
            # bind and listen before serving, so the port is known (port 0) and
            # connections queue from the moment start() returns
            try:
                host = self.host.strip("[]")  # an IPv6 address, bracketed or not
                family = socket.AF_INET6 if ":" in host else socket.AF_INET
                sock = socket.create_server((host, self._bind_port), family=family,
                                            backlog=512)
            except OSError as exc:  # port in use, address not here, no permission
                why = os.strerror(exc.errno) if exc.errno else str(exc)
                raise ConfigError(f"{self.name} cannot listen on {self.host}:{self._bind_port}:"
                                  f" {why}") from exc
            # accepted connections inherit TCP_NODELAY (Linux). asyncio sets it only on
            # sockets whose proto is IPPROTO_TCP, which create_server's (proto 0) is not;
            # without it a response written in two parts (headers, body) waits for the
            # client's delayed ACK: +40 ms on every keep-alive request
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._port = int(sock.getsockname()[1])
            log.info("%s listening on %s%s", self.name, self.url,
                     "" if self.auth is None else " (bearer tokens)")
            self.on_listening()
            self._listening = True
            self._ready.set()
            watcher = asyncio.create_task(self._watch_exit(server))
            try:
                await server.serve(sockets=[sock])
            finally:
                watcher.cancel()
        except BaseException as exc:
            if not self._listening:
                self._failed = exc  # start() raises it
            raise
        finally:
            self._ready.set()  # start() waits no longer when serving failed
            await self.on_shutdown()
            if self._server is not None:
                await _close_connections(self._server)

    def run(self) -> None:
        """Serve on this thread until :meth:`request_exit` (e.g. from a signal handler)."""
        asyncio.run(self.serve())

    def start(self, timeout: float = 20.0) -> None:
        """Serve on a background thread; returns once the port is bound and the workers
        started, and raises what prevented that otherwise."""
        self._thread = threading.Thread(target=self._run_in_thread, name=f"databus-{self.name}",
                                        daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"{self.name} did not start in {timeout} s")
        if self._failed is not None:
            raise self._failed

    def _run_in_thread(self) -> None:
        try:
            self.run()
        except Exception:  # broad: the server thread's top; a failed start is start()'s to raise
            if self._listening:
                raise  # failed while serving: reported like any thread's error
            # failed to start: start() raises it in the caller's thread

    def request_exit(self, *_: Any) -> None:
        """Ask :meth:`serve` to return (safe from a signal handler and other threads)."""
        if self._server is not None:
            self._server.should_exit = True

    def stop(self, timeout: float = 30.0) -> None:
        """:meth:`request_exit`, then wait for the background thread of :meth:`start`."""
        self.request_exit()
        if self._thread is not None:
            self._thread.join(timeout)

    def __enter__(self) -> Self:
        """:meth:`start` (serving on a background thread); :meth:`stop` on exit."""
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        if self._port is None:
            raise RuntimeError(f"{self.name} is not serving")
        return self._port

    @property
    def url(self) -> str:
        scheme = "https" if self.http.tls is not None else "http"
        host = self.host.strip("[]")
        host = f"[{host}]" if ":" in host else host
        return f"{scheme}://{host}:{self.port}"
