"""``GET /stream``: the windows after a checkpoint, long-polling when there are none.

One :class:`StreamEndpoint` answers every ``/stream`` request of a relay, by two
routes with the same answers (status, headers, body, errors, request counts):

* **Direct** (:meth:`StreamEndpoint.direct`, a :mod:`databus.serving.direct` route):
  plain GETs, the request every consumer repeats. A read without a selection runs
  on the event loop and its answer is written at once, with no task. A request
  that must wait joins the relay's waiters: one task (the waker) waits for the
  next append and retries every waiter in one pass: a wake costs at most a buffer
  read per waiter (waiters at the same position share one), not a task switch and
  a timer per waiter; each waiter has one timer for its deadline. Requests with a
  selection (``sources``, ``filters``), JSON output or a token not verified yet run
  as tasks, as on the other route.
* **ASGI** (:meth:`StreamEndpoint.endpoint`): ``HEAD``, and GETs the direct route
  does not take (see :mod:`databus.serving.direct`), through the app.

What costs per event runs in Starlette's thread pool, so a large answer does not
stall the other connections: selecting events and encoding ``output=json``. A read
without a selection stays on the loop; on the direct route it is not even copied:
the answer is written from pinned views of the buffer (:meth:`EventBuffer.read_pinned`),
released when the connection has sent them; a connection still holding them when
the buffer must evict their window is cut (the writer's ``pin_grace``), so an
evicted byte is never sent. Long-poll wakes and the ASGI route copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from functools import partial
from typing import Any, Protocol

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from databus.buffer import EventBuffer, PinnedRead, ReadResult, select
from databus.core import event as ev
from databus.core.checkpoint import Checkpoint, ConsumptionMode
from databus.core.envelope import dumps, envelope
from databus.core.errors import (
    DatabusError,
    InvalidCheckpointError,
    InvalidRequestError,
    UnknownSourceError,
)
from databus.core.filters import ServerFilter
from databus.core.schema import SchemaRegistry
from databus.relay.cluster import ClusterMember
from databus.relay.config import RelayConfig
from databus.relay.consumers import ConsumerTable, check_name
from databus.relay.metrics import Observation, RelayMetrics
from databus.relay.timeline import Timeline
from databus.serving.direct import DirectReply
from databus.serving.errors import error_response
from databus.serving.guard import principal, readable_ids, token_name
from databus.serving.health import Check
from databus.serving.params import bool_param, float_param, int_param, source_ids_param
from databus.sources.base import Source


class ServedRelay(Protocol):
    """What the API reads from the relay it serves (:class:`databus.relay.relay.Relay`)."""

    config: RelayConfig
    metrics: RelayMetrics
    buffer: EventBuffer
    source: Source
    timeline: Timeline  # source time of the windows held
    consumers: ConsumerTable  # who read lately
    stopping: bool  # set at shutdown: long polls return at once

    def changed_event(self) -> asyncio.Event:
        """An event set at the next append (take it before reading the buffer)."""
        ...

    def stats(self) -> dict[str, Any]: ...

    def refresh_gauges(self) -> None: ...

    def fetcher_status(self) -> dict[str, Any]: ...

    def capture_status(self) -> dict[str, Any]: ...

    def origin(self) -> str: ...

    def observe(self) -> Observation: ...

    def readiness(self) -> list[Check]: ...

    @property
    def cluster(self) -> ClusterMember | None: ...

    def wake(self) -> None:
        """Wake long polls (e.g. more windows became servable)."""
        ...


class Inflight:
    """Answer bytes held for clients right now (event-loop only: no lock)."""

    FLOOR = 64 * 1024

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def size_for(self, wanted: int) -> int:
        """What a new answer may take: ``wanted`` while the budget allows, less (but at
        least FLOOR, so every consumer still progresses) when it does not."""
        return max(self.FLOOR, min(wanted, self.limit - self.held))


class HeldResponse:
    """A 200 answer whose bytes count against the in-flight budget until it was sent
    (or its client was cut or went away). The ASGI messages of a Starlette
    ``Response`` (``content-length``, ``content-type``, then the given headers),
    built without its header normalization: the names here are fixed and lowercase."""

    __slots__ = ("body", "held", "inflight", "raw_headers")

    status_code = 200

    def __init__(self, inflight: Inflight, body: bytes, headers: list[tuple[bytes, bytes]],
                 media_type: bytes, size: int | None = None) -> None:
        """``size``: the body's length when it is sent from elsewhere (``body`` empty)."""
        self.body, self.inflight = body, inflight
        self.held = held = len(body) if size is None else size
        self.raw_headers = [(b"content-length", b"%d" % held),
                            (b"content-type", media_type), *headers]
        inflight.held += self.held

    def release(self) -> None:
        """The answer left (or was dropped): its bytes no longer count."""
        self.inflight.held -= self.held
        self.held = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": self.raw_headers})
            await send({"type": "http.response.body", "body": self.body})
        finally:
            self.release()


