"""A bootstrap store of two sources for the snapshot readers' tests: ``db.flat``
(long, string with non-ASCII, double, bytes; nulls) and ``db.logical`` (decimal,
date), written as the applier and the initial load write them."""

from __future__ import annotations

import datetime as dt
import decimal
import json
from typing import Any

from databus.bootstrap.store import BootstrapStore, key_bytes
from databus.core import event as ev
from databus.core.schema import ColumnSpec, SchemaRegistry, TableSchema, table_schema

FLAT = TableSchema(1, "db.flat", 1, table_schema("db", "flat", [
    ColumnSpec("id", "long", nullable=False), ColumnSpec("name", "string"),
    ColumnSpec("amount", "double"), ColumnSpec("blob", "bytes")]), ("id",))
FLAT_V2 = TableSchema(1, "db.flat", 2, table_schema("db", "flat", [  # another schema id
    ColumnSpec("id", "long", nullable=False), ColumnSpec("name", "string", sql_type="TEXT"),
    ColumnSpec("amount", "double"), ColumnSpec("blob", "bytes")]), ("id",))
# decimal and date: the compiled decoder declines them, the Python path decodes
LOGICAL = TableSchema(2, "db.logical", 1, table_schema("db", "logical", [
    ColumnSpec("id", "long", nullable=False),
    ColumnSpec("price", {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}),
    ColumnSpec("day", {"type": "int", "logicalType": "date"})]), ("id",))


def flat_row(i: int) -> dict[str, Any]:
    return {"id": i, "name": None if i % 7 == 0 else f"name-{i}-é",
            "amount": None if i % 5 == 0 else i * 1.5, "blob": bytes([i % 256]) * (i % 4)}


def logical_row(i: int) -> dict[str, Any]:
    return {"id": i, "price": decimal.Decimal(i) / 100,
            "day": dt.date(2020, 1, 1) + dt.timedelta(days=i)}


def event(ts: TableSchema, row: dict[str, Any], scn: int) -> bytes:
    return ev.encode(scn=scn, src_id=ts.src_id, key=row["id"], payload=ts.encode(row),
                     schema_id=ts.id, op=ev.Op.READ, timestamp_ns=scn * 1_000_000_007,
                     extra_attributes=ev.ATTR_SNAPSHOT)


def fill(url: str) -> None:
    """Two sources: 2,500 flat rows (scn 1, then every 10th rewritten at scn 50..) and
    700 logical rows; applied SCN 60."""
    with BootstrapStore(url) as s:
        s.put("sources", json.dumps([{"id": 1, "name": "db.flat"}, {"id": 2, "name": "db.logical"}]))
        s.put("registry", SchemaRegistry([FLAT, LOGICAL]).to_json())
        s.start_initial_load()
        s.load_rows([{"src": 1, "k": key_bytes(i), "scn": 1, "ev": event(FLAT, flat_row(i), 1)}
                     for i in range(1, 2501)])
        s.load_rows([{"src": 2, "k": key_bytes(i), "scn": 1,
                      "ev": event(LOGICAL, logical_row(i), 1)} for i in range(1, 701)])
        s.finish_initial_load(1)
        later = [{"src": 1, "k": key_bytes(i), "scn": 50 + i % 10,
                  "ev": event(FLAT, flat_row(i) | {"name": "later"}, 50 + i % 10)}
                 for i in range(10, 2501, 10)]
        s.fold(later, [], [], 60)
