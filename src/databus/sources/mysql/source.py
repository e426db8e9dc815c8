"""MariaDB/MySQL binlog source: the relay's fetcher for a server read as a replica.

Guarantees (the :class:`~databus.sources.base.Source` contract, made concrete):

* **SCN** = ``(binlog file number << 32) | position after the transaction's
  commit event``. Restarting after an SCN resumes the dump at that file and
  position: the first event after that transaction. Nothing is replayed twice
  and nothing skipped; a purged position raises
  :class:`~databus.core.errors.SourcePositionLostError`.
* **Window** = one transaction (multi-table transactions stay one window); a
  DDL statement is a window of its own. Events carry the binlog timestamp.
* **Source ids** are stable: CRC-32 of ``db.table`` masked to 31 bits.
* **Schemas**: one Avro schema per table shape; its version number counts the
  shapes of that table. With ``state_dir`` the versions are kept in a schema
  history file (written atomically), so numbers and ids survive restarts and
  a restarted relay still serves the schemas of the events it holds.
* **DDL** (CREATE/ALTER/DROP/RENAME/TRUNCATE of a captured table) gives an
  event of the logical source :data:`SCHEMA_CHANGES` (the statement, kind and
  table); TRUNCATE also gives a truncate event (op ``t``) on the table itself.
  Rows before and after an ALTER decode with their own table version because
  every rows event is decoded with the table map logged right before it.
* **Filters**: tables by regexes on ``db.table`` (include, then exclude);
  columns by regexes on ``db.table.column`` (include, then exclude; the rule
  every source shares, :mod:`databus.sources.columns`); key columns are always
  kept. Filters that match no existing table are refused at
  :meth:`MysqlSource.open` (and by :meth:`MysqlSource.reconfigure`) with a
  :class:`~databus.core.errors.ConfigError`.
* **Tables are listed from the start**: every captured table that exists at
  :meth:`MysqlSource.open` is in :meth:`~MysqlSource.sources` and the registry
  before its first change (a provisional version, :mod:`.versions`).
* **Reads hand windows over when the stream has nothing more at once**: a read
  returns the windows it holds as soon as no more bytes are received or readable
  without blocking, whatever events (other tables', heartbeats) follow the last
  one; windows already received leave together (up to 64 a read).
* **Signals**: an ``execute-snapshot`` whose ``data-collections`` match no
  captured table that exists is refused by :meth:`MysqlSource.signal`
  (:class:`~databus.core.errors.InvalidRequestError`, nothing written).
* ``after_scn = -1`` starts at the server's current binlog end, or right after
  ``start_gtid`` (MariaDB GTID state) when given; later restarts use the SCN.
* **Replica id**: the dump connects as ``server_id`` (config), else the relay's
  (``Capturer.server_id``, derived from its name: :func:`~databus.sources.base.
  derived_server_id`), registered as replica ``databus <name>@<host>``; an id another
  replica holds is refused (:mod:`.connection`), never fought over.
* **Origin** (:meth:`origin`): MySQL ``mysql:<@@server_uuid>``, MariaDB
  ``mariadb:<@@hostname>:<@@port>/<@@server_id>``: the server whose binlog positions
  the SCNs are.

Rows are encoded by a codec compiled per table shape (:mod:`.fastpath`) and,
where that codec does not apply, by the Python decoder (:mod:`.rows`); both
give the same bytes.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from databus.core.errors import (
    ConfigError,
    DatabusError,
    SourcePositionLostError,
    SourceUnavailableError,
    UnsupportedEventError,
)
from databus.core.schema import SCHEMA_CHANGES, SchemaRegistry
from databus.core.window import Window
from databus.sources.base import Capturer, Source, SourceInfo
from databus.sources.columns import ColumnFilter
from databus.sources.common import signals
from databus.sources.common.incremental import (
    NOTIFICATIONS,
    NOTIFY_SCHEMA,
    Snapshots,
    idle_stats,
)
from databus.sources.common.progress import ProgressRecords
from databus.sources.common.tables import TableFilter
from databus.sources.config import MysqlSourceConfig
from databus.sources.mysql import compressed, fastpath
from databus.sources.mysql import ddl as dd
from databus.sources.mysql import events as be
from databus.sources.mysql import rows as br
from databus.sources.mysql.checks import check_server, describe, mysql_url
from databus.sources.mysql.connection import (
    BinlogStream,
    SqlSession,
    binlog_behind,
    check_replica_id,
    collations,
    connect,
    master_status,
    server_facts,
)
from databus.sources.mysql.positions import PositionRecord, binlog_scn, gtid_at
from databus.sources.mysql.snapshots import SnapshotIO, encode_chunk
from databus.sources.mysql.tables import PendingRows, RowsMeta, Shape
from databus.sources.mysql.versions import Versions, signature

__all__ = ["NOTIFICATIONS", "SCHEMA_CHANGES", "MysqlSource"]

log = logging.getLogger("databus.sources.mysql")

BEHIND_EVERY = 5.0  # seconds between two reads of the binlog's end (binlog_behind_bytes)


class MysqlSource(Source):
    """Captures tables matching ``tables`` (regexes on ``db.table``); see the module doc."""

    def __init__(self, config: MysqlSourceConfig, *, name: str = "relay",
                 state_dir: Path | None = None, compiled: bool = True,
                 heartbeat: float = 1.0, capturer: Capturer | None = None) -> None:
        """Describes the capture and does no I/O: :meth:`open` connects, checks the
        server, loads the schema history and creates the signal table.

        ``name``: the relay's name (its state files), or ``capturer``: the relay's
        identity (also its replica id); ``state_dir``: where the schema
        history and snapshot progress are kept; ``compiled``: use the C row codec
        when built; ``heartbeat``: seconds between the server's heartbeats.
        """
        who = capturer if capturer is not None else Capturer(name)
        name = who.name
        self.report_host = who.label()
        self.config = config
        self.url = mysql_url(config)
        self._filter = TableFilter(config.tables, config.exclude_tables, config.signal_table)
        self._columns = ColumnFilter.of(config)
        self.server_id = who.replica_id(config.server_id)
        self.heartbeat = heartbeat
        self.start_gtid = config.start_gtid
        self.snapshot_mode = config.snapshot_mode
        self.signal_table = config.signal_table
        self.compiled = compiled and fastpath.available()
        if compiled and not self.compiled:
            log.warning("the compiled row codec is not built; using the slower Python decoder")
        self.mariadb = True  # known after open()
        self._collations: dict[int, str] = {}
        self._tv = Versions(state_dir / f"{name}.mysql-schemas.json" if state_dir else None,
                            self.compiled)
        # TABLE_MAP body (with table id) -> its parse: each transaction repeats the map of
        # every table it touches, so one-row transactions would parse it once per row (a
        # third of their capture time: bench/peers/capture_profile.py)
        self._table_defs: dict[bytes, tuple[bytes, br.TableDef, str]] = {}  # as in _maps
        self._rows_meta = RowsMeta()  # the metadata part of each rows event
        # the source's own logical sources, listed from the start
        self._tv.internal(dd.SCHEMA_CHANGE_SCHEMA)
        self._tv.internal(NOTIFY_SCHEMA)
        self._records_path = state_dir / f"{name}.mysql-snapshot.json" if state_dir else None
        self._positions = PositionRecord(state_dir, name)  # whose binlog a position is
        self._snapshotted = False  # a mode's own snapshot was started by this process
        self._new_filters: tuple[TableFilter, ColumnFilter] | None = None  # reconfigure()
        self._opened = False
        self._origin = ""
        self._progress_every = config.progress_interval
        self._last_out = time.monotonic()  # when the last window left (progress windows)
        self._last_scn = -1
        self._capture_only = False  # capture_only(): a cluster co-leader's source
        self._halted = False  # another capturer's snapshot showed: nothing more is ours
        self._until_ns = 0  # captured_until_ns: the last commit read, or a heartbeat's now
        self._read_pos = 0  # end of the last event read in self._file
        self._behind = 0.0  # binlog_behind_bytes, read every BEHIND_EVERY seconds
        self._behind_at = 0.0
        self._stream: BinlogStream | None = None
        self._stream_scn = -2
        self._file = ""
        self._base = ""
        self._reset_txn()

    def open(self) -> None:
        """Connects: checks the server's settings, reads its collations, loads the schema
        history and snapshot progress, refuses filters that match no existing table,
        lists the captured tables (:meth:`.versions.Versions.list_tables`), creates the
        signal table when a snapshot mode needs it. Idempotent."""
        if self._opened:
            return
        facts = server_facts(self.url)
        log.info("%s; reading its binlog as replica %r, server_id %d", describe(facts),
                 self.report_host, self.server_id)
        check_server(facts)
        self.mariadb = facts.is_mariadb
        self._collations = collations(self.url)
        self._table_defs.clear()  # parsed with the collations of the last connection
        self._tv.load()
        self._sql = SqlSession(self.url)
        self._snap_io = SnapshotIO(self._sql, self.signal_table, self._wanted, self._shape_of)
        # one record per chunk window, dropped once the relay acknowledged a later
        # SCN: a fixed cap would lose the record a restart needs when more chunk
        # windows than the cap pass between two flushes of the relay's state
        self._snaps = Snapshots(self._snap_io, self.config.snapshot_chunk_size, self._wanted,
                                ProgressRecords(self._records_path, keep=None), encode_chunk)
        try:
            self._tv.list_tables(self._snap_io.table_defs(self._captured(self._snap_io)).items(),
                                 self._keep)
            if self.snapshot_mode != "no_data":
                self._snap_io.ensure_signal_table()
            self._origin = self._read_origin()
            # a start that would take another replica's connection is refused here, at once
            con = connect(self.url)
            try:
                check_replica_id(con, self.url, self.server_id, self.report_host)
            finally:
                con.close()
        except BaseException:
            self._sql.close()
            raise
        self._opened = True

    def _captured(self, io: SnapshotIO) -> list[str]:
        """The captured tables that exist now; :class:`ConfigError` when there are none
        (a regex that matches nothing is a mistake to name at start, not a quiet relay)."""
        tables = io.tables()
        if not tables:
            raise ConfigError(f"{self._filter.none_match()} at {self.url.host}:{self.url.port}")
        return tables

    def _read_origin(self) -> str:
        """See the module docstring (**Origin**)."""
        if not self.mariadb:
            (row,) = self._sql.query("SELECT @@server_uuid")
            return f"mysql:{row[0]}"
        (row,) = self._sql.query("SELECT @@hostname, @@port, @@server_id")
        return f"mariadb:{row[0]}:{row[1]}/{row[2]}"

    def origin(self) -> str:
        return self._origin

    # -- schemas -----------------------------------------------------------------

    def adopt_schemas(self, registry: SchemaRegistry) -> None:
        """Versions a former leader published (copied by this relay as a follower) join
        the schema history, so numbering and ids continue after a failover."""
        self._tv.adopt(registry)

    def _keep(self, td: br.TableDef) -> list[bool]:
        names = td.names or [f"col{i}" for i in range(len(td.types))]
        return self._columns.keep(f"{td.schema}.{td.table}", names, td.primary_key)

    def _shape_of(self, td: br.TableDef) -> Shape:
        """The version of a table described by information_schema (snapshots)."""
        return self._tv.shape(signature(td), td, self._keep)

    def _wanted(self, name: str) -> bool:
        """A captured table (the filters in force: :meth:`reconfigure` may change them)."""
        return self._filter(name)

    def signal(self, kind: str, data: dict[str, Any] | None) -> str:
        """Insert a signal row on its own connection (:func:`.signals.send`: the same
        contract for every source): the capture thread sees it in the binlog, in commit
        order. Thread-safe."""
        session = SqlSession(self.url)  # connects on first use
        return signals.send(
            kind, data, SnapshotIO(session, self.signal_table, self._wanted, self._shape_of),
            name=self.signal_table, close=session.close, wanted=self._wanted,
            columns=lambda db, name: [str(r[0]) for r in session.query(
                "SELECT COLUMN_NAME FROM information_schema.COLUMNS"
                " WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s", (db, name))])

    def reconfigure(self, config: Any) -> None:
        """New table/column filters from a reloaded relay config (``url`` and the
        rest must stay). Tables that now match are captured from the current
        position on; an ``execute-snapshot`` signal sends their existing rows.
        Thread-safe: the capture thread applies them before its next event."""
        if mysql_url(config) != self.url:
            raise ConfigError("the source url cannot change while running: restart the relay")
        tables = TableFilter(config.tables, config.exclude_tables, self.signal_table)
        columns = ColumnFilter.of(config)
        session = SqlSession(self.url)
        try:  # refused like a start: new filters that match no table keep the old ones
            if not SnapshotIO(session, self.signal_table, tables, self._shape_of).tables():
                raise ConfigError(f"{tables.none_match()}; the running table filters stay")
        finally:
            session.close()
        self._new_filters = (tables, columns)

    def _apply_filters(self) -> None:
        filters, self._new_filters = self._new_filters, None
        if filters is not None:
            self._filter, self._columns = filters
            self._tv.forget_shapes()  # column filters are part of a shape
            self._snap_io.forget()  # its kept shapes too
            log.info("table and column filters reloaded")


    def stats(self) -> dict[str, float]:
        """Snapshot progress (notifications by kind, rows sent) and the running state."""
        snaps = self._snaps.stats() if self._opened else idle_stats()
        return {**snaps, "snapshot_elsewhere": float(self._halted),
                "binlog_behind_bytes": self._behind}

    def _probe_behind(self) -> None:
        """``binlog_behind_bytes``, at most every :data:`BEHIND_EVERY` seconds."""
        if time.monotonic() - self._behind_at >= BEHIND_EVERY and self._file:
            self._behind_at = time.monotonic()
            behind = binlog_behind(self.url, self._file, self._read_pos)
            self._behind = self._behind if behind is None else float(behind)

    def sources(self) -> list[SourceInfo]:
        return self._tv.sources()

    def registry(self) -> SchemaRegistry:
        return self._tv.registry

    # -- the stream --------------------------------------------------------------

    def _reset_txn(self) -> None:
        self._maps: dict[int, tuple[bytes, br.TableDef, str]] = {}
        self._pending: list[PendingRows] = []
        self._signals: list[tuple[str, str, str | None]] = []
        self._gtid: str | None = None

    def _open(self, after_scn: int, *, at_end: bool = False) -> BinlogStream:
        """Start the dump after ``after_scn`` (-1: at the end or ``start_gtid``).

        ``at_end``: the position is gone and ``when_needed`` applies: stream
        from the server's end and snapshot every captured table instead.
        """
        if self._stream is not None:
            self._stream.close()
        gtid = None
        if after_scn < 0 or at_end:
            if at_end or self.start_gtid is None:
                self._tv.confirm_listed()  # from the end: the tables are as they were listed
            file, pos = master_status(self.url)
            gtid = None if at_end else self.start_gtid
        else:
            self._positions.check(after_scn, self._origin, f"{self.url.host}:{self.url.port}",
                                  self._gtid_pos if self.mariadb else None)
            file, pos = self._file_name(after_scn >> 32), after_scn & 0xFFFFFFFF
        self._base = file.rsplit(".", 1)[0]
        self._file = file  # with a GTID start, the server's first ROTATE names the file
        stream = self._stream = BinlogStream(
            self.url, server_id=self.server_id, file=file, pos=pos, heartbeat=self.heartbeat,
            read_timeout=self.heartbeat * 5, gtid=gtid, mariadb=self.mariadb,
            report_host=self.report_host)
        self._stream_scn = after_scn
        self._last_scn = after_scn
        self._reset_txn()
        self._snaps.restore(after_scn)
        mode = self.snapshot_mode
        if at_end or (not self._snapshotted and not self._snaps.active and (
                (after_scn < 0 and self.start_gtid is None
                 and mode in ("initial", "initial_only", "when_needed"))
                or mode == "always")):
            self._snapshotted = True
            tables = self._snap_io.tables()
            if tables:
                self._snaps.start(tables)
        return stream

    def _file_name(self, number: int) -> str:
        base = self._base or master_status(self.url)[0].rsplit(".", 1)[0]
        return f"{base}.{number:06d}"

    def _gtid_pos(self, scn: int) -> str | None:
        return gtid_at(self._sql, self._file_name(scn >> 32), scn & 0xFFFFFFFF)

    def _scn(self, pos: int) -> int:
        return binlog_scn(self._file, pos)

    def read(self, after_scn: int, stop: threading.Event, timeout: float) -> list[Window]:
        try:
            return self._read(after_scn, stop, timeout)
        except DatabusError:
            # the next read reopens the dump at the relay's position (a partly
            # read transaction is dropped and read again whole)
            self.close()
            raise

    def _read(self, after_scn: int, stop: threading.Event, timeout: float) -> list[Window]:
        stream = self._stream
        if stream is None or after_scn != self._stream_scn:
            stream = self._open(after_scn)
        if self._done_snapshotting() or self._halted:
            stop.wait(timeout)  # initial_only: nothing more after the snapshot
            return []
        deadline = time.monotonic() + timeout
        out: list[Window] = []
        # A burst of small transactions goes to the buffer in one call, but windows
        # are held only while the stream has more to give at once (bytes received or
        # readable without blocking): once it has not, they leave, whatever events
        # (other tables', heartbeats, DDL of other schemas) came after the last one.
        # Holding them for the deadline instead cost a relay capturing one table of a busy
        # server ~100 ms at p99 (bench/mysql_busy_latency.py). Lookups once: per event.
        event, snaps, coord = self._event, self._snaps, self._snaps.coord
        while not stop.is_set() and len(out) < 64:
            if self._new_filters is not None and not self._pending:
                self._apply_filters()  # between transactions: a window has one shape
            if coord.progress is not None:  # a snapshot runs: its next chunk when due
                snaps.step()
            try:
                got = stream.next_event()
            except SourcePositionLostError:
                if self.snapshot_mode != "when_needed" or out:
                    raise
                log.warning("binlog position after scn %d is gone: streaming from the end"
                            " and snapshotting every table (snapshot_mode when_needed)",
                            after_scn)
                stream = self._open(after_scn, at_end=True)
                continue
            if got is None:
                raise SourceUnavailableError("the server ended the binlog stream")
            window = event(*got)
            if self._halted:
                break
            if window is not None:
                self._stream_scn = self._last_scn = window.scn
                self._positions.window(window.scn, self._origin)
                self._last_out = time.monotonic()
                out.append(window)
                if self._done_snapshotting():
                    break
            elif time.monotonic() >= deadline:
                break
            elif not out:
                continue  # nothing to hand over yet: wait for a window until the deadline
            if not stream.pending():
                break
        self._probe_behind()
        return out

    def captured_until_ns(self) -> int | None:
        """The newest commit read (whole seconds), or when a heartbeat arrived at the
        log's end; None before either (the relay's rule applies)."""
        return self._until_ns or None

    def _done_snapshotting(self) -> bool:
        return (self.snapshot_mode == "initial_only" and self._snapshotted
                and not self._snaps.active and not self._snaps.notices)

    def _event(self, h: be.EventHeader, body: memoryview) -> Window | None:
        self._read_pos = h.next_pos
        t = h.type
        if t in compressed.COMPRESSED:  # log_bin_compress=ON: the plain event it stands for
            t, body = compressed.expand(t, body)
        if t in be.ROW_EVENTS:
            entry = self._maps.get(int.from_bytes(body[0:6], "little"))
            if entry is not None:
                table_map, td, name = entry
                if name == self.signal_table:
                    self._signal_rows(td, t, body)
                if self._filter(name):
                    self._pending.append(PendingRows(
                        self._tv.shape(table_map, td, self._keep), t, body,
                        self._rows_meta(self._gtid, self._file, h.next_pos, h.server_id)))
        elif t == be.EventType.TABLE_MAP:
            raw = bytes(body)
            cached = self._table_defs.get(raw)
            if cached is None:
                parsed = br.parse_table_def(body, self._collations)
                cached = (raw[6:], parsed, f"{parsed.schema}.{parsed.table}")
                if len(self._table_defs) >= 4096:  # table ids change with DDL: bounded
                    self._table_defs.clear()
                self._table_defs[raw] = cached
            name = cached[2]
            if name == self.signal_table or self._filter(name):
                self._maps[cached[1].table_id] = cached
        elif t == be.EventType.XID:
            return self._commit(h)
        elif t == be.EventType.MARIADB_GTID:
            self._reset_txn()
            self._gtid = be.parse_mariadb_gtid(body).text(h.server_id)
            self._positions.gtid_read(self._gtid)
        elif t == be.EventType.MYSQL_GTID:
            self._reset_txn()
            self._gtid = be.parse_mysql_gtid(body)
            self._positions.gtid_read(self._gtid)
        elif t == be.EventType.QUERY:
            db, sql = be.parse_query(body)
            word = sql.lstrip()[:8].upper()
            if word.startswith("COMMIT"):
                return self._commit(h)
            if sql.strip().upper() == "ROLLBACK":  # non-transactional tables rolled back
                self._reset_txn()
            elif not word.startswith(("BEGIN", "SAVEPOIN", "ROLLBACK", "XA ")):
                self._ddl_seen(db, sql)
                return self._ddl(h, db, sql)
        elif t == be.EventType.ROTATE:
            self._file = be.parse_rotate(body).file
        elif t == be.EventType.HEARTBEAT and self._gtid is None:
            # the server is idle at h.next_pos of the file the body names
            if bytes(body).rstrip(b"\0").decode("utf-8", "replace") == self._file:
                if not self._pending:  # the server has sent everything up to now
                    self._until_ns = max(self._until_ns, time.time_ns())
                return self._progress(h)
        elif t not in be.PASSED_OVER and not h.flags & be.LOG_EVENT_IGNORABLE_F:
            # an event this source does not know may carry changes: stop at it, loudly
            raise UnsupportedEventError(
                f"binlog event type {t} ({be.event_name(t)}) at {self._file}:{h.next_pos}"
                " is not supported by this source; capture stopped before it (nothing was"
                " skipped). Check the server settings the relay logged at start")
        return None

    def _signal_rows(self, td: br.TableDef, etype: int, body: memoryview) -> None:
        if etype not in (23, 30):  # signals are inserted rows
            return
        names = td.names or ["id", "type", "data"]
        for _before, after in br.decode_rows(td, etype, body):
            row = dict(zip(names, after or [], strict=False))
            self._signals.append((str(row.get("id")), str(row.get("type")),
                                  None if row.get("data") is None else str(row["data"])))

    def capture_only(self) -> None:
        self._capture_only = True

    def _commit(self, h: be.EventHeader) -> Window | None:
        pending, signals = self._pending, self._signals
        self._reset_txn()
        self._until_ns = max(self._until_ns, h.timestamp * 1_000_000_000)
        if signals and self._capture_only:
            # another capturer's snapshot (its signal or watermark): its chunk windows
            # cannot be reproduced here, so nothing from this transaction on is ours
            self._halted = True
            log.info("a signal-table row at %s:%d: another capturer runs a snapshot;"
                     " this capture-only source stops here", self._file, h.next_pos)
            return None
        plain = not signals and self._snaps.quiet
        if not pending and plain:
            return self._progress(h)  # a transaction of other tables: the position moved
        scn = self._scn(h.next_pos)
        ts_ns = h.timestamp * 1_000_000_000
        parts = []
        rows = 0
        for p in pending:
            data, n = p.shape.encode(p.etype, p.body, scn, ts_ns, p.meta_mid, rows)
            parts.append(data)
            rows += n
        if plain:
            # no signal, notice or snapshot chunk: what follows would add nothing (most
            # transactions; the one-row ones are bound by the cost of each)
            if not rows:
                return self._progress(h)
            return Window(scn, parts[0] if len(parts) == 1 else b"".join(parts), rows, ts_ns)
        # signals, notices, a chunk between its watermarks: the snapshot's part
        rows += self._snaps.commit(signals, parts, scn, ts_ns, NOTIFY_SCHEMA)
        if not rows:
            return self._progress(h)
        return Window(scn, b"".join(parts), rows, ts_ns)

    def _progress(self, h: be.EventHeader) -> Window | None:
        """An empty window at the position after ``h`` when the captured tables were
        quiet for ``progress_interval`` seconds while the binlog moved on: the relay's
        restart position and consumers' checkpoints follow the binlog, so a purge of
        files with nothing captured never takes the position away. Only between
        transactions, never while a snapshot runs."""
        if (not self._progress_every or self._snaps.active or self._pending
                or time.monotonic() - self._last_out < self._progress_every):
            return None
        scn = self._scn(h.next_pos)
        if scn <= self._last_scn or h.next_pos < 4:
            return None
        # a transaction of other tables: its time; a heartbeat (timestamp 0): the server
        # is idle at the log's end now, so the window stands for now (docs/operations.md)
        ts_ns = h.timestamp * 1_000_000_000 if h.timestamp else time.time_ns()
        return Window(scn, b"", 0, ts_ns)

    def _ddl_seen(self, db: str, sql: str) -> None:
        """A DDL statement in the binlog: forget the snapshot's kept table
        definitions it may change, and drop a chunk read (with a definition the
        DDL may have changed) but not sent yet, so it is read again.

        A chunk's SELECT and a DDL on its table exclude each other (metadata
        lock), and the high watermark is written after the SELECT; so a DDL the
        chunk's definition missed is in the binlog before the chunk's high
        watermark, i.e. met here before the chunk is sent."""
        names = dd.touched(db, sql)
        if names is None:  # not a table change as parse_ddl reads it: forget all, to be safe
            self._snap_io.forget()
        else:
            for n in names:
                self._snap_io.forget(n)
        chunk = self._snaps.coord.chunk
        if chunk is not None and dd.touches(chunk.table, names, sql):
            log.info("snapshot chunk of %s read again after a DDL", chunk.table)
            self._snaps.coord.chunk = None

    def _ddl(self, h: be.EventHeader, db: str, sql: str) -> Window | None:
        """A DDL statement: schema change events (+ truncate events) as one window."""
        scn = self._scn(h.next_pos)
        ts_ns = h.timestamp * 1_000_000_000
        events = dd.ddl_events(db, sql, self._filter, self._tv.registry, scn, ts_ns)
        if not events:
            return None
        self._reset_txn()
        return Window(scn, b"".join(events), len(events), ts_ns)

    def acknowledge(self, scn: int) -> None:
        """The relay restarts at or after ``scn``: older snapshot progress can go."""
        if self._opened:
            self._snaps.acknowledge(scn)

    def close(self) -> None:
        self._positions.close()
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        if self._opened:
            self._sql.close()

