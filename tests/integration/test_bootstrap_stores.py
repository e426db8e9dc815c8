"""The bootstrap store contract on SQLite, PostgreSQL and MariaDB.

PostgreSQL and MariaDB are the session's private servers (tests/conftest.py),
used as plain targets: a fresh database per test, dropped afterwards.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import sqlalchemy as sa

from databus.bootstrap.applier import Applier
from databus.bootstrap.store import BootstrapStore, key_bytes
from databus.core import event as ev
from databus.core.checkpoint import Checkpoint
from databus.relay.relay import Relay
from tests.support.bootstrap import (
    Consumer,
    make_bootstrap,
    preload,
    wait_equal,
)
from tests.support.bulk import BulkWriter
from tests.support.relays import make_relay
from tests.support.wait import wait_until


@pytest.fixture
def store_url(sql_url: str) -> str:
    return sql_url


def window(scn: int, *changes: tuple[int, int | bytes, ev.Op, bytes]) -> tuple[int, bytes]:
    parts = [ev.encode(scn=scn, src_id=src, key=key, payload=payload, schema_id=b"s" * 8,
                       op=op) for src, key, op, payload in changes]
    return scn, b"".join(parts) + ev.encode_eop(scn)


def test_store_contract(store_url: str) -> None:
    with BootstrapStore(store_url) as store:
        assert not store.state().initialized
        big = b"x" * (3 << 20)  # a window larger than one log part
        windows = [
            window(10, (1, 1, ev.Op.INSERT, b"a1"), (1, 2, ev.Op.INSERT, b"b1"),
                   (2, b'["k",1]', ev.Op.INSERT, b"c1")),
            window(11, (1, 1, ev.Op.UPDATE, b"a2"), (1, 2, ev.Op.DELETE, b"b1")),
            window(12, (1, 3, ev.Op.INSERT, big)),
        ]
        store.append(windows[:2], Checkpoint.after(11), log_start_scn=-1)
        store.append(windows[2:], Checkpoint.after(12))
        st = store.state()
        assert (st.log_start_scn, st.log_max_scn, st.applied_scn) == (-1, 12, -1)
        assert store.producer_checkpoint() == Checkpoint.after(12).model_copy(
            update={"ts_nsecs": store.producer_checkpoint().ts_nsecs})  # type: ignore[union-attr]
        assert store.log_after(-1, 10) == windows  # bytes come back exactly, big one joined
        assert store.log_after(10, 1, upto_scn=11) == windows[1:2]

        applier = Applier(store, batch_windows=2)
        assert applier.step() == 2 and applier.step() == 1 and applier.step() == 0
        assert store.state().applied_scn == 12
        rows, last = store.snapshot_batch(1, -1, 100, 10)
        got = {ev.decode(r).key: ev.decode(r) for r in rows}
        assert set(got) == {1, 3} and got[1].payload == b"a2" and got[3].payload == big
        assert all(e.op == ev.Op.READ and e.is_snapshot for e in got.values())
        # scn < below: rows written at 11 or later are left out
        rows2, last2 = store.snapshot_batch(1, -1, 11, 10)
        assert rows2 == [] and last2 == -1
        first, first_id = store.snapshot_batch(1, -1, 100, 1)
        assert ev.decode(first[0]).key == 1 and store.snapshot_batch(1, first_id, 100, 1)[1] == last
        # an update keeps the row's id (readers resuming after an id miss nothing)
        store.append([window(13, (1, 1, ev.Op.UPDATE, b"a3"))], Checkpoint.after(13))
        applier.step()
        assert store.snapshot_batch(1, -1, 100, 1)[1] == first_id
        # truncate removes the source's rows only
        store.append([window(14, (1, 0, ev.Op.TRUNCATE, b""))], Checkpoint.after(14))
        applier.step()
        assert store.snapshot_batch(1, -1, 100, 10)[0] == []
        assert [ev.decode(r).key for r in store.snapshot_batch(2, -1, 100, 10)[0]] == [
            b'["k",1]']
        assert store.count_snapshot() == 1 == store.select_all_snapshot()


def test_long_keys_stay_unique(store_url: str) -> None:
    with BootstrapStore(store_url) as store:
        k1, k2 = b"a" * 400 + b"1", b"a" * 400 + b"2"
        assert key_bytes(k1) != key_bytes(k2) and len(key_bytes(k1)) <= 300
        store.append([window(5, (1, k1, ev.Op.INSERT, b"1"), (1, k2, ev.Op.INSERT, b"2"))],
                     Checkpoint.after(5), log_start_scn=-1)
        Applier(store).step()
        assert store.count_snapshot() == 2


def test_bootstrap_through_each_store(store_url: str, shop_db: Path, tmp_path: Path) -> None:
    """The whole path (initial load, producer, applier, server, client) on each store."""
    preload(shop_db, 1000)
    relay: Relay = make_relay(shop_db, tmp_path, capacity_bytes=1024 * 1024)
    relay.start()
    bs = make_bootstrap(shop_db, tmp_path, relay, store_url=store_url)
    bs.start()
    w = BulkWriter(shop_db, seed=31, per_tx=50)
    c = None
    try:
        w.run_until(12_000, threading.Event(), 0.001)
        # the relay copies the writer's last windows a moment later: then the oldest
        # have fallen off its 1 MiB
        wait_until(lambda: relay.buffer.min_scn > 2000, 60, "the history to fall off the relay")
        c = Consumer(relay, bs, tmp_path / "replica.db", batch=300)
        w.run_until(14_000, threading.Event(), 0.01)
        wait_equal(shop_db, tmp_path / "replica.db", [c])
    finally:
        if c is not None:
            c.stop()
        w.close()
        bs.stop()
        relay.stop()


def test_trim_keeps_what_is_recent_or_not_folded(store_url: str) -> None:
    with BootstrapStore(store_url) as store:
        store.append([window(1, (1, 1, ev.Op.INSERT, b"a")), window(2, (1, 2, ev.Op.INSERT, b"b"))],
                     Checkpoint.after(2), log_start_scn=0)
        import time

        mid = time.time_ns()
        time.sleep(0.01)
        store.append([window(3, (1, 3, ev.Op.INSERT, b"c"))], Checkpoint.after(3))
        assert store.trim(mid, upto_scn=0) is None  # nothing folded yet: nothing goes
        Applier(store).step()
        assert store.trim(mid, upto_scn=3) == 2  # windows 1, 2 are old and folded
        st = store.state()
        assert (st.log_start_scn, st.log_max_scn, st.applied_scn) == (2, 3, 3)
        assert [w[0] for w in store.log_after(-1, 10)] == [3]
        assert store.count_snapshot() == 3  # the snapshot keeps everything


def test_an_update_that_changes_an_integer_key_moves_the_row(store_url: str) -> None:
    """MariaDB sends a primary-key change as one update with the before image."""
    import json

    from databus.core.schema import ColumnSpec, MetadataCodec, SchemaRegistry, TableSchema
    from databus.core.schema import table_schema as make_schema

    schema = TableSchema(1, "db.t", 1, make_schema("db", "t", [
        ColumnSpec("id", "long", nullable=False), ColumnSpec("v", "string")]), ("id",))
    meta = MetadataCodec()
    with BootstrapStore(store_url) as store:
        store.put("registry", SchemaRegistry([schema]).to_json())
        store.put("sources", json.dumps([{"id": 1, "name": "db.t"}]))

        def row(scn: int, key: int, op: ev.Op, v: str, before: bytes | None = None) -> bytes:
            md = meta.encode({"before": before}) if before is not None else None
            return ev.encode(scn=scn, src_id=1, key=key, op=op, schema_id=schema.id,
                             payload=schema.encode({"id": key, "v": v}), metadata=md,
                             metadata_schema_id=meta.id)

        store.append([(5, row(5, 1, ev.Op.INSERT, "a") + row(5, 2, ev.Op.INSERT, "b")
                          + ev.encode_eop(5))], Checkpoint.after(5), log_start_scn=-1)
        Applier(store).step()
        # id 1 -> 10, and a plain update of 2 (same key, before image present)
        moved = row(6, 10, ev.Op.UPDATE, "a2", before=schema.encode({"id": 1, "v": "a"}))
        same = row(6, 2, ev.Op.UPDATE, "b2", before=schema.encode({"id": 2, "v": "b"}))
        store.append([(6, moved + same + ev.encode_eop(6))], Checkpoint.after(6))
        Applier(store).step()
        rows, _ = store.snapshot_batch(1, -1, 100, 10)
        got = {ev.decode(r).key: schema.decode(ev.decode(r).payload)["v"] for r in rows}
        assert got == {10: "a2", 2: "b2"}


def test_snapshot_chunks_are_the_row_reads_concatenated(
        store_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The serving read gives exactly the bytes, ids and counts of the row-by-row
    read: in id order, pages resumed after the last id, ``scn < below`` honoured,
    events larger than a chunk, and a database that does not concatenate whole."""
    import databus.bootstrap.store as store_mod

    monkeypatch.setattr(store_mod, "CHUNK_BYTES", 64 << 10)  # several chunks per page
    with BootstrapStore(store_url) as store:
        store.start_initial_load()
        # a few large rows: two together are over the 8 MiB (half its 16 MiB packet)
        # MariaDB concatenates at most, so that chunk is read row by row there
        big = {7: 200 << 10, 40: 5 << 20, 41: 5 << 20}
        rows = [{"src": 1 + (k % 2 == 0 and k > 90), "k": key_bytes(k), "scn": 5 + (k % 9 == 0),
                 "ev": ev.encode(scn=5, src_id=1, key=k, payload=bytes([k % 251]) *
                                 big.get(k, 10 + k % 50), schema_id=b"s" * 8, op=ev.Op.READ)}
                for k in range(1, 121)]
        for i in range(0, len(rows), 10):  # statements under MariaDB's packet limit
            store.load_rows(rows[i:i + 10])
        store.finish_initial_load(6)

        def reads(src: int, below: int, limit: int) -> list[tuple[bytes, int, int]]:
            out, after = [], -1
            while True:
                chunks, last, n = store.snapshot_chunks(src, after, below, limit)
                evs, last2 = store.snapshot_batch(src, after, below, limit)
                assert (b"".join(chunks), last, n) == (b"".join(evs), last2, len(evs))
                if n == 0:
                    assert chunks == [] and last == after
                    return out
                out.append((b"".join(chunks), last, n))
                after = last

        for src, below, limit in [(1, 6, 1), (1, 6, 7), (1, 7, 1000), (2, 7, 3), (3, 7, 10)]:
            got = reads(src, below, limit)
            keys = [e.key for body, _, _ in got for e in ev.iter_events(body)]
            want = sorted(k for k in range(1, 121) if 1 + (k % 2 == 0 and k > 90) == src
                          and 5 + (k % 9 == 0) < below)
            assert keys == want  # id order = insertion order here
        # MariaDB cut the 10 MiB chunk (and said so); the others concatenated it
        assert ("did not concatenate" in caplog.text) == (store.dialect in ("mysql", "mariadb"))
        # a database that gives back less than the rows' bytes: read row by row
        plain = store._concat
        monkeypatch.setattr(store, "_concat", sa.text(
            "SELECT NULL, MAX(id)" + str(plain).split(", MAX(id)", 1)[1]))
        assert reads(1, 7, 25)[0][2] == 25


