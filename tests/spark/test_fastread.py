"""The compiled response decoder gives what the Python path gives, value for value (no Spark).

Both paths of :class:`ChunkDecoder` run over the same response bytes, chunk by
chunk with several ``max_rows``; every chunk (record batch, offsets, EOPs,
window index, done) must be equal. Damaged input (any byte flipped, random
Avro behind valid CRCs) must end the same way in both: same output or the same
typed error.
"""

from __future__ import annotations

import random
import shutil
from typing import Any

import pyarrow as pa
import pytest

from databus.core import event as ev
from databus.core.errors import DatabusError, SchemaError
from databus.core.schema import MetadataCodec, SchemaRegistry, TableSchema
from databus.spark import fastread
from databus.spark.arrow import envelope_schema, flat_schema

V1 = {"type": "record", "name": "t", "namespace": "db", "fields": [
    {"name": "id", "type": "long"},
    {"name": "flag", "type": ["null", "boolean"]},
    {"name": "small", "type": ["null", "int"]},
    {"name": "f32", "type": ["null", "float"]},
    {"name": "f64", "type": ["null", "double"]},
    {"name": "name", "type": ["null", "string"]},
    {"name": "blob", "type": ["null", "bytes"]},
    # SQLite style: the declared affinity first, then the other storage classes
    {"name": "any_", "column": "any", "type": ["null", "long", "double", "string", "bytes"]},
]}
V2 = {**V1, "fields": [*V1["fields"], {"name": "extra", "type": ["null", "string"]}]}
META = MetadataCodec()


def table(avro: dict[str, Any], version: int) -> TableSchema:
    return TableSchema(src_id=7, name="db.t", version=version, avro=avro, key_columns=("id",))


def row(rng: random.Random, i: int, with_extra: bool, odd: bool = False) -> dict[str, Any]:
    r: dict[str, Any] = {
        "id": i,
        "flag": rng.choice([None, True, False]),
        "small": rng.choice([None, -(2**31), 2**31 - 1, rng.randrange(-1000, 1000)]),
        "f32": rng.choice([None, 0.5, -2.25, 1e30]),
        "f64": rng.choice([None, rng.random(), -1e-300, 1e300]),
        "name": rng.choice([None, "", "plain", "é漢字🙂", "x" * rng.randrange(300)]),
        "blob": rng.choice([None, b"", b"\x00\xff" * rng.randrange(20)]),
        "any_": rng.choice([None, rng.randrange(-(2**63), 2**63)]),
    }
    if odd:  # values in other union branches: the Python path converts them
        r["any_"] = rng.choice([("double", 3.0), ("double", -0.0), ("double", 2.0**62)])
    if with_extra:
        r["extra"] = rng.choice([None, "more"])
    return r


def events(rng: random.Random, schemas: list[TableSchema], windows: int, *,
           odd: bool = False) -> bytes:
    """Windows of data events over every op, key kind and metadata shape, plus controls."""
    out = []
    scn = 100
    for w in range(windows):
        scn += rng.randrange(1, 5)
        for j in range(rng.randrange(0, 40)):
            ts = rng.choice(schemas)
            op = rng.choice([ev.Op.INSERT, ev.Op.UPDATE, ev.Op.DELETE, ev.Op.READ,
                             ev.Op.TRUNCATE])
            extra = "extra" in [f["name"] for f in ts.avro["fields"]]
            r = row(rng, w * 100 + j, extra, odd=odd and rng.random() < 0.2)
            payload = b"" if op == ev.Op.TRUNCATE else ts.encode(r)
            meta = None
            if rng.random() < 0.7:
                before = ts.encode(row(rng, w, extra))
                meta = META.encode({
                    "before": rng.choice([None, before]), "txid": rng.choice([None, "tx-1"]),
                    "file": rng.choice([None, "binlog.000001", "é"]),
                    "pos": rng.choice([None, 4, 2**40]), "gtid": rng.choice([None, "a:1"]),
                    "server_id": rng.choice([None, 1]), "row": rng.choice([None, 0, 99])})
            key: int | bytes = rng.choice([
                rng.randrange(-(2**63), 2**63), b'["k",1]', b"\xff\xfe", "é".encode()])
            out.append(ev.encode(
                scn=scn, src_id=7, key=key, payload=payload, schema_id=ts.id, op=op,
                timestamp_ns=rng.choice([0, 1_700_000_000_123_456_789, -1_500_000, -1_000_000]),
                metadata=meta, metadata_schema_id=META.id,
                extra_attributes=ev.ATTR_SNAPSHOT if rng.random() < 0.2 else 0))
            if rng.random() < 0.05:
                out.append(ev.encode_control(scn, ev.SRC_CHECKPOINT, b"{}"))
        out.append(ev.encode_eop(scn))
    return b"".join(out)


