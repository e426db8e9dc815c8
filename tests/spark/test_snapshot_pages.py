"""The snapshot reader's page walk gives the rows of the per-event reference (no Spark).

:meth:`SnapshotReader.read` runs in the executor's Python worker; here it runs
directly over a SQLite store. Its output must equal, row for row, what the
reader did before it read concatenated pages: every stored row of the range
with scn <= X decoded one event at a time (event.decode, the Avro decoder,
:class:`EnvelopeBuilder`), op ``r``, index 0, no before image. Batches are
``rowsPerArrowBatch`` rows long whatever ``pageRows`` is (the last one shorter).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from databus.bootstrap.store import BootstrapStore, key_bytes
from databus.core import event as ev
from databus.core.envelope import decode_images
from databus.core.errors import SchemaError
from databus.core.schema import ColumnSpec, SchemaRegistry, TableSchema, table_schema
from databus.spark import arrow
from databus.spark.snapshot import IdRangePartition, SnapshotReader, _Plan
from tests.support.snapshot_store import FLAT, FLAT_V2, LOGICAL, event, fill, flat_row, logical_row


@pytest.fixture
def store(tmp_path: Path) -> Iterator[str]:
    """Two sources: 2,500 flat rows (scn 1, then every 10th rewritten at scn 50..) and
    700 logical rows; applied SCN 60."""
    url = f"sqlite:///{tmp_path / 'bs.db'}"
    fill(url)
    yield url


def reference(url: str, reader: SnapshotReader, part: IdRangePartition) -> pa.Table:
    """The rows as the reader made them one event at a time."""
    registry = SchemaRegistry.from_json(reader.registry_json)
    builder = arrow.EnvelopeBuilder(reader.arrow_schema)
    batches = []
    with BootstrapStore(url, create=False) as s:
        for _id, _src, scn, data in s.snapshot_page(reader.src_ids, part.after_id, part.last_id,
                                                    reader.scn, 10**9):
            e = ev.decode(data, 0)
            schema, _before, after, meta = decode_images(e, registry)
            builder.add("r", scn, 0, e.timestamp_ns // 1_000_000, schema, meta, True,
                        arrow.key_text(e.key), None, after)
    if len(builder):
        batches.append(builder.flush())
    return pa.Table.from_batches(batches, reader.arrow_schema)


def read(url: str, **options: str) -> tuple[SnapshotReader, list[tuple[IdRangePartition,
                                                                        list[pa.RecordBatch]]]]:
    reader = SnapshotReader(_Plan({"store": url, **options}))
    out = []
    for p in reader.partitions():
        assert isinstance(p, IdRangePartition)
        out.append((p, list(reader.read(p))))
    return reader, out


def by_source_and_key(t: pa.Table) -> pa.Table:
    tables, keys = t.column("source").combine_chunks().field("table"), t.column("key")
    return t.take(sorted(range(t.num_rows), key=lambda i: (tables[i].as_py(), keys[i].as_py())))


@pytest.mark.parametrize(("partitions", "page_rows", "per_batch"),
                         [(1, 300, 1000), (3, 1000, 300), (4, 10_000, 8192), (2, 7, 5)])
def test_pages_give_the_reference_rows_in_full_batches(
        store: str, partitions: int, page_rows: int, per_batch: int) -> None:
    reader, parts = read(store, sources="db.flat", partitions=str(partitions),
                         pageRows=str(page_rows), rowsPerArrowBatch=str(per_batch))
    total = 0
    for part, batches in parts:
        sizes = [b.num_rows for b in batches]
        assert all(n == per_batch for n in sizes[:-1]) and 0 < sizes[-1] <= per_batch
        got = pa.Table.from_batches(batches, reader.arrow_schema)
        assert got.equals(reference(store, reader, part))
        total += got.num_rows
    assert total == 2500


def test_rows_written_after_the_snapshot_scn_are_left_out(store: str) -> None:
    reader, parts = read(store, sources="db.flat", scn="54", partitions="2")
    got = pa.Table.from_batches([b for _p, bs in parts for b in bs], reader.arrow_schema)
    # keys 10, 20, ... were rewritten at 50 + key % 10 == 50: all at or below 54
    assert got.num_rows == 2500
    reader, parts = read(store, sources="db.flat", scn="49")
    got = pa.Table.from_batches([b for _p, bs in parts for b in bs], reader.arrow_schema)
    assert got.num_rows == 2500 - 250
    assert max(got.column("scn").to_pylist()) == 1
    for part, batches in parts:
        assert pa.Table.from_batches(batches, reader.arrow_schema).equals(
            reference(store, reader, part))


def test_types_the_compiled_decoder_declines_come_through_the_python_path(store: str) -> None:
    reader, parts = read(store, sources="db.logical", partitions="2", pageRows="100",
                         rowsPerArrowBatch="64")
    for part, batches in parts:
        got = pa.Table.from_batches(batches, reader.arrow_schema)
        assert got.equals(reference(store, reader, part))
    rows = [r for _p, bs in parts for b in bs for r in b.column("after").to_pylist()]
    assert sorted(rows, key=lambda r: r["id"]) == [logical_row(i) for i in range(1, 701)]


def test_json_values_of_several_sources(store: str) -> None:
    reader, parts = read(store, sources="db.flat,db.logical", valueFormat="json",
                         partitions="3", pageRows="250", rowsPerArrowBatch="400")
    got = pa.Table.from_batches([b for _p, bs in parts for b in bs], reader.arrow_schema)
    want = pa.concat_tables([reference(store, reader, p) for p, _bs in parts])
    assert got.num_rows == want.num_rows == 3200
    assert by_source_and_key(got).equals(by_source_and_key(want))
    assert set(got.column("op").to_pylist()) == {"r"}
    assert got.column("before").null_count == got.num_rows


def test_a_table_version_copied_after_planning_is_read(store: str) -> None:
    reader = SnapshotReader(_Plan({"store": store, "sources": "db.flat"}))
    with BootstrapStore(store) as s:
        s.put("registry", SchemaRegistry([FLAT, FLAT_V2, LOGICAL]).to_json())
        s.fold([{"src": 1, "k": key_bytes(3), "scn": 60,
                 "ev": event(FLAT_V2, flat_row(3) | {"name": "v2"}, 60)}], [], [], 60)
    (part,) = reader.partitions()
    assert isinstance(part, IdRangePartition)
    rows = [r for b in reader.read(part) for r in b.column("after").to_pylist()]
    assert len(rows) == 2500 and rows[2]["name"] == "v2"


def test_a_table_version_with_columns_the_query_lacks_fails_the_read(store: str) -> None:
    wider = TableSchema(1, "db.flat", 3, table_schema("db", "flat", [
        ColumnSpec("id", "long", nullable=False), ColumnSpec("name", "string"),
        ColumnSpec("amount", "double"), ColumnSpec("blob", "bytes"),
        ColumnSpec("more", "string")]), ("id",))
    reader = SnapshotReader(_Plan({"store": store, "sources": "db.flat"}))
    with BootstrapStore(store) as s:
        s.put("registry", SchemaRegistry([FLAT, wider, LOGICAL]).to_json())
        s.fold([{"src": 1, "k": key_bytes(3), "scn": 60,
                 "ev": event(wider, flat_row(3) | {"more": "x"}, 60)}], [], [], 60)
    (part,) = reader.partitions()
    assert isinstance(part, IdRangePartition)
    with pytest.raises(SchemaError, match="restart the query"):
        list(reader.read(part))
