"""The relay's HTTP API (docs/relay.md) as a Starlette app.

Every request is validated before it touches the buffer; a client's mistake is
a 4xx with ``{"error": <code>, "message": ...}``, a checkpoint older than the
buffer is 410 ``ScnNotFound``. Unexpected errors are 500 with the same body and
never stop the server (the handlers of :mod:`databus.serving`, registered once).

Threading: ``/stream`` waits for new windows on the event loop (a long poll
holds no thread). What costs per event runs in Starlette's thread pool, so a
large answer does not stall the other connections: selecting events
(``sources``, ``filters``) and encoding ``output=json``. A read without a
selection is one copy of buffer bytes and stays on the loop. The other
endpoints are plain functions, which Starlette runs in that pool too.

Routing: ``GET /stream``, the request every consumer repeats, is answered ahead
of Starlette's middleware and router (:class:`_StreamFirst`) with the same
error answers and request counts; everything else goes through Starlette.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from databus.buffer import EventBuffer
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
from databus.relay.metrics import RelayMetrics
from databus.relay.openapi import relay_openapi
from databus.serving import (
    EXCEPTION_HANDLERS,
    bool_param,
    error_response,
    float_param,
    int_param,
    internal_error_response,
    json_body,
    principal,
    readable_ids,
    source_ids_param,
)
from databus.sources.base import Source


class ServedRelay(Protocol):
    """What the API reads from the relay it serves (:class:`databus.relay.relay.Relay`)."""

    config: RelayConfig
    metrics: RelayMetrics
    buffer: EventBuffer
    source: Source
    stopping: bool  # set at shutdown: long polls return at once

    def changed_event(self) -> asyncio.Event:
        """An event set at the next append (take it before reading the buffer)."""
        ...

    def stats(self) -> dict[str, Any]: ...

    def refresh_gauges(self) -> None: ...

    def fetcher_status(self) -> dict[str, Any]: ...

    @property
    def cluster(self) -> ClusterMember | None: ...

    def wake(self) -> None:
        """Wake long polls (e.g. more windows became servable)."""
        ...


class _CountRequests:
    """Counts answers per endpoint and status (``databus_relay_requests``); requests
    no route matched are not counted (their paths are unbounded)."""

    def __init__(self, app: ASGIApp, metrics: RelayMetrics,
                 names: dict[Callable[..., Any], str]) -> None:
        self.app = app
        self.metrics = metrics
        self.names = names

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500  # unless an answer starts: the error handler answers 500

        async def counting(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, counting)
        finally:
            name = self.names.get(scope.get("endpoint"))  # type: ignore[arg-type]
            if name is not None:
                self.metrics.requests.labels(endpoint=name, status=str(status)).inc()


class _Inflight:
    """Answer bytes held for clients right now (event-loop only: no lock)."""

    FLOOR = 64 * 1024

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def size_for(self, wanted: int) -> int:
        """What a new answer may take: ``wanted`` while the budget allows, less (but at
        least FLOOR, so every consumer still progresses) when it does not."""
        return max(self.FLOOR, min(wanted, self.limit - self.held))


class _HeldResponse:
    """A 200 answer whose bytes count against the in-flight budget until it was sent
    (or its client was cut or went away). The ASGI messages of a Starlette
    ``Response`` (``content-length``, ``content-type``, then the given headers),
    built without its header normalization: the names here are fixed and lowercase."""

    __slots__ = ("body", "held", "inflight", "raw_headers")

    def __init__(self, inflight: _Inflight, body: bytes, headers: list[tuple[bytes, bytes]],
                 media_type: bytes) -> None:
        self.body, self.inflight, self.held = body, inflight, len(body)
        self.raw_headers = [(b"content-length", b"%d" % len(body)),
                            (b"content-type", media_type), *headers]
        inflight.held += self.held

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": self.raw_headers})
            await send({"type": "http.response.body", "body": self.body})
        finally:
            self.inflight.held -= self.held
            self.held = 0


class _StreamFirst:
    """Answers ``GET /stream`` ahead of Starlette's middleware stack and router, and
    hands every other request (and ``HEAD /stream``) to ``app``.

    The contract is the route's: the endpoint's errors are answered by the handlers
    of :mod:`databus.serving` (a :class:`DatabusError` its status; anything else 500
    ``InternalError``, then raised on to the server, as Starlette's
    ``ServerErrorMiddleware`` does), and every answer is counted in
    ``databus_relay_requests`` (endpoint ``stream``). Why: /stream is the hot path
    of every consumer, and the five ASGI layers it skips cost each request more
    than selecting its events does once the buffer walks in C (bench/RESULTS.md,
    "Relay fan-out")."""

    def __init__(self, app: ASGIApp, endpoint: Callable[[Request], Awaitable[ASGIApp]],
                 metrics: RelayMetrics) -> None:
        self.app, self.endpoint, self.metrics = app, endpoint, metrics
        self._counters: dict[int, Any] = {}

    def _counter(self, status: int) -> Any:
        counter = self._counters.get(status)
        if counter is None:  # a labelled child per status, looked up once
            counter = self.metrics.requests.labels(endpoint="stream", status=str(status))
            self._counters[status] = counter
        return counter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/stream" or scope["method"] != "GET":
            await self.app(scope, receive, send)
            return
        status = 500  # unless an answer starts
        started = False

        async def counting(message: Message) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                status, started = message["status"], True
            await send(message)

        try:
            try:
                response = await self.endpoint(Request(scope, receive))
            except DatabusError as exc:
                response = error_response(exc)
            await response(scope, receive, counting)
        except Exception as exc:
            if not started:
                await internal_error_response(exc)(scope, receive, counting)
            raise
        finally:
            self._counter(status).inc()


def build_app(relay: ServedRelay) -> ASGIApp:
    """The ASGI app serving ``relay``: ``GET /stream`` first (:class:`_StreamFirst`),
    the other endpoints through Starlette."""
    metrics = relay.metrics
    inflight = _Inflight(relay.config.stream.max_inflight_bytes)

    def served() -> list[tuple[int, str]]:
        return [(s.id, s.name) for s in relay.source.sources()]

    def sources(request: Request) -> Response:
        who = principal(request)
        return JSONResponse([{"id": i, "name": n} for i, n in served() if who.may_read(n)])

    def register(request: Request) -> Response:
        reg = relay.source.registry()
        ids = source_ids_param(request, set(reg.source_ids()))
        names = [(i, reg.latest(i).name) for i in reg.source_ids()]
        ids = readable_ids(request, names, ids)
        body = reg.to_json(sorted(ids) if ids is not None else None)
        return Response(body, media_type="application/json")

    async def stream(request: Request) -> ASGIApp:
        cfg = relay.config.stream
        q = request.query_params
        listed = served()
        known = {i for i, _ in listed}
        src_ids = readable_ids(request, listed, source_ids_param(request, known))
        size = inflight.size_for(int_param(request, "size", cfg.default_size, 1, cfg.max_size))
        timeout = float_param(request, "timeout", cfg.default_timeout, 0.0, cfg.max_timeout)
        output = q.get("output", "binary")
        if output not in ("binary", "json"):
            raise InvalidRequestError(f"output must be binary or json, got {output[:50]!r}")
        transactions = bool_param(request, "transactions")
        filt = ServerFilter.parse(q["filters"]) if q.get("filters") else None
        if filt is not None:
            unknown = set(filt.by_source) - known
            if unknown:
                raise UnknownSourceError(f"filter names unknown source ids {sorted(unknown)}")
            readable_ids(request, listed, frozenset(filt.by_source))
        raw_cp = q.get("checkPoint")
        cp = Checkpoint.from_json(raw_cp) if raw_cp else Checkpoint.flexible()
        if cp.consumption_mode != ConsumptionMode.ONLINE_CONSUMPTION:
            raise InvalidCheckpointError(
                f"a relay serves ONLINE_CONSUMPTION checkpoints, got {cp.consumption_mode.value}"
            )
        if cp.is_flexible and bool_param(request, "streamFromLatestScn"):
            cp = Checkpoint.after(relay.buffer.max_scn)
        # a cluster serves consumers only the windows every live member holds; its
        # members (chain sources) read past that, and their reads say what they hold
        member = request.headers.get("x-databus-member")
        if member:
            # a member's read moves the cluster's high-water mark: members read with an
            # admin token, never with a consumer's
            principal(request).check_admin("a cluster member's read (X-Databus-Member)")
        member_hw = (int_param_value(request.headers.get("x-databus-member-hw"))
                     if member else None)
        upto: int | None = None
        if relay.cluster is not None:
            if member:
                held = -1 if cp.is_flexible else (cp.prev_scn if cp.in_window else cp.window_scn)
                if relay.cluster.follower_at(member, held):
                    relay.wake()  # consumers waiting for replicated windows
            else:
                upto = relay.cluster.serve_limit()
        # an unselected read is one copy of buffer bytes: cheaper than a thread hop
        # (which costs single consumers ~15% of their rate); a selection walks every event
        selecting = src_ids is not None or filt is not None
        deadline = time.monotonic() + timeout
        while True:
            changed = relay.changed_event()
            if relay.cluster is not None and not member:
                upto = relay.cluster.serve_limit()
            if selecting:
                result = await run_in_threadpool(relay.buffer.read, cp, size,
                                                 sources=src_ids, filter=filt, upto_scn=upto)
            else:
                result = relay.buffer.read(cp, size, upto_scn=upto)
            remaining = deadline - time.monotonic()
            if result.events or remaining <= 0 or relay.stopping:
                break
            if member_hw is not None and relay.cluster is not None \
                    and relay.cluster.serve_limit() != member_hw:
                break  # a member learns a new high-water mark at once
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), remaining)
        metrics.bytes_out.inc(len(result.data))
        metrics.events_out.inc(result.events)
        # the position after this response, so a client need not scan the body
        headers = [
            (b"x-databus-max-scn", b"%d" % relay.buffer.max_scn),
            (b"x-databus-min-scn", b"%d" % relay.buffer.min_scn),
            (b"x-databus-last-window-scn", b"%d" % result.last_scn),
            (b"x-databus-partial-scn", b"%d" % result.partial_scn),
            (b"x-databus-partial-count", b"%d" % result.partial_count),
        ]
        if member and relay.cluster is not None:
            headers.append((b"x-databus-cluster-hw", b"%d" % relay.cluster.serve_limit()))
        if output == "json":
            body = await run_in_threadpool(_to_json_lines, relay.source.registry(), result.data,
                                           transactions=transactions)
            return _HeldResponse(inflight, body, headers, b"application/x-ndjson")
        return _HeldResponse(inflight, result.data, headers, b"application/octet-stream")

    def container_stats(request: Request) -> Response:
        stats = relay.stats()
        who = principal(request)
        stats["sources"] = [s for s in stats["sources"] if who.may_read(s["name"])]
        path = request.path_params.get("path", "")
        node: Any = stats
        for part in [p for p in path.split("/") if p]:
            if not isinstance(node, dict) or part not in node:
                raise InvalidRequestError(f"no stats at /containerStats/{path}")
            node = node[part]
        return JSONResponse(node)

    def metrics_endpoint(_: Request) -> Response:
        relay.refresh_gauges()
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    def admin(_: Request) -> Response:
        status = relay.fetcher_status()
        healthy = status["state"] in ("running", "starting", "retrying")
        stats = relay.stats()
        return JSONResponse(
            {"status": "ok" if healthy else "degraded", "name": relay.config.name,
             "fetcher": status, "buffer": relay.buffer.stats(),
             "continuity": stats["continuity"],
             "source": relay.source.stats(),  # snapshot counters (errors, aborts) included
             **({"cluster": stats["cluster"]} if "cluster" in stats else {})},
            status_code=200 if healthy else 503,
        )

    async def signal(request: Request) -> Response:
        """POST {"type": "execute-snapshot", "data": {...}}: a signal to the source."""
        body = await json_body(request)
        if not isinstance(body, dict) or not isinstance(body.get("type"), str):
            raise InvalidRequestError('signal body needs {"type": ..., "data": {...}}')
        data = body.get("data")
        if data is not None and not isinstance(data, dict):
            raise InvalidRequestError("signal data must be a JSON object")
        who = principal(request)
        if not who.everything and data is not None:
            # a restricted admin token signals only about tables it may read
            patterns = data.get("data-collections") or []
            if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
                raise InvalidRequestError("data-collections must be a list of regexes")
            for p in patterns:
                try:
                    rx = re.compile(p)
                except re.error as exc:
                    raise InvalidRequestError(f"bad data-collection regex {p!r}: {exc}") from exc
                who.check_read(n for _, n in served() if rx.fullmatch(n))
        sid = await run_in_threadpool(relay.source.signal, body["type"], data)
        return JSONResponse({"id": sid, "type": body["type"]}, status_code=202)

    document = relay_openapi(relay.config)

    def openapi(_: Request) -> Response:
        return JSONResponse(document)

    routes = [
        Route("/openapi.json", openapi),
        Route("/sources", sources),
        Route("/register", register),
        Route("/stream", stream),
        Route("/containerStats", container_stats),
        Route("/containerStats/{path:path}", container_stats),
        Route("/metrics", metrics_endpoint),
        Route("/admin", admin),
        Route("/signal", signal, methods=["POST"]),
    ]
    names: dict[Callable[..., Any], str] = {
        sources: "sources", register: "register", stream: "stream",
        container_stats: "containerStats", metrics_endpoint: "metrics", admin: "admin",
        signal: "signal"}
    app = Starlette(routes=routes, exception_handlers=EXCEPTION_HANDLERS,
                    middleware=[Middleware(_CountRequests, metrics=metrics, names=names)])
    return _StreamFirst(app, stream, metrics)


def int_param_value(raw: str | None) -> int | None:
    """An integer header, or None when absent or not an integer."""
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def _to_json_lines(reg: SchemaRegistry, data: bytes, *, transactions: bool = False) -> bytes:
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
