"""The SQLite trigger + txlog source against real database files.

Every test writes through ordinary ``sqlite3`` connections (the application)
and compares what the source emits, decoded, with what ``SELECT`` returns.
"""

from __future__ import annotations

import random
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from databus.core import event as ev
from databus.core.errors import (
    ConfigError,
    SourcePositionLostError,
    SourceUnavailableError,
    TerminalError,
)
from databus.core.window import Window
from databus.sources.txlog import forget_relay, install, uninstall
from databus.sources.txlog import sqlite as sqlite_mod
from tests.support.sources import sqlite_source
from tests.support.txlog import changes as _changes
from tests.support.txlog import commit as _exec
from tests.support.txlog import make_db as _db
from tests.support.txlog import read_all as _read_all
from tests.support.txlog import stream_source as _source

Row = dict[str, Any]


def _select(path: Path, sql: str) -> list[Row]:
    with closing(sqlite3.connect(path)) as con:
        con.text_factory = _RawText  # compare raw text exactly (also invalid UTF-8)
        cur = con.execute(sql)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, (_text(v) for v in r), strict=True)) for r in cur]


class _RawText(bytes):
    """SQLite text, before decoding."""


def _text(v: Any) -> Any:
    if isinstance(v, _RawText):
        try:
            return v.decode()
        except UnicodeDecodeError:
            return bytes(v)
    return v


def _exact(rows: list[Row] | Row | None) -> Any:
    """Values with their types (1 != 1.0, 0.0 != -0.0), for exact comparison."""
    if rows is None:
        return None
    if isinstance(rows, dict):
        return {k: (type(v).__name__, repr(v)) for k, v in rows.items()}
    return [_exact(r) for r in rows]


# -- types and ops ------------------------------------------------------------


TYPES_DDL = ("CREATE TABLE t (id INTEGER PRIMARY KEY, i INTEGER, r REAL, s TEXT, b BLOB,"
             " n NUMERIC, d DECIMAL(10,2), flag BOOLEAN, any_, nn TEXT NOT NULL DEFAULT '')")
VALUES = [
    (1, -(2**63), 0.1 + 0.2, "héllo 😀 ✓", b"\x00", 12.5, "12.50", True, None, "x"),
    (2, 2**63 - 1, -1.7976931348623157e308, "", b"", 7, 3, False, "text", ""),
    (3, "abc", 5e-324, "a\x00b", b"\x00\xff\x00", "12.50", "not a number", "yes", 1.5, "é"),
    (4, None, None, None, None, None, None, None, None, "n"),
    (5, 3.0, 3, 4.25, "not a blob", b"\x01", 1e100, 2, b"\x00", "z"),
    (6, 1.5, float("inf"), 12, 99, "2024-01-01", -0.0, None, 2**62, "w"),
]


def test_every_op_and_type_round_trips_exactly(tmp_path: Path) -> None:
    db = _db(tmp_path / "t.db", TYPES_DDL)
    with _source(db, ["t"]) as src:
        for v in VALUES:
            _exec(db, ("INSERT INTO t VALUES (?,?,?,?,?,?,?,?,?,?)", v))
        _exec(db, ("INSERT INTO t (id, s) VALUES (7, CAST(x'ff00fe' AS TEXT))", ()))
        inserted = _select(db, "SELECT * FROM t ORDER BY id")  # what SQLite stored
        _exec(db, "UPDATE t SET s = 'new', b = x'00' WHERE id = 1", "DELETE FROM t WHERE id = 2",
              "UPDATE t SET i = 'mismatch', r = NULL WHERE id = 3")
        after = {r["id"]: r for r in _select(db, "SELECT * FROM t ORDER BY id")}
        got = _changes(src, _read_all(src))
    assert [g[1] for g in got] == ["c"] * 7 + ["u", "d", "u"]
    assert [g[2] for g in got] == [1, 2, 3, 4, 5, 6, 7, 1, 2, 3]
    assert _exact([g[4] for g in got[:7]]) == _exact(inserted)
    assert got[2][4]["i"] == "abc" and got[5][4]["r"] == float("inf")
    assert got[6][4]["s"] == b"\xff\x00\xfe"  # not UTF-8: bytes
    assert _exact(got[7][3]) == _exact(inserted[0]) and _exact(got[7][4]) == _exact(after[1])
    assert _exact(got[8][3]) == _exact(inserted[1]) and got[8][4] is None
    assert _exact(got[9][3]) == _exact(inserted[2]) and _exact(got[9][4]) == _exact(after[3])