def decoders(registry: SchemaRegistry, query: TableSchema,
             refresh: SchemaRegistry | None = None, *, flat: bool = False
             ) -> dict[bool, fastread.ChunkDecoder]:
    schema = flat_schema(query) if flat else envelope_schema(query)
    return {native: fastread.ChunkDecoder(
        schema, registry, lambda: refresh or registry, native=native)
        for native in (True, False)}


def run(dec: fastread.ChunkDecoder, data: bytes, max_rows: int, end_scn: int) -> list[Any]:
    """Every chunk of ``data`` as comparable values, or the error type it stops with."""
    out: list[Any] = []
    off, index = 0, 0
    try:
        while off < len(data):
            ch = dec.decode(data, off, max_rows, end_scn, index)
            out.append((ch.batch.to_pylist() if ch.batch is not None else None, ch.off,
                        ch.eops, ch.index, ch.tail, ch.tail_scn, ch.done))
            if ch.batch is not None:
                assert ch.batch.schema == dec.schema
                assert ch.batch.num_rows <= max_rows
            off, index = ch.off, ch.index
            if ch.done:
                break
    except DatabusError as exc:
        out.append(type(exc))
    return out


def same(data: bytes, registry: SchemaRegistry, query: TableSchema, max_rows: int,
         end_scn: int = 1 << 62) -> list[Any]:
    """Both paths' chunks, full envelope; the flat ones (both paths) must be their flattening."""
    d = decoders(registry, query)
    native, python = run(d[True], data, max_rows, end_scn), run(d[False], data, max_rows, end_scn)
    assert native == python
    f = decoders(registry, query, flat=True)
    flat_native, flat_python = (run(f[True], data, max_rows, end_scn),
                                run(f[False], data, max_rows, end_scn))
    names = flat_schema(query).names[:-2]
    assert flat_native == flat_python == [flattened(c, names) for c in native]
    return native


def flattened(chunk: Any, names: list[str]) -> Any:
    """A full chunk as ``envelope=flat`` gives it: what changes() selects per row."""
    if isinstance(chunk, type):
        return chunk
    rows, *rest = chunk
    if rows is not None:
        rows = [{**(r["after"] or r["before"] or dict.fromkeys(names)), "_op": r["op"],
                 "_sequence": r["sequence"]} for r in rows]
    return (rows, *rest)


@pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("cc") is None,
                    reason="no C compiler on this machine: the Python path is used")
def test_the_compiled_decoder_is_built() -> None:
    assert fastread.available(), "run scripts/setup.sh: the _wiredecode extension did not build"


@pytest.mark.parametrize("max_rows", [1, 7, 8192])
def test_both_paths_give_the_same_chunks_on_every_type_op_and_key(max_rows: int) -> None:
    rng = random.Random(max_rows)
    v1, v2 = table(V1, 1), table(V2, 2)
    registry = SchemaRegistry([v1, v2])
    data = events(rng, [v1, v2], 30)
    chunks = same(data, registry, v2, max_rows)
    rows = [r for c in chunks for r in (c[0] or [])]
    assert len(rows) > 200 and {r["op"] for r in rows} == {"c", "u", "d", "r", "t"}
    assert any(r["key"].startswith("0x") for r in rows)  # a key that is not UTF-8
    assert any(r["after"] and r["after"]["extra"] is None for r in rows)  # v1 row in v2 shape
    # the clean input is decoded by the extension, not handed to the Python path
    dec = decoders(registry, v2)[True]
    assert dec.native
    assert fastread._native.envelope_columns(data, 0, 1 << 20, 1 << 62, 0, dec._plans,
                                             dec._kinds) is not None


