"""ReplicateSink into SQLite, PostgreSQL and MariaDB: state, exactly-once, types.

PostgreSQL and MariaDB are the session's private servers (tests/conftest.py):
a fresh database per test, dropped afterwards.
"""

from __future__ import annotations

import datetime as dt
import decimal
import random
import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from databus.client import (
    ClientConfig,
    DatabusClient,
    MemoryCheckpointStore,
    ReplicateSink,
)
from databus.core import event as ev
from databus.core.errors import RetriesExhaustedError
from databus.core.schema import ColumnSpec, TableSchema, table_schema
from tests.support.memrelay import (
    CUSTOMERS,
    ITEMS,
    MemoryRelay,
    data_event,
)
from tests.support.sql import sql_engine


@pytest.fixture
def target(sql_url: str) -> str:
    return sql_url


def _rows(url: str, table: str, order: str) -> list[tuple[Any, ...]]:
    with sql_engine(url) as engine, engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(f"SELECT * FROM {table} ORDER BY {order}"))]


class Model:
    """Expected target state, fed the same changes as the relay."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.customers: dict[int, tuple[Any, ...]] = {}
        self.items: dict[tuple[int, int], tuple[Any, ...]] = {}

    def window(self, scn: int) -> list[bytes]:
        rng = self.rng
        out: list[bytes] = []
        for _ in range(rng.randrange(1, 12)):
            if rng.random() < 0.5:
                cid = rng.randrange(1, 40)
                if cid in self.customers and rng.random() < 0.3:
                    old = self.customers.pop(cid)
                    out.append(data_event(CUSTOMERS, scn, ev.Op.DELETE,
                                          {"id": cid, "name": old[1], "balance": old[2]}))
                else:
                    op = ev.Op.UPDATE if cid in self.customers else ev.Op.INSERT
                    row = {"id": cid, "name": f"n{scn}-{rng.randrange(99)} ✓",
                           "balance": rng.choice([None, rng.random() * 100])}
                    self.customers[cid] = (cid, row["name"], row["balance"])
                    out.append(data_event(CUSTOMERS, scn, op, row))
            else:
                key = (rng.randrange(1, 6), rng.randrange(1, 4))
                if key in self.items and rng.random() < 0.3:
                    old_item = self.items.pop(key)
                    out.append(data_event(ITEMS, scn, ev.Op.DELETE, dict(zip(
                        ["order_id", "line", "sku", "qty"], old_item, strict=True))))
                else:
                    op = ev.Op.UPDATE if key in self.items else ev.Op.INSERT
                    row = {"order_id": key[0], "line": key[1], "sku": f"s{scn}",
                           "qty": rng.randrange(100)}
                    self.items[key] = (key[0], key[1], row["sku"], row["qty"])
                    out.append(data_event(ITEMS, scn, op, row))
        return out


def _client(relay: MemoryRelay, sink: ReplicateSink, **kw: Any) -> DatabusClient:
    cfg = ClientConfig(relay=relay.url, poll_timeout=0.1, backoff_initial=0.01,
                       backoff_max=0.02, **kw)
    return DatabusClient(cfg, sink)


def _close(a: float | None, b: float | None) -> bool:
    return a == b if a is None or b is None else abs(a - b) < 1e-9


def _check_state(url: str, model: Model) -> None:
    got_c = _rows(url, "customers", "id")
    want_c = [model.customers[k] for k in sorted(model.customers)]
    assert [(r[0], r[1]) for r in got_c] == [(r[0], r[1]) for r in want_c]
    assert all(_close(g[2], w[2]) for g, w in zip(got_c, want_c, strict=True))
    assert _rows(url, "items", "order_id, line") == [model.items[k] for k in sorted(model.items)]


def test_replicates_two_tables_exactly_once(memrelay: MemoryRelay, target: str) -> None:
    model = Model(seed=7)
    scns = list(range(100, 3100, 100))
    for scn in scns:
        memrelay.add_window(scn, model.window(scn))
    with ReplicateSink(target) as sink:
        _client(memrelay, sink, fetch_size=2048).run(max_windows=len(scns))
        assert sink.windows_applied == len(scns)
    _check_state(target, model)
    with sql_engine(target) as engine:
        with engine.connect() as conn:
            row = conn.execute(sa.text("SELECT name, checkpoint FROM databus_checkpoint")).one()
        assert row[0] == "replicate" and '"windowScn":3000' in row[1]
        # key columns form the primary key
        pk = sa.inspect(engine).get_pk_constraint("items")["constrained_columns"]
        assert pk == ["order_id", "line"]

    # a replay of every window (a consumer that lost its position) changes nothing
    with ReplicateSink(target) as again:
        DatabusClient(ClientConfig(relay=memrelay.url, poll_timeout=0.1), again,
                      MemoryCheckpointStore()).run(max_windows=len(scns))
        assert again.windows_skipped == len(scns) and again.windows_applied == 0
    _check_state(target, model)

    # restarting loads the position from the target: only new windows are applied
    memrelay.add_window(5000, model.window(5000))
    with ReplicateSink(target) as third:
        client = _client(memrelay, third)
        client.run(max_windows=1)
        assert third.windows_applied == 1 and third.windows_skipped == 0
        assert client.stats.last_scn == 5000
    _check_state(target, model)


def test_a_failing_window_is_not_half_applied(memrelay: MemoryRelay, target: str) -> None:
    # the target already has items, with a CHECK the stream will violate
    with sql_engine(target) as engine, engine.begin() as conn:
        conn.execute(sa.text(
            "CREATE TABLE items (order_id BIGINT NOT NULL, line INTEGER NOT NULL, "
            "sku VARCHAR(50), qty INTEGER CHECK (qty < 1000), PRIMARY KEY (order_id, line))"))
    ok = data_event(CUSTOMERS, 10, ev.Op.INSERT, {"id": 1, "name": "a", "balance": 1.0})
    memrelay.add_window(10, [ok])
    memrelay.add_window(20, [
        data_event(CUSTOMERS, 20, ev.Op.INSERT, {"id": 2, "name": "b", "balance": None}),
        data_event(ITEMS, 20, ev.Op.INSERT, {"order_id": 1, "line": 1, "sku": "x", "qty": 5}),
        data_event(ITEMS, 20, ev.Op.INSERT, {"order_id": 1, "line": 2, "sku": "y", "qty": 5000}),
    ])
    with ReplicateSink(target) as sink:
        with pytest.raises(RetriesExhaustedError, match="window 20"):
            _client(memrelay, sink, max_retries=1).run()
        assert sink.windows_applied == 1
    assert [r[0] for r in _rows(target, "customers", "id")] == [1]
    assert _rows(target, "items", "order_id") == []
    with ReplicateSink(target) as sink:
        cp = sink.load()
        assert cp is not None and cp.window_scn == 10


WIDE = TableSchema(src_id=3, name="app.wide", version=1, avro=table_schema("app", "wide", [
    ColumnSpec("code", "string", nullable=False),
    ColumnSpec("n", "long", nullable=False),
    ColumnSpec("flag", "boolean"),
    ColumnSpec("ratio", "double"),
    ColumnSpec("small", "float"),
    ColumnSpec("price", {"type": "bytes", "logicalType": "decimal", "precision": 12,
                         "scale": 3}),
    ColumnSpec("day", {"type": "int", "logicalType": "date"}),
    ColumnSpec("at", {"type": "long", "logicalType": "timestamp-micros"}),
    ColumnSpec("clock", {"type": "long", "logicalType": "time-micros"}),
    ColumnSpec("uid", {"type": "string", "logicalType": "uuid"}),
    ColumnSpec("blob", "bytes"),
    ColumnSpec("mixed", ["long", "string"]),
    ColumnSpec("full name", "string"),
]), key_columns=("code", "n"))


def test_types_truncate_key_change_and_new_columns(target: str) -> None:
    with MemoryRelay(schemas=[WIDE], sources=[(3, "app.wide")]) as relay:
        uid = uuid.uuid4()
        at = dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=dt.UTC)
        row = {"code": "k€y", "n": 1, "flag": True, "ratio": 2.5, "small": 0.5,
               "price": decimal.Decimal("1234.567"), "day": dt.date(2024, 2, 29), "at": at,
               "clock": dt.time(23, 59, 58, 999999), "uid": uid, "blob": b"\x00\xffz",
               "mixed": 42, "full_name": "Ada"}
        second = {**row, "n": 2, "mixed": "text", "flag": None, "blob": None}
        relay.add_window(1, [data_event(WIDE, 1, ev.Op.INSERT, row),
                             data_event(WIDE, 1, ev.Op.INSERT, second)])
        # an update that changes the key removes the old row
        moved = {**second, "n": 3}
        relay.add_window(2, [data_event(WIDE, 2, ev.Op.UPDATE, moved, before=second)])
        with ReplicateSink(target, sources=["wide"]) as sink:
            _client(relay, sink).run(max_windows=2)
        got = _rows(target, "wide", "n")
        assert [r[:2] for r in got] == [("k€y", 1), ("k€y", 3)]
        r = got[0]
        assert r[2] in (True, 1) and r[3] == 2.5 and r[4] == 0.5
        assert decimal.Decimal(str(r[5])) == decimal.Decimal("1234.567")
        assert str(r[6]) == "2024-02-29"
        at_got = r[7] if isinstance(r[7], dt.datetime) else dt.datetime.fromisoformat(r[7])
        assert at_got.replace(tzinfo=None) == at.replace(tzinfo=None)
        assert str(r[8]).startswith("23:59:58")
        assert str(r[9]).replace("-", "") == uid.hex
        assert bytes(r[10]) == b"\x00\xffz" and str(r[11]) == "42" and r[12] == "Ada"
        assert got[1][11] == "text" and got[1][10] is None

        # a new table version with one more column, then a truncate
        v2 = TableSchema(src_id=3, name="app.wide", version=2, avro=table_schema(
            "app", "wide", [*_specs(WIDE), ColumnSpec("extra", "long")]),
            key_columns=("code", "n"))
        relay.registry.add(v2)
        relay.add_window(3, [data_event(v2, 3, ev.Op.INSERT, {**row, "n": 9, "extra": 7})])
        with ReplicateSink(target) as sink:
            _client(relay, sink).run(max_windows=1)
        got = _rows(target, "wide", "n")
        assert [(g[1], g[-1]) for g in got] == [(1, None), (3, None), (9, 7)]
        truncate = ev.encode(scn=4, src_id=3, key=0, payload=b"", schema_id=v2.id,
                             schema_version=2, op=ev.Op.TRUNCATE)
        relay.add_window(4, [truncate, data_event(v2, 4, ev.Op.INSERT,
                                                  {**row, "n": 10, "extra": 1})])
        with ReplicateSink(target) as sink:
            _client(relay, sink).run(max_windows=1)
        assert [g[1] for g in _rows(target, "wide", "n")] == [10]


def _specs(schema: TableSchema) -> list[ColumnSpec]:
    out = []
    for f in schema.avro["fields"]:
        t = f["type"]
        nullable = isinstance(t, list) and "null" in t
        if nullable:
            rest = [b for b in t if b != "null"]
            t = rest[0] if len(rest) == 1 else rest
        out.append(ColumnSpec(f.get("column", f["name"]), t, nullable=nullable))
    return out


def test_unreachable_target_is_retried(memrelay: MemoryRelay, tmp_path: Path) -> None:
    """Missing at start (load is retried), then locked mid-run (the window is replayed)."""
    import sqlite3
    import threading
    import time

    db = tmp_path / "later" / "replica.db"
    url = f"sqlite:///{db}?timeout=0.05"
    memrelay.add_window(10, [data_event(CUSTOMERS, 10, ev.Op.INSERT,
                                        {"id": 1, "name": "a", "balance": None})])
    memrelay.add_window(20, [data_event(CUSTOMERS, 20, ev.Op.INSERT,
                                        {"id": 2, "name": "b", "balance": None})])
    locker: list[sqlite3.Connection] = []
    releaser: list[threading.Thread] = []

    class LockBefore20(ReplicateSink):
        def on_start_data_event_sequence(self, scn: int) -> None:
            if scn == 20 and not locker:  # another writer holds the database for a while
                con = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
                con.execute("BEGIN EXCLUSIVE")
                locker.append(con)

                def release() -> None:
                    time.sleep(0.3)
                    con.execute("COMMIT")
                    con.close()

                releaser.append(threading.Thread(target=release))
                releaser[0].start()
            super().on_start_data_event_sequence(scn)

    threading.Timer(0.2, lambda: db.parent.mkdir()).start()
    with LockBefore20(url) as sink:
        client = _client(memrelay, sink, max_retries=50)
        client.run(max_windows=2)
        assert client.stats.relay_errors >= 1  # the start-up load was retried
        assert client.stats.rollbacks >= 1  # window 20 was rolled back and replayed
        assert sink.windows_applied == 2
    releaser[0].join(10)  # the other writer has let go
    assert [r[0] for r in _rows(url, "customers", "id")] == [1, 2]