def test_random_values_are_exact(tmp_path: Path) -> None:
    rng = random.Random(7)

    def value() -> Any:
        kind = rng.randrange(5)
        if kind == 0:
            return rng.choice([0, 1, -1, 2**63 - 1, -(2**63), rng.getrandbits(64) - 2**63])
        if kind == 1:
            bits = rng.getrandbits(64)
            f = float.fromhex(f"{'-' if bits >> 63 else ''}0x1.{bits & (2**52 - 1):013x}p"
                              f"{rng.randrange(-1074, 1024)}")
            return f
        if kind == 2:
            return "".join(chr(rng.choice([rng.randrange(32, 127), rng.randrange(0x80, 0xD800),
                                           rng.randrange(0x10000, 0x110000), 0]))
                           for _ in range(rng.randrange(0, 20)))
        if kind == 3:
            return rng.randbytes(rng.randrange(0, 30))
        return None

    db = _db(tmp_path / "r.db", "CREATE TABLE t (id INTEGER PRIMARY KEY, a INTEGER, b REAL,"
             " c TEXT, d BLOB, e NUMERIC, f)")
    with _source(db, ["t"]) as src:
        with closing(sqlite3.connect(db, isolation_level=None)) as con:
            con.execute("BEGIN")
            con.executemany("INSERT INTO t VALUES (?,?,?,?,?,?,?)",
                            [(i, *(value() for _ in range(6))) for i in range(1, 1501)])
            con.execute("COMMIT")
        stored = _select(db, "SELECT * FROM t ORDER BY id")
        got = _changes(src, _read_all(src))
    assert _exact([g[4] for g in got]) == _exact(stored)


def test_keys_composite_text_blob_and_rowid(tmp_path: Path) -> None:
    db = _db(tmp_path / "k.db",
             "CREATE TABLE c (a TEXT, b INTEGER, v TEXT, PRIMARY KEY (b, a))",
             "CREATE TABLE s (k TEXT PRIMARY KEY, v INTEGER) WITHOUT ROWID",
             "CREATE TABLE i (id INT PRIMARY KEY, v TEXT)",  # not a rowid alias
             "CREATE TABLE nopk (v TEXT, w BLOB)")
    with _source(db, ["c", "s", "i", "nopk"]) as src:
        _exec(db, "INSERT INTO c VALUES ('x', 1, 'v')", "INSERT INTO s VALUES ('é', 1)",
              "INSERT INTO i VALUES (5, 'a')", "INSERT INTO i VALUES ('abc', 'b')",
              "INSERT INTO nopk VALUES ('z', x'00')", "INSERT INTO nopk VALUES ('y', NULL)")
        got = _changes(src, _read_all(src))
        assert [g[2] for g in got] == [[1, "x"], ["é"], 5, ["abc"], 1, 2]
        assert src.registry().latest(src.sources()[0].id).key_columns == ("b", "a")
        assert src.registry().latest(src.sources()[3].id).key_columns == ()
        # key changes: a delete of the old key, then an insert of the new one
        _exec(db, "UPDATE c SET a = 'y' WHERE b = 1", "UPDATE i SET v = 'c' WHERE id = 5",
              "UPDATE nopk SET rowid = 10 WHERE v = 'z'", "UPDATE nopk SET v = 'q' WHERE rowid = 2")
        got = _changes(src, _read_all(src, after=-1))
    tail = got[6:]
    assert [(g[0], g[1], g[2]) for g in tail] == [
        ("c", "d", [1, "x"]), ("c", "c", [1, "y"]), ("i", "u", 5),
        ("nopk", "d", 1), ("nopk", "c", 10), ("nopk", "u", 2)]
    assert tail[2][3] == {"id": 5, "v": "a"} and tail[2][4] == {"id": 5, "v": "c"}
    assert tail[5][3] == {"v": "y", "w": None} and tail[5][4] == {"v": "q", "w": None}


