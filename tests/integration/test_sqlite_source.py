"""The SQLite source against real database files: types, windows, restart, trim, DDL."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from databus.core import event as ev
from databus.core.errors import ConfigError, SourcePositionLostError
from databus.core.schema import SchemaRegistry
from databus.sources.base import Window
from databus.sources.txlog import SqliteSource
from tests.support.shop import txlog_max


def _db(path: Path, *ddl: str) -> Path:
    con = sqlite3.connect(path)
    for stmt in ddl:
        con.execute(stmt)
    con.commit()
    con.close()
    return path


def _exec(path: Path, *stmts: tuple[str, tuple[Any, ...]]) -> None:
    con = sqlite3.connect(path, isolation_level=None)
    try:
        con.execute("BEGIN")
        for sql, args in stmts:
            con.execute(sql, args)
        con.execute("COMMIT")
    finally:
        con.close()


def _read_all(src: SqliteSource, after: int = -1) -> list[Window]:
    out: list[Window] = []
    while True:
        got = src.read(out[-1].scn if out else after, threading.Event(), 0.05)
        if not got:
            return out
        out.extend(got)


def _rows(reg: SchemaRegistry, windows: list[Window]) -> list[tuple[str, dict[str, Any] | None,
                                                                     dict[str, Any] | None]]:
    out = []
    for w in windows:
        for e in ev.iter_events(w.events):
            schema = reg.get(e.schema_id)
            row = schema.decode(e.payload)
            meta = reg.metadata.decode(e.metadata) if e.metadata else {}
            before = schema.decode(meta["before"]) if meta.get("before") else None
            if e.op == ev.Op.DELETE:
                out.append(("d", row, None))
            else:
                out.append((e.op.letter, before, row))
    return out


def test_every_storage_class_round_trips_exactly(tmp_path: Path) -> None:
    db = _db(tmp_path / "t.db", "CREATE TABLE t (id INTEGER PRIMARY KEY, i INTEGER, r REAL,"
             " s TEXT, b BLOB, n NUMERIC, any_)")
    src = SqliteSource(db, ["t"])
    try:
        values = [
            (1, -(2**63), 0.1 + 0.2, "héllo 😀", b"\x00\xff", 12.5, None),
            (2, 2**63 - 1, -1e308, "", b"", 7, "x"),
            (3, "abc", 3, 4.25, "not a blob", "12.50", b"\x01"),  # mismatched storage classes
            (4, None, None, None, None, None, None),
        ]
        for v in values:
            _exec(db, ("INSERT INTO t VALUES (?,?,?,?,?,?,?)", v))
        inserted = _select(db)  # what SQLite stored (its affinity rules applied)
        _exec(db, ("UPDATE t SET s=? WHERE id=1", ("new",)), ("DELETE FROM t WHERE id=2", ()))
        current = _select(db)
        got = _rows(src.registry(), _read_all(src))
        assert [g[2] for g in got[:4]] == inserted
        assert got[4] == ("u", inserted[0], current[0])
        assert got[5] == ("d", inserted[1], None)
        assert type(got[2][2]["i"]) is str and type(got[2][2]["r"]) is float  # type: ignore[index]
    finally:
        src.close()


def _select(db: Path) -> list[dict[str, Any]]:
    con = sqlite3.connect(db)
    try:
        cur = con.execute("SELECT * FROM t ORDER BY id")
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur]
    finally:
        con.close()


def test_keys_composite_and_rowid(tmp_path: Path) -> None:
    db = _db(tmp_path / "k.db", "CREATE TABLE c (a TEXT, b INTEGER, v TEXT, PRIMARY KEY (a, b))",
             "CREATE TABLE nopk (v TEXT)")
    src = SqliteSource(db, ["c", "nopk"])
    try:
        _exec(db, ("INSERT INTO c VALUES ('x', 1, 'v')", ()), ("INSERT INTO nopk VALUES ('z')", ()))
        events = [e for w in _read_all(src) for e in ev.iter_events(w.events)]
        assert json.loads(events[0].key) == ["x", 1]  # type: ignore[arg-type]
        assert events[1].key == 1  # rowid
        assert src.registry().latest(events[0].src_id).key_columns == ("a", "b")
    finally:
        src.close()


def test_concurrent_transactions_are_never_split(tmp_path: Path) -> None:
    db = _db(tmp_path / "c.db", "CREATE TABLE t (id INTEGER PRIMARY KEY, tx INTEGER)")
    src = SqliteSource(db, ["t"], poll_interval=0.001)
    committed: list[list[int]] = []
    done = threading.Event()

    def write() -> None:
        con = sqlite3.connect(db, isolation_level=None, timeout=30)
        nid = 0
        for tx in range(400):
            con.execute("BEGIN IMMEDIATE")
            ids = []
            for _ in range(1 + tx % 7):
                nid += 1
                con.execute("INSERT INTO t VALUES (?, ?)", (nid, tx))
                ids.append(nid)
            if tx % 9 == 0:
                con.execute("ROLLBACK")
                nid -= len(ids)
            else:
                con.execute("COMMIT")
                committed.append(ids)
        con.close()
        done.set()

    t = threading.Thread(target=write)
    t.start()
    windows: list[Window] = []
    try:
        while not done.is_set() or (windows and windows[-1].scn < txlog_max(db)):
            windows.extend(src.read(windows[-1].scn if windows else -1, threading.Event(), 0.05))
    finally:
        t.join()
        src.close()
    assert [w.scn for w in windows] == sorted({w.scn for w in windows})
    where: dict[int, int] = {}
    for i, w in enumerate(windows):
        for e in ev.iter_events(w.events):
            where[e.key] = i  # type: ignore[index]
    assert sorted(where) == sorted(k for ids in committed for k in ids)
    for ids in committed:
        assert len({where[k] for k in ids}) == 1, "a transaction was split across windows"
    assert len(windows) > 10


def test_restart_trim_and_lost_position(tmp_path: Path) -> None:
    db = _db(tmp_path / "r.db", "CREATE TABLE t (id INTEGER PRIMARY KEY)")
    src = SqliteSource(db, ["t"], relay_name="a")
    other = SqliteSource(db, ["t"], relay_name="b")
    try:
        for i in range(1, 6):
            _exec(db, ("INSERT INTO t VALUES (?)", (i,)))
        first = _read_all(src)
        scn = first[0].scn
        _exec(db, ("INSERT INTO t VALUES (6)", ()))
        again = _read_all(src, after=scn)
        assert [e.key for w in again for e in ev.iter_events(w.events)] == [6]
        src.acknowledge(scn)
        assert _read_all(other, after=-1), "relay b has not acknowledged: nothing trimmed"
        other.acknowledge(scn)
        assert [e.key for w in _read_all(src, after=-1) for e in ev.iter_events(w.events)] == [6]
        with pytest.raises(SourcePositionLostError, match="bootstrap"):
            src.read(scn - 1, threading.Event(), 0.01)
    finally:
        src.close()
        other.close()


def test_alter_table_makes_a_new_version(tmp_path: Path) -> None:
    db = _db(tmp_path / "a.db", "CREATE TABLE t (id INTEGER PRIMARY KEY, a TEXT)")
    src = SqliteSource(db, ["t"])
    src.close()
    _exec(db, ("INSERT INTO t VALUES (1, 'old')", ()))
    _db(db, "ALTER TABLE t ADD COLUMN b INTEGER")
    src = SqliteSource(db, ["t"])  # reinstall: version 2, new triggers
    try:
        _exec(db, ("INSERT INTO t VALUES (2, 'new', 5)", ()))
        reg = src.registry()
        events = [e for w in _read_all(src) for e in ev.iter_events(w.events)]
        assert [e.schema_version for e in events] == [1, 2]
        assert [reg.get(e.schema_id).decode(e.payload) for e in events] == [
            {"id": 1, "a": "old"}, {"id": 2, "a": "new", "b": 5}]
    finally:
        src.close()


def test_stop_interrupts_a_blocking_read_and_bad_config(tmp_path: Path) -> None:
    db = _db(tmp_path / "s.db", "CREATE TABLE t (id INTEGER PRIMARY KEY)")
    src = SqliteSource(db, ["t"])
    try:
        stop = threading.Event()
        threading.Timer(0.2, stop.set).start()
        t0 = time.monotonic()
        assert src.read(-1, stop, 30) == []
        assert time.monotonic() - t0 < 5
    finally:
        src.close()
    with pytest.raises(ConfigError, match="does not exist"):
        SqliteSource(db, ["missing"])
    with pytest.raises(ConfigError):
        SqliteSource(tmp_path / "nope.db", ["t"])
