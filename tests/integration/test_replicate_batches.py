"""The replicate sink in batches (many windows per target transaction), into SQLite,
PostgreSQL and MariaDB: what lands is what the source committed, in its order; the
target's checkpoint decides what a batch leaves out; a failing batch is applied again
window by window; a batch is committed within its linger while the source is quiet.
"""

from __future__ import annotations

import json
import random
import threading
import time
from typing import Any

import pytest
import sqlalchemy as sa

from databus.client import DatabusClient, MemoryCheckpointStore, ReplicateSink
from databus.client.config import BatchConfig, ReplicateConfig
from databus.client.sinks.apply import COPY_MIN
from databus.core import event as ev
from databus.core.errors import RetriesExhaustedError
from tests.support.memrelay import CUSTOMERS, ITEMS, MemoryRelay, data_event
from tests.support.sql import sql_engine
from tests.support.wait import wait_until

Op = ev.Op
ONE_BATCH = BatchConfig(rows=1_000_000, bytes=1 << 30, linger=60)


def _client(relay: MemoryRelay, sink: ReplicateSink, **kw: Any) -> DatabusClient:
    """A client as ``databus replicate`` makes it: the sink says when to save."""
    cfg = ReplicateConfig(relay=relay.url, poll_timeout=0.1, backoff_initial=0.01,
                          backoff_max=0.02, **kw)
    return DatabusClient(cfg.client_config(), sink)


def _rows(url: str, table: str, order: str) -> list[tuple[Any, ...]]:
    with sql_engine(url) as engine, engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(f"SELECT * FROM {table} ORDER BY {order}"))]


def _checkpoint_scn(url: str) -> int:
    """The window SCN of the checkpoint committed in the target (-1: none yet)."""
    try:
        with sql_engine(url) as engine, engine.connect() as conn:
            text = conn.execute(sa.text("SELECT checkpoint FROM databus_checkpoint")).scalar()
    except sa.exc.DBAPIError:  # no checkpoint table yet
        return -1
    return -1 if text is None else int(json.loads(str(text))["windowScn"])


class Source:
    """The source's tables as a model, and the events of what it commits."""

    def __init__(self) -> None:
        self.customers: dict[int, tuple[Any, ...]] = {}
        self.items: dict[tuple[int, int], tuple[Any, ...]] = {}
        self.items_written = False

    def put(self, scn: int, cid: int, name: str, *, before: int | None = None) -> bytes:
        """Insert or update customer ``cid``; ``before``: the key it had (a key change
        sent as one update with its before image)."""
        row = {"id": cid, "name": name, "balance": float(cid)}
        old = None
        if before is not None:
            prev = self.customers.pop(before)
            old = {"id": before, "name": prev[1], "balance": prev[2]}
        op = Op.UPDATE if cid in self.customers or before is not None else Op.INSERT
        self.customers[cid] = (cid, name, float(cid))
        return data_event(CUSTOMERS, scn, op, row, before=old)

    def delete(self, scn: int, cid: int) -> bytes:
        _, name, balance = self.customers.pop(cid)
        return data_event(CUSTOMERS, scn, Op.DELETE, {"id": cid, "name": name,
                                                       "balance": balance})

    def put_item(self, scn: int, order: int, line: int, qty: int) -> bytes:
        op = Op.UPDATE if (order, line) in self.items else Op.INSERT
        self.items_written = True
        self.items[(order, line)] = (order, line, f"s{order}", qty)
        return data_event(ITEMS, scn, op, {"order_id": order, "line": line,
                                           "sku": f"s{order}", "qty": qty})

    def delete_item(self, scn: int, order: int, line: int) -> bytes:
        _, _, sku, qty = self.items.pop((order, line))
        return data_event(ITEMS, scn, Op.DELETE, {"order_id": order, "line": line,
                                                  "sku": sku, "qty": qty})

    def truncate_items(self, scn: int) -> bytes:
        self.items.clear()
        return ev.encode(scn=scn, src_id=ITEMS.src_id, key=0, payload=b"",
                         schema_id=ITEMS.id, schema_version=ITEMS.version, op=Op.TRUNCATE)

    def check(self, url: str) -> None:
        got = _rows(url, "customers", "id")
        assert [(r[0], r[1]) for r in got] == [
            (c[0], c[1]) for _, c in sorted(self.customers.items())]
        if self.items_written:
            assert _rows(url, "items", "order_id, line") == [
                v for _, v in sorted(self.items.items())]


def test_one_batch_applies_what_the_source_committed(memrelay: MemoryRelay,
                                                     sql_url: str) -> None:
    """Inserts, a key change sent as one update, a key change sent as a delete and an
    insert, a delete then a re-insert of the same key, a truncate between changes of
    its table, and enough rows for PostgreSQL's COPY: all in ONE target transaction."""
    s = Source()
    bulk = range(100, 100 + COPY_MIN + 50)
    memrelay.add_window(10, [s.put(10, 1, "a"), s.put(10, 2, "b"), s.put_item(10, 1, 1, 5),
                             *[s.put(10, i, f"bulk{i}") for i in bulk]])
    memrelay.add_window(20, [s.put(20, 5, "a moved", before=1)])  # key 1 -> 5
    memrelay.add_window(30, [s.delete(30, 2), s.put(30, 2, "b again")])
    memrelay.add_window(40, [s.put_item(40, 1, 1, 6), s.delete_item(40, 1, 1),  # (1,1) ->
                             s.put_item(40, 1, 2, 6)])                         # (1,2)
    memrelay.add_window(50, [s.put_item(50, 3, 1, 1), s.truncate_items(50),
                             s.put_item(50, 2, 1, 7)])
    memrelay.add_window(60, [s.put(60, 5, "a moved twice"),
                             *[s.delete(60, i) for i in bulk if i % 2],
                             s.put(60, 200, "updated")])
    memrelay.add_window(70, [s.put(70, 1, "old key again"), s.delete(70, 2)])
    memrelay.add_window(80, [s.put(80, 2, "re-inserted after its delete")])
    with ReplicateSink(sql_url, batch=ONE_BATCH) as sink:
        _client(memrelay, sink).run(max_windows=8)
        assert sink.windows_applied == 8 and sink.batches_committed == 1
    s.check(sql_url)
    assert _checkpoint_scn(sql_url) == 80


def test_windows_of_tables_in_shape_go_in_bulk_as_the_source_committed(
        memrelay: MemoryRelay, sql_url: str) -> None:
    """The same changes once the tables exist: the answer's windows reach the sink in one
    ``on_windows`` call and one batch (each table's net change in bulk, a key change and
    a truncate keeping their order), and land as the source committed them."""
    s = Source()
    memrelay.add_window(10, [s.put(10, 1, "a"), s.put(10, 2, "b"), s.put_item(10, 1, 1, 5)])
    sink = ReplicateSink(sql_url, batch=ONE_BATCH)
    _client(memrelay, sink).run(max_windows=1)  # creates the tables
    bulk = range(100, 100 + COPY_MIN + 50)
    memrelay.add_window(15, [s.put(15, i, f"bulk{i}") for i in bulk])
    memrelay.add_window(20, [s.put(20, 5, "a moved", before=1)])  # key 1 -> 5
    memrelay.add_window(30, [s.delete(30, 2), s.put(30, 2, "b again")])
    memrelay.add_window(40, [s.put_item(40, 1, 1, 6), s.delete_item(40, 1, 1),
                             s.put_item(40, 1, 2, 6)])
    memrelay.add_window(50, [s.put_item(50, 3, 1, 1), s.truncate_items(50),
                             s.put_item(50, 2, 1, 7)])
    memrelay.add_window(60, [s.put(60, 5, "a moved twice"),
                             *[s.delete(60, i) for i in bulk if i % 2],
                             s.put(60, 200, "updated")])
    memrelay.add_window(70, [s.put(70, 1, "old key again"), s.delete(70, 2)])
    memrelay.add_window(80, [s.put(80, 2, "re-inserted after its delete")])
    memrelay.add_window(90, [s.put(90, i, f"again{i}") for i in bulk if not i % 2])
    memrelay.add_window(95, [s.put(95, 300, "moved from 200", before=200)])
    with sink:
        _client(memrelay, sink).run(max_windows=10)
        assert (sink.windows_applied, sink.batches_committed) == (11, 2)
        assert sink.windows_in_bulk == 10
    s.check(sql_url)
    assert _checkpoint_scn(sql_url) == 95


def test_copy_upserts_on_both_sides_of_a_truncate_in_one_batch(memrelay: MemoryRelay,
                                                               sql_url: str) -> None:
    """Enough rows for PostgreSQL's COPY before a truncate of their table and after it,
    in one transaction: the rows before the truncate stay gone (the temporary table the
    first COPY filled is emptied before the second)."""
    s = Source()
    memrelay.add_window(10, [s.put(10, 1, "a"), s.put_item(10, 1, 1, 1)])
    sink = ReplicateSink(sql_url, batch=ONE_BATCH)
    _client(memrelay, sink).run(max_windows=1)  # creates the tables
    lines = range(1, COPY_MIN + 20)
    memrelay.add_window(20, [s.put_item(20, 100, i, 1) for i in lines])
    memrelay.add_window(30, [s.truncate_items(30), *[s.put_item(30, 200, i, 2) for i in lines]])
    with sink:
        _client(memrelay, sink).run(max_windows=2)
        assert sink.batches_committed == 2 and sink.windows_in_bulk == 2
    s.check(sql_url)