def test_odd_table_and_column_names(tmp_path: Path) -> None:
    db = _db(tmp_path / "q.db", 'CREATE TABLE "odd ""t"" é" ("col-1 é" TEXT PRIMARY KEY,'
             ' "select" INTEGER, "v0" REAL, src TEXT)')
    with _source(db, ['odd "t" é']) as src:
        _exec(db, ('INSERT INTO "odd ""t"" é" VALUES (?, ?, ?, ?)', ("k", 1, 0.5, "s")),
              'UPDATE "odd ""t"" é" SET "select" = 2')
        got = _changes(src, _read_all(src))
        schema = src.registry().latest(src.sources()[0].id)
    assert src.sources()[0].name == 'main.odd "t" é'
    assert schema.column_names == ["col-1 é", "select", "v0", "src"]
    fields = [f["name"] for f in schema.avro["fields"]]  # Avro-safe names of the columns
    after = dict(zip(fields, ["k", 2, 0.5, "s"], strict=True))
    assert got == [('odd "t" é', "c", ["k"], None, {**after, "select": 1}),
                   ('odd "t" é', "u", ["k"], {**after, "select": 1}, after)]


# -- windows and transactions -------------------------------------------------


WRITER = """
import sqlite3, sys
con = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
base = int(sys.argv[2])
for tx in range(base, base + int(sys.argv[3])):
    con.execute("BEGIN IMMEDIATE")
    for line in range(1 + tx % 5):
        con.execute("INSERT INTO b VALUES (?, ?, ?)", (tx, line, "p"))
    con.execute("UPDATE a SET n = n + 1, tx = ? WHERE id = 1", (tx,))
    con.execute("ROLLBACK" if tx % 11 == 0 else "COMMIT")
con.close()
"""


def test_transactions_are_never_split_across_windows(tmp_path: Path) -> None:
    """Two writers (a thread and a process) commit multi-row transactions, some rolled
    back, while the source reads: every committed transaction lies in one window."""
    db = _db(tmp_path / "c.db", "CREATE TABLE a (id INTEGER PRIMARY KEY, n INTEGER, tx INTEGER)",
             "CREATE TABLE b (tx INTEGER, line INTEGER, p TEXT, PRIMARY KEY (tx, line))")
    _exec(db, "INSERT INTO a VALUES (1, 0, 0)")
    with _source(db, ["a", "b"], poll_interval=0.001) as src:
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(db), "100000", "300"])
        committed: list[int] = []

        def write() -> None:
            with closing(sqlite3.connect(db, isolation_level=None, timeout=30)) as con:
                for tx in range(1, 301):
                    con.execute("BEGIN IMMEDIATE")
                    for line in range(1 + tx % 7):
                        con.execute("INSERT INTO b VALUES (?, ?, 'q')", (tx, line))
                    con.execute("UPDATE a SET n = n + 1, tx = ? WHERE id = 1", (tx,))
                    if tx % 9 == 0:
                        con.execute("ROLLBACK")
                    else:
                        con.execute("COMMIT")
                        committed.append(tx)
                    time.sleep(0.0005 * (tx % 3))

        thread = threading.Thread(target=write)
        thread.start()
        windows: list[Window] = []
        try:
            while thread.is_alive() or proc.poll() is None:
                windows.extend(src.read(windows[-1].scn if windows else -1,
                                        threading.Event(), 0.05))
        finally:
            thread.join()
            proc.wait()
        windows.extend(_read_all(src, windows[-1].scn if windows else -1))
        got = _changes(src, windows)
    assert proc.returncode == 0
    scns = [w.scn for w in windows]
    assert scns == sorted(set(scns)), "window SCNs must strictly increase"
    assert len(windows) > 10
    # per transaction (key of table b = [tx, line]): where its rows are
    position: dict[int, list[tuple[int, int]]] = {}
    flat = 0
    for wi, w in enumerate(windows):
        for _ in range(w.count):
            table, _op, key, _b, _a = got[flat]
            if table == "b":
                position.setdefault(key[0], []).append((wi, flat))
            flat += 1
    other = {tx for tx in range(100000, 100300) if tx % 11}
    assert set(position) == set(committed) | other, "exactly the committed transactions"
    for tx, where in position.items():
        size = 1 + tx % (5 if tx >= 100000 else 7)
        assert len(where) == size
        assert len({wi for wi, _ in where}) == 1, f"transaction {tx} split across windows"
        flats = [f for _, f in where]
        assert flats == list(range(flats[0], flats[0] + size)), f"transaction {tx} interleaved"
    # each transaction's update of a.n directly follows its inserts; n counts commits
    ns = [g[4]["n"] for g in got if g[0] == "a"]
    assert ns == list(range(1, len(committed) + len(other) + 1)), "commit order"
    txs = [g[4]["tx"] for g in got if g[0] == "a"]
    assert [t for t in txs if t < 100000] == committed
    assert [t for t in txs if t >= 100000] == sorted(other)
    # ... and directly follows the inserts of its own transaction
    for i, g in enumerate(got):
        if g[0] == "a":
            assert got[i - 1][0] == "b" and got[i - 1][2][0] == g[4]["tx"]


def test_restart_from_any_window_replays_exactly_what_follows(tmp_path: Path) -> None:
    db = _db(tmp_path / "r.db", "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
    windows: list[Window] = []
    with _source(db, ["t"]) as src:
        for i in range(1, 30):
            _exec(db, ("INSERT INTO t VALUES (?, ?)", (i, f"v{i}")),
                  ("UPDATE t SET v = v || '!' WHERE id = ?", (max(1, i - 3),)))
            windows.extend(_read_all(src, windows[-1].scn if windows else -1))
        everything = _changes(src, windows)
    assert len(windows) == 29
    with _source(db, ["t"]) as again:
        for cut, w in enumerate(windows):
            replay = _changes(again, _read_all(again, after=w.scn))
            assert replay == everything[2 * (cut + 1):]
            assert all(x.scn > w.scn for x in _read_all(again, after=w.scn))
        assert _changes(again, _read_all(again, after=-1)) == everything


def test_acknowledge_trims_and_lost_positions_are_reported(tmp_path: Path) -> None:
    db = _db(tmp_path / "a.db", "CREATE TABLE t (id INTEGER PRIMARY KEY)")
    with _source(db, ["t"], name="a") as a, _source(db, ["t"], name="b") as b:
        with closing(sqlite3.connect(db, isolation_level=None)) as con:
            con.execute("BEGIN")
            con.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(1, 12001)])
            con.execute("COMMIT")
        _exec(db, "INSERT INTO t VALUES (12001)")
        first = _read_all(a)
        assert len(first) == 1 and first[0].count == 12001
        scn = first[0].scn
        a.acknowledge(scn - 1)
        assert _read_all(b)[0].count == 12001, "b has not acknowledged: nothing trimmed"
        b.acknowledge(scn - 1)  # both: trimmed in several batches
        assert _txlog_scns(db) == [scn]
        rest = _read_all(a, after=scn - 1)
        assert [e.key for w in rest for e in ev.iter_events(w.events)] == [12001]
        with pytest.raises(SourcePositionLostError, match="bootstrap"):
            a.read(scn - 2, threading.Event(), 0.01)
        with pytest.raises(SourcePositionLostError):
            b.read(0, threading.Event(), 0.01)
        # -1: from the oldest row still there
        assert [e.key for w in _read_all(b, after=-1) for e in ev.iter_events(w.events)] == [12001]
        assert _read_all(a, after=scn) == []
    # a relay that stopped for good holds trimming back until it is forgotten
    with _source(db, ["t"], name="a") as a:
        a.acknowledge(scn)
        assert _txlog_scns(db) == [scn]
        forget_relay(db, "b")
        a.acknowledge(scn)
        assert _txlog_scns(db) == []
        _exec(db, "INSERT INTO t VALUES (20000)")
        new = _read_all(a, after=scn)
        assert new[0].scn > scn and new[0].count == 1  # SCNs are never reused
        with pytest.raises(SourcePositionLostError, match="ahead"):
            a.read(new[0].scn + 5, threading.Event(), 0.01)


def _txlog_scns(db: Path) -> list[int]:
    with closing(sqlite3.connect(db)) as con:
        return [r[0] for r in con.execute("SELECT scn FROM _databus_txlog ORDER BY scn")]


def test_new_relay_does_not_lose_rows_to_anothers_trim(tmp_path: Path) -> None:
    db = _db(tmp_path / "n.db", "CREATE TABLE t (id INTEGER PRIMARY KEY)")
    with _source(db, ["t"], name="a") as a:
        _exec(db, "INSERT INTO t VALUES (1)")
        w = _read_all(a)
        with _source(db, ["t"], name="b") as b:  # registered, acked -1
            a.acknowledge(w[-1].scn)
            assert [e.key for x in _read_all(b) for e in ev.iter_events(x.events)] == [1]


def test_position_from_a_reinstalled_database_is_lost(tmp_path: Path) -> None:
    db = _db(tmp_path / "u.db", "CREATE TABLE t (id INTEGER PRIMARY KEY)")
    with _source(db, ["t"]) as src:
        _exec(db, "INSERT INTO t VALUES (1)", "INSERT INTO t VALUES (2)")
        scn = _read_all(src)[-1].scn
    uninstall(db)
    with closing(sqlite3.connect(db)) as con:
        assert not con.execute("SELECT name FROM sqlite_master WHERE name LIKE '%databus%'"
                               ).fetchall()
    with _source(db, ["t"]) as src, pytest.raises(SourcePositionLostError, match="ahead"):
        src.read(scn, threading.Event(), 0.01)


# -- schema changes and install -------------------------------------------------


def test_alter_table_makes_a_new_version_old_rows_keep_theirs(tmp_path: Path) -> None:
    db = _db(tmp_path / "v.db", "CREATE TABLE t (id INTEGER PRIMARY KEY, a TEXT)")
    install(db, ["t"])
    _exec(db, "INSERT INTO t VALUES (1, 'old')")
    _exec(db, "ALTER TABLE t ADD COLUMN b INTEGER")
    install(db, ["t"])  # explicit re-install: version 2
    _exec(db, "INSERT INTO t VALUES (2, 'new', 5)", "UPDATE t SET b = 7 WHERE id = 1")
    with _source(db, ["t"]) as src:
        windows = _read_all(src)
        events = [e for w in windows for e in ev.iter_events(w.events)]
        assert [e.schema_version for e in events] == [1, 2, 2]
        assert _changes(src, windows) == [
            ("t", "c", 1, None, {"id": 1, "a": "old"}),
            ("t", "c", 2, None, {"id": 2, "a": "new", "b": 5}),
            ("t", "u", 1, {"id": 1, "a": "old", "b": None}, {"id": 1, "a": "old", "b": 7})]
        reg = src.registry()
        assert [s.version for s in reg.versions(src.sources()[0].id)] == [1, 2]
        # a running source notices ALTER TABLE and re-installs by itself
        _exec(db, "ALTER TABLE t ADD COLUMN c BLOB")
        assert _read_all(src, windows[-1].scn) == []  # the re-install logs nothing
        _exec(db, "INSERT INTO t VALUES (3, 'x', 1, x'00')")
        later = _changes(src, _read_all(src, windows[-1].scn))
        assert later == [("t", "c", 3, None, {"id": 3, "a": "x", "b": 1, "c": b"\x00"})]
        assert reg.latest(src.sources()[0].id).version == 3
        # the gap-free way: ALTER TABLE and install in one application transaction
        with closing(sqlite3.connect(db, isolation_level=None)) as con:
            con.execute("BEGIN IMMEDIATE")
            con.execute("ALTER TABLE t ADD COLUMN d REAL")
            install(con, ["t"])
            con.execute("INSERT INTO t VALUES (4, 'y', 2, NULL, 0.5)")
            con.execute("COMMIT")
        last = _changes(src, _read_all(src, windows[-1].scn))[-1]
        assert last[4] == {"id": 4, "a": "y", "b": 2, "c": None, "d": 0.5}
        assert reg.latest(src.sources()[0].id).version == 4


def test_reinstall_is_idempotent_and_ids_are_stable(tmp_path: Path) -> None:
    db = _db(tmp_path / "i.db", "CREATE TABLE a (id INTEGER PRIMARY KEY)",
             "CREATE TABLE b (id INTEGER PRIMARY KEY)", "CREATE TABLE c (x)")
    first = install(db, ["a", "b"])
    with closing(sqlite3.connect(db)) as con:
        sv = con.execute("PRAGMA schema_version").fetchone()[0]
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert install(db, ["b", "a"]) == first[::-1]
    with closing(sqlite3.connect(db)) as con:
        assert con.execute("PRAGMA schema_version").fetchone()[0] == sv, "nothing recreated"
    uninstall(db, ["b"])  # capture of b stops; its id stays taken
    third = install(db, ["C", "b"])  # table names are case-insensitive in SQLite
    assert [i.name for i in third] == ["main.c", "main.b"]
    assert third[1].id == first[1].id and third[0].id > first[1].id
    with _source(db, ["a", "b", "c"]) as src:
        assert [s.name for s in src.sources()] == ["main.a", "main.b", "main.c"]


