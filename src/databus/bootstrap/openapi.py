"""The bootstrap server's HTTP API as an OpenAPI document (``/openapi.json``)."""

from __future__ import annotations

from typing import Any

from databus.serving.openapi import openapi_document, operation, query

_IDS = {"type": "string", "pattern": r"^\d+(,\d+)*$"}


def bootstrap_openapi(max_batch: int) -> dict[str, Any]:
    """The document of a bootstrap server taking at most ``max_batch`` per answer."""
    sources = query("sources", _IDS, "comma-separated source ids (default: every source the"
                    " token may read)")
    checkpoint = query("checkPoint", {"type": "string"}, "a checkpoint (JSON)")
    binary = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
    paths = {
        "/sources": {"get": operation("The relay's tables the token may read", errors=(409,))},
        "/register": {"get": operation("Schema versions", params=[sources],
                                       errors=(400, 404, 409))},
        "/startSCN": {"get": operation("Where a bootstrap starts", params=[
            sources, checkpoint,
            query("idSpan", {"type": "boolean"}, "also answer snapshotIdSpan: the lowest and"
                  " highest row id of a snapshot bootstrap")], errors=(400, 404, 409))},
        "/targetSCN": {"get": operation("The newest SCN in the log", errors=(409,))},
        "/bootstrap": {"get": operation("The next snapshot or catch-up batch", ok=binary,
                                        errors=(400, 404, 409, 410), params=[
            sources, checkpoint,
            query("batchSize", {"type": "integer", "minimum": 1, "maximum": max_batch},
                  "rows or events per answer"),
            query("filters", {"type": "string"}, "server-side MOD/RANGE filter (JSON)"),
            query("snapshotEnd", {"type": "integer", "minimum": -1,
                                  "maximum": 9223372036854775807},
                  "snapshot phase: only rows with id <= this (not with filters)")])},
        "/admin": {"get": operation("Store status", errors=(), admin=True)},
        "/metrics": {"get": {**operation("Prometheus metrics (docs/operations.md); needs no"
                                         " token", errors=(),
                                         ok={"text/plain": {"schema": {"type": "string"}}}),
                             "security": []}},
    }
    return openapi_document("Databus bootstrap server", "Snapshots and catch-up for new or"
                            " far-behind consumers (docs/bootstrap.md).", paths)
