"""The client's batch decoder: compiled and Python halves give the same events, rows,
columns and typed errors (SQLite type matrix, logical types, damaged and truncated
bodies, row bytes the compiled half leaves to fastavro)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from databus.client import wiredecode as wd
from databus.core import event as ev
from databus.core.errors import CorruptEventError, SchemaError
from databus.core.schema import ColumnSpec, MetadataCodec, TableSchema, table_schema
from databus.sources.txlog.rows import WindowMetadata
from tests.support.wiredecode import LOGICAL, LOGICAL_ROWS, SQLITE, sqlite_payloads

needs_c = pytest.mark.skipif(not wd.compiled(), reason="the C extension is not built")



def _body() -> bytes:
    """Two windows: SQLite rows with metadata (before images), bytes and int keys,
    a checkpoint and an error control event, EOPs."""
    meta = WindowMetadata(MetadataCodec(), "txid-1")
    parts = []
    payloads = sqlite_payloads()
    for i, p in enumerate(payloads[:20]):
        op = [ev.Op.INSERT, ev.Op.UPDATE, ev.Op.DELETE][i % 3]
        key: int | bytes = i if i % 2 else f'["k{i}"]'.encode()
        md = meta.encode(payloads[i + 1] if op is ev.Op.UPDATE else None, i) if i % 4 else None
        parts.append(ev.encode(scn=5, src_id=7, key=key, payload=p, schema_id=SQLITE.schema.id,
                               op=op, timestamp_ns=-i, partition=-3, metadata=md,
                               metadata_schema_id=MetadataCodec.ID if md is not None else b""))
    parts.append(ev.encode_control(5, ev.SRC_CHECKPOINT, b'{"windowScn": 5}'))
    parts.append(ev.encode_eop(5, timestamp_ns=123))
    parts += [ev.encode(scn=9, src_id=9, key=r["id"], payload=LOGICAL.encode(r),
                        schema_id=LOGICAL.id, schema_version=-2, op=ev.Op.READ,
                        extra_attributes=ev.ATTR_SNAPSHOT) for r in LOGICAL_ROWS]
    parts.append(ev.encode_control(9, -7, b'{"error": "x"}'))
    parts.append(ev.encode_eop(9))
    return b"".join(parts)


@needs_c
@pytest.mark.parametrize("verify", [True, False])
def test_scan_gives_the_same_events_as_the_python_decoder(verify: bool) -> None:
    body = _body()
    native = wd.scan(body, verify=verify)
    assert native == wd.scan(body, verify=verify, native=False) == list(ev.iter_events(body))
    assert all(type(e) is ev.Event for e in native)
    assert {e.src_id for e in native} == {7, 9, ev.SRC_CHECKPOINT, -7, ev.SRC_EOP}
    assert wd.scan(memoryview(body)) == native  # any buffer, read in place
    assert wd.scan(b"") == []


def _error(fn: Any) -> tuple[type[BaseException], str] | None:
    try:
        fn()
    except Exception as exc:
        return type(exc), str(exc)
    return None


@needs_c
def test_every_damaged_byte_is_the_same_typed_error_on_both_halves() -> None:
    full = _body()
    first = ev.peek_length(full)
    body = full[: first + ev.peek_length(full, first)]  # two events: every byte of both
    for i in range(len(body)):
        damaged = bytearray(body)
        damaged[i] ^= 0x40
        native = _error(lambda d=damaged: wd.scan(bytes(d)))
        python = _error(lambda d=damaged: wd.scan(bytes(d), native=False))
        assert native == python
        assert native is not None and native[0] is CorruptEventError, (i, native)


@needs_c
@pytest.mark.parametrize("verify", [True, False])
def test_a_truncated_body_is_the_same_typed_error_on_both_halves(verify: bool) -> None:
    body = _body()
    first = ev.peek_length(body)
    for cut in [*range(1, first), first + 1, first + 50, len(body) - 1]:
        native = _error(lambda c=cut: wd.scan(body[:c], verify=verify))
        python = _error(lambda c=cut: wd.scan(body[:c], verify=verify, native=False))
        assert native == python, cut
        assert native is not None and native[0] is CorruptEventError, cut


@needs_c
def test_without_verify_a_damaged_crc_reaches_the_caller_alike() -> None:
    body = bytearray(_body())
    body[13] ^= 1  # the first event's body CRC
    with pytest.raises(CorruptEventError, match="CRC"):
        wd.scan(bytes(body))
    assert wd.scan(bytes(body), verify=False) == wd.scan(bytes(body), verify=False,
                                                         native=False)


@needs_c
@pytest.mark.parametrize(("schema", "payloads"), [
    (SQLITE.schema, sqlite_payloads()),
    (LOGICAL, [LOGICAL.encode(r) for r in LOGICAL_ROWS]),
], ids=["sqlite-matrix", "logical-types"])
def test_rows_and_columns_are_the_same_on_both_halves(schema: TableSchema,
                                                      payloads: list[bytes]) -> None:
    native, python = wd.RowDecoder(schema), wd.RowDecoder(schema, native=False)
    assert native.native and not python.native
    rows = python.rows(payloads)
    assert rows == [{c: schema.decode(p)[f["name"]] for c, f in
                     zip(schema.column_names, schema.avro["fields"], strict=True)}
                    for p in payloads]
    got = native.rows(payloads)
    # repr: -0.0 == 0.0 and nan != nan would hide a difference
    assert repr(got) == repr(rows)
    assert [list(r) for r in got] == [list(r) for r in rows]  # column order
    assert repr([native.row(p) for p in payloads]) == repr(rows)
    cols = native.columns([memoryview(p) for p in payloads])
    assert repr(cols) == repr(python.columns(payloads))
    assert list(cols) == list(schema.column_names)
    assert repr(cols) == repr({c: [r[c] for r in rows] for c in schema.column_names})


def _row(schema: TableSchema, **raw: bytes) -> bytes:
    """Avro bytes of a record whose fields are given already encoded."""
    return b"".join(raw[f["name"]] for f in schema.avro["fields"])


def _no_addr(text: str) -> str:
    return re.sub(r"0x[0-9a-f]+", "0x", text)


EDGE = TableSchema(3, "x.edge", 1, table_schema("x", "edge", [
    ColumnSpec("i", "int", nullable=False), ColumnSpec("b", "boolean", nullable=False),
    ColumnSpec("s", "string"),
]), ())


@needs_c
@pytest.mark.parametrize("data", [
    _row(EDGE, i=b"\x80\x80\x80\x80\x10", b=b"\x01", s=b"\x00"),  # an int beyond 32 bits
    _row(EDGE, i=b"\x02", b=b"\x02", s=b"\x00"),                  # a boolean byte 2
    _row(EDGE, i=b"\x02", b=b"\x00", s=b"\x02\x04\xff\xfe"),      # invalid UTF-8
    _row(EDGE, i=b"\x02", b=b"\x00", s=b"\x06"),                  # union index out of range
    _row(EDGE, i=b"\x02", b=b"\x00", s=b"\x02\x10ab"),            # string beyond the row
    b"\x02",                                                       # truncated row
    b"",                                                           # no row at all
    _row(EDGE, i=b"\x02", b=b"\x01", s=b"\x00") + b"tail",        # trailing bytes: ignored
], ids=["int-overflow", "bool-2", "bad-utf8", "bad-branch", "long-string", "truncated",
        "empty", "trailing"])
def test_row_bytes_the_compiled_half_does_not_take_give_what_fastavro_gives(data: bytes) -> None:
    native, python = wd.RowDecoder(EDGE), wd.RowDecoder(EDGE, native=False)
    for call in (lambda d: d.row(data), lambda d: d.rows([data, data]),
                 lambda d: d.columns([data])):
        try:
            expected: Any = call(python)
        except SchemaError as exc:
            with pytest.raises(SchemaError) as got:
                call(native)
            # fastavro's message may name its reader object: compare without addresses
            assert _no_addr(str(got.value)) == _no_addr(str(exc))
        else:
            assert repr(call(native)) == repr(expected)


def test_schemas_the_compiled_half_does_not_cover_use_fastavro() -> None:
    nested = TableSchema(4, "x.nested", 1, {
        "type": "record", "name": "n", "namespace": "x", "fields": [
            {"name": "tags", "type": {"type": "array", "items": "string"}},
            {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}}]}, ())
    d = wd.RowDecoder(nested)
    assert not d.native
    data = nested.encode({"tags": ["a", "b"], "e": "B"})
    assert d.row(data) == {"tags": ["a", "b"], "e": "B"}
    assert d.columns([data, data]) == {"tags": [["a", "b"]] * 2, "e": ["B", "B"]}


# -- scan_table: where the events are, without an object per event -------------------

def _table_view(t: wd.Scanned) -> tuple[Any, ...]:
    return (*(getattr(t, c).tolist() for c in wd._COLS), t.runs)


@needs_c
@pytest.mark.parametrize("verify", [True, False])
def test_scan_table_is_the_same_on_both_halves_and_its_events_are_the_scan(
        verify: bool) -> None:
    body = _body()
    native, python = wd.scan_table(body, verify=verify), wd.scan_table(body, verify=verify,
                                                                       native=False)
    assert _table_view(native) == _table_view(python)
    events = wd.scan(body)
    assert native.events() == python.events() == events
    assert native.events(3, 9) == python.events(3, 9) == events[3:9]
    assert native.src_ids.tolist() == [e.src_id for e in events]
    assert native.attributes.tolist() == [e.attributes for e in events]
    # payload spans point at each event's payload bytes in the body
    assert [bytes(body[o:o + n]) for o, n in zip(native.payload_offsets,
                                                 native.payload_lengths, strict=True)] == [
        e.payload for e in events]
    # runs: one per schema id (per source for events without one), as schema_runs cuts
    assert native.runs == [(0, 20), (20, 21), (21, 22), (22, 25), (25, 26), (26, 27)]
    assert len(wd.scan_table(b"")) == 0 and wd.scan_table(b"").runs == []


@needs_c
def test_a_damaged_table_scan_is_the_same_typed_error_on_both_halves() -> None:
    full = _body()
    first = ev.peek_length(full)
    body = full[: first + ev.peek_length(full, first)]
    for i in range(len(body)):
        damaged = bytearray(body)
        damaged[i] ^= 0x40
        native = _error(lambda d=damaged: wd.scan_table(bytes(d)))
        python = _error(lambda d=damaged: wd.scan_table(bytes(d), native=False))
        assert native == python == _error(lambda d=damaged: wd.scan(bytes(d)))
        assert native is not None and native[0] is CorruptEventError, (i, native)


@needs_c
def test_a_large_body_is_checked_alike_on_both_halves() -> None:
    """Bodies from 64 KiB on are walked without the GIL: same events, same errors."""
    body = _body() * 40
    assert len(body) > 64 * 1024
    assert wd.scan(body) == wd.scan(body, native=False)
    assert wd.scan_table(body).events() == wd.scan(body)
    damaged = bytearray(body)
    damaged[len(body) // 2] ^= 1
    for fn in (wd.scan, wd.scan_table):
        native = _error(lambda f=fn: f(bytes(damaged)))
        assert native is not None and native[0] is CorruptEventError
        assert native == _error(lambda f=fn: f(bytes(damaged), native=False))


@needs_c
def test_rows_and_columns_at_spans_equal_rows_and_columns_on_both_halves() -> None:
    body = _body()
    table = wd.scan_table(body)
    events = wd.scan(body)
    for schema, (a, b) in ((SQLITE.schema, table.runs[0]), (LOGICAL, table.runs[3])):
        payloads = [e.payload for e in events[a:b]]
        offs, lens = table.payload_offsets[a:b], table.payload_lengths[a:b]
        for d in (wd.RowDecoder(schema), wd.RowDecoder(schema, native=False)):
            assert repr(d.rows_at(body, offs, lens)) == repr(d.rows(payloads))
            assert repr(d.columns_at(memoryview(body), offs, lens)) == repr(
                d.columns(payloads))
    with pytest.raises(ValueError, match="outside the body"):
        wd.RowDecoder(SQLITE.schema).rows_at(body[:100], offs, lens)