def test_snapshot_id_span_is_the_lowest_and_highest_id_that_pass(store_url: str) -> None:
    """``snapshot_id_span`` equals the ends of a plain id-ordered read with the same
    scn test, also when the rows at a source's ends were written after ``upto_scn``
    (so the walk from an end of the index must skip them) or no row passes."""
    with BootstrapStore(store_url) as store:
        store.start_initial_load()
        # src 1 and 2 interleaved, src 3 alone at the top; the first and last rows of
        # src 1 and the last of src 2 are newer than the rest
        scns = {1: 9, 2: 9, 3: 5, 40: 5, 57: 8, 58: 9, 60: 9}
        rows = [{"src": 3 if k > 50 else 1 + k % 2, "k": key_bytes(k), "scn": scns.get(k, 5),
                 "ev": ev.encode(scn=5, src_id=1, key=k, payload=b"p", schema_id=b"s" * 8,
                                 op=ev.Op.READ)} for k in range(1, 61)]
        store.load_rows(rows)
        store.finish_initial_load(9)
        for sources in ([1], [2], [3], [1, 2], [2, 3], [1, 2, 3], [4]):
            for upto in (4, 5, 7, 8, 9):
                page = store.snapshot_page(sources, -1, (1 << 63) - 1, upto, 1000)
                want = (page[0][0], page[-1][0]) if page else (0, -1)
                assert store.snapshot_id_span(sources, upto) == want, (sources, upto)
