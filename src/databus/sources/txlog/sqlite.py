"""SQLite capture through triggers and a txlog table: the embedded default.

The seeds' "Databus for Oracle" design adapted to SQLite. Triggers (see
:mod:`databus.sources.txlog.catalog`) append every changed row to
``_databus_txlog`` inside the application's own transaction, so a change is
in the txlog exactly when its transaction committed, and a rolled-back change
never is.

**SCN.** The txlog's ``INTEGER PRIMARY KEY AUTOINCREMENT`` id. SQLite has one
writer at a time, holding the write lock from its first write to its commit,
so ids are assigned in commit order and never reused (AUTOINCREMENT remembers
the highest id ever committed, also after trimming).

**Windows.** :meth:`SqliteSource.read` takes, in ONE read transaction (one
commit-consistent snapshot: in WAL mode a reader sees exactly the transactions
committed before its first read), every txlog row above ``after_scn``. Those
rows are whole committed transactions, and they become ONE window whose SCN is
the highest txlog SCN in the snapshot. SQLite has no transaction id a trigger
could record, so transactions cannot be told apart: a window holds one or more
whole transactions (one, when the reader keeps up with the writer; the whole
backlog after a restart), never a part of one. For the same reason there is no
``max_window_rows``: any cap could cut a transaction.

**Shared window cuts** (``window_cuts="shared"``; the default ``"local"`` is the
above). With local cuts a window ends where this reader's snapshot ended, so two
relays capturing the same database cut it differently. With shared cuts window
boundaries are rows of ``_databus_cuts`` (SCNs of txlog rows), a property of the
database, and every shared-cut reader emits the same windows:

* the window after position ``S`` holds exactly the txlog rows with
  ``S < scn <= c``, ``c`` the smallest cut above ``S``; its SCN is ``c``, its
  timestamp the ``ts`` of the txlog row at ``c`` (so its bytes are the same on
  every reader);
* a reader that finds txlog rows above ``S`` but no cut above ``S`` adds one at
  the txlog's highest SCN in a ``BEGIN IMMEDIATE`` transaction of its writer
  connection, re-reading the highest SCN and the newest cut inside it (nothing is
  inserted when another reader cut there or above first). SQLite has one writer:
  holding the write lock, no application transaction is half-written, so a cut
  always falls between transactions. The lock is asked for every 0.1 ms for up to
  ``busy_timeout`` (:func:`~databus.sources.txlog._db.begin_immediate`), then
  the read fails with SourceUnavailableError;
* one read returns every window of the cuts already present above ``S`` (a
  reader behind a backlog: several), up to ``_CUTS_PER_READ`` windows or about
  ``_ROWS_PER_READ`` own rows (always at least one whole window);
* a window without own rows is not sent (the next one covers its range: positions
  are compared with ``>``), except as the empty progress window below, whose SCN
  is then a cut. Which empty windows a reader sends depends on its timing; the
  windows with events do not;
* snapshot chunk windows (one reader snapshots) keep the SCN of their read
  transaction (as does the empty window that may follow a snapshot's last,
  eventless chunk); the window after one again ends at the smallest cut above it.

The cost: one short write transaction (a commit) per poll that finds new data
without a cut, taking the application's write lock briefly.

**Restart.** ``read(after_scn=S)`` returns exactly the rows with SCN > S.
``S < 0`` means "from the oldest row the txlog still has" (a new relay starts
there, whatever was trimmed for others) with ``snapshot_mode="no_data"``; the
other modes start with a snapshot instead (below). ``S >= 0`` below the highest trimmed
SCN (``_databus_meta.trimmed_scn``), or above the highest SCN ever assigned (the
database was replaced or capture re-installed from scratch), raises
:class:`~databus.core.errors.SourcePositionLostError` (``when_needed``: a
snapshot instead).

**Trimming.** Each source registers its relay's shared name
(``Capturer.shared_name``: the relay's name, or its cluster's) in
``_databus_relays`` when it starts (position -1, or kept from before) and
:meth:`acknowledge` moves it; two relays with different names never share a row,
so neither trims what the other has not read. A relay whose name was derived
(``Capturer.legacy``) that finds no row of its own but one named ``relay`` (every
relay's name before names were derived) refuses to start, naming ``--name relay``:
adopting the row could take another relay's position, ignoring it would hold back
trimming for ever.
Txlog rows at or below the lowest position of all registered relays are
deleted, with the cuts at or below them, in batches of short write
transactions. A relay that is gone for good must be removed
(:func:`databus.sources.txlog.catalog.forget_relay`) or the txlog keeps
growing.

**Several relays, several table sets.** Install never removes capture of
tables it was not given, so the txlog may hold rows of tables this source does
not capture: they are skipped, but still count for positions (a window's SCN is
the snapshot's highest SCN, or a cut). When only such rows arrive for a while
(``_PROGRESS_AFTER`` seconds) an empty window (no events) moves the position on,
so the relay acknowledges them and they can be trimmed.

**Schema changes.** ``PRAGMA schema_version`` is checked on every poll that
finds new data; when a captured table's columns or capture triggers changed
(``ALTER TABLE``, a dropped and re-created table), capture is re-installed:
a new table version, new triggers. Rows the application wrote between its
``ALTER TABLE`` and that re-install were logged by the old triggers with the
old version (the new column is missing from them): in the re-install's own
transaction, each of those rows is read from the table and logged again whole,
as a READ (``r``) event of the new version
(:func:`~databus.sources.txlog.catalog.refresh_rows`), so a consumer applying
changes in order ends with every column as the table has it; the new column's
values of the in-between changes themselves are not known. To avoid that
window, call :func:`~databus.sources.txlog.catalog.install` with the
application's connection in the same transaction as the ``ALTER TABLE``.

**Columns.** ``include_columns``/``exclude_columns`` (regexes on
``table.column`` or ``main.table.column``, :mod:`databus.sources.columns`; key
columns always kept) are applied when txlog rows are read: each table version's
codec leaves the other columns out of its schema and payloads, and snapshots
select them as NULL. The triggers log whole rows: they and the txlog are the
database's, shared by every relay capturing it, each with its own filters. The
schemas this relay served are recorded in ``<state_dir>/<relay>.sqlite-schemas.json``
(:mod:`.history`), so after a restart with other filters the events it buffered
before still have their schema.

**Events.** One data event per own txlog row (see :mod:`.rows` for types and
keys): sequence = the window SCN; payload = Avro of the after image (the
before image for a delete); metadata = ``before`` (Avro of the before image,
updates only), ``txid`` (``"sqlite:<window scn>"``), ``row`` (index of the
event in the window). An update that changes the key (primary key, or rowid of
a table without one) arrives as a delete of the old key then an insert of the
new. The timestamp is the time the trigger ran (``julianday('now')``, ms
resolution), not the commit time, which SQLite does not expose; the window's
timestamp is that of its newest txlog row.

**Connections.** Two per source, both to the file in autocommit mode with a
busy timeout: a reader (never blocks writers in WAL mode) and a writer (trim,
re-install, markers, shared cuts; short transactions). ``sqlite3`` errors never
escape: see :mod:`databus.sources.txlog._db`.

**Snapshot modes** (``snapshot_mode``, as for the MySQL source; see
docs/snapshots.md): ``initial`` (the default) makes a relay without a position
(``read(after_scn<0)``) first send every existing row of the captured tables
as ``r`` events, chunk by chunk, while it keeps streaming; it then streams from
the txlog position the snapshot started at (the backlog before it is not
sent: the snapshot covers it). ``initial_only`` stops after the snapshot (read
returns nothing more); ``no_data`` only streams; ``when_needed`` snapshots
when there is no position, and, instead of raising SourcePositionLostError,
when the position is gone (the next window is then above the lost position
and the current txlog end); ``always`` snapshots at every start. How chunks
stay consistent with the stream, the marker rows that give every chunk window
a fresh SCN, and what a restart resumes: :mod:`databus.sources.txlog.snapshot`.
**Origin** (:meth:`origin`): ``sqlite:`` and the installation's random id
(``_databus_meta.epoch``), the same for every relay capturing the database; a new id
(a capture installed from scratch) means new SCNs.

Progress is kept in ``<state_dir>/<relay name>.sqlite-snapshot.json``
(in memory without ``state_dir``: a restarted process then resumes nothing and
follows its mode from the position it is given).

Limits: REPLACE conflict resolution deletes conflicting rows without firing
delete triggers unless the application connection sets ``PRAGMA
recursive_triggers=ON``; ``VACUUM`` may renumber rowids of tables without an
``INTEGER PRIMARY KEY`` (their event keys) without any trigger firing; a
captured table may have at most (SQLite's column limit - 6) / 2 columns.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from databus.core import event as ev
from databus.core.errors import ConfigError, SourcePositionLostError, TerminalError
from databus.core.schema import MetadataCodec, SchemaRegistry
from databus.core.window import Window
from databus.sources.base import Capturer, Source, SourceInfo
from databus.sources.columns import ColumnFilter
from databus.sources.common.progress import ProgressRecords
from databus.sources.config import SqliteSourceConfig
from databus.sources.txlog import catalog as cat
from databus.sources.txlog._db import (
    begin_immediate,
    connect,
    rollback_quietly,
    translated,
)
from databus.sources.txlog.history import SchemaHistory
from databus.sources.txlog.rows import VersionCodec, WindowMetadata, keep_of
from databus.sources.txlog.snapshot import MARKER_SRC, SnapshotState, read_chunks

log = logging.getLogger("databus.sources.sqlite")

_OPS = {cat.OP_INSERT: ev.Op.INSERT, cat.OP_UPDATE: ev.Op.UPDATE, cat.OP_DELETE: ev.Op.DELETE,
        cat.OP_READ: ev.Op.READ}
_PROGRESS_AFTER = 1.0  # seconds of rows of other tables only before an empty window
_TRIM_BATCH = 5000  # txlog rows deleted per write transaction
_TRIM_PAUSE = 0.002  # seconds between trim batches, so application writers get the lock
# shared cuts: what one read returns at most (a relay behind a backlog catches up in
# steps, each a bounded amount of memory); at least one whole window, whatever its size
_CUTS_PER_READ = 1000
_ROWS_PER_READ = 20_000


class _Retry(Exception):
    """Internal: capture was re-installed; poll again."""


class SqliteSource(Source):
    """Captures the tables of ``config`` in the SQLite database of its URL (see the
    module docstring).

    The constructor only describes the capture. :meth:`open` installs (or updates) it:
    it switches the database to WAL, creates the ``_databus_*`` tables and triggers,
    and registers the relay (``capturer``, else ``Capturer(name)``) for trimming.
    ``poll_interval`` (config) is
    the pause between polls of an idle txlog (an idle poll costs one
    ``PRAGMA data_version``); ``busy_timeout`` is how long a statement waits for the
    application's locks; ``state_dir`` is where snapshot progress is kept;
    ``window_cuts`` (config) whether windows end at cuts shared by every relay.
    """

    def __init__(self, config: SqliteSourceConfig, *, name: str = "relay",
                 busy_timeout: float = 5.0, state_dir: Path | None = None,
                 capturer: Capturer | None = None) -> None:
        path = config.url[len("sqlite:///"):] if config.url.startswith("sqlite:///") else ""
        if not path:
            raise ConfigError("sqlite source needs a path: sqlite:///PATH.db")
        if not config.tables:
            raise ConfigError("sqlite source needs --tables (the tables to capture)")
        self.config = config
        self.path = Path(path)
        self.tables = list(config.tables)
        self.poll_interval = config.poll_interval
        self.capturer = capturer if capturer is not None else Capturer(name)
        self.relay_name = self.capturer.shared_name  # its row of _databus_relays
        self.snapshot_mode = config.snapshot_mode
        self.chunk_size = config.snapshot_chunk_size
        self.shared_cuts = config.window_cuts == "shared"
        self.busy_timeout = busy_timeout
        self._records_path = (Path(state_dir) / f"{self.capturer.name}.sqlite-snapshot.json"
                              if state_dir else None)
        self._columns = ColumnFilter.of(config)
        # every schema this relay emitted (include/exclude_columns can change between
        # runs, and events of the old ones may still be in its buffer)
        self._history = SchemaHistory(
            Path(state_dir) / f"{self.capturer.name}.sqlite-schemas.json" if state_dir else None)
        self._pos: int | None = None  # the position read() continues from (None: not opened)
        self._snap: SnapshotState | None = None  # the running snapshot
        self._started = False  # this process started its mode's snapshot
        self._lost: int | None = None  # a lost position when_needed replaced by a snapshot
        # every key present from the start: stats() copies it from other threads
        self._stats = dict.fromkeys(("snapshot_started_total", "snapshot_chunks_total",
                                     "snapshot_rows_total", "snapshot_completed_total",
                                     "window_cuts_total"), 0.0)
        self._infos: list[SourceInfo] = []
        self._own: frozenset[int] = frozenset()
        self._tables: dict[int, str] = {}
        self._meta = MetadataCodec()
        self._registry = SchemaRegistry()
        self._codecs: dict[tuple[int, int], VersionCodec] = {}
        self._latest: dict[int, VersionCodec] = {}
        self._versions_seen = 0
        self._width = 0  # txlog v* columns read: twice the widest own version
        self._schema_version: int | None = None
        # the txlog's top in a read that found every captured table as installed:
        # rows up to it were logged before any later ALTER TABLE (refresh_rows)
        self._clean_upto = -1
        self._idle: tuple[int, int] | None = None  # (data_version, after_scn) with nothing new
        self._skip: tuple[int, int, int, float] | None = None  # after, top, top ts, since
        self._missing: set[str] = set()
        self._reinstalls = 0  # consecutive re-installs that did not make capture current
        self._opened = False
        self._closed = False
        self._epoch: int | None = None
        self._read_lock = threading.Lock()
        self._write_lock = threading.Lock()

    def open(self) -> None:
        """Installs capture, connects and loads the table versions; snapshot progress
        is read from ``state_dir``. Idempotent."""
        if self._opened:
            return
        self._records = ProgressRecords(self._records_path, keep=None)  # one per chunk window
        infos = cat.install(self.path, self.tables)
        self._infos = sorted({i.id: i for i in infos}.values(), key=lambda i: i.id)
        self._own = frozenset(i.id for i in self._infos)
        self._tables = {i.id: i.name.split(".", 1)[1] for i in self._infos}
        self._reader = connect(self.path, busy_timeout=self.busy_timeout)
        try:
            self._reader.text_factory = _text
            self._writer = connect(self.path, busy_timeout=self.busy_timeout)
        except BaseException:
            self._reader.close()
            raise
        self._opened = True
        try:
            self._register_relay()
            with translated("loading table versions"):
                self._epoch = cat.epoch(self._reader)
                self._load_versions(self._reader)
                self._check_column_filters()
            # schemas of earlier runs (other column filters) are served too
            self._registry = self._history.start(self._registry, self._own)
        except BaseException:
            self.close()
            raise

    # -- contract --------------------------------------------------------------

    def sources(self) -> list[SourceInfo]:
        return list(self._infos)

    def registry(self) -> SchemaRegistry:
        return self._registry

    def read(self, after_scn: int, stop: threading.Event, timeout: float) -> list[Window]:
        """The next window after ``after_scn`` (shared cuts: possibly several), waiting
        up to ``timeout`` seconds for one."""
        deadline = time.monotonic() + timeout
        while not stop.is_set():
            try:
                with self._read_lock:
                    if after_scn != self._pos:
                        self._open(after_scn)
                    windows: list[Window] = []
                    if self._snap is not None:
                        chunk = self._chunk_window(after_scn)
                        windows = [chunk] if chunk is not None else []
                    elif self.snapshot_mode != "initial_only":
                        windows = self._poll(after_scn)
                    if windows:
                        self._pos = windows[-1].scn
            except _Retry:
                continue
            except SourcePositionLostError:
                if self.snapshot_mode != "when_needed" or self._lost == after_scn:
                    raise
                with self._read_lock:
                    log.warning("txlog position %d of %s is gone: snapshotting every table"
                                " and streaming from the txlog's end (snapshot_mode"
                                " when_needed)", after_scn, self.path)
                    self._lost = after_scn
                    self._begin(fresh=True)
                continue
            if windows:
                return windows
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            stop.wait(min(self.poll_interval, remaining))
        return []

    def origin(self) -> str:
        """``sqlite:<installation id>`` (see the module docstring)."""
        return "" if self._epoch is None else f"sqlite:{self._epoch:016x}"

    def complete_after(self, after_scn: int) -> int | None:
        """With ``no_data`` a fresh start reads the txlog from its oldest row: complete
        after the highest trimmed SCN (-1 when nothing was ever trimmed); other modes
        start with a snapshot, which summarises (and cannot prove) what came before."""
        if after_scn >= 0:
            return after_scn
        if self.snapshot_mode != "no_data":
            return None
        with self._read_lock, translated("reading the trim position"):
            row = self._reader.execute(
                "SELECT v FROM _databus_meta WHERE k = 'trimmed_scn'").fetchone()
        return int(row[0]) if row is not None else -1

    def acknowledge(self, scn: int) -> None:
        """Record ``scn`` for this relay; trim txlog rows every relay has acknowledged."""
        with self._read_lock:  # the relay restarts at or after scn: older progress can go
            self._records.forget_before(scn)
        with self._write_lock, translated("acknowledging a position"):
            con = self._writer
            first = True
            while True:
                begin_immediate(con, busy_timeout=self.busy_timeout)
                try:
                    if first:
                        con.execute(
                            "INSERT INTO _databus_relays VALUES (?, ?, ?) ON CONFLICT(name)"
                            " DO UPDATE SET acked_scn = excluded.acked_scn,"
                            " updated_at = excluded.updated_at",
                            (self.relay_name, scn, time.time()))
                        first = False
                    done = _trim_batch(con)
                    con.execute("COMMIT")
                except BaseException:
                    rollback_quietly(con)
                    raise
                if done:
                    return
                time.sleep(_TRIM_PAUSE)

    def stats(self) -> dict[str, float]:
        """Snapshot counters (chunk windows, rows, snapshots started and completed)
        and the running snapshot's state."""
        snap = self._snap
        return {**self._stats, "snapshot_running": float(snap is not None),
                "snapshot_tables_left": float(len(snap.tables) if snap else 0)}

    def close(self) -> None:
        with self._read_lock, self._write_lock:
            if self._closed or not self._opened:
                return
            self._closed = True
            self._reader.close()
            self._writer.close()

    # -- snapshots ---------------------------------------------------------------

    def _open(self, after_scn: int) -> None:
        """A (re)start at ``after_scn``: resume or start the mode's snapshot."""
        self._pos = after_scn
        self._lost = None
        self._skip = self._idle = None
        self._snap = None
        if self.snapshot_mode == "no_data":
            return
        if after_scn < 0:
            self._begin(fresh=True)
            return
        self._snap = SnapshotState.restore(self._records.at(after_scn))
        if self._snap is not None:
            log.info("snapshot %s of %s: resuming after scn %d (%d chunks done)",
                     self._snap.id, self.path, after_scn, self._snap.chunks)
        elif self.snapshot_mode == "always" and not self._started:
            self._begin(fresh=False)

    def _begin(self, *, fresh: bool) -> None:
        """Start a snapshot of every captured table; ``fresh``: the consumer has
        nothing, so the txlog backlog before the first chunk is not sent."""
        self._started = True
        self._snap = SnapshotState.start([i.id for i in self._infos], fresh=fresh)
        self._count("snapshot_started_total")
        log.info("snapshot %s of %s: started (%d tables, %d rows per chunk)", self._snap.id,
                 self.path, len(self._snap.tables), self.chunk_size)

    def _count(self, name: str, n: float = 1) -> None:
        self._stats[name] += n

    def _chunk_window(self, after_scn: int) -> Window | None:
        """Stream rows above ``after_scn`` and the next chunk, read in ONE read
        transaction, as one window (see :mod:`databus.sources.txlog.snapshot`).

        A window with no event at all can only end the snapshot (a chunk reads
        on into the next tables); it is not sent: the stream goes on from its
        SCN as after rows of other tables (the next window covers it, or an
        empty one after ``_PROGRESS_AFTER`` seconds), so a consumer of empty
        tables sees their first change first.
        """
        snap = self._snap
        assert snap is not None
        con = self._reader
        got = None
        with translated("reading a snapshot chunk"):
            con.execute("BEGIN")
            try:
                self._check_schema(con)
                if self._lost != after_scn:
                    self._check_position(con, after_scn)
                top = con.execute("SELECT scn, ts FROM _databus_txlog ORDER BY scn DESC"
                                  " LIMIT 1").fetchone()
                if top is not None and top[0] > after_scn:
                    scn, ts = int(top[0]), int(top[1])
                    rows = [] if snap.fresh else self._own_rows(con, after_scn, scn)
                    missing = {s for s, t in self._tables.items() if t in self._missing}
                    new, parts = read_chunks(con, snap, self._latest, missing, self.chunk_size,
                                             scn=scn, timestamp_ns=ts * 1_000_000)
                    got = scn, ts, rows, new, parts
            finally:
                rollback_quietly(con)
        if got is None:  # nothing committed since the last window: a marker gives a new SCN
            self._write_marker(after_scn)
            raise _Retry
        scn, ts, rows, new, parts = got
        stream = self._window(scn, ts, rows)
        done = not new.tables
        self._records.add(scn, None if done else new.to_json())
        self._snap = None if done else new
        self._count("snapshot_chunks_total")
        self._count("snapshot_rows_total", new.rows - snap.rows)
        if done:
            self._count("snapshot_completed_total")
            log.info("snapshot %s of %s: completed at scn %d (%d rows, %d chunk windows)",
                     new.id, self.path, scn, new.rows, new.chunks)
        if stream.count + len(parts) == 0:
            assert done
            self._skip = (after_scn, scn, ts, time.monotonic())
            return None
        return Window(scn, stream.events + b"".join(parts), stream.count + len(parts),
                      ts * 1_000_000)

    def _write_marker(self, floor: int) -> None:
        """Commit a marker row into the txlog with an SCN above ``floor`` and
        every SCN assigned so far (a database replaced under a lost position
        has lower SCNs than the relay's)."""
        with self._write_lock, translated("writing a snapshot marker"):
            self._write_one(
                "INSERT INTO _databus_txlog (scn, src, ver, op, ts, rid) VALUES (max(coalesce("
                "(SELECT seq FROM sqlite_sequence WHERE name = '_databus_txlog'), 0),"
                " coalesce((SELECT max(scn) FROM _databus_txlog), 0), ?) + 1, ?, 0, 0, ?, NULL)",
                (floor, MARKER_SRC, int(time.time() * 1000)))

    def _write_one(self, sql: str, params: tuple[object, ...]) -> None:
        """Run one statement in its own write transaction, asking for the write lock
        the way cuts do (SQLite's busy handler, sleeping up to 100 ms between tries,
        can wait past ``busy_timeout`` for an application that commits back to back
        and fail with "database is locked")."""
        con = self._writer
        begin_immediate(con, busy_timeout=self.busy_timeout)
        try:
            con.execute(sql, params)
            con.execute("COMMIT")
        except BaseException:
            rollback_quietly(con)
            raise

    # -- reading ---------------------------------------------------------------

    def _poll(self, after_scn: int) -> list[Window]:
        if self._skip is not None and self._skip[0] != after_scn:
            self._skip = None
        con = self._reader
        with translated("reading the txlog"):
            # changes when another connection commits, this source's writer included
            dv = int(con.execute("PRAGMA data_version").fetchone()[0])
            if self._idle == (dv, after_scn):
                return self._progress()
            if self.shared_cuts:
                return self._poll_cuts(dv, after_scn)
            con.execute("BEGIN")
            try:
                got = self._snapshot(con, after_scn)
            finally:
                rollback_quietly(con)  # a read transaction: nothing to keep
        if got is None:
            self._idle = (dv, after_scn)
            return self._progress()
        top, top_ts, rows = got
        self._idle = None
        if not rows:
            since = self._skip[3] if self._skip is not None else time.monotonic()
            self._skip = (after_scn, top, top_ts, since)
            return self._progress()
        self._skip = None
        return [self._window(top, top_ts, rows)]

    def _poll_cuts(self, dv: int, after_scn: int) -> list[Window]:
        """:meth:`_poll` with shared cuts: the windows of the cuts above the position,
        after adding a cut when the txlog goes on past the newest one."""
        con = self._reader
        for _ in range(2):  # a second read only after adding a cut
            con.execute("BEGIN")
            try:
                got, uncut = self._read_cuts(con, after_scn)
            finally:
                rollback_quietly(con)
            if got or not uncut:
                break
            self._add_cut()
        if not got:
            self._idle = (dv, after_scn)
            return self._progress()
        self._idle = None
        out: list[Window] = []
        for cut, ts, rows in got:
            if rows:
                out.append(self._window(cut, ts, rows))
                self._skip = None
            else:  # rows of other tables only: the next window covers them
                at = out[-1].scn if out else after_scn  # the position read() gets next
                since = (self._skip[3] if self._skip is not None and self._skip[0] == at
                         else time.monotonic())
                self._skip = (at, cut, ts, since)
        return out or self._progress()

    def _read_cuts(self, con: sqlite3.Connection, after_scn: int
                   ) -> tuple[list[tuple[int, int, list[tuple[Any, ...]]]], bool]:
        """In the open read transaction: ([(cut, its ts, own rows up to it), ...] above
        the position, whether the txlog has rows above it that no cut ends)."""
        self._check_schema(con)
        if self._lost != after_scn:
            self._check_position(con, after_scn)
        start = after_scn
        if self._skip is not None:
            start = max(start, self._skip[1])
        # a cut's txlog row is trimmed with the cut; LEFT JOIN only guards the bytes
        cuts = con.execute(
            "SELECT c.scn, coalesce(t.ts, 0) FROM _databus_cuts c LEFT JOIN _databus_txlog t"
            " ON t.scn = c.scn WHERE c.scn > ? ORDER BY c.scn LIMIT ?",
            (start, _CUTS_PER_READ)).fetchall()
        if not cuts:
            top = con.execute("SELECT max(scn) FROM _databus_txlog").fetchone()[0]
            return [], top is not None and top > start
        rows = self._own_rows(con, start, int(cuts[-1][0]), limit=_ROWS_PER_READ)
        if len(rows) >= _ROWS_PER_READ:  # keep the windows whose rows were all read
            edge = rows[-1][0]
            whole = [c for c in cuts if c[0] <= edge]
            if whole:
                cuts = whole
                rows = [r for r in rows if r[0] <= whole[-1][0]]
            else:  # one window larger than the budget: whole all the same
                cuts = cuts[:1]
                rows = self._own_rows(con, start, int(cuts[0][0]))
        out: list[tuple[int, int, list[tuple[Any, ...]]]] = []
        i = 0
        for cut, ts in cuts:
            j = i
            while j < len(rows) and rows[j][0] <= cut:
                j += 1
            out.append((int(cut), int(ts), rows[i:j]))
            i = j
        return out, False

    def _add_cut(self) -> None:
        """Commit a cut at the txlog's highest SCN, unless the newest cut is there or
        above already (another reader cut first)."""
        with self._write_lock, translated("writing a window cut"):
            con = self._writer
            # holding the write lock, no application transaction is half-written:
            # the highest SCN read here ends a committed transaction
            begin_immediate(con, busy_timeout=self.busy_timeout)
            try:
                cur = con.execute(
                    "INSERT INTO _databus_cuts (scn) SELECT top FROM (SELECT max(scn) AS top"
                    " FROM _databus_txlog) WHERE top > coalesce((SELECT max(scn) FROM"
                    " _databus_cuts), -1)")
                con.execute("COMMIT")
            except BaseException:
                rollback_quietly(con)
                raise
        self._count("window_cuts_total", cur.rowcount)

    def _snapshot(self, con: sqlite3.Connection, after_scn: int
                  ) -> tuple[int, int, list[tuple[Any, ...]]] | None:
        """In the open read transaction: (top scn, its ts, own rows) or None if nothing new."""
        self._check_schema(con)
        if self._lost != after_scn:
            self._check_position(con, after_scn)
        top = con.execute("SELECT scn, ts FROM _databus_txlog ORDER BY scn DESC LIMIT 1"
                          ).fetchone()
        start = after_scn
        if self._skip is not None:
            start = max(start, self._skip[1])
        if top is None or top[0] <= start:
            return None
        return int(top[0]), int(top[1]), self._own_rows(con, start, int(top[0]))

    def _check_schema(self, con: sqlite3.Connection) -> None:
        """Re-install capture (and raise _Retry) when a captured table changed."""
        sv = int(con.execute("PRAGMA schema_version").fetchone()[0])
        if sv != self._schema_version:
            self._check_epoch(con)
            if self._capture_stale(con):
                if self._reinstalls >= 2:
                    raise TerminalError(f"{self.path}: capture still differs from the tables"
                                        " after re-installing it")
                rollback_quietly(con)
                self._reinstall()
                self._reinstalls += 1
                raise _Retry
            self._schema_version = sv
            self._reinstalls = 0
        top = con.execute("SELECT max(scn) FROM _databus_txlog").fetchone()[0]
        self._clean_upto = max(self._clean_upto, -1 if top is None else int(top))
        self._load_versions(con)

    def _check_position(self, con: sqlite3.Connection, after_scn: int) -> None:
        trimmed = con.execute("SELECT v FROM _databus_meta WHERE k = 'trimmed_scn'").fetchone()
        seq = con.execute("SELECT seq FROM sqlite_sequence WHERE name = '_databus_txlog'"
                          ).fetchone()
        if after_scn >= 0 and trimmed is not None and after_scn < trimmed[0]:
            raise SourcePositionLostError(
                f"{self.path}: SCN {after_scn} was trimmed from the txlog (rows up to"
                f" {trimmed[0]} are gone); consumers behind it must bootstrap")
        if after_scn > (seq[0] if seq is not None else 0):
            raise SourcePositionLostError(
                f"{self.path}: SCN {after_scn} is ahead of every SCN this database's txlog"
                " ever assigned (the database was replaced or capture re-installed)")

    def _own_rows(self, con: sqlite3.Connection, start: int, top: int,
                  limit: int = -1) -> list[tuple[Any, ...]]:
        """Txlog rows of the captured tables with ``start < scn <= top``, the first
        ``limit`` (-1: all)."""
        slots = "".join(f", v{i}" for i in range(self._width))
        own = ",".join(str(i) for i in sorted(self._own))
        rows = con.execute(
            f"SELECT scn, src, ver, op, ts, rid{slots} FROM _databus_txlog"
            f" WHERE scn > ? AND scn <= ? AND src IN ({own}) ORDER BY scn LIMIT ?",
            (start, top, limit)).fetchall()
        return rows

    def _progress(self) -> list[Window]:
        """An empty window over rows of other tables only, once they waited long enough."""
        skip = self._skip
        if skip is None or time.monotonic() - skip[3] < _PROGRESS_AFTER:
            return []
        self._skip = None
        return [Window(skip[1], b"", 0, skip[2] * 1_000_000)]

    def _window(self, top: int, top_ts: int, rows: list[tuple[Any, ...]]) -> Window:
        meta = WindowMetadata(self._meta, f"sqlite:{top}")
        meta_id = self._meta.id
        parts: list[bytes] = []
        for index, r in enumerate(rows):
            codec = self._codecs.get((r[1], r[2]))
            if codec is None:
                raise TerminalError(f"{self.path}: txlog row {r[0]} names unknown version"
                                    f" {r[2]} of source {r[1]}")
            n = codec.width
            image = r[6 : 6 + n]
            op = r[3]
            before = codec.encode(r[6 + n : 6 + 2 * n]) if op == cat.OP_UPDATE else None
            parts.append(ev.encode(
                scn=top, src_id=r[1], key=codec.key(image, r[5]), payload=codec.encode(image),
                schema_id=codec.schema.id, schema_version=r[2], op=_OPS[op],
                timestamp_ns=r[4] * 1_000_000, metadata=meta.encode(before, index),
                metadata_schema_id=meta_id,
                # a row read again by refresh_rows: read from the table, not the log
                extra_attributes=ev.ATTR_SNAPSHOT if op == cat.OP_READ else 0))
        return Window(top, b"".join(parts), len(parts), top_ts * 1_000_000)

    def _load_versions(self, con: sqlite3.Connection) -> None:
        newest = con.execute("SELECT max(rowid) FROM _databus_versions").fetchone()[0] or 0
        if newest <= self._versions_seen:
            return
        for tv in cat.load_versions(con, self._versions_seen):
            if tv.src not in self._own or (tv.src, tv.version) in self._codecs:
                continue
            # include/exclude_columns apply to every version, those of later ALTERs too
            codec = VersionCodec(tv, keep_of(self._columns, tv))
            self._codecs[(tv.src, tv.version)] = codec
            self._registry.add(codec.schema)
            if tv.src not in self._latest or tv.version > self._latest[tv.src].tv.version:
                self._latest[tv.src] = codec
            self._width = max(self._width, 2 * codec.width)
        self._versions_seen = int(newest)
        self._history.record(self._registry)  # a no-op until open() started it

    # -- column filters ------------------------------------------------------------

    def _check_column_filters(self) -> None:
        """Warn about an include/exclude_columns regex that matches no column of the
        captured tables: it is applied, to columns added later too, but most likely
        misspelt."""
        if not self._columns:
            return
        names = [f"{t}.{col.name}" for c in self._latest.values() for col in c.tv.columns
                 for t in (c.tv.name, c.tv.table)]
        for pattern in self._columns.unmatched(names):
            log.warning("column regex %r matches no column of the captured tables (columns"
                        " are named table.column or main.table.column)", pattern)

    # -- schema changes ----------------------------------------------------------

    def _check_epoch(self, con: sqlite3.Connection) -> None:
        now = cat.epoch(con)
        if now == self._epoch:
            return
        if now is None:
            raise TerminalError(f"{self.path}: capture was uninstalled under this source")
        raise TerminalError(f"{self.path}: capture was re-installed from scratch under this"
                            " source (new source ids and SCNs); restart the relay")

    def _capture_stale(self, con: sqlite3.Connection) -> bool:
        """Whether a captured table's columns or capture triggers changed since install."""
        self._load_versions(con)
        for src, table in self._tables.items():
            cols = cat.table_columns(con, table)
            if not cols:
                if table not in self._missing:
                    log.warning("captured table %s no longer exists in %s", table, self.path)
                    self._missing.add(table)
                continue
            self._missing.discard(table)
            latest = self._latest.get(src)
            if latest is None or tuple(cols) != latest.tv.columns:
                return True
            prefix = f"{cat.PREFIX}{src}_"
            n = con.execute("SELECT count(*) FROM sqlite_master WHERE type = 'trigger'"
                            " AND tbl_name = ? AND substr(name, 1, ?) = ?",
                            (table, len(prefix), prefix)).fetchone()[0]
            if n != 4:
                return True
        return False

    def _reinstall(self) -> None:
        tables = [t for t in self._tables.values() if t not in self._missing]
        log.info("schema of %s changed: re-installing capture of %s", self.path, tables)
        with self._write_lock, translated("re-installing capture"):
            if tables:
                con = self._writer
                begin_immediate(con, busy_timeout=self.busy_timeout)
                try:
                    before = dict(con.execute("SELECT id, version FROM _databus_sources"))
                    for table in tables:
                        if not con.execute("SELECT 1 FROM sqlite_master WHERE type = 'trigger'"
                                           " AND tbl_name = ? AND substr(name, 1, ?) = ?",
                                           (table, len(cat.PREFIX), cat.PREFIX)).fetchone():
                            log.warning(
                                "%s: capture triggers of %s were gone (table dropped and"
                                " re-created?): writes to it since then were not logged;"
                                " restart the relay with snapshot_mode: always to send its"
                                " rows as they are", self.path, table)
                    infos = cat.install_on(con, tables)
                    changed = [i for i in infos if self._tables.get(i.id) is None]
                    if changed:  # a table re-created under another name cannot happen
                        raise ConfigError(f"capture re-install gave new sources {changed}")
                    after = dict(con.execute("SELECT id, version FROM _databus_sources"))
                    for info in infos:
                        if before.get(info.id) != after[info.id]:
                            cat.refresh_rows(con, info.id, self._clean_upto)
                    con.execute("COMMIT")
                except BaseException:
                    rollback_quietly(con)
                    raise
        self._schema_version = None

    def _register_relay(self) -> None:
        with self._write_lock, translated("registering the relay"):
            self._refuse_legacy_row()
            self._write_one(
                "INSERT OR IGNORE INTO _databus_relays VALUES (?, coalesce((SELECT v FROM"
                " _databus_meta WHERE k = 'trimmed_scn'), -1), ?)",
                (self.relay_name, time.time()))


    def _refuse_legacy_row(self) -> None:
        """A relay with a derived name and no row of its own must not start beside a
        row of the legacy name: see the module docstring (**Trimming**)."""
        legacy = self.capturer.legacy
        if legacy is None or legacy == self.relay_name:
            return
        rows = dict(self._writer.execute(
            "SELECT name, acked_scn FROM _databus_relays WHERE name IN (?, ?)",
            (self.relay_name, legacy)).fetchall())
        if self.relay_name in rows or legacy not in rows:
            return
        raise ConfigError(
            f"{self.path} has a trim registration {legacy!r} (acknowledged scn"
            f" {rows[legacy]}) from before relays had their own names, and none for this"
            f" relay ({self.relay_name!r}): if it is this relay's, start it with --name"
            f" {legacy} (name: {legacy}) to keep its position; if no relay named {legacy}"
            " captures this database any more, remove it (databus.sources.txlog.catalog."
            f"forget_relay(path, {legacy!r})); to start beside it, give this relay a name")