def test_the_batch_end_window_stops_both_paths_at_the_same_place() -> None:
    rng = random.Random(3)
    v1 = table(V1, 1)
    data = events(rng, [v1], 12)
    scns = sorted({ev.peek_scn(data, 0), *(e.scn for e in ev.iter_events(data) if e.is_eop)})
    for end in scns[::3]:
        chunks = same(data, SchemaRegistry([v1]), v1, 5, end_scn=end)
        assert chunks[-1][-1] is True and end in chunks[-1][2]


def test_values_of_other_union_branches_are_converted_by_the_python_path() -> None:
    rng = random.Random(4)
    v1 = table(V1, 1)
    data = events(rng, [v1], 10, odd=True)
    chunks = same(data, SchemaRegistry([v1]), v1, 64)
    values = {r["after"]["any"] for c in chunks for r in (c[0] or []) if r["after"]}
    assert 3 in values and 2**62 in values  # whole doubles in a long column


def test_a_value_that_fits_no_column_fails_alike() -> None:
    v1 = table(V1, 1)
    bad = ev.encode(scn=5, src_id=7, key=1, payload=v1.encode({**row(random.Random(1), 1, False),
                                                             "any_": "text"}),
                    schema_id=v1.id, op=ev.Op.INSERT) + ev.encode_eop(5)
    assert same(bad, SchemaRegistry([v1]), v1, 10) == [SchemaError]


def test_an_unknown_version_refreshes_the_registry_once_then_decodes() -> None:
    rng = random.Random(5)
    v1, v2 = table(V1, 1), table(V2, 2)
    data = events(rng, [v1, v2], 8)
    d = decoders(SchemaRegistry([v1]), v2, refresh=SchemaRegistry([v1, v2]))
    native, python = run(d[True], data, 50, 1 << 62), run(d[False], data, 50, 1 << 62)
    assert native == python and all(not isinstance(c, type) for c in native)


def test_logical_types_use_the_python_path() -> None:
    avro = {**V1, "fields": [*V1["fields"],
                             {"name": "day", "type": ["null", {"type": "int",
                                                               "logicalType": "date"}]}]}
    ts = table(avro, 1)
    dec = decoders(SchemaRegistry([ts]), ts)[True]
    assert not dec.native
    data = ev.encode(scn=5, src_id=7, key=1, payload=ts.encode({**row(random.Random(1), 1, False),
                                                              "day": 19000}),
                     schema_id=ts.id, op=ev.Op.INSERT) + ev.encode_eop(5)
    assert same(data, SchemaRegistry([ts]), ts, 10)[0][0][0]["after"]["day"].year == 2022


def test_damaged_bytes_end_the_same_way_in_both_paths() -> None:
    rng = random.Random(6)
    v1 = table(V1, 1)
    registry = SchemaRegistry([v1])
    data = events(rng, [v1], 4)
    for _ in range(300):
        damaged = bytearray(data)
        for _ in range(rng.randrange(1, 4)):
            damaged[rng.randrange(len(damaged))] ^= 1 << rng.randrange(8)
        cut = bytes(damaged[: rng.choice([len(damaged), rng.randrange(len(damaged))])])
        same(cut, registry, v1, rng.choice([1, 10, 1000]))


