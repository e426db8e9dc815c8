"""The HTTP/1.1 connection protocol every server runs under uvicorn: uvicorn's h11
protocol with a deadline for each request head, and *direct* GET routes answered on
the connection itself, without h11, an ASGI cycle or a task per request.

Why direct routes: a relay's consumers repeat ``GET /stream`` back to back, and
h11's parsing and answer encoding, uvicorn's request cycle and task, and the ASGI
layers above cost each such request more than reading its events does
(bench/RESULTS.md, "Relay fan-out").

Contract of a direct route:

* Only a plain request takes it: ``GET <path>[?query] HTTP/1.1`` whose path is a
  direct route, exactly one ``Host``, no ``Content-Length`` (but one
  ``Content-Length: 0``, an empty body: Java's HttpClient sends it with every GET),
  no ``Transfer-Encoding``, ``Expect`` or ``Upgrade``, ``Connection`` absent or
  ``keep-alive``, every line as
  h11 would accept it, the head at most ``max_head`` bytes, and the server under its
  connection limit. Every other request, whole and byte for byte, goes to uvicorn's
  h11 protocol and the ASGI app, as it would without direct routes: its answer
  (400, 503, ``Connection: close``, the app's own) is the one it always was.
* The server's :class:`Gate` admits the request first (tokens, admin paths, header
  size) with the answers of its ASGI guard; the handler then gets a Starlette
  ``Request`` over a scope like uvicorn's and a :class:`DirectReply`, and must
  answer through it exactly once, at once or later (a long poll).
* An answer is written as uvicorn would write it (the same status line, its
  ``server`` and ``date`` headers, then the handler's), the body in parts of at most
  1 MiB; before each part a client that has not read the previous one gets
  ``send_timeout`` seconds, then its connection is cut.
* A body may be a list of buffers the server does not own (views of the relay's
  event buffer), written without a copy. The transport may keep a view it could
  not send yet (asyncio 3.12+, uvloop), so the reply's ``done`` callback runs only
  once the transport holds none of them: its write buffer is empty (the protocol
  asks to be told: write-buffer limits of zero until then), or the connection is
  gone. :meth:`DirectReply.abort` drops what the transport still holds.
* A handler that raises gets a 500 ``InternalError`` answer, the traceback is
  logged and the connection closed, as uvicorn does for an ASGI app.
* Timers: the request-head deadline (``read_timeout`` from the connection and from
  the end of each answer, for a request head to arrive whole) and, after a direct
  answer, uvicorn's keep-alive timeout, share one lazily moved timer per connection.
* Pipelined requests wait, in order, until the answer in progress is written; a
  graceful shutdown closes an idle connection at once and a busy one after its
  answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable
from urllib.parse import unquote

import h11
from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Scope
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.h11_impl import STATUS_PHRASES, H11Protocol

from databus.auth import Principal

log = logging.getLogger("databus.serving")

PART = 1024 * 1024
"""Largest part of an answer written at once (see :class:`DirectReply`; the guard's
answers too)."""

PRINCIPAL_KEY = "databus.principal"
"""The scope key of who sent a request (set by the gate's admission, read by
:func:`databus.serving.guard.principal`)."""

# h11's grammar (h11/_abnf.py), so a head taken here is one h11 would take
_TOKEN = rb"[-!#$%&'*+.^_`|~0-9a-zA-Z]+"
_FIELD_CONTENT = rb"[^\x00\s]+(?:[ \t]+[^\x00\s]+)*"
_HEADER = re.compile(rb"(" + _TOKEN + rb"):[ \t]*((?:" + _FIELD_CONTENT + rb")?)[ \t]*")
_REQUEST_LINE = re.compile(rb"GET (/[\x21-\x3e\x40-\x7e]*)(?:\?([\x21-\x7e]*))? HTTP/1\.1")
_DELEGATED = frozenset({b"content-length", b"transfer-encoding", b"expect", b"upgrade"})


class Gate(Protocol):
    """What a server checks before any endpoint runs (:class:`databus.serving.guard.Guard`)."""

    def admit_now(self, scope: Scope) -> Principal | None:
        """Who sent the request, when that is known without hashing a token; None when
        a token must be verified (:meth:`admit`). Raises the request's refusal
        (:class:`databus.core.errors.DatabusError`)."""
        ...

    async def admit(self, scope: Scope) -> Principal:
        """As :meth:`admit_now`, verifying a new token off the event loop."""
        ...

    def refusal(self, exc: Exception) -> Response:
        """The answer to a refusal :meth:`admit_now` raised."""
        ...

    def internal_error(self, exc: BaseException) -> Response:
        """The answer to an exception a handler raised (500)."""
        ...


DirectHandler = Callable[[Request, "DirectReply"], None]
"""Answers a direct GET through the reply, now or later; must not block."""


@runtime_checkable
class DirectRoutes(Protocol):
    """An ASGI app that also answers some GET paths directly (raw path -> handler);
    the app itself still answers everything else, and those paths when a request is
    not plain enough for a direct route (see the module docstring)."""

    direct_get: Mapping[bytes, DirectHandler]


class DirectReply:
    """The one answer to a direct request (see the module docstring)."""

    __slots__ = ("_proto", "done", "scope")

    def __init__(self, proto: DirectH11, scope: Scope) -> None:
        self._proto, self.scope, self.done = proto, scope, False

    @property
    def closed(self) -> bool:
        """Whether the client went away (an answer would be dropped)."""
        return self._proto.transport.is_closing()

    def send(self, status: int, headers: list[tuple[bytes, bytes]],
             body: bytes | Sequence[memoryview], sent: Callable[[], None] | None = None,
             done: Callable[[], None] | None = None) -> None:
        """Answer ``status`` with ``headers`` (lowercase names, ``content-length``
        among them) and ``body``; ``sent`` runs once the answer is written to the
        connection or dropped (the client went away or was cut).

        ``body`` as a list of views is written without a copy; ``done`` then runs
        once the connection no longer holds any of them (see the module docstring):
        until then they must stay unchanged."""
        if self.done:
            raise RuntimeError("a direct request answered twice")
        self.done = True
        proto = self._proto
        head = [b"HTTP/1.1 %d %s\r\n" % (status, STATUS_PHRASES[status])]
        head += [b"%s: %s\r\n" % kv for kv in proto.server_state.default_headers]
        head += [b"%s: %s\r\n" % kv for kv in headers]
        head.append(b"\r\n")
        transport = proto.transport
        parts = [body] if isinstance(body, bytes) else body
        size = sum(map(len, parts))
        if transport.is_closing():
            proto._answered(sent)
            proto._when_sent(done)
        elif size <= PART and not proto.flow.write_paused:
            # the usual case: written now, no task
            transport.write(b"".join(head))
            for part in parts:
                if part:
                    transport.write(part)
            proto._answered(sent)
            proto._when_sent(done)
        else:
            proto._spawn(proto._write_parts(self.scope, b"".join(head), body, sent, done))

    def abort(self) -> None:
        """Cut the connection now, dropping what its transport still holds (a body's
        views that must not be sent any more)."""
        self._proto.transport.abort()

    def send_response(self, response: Response) -> None:
        """Answer with a Starlette ``Response`` whose body is rendered (not streamed)."""
        self.send(response.status_code, response.raw_headers, bytes(response.body))

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` (which answers later) as a task the server tracks like its
        request tasks."""
        self._proto._spawn(coro)

    def fail(self, exc: BaseException) -> None:
        """Answer 500 ``InternalError`` (when nothing was answered yet), log the
        traceback and close the connection after the answer."""
        proto = self._proto
        proto.logger.error("Exception in ASGI application\n", exc_info=exc)
        if self.done:  # after its answer: the connection goes, as uvicorn closes it
            proto.transport.close()
            return
        proto._close_after = True
        self.send_response(proto.gate_().internal_error(exc))


