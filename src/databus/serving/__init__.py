"""HTTP serving shared by the relay and the bootstrap server.

* **Query parameters**: :func:`int_param`, :func:`float_param`, :func:`bool_param`
  and :func:`source_ids_param` turn a bad value into
  :class:`~databus.core.errors.InvalidRequestError` (or ``UnknownSource``), so an
  endpoint never sees one.
* **Errors**: :data:`EXCEPTION_HANDLERS` is given once to ``Starlette(...)``;
  endpoints just raise. A :class:`~databus.core.errors.DatabusError` answers its
  ``http_status`` with ``{"error": <code>, "message": ...}``; any other exception
  answers 500 ``InternalError`` with the same body, then Starlette raises it on to
  the server, which logs the traceback, closes that connection and goes on
  serving; an unknown path answers 404 ``NotFound``, a wrong method 405
  ``MethodNotAllowed``. Clients rebuild the error type from ``error``
  (:func:`databus.core.errors.error_from_code`).
* **Lifecycle**: :class:`HttpService` runs an app under uvicorn (with the connection
  protocol of :mod:`databus.serving.direct`: the request-head deadline, and the
  GET routes an app answers on the connection itself, :class:`~databus.serving.direct.
  DirectRoutes`) on a socket it binds itself before serving (port 0 works; connections queue from the moment
  :meth:`HttpService.start` returns), next to the worker threads of its subclass,
  in the caller's event loop (:meth:`~HttpService.serve`, :meth:`~HttpService.run`)
  or on a thread of its own (:meth:`~HttpService.start`, :meth:`~HttpService.stop`).
* **Security** (docs/security.md), from one :class:`HttpServerConfig` per server:
  bearer tokens (:mod:`databus.auth`; every path but ``/health``, ``/metrics`` and
  ``/openapi.json`` needs one, the service's admin paths an admin one), TLS and
  mutual TLS, and limits: request body, header size, connections, idle keep-alive,
  slow senders (a request line and headers, and then a body, each get
  ``read_timeout`` seconds: a client that trickles or stalls is cut) and slow
  readers. A server bound beyond loopback without a token file refuses to
  start unless ``insecure`` (then it warns at every start). Endpoints ask
  :func:`principal` what the request may read.

This package imports only :mod:`databus.core` and :mod:`databus.auth`: the relay and
the bootstrap service both build on it without knowing each other.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import ipaddress
import logging
import os
import socket
import ssl
import threading
from abc import ABC, abstractmethod
from collections.abc import Collection
from pathlib import Path
from typing import Any, ClassVar, Self

import uvicorn
from pydantic import Field
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, ExceptionHandler, Message, Receive, Scope, Send

from databus.auth import ANONYMOUS, Authenticator, Principal
from databus.core import jsonsafe
from databus.core.config import FrozenModel
from databus.core.errors import (
    ConfigError,
    DatabusError,
    ForbiddenError,
    HeadersTooLargeError,
    InvalidRequestError,
    PayloadTooLargeError,
    RequestTimeoutError,
    UnknownSourceError,
    UnsupportedMediaTypeError,
    error_body,
)
from databus.serving.direct import DirectH11, DirectRoutes, protocol_class

log = logging.getLogger("databus.serving")

MAX_SOURCE_IDS = 10_000  # ids one request may name

# -- query parameters -----------------------------------------------------------------


def int_param(request: Request, name: str, default: int, lo: int, hi: int) -> int:
    """The integer query parameter ``name`` in ``[lo, hi]``; ``default`` when absent."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidRequestError(f"{name} must be an integer, got {raw[:50]!r}") from None
    if not lo <= value <= hi:
        raise InvalidRequestError(f"{name} must be between {lo} and {hi}, got {value}")
    return value


def float_param(request: Request, name: str, default: float, lo: float, hi: float) -> float:
    """The number query parameter ``name`` in ``[lo, hi]`` (NaN refused); ``default``
    when absent."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise InvalidRequestError(f"{name} must be a number, got {raw[:50]!r}") from None
    if not lo <= value <= hi:  # also rejects NaN
        raise InvalidRequestError(f"{name} must be between {lo} and {hi}, got {raw[:50]}")
    return value


def bool_param(request: Request, name: str, default: bool = False) -> bool:
    """``true``/``1``/``yes`` or ``false``/``0``/``no`` (any case); ``default`` when absent."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    value = raw.lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise InvalidRequestError(f"{name} must be true or false, got {raw[:50]!r}")


