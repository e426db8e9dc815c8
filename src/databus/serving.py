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
* **Lifecycle**: :class:`HttpService` runs an app under uvicorn on a socket it binds
  itself before serving (port 0 works; connections queue from the moment
  :meth:`HttpService.start` returns), next to the worker threads of its subclass,
  in the caller's event loop (:meth:`~HttpService.serve`, :meth:`~HttpService.run`)
  or on a thread of its own (:meth:`~HttpService.start`, :meth:`~HttpService.stop`).

This module imports only :mod:`databus.core`: the relay and the bootstrap service
both build on it without knowing each other.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from abc import ABC, abstractmethod
from collections.abc import Collection
from typing import Any, Self

import uvicorn
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, ExceptionHandler

from databus.core import jsonsafe
from databus.core.errors import (
    ConfigError,
    DatabusError,
    ForbiddenError,
    InvalidRequestError,
    UnknownSourceError,
    UnsupportedMediaTypeError,
)

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
    """The answer to ``exc``: its ``http_status`` and ``{"error", "message"}``."""
    return JSONResponse({"error": exc.code, "message": str(exc)}, status_code=exc.http_status)


async def _databus_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, DatabusError)
    return error_response(exc)


async def _internal_error(_: Request, exc: Exception) -> Response:
    # no logging here: Starlette raises exc on to the server, which logs the traceback
    return JSONResponse({"error": "InternalError", "message": f"{type(exc).__name__}: {exc}"},
                        status_code=500)


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


# -- lifecycle ----------------------------------------------------------------------------


class HttpService(ABC):
    """A process part that serves HTTP beside worker threads of its own.

    Subclasses give the app (:meth:`build_app`), start their workers once the
    socket listens (:meth:`on_listening`) and stop them and close what they hold
    after serving ended (:meth:`on_shutdown`, which also runs when binding failed).
    Shutdown first tells the subclass (:meth:`on_exit_requested`, where long polls
    end at once with what they have), then lets requests in progress finish for at
    most 2 seconds; their clients retry elsewhere or later.
    """

    def __init__(self, host: str, port: int, name: str) -> None:
        self.host = host
        self.name = name
        self._bind_port = port
        self._port: int | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._listening = False
        self._failed: BaseException | None = None

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

    async def _watch_exit(self, server: uvicorn.Server) -> None:
        # uvicorn sets should_exit from its own signal handlers too: polling sees both
        while not server.should_exit:
            await asyncio.sleep(0.05)
        await self.on_exit_requested()

    async def serve(self) -> None:
        """Serve until :meth:`request_exit`; then :meth:`on_shutdown`."""
        try:
            server = uvicorn.Server(uvicorn.Config(
                self.build_app(), log_level="warning", lifespan="on", access_log=False,
                timeout_graceful_shutdown=2))
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
        return f"http://{self.host}:{self.port}"


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
