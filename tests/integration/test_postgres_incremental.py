"""Incremental (signal) snapshots of the PostgreSQL source under concurrent writers: a
consumer that applies the stream and the ``r`` events in order ends with the table
PostgreSQL holds, across a source restart in the middle of the snapshot; bad signals
are ERROR notices and never stop streaming."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from databus.core import event as ev
from databus.core.errors import InvalidRequestError
from databus.core.window import Window
from databus.sources.common.names import source_id
from databus.sources.postgres.source import NOTIFICATIONS, PostgresSource
from tests.support.postgres import PostgreSQL
from tests.support.sources import source_config

NOTIFY_SRC = source_id(NOTIFICATIONS)


@pytest.fixture()
def db(postgres: PostgreSQL) -> Iterator[str]:
    with postgres.fresh_database("pginc") as url:
        yield url.rsplit("/", 1)[1]  # its slots are dropped with it


def connect(postgres: PostgreSQL, db: str) -> psycopg.Connection[Any]:
    return psycopg.connect(f"host=127.0.0.1 port={postgres.port} user=postgres dbname={db}",
                           autocommit=True)


def make_source(postgres: PostgreSQL, db: str, state: Path, **fields: Any) -> PostgresSource:
    fields.setdefault("snapshot_chunk_size", 150)
    cfg = source_config(postgres.source_url(db), [r"public\..*"], snapshot_mode="no_data",
                        create_publication=True, **fields)
    src = PostgresSource(cfg, name="inc", state_dir=state)
    src.open()
    return src


class Consumer:
    """Applies windows in order: c/u/r upsert by key, d deletes, t empties the table."""

    def __init__(self, src: PostgresSource) -> None:
        self.src = src
        self.tables: dict[int, dict[Any, dict[str, Any]]] = {}
        self.notices: list[dict[str, Any]] = []
        self.snapshot_rows = 0

    def apply(self, w: Window) -> None:
        for e in ev.iter_events(w.events):
            s = self.src.registry().get(e.schema_id)
            if e.src_id == NOTIFY_SRC:
                self.notices.append(s.decode(e.payload))
                continue
            table = self.tables.setdefault(e.src_id, {})
            if e.op == ev.Op.TRUNCATE:
                table.clear()
            elif e.op == ev.Op.DELETE:
                table.pop(e.key, None)
            else:
                table[e.key] = s.decode(e.payload)
                self.snapshot_rows += e.is_snapshot

    def kinds(self) -> list[str]:
        return [n["kind"] for n in self.notices]


def read(src: PostgresSource, consumer: Consumer, after: int, until: Any,
         timeout: float = 120.0) -> int:
    stop = threading.Event()
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, f"timed out; notices {consumer.kinds()}"
        for w in src.read(after, stop, 0.3):
            assert w.scn > after
            after = w.scn
            consumer.apply(w)
    return after


def writer(postgres: PostgreSQL, db: str, stop: threading.Event, errors: list[BaseException]
           ) -> None:
    rng = random.Random(7)
    try:
        with connect(postgres, db) as con:
            while not stop.is_set():
                k = rng.randrange(0, 4500)  # beyond the maximum key at the start too
                op = rng.random()
                if op < 0.4:
                    con.execute("UPDATE items SET v = v || '+', n = n + 1 WHERE id = %s", [k])
                elif op < 0.6:
                    con.execute("DELETE FROM items WHERE id = %s", [k])
                elif op < 0.9:
                    con.execute("INSERT INTO items VALUES (%s, 'new', 0) ON CONFLICT (id)"
                                " DO UPDATE SET v = 'upserted'", [k])
                else:  # several rows in one transaction
                    with con.transaction():
                        con.execute("UPDATE items SET n = n * 2 WHERE id BETWEEN %s AND %s",
                                    [k, k + 20])
                        con.execute("DELETE FROM items WHERE id = %s", [k + 21])
                time.sleep(0.002)
    except BaseException as exc:
        errors.append(exc)


def test_snapshot_under_writers_and_a_restart_rebuilds_the_table(
        postgres: PostgreSQL, db: str, tmp_path: Path) -> None:
    with connect(postgres, db) as con:
        con.execute("CREATE TABLE items (id int PRIMARY KEY, v text, n int)")
        con.execute("INSERT INTO items SELECT g, 'v' || g, g FROM generate_series(0, 2999) g")
        con.execute("CREATE TABLE marker (id int PRIMARY KEY)")
    src = make_source(postgres, db, tmp_path)
    assert src.read(-1, threading.Event(), 0.2) == []  # the slot: the rows before it
    consumer = Consumer(src)  # only the snapshot brings
    stop, errors = threading.Event(), []  # type: ignore[var-annotated]
    thread = threading.Thread(target=writer, args=(postgres, db, stop, errors))
    thread.start()
    try:
        sid = src.signal("execute-snapshot", {"data-collections": ["public\\.items"]})
        after = read(src, consumer, -1,
                     lambda: consumer.kinds().count("CHUNK_DONE") >= 6)
        src.close()  # a restart in the middle of the snapshot, after the last window read
        src = make_source(postgres, db, tmp_path)
        consumer.src = src
        after = read(src, consumer, after, lambda: "COMPLETED" in consumer.kinds())
    finally:
        stop.set()
        thread.join(60)
    assert not errors, errors
    with connect(postgres, db) as con:
        con.execute("INSERT INTO marker VALUES (1)")
        want = {r[0]: {"id": r[0], "v": r[1], "n": r[2]}
                for r in con.execute("SELECT id, v, n FROM items").fetchall()}
    marker = source_id("public.marker")
    read(src, consumer, after, lambda: marker in consumer.tables)
    src.close()
    got = consumer.tables[source_id("public.items")]
    assert len(got) == len(want)
    assert got == want
    kinds = consumer.kinds()
    assert kinds[0] == "STARTED" and kinds[-1] == "COMPLETED"
    assert consumer.notices[0]["snapshot"] == sid
    assert kinds.count("TABLE_DONE") == 1 and kinds.count("CHUNK_DONE") >= 20
    assert consumer.snapshot_rows > 2000  # most rows came only from the snapshot


def test_bad_signals_are_error_notices_and_stop_aborts(postgres: PostgreSQL, db: str,
                                                       tmp_path: Path) -> None:
    with connect(postgres, db) as con:
        con.execute("CREATE TABLE a (id int PRIMARY KEY, s text)")
        con.execute("INSERT INTO a SELECT g, 'x' FROM generate_series(1, 1000) g")
        con.execute("CREATE TABLE nokey (x int)")
        con.execute("ALTER TABLE nokey REPLICA IDENTITY FULL")
    src = make_source(postgres, db, tmp_path, snapshot_chunk_size=10)
    assert src.read(-1, threading.Event(), 0.2) == []
    consumer = Consumer(src)
    with pytest.raises(InvalidRequestError, match="unknown signal"):
        src.signal("explode", None)
    with pytest.raises(InvalidRequestError, match="not allowed"):
        src.signal("execute-snapshot", {"data-collections": ["public\\.a"],
                                        "additional-conditions": [
                                            {"data-collection": "public.a",
                                             "filter": "id > (SELECT 1)"}]})
    with pytest.raises(InvalidRequestError, match="no captured table matches"):
        src.signal("execute-snapshot", {"data-collections": ["public\\.zzz"]})
    with connect(postgres, db) as con:  # written past the check: refused in the stream
        con.execute("INSERT INTO databus.signals VALUES ('zzz', 'execute-snapshot',"
                    " '{\"data-collections\": [\"public\\\\.zzz\"]}')")
    src.signal("execute-snapshot", {"data-collections": ["public\\.nokey"]})
    after = read(src, consumer, -1, lambda: consumer.kinds().count("ABORTED") >= 1)
    assert consumer.kinds()[:2] == ["ERROR", "STARTED"]
    assert "no captured table matches" in json.loads(consumer.notices[0]["data"])["message"]
    src.signal("execute-snapshot", {
        "data-collections": ["public\\.a"],
        "additional-conditions": [{"data-collection": "public.a", "filter": "id % 2 = 0"}]})
    after = read(src, consumer, after, lambda: "CHUNK_DONE" in consumer.kinds())
    src.signal("stop-snapshot", None)
    after = read(src, consumer, after, lambda: consumer.kinds().count("ABORTED") >= 2)
    rows = consumer.tables[source_id("public.a")]
    assert rows and all(k % 2 == 0 for k in rows)  # the condition applied
    assert "COMPLETED" not in consumer.kinds()
    with connect(postgres, db) as con:
        con.execute("INSERT INTO a VALUES (5000, 'after')")
    read(src, consumer, after, lambda: 5000 in rows)  # streaming went on
    src.close()
