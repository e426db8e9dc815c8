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

**Shared window cuts** (``window_cuts="shared"``, :mod:`.cuts`; the default
``"local"`` is the above): window boundaries are rows of ``_databus_cuts``, a property
of the database, so every shared-cut reader emits the same windows with events; a
reader that finds txlog rows past the newest cut adds one at the txlog's highest SCN.


**Restart.** ``read(after_scn=S)`` returns exactly the rows with SCN > S.
``S < 0`` means "from the oldest row the txlog still has" (a new relay starts
there, whatever was trimmed for others) with ``snapshot_mode="no_data"``; the
other modes start with a snapshot instead (below). ``S >= 0`` below the highest trimmed
SCN (``_databus_meta.trimmed_scn``), or above the highest SCN ever assigned (the
database was replaced or capture re-installed from scratch), raises
:class:`~databus.core.errors.SourcePositionLostError` (``when_needed``: a
snapshot instead).

**Trimming** (:mod:`.trim`). Each source registers its relay's shared name
(``Capturer.shared_name``) in ``_databus_relays`` when it starts and
:meth:`acknowledge` moves it; txlog rows at or below the lowest position of all
registered relays are deleted. A start beside a row of the legacy name ``relay``
(and none of its own) is refused, naming ``--name relay``.

**Several relays, several table sets.** Install never removes capture of
tables it was not given, so the txlog may hold rows of tables this source does
not capture: they are skipped, but still count for positions (a window's SCN is
the snapshot's highest SCN, or a cut). When only such rows arrive for a while
(``_PROGRESS_AFTER`` seconds) an empty window (no events) moves the position on,
so the relay acknowledges them and they can be trimmed.

**Schema changes** (:mod:`.tables`). ``PRAGMA schema_version`` is checked on every
poll that finds new data; when a captured table's columns or capture triggers changed
(``ALTER TABLE``, a dropped and re-created table), capture is re-installed: a new table
version, new triggers. Rows the application wrote between its ``ALTER TABLE`` and that
re-install were logged by the old triggers with the old version (the new column is
missing from them): in the re-install's own transaction, each of those rows is read
from the table and logged again whole, as a READ (``r``) event of the new version
(:func:`~databus.sources.txlog.catalog.refresh_rows`), so a consumer applying changes in
order ends with every column as the table has it; the new column's values of the
in-between changes themselves are not known. To avoid that window, call
:func:`~databus.sources.txlog.catalog.install` with the application's connection in the
same transaction as the ``ALTER TABLE``.

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

from databus.core.errors import ConfigError, SourcePositionLostError
from databus.core.schema import SchemaRegistry
from databus.core.window import Window
from databus.sources.base import Capturer, Source, SourceInfo
from databus.sources.columns import ColumnFilter
from databus.sources.common.progress import ProgressRecords
from databus.sources.config import SqliteSourceConfig
from databus.sources.txlog import catalog as cat
from databus.sources.txlog import cuts, trim
from databus.sources.txlog._db import (
    connect,
    rollback_quietly,
    translated,
    write_one,
)
from databus.sources.txlog.history import SchemaHistory
from databus.sources.txlog.snapshot import MARKER_SRC, SnapshotState, read_chunks
from databus.sources.txlog.tables import Captured, Retry

log = logging.getLogger("databus.sources.sqlite")

_PROGRESS_AFTER = 1.0  # seconds of rows of other tables only before an empty window


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

    _captured: Captured  # the captured tables as this source reads them: made by open()

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
        self._idle: tuple[int, int] | None = None  # (data_version, after_scn) with nothing new
        self._skip: tuple[int, int, int, float] | None = None  # after, top, top ts, since
        self._opened = False
        self._closed = False
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
        self._captured = Captured(self.path, self._infos, self._columns, self._history,
                                  busy_timeout=self.busy_timeout)
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
                self._captured.start(self._reader)
        except BaseException:
            self.close()
            raise

    # -- contract --------------------------------------------------------------

    def sources(self) -> list[SourceInfo]:
        return list(self._infos)

    def registry(self) -> SchemaRegistry:
        return self._captured.registry if self._opened else SchemaRegistry()

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
            except Retry:
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
        epoch = self._captured.epoch if self._opened else None
        return "" if epoch is None else f"sqlite:{epoch:016x}"

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
            trim.acknowledge(self._writer, self.relay_name, scn,
                             busy_timeout=self.busy_timeout)

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
                self._captured.check(con, self._writer, self._write_lock)
                if self._lost != after_scn:
                    self._check_position(con, after_scn)
                top = con.execute("SELECT scn, ts FROM _databus_txlog ORDER BY scn DESC"
                                  " LIMIT 1").fetchone()
                if top is not None and top[0] > after_scn:
                    scn, ts = int(top[0]), int(top[1])
                    cap = self._captured
                    rows = [] if snap.fresh else cap.own_rows(con, after_scn, scn)
                    missing = {s for s, t in cap.tables.items() if t in cap.missing}
                    new, parts = read_chunks(con, snap, cap.latest, missing, self.chunk_size,
                                             scn=scn, timestamp_ns=ts * 1_000_000)
                    got = scn, ts, rows, new, parts
            finally:
                rollback_quietly(con)
        if got is None:  # nothing committed since the last window: a marker gives a new SCN
            self._write_marker(after_scn)
            raise Retry
        scn, ts, rows, new, parts = got
        stream = self._captured.window(scn, ts, rows)
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
            write_one(
                self._writer,
                "INSERT INTO _databus_txlog (scn, src, ver, op, ts, rid) VALUES (max(coalesce("
                "(SELECT seq FROM sqlite_sequence WHERE name = '_databus_txlog'), 0),"
                " coalesce((SELECT max(scn) FROM _databus_txlog), 0), ?) + 1, ?, 0, 0, ?, NULL)",
                (floor, MARKER_SRC, int(time.time() * 1000)), busy_timeout=self.busy_timeout)

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
        return [self._captured.window(top, top_ts, rows)]

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
                out.append(self._captured.window(cut, ts, rows))
                self._skip = None
            else:  # rows of other tables only: the next window covers them
                at = out[-1].scn if out else after_scn  # the position read() gets next
                since = (self._skip[3] if self._skip is not None and self._skip[0] == at
                         else time.monotonic())
                self._skip = (at, cut, ts, since)
        return out or self._progress()

    def _read_cuts(self, con: sqlite3.Connection, after_scn: int
                   ) -> tuple[list[cuts.Cut], bool]:
        """In the open read transaction: :func:`.cuts.read_cuts` above the position."""
        self._captured.check(con, self._writer, self._write_lock)
        if self._lost != after_scn:
            self._check_position(con, after_scn)
        start = after_scn
        if self._skip is not None:
            start = max(start, self._skip[1])
        return cuts.read_cuts(con, start, self._captured.own_rows)

    def _add_cut(self) -> None:
        with self._write_lock, translated("writing a window cut"):
            added = cuts.add_cut(self._writer, busy_timeout=self.busy_timeout)
        self._count("window_cuts_total", added)

    def _snapshot(self, con: sqlite3.Connection, after_scn: int
                  ) -> tuple[int, int, list[tuple[Any, ...]]] | None:
        """In the open read transaction: (top scn, its ts, own rows) or None if nothing new."""
        self._captured.check(con, self._writer, self._write_lock)
        if self._lost != after_scn:
            self._check_position(con, after_scn)
        top = con.execute("SELECT scn, ts FROM _databus_txlog ORDER BY scn DESC LIMIT 1"
                          ).fetchone()
        start = after_scn
        if self._skip is not None:
            start = max(start, self._skip[1])
        if top is None or top[0] <= start:
            return None
        return int(top[0]), int(top[1]), self._captured.own_rows(con, start, int(top[0]))

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

    def _progress(self) -> list[Window]:
        """An empty window over rows of other tables only, once they waited long enough."""
        skip = self._skip
        if skip is None or time.monotonic() - skip[3] < _PROGRESS_AFTER:
            return []
        self._skip = None
        return [Window(skip[1], b"", 0, skip[2] * 1_000_000)]

    # -- the relay's registration ------------------------------------------------

    def _register_relay(self) -> None:
        with self._write_lock, translated("registering the relay"):
            trim.register(self._writer, self.path, self.relay_name, self.capturer.legacy,
                          busy_timeout=self.busy_timeout)


def _text(raw: bytes) -> str | bytes:
    """SQLite text as str; text that is not valid UTF-8 stays bytes (carried exactly)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw
