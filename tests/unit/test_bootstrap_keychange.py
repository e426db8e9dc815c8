"""The applier's fold of key-changing updates (one update with the before image,
as the MariaDB source sends them): the old key's row is removed for int keys
and JSON-array keys, and never guessed when the key form cannot be reproduced.
The end-to-end check with a real MariaDB is tests/e2e/test_bootstrap_mysql.py."""

from __future__ import annotations

import json
from typing import Any

from databus.bootstrap.applier import KeyChanges, _json_old_key, collapse
from databus.bootstrap.store import key_bytes
from databus.core import event as ev
from databus.core.schema import MetadataCodec, SchemaRegistry, TableSchema


def _key(*values: Any) -> bytes:
    return json.dumps(list(values), ensure_ascii=False, separators=(",", ":")).encode()


def test_json_old_key_replaces_only_changed_columns() -> None:
    assert _json_old_key(_key(7, 2), [7, 1], [7, 2]) == _key(7, 1)
    assert _json_old_key(_key(9, 1), [7, 1], [9, 1]) == _key(7, 1)
    assert _json_old_key(_key("né"), ["old"], ["né"]) == _key("old")


def test_json_old_key_refuses_what_it_cannot_reproduce() -> None:
    assert _json_old_key(b"[7, 2]", [7, 1], [7, 2]) is None  # not the compact form
    assert _json_old_key(b"not json", [1], [2]) is None
    assert _json_old_key(_key(7), [7, 1], [7, 2]) is None  # arity differs
    # a changed column whose key form is not the value itself (e.g. a datetime)
    assert _json_old_key(_key("2020-01-02T00:00:00"), [1577836800000000],
                         [1577923200000000]) is None
    assert _json_old_key(_key(True), [False], [True]) is None


def _items_schema() -> TableSchema:
    avro = {"type": "record", "name": "items", "namespace": "shop", "fields": [
        {"name": "order_id", "type": ["null", "long"]},
        {"name": "line", "type": ["null", "long"]},
        {"name": "qty", "type": ["null", "long"]}]}
    return TableSchema(src_id=5, name="shop.items", version=1, avro=avro,
                       key_columns=("order_id", "line"))


def _update(schema: TableSchema, before: dict[str, Any], after: dict[str, Any],
            scn: int) -> bytes:
    meta = MetadataCodec().encode({"before": schema.encode(before)})
    return ev.encode(scn=scn, src_id=schema.src_id, key=_key(after["order_id"], after["line"]),
                     payload=schema.encode(after), schema_id=schema.id,
                     schema_version=schema.version, op=ev.Op.UPDATE, timestamp_ns=1,
                     metadata=meta, metadata_schema_id=MetadataCodec.ID)


def test_collapse_removes_the_old_composite_key() -> None:
    schema = _items_schema()
    keys = KeyChanges(None)
    keys.registry = SchemaRegistry([schema])
    ins = ev.encode(scn=10, src_id=5, key=_key(1, 1),
                    payload=schema.encode({"order_id": 1, "line": 1, "qty": 1}),
                    schema_id=schema.id, schema_version=1, op=ev.Op.INSERT, timestamp_ns=1)
    move = _update(schema, {"order_id": 1, "line": 1, "qty": 1},
                   {"order_id": 4, "line": 2, "qty": 2}, 11)
    upserts, deletes, _ = collapse([(10, ins), (11, move)], keys)
    assert [u["k"] for u in upserts] == [key_bytes(_key(4, 2))]
    assert deletes == [{"src": 5, "k": key_bytes(_key(1, 1))}]
