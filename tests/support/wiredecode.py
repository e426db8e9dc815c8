"""Type matrices the decoder tests share: the SQLite storage classes in every
affinity, and Avro logical types with their expected values."""

from __future__ import annotations

import datetime as dt
import decimal
import random
from typing import Any

from databus.core.schema import ColumnSpec, TableSchema, table_schema
from databus.sources.txlog.catalog import Column, TableVersion
from databus.sources.txlog.rows import VersionCodec

# the SQLite matrix: every storage class in a column of every affinity (test_sqlite_rows)
DECLS = ["INTEGER", "REAL", "TEXT", "BLOB", "NUMERIC"]
VALUES = [None, 0, -(2**63), 2**63 - 1, 0.1, -0.0, 5e-324, float("inf"), "", "é😀",
          "a\x00b", b"", b"\x00\xff"]
SQLITE = VersionCodec(TableVersion(7, "main.t", 1, tuple(
    Column(f"c{i}", d, False, 0, 0) for i, d in enumerate(DECLS)), ()))

LOGICAL = TableSchema(9, "x.logical", 1, table_schema("x", "logical", [
    ColumnSpec("id", "long", nullable=False),
    ColumnSpec("d", {"type": "bytes", "logicalType": "decimal", "precision": 65, "scale": 30}),
    ColumnSpec("d2", {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}),
    ColumnSpec("day", {"type": "int", "logicalType": "date"}),
    ColumnSpec("ts", {"type": "long", "logicalType": "timestamp-micros"}),
    ColumnSpec("lts", {"type": "long", "logicalType": "local-timestamp-micros"}),
    ColumnSpec("ok", "boolean"), ColumnSpec("f", "float"), ColumnSpec("i", "int"),
    ColumnSpec("a-b", "string"),  # renamed field: the column name is kept
]), ("id",))
LOGICAL_ROWS: list[dict[str, Any]] = [
    {"id": 1, "d": decimal.Decimal("-12345678901234567890123456789012345.123456789012345678901234567890"),
     "d2": decimal.Decimal("-0.01"), "day": dt.date(1000, 1, 1),
     "ts": dt.datetime(2038, 1, 19, 3, 14, 7, 999999, tzinfo=dt.UTC),
     "lts": dt.datetime(9999, 12, 31, 23, 59, 59, 999999), "ok": True, "f": 1.5,
     "i": -(2**31), "a_b": "日本語😀"},
    {"id": 2, "d": decimal.Decimal("0E-30"), "d2": decimal.Decimal("12345678.90"),
     "day": dt.date(9999, 12, 31), "ts": dt.datetime(1970, 1, 1, tzinfo=dt.UTC),
     "lts": dt.datetime(1000, 1, 1), "ok": False, "f": -0.0, "i": 2**31 - 1, "a_b": ""},
    {"id": 3, **{k: None for k in ("d", "d2", "day", "ts", "lts", "ok", "f", "i", "a_b")}},
]


def sqlite_payloads() -> list[bytes]:
    out = [SQLITE.encode([v] * len(DECLS)) for v in VALUES]
    rnd = random.Random(7)
    out += [SQLITE.encode([rnd.choice(VALUES) for _ in DECLS]) for _ in range(200)]
    return out