class _Query:
    """A validated /stream request."""

    __slots__ = ("cp", "deadline", "filt", "member", "member_hw", "newest", "output",
                 "selecting", "size", "src_ids", "transactions", "upto", "upto_asked")

    cp: Checkpoint
    deadline: float  # time.monotonic(), the clock of asyncio's loop.time() too
    filt: ServerFilter | None
    member: str | None
    member_hw: int | None
    newest: bool  # each key's last event only (select.newest), windows up to upto_asked
    output: str
    selecting: bool
    size: int
    src_ids: frozenset[int] | None
    transactions: bool
    upto: int | None
    upto_asked: int | None  # uptoScn: no window past it (with the cluster's limit)


class _Poll:
    """A direct request waiting for windows."""

    __slots__ = ("query", "reply", "timer")

    def __init__(self, query: _Query, reply: DirectReply) -> None:
        self.query, self.reply = query, reply
        self.timer: asyncio.TimerHandle | None = None


class StreamEndpoint:
    """Answers ``/stream`` for one relay (see the module docstring); counts every
    answer in ``databus_relay_requests`` (endpoint ``stream``)."""

    def __init__(self, relay: ServedRelay, inflight: Inflight) -> None:
        self.relay, self.inflight = relay, inflight
        self._counters: dict[int, Any] = {}
        self._waiting: dict[_Poll, None] = {}  # insertion order: answered in arrival order
        self._waker: asyncio.Task[None] | None = None

    def count(self, status: int) -> None:
        """One answer with ``status``."""
        counter = self._counters.get(status)
        if counter is None:  # a labelled child per status, looked up once
            counter = self.relay.metrics.requests.labels(endpoint="stream", status=str(status))
            self._counters[status] = counter
        counter.inc()

    # -- the steps every request takes --------------------------------------------------

    def parse(self, request: Request) -> _Query:
        """The request, validated (raises its 4xx :class:`DatabusError`)."""
        relay = self.relay
        cfg = relay.config.stream
        q = request.query_params
        listed = [(s.id, s.name) for s in relay.source.sources()]
        known = {i for i, _ in listed}
        query = _Query()
        query.src_ids = readable_ids(request, listed, source_ids_param(request, known))
        query.size = self.inflight.size_for(
            int_param(request, "size", cfg.default_size, 1, cfg.max_size))
        timeout = float_param(request, "timeout", cfg.default_timeout, 0.0, cfg.max_timeout)
        output = q.get("output", "binary")
        if output not in ("binary", "json"):
            raise InvalidRequestError(f"output must be binary or json, got {output[:50]!r}")
        query.output = output
        query.transactions = bool_param(request, "transactions")
        query.upto_asked = (int_param(request, "uptoScn", 0, -1, 2**63 - 1)
                            if q.get("uptoScn") is not None else None)
        query.newest = bool_param(request, "newest")
        if query.newest and query.upto_asked is None:
            # a key's newer change past the reader's end must not hide the one before it
            raise InvalidRequestError("newest=true needs uptoScn (the last window the "
                                      "reader's range holds)")
        filt = ServerFilter.parse(q["filters"]) if q.get("filters") else None
        if filt is not None:
            unknown = set(filt.by_source) - known
            if unknown:
                raise UnknownSourceError(f"filter names unknown source ids {sorted(unknown)}")
            readable_ids(request, listed, frozenset(filt.by_source))
        query.filt = filt
        raw_cp = q.get("checkPoint")
        cp = Checkpoint.from_json(raw_cp) if raw_cp else Checkpoint.flexible()
        if cp.consumption_mode != ConsumptionMode.ONLINE_CONSUMPTION:
            raise InvalidCheckpointError(
                f"a relay serves ONLINE_CONSUMPTION checkpoints, got {cp.consumption_mode.value}"
            )
        if cp.is_flexible and bool_param(request, "streamFromLatestScn"):
            cp = Checkpoint.after(relay.buffer.max_scn)
        query.cp = cp
        # a cluster serves consumers only the windows every live member holds; its
        # members (chain sources) read past that, and their reads say what they hold
        member = request.headers.get("x-databus-member") or None
        if member:
            # a member's read moves the cluster's high-water mark: members read with an
            # admin token, never with a consumer's
            principal(request).check_admin("a cluster member's read (X-Databus-Member)")
        query.member = member
        query.member_hw = (_int_or_none(request.headers.get("x-databus-member-hw"))
                           if member else None)
        query.upto = None
        if relay.cluster is not None:
            if member:
                held = -1 if cp.is_flexible else (cp.prev_scn if cp.in_window else cp.window_scn)
                if relay.cluster.follower_at(member, held):
                    relay.wake()  # consumers waiting for replicated windows
            else:
                relay.cluster.check_serving()  # a member whose capture stopped: 503
                query.upto = relay.cluster.serve_limit()
        # an unselected read is one copy of buffer bytes: cheaper than a thread hop
        # (which costs single consumers ~15% of their rate); a selection walks every event
        # (newest=true needs uptoScn: upto_asked covers it)
        query.selecting = (query.src_ids is not None or filt is not None
                           or query.upto_asked is not None)
        query.deadline = time.monotonic() + timeout
        # who reads, and from where (GET /consumers): a dict lookup and a few stores
        name = check_name(request.headers.get("x-databus-consumer"))
        if name is None and member:
            name = f"member {member}"
        client = request.scope.get("client")
        relay.consumers.seen(name, token_name(request), client[0] if client else "?", cp,
                             query.deadline, member=bool(member))
        return query

    def _read_here(self, query: _Query,
                   shared: dict[tuple[Checkpoint, int, int | None], ReadResult] | None = None,
                   ) -> ReadResult:
        """Read on this thread (an unselected read, on the event loop). With ``shared``
        (one wake's reads), waiters at the same position share one read: a wake of
        many consumers at the newest window reads it once."""
        relay = self.relay
        if relay.cluster is not None and not query.member:
            query.upto = relay.cluster.serve_limit()
        if shared is None:
            return relay.buffer.read(query.cp, query.size, upto_scn=query.upto)
        key = (query.cp, query.size, query.upto)
        result = shared.get(key)
        if result is None:
            result = relay.buffer.read(query.cp, query.size, upto_scn=query.upto)
            shared[key] = result
        return result

    async def _read(self, query: _Query) -> ReadResult:
        if not query.selecting:
            return self._read_here(query)
        relay = self.relay
        if relay.cluster is not None and not query.member:
            query.upto = relay.cluster.serve_limit()
        if query.upto_asked is not None:
            query.upto = (query.upto_asked if query.upto is None
                          else min(query.upto, query.upto_asked))
        result: ReadResult = await run_in_threadpool(self._read_selected, query)
        return result

    def _read_selected(self, query: _Query) -> ReadResult:
        """A selected read (on a worker thread); with ``newest``, whole windows reduced to
        each key's last event (a partial window is served as it is: the reader's own
        per-key map is what makes its result right, the reduction only spares work)."""
        result = self.relay.buffer.read(query.cp, query.size, sources=query.src_ids,
                                        filter=query.filt, upto_scn=query.upto)
        if not query.newest or result.partial or not result.data_events:
            return result
        data, kept = select.newest(result.data)
        return dataclasses.replace(result, data=data, data_events=kept,
                                   events=result.events - (result.data_events - kept))

    def _done(self, query: _Query, result: ReadResult | PinnedRead) -> bool:
        """Whether ``result`` is the answer: events, the deadline passed, shutdown, or
        (for a member) a new cluster high-water mark to tell."""
        relay = self.relay
        if result.events or query.deadline - time.monotonic() <= 0 or relay.stopping:
            return True
        # a member learns a new high-water mark at once
        return (query.member_hw is not None and relay.cluster is not None
                and relay.cluster.serve_limit() != query.member_hw)

    def _headers(self, query: _Query, result: ReadResult | PinnedRead,
                 ) -> list[tuple[bytes, bytes]]:
        relay = self.relay
        self.relay.metrics.bytes_out.inc(
            result.size if isinstance(result, PinnedRead) else len(result.data))
        self.relay.metrics.events_out.inc(result.events)
        # the position after this response, so a client need not scan the body
        headers = [
            (b"x-databus-max-scn", b"%d" % relay.buffer.max_scn),
            (b"x-databus-min-scn", b"%d" % relay.buffer.min_scn),
            (b"x-databus-last-window-scn", b"%d" % result.last_scn),
            (b"x-databus-partial-scn", b"%d" % result.partial_scn),
            (b"x-databus-partial-count", b"%d" % result.partial_count),
        ]
        # the relay's source time, and what it holds beyond this answer: a client's lag
        # (docs/operations.md, "Time in the stream")
        headers.append((b"x-databus-source-time-ns", b"%d" % relay.timeline.captured_until_ns))
        last = result.last_scn
        if last >= relay.buffer.max_scn or (last < 0 and not result.events):
            headers.append((b"x-databus-windows-behind", b"0"))
        else:
            cp = query.cp
            at = last if last >= 0 else (-1 if cp.is_flexible else
                                         cp.prev_scn if cp.in_window else cp.window_scn)
            headers.append((b"x-databus-windows-behind", b"%d" % relay.timeline.behind(at)))
        if query.member and relay.cluster is not None:
            headers.append((b"x-databus-cluster-hw", b"%d" % relay.cluster.serve_limit()))
        if query.cp.is_flexible and relay.buffer.prev_scn >= 0:
            # a new reader starts at the oldest window: the windows up to this one are gone
            headers.append((b"x-databus-prev-scn", b"%d" % relay.buffer.prev_scn))
        return headers

    async def _answer(self, query: _Query, result: ReadResult) -> HeldResponse:
        headers = self._headers(query, result)
        if query.output == "json":
            body = await run_in_threadpool(to_json_lines, self.relay.source.registry(),
                                           result.data, transactions=query.transactions)
            return HeldResponse(self.inflight, body, headers, b"application/x-ndjson")
        return HeldResponse(self.inflight, result.data, headers, b"application/octet-stream")

    async def _serve(self, query: _Query) -> HeldResponse:
        while True:
            changed = self.relay.changed_event()  # before the read: no append is missed
            result = await self._read(query)
            if self._done(query, result):
                return await self._answer(query, result)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(query.deadline):
                    await changed.wait()

    # -- the ASGI route -------------------------------------------------------------------

    async def endpoint(self, request: Request) -> HeldResponse:
        """The answer to ``request`` (raises its :class:`DatabusError`)."""
        return await self._serve(self.parse(request))

    # -- the direct route ----------------------------------------------------------------

    def direct(self, request: Request, reply: DirectReply) -> None:
        """Answers a plain ``GET /stream`` (a :data:`databus.serving.direct.DirectHandler`)."""
        try:
            query = self.parse(request)
            if query.selecting or query.output == "json":
                reply.spawn(self._serve_later(query, reply))
                return
            changed = self.relay.changed_event()  # before the read: no append is missed
            relay = self.relay
            if relay.cluster is not None and not query.member:
                query.upto = relay.cluster.serve_limit()
            pinned = relay.buffer.read_pinned(query.cp, query.size, upto_scn=query.upto)
            try:
                if not self._done(query, pinned):
                    pinned.release()  # nothing read: nothing pinned
                    self._wait(_Poll(query, reply), changed)
                    return
                headers = self._headers(query, pinned)
                self._send_pinned(reply, pinned, headers)
            except BaseException:
                pinned.release()
                raise
        except DatabusError as exc:
            self._send_error(reply, exc)
            return
        except Exception:
            self.count(500)
            raise  # the reply answers 500

    def _send_pinned(self, reply: DirectReply, pinned: PinnedRead,
                     headers: list[tuple[bytes, bytes]]) -> None:
        """Answer with the pinned views (no copy); the pin goes when the connection
        has sent them or is gone, or is revoked (the connection cut) by a writer that
        must evict them."""
        loop = asyncio.get_running_loop()
        pinned.on_revoke(partial(_revoke, loop, pinned, reply))
        response = HeldResponse(self.inflight, b"", headers, b"application/octet-stream",
                                size=pinned.size)
        self.count(200)
        reply.send(200, response.raw_headers, pinned.parts, sent=response.release,
                   done=pinned.release)

    async def _serve_later(self, query: _Query, reply: DirectReply) -> None:
        try:
            response = await self._serve(query)
        except DatabusError as exc:
            self._send_error(reply, exc)
        except Exception as exc:  # broad: a spawned task's top; any error answers 500
            self.count(500)
            reply.fail(exc)
        else:
            self._send(reply, response)

    def _send(self, reply: DirectReply, response: HeldResponse) -> None:
        self.count(200)
        reply.send(200, response.raw_headers, response.body, sent=response.release)

    def _send_error(self, reply: DirectReply, exc: DatabusError) -> None:
        response: JSONResponse = error_response(exc)
        self.count(response.status_code)
        reply.send_response(response)

    # -- waiting for windows (direct route) ------------------------------------------------

    def _wait(self, poll: _Poll, changed: asyncio.Event) -> None:
        """``poll`` waits for the next append after the read it made (``changed`` was
        taken before that read) or its deadline."""
        loop = asyncio.get_running_loop()
        poll.timer = loop.call_at(poll.query.deadline, self._expire, poll)
        self._waiting[poll] = None
        if self._waker is None:
            # every waiter's event is this one, or a newer one (then this one was set):
            # waiting for it misses no append
            self._waker = loop.create_task(self._wake_loop(changed))

    async def _wake_loop(self, changed: asyncio.Event) -> None:
        try:
            while self._waiting:
                await changed.wait()
                changed = self.relay.changed_event()  # before the reads
                shared: dict[tuple[Checkpoint, int, int | None], ReadResult] = {}
                for poll in list(self._waiting):
                    self._retry(poll, final=False, shared=shared)
        finally:
            self._waker = None

    def _expire(self, poll: _Poll) -> None:
        poll.timer = None
        if poll in self._waiting:
            self._retry(poll, final=True)

    def _retry(self, poll: _Poll, *, final: bool,
               shared: dict[tuple[Checkpoint, int, int | None], ReadResult] | None = None,
               ) -> None:
        reply = poll.reply
        if reply.closed:  # the client went away: nobody to answer
            self._drop(poll)
            return
        query = poll.query
        try:
            result = self._read_here(query, shared)
            if not final and not self._done(query, result):
                return
            self._drop(poll)
            response = HeldResponse(self.inflight, result.data, self._headers(query, result),
                                    b"application/octet-stream")
        except DatabusError as exc:
            self._drop(poll)
            self._send_error(reply, exc)
            return
        except Exception as exc:  # broad: one poll's answer; any error answers it 500
            self._drop(poll)
            self.count(500)
            reply.fail(exc)
            return
        self._send(reply, response)

    def _drop(self, poll: _Poll) -> None:
        self._waiting.pop(poll, None)
        if poll.timer is not None:
            poll.timer.cancel()
            poll.timer = None