def source_ids_param(request: Request, known: Collection[int],
                     name: str = "sources") -> frozenset[int] | None:
    """``sources=1,2`` -> those ids, each one of ``known`` (else ``UnknownSource``);
    None when absent or empty, which means every source."""
    text = request.query_params.get(name)
    if text is None or not text.strip():
        return None
    ids: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        try:
            sid = int(part)
        except ValueError:
            raise InvalidRequestError(
                f"{name} must be comma-separated ids, got {part[:50]!r}") from None
        if sid not in known:
            raise UnknownSourceError(f"unknown source id {sid}; known: {sorted(known)}")
        ids.add(sid)
        if len(ids) > MAX_SOURCE_IDS:
            raise InvalidRequestError(f"{name} names more than {MAX_SOURCE_IDS} sources")
    return frozenset(ids)


# -- errors ------------------------------------------------------------------------------


def error_response(exc: DatabusError) -> JSONResponse:
    """The answer to ``exc``: its ``http_status`` and its body
    (:func:`databus.core.errors.error_body`: error, message, fields)."""
    return JSONResponse(error_body(exc), status_code=exc.http_status)


async def _databus_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, DatabusError)
    return error_response(exc)


def internal_error_response(exc: BaseException) -> JSONResponse:
    """The answer to an unexpected ``exc``: 500 ``InternalError`` (the caller raises
    ``exc`` on to the server, which logs the traceback)."""
    return JSONResponse({"error": "InternalError", "message": f"{type(exc).__name__}: {exc}"},
                        status_code=500)


async def _internal_error(_: Request, exc: Exception) -> Response:
    # no logging here: Starlette raises exc on to the server, which logs the traceback
    return internal_error_response(exc)


async def _not_found(request: Request, _: Exception) -> Response:
    return JSONResponse({"error": "NotFound", "message": f"no endpoint {request.url.path}"},
                        status_code=404)


async def _method_not_allowed(request: Request, _: Exception) -> Response:
    return JSONResponse({"error": "MethodNotAllowed",
                         "message": f"{request.method} not allowed"}, status_code=405)


EXCEPTION_HANDLERS: dict[Any, ExceptionHandler] = {
    DatabusError: _databus_error,
    Exception: _internal_error,
    404: _not_found,
    405: _method_not_allowed,
}


# -- configuration ---------------------------------------------------------------------


class TlsServerConfig(FrozenModel):
    """TLS of a server: its certificate chain and key (PEM); with ``client_ca_file``,
    mutual TLS: every client must present a certificate that CA signed."""

    cert_file: Path = Field(description="PEM certificate (chain) the server presents")
    key_file: Path = Field(description="PEM private key of that certificate")
    client_ca_file: Path | None = Field(
        None, description="mutual TLS: PEM CA(s) client certificates must chain to")

    def server_context(self) -> ssl.SSLContext:
        """A server TLS context of these files (TLS 1.2 at least; with ``client_ca_file``,
        a client certificate required). A file that cannot be read is a ConfigError
        naming that file and what it is; a certificate and key that do not go together
        are named both."""
        for path, what in ((self.cert_file, "certificate"), (self.key_file, "private key"),
                           (self.client_ca_file, "client CA")):
            if path is None:
                continue
            try:
                with path.open("rb"):
                    pass
            except OSError as exc:
                raise ConfigError(f"TLS {what} file {path}: {exc.strerror or exc}") from exc
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(str(self.cert_file), str(self.key_file))
        except ssl.SSLError as exc:
            raise ConfigError(f"TLS certificate {self.cert_file} and key {self.key_file}"
                              f" unusable together: {exc.reason or exc}") from exc
        if self.client_ca_file is not None:
            try:
                ctx.load_verify_locations(str(self.client_ca_file))
            except ssl.SSLError as exc:
                raise ConfigError(f"TLS client CA file {self.client_ca_file} unusable:"
                                  f" {exc.reason or exc}") from exc
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx


class HttpServerConfig(FrozenModel):
    """Where and how a server listens (the ``http:`` section of each server's config)."""

    host: str = Field("127.0.0.1", description="address to bind; beyond loopback needs a"
                      " token_file (or insecure)")
    port: int = Field(0, ge=0, le=65535, description="0 picks a free port")
    token_file: Path | None = Field(
        None, description="bearer tokens (databus token add); None = no authentication")
    insecure: bool = Field(
        False, description="serve beyond loopback without tokens (warned at every start)")
    tls: TlsServerConfig | None = Field(None, description="serve https (none: plain http)")
    max_body_bytes: int = Field(1 << 20, ge=1024, description="largest request body")
    max_header_bytes: int = Field(16 * 1024, ge=1024, le=1 << 20,
                                  description="largest request line plus headers")
    max_connections: int = Field(
        2048, ge=1, description="connections (and requests) served at once; more get 503")
    idle_timeout: float = Field(
        15.0, gt=0, le=3600, description="seconds an idle keep-alive connection stays open")
    send_timeout: float = Field(
        60.0, gt=0, le=3600, description="seconds one response part may wait for a client"
        " that does not read; then the connection is cut (the client resumes from its"
        " checkpoint)")
    read_timeout: float = Field(
        30.0, gt=0, le=3600, description="seconds a client may take to send a request"
        " line and headers (from its connection, or the end of its previous answer), and"
        " then its whole body; a client that stalls or trickles is cut (408 for a body)")


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def principal(request: Request) -> Principal:
    """Who made ``request`` (set by the server's guard; everyone when no tokens)."""
    p = request.scope.get("databus.principal", ANONYMOUS)
    assert isinstance(p, Principal)
    return p


def readable_ids(request: Request, served: Collection[tuple[int, str]],
                 ids: frozenset[int] | None) -> frozenset[int] | None:
    """The source ids a request may read: ``ids`` it named (403 naming the first table
    its token may not read), or, when it named none, every served source its token may
    read (None: every source, for a principal that reads everything)."""
    who = principal(request)
    if who.everything:
        return ids
    names = dict(served)
    if ids is not None:
        who.check_read(names[i] for i in sorted(ids) if i in names)
        return ids
    return frozenset(i for i, n in names.items() if who.may_read(n))