def _trim_batch(con: sqlite3.Connection) -> bool:
    """Delete up to one batch of txlog rows all relays acknowledged, and the cuts at or
    below them; True when none are left."""
    low = con.execute("SELECT min(acked_scn) FROM _databus_relays").fetchone()[0]
    if low is None:
        return True
    row = con.execute("SELECT scn FROM _databus_txlog WHERE scn <= ? ORDER BY scn"
                      " LIMIT 1 OFFSET ?", (low, _TRIM_BATCH - 1)).fetchone()
    last = row is None
    if last:
        row = con.execute("SELECT max(scn) FROM _databus_txlog WHERE scn <= ?", (low,)
                          ).fetchone()
    hi = row[0] if row is not None else None
    if hi is None:
        return True
    con.execute("DELETE FROM _databus_txlog WHERE scn <= ?", (hi,))
    con.execute("DELETE FROM _databus_cuts WHERE scn <= ?", (hi,))
    con.execute("INSERT INTO _databus_meta VALUES ('trimmed_scn', ?) ON CONFLICT(k)"
                " DO UPDATE SET v = max(v, excluded.v)", (hi,))
    return last


def _text(raw: bytes) -> str | bytes:
    """SQLite text as str; text that is not valid UTF-8 stays bytes (carried exactly)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw
