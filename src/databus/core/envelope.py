"""The JSON change envelope (Debezium-compatible), one object per data event.

::

    {"before": {...} | null, "after": {...} | null,
     "source": {"db", "table", "scn", "file", "pos", "gtid", "server_id", "ts_ms",
                "snapshot"},
     "op": "c" | "u" | "d" | "r" | "t", "ts_ms": <ms when encoded>,
     "transaction": {"id", "total_order", "data_collection_order"}}

Value mapping (documented in docs/json.md): integers and floats as JSON numbers,
decimals as strings (exact), date/time/timestamps as ISO-8601 strings (UTC for
timestamps), bytes as base64, UUIDs as strings. Column names are the table's
own names (not the Avro-sanitised field names).
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import time
import uuid
from typing import Any

from databus.core.event import Event, Op
from databus.core.schema import SchemaRegistry, TableSchema


def json_value(value: Any) -> Any:
    """One column value as JSON-compatible data."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, decimal.Decimal):
        return format(value, "f")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.UTC)
            return value.replace(tzinfo=None).isoformat() + "Z"
        return value.isoformat()
    if isinstance(value, (dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return _iso_duration(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dict):
        return {k: json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    return str(value)


def _iso_duration(value: dt.timedelta) -> str:
    micros = value // dt.timedelta(microseconds=1)
    sign = "-" if micros < 0 else ""
    micros = abs(micros)
    secs, frac = divmod(micros, 1_000_000)
    return f"{sign}PT{secs}.{frac:06d}S" if frac else f"{sign}PT{secs}S"


def row_to_json(schema: TableSchema, row: dict[str, Any] | None) -> dict[str, Any] | None:
    """A decoded Avro row with column names restored and values made JSON-safe."""
    if row is None:
        return None
    out: dict[str, Any] = {}
    for f in schema.avro["fields"]:
        out[f.get("column", f["name"])] = json_value(row.get(f["name"]))
    return out


def decode_images(
    event: Event, registry: SchemaRegistry
) -> tuple[TableSchema, dict[str, Any] | None, dict[str, Any] | None, dict[str, Any]]:
    """(schema, before, after, metadata) of a data event, rows as Avro field dicts.

    The payload is the after image, except for deletes where it is the before
    image. The metadata part may carry the before image of an update.
    """
    schema = registry.get(event.schema_id)
    meta: dict[str, Any] = {}
    if event.metadata is not None:
        meta = registry.metadata.decode(event.metadata)
    row = schema.decode(event.payload) if event.payload else None
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    if event.op == Op.DELETE:
        before = row
    else:
        after = row
        if meta.get("before") is not None:
            before = schema.decode(meta["before"])
    return schema, before, after, meta


def envelope(
    event: Event,
    registry: SchemaRegistry,
    *,
    total_order: int = 0,
    data_collection_order: int = 0,
) -> dict[str, Any]:
    """The envelope dict of a data event (orders are 1-based within the window)."""
    schema, before, after, meta = decode_images(event, registry)
    db, _, table = schema.name.partition(".")
    ts_ms = event.timestamp_ns // 1_000_000
    txid = meta.get("txid") or str(event.scn)
    return {
        "before": row_to_json(schema, before),
        "after": row_to_json(schema, after),
        "source": {
            "db": db,
            "table": table,
            "scn": event.scn,
            "file": meta.get("file"),
            "pos": meta.get("pos"),
            "gtid": meta.get("gtid"),
            "server_id": meta.get("server_id"),
            "row": meta.get("row"),
            "ts_ms": ts_ms,
            "snapshot": event.is_snapshot,
        },
        "op": event.op.letter,
        "ts_ms": time.time_ns() // 1_000_000,
        "transaction": {
            "id": txid,
            "total_order": total_order,
            "data_collection_order": data_collection_order,
        },
    }


def dumps(obj: Any) -> str:
    """Compact JSON for one envelope line."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
