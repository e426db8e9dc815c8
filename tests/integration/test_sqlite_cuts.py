"""Shared window cuts of the SQLite source (``window_cuts: shared``) against real
database files: several relays capturing one database emit the same windows
(same SCNs, same event bytes) whatever the moments they read at.

Windows are compared by (SCN, event bytes) over those with events: which empty
windows a reader sends (rows of other tables only, after ``_PROGRESS_AFTER``)
depends on its timing, by design; their SCNs are cuts all the same.
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

from databus.core.errors import SourcePositionLostError
from databus.core.window import Window
from databus.sources.txlog import SqliteSource, install
from databus.sources.txlog import cuts as cuts_mod
from databus.sources.txlog import sqlite as sqlite_mod
from tests.support.txlog import changes as _changes
from tests.support.txlog import commit as _exec
from tests.support.txlog import make_db as _db
from tests.support.txlog import read_all as _read_all
from tests.support.txlog import stream_source as _source

DDL = ("CREATE TABLE a (id INTEGER PRIMARY KEY, n INTEGER, tx INTEGER)",
       "CREATE TABLE b (tx INTEGER, line INTEGER, p TEXT, PRIMARY KEY (tx, line))",
       "CREATE TABLE u (id INTEGER PRIMARY KEY, tx INTEGER)")
TABLES = ["a", "b"]  # u is captured too, but by no source here: its txlog rows are skipped


def _setup(path: Path) -> Path:
    """The three tables, u captured (for another relay's table set)."""
    _db(path, *DDL)
    install(path, ["u"])
    return path
Change = tuple[str, str, Any]  # (table, op letter, key)


def _full(windows: list[Window]) -> list[tuple[int, bytes]]:
    """What a consumer can tell apart: the windows with events, as (SCN, bytes)."""
    return [(w.scn, w.events) for w in windows if w.count]


def _cuts(db: Path) -> list[int]:
    with closing(sqlite3.connect(db)) as con:
        return [r[0] for r in con.execute("SELECT scn FROM _databus_cuts ORDER BY scn")]


def _tx_of(change: tuple[str, str, Any, Any, Any]) -> int:
    table, _op, key, _before, after = change
    return int(key[0]) if table == "b" else int(after["tx"])


class Workload:
    """Random multi-row transactions on a, b (captured) and u (not), some rolled back,
    some touching u only; ``committed`` lists the captured changes of each committed
    one, in statement order."""

    def __init__(self, db: Path, seed: int) -> None:
        self.db = db
        self.rng = random.Random(seed)
        self.committed: list[list[Change]] = []
        self.a_ids: list[int] = []
        self.u_id = 0

    def transaction(self, con: sqlite3.Connection, tx: int) -> None:
        rng = self.rng
        con.execute("BEGIN IMMEDIATE")
        changes: list[Change] = []
        only_u = rng.random() < 0.15
        for line in range(rng.randrange(1, 7)):
            kind = "u" if only_u else rng.choice("aabbbu")
            if kind == "u":
                self.u_id += 1
                con.execute("INSERT INTO u VALUES (?, ?)", (self.u_id, tx))
            elif kind == "b":
                con.execute("INSERT INTO b VALUES (?, ?, ?)", (tx, line, "x" * rng.randrange(9)))
                changes.append(("b", "c", [tx, line]))
            elif self.a_ids and rng.random() < 0.5:
                aid = rng.choice(self.a_ids)
                con.execute("UPDATE a SET n = n + 1, tx = ? WHERE id = ?", (tx, aid))
                changes.append(("a", "u", aid))
            else:
                aid = tx * 10 + line
                con.execute("INSERT INTO a VALUES (?, 0, ?)", (aid, tx))
                changes.append(("a", "c", aid))
        if rng.random() < 0.1:
            con.execute("ROLLBACK")
            return
        con.execute("COMMIT")
        self.a_ids += [k for t, op, k in changes if t == "a" and op == "c"]
        if changes:
            self.committed.append(changes)


def _drain(src: SqliteSource, after: int, into: list[Window]) -> None:
    """Read until a read finds nothing (nothing is being written any more)."""
    while True:
        got = src.read(into[-1].scn if into else after, threading.Event(), 0.05)
        if not got:
            return
        into.extend(got)


def _run(db: Path, cuts: str, *, txs: int = 360, seed: int = 5
         ) -> tuple[Workload, list[Window], list[Window], list[Window], int]:
    """The workload with three readers: ``eager`` (in the writer's thread, after every
    1-3 commits), ``bursty`` (its own thread: sleeps, then reads all there is) and
    ``late`` (started halfway from the middle of eager's windows). Returns the
    workload, the three window lists and late's start position."""
    work = Workload(db, seed)
    kw: dict[str, Any] = {"window_cuts": cuts, "poll_interval": 0.001}
    eager_w: list[Window] = []
    bursty_w: list[Window] = []
    late_w: list[Window] = []
    halfway = threading.Event()
    done = threading.Event()
    errors: list[BaseException] = []
    late_from: list[int] = []
    with _source(db, TABLES, name="eager", **kw) as eager, \
            _source(db, TABLES, name="bursty", **kw) as bursty, \
            _source(db, TABLES, name="late", **kw) as late:

        def write() -> None:
            try:
                with closing(sqlite3.connect(db, isolation_level=None, timeout=30)) as con:
                    next_read = 1
                    for tx in range(1, txs + 1):
                        work.transaction(con, tx)
                        if tx >= next_read:
                            eager_w.extend(_read_all(eager, eager_w[-1].scn if eager_w else -1))
                            next_read = tx + work.rng.randrange(1, 4)
                        if tx == txs // 2:
                            halfway.set()
                        time.sleep(0.001 * work.rng.randrange(3))
            except BaseException as exc:
                errors.append(exc)
            finally:
                halfway.set()
                done.set()

        def read_in_bursts() -> None:
            rng = random.Random(seed + 1)
            try:
                while not done.is_set():
                    time.sleep(rng.uniform(0.02, 0.25))
                    bursty_w.extend(_read_all(bursty, bursty_w[-1].scn if bursty_w else -1))
            except BaseException as exc:
                errors.append(exc)

        def read_late() -> None:
            try:
                halfway.wait()
                # the middle of what eager has emitted so far (a window with events)
                full = [w for w in list(eager_w) if w.count]
                late_from.append(full[len(full) // 2].scn)
                while not done.is_set():
                    late_w.extend(late.read(late_w[-1].scn if late_w else late_from[0],
                                            threading.Event(), 0.02))
                    time.sleep(0.03)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=f) for f in (write, read_in_bursts, read_late)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        _drain(eager, -1, eager_w)
        _drain(bursty, -1, bursty_w)
        _drain(late, late_from[0], late_w)
    return work, eager_w, bursty_w, late_w, late_from[0]


def test_shared_cut_readers_emit_identical_windows_whatever_their_timing(
        tmp_path: Path) -> None:
    db = _setup(tmp_path / "s.db")
    work, eager, bursty, late, late_from = _run(db, "shared")
    cuts = set(_cuts(db))
    for windows in (eager, bursty, late):
        scns = [w.scn for w in windows]
        assert scns == sorted(set(scns)), "window SCNs strictly increase"
        assert set(scns) <= cuts, "every window (empty ones too) ends at a cut"
    assert len(_full(eager)) > 50, "eager reads make many small windows"
    assert _full(bursty) == _full(eager)
    assert _full(late) == [w for w in _full(eager) if w[0] > late_from]
    assert len(_full(late)) > 10
    # the union of events is what was committed, in commit order, each transaction whole
    with _source(db, TABLES, name="check") as src:
        got = _changes(src, eager)
    assert [(t, op, k) for t, op, k, _b, _a in got] == [c for tx in work.committed for c in tx]
    window_of: dict[int, set[int]] = {}
    flat = 0
    for wi, w in enumerate(eager):
        for _ in range(w.count):
            window_of.setdefault(_tx_of(got[flat]), set()).add(wi)
            flat += 1
    assert len(window_of) == len(work.committed)
    assert all(len(ws) == 1 for ws in window_of.values()), "a transaction split"


def test_local_cuts_differ_between_readers_of_the_same_workload(tmp_path: Path) -> None:
    """The same workload with local cuts: the readers' windows differ (so the test
    above would notice shared cuts that are not shared), their events do not."""
    db = _setup(tmp_path / "l.db")
    work, eager, bursty, _late, _from = _run(db, "local")
    assert _cuts(db) == []
    assert [s for s, _ in _full(eager)] != [s for s, _ in _full(bursty)]
    with _source(db, TABLES, name="check") as src:
        flat = [(t, op, k) for t, op, k, _b, _a in _changes(src, eager)]
        assert flat == [(t, op, k) for t, op, k, _b, _a in _changes(src, bursty)]
    assert flat == [c for tx in work.committed for c in tx]


def _commit_some(db: Path, work: Workload, txs: range) -> None:
    with closing(sqlite3.connect(db, isolation_level=None, timeout=30)) as con:
        for tx in txs:
            work.transaction(con, tx)


def test_restarted_source_resumes_with_the_windows_of_one_that_never_stopped(
        tmp_path: Path) -> None:
    db = _setup(tmp_path / "r.db")
    work = Workload(db, 11)
    steady: list[Window] = []
    restarted: list[Window] = []
    with _source(db, TABLES, name="steady", window_cuts="shared") as a:
        with _source(db, TABLES, name="restarted", window_cuts="shared") as r:
            for tx in range(1, 60, 3):
                _commit_some(db, work, range(tx, tx + 3))
                steady.extend(_read_all(a, steady[-1].scn if steady else -1))
                restarted.extend(_read_all(r, restarted[-1].scn if restarted else -1))
        stopped_at = restarted[-1].scn
        # while it is down, the other one reads (and cuts) on
        for tx in range(61, 121, 4):
            _commit_some(db, work, range(tx, tx + 4))
            steady.extend(_read_all(a, steady[-1].scn))
        with _source(db, TABLES, name="restarted", window_cuts="shared") as r:
            first = r.read(stopped_at, threading.Event(), 0.1)
            assert len(first) > 1, "a backlog of cuts comes as several windows in one read"
            restarted.extend(first)
            restarted.extend(_read_all(r, restarted[-1].scn))
            assert _full(restarted) == _full(steady)
            # the restarted one reads a new backlog first: its cut is the other's too
            _commit_some(db, work, range(125, 145))
            restarted.extend(_read_all(r, restarted[-1].scn))
            steady.extend(_read_all(a, steady[-1].scn))
            assert _full(restarted) == _full(steady)
            # and from any window's SCN, a fresh reader produces what followed it
            with _source(db, TABLES, name="fresh", window_cuts="shared") as f:
                for w in steady[:: max(1, len(steady) // 7)]:
                    assert _full(_read_all(f, w.scn)) == [x for x in _full(steady)
                                                          if x[0] > w.scn]


def test_one_read_stops_at_its_caps_but_always_returns_a_whole_window(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = _setup(tmp_path / "c.db")
    with _source(db, TABLES, name="cutter", window_cuts="shared") as cutter:
        pos = -1
        for tx in range(10):  # ten windows of three rows, each cut by a read
            _exec(db, *[("INSERT INTO b VALUES (?, ?, 'p')", (tx, i)) for i in range(3)])
            got = _read_all(cutter, pos)
            assert [w.count for w in got] == [3]
            pos = got[-1].scn
        _exec(db, *[("INSERT INTO b VALUES (?, ?, 'p')", (10, i)) for i in range(12)])
        assert [w.count for w in _read_all(cutter, pos)] == [12]
    everything = _full(_read_all_fresh(db))
    assert len(everything) == 11
    monkeypatch.setattr(cuts_mod, "_CUTS_PER_READ", 4)
    with _source(db, TABLES, name="capped", window_cuts="shared") as src:
        assert _full(src.read(-1, threading.Event(), 0)) == everything[:4]
    monkeypatch.setattr(cuts_mod, "_CUTS_PER_READ", 1000)
    monkeypatch.setattr(cuts_mod, "_ROWS_PER_READ", 5)
    with _source(db, TABLES, name="capped", window_cuts="shared") as src:
        assert _full(src.read(-1, threading.Event(), 0)) == everything[:1]
        # the 12-row window is larger than the budget: it comes whole, alone
        assert _full(src.read(everything[-2][0], threading.Event(), 0)) == everything[-1:]
        assert _full(_read_all(src)) == everything


def _read_all_fresh(db: Path) -> list[Window]:
    with _source(db, TABLES, name="fresh", window_cuts="shared") as src:
        return _read_all(src)


def test_trim_removes_cuts_with_the_txlog(tmp_path: Path) -> None:
    db = _setup(tmp_path / "t.db")
    windows: list[Window] = []
    with _source(db, TABLES, name="only", window_cuts="shared") as src:
        for tx in range(8):
            _exec(db, ("INSERT INTO b VALUES (?, 0, 'p')", (tx,)), ("INSERT INTO u VALUES (?, ?)",
                                                                    (tx, tx)))
            windows.extend(_read_all(src, windows[-1].scn if windows else -1))
        assert _cuts(db) == [w.scn for w in windows]
        src.acknowledge(windows[3].scn)
        assert _cuts(db) == [w.scn for w in windows[4:]]
        with pytest.raises(SourcePositionLostError):
            src.read(windows[3].scn - 1, threading.Event(), 0)
        assert _full(_read_all(src, windows[3].scn)) == _full(windows[4:])
        src.acknowledge(windows[-1].scn)
        assert _cuts(db) == []
        _exec(db, "INSERT INTO b VALUES (100, 0, 'p')")
        after = _read_all(src, windows[-1].scn)
        assert [w.count for w in after] == [1] and _cuts(db) == [after[0].scn]


def test_a_cut_by_the_sources_own_writer_ends_the_idle_shortcut(tmp_path: Path) -> None:
    """``PRAGMA data_version`` of the reader changes when the source's own writer
    connection commits a cut, so the idle shortcut never hides a cut it made."""
    db = _setup(tmp_path / "d.db")
    with _source(db, TABLES, name="self", window_cuts="shared") as src, \
            _source(db, TABLES, name="other", window_cuts="shared") as other:
        assert _read_all(src) == []  # idle: its reader's data_version noted
        _exec(db, "INSERT INTO a VALUES (1, 0, 1)")
        before = src._reader.execute("PRAGMA data_version").fetchone()[0]
        src._add_cut()  # the writer connection of the same source
        assert src._reader.execute("PRAGMA data_version").fetchone()[0] != before
        assert _cuts(db) and src.stats()["window_cuts_total"] == 1
        mine = _read_all(src)  # the window of its own cut
        _exec(db, "INSERT INTO a VALUES (2, 0, 2)")
        theirs = _read_all(other)  # reads that window, then cuts after row 2
        mine += _read_all(src, mine[-1].scn)  # takes the other's cut as it is
        assert src.stats()["window_cuts_total"] == 1 and other.stats()["window_cuts_total"] == 1
        assert _full(mine) == _full(theirs) and len(mine) == 2


def test_schema_change_and_other_tables_keep_shared_windows_identical(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_mod, "_PROGRESS_AFTER", 0.1)
    db = _setup(tmp_path / "v.db")
    one: list[Window] = []
    two: list[Window] = []
    with _source(db, TABLES, name="one", window_cuts="shared") as a, \
            _source(db, TABLES, name="two", window_cuts="shared") as b:
        _exec(db, "INSERT INTO a VALUES (1, 0, 1)")
        one.extend(_read_all(a))
        _exec(db, "ALTER TABLE a ADD COLUMN extra TEXT")
        assert _read_all(a, one[-1].scn) == []  # re-installs capture (logs nothing)
        _exec(db, "INSERT INTO a VALUES (2, 0, 2, 'e')", "INSERT INTO u VALUES (1, 2)")
        one.extend(_read_all(a, one[-1].scn))
        _exec(db, "INSERT INTO u VALUES (2, 3)")  # other tables only: an empty window
        _exec(db, "INSERT INTO b VALUES (4, 0, 'p')")
        two.extend(_read_all(b))
        one.extend(_read_all(a, one[-1].scn))
        _exec(db, "INSERT INTO u VALUES (3, 5)")
        one.extend(_read_all(a, one[-1].scn))  # cuts after u's row
        empty = a.read(one[-1].scn, threading.Event(), 1.0)
        assert [w.count for w in empty] == [0] and empty[0].scn in _cuts(db)
        one.extend(empty)
        two.extend(_read_all(b, two[-1].scn))
        assert _full(one) == _full(two)
        assert len(_full(one)) == 3
        assert [x[4].get("extra") for x in _changes(a, one) if x[0] == "a"] == [None, "e"]


def test_shared_cuts_after_a_snapshot_and_when_the_position_is_lost(tmp_path: Path) -> None:
    """A snapshot's chunk windows keep their SCN; the window after one ends at the
    smallest cut above it, and from then on the windows are everyone's."""
    db = _setup(tmp_path / "n.db")
    _exec(db, *[("INSERT INTO a VALUES (?, 0, 0)", (i,)) for i in range(1, 8)])
    with _source(db, TABLES, name="stream", window_cuts="shared") as other, \
            _source(db, TABLES, name="snap", window_cuts="shared", snapshot_mode="initial",
                    snapshot_chunk_size=3) as snap:
        seen: list[Window] = []
        _exec(db, "INSERT INTO b VALUES (1, 0, 'p')")
        theirs = _read_all(other)  # cuts (a backlog of one cut)
        while snap.stats()["snapshot_completed_total"] == 0:
            seen.extend(snap.read(seen[-1].scn if seen else -1, threading.Event(), 0.1))
            _exec(db, ("INSERT INTO b VALUES (2, ?, 'p')", (len(seen),)))
            theirs.extend(_read_all(other, theirs[-1].scn))
        last_chunk = seen[-1].scn
        _exec(db, "INSERT INTO b VALUES (3, 0, 'p')")
        theirs.extend(_read_all(other, theirs[-1].scn))
        after = _read_all(snap, last_chunk)
        assert after and all(w.scn in _cuts(db) for w in after)
        tail = [x for x in _full(theirs) if x[0] > after[0].scn]
        assert _full(after)[1:] == tail and len(tail) >= 1
        # the position is trimmed: when_needed snapshots again, then streams at cuts
        other.acknowledge(theirs[-1].scn)
        snap.acknowledge(after[-1].scn)
    with _source(db, TABLES, name="snap", window_cuts="shared",
                 snapshot_mode="when_needed") as again:
        got = _read_all(again, 0)
        assert any(w.count for w in got)
        _exec(db, "INSERT INTO b VALUES (9, 0, 'p')")
        more = _read_all(again, got[-1].scn)
        assert [w.count for w in more] == [1] and more[0].scn in _cuts(db)


HOT_WRITER = """
import sqlite3, sys, time
con = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
until, tx = time.monotonic() + float(sys.argv[2]), 0
while time.monotonic() < until:  # back to back: the write lock is free for microseconds
    tx += 1
    con.execute("BEGIN IMMEDIATE")
    con.execute("INSERT INTO b VALUES (?, 0, 'p')", (tx,))
    con.execute("COMMIT")
print(tx)
"""


def test_cuts_are_taken_between_back_to_back_application_transactions(tmp_path: Path) -> None:
    """An application committing without pause for longer than the busy timeout:
    the source still cuts (and emits) while it runs, never failing with "locked"."""
    db = _setup(tmp_path / "h.db")
    with _source(db, TABLES, name="hot", window_cuts="shared", busy_timeout=0.5) as src:
        writer = subprocess.Popen([sys.executable, "-c", HOT_WRITER, str(db), "2.0"],
                                  stdout=subprocess.PIPE, text=True)
        windows: list[Window] = []
        while writer.poll() is None:
            windows.extend(src.read(windows[-1].scn if windows else -1, threading.Event(), 0.1))
        during = len(windows)
        txs = int(writer.communicate()[0])
        windows.extend(_read_all(src, windows[-1].scn if windows else -1))
    # about 20 on an idle machine; fewer when the writer process gets most of the CPU
    assert during >= 8, f"only {during} windows while the writer ran"
    assert sum(w.count for w in windows) == txs


@pytest.mark.parametrize("window_cuts", ["shared", "local"])
def test_trimming_under_back_to_back_application_transactions(tmp_path: Path,
                                                              window_cuts: str) -> None:
    """Acknowledging (which records the relay's position and trims the txlog) takes
    the write lock between an application's back-to-back transactions too, instead
    of failing with "locked" after the busy timeout; the trimmed rows are gone."""
    db = _setup(tmp_path / "t.db")
    with _source(db, TABLES, name="hot", window_cuts=window_cuts, busy_timeout=0.5) as src:
        writer = subprocess.Popen([sys.executable, "-c", HOT_WRITER, str(db), "2.0"],
                                  stdout=subprocess.PIPE, text=True)
        windows: list[Window] = []
        acks = 0
        while writer.poll() is None:
            windows.extend(src.read(windows[-1].scn if windows else -1, threading.Event(), 0.1))
            if windows:
                src.acknowledge(windows[-1].scn)
                acks += 1
        txs = int(writer.communicate()[0])
        windows.extend(_read_all(src, windows[-1].scn if windows else -1))
        src.acknowledge(windows[-1].scn)
    assert acks >= 10, f"only {acks} acknowledgements while the writer ran"
    assert sum(w.count for w in windows) == txs
    with closing(sqlite3.connect(db)) as con:
        left = con.execute("SELECT count(*) FROM _databus_txlog WHERE scn <= ?",
                           (windows[-1].scn,)).fetchone()[0]
    assert left == 0
