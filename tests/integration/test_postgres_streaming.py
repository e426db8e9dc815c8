"""Protocol 2: transactions larger than ``logical_decoding_work_mem`` streamed by the server
while they run, delivered by the source as one whole window at their commit.

A private PostgreSQL 15 with ``logical_decoding_work_mem = 64kB`` (its minimum), so a
few hundred rows already stream; the source holds 32 KiB of streamed messages in
memory and spills the rest to a file in its state directory. The server's own
counters (``pg_stat_replication_slots``) show that it did stream.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from databus.core import event as ev
from databus.core.window import Window
from databus.sources.postgres import fastpath
from databus.sources.postgres.source import PostgresSource
from tests.support.postgres import SETTINGS, PostgreSQL
from tests.support.sources import source_config

WORK_MEM = {**SETTINGS, "logical_decoding_work_mem": "64kB"}


@pytest.fixture(scope="module")
def server() -> Iterator[PostgreSQL]:
    with PostgreSQL(settings=WORK_MEM) as pg:
        yield pg


@pytest.fixture()
def db(server: PostgreSQL) -> Iterator[str]:
    with server.fresh_database("pgstream") as url:
        yield url.rsplit("/", 1)[1]  # its slots are dropped with it


def connect(server: PostgreSQL, db: str, autocommit: bool = True) -> psycopg.Connection[Any]:
    return psycopg.connect(f"host=127.0.0.1 port={server.port} user=postgres dbname={db}",
                           autocommit=autocommit)


def make_source(server: PostgreSQL, db: str, state: Path, *, compiled: bool | None = None,
                name: str = "s") -> PostgresSource:
    cfg = source_config(server.source_url(db), [r"public\..*"], snapshot_mode="no_data",
                        create_publication=True)
    src = PostgresSource(cfg, name=name, state_dir=state, compiled=compiled,
                         stream_memory=32 * 1024)
    src.open()
    return src


def keys_of(w: Window) -> list[tuple[str, int | bytes]]:
    return [(e.op.letter, e.key) for e in ev.iter_events(w.events)]


def read_all(src: PostgresSource, after: int, seconds: float) -> list[Window]:
    """Every window with events read within ``seconds``."""
    out: list[Window] = []
    stop = threading.Event()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for w in src.read(after, stop, 0.3):
            after = w.scn
            if w.count:
                out.append(w)
    return out


def read_until(src: PostgresSource, after: int, want: int, timeout: float = 60.0
               ) -> list[Window]:
    out: list[Window] = []
    stop = threading.Event()
    deadline = time.monotonic() + timeout
    while len(out) < want:
        assert time.monotonic() < deadline, f"{len(out)} windows of {want}"
        for w in src.read(after, stop, 0.5):
            after = w.scn
            if w.count:
                out.append(w)
    return out


def streamed_count(server: PostgreSQL, db: str) -> int:
    with connect(server, db) as con:
        row = con.execute("SELECT coalesce(sum(stream_txns), 0) FROM pg_stat_replication_slots"
                          " s JOIN pg_replication_slots r USING (slot_name)"
                          " WHERE r.database = current_database()").fetchone()
    return int(row[0]) if row else 0


def test_large_transaction_streamed_is_one_window_at_its_commit_without_aborted_parts(
        server: PostgreSQL, db: str, tmp_path: Path) -> None:
    with connect(server, db) as con:
        con.execute("CREATE TABLE big (id int PRIMARY KEY, pad text)")
        con.execute("CREATE TABLE small (id int PRIMARY KEY)")
    src = make_source(server, db, tmp_path)
    assert src.read(-1, threading.Event(), 0.2) == []  # the slot: changes from here on
    pad = "p" * 200
    with connect(server, db, autocommit=False) as large, connect(server, db) as other:
        windows, early = _large_transaction(server, db, src, large, other, pad)
    src.close()
    # the same WAL through the other decoder: the same bytes (C reads streamed changes
    # with their transaction id in front)
    if fastpath.available():
        again = make_source(server, db, tmp_path / "py", compiled=False)
        replay = read_until(again, -1, 5)
        again.close()
        assert [(w.scn, w.events) for w in replay] == \
            [(w.scn, w.events) for w in [*early, *windows]]
    assert list(tmp_path.glob("databus-pg-stream-*")) == []  # spill files unlinked


def _large_transaction(server: PostgreSQL, db: str, src: PostgresSource,
                       large: psycopg.Connection[Any], other: psycopg.Connection[Any],
                       pad: str) -> tuple[list[Window], list[Window]]:
    expected: list[int] = []

    def rows(a: int, b: int, keep: bool) -> None:
        large.execute("INSERT INTO big SELECT g, %s FROM generate_series(%s::int, %s::int) g",
                      [pad, a, b - 1])
        if keep:
            expected.extend(range(a, b))

    rows(0, 600, True)
    large.execute("SAVEPOINT s1")
    rows(1000, 1600, False)
    large.execute("ROLLBACK TO SAVEPOINT s1")  # a subtransaction abort
    other.execute("INSERT INTO small VALUES (1)")  # commits while the large one runs
    rows(2000, 2400, True)
    large.execute("SAVEPOINT s2")
    rows(3000, 3400, True)
    large.execute("RELEASE SAVEPOINT s2")  # kept
    large.execute("SAVEPOINT a")
    rows(4000, 4300, False)
    large.execute("SAVEPOINT b")
    rows(5000, 5300, False)
    large.execute("RELEASE SAVEPOINT b")
    large.execute("ROLLBACK TO SAVEPOINT a")  # a, and b inside it
    rows(6000, 6500, True)
    large.execute("UPDATE big SET pad = 'u' WHERE id < 100")
    other.execute("INSERT INTO small VALUES (2)")
    # the large transaction runs: only the small ones are delivered meanwhile
    early = read_all(src, -1, 3.0)
    assert [keys_of(w) for w in early] == [[("c", 1)], [("c", 2)]]
    assert src.stats()["streams_open"] == 1.0
    assert streamed_count(server, db) >= 1  # the server did stream it
    large.commit()
    other.execute("INSERT INTO small VALUES (3)")
    # an aborted large transaction: never delivered
    with connect(server, db, autocommit=False) as gone:
        gone.execute("INSERT INTO big SELECT g, %s FROM generate_series(10000, 12000) g",
                     [pad])
        gone.rollback()
    other.execute("INSERT INTO small VALUES (4)")
    windows = read_until(src, early[-1].scn, 3)
    big, three, four = windows
    assert keys_of(big) == [("c", i) for i in expected] + [("u", i) for i in range(100)]
    assert keys_of(three) == [("c", 3)] and keys_of(four) == [("c", 4)]
    assert early[-1].scn < big.scn < three.scn < four.scn
    stats = src.stats()
    assert stats["streamed_transactions_total"] == 1.0
    assert stats["streamed_aborts_total"] >= 1.0
    assert stats["stream_spilled_bytes_total"] > 0 and stats["streams_open"] == 0.0
    return windows, early


def test_relation_described_in_an_aborted_subtransaction_still_decodes(
        server: PostgreSQL, db: str, tmp_path: Path) -> None:
    """The server describes a table once per streamed transaction; when that Relation
    message came inside a subtransaction later rolled back, it is kept."""
    with connect(server, db) as con:
        con.execute("CREATE TABLE t (id int PRIMARY KEY, pad text)")
    src = make_source(server, db, tmp_path)
    assert src.read(-1, threading.Event(), 0.2) == []
    with connect(server, db, autocommit=False) as con:
        con.execute("SAVEPOINT s")
        con.execute("INSERT INTO t SELECT g, repeat('x', 300) FROM generate_series(1, 800) g")
        con.execute("ROLLBACK TO SAVEPOINT s")
        con.execute("INSERT INTO t SELECT g, repeat('y', 300) FROM generate_series(2000, 2800)"
                    " g")
        con.commit()
    (w,) = read_until(src, -1, 1)
    assert keys_of(w) == [("c", i) for i in range(2000, 2801)]
    assert streamed_count(server, db) >= 1
    src.close()


def test_stream_spool_abort_keeps_only_what_came_before(tmp_path: Path) -> None:
    """The spool alone: subtransaction aborts in memory, across the spill boundary and in
    the file; Relation messages of an aborted part kept."""
    from databus.sources.postgres.streams import Budget, Spool

    budget = Budget(100)
    spool = Spool(7, budget, tmp_path)

    def msg(t: bytes, xid: int, n: int) -> bytes:
        return t + xid.to_bytes(4, "big") + json.dumps(n).encode().ljust(20)

    for i in range(3):
        spool.append(msg(b"I", 7, i), 7)  # 3 x 25 bytes in memory
    spool.append(msg(b"I", 8, 3), 8)  # 100 bytes: still in memory
    spool.append(msg(b"R", 8, 4), 8)  # spilled from here on
    spool.append(msg(b"I", 9, 5), 9)
    spool.append(msg(b"I", 9, 6), 9)
    spool.abort_subxact(9)  # in the file
    assert [m[5:].strip() for m in spool.messages()] == [b"0", b"1", b"2", b"3", b"4"]
    spool.append(msg(b"I", 10, 7), 10)
    spool.abort_subxact(8)  # from memory on: the Relation message kept
    assert [m[:1] + m[5:].strip() for m in spool.messages()] == \
        [b"I0", b"I1", b"I2", b"R4"]
    assert spool.spilled_bytes > 0
    spool.close()
    assert budget.used == 0
