"""The guard: the ASGI layer every request of a server passes before any endpoint.

Contract (docs/security.md), from the server's
:class:`~databus.serving.config.HttpServerConfig`:

* ``GET /health`` answers ``{"status": "ok", "service": <name>}`` at once, to anyone.
* **Authentication**: with a token file (:mod:`databus.auth`), every path but the
  service's open ones (``/health``, ``/metrics``, ``/openapi.json``) needs a valid
  bearer token (401 naming the ``Bearer`` scheme otherwise), and the admin paths, and
  everything below them, an admin one (403). A token seen before is checked without
  hashing; a new one is verified (argon2) off the event loop. Without a token file
  everyone is :data:`~databus.auth.ANONYMOUS`. Endpoints ask :func:`principal` who
  sent a request and :func:`readable_ids` what it may read.
* **Limits**: a ``Content-Length`` over ``max_body_bytes`` is 413 before the body is
  read, and so is a chunked body once it grows past it; a request line plus headers
  over ``max_header_bytes`` is 431; a body not received whole within
  ``read_timeout`` seconds of its first read is 408.
* **Slow readers**: each part of an answer (at most 1 MiB; a larger body is sent in
  parts, copied, so a stalled connection never pins a whole answer) waits at most
  ``send_timeout`` seconds for the client; then the connection is cut and a warning
  logged. The client resumes from its checkpoint.
* A refusal is the JSON answer of :mod:`databus.serving.errors`. The same checks and
  answers serve the direct routes: :class:`Guard` is their
  :class:`~databus.serving.direct.Gate`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from databus.auth import ANONYMOUS, Authenticator, Principal
from databus.core.errors import (
    DatabusError,
    HeadersTooLargeError,
    InvalidRequestError,
    PayloadTooLargeError,
    RequestTimeoutError,
)
from databus.serving.config import HttpServerConfig
from databus.serving.direct import PART, PRINCIPAL_KEY
from databus.serving.errors import error_response, internal_error_response

log = logging.getLogger("databus.serving")


def principal(request: Request) -> Principal:
    """Who made ``request`` (set by the server's guard; everyone when no tokens)."""
    p = request.scope.get(PRINCIPAL_KEY, ANONYMOUS)
    assert isinstance(p, Principal)
    return p


def token_name(request: Request) -> str | None:
    """The name of the token ``request`` was sent with; None on a server without tokens."""
    p = principal(request)
    return None if p is ANONYMOUS else p.name


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


class Guard:
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
        scope[PRINCIPAL_KEY] = who
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
            if message["type"] != "http.response.body" or len(body) <= PART:
                await send_one(message)
                return
            # a large body goes out in parts: the server waits for a slow reader before
            # each part (so the timeout can cut it) and holds at most one part of it,
            # not the whole answer, in its write buffer
            # parts are copies: a view would keep the whole answer alive for as long as
            # a stalled connection holds its part (measured: GBs with 500 clients)
            view = memoryview(body)
            more = bool(message.get("more_body", False))
            for start in range(0, len(body), PART):
                part = bytes(view[start:start + PART])
                last = start + PART >= len(body)
                await send_one({"type": "http.response.body", "body": part,
                                "more_body": more or not last})

        return send_timed


class _SlowClient(Exception):
    """Raised through the app when a client stopped reading (see :class:`Guard`)."""
