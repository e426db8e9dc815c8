"""Schemas: generation from columns, stable ids, registry and envelope values."""

from __future__ import annotations

import datetime as dt
import decimal

from databus.core import event as ev
from databus.core.envelope import envelope, json_value
from databus.core.schema import ColumnSpec, SchemaRegistry, TableSchema, table_schema


def _users(version: int = 1, extra: bool = False) -> TableSchema:
    cols = [ColumnSpec("id", "long", nullable=False), ColumnSpec("full name", "string")]
    if extra:
        cols.append(ColumnSpec("age", "long"))
    return TableSchema(1, "app.users", version, table_schema("app", "users", cols), ("id",))


def test_schema_id_is_a_digest_of_the_canonical_form() -> None:
    a, b = _users(), _users()
    assert a.id == b.id and len(a.id) == 16
    assert _users(2, extra=True).id != a.id


def test_registry_versions_and_json_round_trip() -> None:
    reg = SchemaRegistry([_users(1), _users(2, extra=True)])
    assert [s.version for s in reg.versions(1)] == [1, 2]
    again = SchemaRegistry.from_json(reg.to_json())
    assert again.latest(1).id == reg.latest(1).id
    assert again.get(reg.versions(1)[0].id).column_names == ["id", "full name"]


def test_envelope_restores_column_names_and_before_image() -> None:
    s = _users()
    reg = SchemaRegistry([s])
    meta = reg.metadata.encode({"before": s.encode({"id": 1, "full_name": "a"}), "txid": "t1"})
    data = ev.encode(scn=7, src_id=1, key=1, payload=s.encode({"id": 1, "full_name": "b"}),
                     schema_id=s.id, op=ev.Op.UPDATE, metadata=meta,
                     metadata_schema_id=reg.metadata.id, timestamp_ns=5_000_000)
    env = envelope(ev.decode(data), reg, total_order=1, data_collection_order=1)
    assert env["before"] == {"id": 1, "full name": "a"}
    assert env["after"] == {"id": 1, "full name": "b"}
    assert env["op"] == "u" and env["source"]["table"] == "users" and env["source"]["ts_ms"] == 5
    assert env["transaction"] == {"id": "t1", "total_order": 1, "data_collection_order": 1}


def test_json_values_are_exact() -> None:
    assert json_value(decimal.Decimal("12345678901234567890.000000001")) == \
        "12345678901234567890.000000001"
    assert json_value(b"\x00\xff") == "AP8="
    assert json_value(dt.datetime(2020, 1, 2, 3, 4, 5, 6, tzinfo=dt.UTC)) == \
        "2020-01-02T03:04:05.000006Z"
    assert json_value(dt.timedelta(hours=-1, microseconds=5)) == "-PT3599.999995S"


def test_field_names_are_valid_avro_and_never_collide() -> None:
    cols = [ColumnSpec("id", "long", nullable=False), ColumnSpec("prénom", "string"),
            ColumnSpec("a-b", "string"), ColumnSpec("a_b", "string"),
            ColumnSpec("日付", "string"), ColumnSpec("名前", "string")]
    s = TableSchema(1, "app.t", 1, table_schema("app", "t", cols), ("id",))
    names = [f["name"] for f in s.avro["fields"]]
    assert len(set(names)) == len(names)
    assert all(n.isascii() and (n[0].isalpha() or n[0] == "_")
               and all(c.isalnum() or c == "_" for c in n) for n in names)
    assert s.column_names == ["id", "prénom", "a-b", "a_b", "日付", "名前"]
    row = dict(zip(names, [1, "é", "x", "y", "d", "n"], strict=True))
    data = ev.encode(scn=1, src_id=1, key=1, payload=s.encode(row), schema_id=s.id,
                     op=ev.Op.INSERT, timestamp_ns=0)
    env = envelope(ev.decode(data), SchemaRegistry([s]), total_order=1,
                   data_collection_order=1)
    assert env["after"] == {"id": 1, "prénom": "é", "a-b": "x", "a_b": "y", "日付": "d",
                            "名前": "n"}