class DirectH11(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with the request-head deadline uvicorn lacks and
    the direct routes of the module docstring.

    The head deadline: a connection that sends nothing, or a partial head, would
    otherwise hold a connection slot for ever (a slowloris). It runs from the
    connection, then from the end of each answer; when it passes while no whole
    request head arrived, the connection is closed. A request in progress (a long
    poll, a body being read, which the ASGI guard times) is never cut by it.

    Subclassed per server with its settings (``databus.serving.HttpService``)."""

    read_timeout: ClassVar[float] = 30.0
    send_timeout: ClassVar[float] = 60.0
    max_head: ClassVar[int] = 16 * 1024
    server_name: ClassVar[str] = "server"
    direct: ClassVar[Mapping[bytes, DirectHandler]] = {}
    gate: ClassVar[Gate | None] = None

    _timer: asyncio.TimerHandle | None = None
    _head_from = 0.0  # loop time the head deadline runs from
    _idle_from: float | None = None  # end of a direct answer, until data arrives
    _reply: DirectReply | None = None  # the direct request in progress
    _close_after = False
    _consuming = False
    _held: list[Callable[[], None]] | None = None  # done callbacks waiting for the drain
    _limits: tuple[int, int] = (0, 0)  # the transport's write-buffer limits before

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._pending = bytearray()
        self._arm_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        try:
            super().connection_lost(exc)
        finally:
            self._release_held()  # the transport holds nothing any more

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._held is not None and self.transport.get_write_buffer_size() == 0:
            self._release_held()

    def gate_(self) -> Gate:
        assert self.gate is not None, "direct routes need a gate"
        return self.gate

    # -- reading ---------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        self._idle_from = None
        if self._reply is not None:
            # pipelined behind a direct answer in progress: read on after it
            self._pending += data
            if len(self._pending) > HIGH_WATER_LIMIT:
                self.flow.pause_reading()
            return
        if not self.direct or not self._h11_idle():
            super().data_received(data)
            return
        self._unset_keepalive_if_required()
        self._pending += data
        self._consume()

    def _h11_idle(self) -> bool:
        conn = self.conn
        return (conn.our_state is h11.IDLE and conn.their_state is h11.IDLE
                and not conn.trailing_data[0])

    def _delegate(self) -> None:
        data, self._pending = bytes(self._pending), bytearray()
        super().data_received(data)

    def _consume(self) -> None:
        """Start the requests held in ``_pending``, direct ones here, the rest in h11."""
        if self._consuming:
            return  # an answer written from inside this loop: the loop goes on
        self._consuming = True
        try:
            while self._reply is None and self._pending and not self.transport.is_closing():
                if not self._h11_idle():
                    self._delegate()
                    return
                buf = self._pending
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    probe = bytes(buf[:12])
                    if len(buf) > self.max_head or not _may_be_direct(probe):
                        self._delegate()
                    return  # a direct head so far: wait for the rest
                head = bytes(buf[:end])
                request = self._parse(head) if end + 4 <= self.max_head else None
                limit = self.limit_concurrency
                if request is None or (limit is not None and (
                        len(self.connections) >= limit or len(self.tasks) >= limit)):
                    self._delegate()  # h11 answers it (503 over the limit)
                    return
                del buf[:end + 4]
                self._start(*request)
        finally:
            self._consuming = False

    def _parse(self, head: bytes) -> tuple[DirectHandler, Scope] | None:
        lines = head.split(b"\r\n")
        m = _REQUEST_LINE.fullmatch(lines[0])
        if m is None:
            return None
        raw_path = m[1]
        handler = self.direct.get(raw_path)
        if handler is None:
            return None
        headers: list[tuple[bytes, bytes]] = []
        hosts = lengths = 0
        for line in lines[1:]:
            h = _HEADER.fullmatch(line)
            if h is None:
                return None
            name = h[1].lower()
            value = h[2]
            if name == b"content-length" and value == b"0":
                # an empty body, nothing to read after the head: Java's HttpClient (the
                # Spark JVM reader's) sends it with every GET before Java 19 (JDK-8283544)
                lengths += 1
            elif name in _DELEGATED:
                return None
            if name == b"host":
                hosts += 1
            elif name == b"connection" and value.lower() != b"keep-alive":
                return None
            headers.append((name, value))
        if hosts != 1 or lengths > 1:
            return None
        scope: Scope = {
            "type": "http", "asgi": {"version": self.asgi_version, "spec_version": "2.3"},
            "http_version": "1.1", "server": self.server, "client": self.client,
            "scheme": self.scheme, "method": "GET", "root_path": self.root_path,
            "path": self.root_path + raw_path.decode("ascii"),
            "raw_path": self.root_path.encode("ascii") + raw_path,
            "query_string": m[2] or b"", "headers": headers, "state": self.app_state.copy()}
        return handler, scope

    # -- a direct request --------------------------------------------------------------

    def _start(self, handler: DirectHandler, scope: Scope) -> None:
        reply = DirectReply(self, scope)
        self._reply = reply
        gate = self.gate_()
        try:
            who = gate.admit_now(scope)
        # broad: a request's top on the event loop; every error is answered (a refusal,
        # else 500), none reaches the loop
        except Exception as exc:
            self._answer_refusal(reply, gate, exc)
            return
        if who is None:
            self._spawn(self._admit_then(handler, scope, reply))
            return
        self._run(handler, scope, reply, who)

    def _answer_refusal(self, reply: DirectReply, gate: Gate, exc: Exception) -> None:
        try:
            response = gate.refusal(exc)
        except Exception as unexpected:  # broad: not a refusal, so the server's error: 500
            reply.fail(unexpected)
            return
        reply.send_response(response)

    async def _admit_then(self, handler: DirectHandler, scope: Scope,
                          reply: DirectReply) -> None:
        gate = self.gate_()
        try:
            who = await gate.admit(scope)
        except Exception as exc:  # broad: a request's top, as in _start
            self._answer_refusal(reply, gate, exc)
            return
        self._run(handler, scope, reply, who)

    def _run(self, handler: DirectHandler, scope: Scope, reply: DirectReply,
             who: Principal) -> None:
        scope[PRINCIPAL_KEY] = who
        request = Request(scope)
        # Starlette parses the query at first use; this is the same parse, cheaper
        # (and were Starlette to look elsewhere, it would just parse it again)
        request._query_params = query_params(scope["query_string"])
        try:
            handler(request, reply)
        except Exception as exc:  # broad: a request's top: a handler's error answers 500
            reply.fail(exc)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        # tracked like uvicorn's request tasks: counted against the connection limit
        # and waited for (then cancelled) by a graceful shutdown
        task = self.loop.create_task(coro)
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    async def _write_parts(self, scope: Scope, head: bytes, body: bytes | Sequence[memoryview],
                           sent: Callable[[], None] | None,
                           done: Callable[[], None] | None) -> None:
        try:
            await self._writable(scope)
            self.transport.write(head)
            if isinstance(body, bytes):
                # parts are copies: a view would keep the whole answer alive for as long
                # as a stalled connection holds its part (measured: GBs with 500 clients)
                view = memoryview(body)
                for start in range(0, len(body), PART):
                    await self._writable(scope)
                    if self.transport.is_closing():
                        break
                    self.transport.write(body if len(body) <= PART
                                         else bytes(view[start:start + PART]))
            else:  # views of memory that lives on anyway: no copy
                for buf in body:
                    for start in range(0, len(buf), PART):
                        await self._writable(scope)
                        if self.transport.is_closing():
                            return
                        self.transport.write(buf[start:start + PART])
        finally:
            self._answered(sent)
            self._when_sent(done)

    def _when_sent(self, done: Callable[[], None] | None) -> None:
        """Run ``done`` once the transport holds nothing of what was written so far."""
        if done is None:
            return
        transport = self.transport
        if transport.get_write_buffer_size() == 0:
            done()
            return
        if self._held is None:
            # resume_writing is then called exactly when the write buffer is empty
            self._held = []
            low, high = transport.get_write_buffer_limits()
            self._limits = (high, low)
            transport.set_write_buffer_limits(high=0, low=0)
        self._held.append(done)

    def _release_held(self) -> None:
        held, self._held = self._held, None
        if held is None:
            return
        transport = self.transport
        if not transport.is_closing():
            high, low = self._limits
            transport.set_write_buffer_limits(high=high, low=low)
        for done in held:
            try:
                done()
            except Exception:  # broad: one callback's failure must not skip the others
                log.exception("%s: a callback after an answer was sent failed",
                              self.server_name)

    async def _writable(self, scope: Scope) -> None:
        if not self.flow.write_paused or self.transport.is_closing():
            return
        try:
            async with asyncio.timeout(self.send_timeout):
                await self.flow.drain()
        except TimeoutError:
            client = scope.get("client")
            log.warning("%s: cut a client that read nothing for %.0f s (%s %s from %s)",
                        self.server_name, self.send_timeout, scope["method"], scope["path"],
                        f"{client[0]}:{client[1]}" if client else "?")
            self.transport.close()

    def _answered(self, sent: Callable[[], None] | None) -> None:
        """The answer in progress was written (or dropped): the next request may start."""
        self._reply = None
        self.server_state.total_requests += 1
        try:
            if sent is not None:
                sent()
        finally:
            transport = self.transport
            if not transport.is_closing():
                if self._close_after:
                    self._close()
                else:
                    self._idle_from = self.loop.time()
                    self._arm_deadline()
                    self.flow.resume_reading()
                    if self._pending:
                        self._consume()

    def _close(self) -> None:
        if self.conn.our_state is not h11.ERROR:
            with contextlib.suppress(h11.LocalProtocolError):
                self.conn.send(h11.ConnectionClosed())
        self.transport.close()

    def shutdown(self) -> None:
        if self._reply is not None:
            self._close_after = True  # closed once its answer is written
            return
        super().shutdown()

    # -- the head deadline and the keep-alive timeout -----------------------------------

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_deadline()

    def _due(self) -> float:
        due = self._head_from + self.read_timeout
        if self._idle_from is not None:
            due = min(due, self._idle_from + self.timeout_keep_alive)
        return due

    def _arm_deadline(self) -> None:
        # a pending timer is moved lazily (when it fires), not cancelled and made
        # again: one timer per answer cost a busy relay ~4% of its loop (measured)
        self._head_from = self.loop.time()
        if self.transport.is_closing():
            return
        timer = self._timer
        due = self._due()
        if timer is not None and timer.when() > due:
            timer.cancel()  # the keep-alive timeout ends before it (the first answer)
            timer = None
        if timer is None:
            self._timer = self.loop.call_at(due, self._deadline_passed)

    def _deadline_passed(self) -> None:
        self._timer = None
        if (self.transport.is_closing() or self._reply is not None
                or self.conn.their_state is not h11.IDLE):
            return  # a request in progress: its answer's end arms the deadline again
        now = self.loop.time()
        if self._idle_from is not None and now >= self._idle_from + self.timeout_keep_alive:
            self._close()  # uvicorn's keep-alive timeout, after a direct answer
            return
        if now >= self._head_from + self.read_timeout:
            log.info("%s: closed a connection that sent no whole request in %g s (from %s)",
                     self.server_name, self.read_timeout,
                     "%s:%s" % self.client if self.client else "?")  # noqa: UP031
            self._close()
            return
        # an answer ended (or data came) since this timer was set: run from there
        self._timer = self.loop.call_at(self._due(), self._deadline_passed)


def query_params(raw: bytes) -> QueryParams:
    """Starlette's ``QueryParams(raw)`` (``parse_qsl`` of the latin-1 text, blank values
    kept), equal for every input (tested), in less time for the query a consumer
    sends with every request: a percent-encoded JSON checkpoint costs
    ``unquote_to_bytes`` a list item per escape; here the five escapes JSON needs are
    replaced in C, and anything else is unquoted as ``parse_qsl`` does."""
    pairs: list[tuple[str, str]] = []
    for field in raw.decode("latin-1").split("&"):
        if not field:
            continue
        name, _eq, value = field.partition("=")
        pairs.append((_unquote(name), _unquote(value)))
    return QueryParams(pairs)


def _unquote(text: str) -> str:
    """``unquote(text.replace("+", " "))``, as ``parse_qsl`` decodes a name or value."""
    if "+" in text:
        text = text.replace("+", " ")
    if "%" not in text:
        return text
    # a replacement's result (one of '":,{}') can be part of no other escape: when no
    # '%' is left, every escape was one of these five, decoded as unquote decodes it
    out = (text.replace("%22", '"').replace("%3A", ":").replace("%2C", ",")
           .replace("%7B", "{").replace("%7D", "}"))
    return out if "%" not in out else unquote(text)


def _may_be_direct(start: bytes) -> bool:
    """Whether a head beginning ``start`` (not yet whole) may be a direct GET."""
    return b"GET /"[:len(start)] == start[:5]


def protocol_class(base: type[DirectH11], **settings: Any) -> type[DirectH11]:
    """``base`` with ``settings`` as class attributes (uvicorn makes the protocol
    from a class)."""
    return type(base.__name__, (base,), settings)