def _random_windows(relay: MemoryRelay, s: Source, seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    scns = []
    for w in range(1, n + 1):
        scn = w * 10
        events = []
        for _ in range(rng.randrange(1, 9)):
            r = rng.random()
            cid = rng.randrange(1, 25)
            if r < 0.02:
                events.append(s.truncate_items(scn))
            elif r < 0.3:
                line = (rng.randrange(1, 4), rng.randrange(1, 3))
                if line in s.items and rng.random() < 0.4:
                    events.append(s.delete_item(scn, *line))
                else:
                    events.append(s.put_item(scn, *line, qty=rng.randrange(50)))
            elif cid in s.customers and r < 0.45:
                events.append(s.delete(scn, cid))
            elif cid in s.customers and r < 0.55:
                new = rng.randrange(25, 40)
                if new not in s.customers:
                    events.append(s.put(scn, new, f"moved{scn}", before=cid))
            else:
                events.append(s.put(scn, cid, f"n{scn}-{rng.randrange(99)}"))
        relay.add_window(scn, events)
        scns.append(scn)
    return scns


def test_random_windows_in_batches_equal_the_source(memrelay: MemoryRelay,
                                                    sql_url: str) -> None:
    s = Source()
    scns = _random_windows(memrelay, s, seed=3, n=300)
    with ReplicateSink(sql_url, batch=BatchConfig(rows=40, linger=60)) as sink:
        _client(memrelay, sink, fetch_size=16 * 1024).run(max_windows=len(scns))
        assert sink.windows_applied == len(scns)
        assert 10 < sink.batches_committed < len(scns)  # batches of several windows
        assert sink.windows_in_bulk > len(scns) // 2  # answers of tables in shape
    s.check(sql_url)
    assert _checkpoint_scn(sql_url) == scns[-1]


def test_windows_the_target_holds_are_left_out_of_a_batch(memrelay: MemoryRelay,
                                                          sql_url: str) -> None:
    s = Source()
    for scn in (10, 20, 30):
        memrelay.add_window(scn, [s.put(scn, scn, f"v{scn}"), s.put_item(scn, scn, 1, 1)])
    with ReplicateSink(sql_url, batch=ONE_BATCH) as sink:
        _client(memrelay, sink).run(max_windows=3)
        assert (sink.windows_applied, sink.batches_committed) == (3, 1)
        # windows 40 and 50 change rows of windows 10 and 20 again; a consumer that lost
        # its position (a store of its own) replays 10..50 in one batch: 10..30 are in
        # the target and stay out of it, 40 and 50 go in
        memrelay.add_window(40, [s.put(40, 10, "v40")])
        memrelay.add_window(50, [s.delete(50, 20)])
        cfg = ReplicateConfig(relay=memrelay.url, poll_timeout=0.1)
        DatabusClient(cfg.client_config(), sink, MemoryCheckpointStore()).run(max_windows=5)
        assert (sink.windows_skipped, sink.windows_applied, sink.batches_committed) == (3, 5, 2)
    s.check(sql_url)
    assert _checkpoint_scn(sql_url) == 50


def test_a_failing_batch_is_applied_again_window_by_window(memrelay: MemoryRelay,
                                                           sql_url: str) -> None:
    with sql_engine(sql_url) as engine, engine.begin() as conn:
        conn.execute(sa.text(
            "CREATE TABLE items (order_id BIGINT NOT NULL, line INTEGER NOT NULL, "
            "sku VARCHAR(50), qty INTEGER CHECK (qty < 1000), PRIMARY KEY (order_id, line))"))
    s = Source()
    memrelay.add_window(10, [s.put(10, 1, "a")])
    memrelay.add_window(20, [s.put(20, 2, "b"), s.put_item(20, 1, 1, 5)])
    memrelay.add_window(30, [s.put(30, 3, "c"), s.put_item(30, 1, 2, 5000)])  # CHECK fails
    memrelay.add_window(40, [s.put(40, 4, "d")])
    with ReplicateSink(sql_url, batch=ONE_BATCH) as sink:
        with pytest.raises(RetriesExhaustedError, match="window 30"):
            _client(memrelay, sink, max_retries=2).run()
        assert sink.windows_applied == 2  # 10 and 20, each on its own after the batch failed
    assert [r[0] for r in _rows(sql_url, "customers", "id")] == [1, 2]
    assert _rows(sql_url, "items", "order_id") == [(1, 1, "s1", 5)]
    assert _checkpoint_scn(sql_url) == 20


def test_a_batch_is_committed_within_its_linger_while_the_source_is_quiet(
        memrelay: MemoryRelay, sql_url: str) -> None:
    s = Source()
    memrelay.add_window(10, [s.put(10, 1, "a")])
    with ReplicateSink(sql_url, batch=BatchConfig(linger=0.2)) as sink:
        cfg = ReplicateConfig(relay=memrelay.url, poll_timeout=5)  # no idle save for 5 s
        client = DatabusClient(cfg.client_config(), sink)
        stop = threading.Event()
        runner = threading.Thread(target=client.run, kwargs={"stop": stop})
        runner.start()
        try:
            wait_until(lambda: _checkpoint_scn(sql_url) == 10, 10, "window 10 committed")
            memrelay.add_window(20, [s.put(20, 2, "b")])
            t0 = time.monotonic()
            wait_until(lambda: _checkpoint_scn(sql_url) == 20, 10, "window 20 committed")
            assert time.monotonic() - t0 < 3.0
            assert client.stats.checkpoints == 0  # the client itself saved nothing yet
        finally:
            stop.set()
            runner.join(60)
    s.check(sql_url)
