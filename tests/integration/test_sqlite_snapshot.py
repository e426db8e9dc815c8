"""Snapshot modes of the SQLite source against real database files.

A consumer applies the events in order (insert / update / ``r`` = upsert by
key, delete = remove) and must end equal to ``SELECT`` on the tables, also
while application threads write the same keys during the snapshot.
"""

from __future__ import annotations

import json
import random
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import pytest

from databus.core import event as ev
from databus.core.errors import ConfigError, SourcePositionLostError
from databus.core.window import Window
from databus.sources.txlog import SqliteSource
from tests.support.sources import sqlite_source

Key = tuple[str, Any]
DDL = (
    "CREATE TABLE a (id INTEGER PRIMARY KEY, v INTEGER, s TEXT)",
    "CREATE TABLE c (x TEXT, y INTEGER, v INTEGER, PRIMARY KEY (y, x))",  # composite
    "CREATE TABLE n (v INTEGER, s TEXT)",  # no primary key: rowid keys
    "CREATE TABLE w (k TEXT PRIMARY KEY, v INTEGER) WITHOUT ROWID",
)


def _db(path: Path, rows: int) -> Path:
    with closing(sqlite3.connect(path, isolation_level=None)) as con:
        con.execute("PRAGMA journal_mode=WAL")
        for stmt in DDL:
            con.execute(stmt)
        con.execute("BEGIN")
        con.executemany("INSERT INTO a VALUES (?,?,?)", [(i, i, f"s{i}") for i in range(rows)])
        con.executemany("INSERT INTO c VALUES (?,?,?)",
                        [(f"k{i % 7}", i // 7, i) for i in range(rows // 4)])
        con.executemany("INSERT INTO n VALUES (?,?)", [(i, f"n{i}") for i in range(rows // 4)])
        con.executemany("INSERT INTO w VALUES (?,?)", [(f"w{i:05d}", i) for i in range(rows // 4)])
        con.execute("COMMIT")
    return path


def _jkey(*values: Any) -> str:
    return json.dumps(list(values), separators=(",", ":"), ensure_ascii=False)


def _table_state(path: Path) -> dict[Key, dict[str, Any]]:
    out: dict[Key, dict[str, Any]] = {}
    with closing(sqlite3.connect(path)) as con:
        for r in con.execute("SELECT id, v, s FROM a"):
            out[("a", r[0])] = {"id": r[0], "v": r[1], "s": r[2]}
        for r in con.execute("SELECT x, y, v FROM c"):
            out[("c", _jkey(r[1], r[0]))] = {"x": r[0], "y": r[1], "v": r[2]}
        for r in con.execute("SELECT rowid, v, s FROM n"):
            out[("n", r[0])] = {"v": r[1], "s": r[2]}
        for r in con.execute("SELECT k, v FROM w"):
            out[("w", _jkey(r[0]))] = {"k": r[0], "v": r[1]}
    return out


class Replica:
    """A consumer applying events in order; counts what it got."""

    def __init__(self, src: SqliteSource) -> None:
        self.src = src
        self.rows: dict[Key, dict[str, Any]] = {}
        self.reads = 0
        self.changes = 0
        self.scns: list[int] = []

    def apply(self, windows: list[Window]) -> None:
        reg = self.src.registry()
        names = {s.id: s.name.split(".", 1)[1] for s in self.src.sources()}
        for w in windows:
            assert not self.scns or w.scn > self.scns[-1], "window SCNs must increase"
            self.scns.append(w.scn)
            seen_read = False
            for e in ev.iter_events(w.events):
                assert e.scn == w.scn
                schema = reg.get(e.schema_id)
                key = e.key.decode() if isinstance(e.key, bytes) else e.key
                k = (names[e.src_id], key)
                if e.op == ev.Op.READ:
                    assert e.is_snapshot
                    seen_read = True
                    self.reads += 1
                else:
                    assert not seen_read, "stream events come before the chunk's r events"
                    assert not e.is_snapshot
                    self.changes += 1
                if e.op == ev.Op.DELETE:
                    self.rows.pop(k, None)
                else:
                    self.rows[k] = schema.decode(e.payload)


@contextmanager
def _source(path: Path, **kw: Any) -> Iterator[SqliteSource]:
    with sqlite_source(path, ["a", "c", "n", "w"], poll_interval=0.01, **kw) as src:
        yield src


def drain(src: SqliteSource, replica: Replica, after: int, *, timeout: float = 0.0,
           limit: int | None = None) -> int:
    """Read and apply windows until none comes (or ``limit`` windows); the last SCN."""
    n = 0
    while limit is None or n < limit:
        got = src.read(after, threading.Event(), timeout)
        if not got:
            break
        replica.apply(got)
        after = got[-1].scn
        n += len(got)
    return after


def _write(path: Path, *stmts: tuple[str, tuple[Any, ...]]) -> None:
    with closing(sqlite3.connect(path, isolation_level=None, timeout=30)) as con:
        con.execute("BEGIN IMMEDIATE")
        for sql, args in stmts:
            con.execute(sql, args)
        con.execute("COMMIT")


def _txlog_max(path: Path) -> int:
    with closing(sqlite3.connect(path)) as con:
        return int(con.execute("SELECT max(scn) FROM _databus_txlog").fetchone()[0])


def _rows(path: Path) -> int:
    return len(_table_state(path))


# -- modes ----------------------------------------------------------------------------


def test_initial_sends_every_row_then_streams(tmp_path: Path) -> None:
    db = _db(tmp_path / "s.db", 400)
    _write(db, ("UPDATE a SET v = -1 WHERE id < 5", ()))  # before capture: not in the txlog
    with _source(db, snapshot_chunk_size=37) as src:
        _write(db, ("UPDATE a SET v = -2 WHERE id < 10", ()))  # a backlog: covered by the snapshot
        replica = Replica(src)
        pos = drain(src, replica, -1)
        assert replica.reads == _rows(db) and replica.changes == 0
        assert replica.rows == _table_state(db)
        assert len(replica.scns) >= _rows(db) // 37
        _write(db, ("INSERT INTO a VALUES (10000, 1, 'new')", ()),
               ("DELETE FROM w WHERE k = 'w00003'", ()))
        before = replica.reads
        pos = drain(src, replica, pos, timeout=2.0, limit=1)
        assert replica.reads == before and replica.changes == 2
        assert replica.rows == _table_state(db)
        assert src.stats()["snapshot_completed_total"] == 1
        assert src.stats()["snapshot_running"] == 0


def test_no_data_streams_only(tmp_path: Path) -> None:
    db = _db(tmp_path / "s.db", 100)
    with _source(db, snapshot_mode="no_data") as src:
        replica = Replica(src)
        assert src.read(-1, threading.Event(), 0.2) == []
        _write(db, ("UPDATE a SET v = 7 WHERE id = 3", ()))
        drain(src, replica, -1, timeout=2.0, limit=1)
    assert replica.reads == 0 and replica.changes == 1


def test_initial_only_stops_after_the_snapshot(tmp_path: Path) -> None:
    db = _db(tmp_path / "s.db", 100)
    state = tmp_path / "state"
    state.mkdir()
    with _source(db, snapshot_mode="initial_only", snapshot_chunk_size=40,
                 state_dir=state) as src:
        replica = Replica(src)
        pos = drain(src, replica, -1)
        assert replica.reads == _rows(db)
        _write(db, ("UPDATE a SET v = 7 WHERE id = 3", ()))
        assert src.read(pos, threading.Event(), 0.3) == []
    with _source(db, snapshot_mode="initial_only", state_dir=state) as src:  # a restart
        assert src.read(pos, threading.Event(), 0.3) == []


def test_empty_tables_send_no_window_and_their_first_change_first(tmp_path: Path) -> None:
    db = _db(tmp_path / "s.db", 0)
    with _source(db) as src:
        _write(db, ("INSERT INTO a VALUES (1, 1, 'x')", ()), ("DELETE FROM a", ()))  # backlog
        assert src.read(-1, threading.Event(), 0.2) == []
        assert src.stats()["snapshot_completed_total"] == 1
        _write(db, ("INSERT INTO a VALUES (2, 2, 'y')", ()))
        replica = Replica(src)
        pos = drain(src, replica, -1, timeout=2.0, limit=1)
        assert (replica.changes, replica.reads) == (1, 0)
        assert replica.rows == _table_state(db)
        _write(db, ("DELETE FROM a", ()))
        pos = drain(src, replica, pos, timeout=2.0, limit=1)
        assert replica.rows == {}
    with _source(db, snapshot_mode="always") as src:  # empty, nothing new: a marker row
        assert src.read(pos, threading.Event(), 0.2) == []
        assert _txlog_max(db) > pos
        # the marker is passed with an empty window, as rows of other tables are
        late = src.read(pos, threading.Event(), 3.0)
        assert len(late) == 1 and late[0].count == 0 and late[0].scn == _txlog_max(db)


def test_when_needed_with_empty_tables_streams_from_the_end(tmp_path: Path) -> None:
    db = _db(tmp_path / "s.db", 0)
    with _source(db, snapshot_mode="when_needed") as src:
        assert src.read(5000, threading.Event(), 0.2) == []
        _write(db, ("INSERT INTO a VALUES (2, 2, 'y')", ()))
        replica = Replica(src)
        drain(src, replica, 5000, timeout=2.0, limit=1)
        assert replica.changes == 1 and replica.scns[0] > 5000


def test_bad_mode_is_a_config_error(tmp_path: Path) -> None:
    db = _db(tmp_path / "s.db", 0)
    with pytest.raises(ConfigError):
        sqlite_source(db, ["a"], snapshot_mode="sometimes")


# -- consistency under writers ------------------------------------------------------------


def _writer(path: Path, stop: threading.Event, rows: int, seed: int) -> None:
    rng = random.Random(seed)
    with closing(sqlite3.connect(path, isolation_level=None, timeout=30)) as con:
        while not stop.is_set():
            con.execute("BEGIN IMMEDIATE")
            for _ in range(rng.randrange(1, 6)):
                i = rng.randrange(rows + rows // 10)
                op = rng.randrange(8)
                if op == 0:
                    con.execute("DELETE FROM a WHERE id = ?", (i,))
                elif op == 1:
                    con.execute("INSERT OR REPLACE INTO a VALUES (?, ?, 'ins')", (i, -i))
                elif op == 2:  # a key change: delete + insert in the stream
                    con.execute("UPDATE OR IGNORE a SET id = ? WHERE id = ?",
                                (rows * 2 + rng.randrange(rows), i))
                elif op == 3:
                    con.execute("UPDATE c SET v = v + 1 WHERE y = ?", (i // 28,))
                elif op == 4:
                    con.execute("DELETE FROM n WHERE rowid = ?", (i // 4,))
                elif op == 5:
                    con.execute("INSERT INTO n VALUES (?, 'late')", (i,))
                elif op == 6:
                    con.execute("UPDATE w SET v = v * 2 WHERE k = ?", (f"w{i // 4:05d}",))
                else:
                    con.execute("UPDATE a SET v = v + 1, s = 'upd' WHERE id = ?", (i,))
            con.execute("COMMIT")
            stop.wait(0.0005)


def test_snapshot_while_writers_change_the_same_keys(tmp_path: Path) -> None:
    rows = 20_000
    db = _db(tmp_path / "s.db", rows)
    with _source(db, snapshot_chunk_size=500) as src:
        replica = Replica(src)
        stop = threading.Event()
        writers = [threading.Thread(target=_writer, args=(db, stop, rows, s)) for s in (1, 2)]
        for t in writers:
            t.start()
        try:
            pos = -1
            while src.stats().get("snapshot_completed_total", 0) < 1:
                pos = drain(src, replica, pos, limit=1, timeout=1.0)
        finally:
            stop.set()
            for t in writers:
                t.join()
        pos = drain(src, replica, pos, timeout=0.3)
        assert replica.changes > 100, "the writers ran during the snapshot"
        assert replica.reads >= rows  # every pre-existing row of a, at least
        assert replica.rows == _table_state(db)


# -- restarts ------------------------------------------------------------------------


def test_restart_resumes_after_the_last_chunk_it_holds(tmp_path: Path) -> None:
    db = _db(tmp_path / "s.db", 2000)
    state = tmp_path / "state"
    state.mkdir()
    with _source(db, snapshot_chunk_size=100, state_dir=state, name="r") as src:
        replica = Replica(src)
        drain(src, replica, -1, limit=12)
        assert replica.reads == 12 * 100
        kept = replica.scns[-3]  # the relay lost its last two windows
        _write(db, ("UPDATE a SET v = 0 WHERE id BETWEEN 100 AND 120", ()),
               ("DELETE FROM n WHERE rowid < 10", ()))
    total = _rows(db)
    with _source(db, snapshot_chunk_size=100, state_dir=state, name="r") as src:
        again = Replica(src)
        pos = drain(src, again, kept)
        assert pos > kept
    # the ten chunk windows up to `kept` were held: the restart sent only the rest
    assert again.reads == total - 10 * 100
    assert again.changes == 21 + 9


def test_restart_far_back_in_a_long_snapshot_resumes_there(tmp_path: Path) -> None:
    """More chunk windows than a fixed record cap would keep, none acknowledged."""
    db = _db(tmp_path / "s.db", 800)
    state = tmp_path / "state"
    state.mkdir()
    with _source(db, snapshot_chunk_size=5, state_dir=state) as src:
        replica = Replica(src)
        drain(src, replica, -1, limit=300)
        kept = replica.scns[3]  # the relay kept only four windows
        src.acknowledge(kept)
    with _source(db, snapshot_chunk_size=5, state_dir=state) as src:
        again = Replica(src)
        drain(src, again, kept)
    assert again.reads == _rows(db) - 4 * 5


def test_restart_rebuilds_the_table_exactly(tmp_path: Path) -> None:
    db = _db(tmp_path / "s.db", 3000)
    state = tmp_path / "state"
    state.mkdir()
    with _source(db, snapshot_chunk_size=200, state_dir=state) as src:
        replica = Replica(src)
        pos = drain(src, replica, -1, limit=5)
        _write(db, ("UPDATE a SET v = 0 WHERE id < 3000", ()), ("DELETE FROM w", ()))
    with _source(db, snapshot_chunk_size=200, state_dir=state) as src:
        replica.src = src
        _write(db, ("INSERT INTO c VALUES ('z', 99999, 1)", ()))
        drain(src, replica, pos)
    assert replica.rows == _table_state(db)


def test_finished_snapshot_is_not_replayed_but_always_is(tmp_path: Path) -> None:
    db = _db(tmp_path / "s.db", 300)
    state = tmp_path / "state"
    state.mkdir()
    with _source(db, snapshot_chunk_size=1000, state_dir=state) as src:
        replica = Replica(src)
        pos = drain(src, replica, -1)
        assert replica.reads == _rows(db)
    with _source(db, state_dir=state) as src:  # initial, restarted with a position
        replica = Replica(src)
        _write(db, ("UPDATE a SET v = 1 WHERE id = 1", ()))
        pos = drain(src, replica, pos, timeout=1.0, limit=1)
        assert replica.reads == 0 and replica.changes == 1
    with _source(db, snapshot_mode="always", state_dir=state) as src:
        replica = Replica(src)
        drain(src, replica, pos)
        assert replica.reads == _rows(db)


# -- lost positions ----------------------------------------------------------------------


def _trimmed(tmp_path: Path) -> tuple[Path, int]:
    """A database whose txlog was trimmed above position 1; returns (db, a lost position)."""
    db = _db(tmp_path / "s.db", 200)
    with _source(db, snapshot_mode="no_data", name="only") as src:
        for i in range(5):
            _write(db, ("UPDATE a SET v = ? WHERE id = 1", (i,)))
        got = src.read(-1, threading.Event(), 1.0)
        src.acknowledge(got[-1].scn)  # trims everything: no other relay
    return db, 1


def test_when_needed_snapshots_a_trimmed_position(tmp_path: Path) -> None:
    db, lost = _trimmed(tmp_path)
    with _source(db, snapshot_mode="initial", name="only") as src, \
            pytest.raises(SourcePositionLostError):
        src.read(lost, threading.Event(), 0.1)
    with _source(db, snapshot_mode="when_needed", name="only",
                 snapshot_chunk_size=64) as src:
        replica = Replica(src)
        _write(db, ("DELETE FROM a WHERE id = 2", ()))
        pos = drain(src, replica, lost)
        assert replica.scns[0] > lost
        assert replica.reads == _rows(db) and replica.rows == _table_state(db)
        _write(db, ("UPDATE a SET v = 5 WHERE id = 3", ()))
        drain(src, replica, pos, timeout=1.0, limit=1)
        assert replica.changes == 1 and replica.rows == _table_state(db)


def test_when_needed_snapshots_a_position_ahead_of_the_database(tmp_path: Path) -> None:
    db = _db(tmp_path / "s.db", 50)
    ahead = 1_000_000
    with _source(db, snapshot_mode="when_needed") as src:
        replica = Replica(src)
        pos = drain(src, replica, ahead)
        assert replica.scns[0] > ahead  # the txlog's SCNs moved above the lost position
        assert replica.rows == _table_state(db)
        _write(db, ("INSERT INTO a VALUES (777, 1, 'x')", ()))
        drain(src, replica, pos, timeout=1.0, limit=1)
        assert replica.changes == 1 and replica.rows == _table_state(db)


# -- schema changes ------------------------------------------------------------------------


def test_alter_table_mid_snapshot_sends_the_current_version(tmp_path: Path) -> None:
    db = _db(tmp_path / "s.db", 1000)
    with _source(db, snapshot_chunk_size=100) as src:
        replica = Replica(src)
        pos = drain(src, replica, -1, limit=3)
        _write(db, ("ALTER TABLE a ADD COLUMN extra TEXT DEFAULT 'd'", ()))
        _write(db, ("UPDATE a SET extra = 'set' WHERE id = 950", ()))
        drain(src, replica, pos)
    got = {k[1]: v for k, v in replica.rows.items() if k[0] == "a"}
    assert "extra" not in got[5]  # sent before the ALTER: the old version
    assert got[999]["extra"] == "d" and got[950]["extra"] == "set"
    assert len(got) == 1000


def test_table_recreated_mid_snapshot(tmp_path: Path) -> None:
    db = _db(tmp_path / "s.db", 1000)
    with _source(db, snapshot_chunk_size=100) as src:
        replica = Replica(src)
        pos = drain(src, replica, -1, limit=2)
        _write(db, ("DROP TABLE a", ()),
               ("CREATE TABLE a (id INTEGER PRIMARY KEY, v INTEGER, s TEXT, t TEXT)", ()),
               ("INSERT INTO a (id, v, s, t) SELECT value, value, 'again', 'x'"
                " FROM (WITH RECURSIVE s(value) AS (SELECT 500 UNION ALL SELECT value + 1 FROM s"
                " WHERE value < 520) SELECT value FROM s)", ()))
        drain(src, replica, pos)
    rows = {k[1]: v for k, v in replica.rows.items() if k[0] == "a"}
    for i in range(500, 521):
        assert rows[i] == {"id": i, "v": i, "s": "again", "t": "x"}