class _Guard:
    """The ASGI layer every request passes first: ``/health``, authentication,
    the admin paths, the body limit, and the slow-reader cut (see the module
    docstring); also the :class:`~databus.serving.direct.Gate` of the direct
    routes, with the same checks and refusals."""

    def __init__(self, app: ASGIApp, *, auth: Authenticator | None, config: HttpServerConfig,
                 open_paths: frozenset[str], admin_paths: frozenset[str], name: str) -> None:
        self.app, self.auth, self.config, self.name = app, auth, config, name
        self.open_paths, self.admin_paths = open_paths, admin_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["path"] == "/health":
            await JSONResponse({"status": "ok", "service": self.name})(scope, receive, send)
            return
        try:
            who = await self.admit(scope)
        except DatabusError as exc:
            await self.refusal(exc)(scope, receive, send)
            return
        scope["databus.principal"] = who
        # a cut slow reader: uvicorn closes the connection of a response not completed
        with contextlib.suppress(_SlowClient):
            await self.app(scope, self._limited(receive), self._timed(send, scope))

    # the checks, shared with the direct routes (databus.serving.direct.Gate)

    def admit_now(self, scope: Scope) -> Principal | None:
        """Who sent the request, when known without hashing a token, after the admin
        path, body length and header size checks; None when a token needs hashing."""
        who = self._principal_now(scope)
        if who is not None:
            self._check(scope, who)
        return who

    async def admit(self, scope: Scope) -> Principal:
        """Who sent the request, after every check (a new token hashed off the loop)."""
        who = await self._principal(scope)
        self._check(scope, who)
        return who

    def refusal(self, exc: Exception) -> Response:
        """The answer to a refused request (a 401 names the auth scheme)."""
        if not isinstance(exc, DatabusError):
            raise exc
        response = error_response(exc)
        if exc.http_status == 401:
            response.headers["WWW-Authenticate"] = 'Bearer realm="databus"'
        return response

    def internal_error(self, exc: BaseException) -> Response:
        """The answer to an unexpected error (500 ``InternalError``)."""
        return internal_error_response(exc)

    def _check(self, scope: Scope, who: Principal) -> None:
        path = scope["path"]
        if path in self.admin_paths or any(path.startswith(p + "/") for p in self.admin_paths):
            who.check_admin(path)
        self._check_length(scope)
        self._check_headers(scope)

    def _principal_now(self, scope: Scope) -> Principal | None:
        if self.auth is None or scope["path"] in self.open_paths:
            return ANONYMOUS
        return self.auth.cached(self._authorization(scope))

    @staticmethod
    def _authorization(scope: Scope) -> str | None:
        for k, v in scope["headers"]:
            if k == b"authorization":
                return str(v.decode("latin-1"))
        return None

    async def _principal(self, scope: Scope) -> Principal:
        who = self._principal_now(scope)
        if who is not None:
            return who
        # a first verification costs an argon2 hash: off the event loop
        assert self.auth is not None
        return await run_in_threadpool(self.auth.authenticate, self._authorization(scope))

    def _check_length(self, scope: Scope) -> None:
        for k, v in scope["headers"]:
            if k == b"content-length":
                try:
                    n = int(v)
                except ValueError:
                    raise InvalidRequestError("Content-Length is not a number") from None
                if n > self.config.max_body_bytes:
                    raise PayloadTooLargeError(
                        f"request body of {n} bytes; this server takes at most"
                        f" {self.config.max_body_bytes}")

    def _check_headers(self, scope: Scope) -> None:
        size = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"")
        size += sum(len(k) + len(v) + 4 for k, v in scope["headers"])
        if size > self.config.max_header_bytes:
            raise HeadersTooLargeError(f"request line and headers of {size} bytes; this server"
                                       f" takes at most {self.config.max_header_bytes}")

    def _limited(self, receive: Receive) -> Receive:
        limit = self.config.max_body_bytes
        seen = 0
        deadline: float | None = None  # for the whole body, from its first read
        done = False

        async def receive_limited() -> Message:
            nonlocal seen, deadline, done
            if done:  # after the body: a wait for the client's disconnect, not timed
                return await receive()
            if deadline is None:
                deadline = asyncio.get_running_loop().time() + self.config.read_timeout
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise RequestTimeoutError(
                    f"request body not received whole within {self.config.read_timeout:g} s"
                    " (this server's read_timeout)") from None
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:  # a chunked body that passed the Content-Length check
                    raise PayloadTooLargeError(
                        f"request body larger than {limit} bytes (this server's limit)")
                done = not message.get("more_body", False)
            else:
                done = True
            return message

        return receive_limited

    def _timed(self, send: Send, scope: Scope) -> Send:
        timeout = self.config.send_timeout

        async def send_one(message: Message) -> None:
            try:
                async with asyncio.timeout(timeout):  # no task per send, unlike wait_for
                    await send(message)
            except TimeoutError:
                client = scope.get("client")
                log.warning("%s: cut a client that read nothing for %.0f s (%s %s from %s)",
                            self.name, timeout, scope["method"], scope["path"],
                            f"{client[0]}:{client[1]}" if client else "?")
                raise _SlowClient from None

        async def send_timed(message: Message) -> None:
            body = message.get("body", b"")
            if message["type"] != "http.response.body" or len(body) <= _SEND_CHUNK:
                await send_one(message)
                return
            # a large body goes out in parts: the server waits for a slow reader before
            # each part (so the timeout can cut it) and holds at most one part of it,
            # not the whole answer, in its write buffer
            # parts are copies: a view would keep the whole answer alive for as long as
            # a stalled connection holds its part (measured: GBs with 500 clients)
            view = memoryview(body)
            more = bool(message.get("more_body", False))
            for start in range(0, len(body), _SEND_CHUNK):
                part = bytes(view[start:start + _SEND_CHUNK])
                last = start + _SEND_CHUNK >= len(body)
                await send_one({"type": "http.response.body", "body": part,
                                "more_body": more or not last})

        return send_timed


