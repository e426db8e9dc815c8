"""The one decoder's two sinks agree: Python objects (the client's ``wiredecode``) and
Arrow envelope columns (the Spark readers' ``fastread``), on the SQLite type matrix
(every storage class in every affinity), logical types, both key kinds, before
images and control events.

The Arrow sink's row is the object sink's row as the Arrow type expects it
(:func:`databus.spark.arrow.convert`), or, where a value does not fit its column's
type (a string in an INTEGER column), the read fails with :class:`SchemaError` on
the Arrow side exactly when the conversion refuses it. Each sink is held to its own
Python fallback elsewhere (tests/unit/test_client_wiredecode.py,
tests/spark/test_fastread.py); the MySQL matrix is in
tests/integration/test_client_wiredecode_mysql.py.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from databus.client import wiredecode as wd
from databus.core import event as ev
from databus.core.errors import SchemaError
from databus.core.schema import MetadataCodec, SchemaRegistry, TableSchema
from tests.support.wiredecode import LOGICAL, LOGICAL_ROWS, SQLITE, sqlite_payloads

pa = pytest.importorskip("pyarrow")
fastread = pytest.importorskip("databus.spark.fastread")
arrow = pytest.importorskip("databus.spark.arrow")


def arrow_sink(ts: TableSchema, body: bytes, *, native: bool = True) -> list[dict[str, Any]]:
    """Every data event of ``body`` through the Arrow sink, as Python rows."""
    reg = SchemaRegistry([ts])
    dec = fastread.ChunkDecoder(arrow.envelope_schema(ts), reg, lambda: reg, native=native)
    out, off = [], 0
    while off < len(body):
        ch = dec.decode(body, off, 1000, 1 << 62, 0)
        if ch.batch is not None:
            out += ch.batch.to_pylist()
        off = ch.off
    return out


def body_of(events: list[ev.Event]) -> bytes:
    """The wire bytes of ``events`` (data events), as the relay would serve them."""
    return b"".join(ev.encode(scn=e.scn, src_id=e.src_id, key=e.key, payload=e.payload,
                              schema_id=e.schema_id, schema_version=e.schema_version,
                              op=e.op, timestamp_ns=e.timestamp_ns, partition=e.partition,
                              metadata=e.metadata, metadata_schema_id=e.metadata_schema_id,
                              extra_attributes=e.attributes & ev.ATTR_SNAPSHOT)
                    for e in events)


def as_arrow(ts: TableSchema, row: dict[str, Any] | None) -> dict[str, Any] | None:
    """The object sink's ``row`` as the Arrow sink gives it (SchemaError: it does not fit)."""
    if row is None:
        return None
    t = arrow.avro_to_arrow(ts.avro)
    value = {f.name: arrow.convert(row.get(f.name), f.type, f.name) for f in t}
    got: dict[str, Any] = pa.array([value], t).to_pylist()[0]
    return got


