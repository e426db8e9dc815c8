"""Avro rows to the Arrow envelope: types, union branches, schema versions (no Spark)."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from typing import Any

import pyarrow as pa
import pytest

from databus.core.errors import SchemaError
from databus.core.schema import TableSchema
from databus.spark.arrow import EnvelopeBuilder, avro_to_arrow, envelope_schema

AVRO = {"type": "record", "name": "t", "namespace": "db", "fields": [
    {"name": "id", "type": "long"},
    {"name": "amount", "type": ["null", {"type": "bytes", "logicalType": "decimal",
                                         "precision": 12, "scale": 2}]},
    {"name": "day", "type": ["null", {"type": "int", "logicalType": "date"}]},
    {"name": "at", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}]},
    {"name": "local", "type": ["null", {"type": "long", "logicalType": "local-timestamp-micros"}]},
    {"name": "tod", "type": ["null", {"type": "long", "logicalType": "time-micros"}]},
    {"name": "uid", "type": ["null", {"type": "string", "logicalType": "uuid"}]},
    {"name": "any_", "column": "any", "type": ["null", "long", "double", "string", "bytes"]},
]}


def table(avro: dict[str, Any] = AVRO, version: int = 1) -> TableSchema:
    return TableSchema(src_id=1, name="db.t", version=version, avro=avro, key_columns=("id",))


def build(rows: list[dict[str, Any] | None], schema: TableSchema | None = None,
          json_mode: bool = False) -> pa.RecordBatch:
    ts = schema or table()
    b = EnvelopeBuilder(envelope_schema(None if json_mode else table()))
    for i, r in enumerate(rows):
        b.add("u" if r else "d", 10, i, 5, ts, {}, False, str(i), None, r)
    return b.flush()


def test_logical_types_map_to_arrow() -> None:
    row_type = avro_to_arrow(AVRO)
    assert row_type.field("amount").type == pa.decimal128(12, 2)
    assert row_type.field("day").type == pa.date32()
    assert row_type.field("at").type == pa.timestamp("us", tz="UTC")
    assert row_type.field("local").type == pa.timestamp("us")
    assert row_type.field("tod").type == pa.int64()
    assert row_type.field("uid").type == pa.string()
    assert row_type.field("any").type == pa.int64()  # the first non-null branch


def test_values_decoded_by_fastavro_roundtrip_into_arrow() -> None:
    ts = table()
    u = uuid.uuid4()
    row = ts.decode(ts.encode({
        "id": 1, "amount": decimal.Decimal("12.34"), "day": dt.date(2024, 2, 29),
        "at": dt.datetime(2024, 1, 1, 12, tzinfo=dt.UTC), "local": dt.datetime(2024, 1, 1, 12),
        "tod": dt.time(1, 2, 3, 4), "uid": str(u), "any_": 3.0}))
    got = build([row, None]).column("after").to_pylist()
    assert got[1] is None
    assert got[0]["amount"] == decimal.Decimal("12.34")
    assert got[0]["tod"] == ((1 * 60 + 2) * 60 + 3) * 1_000_000 + 4
    assert got[0]["uid"] == str(u)
    assert got[0]["any"] == 3  # a double branch value that is a whole number fits a long
    assert got[0]["at"] == dt.datetime(2024, 1, 1, 12, tzinfo=dt.UTC)


def test_a_value_that_does_not_fit_fails_with_the_column_name() -> None:
    with pytest.raises(SchemaError, match=r"db\.t\.any|any"):
        build([{"id": 1, "any_": "text"}])


@pytest.mark.parametrize("value", [0.1, -2.5, 1e30, decimal.Decimal("1.5"), b"7"])
def test_a_value_arrow_would_take_inexactly_fails_instead(value: Any) -> None:
    # pa.array([0.1], pa.int64()) is [0] and pa.array([b"7"], pa.string()) is ["7"]
    with pytest.raises(SchemaError, match="column any"):
        build([{"id": 1, "any_": 2}, {"id": 2, "any_": value}])
    if isinstance(value, float):
        with pytest.raises(SchemaError, match="uid"):
            build([{"id": 1, "uid": value}])


def test_whole_floats_in_an_integer_column_are_kept() -> None:
    got = build([{"id": 1, "any_": 3.0}, {"id": 2, "any_": -(2.0**62)}, {"id": 3}])
    assert [r["any"] for r in got.column("after").to_pylist()] == [3, -(2**62), None]


def test_json_mode_carries_any_value() -> None:
    got = build([{"id": 1, "any_": "text", "amount": decimal.Decimal("1.50")}],
                json_mode=True).column("after").to_pylist()
    assert '"any":"text"' in got[0] and '"amount":"1.50"' in got[0]


def test_table_versions_match_by_column_name() -> None:
    older = {**AVRO, "fields": [f for f in AVRO["fields"] if f["name"] != "uid"]}
    got = build([{"id": 7, "any_": 1}], schema=table(older, version=0)).column("after")
    assert got.to_pylist()[0]["uid"] is None and got.to_pylist()[0]["id"] == 7
    newer = {**AVRO, "fields": [*AVRO["fields"], {"name": "extra", "type": ["null", "long"]}]}
    with pytest.raises(SchemaError, match="restart the query"):
        build([{"id": 7}], schema=table(newer, version=2))
