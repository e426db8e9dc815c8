"""The relay's HTTP API (DESIGN.md section 4) as a Starlette app.

Every request is validated before it touches the buffer; a client's mistake is
a 4xx with ``{"error": <code>, "message": ...}``, a checkpoint older than the
buffer is 410 ``ScnNotFound``. Unexpected errors are 500 with the same body and
never stop the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

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

if TYPE_CHECKING:
    from databus.relay.relay import Relay

log = logging.getLogger("databus.relay")
Handler = Callable[[Request], Awaitable[Response]]


def error_response(exc: DatabusError) -> JSONResponse:
    return JSONResponse({"error": exc.code, "message": str(exc)}, status_code=exc.http_status)


def parse_source_ids(text: str | None, known: set[int]) -> frozenset[int] | None:
    """``"1,2"`` -> ids; None when absent (= every source)."""
    if text is None or text.strip() == "":
        return None
    ids: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        try:
            sid = int(part)
        except ValueError:
            raise InvalidRequestError(f"sources must be comma-separated ids, got {part!r}") from None
        if sid not in known:
            raise UnknownSourceError(f"unknown source id {sid}; known: {sorted(known)}")
        ids.add(sid)
    if len(ids) > 10_000:
        raise InvalidRequestError("too many sources")
    return frozenset(ids)


def int_param(request: Request, name: str, default: int, lo: int, hi: int) -> int:
    """An integer query parameter in [lo, hi]; InvalidRequestError otherwise."""
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


def _float_param(request: Request, name: str, default: float, lo: float, hi: float) -> float:
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


def _bool_param(request: Request, name: str) -> bool:
    raw = request.query_params.get(name, "false").lower()
    if raw not in ("true", "false", "1", "0"):
        raise InvalidRequestError(f"{name} must be true or false, got {raw[:50]!r}")
    return raw in ("true", "1")


def build_app(relay: Relay) -> Starlette:
    """The ASGI app serving ``relay``."""
    metrics = relay.metrics

    def guarded(endpoint: str, fn: Handler) -> Handler:
        async def handler(request: Request) -> Response:
            try:
                response = await fn(request)
            except DatabusError as exc:
                response = error_response(exc)
            except Exception as exc:  # never let one request take the relay down
                log.exception("unexpected error serving %s", request.url.path)
                response = JSONResponse(
                    {"error": "InternalError", "message": f"{type(exc).__name__}: {exc}"},
                    status_code=500,
                )
            metrics.requests.labels(endpoint=endpoint, status=str(response.status_code)).inc()
            return response

        return handler

    async def sources(_: Request) -> Response:
        return JSONResponse([{"id": s.id, "name": s.name} for s in relay.source.sources()])

    async def register(request: Request) -> Response:
        reg = relay.source.registry()
        known = set(reg.source_ids())
        ids = parse_source_ids(request.query_params.get("sources"), known)
        body = reg.to_json(sorted(ids) if ids is not None else None)
        return Response(body, media_type="application/json")

    async def stream(request: Request) -> Response:
        cfg = relay.config.stream
        q = request.query_params
        known = {s.id for s in relay.source.sources()}
        src_ids = parse_source_ids(q.get("sources"), known)
        size = int_param(request, "size", cfg.default_size, 1, cfg.max_size)
        timeout = _float_param(request, "timeout", cfg.default_timeout, 0.0, cfg.max_timeout)
        output = q.get("output", "binary")
        if output not in ("binary", "json"):
            raise InvalidRequestError(f"output must be binary or json, got {output[:50]!r}")
        filt = ServerFilter.parse(q["filters"]) if q.get("filters") else None
        if filt is not None:
            unknown = set(filt.by_source) - known
            if unknown:
                raise UnknownSourceError(f"filter names unknown source ids {sorted(unknown)}")
        raw_cp = q.get("checkPoint")
        cp = Checkpoint.from_json(raw_cp) if raw_cp else Checkpoint.flexible()
        if cp.consumption_mode != ConsumptionMode.ONLINE_CONSUMPTION:
            raise InvalidCheckpointError(
                f"a relay serves ONLINE_CONSUMPTION checkpoints, got {cp.consumption_mode.value}"
            )
        if cp.is_flexible and _bool_param(request, "streamFromLatestScn"):
            cp = Checkpoint.after(relay.buffer.max_scn)
        deadline = time.monotonic() + timeout
        while True:
            changed = relay.changed_event()
            result = relay.buffer.read(cp, size, sources=src_ids, filter=filt)
            remaining = deadline - time.monotonic()
            if result.events or remaining <= 0 or relay.stopping:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), remaining)
        metrics.bytes_out.inc(len(result.data))
        metrics.events_out.inc(result.events)
        # the position after this response, so a client need not scan the body
        headers = {
            "X-Databus-Max-Scn": str(relay.buffer.max_scn),
            "X-Databus-Min-Scn": str(relay.buffer.min_scn),
            "X-Databus-Last-Window-Scn": str(result.last_scn),
            "X-Databus-Partial-Scn": str(result.partial_scn),
            "X-Databus-Partial-Count": str(result.partial_count),
        }
        if output == "json":
            txn = _flag(q.get("transactions"), "transactions")
            return Response(_to_json_lines(relay, result.data, transactions=txn), headers=headers,
                            media_type="application/x-ndjson")
        return Response(result.data, headers=headers, media_type="application/octet-stream")

    async def container_stats(request: Request) -> Response:
        stats = relay.stats()
        path = request.path_params.get("path", "")
        node: Any = stats
        for part in [p for p in path.split("/") if p]:
            if not isinstance(node, dict) or part not in node:
                raise InvalidRequestError(f"no stats at /containerStats/{path}")
            node = node[part]
        return JSONResponse(node)

    async def metrics_endpoint(_: Request) -> Response:
        relay.refresh_gauges()
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    async def admin(_: Request) -> Response:
        status = relay.fetcher_status()
        healthy = status["state"] in ("running", "starting", "retrying")
        return JSONResponse(
            {"status": "ok" if healthy else "degraded", "name": relay.config.name,
             "fetcher": status, "buffer": relay.buffer.stats(),
             "continuity": relay.stats()["continuity"]},
            status_code=200 if healthy else 503,
        )

    async def signal(request: Request) -> Response:
        """POST {"type": "execute-snapshot", "data": {...}}: a signal to the source."""
        try:
            body = json.loads(await request.body() or b"{}")
        except ValueError as exc:
            raise InvalidRequestError(f"signal body is not JSON: {exc}") from exc
        if not isinstance(body, dict) or not isinstance(body.get("type"), str):
            raise InvalidRequestError('signal body needs {"type": ..., "data": {...}}')
        data = body.get("data")
        if data is not None and not isinstance(data, dict):
            raise InvalidRequestError("signal data must be a JSON object")
        sid = await asyncio.to_thread(relay.source.signal, body["type"], data)
        return JSONResponse({"id": sid, "type": body["type"]}, status_code=202)

    async def not_found(request: Request, _exc: Exception) -> Response:
        return JSONResponse(
            {"error": "NotFound", "message": f"no endpoint {request.url.path}"}, status_code=404
        )

    async def method_not_allowed(request: Request, _exc: Exception) -> Response:
        return JSONResponse(
            {"error": "MethodNotAllowed", "message": f"{request.method} not allowed"},
            status_code=405,
        )

    routes = [
        Route("/sources", guarded("sources", sources)),
        Route("/register", guarded("register", register)),
        Route("/stream", guarded("stream", stream)),
        Route("/containerStats", guarded("containerStats", container_stats)),
        Route("/containerStats/{path:path}", guarded("containerStats", container_stats)),
        Route("/metrics", guarded("metrics", metrics_endpoint)),
        Route("/admin", guarded("admin", admin)),
        Route("/signal", guarded("signal", signal), methods=["POST"]),
    ]
    return Starlette(
        routes=routes, exception_handlers={404: not_found, 405: method_not_allowed}
    )


def _flag(value: str | None, name: str) -> bool:
    if value is None or value.lower() in ("false", "0", "no"):
        return False
    if value.lower() in ("true", "1", "yes"):
        return True
    raise InvalidRequestError(f"{name} must be true or false, got {value[:20]!r}")


def _to_json_lines(relay: Relay, data: bytes, *, transactions: bool = False) -> bytes:
    """Binary events -> envelope lines; each window ends with an ``eop`` line.

    With ``transactions``, a window's events are framed by transaction lines
    (``status`` BEGIN, and END with the event count per table), as in
    Debezium's transaction metadata.
    """
    reg = relay.source.registry()
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