def test_install_refuses_what_it_cannot_capture(tmp_path: Path) -> None:
    db = _db(tmp_path / "e.db", "CREATE TABLE t (id INTEGER PRIMARY KEY)",
             "CREATE VIEW w AS SELECT * FROM t")
    with pytest.raises(ConfigError, match="does not exist"):
        sqlite_source(db, ["missing"])
    with pytest.raises(ConfigError, match="view"):
        install(db, ["w"])
    with pytest.raises(ConfigError, match="own tables"):
        install(db, ["_databus_txlog"])
    with pytest.raises(ConfigError, match="does not exist"):
        sqlite_source(tmp_path / "nope.db", ["t"])
    assert not (tmp_path / "nope.db").exists()
    old = _db(tmp_path / "old.db", "CREATE TABLE t (id INTEGER PRIMARY KEY)",
              "CREATE TABLE _databus_txlog (scn INTEGER PRIMARY KEY AUTOINCREMENT, src, ver,"
              " op, ts, rid, old TEXT, new TEXT)")
    with pytest.raises(ConfigError, match="older databus"):
        install(old, ["t"])


def test_other_tables_rows_are_skipped_but_positions_move(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_mod, "_PROGRESS_AFTER", 0.2)
    db = _db(tmp_path / "o.db", "CREATE TABLE a (id INTEGER PRIMARY KEY)",
             "CREATE TABLE b (id INTEGER PRIMARY KEY)")
    with _source(db, ["a"], name="ra") as ra, _source(db, ["b"], name="rb") as rb:
        _exec(db, "INSERT INTO a VALUES (1)", "INSERT INTO b VALUES (1)")
        _exec(db, "INSERT INTO b VALUES (2)")
        wa, wb = _read_all(ra), _read_all(rb)
        assert [w.count for w in wa] == [1] and [w.count for w in wb] == [2]
        assert wa[0].scn == wb[0].scn, "a window covers the whole snapshot"
        _exec(db, "INSERT INTO b VALUES (3)")
        assert ra.read(wa[0].scn, threading.Event(), 0.1) == []  # not yet
        empty = ra.read(wa[0].scn, threading.Event(), 1.0)
        assert [(w.count, w.events) for w in empty] == [(0, b"")]
        assert empty[0].scn == _txlog_scns(db)[-1]
        assert [s.name for s in ra.sources()] == ["main.a"]


# -- waiting, stopping, errors -------------------------------------------------


def test_stop_interrupts_a_blocking_read(tmp_path: Path) -> None:
    db = _db(tmp_path / "s.db", "CREATE TABLE t (id INTEGER PRIMARY KEY)")
    with _source(db, ["t"], poll_interval=0.05) as src:
        stop = threading.Event()
        timer = threading.Timer(0.2, stop.set)
        timer.start()
        t0 = time.monotonic()
        assert src.read(-1, stop, 30) == []
        assert time.monotonic() - t0 < 1.0
        timer.join()
        t0 = time.monotonic()
        assert src.read(-1, threading.Event(), 0.3) == []  # timeout bounds the wait
        assert 0.25 < time.monotonic() - t0 < 1.5
        # a commit during a blocking read ends it promptly
        threading.Timer(0.2, _exec, (db, "INSERT INTO t VALUES (1)")).start()
        t0 = time.monotonic()
        got = src.read(-1, threading.Event(), 10)
        assert [w.count for w in got] == [1] and time.monotonic() - t0 < 2


def test_locked_database_is_a_transient_error(tmp_path: Path) -> None:
    db = _db(tmp_path / "l.db", "CREATE TABLE t (id INTEGER PRIMARY KEY)")
    with _source(db, ["t"], busy_timeout=0.1) as src:
        _exec(db, "INSERT INTO t VALUES (1)")
        scn = _read_all(src)[-1].scn
        with closing(sqlite3.connect(db, isolation_level=None)) as app:
            app.execute("BEGIN IMMEDIATE")  # the application holds the write lock
            app.execute("INSERT INTO t VALUES (2)")
            assert _read_all(src, after=scn) == []  # the reader is not blocked (WAL)
            with pytest.raises(SourceUnavailableError, match="locked"):
                src.acknowledge(scn)
            app.execute("COMMIT")
        src.acknowledge(scn)
        assert [w.count for w in _read_all(src, after=scn)] == [1]
    with pytest.raises(TerminalError):
        src.read(-1, threading.Event(), 0.01)  # closed
    src.close()  # idempotent