def object_sink(ts: TableSchema, e: ev.Event) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(before, after) of a data event through the object sink (RowDecoder)."""
    rd = wd.RowDecoder(ts)
    payload = rd.row(e.payload) if e.payload else None
    before_bytes = MetadataCodec().decode(e.metadata)["before"] if e.metadata else None
    if e.op is ev.Op.DELETE:
        return payload, None
    return (rd.row(before_bytes) if before_bytes is not None else None), payload


def expect(ts: TableSchema, e: ev.Event) -> dict[str, Any]:
    """The envelope row the Arrow sink must give for ``e`` (SchemaError when a value
    does not fit)."""
    before, after = object_sink(ts, e)
    return {"op": e.op.letter, "scn": e.scn, "ts_ms": e.timestamp_ns // 1_000_000,
            "key": arrow.key_text(e.key), "before": as_arrow(ts, before),
            "after": as_arrow(ts, after)}


def picked(row: dict[str, Any]) -> dict[str, Any]:
    return {k: row[k] for k in ("op", "scn", "ts_ms", "key", "before", "after")}


def outcome(fn: Any) -> Any:
    """``fn()``, or :class:`SchemaError` (the class) when it raises that."""
    try:
        return fn()
    except SchemaError:
        return SchemaError


@pytest.mark.parametrize("native", [True, False])
def test_every_sqlite_payload_gives_the_same_row_in_both_sinks(native: bool) -> None:
    ts = SQLITE.schema
    payloads = sqlite_payloads()
    fits = 0
    for i, p in enumerate(payloads):
        before = payloads[(i + 1) % len(payloads)] if i % 3 == 1 else None
        md = MetadataCodec().encode({"before": before, "txid": None, "file": "f", "pos": i,
                                     "gtid": None, "server_id": 3, "row": i}) if i % 2 else None
        op = [ev.Op.INSERT, ev.Op.UPDATE, ev.Op.DELETE, ev.Op.READ][i % 4]
        key: int | bytes = i if i % 2 else b"\xff\x00" if i % 4 == 0 else f"k{i}".encode()
        body = ev.encode(scn=40 + i, src_id=ts.src_id, key=key, payload=p, schema_id=ts.id,
                         op=op, timestamp_ns=i * 1_234_567, metadata=md,
                         metadata_schema_id=MetadataCodec.ID if md is not None else b"")
        (e,) = wd.scan(body)
        want = outcome(lambda e=e: expect(ts, e))
        got = outcome(lambda b=body: picked(next(iter(arrow_sink(ts, b, native=native)))))
        assert repr(got) == repr(want), i
        fits += want is not SchemaError
    assert 0 < fits < len(payloads)  # both outcomes are in the matrix


@pytest.mark.parametrize("native", [True, False])
def test_logical_types_and_fitting_sqlite_rows_give_the_same_rows_in_both_sinks(native: bool) -> None:
    logical = b"".join(ev.encode(scn=9, src_id=9, key=r["id"], payload=LOGICAL.encode(r),
                                 schema_id=LOGICAL.id, op=ev.Op.READ,
                                 extra_attributes=ev.ATTR_SNAPSHOT) for r in LOGICAL_ROWS)
    got = [picked(r) for r in arrow_sink(LOGICAL, logical + ev.encode_eop(9), native=native)]
    want = [expect(LOGICAL, e) for e in wd.scan(logical)]
    assert repr(got) == repr(want) and len(got) == len(LOGICAL_ROWS)
    # SQLite rows whose values all fit their columns, many in one chunk: the compiled
    # Arrow sink decodes them without the Python path
    ts, rnd = SQLITE.schema, random.Random(3)
    fits: list[list[Any]] = [[None, 0, -(2**63), 2**63 - 1], [None, 0.1, -0.0, 5e-324, float("inf")],
            [None, "", "é😀", "a\x00b"], [None, b"", b"\x00\xff"], [None, 7, -1]]
    parts = []
    for i in range(300):
        row = [rnd.choice(f) for f in fits]
        md = MetadataCodec().encode({
            "before": SQLITE.encode([rnd.choice(f) for f in fits]) if i % 3 else None,
            "txid": "t", "file": None, "pos": i, "gtid": None, "server_id": None,
            "row": None}) if i % 2 else None
        parts.append(ev.encode(scn=100 + i // 7, src_id=ts.src_id, key=i if i % 5 else b"k",
                               payload=SQLITE.encode(row), schema_id=ts.id,
                               op=[ev.Op.INSERT, ev.Op.UPDATE, ev.Op.DELETE][i % 3],
                               timestamp_ns=-i * 999_999, metadata=md,
                               metadata_schema_id=MetadataCodec.ID if md is not None else b""))
    sub = b"".join(parts)
    if native:
        reg = SchemaRegistry([ts])
        dec = fastread.ChunkDecoder(arrow.envelope_schema(ts), reg, lambda: reg)
        assert fastread._native.envelope_columns(sub, 0, 1000, 1 << 62, 0, dec._plans,
                                                 dec._kinds) is not None
    got = [picked(r) for r in arrow_sink(ts, sub, native=native)]
    assert len(got) == 300 and repr(got) == repr([expect(ts, e) for e in wd.scan(sub)])
