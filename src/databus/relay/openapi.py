"""The relay's HTTP API as an OpenAPI document (served at ``/openapi.json``).

Limits come from the relay's config, so the document states what this relay
accepts (a fuzzer generating from it explores the real bounds).
"""

from __future__ import annotations

from typing import Any

from databus.relay.config import RelayConfig
from databus.serving.openapi import openapi_document, operation, query

_IDS = {"type": "string", "pattern": r"^\d+(,\d+)*$"}


def relay_openapi(config: RelayConfig) -> dict[str, Any]:
    """The document of a relay with ``config``."""
    st = config.stream
    sources = query("sources", _IDS, "comma-separated source ids (default: every source the"
                    " token may read); a source the token may not read is 403")
    binary = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
              "application/x-ndjson": {"schema": {"type": "string"}}}
    stream_params = [
        sources,
        query("checkPoint", {"type": "string"}, "the consumer's checkpoint (JSON); absent:"
              " the oldest window held"),
        query("size", {"type": "integer", "minimum": 1, "maximum": st.max_size},
              "bytes per answer"),
        query("timeout", {"type": "number", "minimum": 0, "maximum": st.max_timeout},
              "long-poll seconds"),
        query("output", {"type": "string", "enum": ["binary", "json"]}, "event encoding"),
        query("transactions", {"type": "boolean"}, "json: BEGIN/END transaction lines"),
        query("filters", {"type": "string"}, "server-side MOD/RANGE filter (JSON)"),
        query("streamFromLatestScn", {"type": "boolean"}, "start after the newest window"),
        query("uptoScn", {"type": "integer", "minimum": -1}, "no window past this SCN"),
        query("newest", {"type": "boolean"}, "each key's last event of the answer only, the"
              " windows' EOPs and truncates kept (needs uptoScn)"),
    ]
    signal_body = {"type": "object", "required": ["type"],
                   "properties": {"type": {"type": "string"},
                                  "data": {"type": "object"}}}
    paths = {
        "/sources": {"get": operation(
            "Captured tables the token may read; the header Databus-Origin names the"
            " captured database", errors=(403, 404), params=[query(
                "names", {"type": "string"}, "comma-separated db.table names: those only;"
                " 403 for one the token may not read, 404 for one not served")])},
        "/register": {"get": operation("Schema versions", params=[sources], errors=(400, 404))},
        "/stream": {"get": operation("Whole windows after a checkpoint", params=stream_params,
                                     ok=binary, errors=(400, 404, 409, 410, 503))},
        "/containerStats": {"get": operation("Counters and gauges as JSON", errors=(400,))},
        "/containerStats/{path}": {"get": operation(
            "One branch of /containerStats", errors=(400,),
            params=[{"name": "path", "in": "path", "required": True,
                     "schema": {"type": "string"}}])},
        "/metrics": {"get": {**operation("Prometheus metrics; needs no token", errors=(),
                                         ok={"text/plain": {"schema": {"type": "string"}}}),
                             "security": []}},
        "/admin": {"get": operation("Capture and buffer status", errors=(503,), admin=True)},
        "/consumers": {"get": operation(
            "The consumers this relay served lately: position, seconds and windows behind,"
            " state, about to fall off (docs/operations.md)", errors=())},
        "/signal": {"post": operation("A signal to the source (incremental snapshots)",
                                      ok_status="202", errors=(400, 413, 415), admin=True,
                                      body=signal_body)},
    }
    return openapi_document("Databus relay", "Captured changes as whole windows"
                            " (docs/relay.md).", paths)