def test_random_avro_behind_valid_crcs_ends_the_same_way_in_both_paths() -> None:
    rng = random.Random(7)
    v1 = table(V1, 1)
    registry = SchemaRegistry([v1])
    outcomes = set()
    for _ in range(400):
        good = v1.encode(row(rng, 1, False))
        junk = bytearray(good)
        for _ in range(rng.randrange(1, 4)):
            junk[rng.randrange(len(junk))] = rng.randrange(256)
        payload = bytes(junk[: rng.randrange(len(junk) + 1)])
        meta = bytes(rng.randrange(256) for _ in range(rng.randrange(12)))
        data = ev.encode(scn=5, src_id=7, key=1, payload=payload, schema_id=v1.id,
                         op=ev.Op.UPDATE, metadata=rng.choice([None, meta]),
                         metadata_schema_id=META.id) + ev.encode_eop(5)
        out = same(data, registry, v1, 10)
        outcomes.add("error" if isinstance(out[-1], type) else "rows")
    assert outcomes == {"error", "rows"}


def test_json_value_format_uses_the_python_path() -> None:
    v1 = table(V1, 1)
    dec = fastread.ChunkDecoder(envelope_schema(None), SchemaRegistry([v1]), lambda: None)
    assert not dec.native
    data = events(random.Random(8), [v1], 2)
    assert isinstance(run(dec, data, 100, 1 << 62)[0][0][0]["after"] or "", str)
    assert pa.types.is_string(dec.schema.field("after").type)


def test_the_flat_envelope_is_decoded_by_the_extension() -> None:
    rng = random.Random(9)
    v1 = table(V1, 1)
    data = events(rng, [v1], 10)
    dec = decoders(SchemaRegistry([v1]), v1, flat=True)[True]
    assert dec.native and dec.schema.names == [*(f["column"] if "column" in f else f["name"]
                                                  for f in V1["fields"]), "_op", "_sequence"]
    res = fastread._native.envelope_columns(data, 0, 1 << 20, 1 << 62, 0, dec._plans,
                                            dec._kinds, True)
    assert res is not None and res[9] == ()  # only the row columns come back


def test_a_damaged_before_image_behind_an_after_image_fails_alike_when_flat() -> None:
    """The flat decode does not keep the before image of an update, but checks it exactly
    as the full decode does: the same bytes end the same way in every path."""
    rng = random.Random(10)
    v1 = table(V1, 1)
    registry = SchemaRegistry([v1])
    outcomes = set()
    for _ in range(300):
        before = bytearray(v1.encode(row(rng, 1, False)))
        for _ in range(rng.randrange(1, 3)):
            before[rng.randrange(len(before))] = rng.randrange(256)
        meta = META.encode({"before": bytes(before), "txid": None, "file": None, "pos": None,
                            "gtid": None, "server_id": None, "row": None})
        data = ev.encode(scn=5, src_id=7, key=1, payload=v1.encode(row(rng, 1, False)),
                         schema_id=v1.id, op=ev.Op.UPDATE, metadata=meta,
                         metadata_schema_id=META.id) + ev.encode_eop(5)
        out = same(data, registry, v1, 10)
        outcomes.add("error" if isinstance(out[-1], type) else "rows")
    assert outcomes == {"error", "rows"}


def test_flat_refuses_a_table_with_a_column_named_like_its_own() -> None:
    avro = {**V1, "fields": [*V1["fields"], {"name": "_op", "type": ["null", "string"]}]}
    with pytest.raises(SchemaError, match="envelope=full"):
        flat_schema(table(avro, 1))


def test_a_flat_table_may_have_columns_named_like_the_envelope() -> None:
    avro = {**V1, "fields": [*V1["fields"], {"name": "after", "type": ["null", "string"]},
                             {"name": "op", "type": ["null", "string"]}]}
    ts = table(avro, 1)
    data = ev.encode(scn=5, src_id=7, key=1, payload=ts.encode(
        {**row(random.Random(1), 1, False), "after": "x", "op": "y"}), schema_id=ts.id,
        op=ev.Op.INSERT) + ev.encode_eop(5)
    rows = same(data, SchemaRegistry([ts]), ts, 10)[0][0]
    assert rows[0]["after"]["after"] == "x" and rows[0]["op"] == "c"
    flat = run(decoders(SchemaRegistry([ts]), ts, flat=True)[True], data, 10, 1 << 62)
    assert flat[0][0][0]["after"] == "x" and flat[0][0][0]["op"] == "y"
    assert flat[0][0][0]["_op"] == "c"