def _revoke(loop: asyncio.AbstractEventLoop, pinned: PinnedRead, reply: DirectReply) -> None:
    """From the buffer's writer: cut the connection that still holds ``pinned``'s
    views (on the loop's thread); with the loop gone nothing sends them any more."""
    def cut() -> None:
        if pinned.held:
            reply.abort()
            pinned.release()  # the transport dropped the views with the connection

    try:
        loop.call_soon_threadsafe(cut)
    except RuntimeError:  # the loop is closed
        pinned.release()


def _int_or_none(raw: str | None) -> int | None:
    """An integer header, or None when absent or not an integer."""
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def to_json_lines(reg: SchemaRegistry, data: bytes, *, transactions: bool = False) -> bytes:
    """Binary events -> envelope lines; each window ends with an ``eop`` line.

    With ``transactions``, a window's events are framed by transaction lines
    (``status`` BEGIN, and END with the event count per table), as in
    Debezium's transaction metadata.
    """
    lines: list[str] = []
    total = 0
    per_source: dict[int, int] = {}
    txid: str | None = None
    for event in ev.iter_events(data, verify=False):
        if event.src_id == ev.SRC_EOP:
            if transactions and total:
                lines.append(json.dumps({
                    "type": "transaction", "status": "END", "id": txid, "scn": event.scn,
                    "event_count": total,
                    "data_collections": [
                        {"data_collection": _source_name(reg, src), "event_count": n}
                        for src, n in per_source.items()]}))
            lines.append(json.dumps({"type": "eop", "scn": event.scn,
                                     "ts_ms": event.timestamp_ns // 1_000_000}))
            total = 0
            per_source.clear()
            continue
        if event.is_control:
            continue
        total += 1
        per_source[event.src_id] = per_source.get(event.src_id, 0) + 1
        env = envelope(event, reg, total_order=total,
                       data_collection_order=per_source[event.src_id])
        if transactions and total == 1:
            txid = env["transaction"]["id"]
            lines.append(json.dumps({"type": "transaction", "status": "BEGIN", "id": txid,
                                     "scn": event.scn,
                                     "ts_ms": event.timestamp_ns // 1_000_000}))
        lines.append(dumps(env))
    return ("\n".join(lines) + "\n").encode("utf-8") if lines else b""


def _source_name(reg: SchemaRegistry, src_id: int) -> str:
    try:
        return reg.latest(src_id).name
    except DatabusError:
        return str(src_id)
