"""The relay's HTTP API (docs/relay.md) as a Starlette app.

Every request is validated before it touches the buffer; a client's mistake is
a 4xx with ``{"error": <code>, "message": ...}``, a checkpoint older than the
buffer is 410 ``ScnNotFound``. Unexpected errors are 500 with the same body and
never stop the server (the handlers of :mod:`databus.serving`, registered once).

Threading: ``/stream`` (:mod:`databus.relay.stream`) waits for new windows on the
event loop (a long poll holds no thread). The other endpoints are plain
functions, which Starlette runs in its thread pool.

Routing: ``GET /stream``, the request every consumer repeats, is answered on the
connection itself when it is a plain request (a direct route of
:mod:`databus.serving.direct`), else ahead of Starlette's middleware and router
(:class:`_StreamFirst`), with the same answers and request counts either way;
everything else goes through Starlette.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from databus.core.errors import (
    DatabusError,
    InvalidRequestError,
    UnknownSourceError,
)
from databus.relay.metrics import RelayMetrics
from databus.relay.openapi import relay_openapi
from databus.relay.stream import Inflight, ServedRelay, StreamEndpoint
from databus.serving.direct import DirectHandler
from databus.serving.errors import EXCEPTION_HANDLERS, error_response, internal_error_response
from databus.serving.guard import principal, readable_ids
from databus.serving.health import health_routes
from databus.serving.params import MAX_SOURCE_IDS, source_ids_param
from databus.serving.requests import json_body
from databus.serving.ui import ui_route


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


class _StreamFirst:
    """Answers ``GET /stream`` ahead of Starlette's middleware stack and router, and
    hands every other request (and ``HEAD /stream``) to ``app``; its
    ``direct_get`` routes plain ``GET /stream`` requests past ASGI altogether
    (:class:`databus.serving.direct.DirectRoutes`).

    The contract is the route's: the endpoint's errors are answered by the handlers
    of :mod:`databus.serving` (a :class:`DatabusError` its status; anything else 500
    ``InternalError``, then raised on to the server, as Starlette's
    ``ServerErrorMiddleware`` does), and every answer is counted in
    ``databus_relay_requests`` (endpoint ``stream``). Why: /stream is the hot path
    of every consumer, and the five ASGI layers it skips cost each request more
    than selecting its events does once the buffer walks in C (bench/RESULTS.md,
    "Relay fan-out")."""

    def __init__(self, app: ASGIApp, stream: StreamEndpoint) -> None:
        self.app, self.stream = app, stream
        self.direct_get: dict[bytes, DirectHandler] = {b"/stream": stream.direct}

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
            response: ASGIApp
            try:
                response = await self.stream.endpoint(Request(scope, receive))
            except DatabusError as exc:
                response = error_response(exc)
            await response(scope, receive, counting)
        except Exception as exc:
            if not started:
                await internal_error_response(exc)(scope, receive, counting)
            raise
        finally:
            self.stream.count(status)


def build_app(relay: ServedRelay) -> ASGIApp:
    """The ASGI app serving ``relay``: ``GET /stream`` first (:class:`_StreamFirst`,
    and its direct route), the other endpoints through Starlette."""
    metrics = relay.metrics
    inflight = Inflight(relay.config.stream.max_inflight_bytes)

    def served() -> list[tuple[int, str]]:
        return [(s.id, s.name) for s in relay.source.sources()]

    def sources(request: Request) -> Response:
        """Every served source the token may read; with ``names=a,b``, those sources
        only: 403 naming the first the token may not read (served or not: a token
        learns nothing of tables outside its grant), else 404 naming the first this
        relay does not serve."""
        who = principal(request)
        origin = relay.origin()  # the captured database, the same on every relay of it
        headers = {"Databus-Origin": origin} if origin else None
        names = request.query_params.get("names")
        if names is None:
            return JSONResponse([{"id": i, "name": n} for i, n in served()
                                 if who.may_read(n)], headers=headers)
        wanted = [n.strip() for n in names.split(",") if n.strip()][:MAX_SOURCE_IDS]
        who.check_read(wanted)
        ids = {n: i for i, n in served()}
        missing = [n for n in wanted if n not in ids]
        if missing:
            raise UnknownSourceError(f"this relay serves no source {missing[0]!r}")
        return JSONResponse([{"id": ids[n], "name": n} for n in wanted], headers=headers)

    def register(request: Request) -> Response:
        reg = relay.source.registry()
        ids = source_ids_param(request, set(reg.source_ids()))
        names = [(i, reg.latest(i).name) for i in reg.source_ids()]
        ids = readable_ids(request, names, ids)
        body = reg.to_json(sorted(ids) if ids is not None else None)
        return Response(body, media_type="application/json")

    endpoint = StreamEndpoint(relay, inflight)

    async def stream(request: Request) -> ASGIApp:
        return await endpoint.endpoint(request)

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
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    def consumers(_: Request) -> Response:
        """The consumers this relay served lately (docs/operations.md)."""
        o = relay.observe()
        buf = o.buffer
        return JSONResponse({
            "relay": relay.stats()["name"], "time": round(time.time(), 3),
            "capture": o.capture, "lag_seconds": round(o.lag_seconds, 3),
            "captured_until": round(o.captured_until_ns / 1e9, 3),
            "buffer": {"min_scn": buf["min_scn"], "max_scn": buf["max_scn"],
                       "windows": buf["windows"], "span_seconds": round(o.span_seconds, 3),
                       "evicting": buf["evicted_windows"] > 0},
            "consumers": o.consumers})

    def admin(_: Request) -> Response:
        status = relay.fetcher_status()
        healthy = status["state"] in ("running", "starting", "retrying")
        if relay.cluster is not None and relay.cluster.coordinator_problem() is not None:
            healthy = False  # ZooKeeper unreachable past the session: role unconfirmed
        stats = relay.stats()
        return JSONResponse(
            {"status": "ok" if healthy else "degraded", "name": stats["name"],
             "identity": stats["identity"], "origin": stats["origin"],
             "capture": relay.capture_status(),
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

    health = health_routes("relay", relay.readiness, lambda: relay.stats()["name"])
    routes = [
        *health,
        Route("/openapi.json", openapi),
        Route("/sources", sources),
        Route("/register", register),
        Route("/stream", stream),
        Route("/containerStats", container_stats),
        Route("/containerStats/{path:path}", container_stats),
        Route("/metrics", metrics_endpoint),
        Route("/admin", admin),
        Route("/consumers", consumers),
        Route("/signal", signal, methods=["POST"]),
        ui_route(),
    ]
    names: dict[Callable[..., Any], str] = {
        sources: "sources", register: "register", stream: "stream",
        container_stats: "containerStats", metrics_endpoint: "metrics", admin: "admin",
        consumers: "consumers", signal: "signal",
        **{r.endpoint: "health" for r in health}}
    app = Starlette(routes=routes, exception_handlers=EXCEPTION_HANDLERS,
                    middleware=[Middleware(_CountRequests, metrics=metrics, names=names)])
    return _StreamFirst(app, endpoint)


_Inflight = Inflight  # its former name