def test_capture_removed_under_a_running_source_is_a_terminal_error(tmp_path: Path) -> None:
    db = _db(tmp_path / "g.db", "CREATE TABLE t (id INTEGER PRIMARY KEY)")
    with _source(db, ["t"]) as src:
        uninstall(db)
        with pytest.raises(TerminalError, match="uninstalled"):
            src.read(-1, threading.Event(), 0.01)
    with _source(db, ["t"]) as src:
        uninstall(db)
        install(db, ["t"])  # a new install: new ids and SCNs, the source's are stale
        with pytest.raises(TerminalError, match="re-installed"):
            src.read(-1, threading.Event(), 0.01)


def test_rows_written_between_alter_table_and_the_reinstall_are_logged_again_whole(
        tmp_path: Path) -> None:
    """The old triggers log writes made after ALTER TABLE without the new column; the
    re-install logs the current image of each such row (READ, new version), so the
    column's values are not lost; rows logged before the ALTER are not read again."""
    db = _db(tmp_path / "g.db", "CREATE TABLE t (id INTEGER PRIMARY KEY, a TEXT)")
    install(db, ["t"])
    _exec(db, "INSERT INTO t VALUES (1, 'before')", "INSERT INTO t VALUES (2, 'gone')")
    with _source(db, ["t"]) as src:
        first = _read_all(src)
        applied = _changes(src, first)
        assert len(applied) == 2
        # the application: ALTER TABLE, then writes, before the source polls again
        _exec(db, "ALTER TABLE t ADD COLUMN b INTEGER")
        _exec(db, "INSERT INTO t VALUES (3, 'gap', 30)", "UPDATE t SET b = 10 WHERE id = 1",
              "DELETE FROM t WHERE id = 2")
        later = _read_all(src, first[-1].scn)
        got = _changes(src, later)
        events = [e for w in later for e in ev.iter_events(w.events)]
    # what the old triggers logged (version 1: no b), then the rows as they are
    assert got[:3] == [
        ("t", "c", 3, None, {"id": 3, "a": "gap"}),
        ("t", "u", 1, {"id": 1, "a": "before"}, {"id": 1, "a": "before"}),
        ("t", "d", 2, {"id": 2, "a": "gone"}, None)]
    assert sorted(got[3:], key=lambda c: c[2]) == [
        ("t", "r", 1, None, {"id": 1, "a": "before", "b": 10}),
        ("t", "r", 3, None, {"id": 3, "a": "gap", "b": 30})]
    assert [e.schema_version for e in events] == [1, 1, 1, 2, 2]
    # the consumer's table, applying in order, equals the database's
    table: dict[object, dict[str, object]] = {}
    for _t, _op, key, _before, after in applied + got:
        if after is None:
            table.pop(key, None)
        else:
            table[key] = {**table.get(key, {}), **after}
    with closing(sqlite3.connect(db)) as con:
        rows = con.execute("SELECT id, a, b FROM t ORDER BY id").fetchall()
    assert [(k, r["a"], r.get("b")) for k, r in sorted(table.items())] == rows


def test_a_recreated_table_is_captured_again_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Dropping a table drops its capture triggers: the relay re-installs them and says
    that writes in between were not logged (they cannot be known)."""
    db = _db(tmp_path / "r.db", "CREATE TABLE t (id INTEGER PRIMARY KEY, a TEXT)")
    install(db, ["t"])
    with _source(db, ["t"]) as src:
        _exec(db, "INSERT INTO t VALUES (1, 'x')")
        first = _read_all(src)
        _exec(db, "DROP TABLE t", "CREATE TABLE t (id INTEGER PRIMARY KEY, a TEXT)",
              "INSERT INTO t VALUES (2, 'unlogged')")
        with caplog.at_level("WARNING", logger="databus.sources.sqlite"):
            assert _read_all(src, first[-1].scn) == []
            _exec(db, "INSERT INTO t VALUES (3, 'logged')")
            got = _changes(src, _read_all(src, first[-1].scn))
    assert got == [("t", "c", 3, None, {"id": 3, "a": "logged"})]
    assert any("were gone" in r.getMessage() and "snapshot_mode: always" in r.getMessage()
               for r in caplog.records)