_SEND_CHUNK = 1024 * 1024


class _SlowClient(Exception):
    """Raised through the app when a client stopped reading (see :class:`_Guard`)."""


# -- lifecycle ----------------------------------------------------------------------------


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

    open_paths: ClassVar[frozenset[str]] = frozenset({"/health", "/metrics", "/openapi.json"})
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
        app = _Guard(self.build_app(), auth=self.auth, config=http, open_paths=self.open_paths,
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
                sock = socket.create_server((self.host, self._bind_port), backlog=512)
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
        except Exception:
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
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}"


# -- machine-readable API description ---------------------------------------------------

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["error", "message"],
    "properties": {"error": {"type": "string"}, "message": {"type": "string"},
                   "fields": {"type": "object", "description": "the error's context"
                              " (positions, names), when it has any"}}}


def query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    """An OpenAPI query parameter."""
    return {"name": name, "in": "query", "required": False, "schema": schema,
            "description": description}


def operation(summary: str, *, params: list[dict[str, Any]] | None = None,
              ok: dict[str, Any] | None = None, ok_status: str = "200",
              errors: tuple[int, ...] = (400,), admin: bool = False,
              body: dict[str, Any] | None = None) -> dict[str, Any]:
    """An OpenAPI operation answering ``ok`` (JSON unless given a media map) or one of
    the typed errors; 401 and 403 are listed for every operation a token guards."""
    content = ok if ok is not None else {"application/json": {"schema": {}}}
    responses: dict[str, Any] = {ok_status: {"description": "OK", "content": content}}
    for status in (*errors, 401, 403):
        responses[str(status)] = {"description": "error", "content": {
            "application/json": {"schema": ERROR_SCHEMA}}}
    op: dict[str, Any] = {"summary": summary + (" (admin token)" if admin else ""),
                          "parameters": params or [], "responses": responses}
    if body is not None:
        op["requestBody"] = {"required": True,
                             "content": {"application/json": {"schema": body}}}
    return op


def openapi_document(title: str, description: str,
                     paths: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """An OpenAPI 3.0 document with the parts every server shares (``/health``,
    bearer authentication)."""
    try:
        version = importlib.metadata.version("databus")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        version = "0"
    return {
        "openapi": "3.0.3",
        "info": {"title": title, "version": version, "description": description},
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{"bearer": []}],
        "paths": {
            **paths,
            "/health": {"get": {**operation("Liveness; needs no token", errors=()),
                                "security": []}},
            "/openapi.json": {"get": {**operation("This description; needs no token",
                                                  errors=()), "security": []}},
        },
    }


# -- state-changing requests ---------------------------------------------------------------

_LOOPBACK = ("127.0.0.1", "localhost", "[::1]", "::1")


async def json_body(request: Request, *, max_bytes: int = 1 << 20) -> Any:
    """The body of a state-changing request, checked and parsed: ``application/json``
    only (415 otherwise: a browser's cross-site form post cannot send it without a
    preflight), a same-origin ``Origin`` and, for a loopback-bound server, a loopback
    ``Host`` (403 otherwise: a web page the operator opens, even through DNS rebinding,
    cannot drive a local server), at most ``max_bytes``, JSON nested at most
    :data:`databus.core.jsonsafe.MAX_DEPTH` levels (400)."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/json":
        raise UnsupportedMediaTypeError(
            f"{request.url.path} takes Content-Type: application/json, got {ctype or 'none'}")
    host = request.headers.get("host", "")
    bound = request.scope.get("server")
    if bound and str(bound[0]) in _LOOPBACK:
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        if name not in _LOOPBACK:
            raise ForbiddenError(f"Host {host!r} is not this server's (loopback)")
    origin = request.headers.get("origin")
    if origin is not None and origin.split("://", 1)[-1].rstrip("/") != host:
        raise ForbiddenError(f"Origin {origin!r} is not this server's ({host})")
    raw = await request.body()
    if len(raw) > max_bytes:
        raise InvalidRequestError(f"request body larger than {max_bytes} bytes")
    try:
        return jsonsafe.loads(raw or b"{}")
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequestError(f"request body is not acceptable JSON: {exc}") from exc
