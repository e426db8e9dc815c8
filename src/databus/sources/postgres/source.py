"""PostgreSQL source: logical decoding through a replication slot and pgoutput.

Guarantees (the :class:`~databus.sources.base.Source` contract, made concrete):

* **SCN** = the LSN just past the transaction's commit record (pgoutput's
  Commit ``end_lsn``): unique per transaction and increasing in commit order.
  ``read(after_scn=S)`` starts replication at S; the server skips every
  transaction whose commit record starts before S, i.e. exactly those with an
  SCN up to S (and the source drops any it would still send).
* **Window** = one transaction, whole, at its commit; rolled-back work never
  appears. Events carry the commit time. On PostgreSQL 14+ replication uses
  protocol 2 with ``streaming 'on'``: a transaction larger than the server's
  ``logical_decoding_work_mem`` is sent while it runs, in blocks that may
  interleave with other transactions; its messages are held (:mod:`.streams`:
  in memory up to ``stream_memory`` bytes for all open ones, then in a
  temporary file) and decoded into one window at its Stream Commit, never
  before; a Stream Abort drops it, or the part of an aborted subtransaction.
  Older servers: protocol 1 (the server decodes a transaction at its commit).
* **Slot** (``slot``, default ``databus_<shared name>``: the relay's name, or its
  cluster's; :class:`~databus.sources.base.Capturer`): created on a fresh
  start (``after_scn < 0``); its confirmed flush LSN moves only to SCNs the
  relay passed to :meth:`acknowledge` (which the relay calls with what its
  buffer no longer needs, docs/postgresql.md), so the server keeps the WAL of
  everything after; and, through psycopg2, to the position of a server
  keepalive once every message received before it was acknowledged (WAL
  without a captured change). Each acknowledged SCN is recorded first in
  ``<state_dir>/<relay>.postgres-slot.json``. A slot that is gone, or a relay
  position below the SCN it had acknowledged, raises
  :class:`~databus.core.errors.SourcePositionLostError`; a confirmed LSN past
  the relay's position but not past an acknowledgement only skipped WAL
  without captured changes (without ``state_dir`` this cannot be told apart
  and is logged as a warning).
* **Progress**: when no captured change arrives for ``progress_interval``
  seconds but the server reports (keepalives) that it decoded further, an
  empty window at that position is sent, so acknowledgements, and with them
  the slot, follow the server and an idle table holds no WAL. A position from
  a keepalive is safe to restart after: every commit before it was sent.
* **Schemas**: a Relation message gives a table's columns; each distinct shape
  (names, types, key) is a table version, numbered per table (kept in
  ``<state_dir>/<relay>.postgres-schemas.json``). An ``ALTER TABLE`` that adds
  or drops a column gives a new version from the next change on.
* **Keys**: the primary key; else the replica identity's index columns; else
  (FULL without a primary key) the row's index in its window.
* **Columns** (``include_columns``/``exclude_columns``, regexes on
  ``schema.table.column``, :mod:`databus.sources.columns`): a table version
  holds the kept columns only (key columns always kept); tuples from the wire
  are projected on them before anything is typed, fetched (TOAST) or encoded,
  the C decoder skips the others, and snapshots select the kept ones only.
* **Events**: insert, update (the after image; the before image when the
  server sends one: REPLICA IDENTITY FULL, or the key columns when the key
  changed; a key change is a delete of the old key then an insert), delete
  (the old row: only its key columns unless FULL), truncate (op ``t``, one per
  table). Metadata: ``txid`` the transaction id, ``pos`` the SCN, ``gtid`` the
  replication origin (``name/LSN``) of a transaction that came from another
  server through logical replication.
* **Unchanged TOASTed values** in an update are not sent by the server. With
  REPLICA IDENTITY FULL they are carried from the old row the server sends
  (exact). Otherwise they are fetched from the table by key when the update
  is decoded: the value is then the current one, which is newer than the
  update's when a later transaction changed that column again (that change
  follows as its own event); a row deleted since gives NULL, counted in
  ``toast_unavailable_total``. Tables with large values that must be exact
  per event: REPLICA IDENTITY FULL.
* **Types**: see :mod:`.types`; values are PostgreSQL's text of them.

* **Snapshots** (``snapshot_mode`` initial, initial_only, when_needed): on a
  fresh start the slot is created exporting its snapshot, and the captured
  tables' rows as of the slot's consistent point go out first as ``r`` events
  (:mod:`.snapshot`); the stream continues right after that point. no_data:
  no snapshot. A lost slot is never re-snapshotted (when_needed included).

* **Decoding**: change messages are decoded and encoded in C when the
  extension is built (:mod:`.fastpath`, the measured reason there), else in
  Python; the events are the same bytes.

* **Incremental snapshots** (signals): as the MySQL source's, with the same
  signal-table contract (:mod:`databus.sources.common.signals`), chunk windows and
  watermarks (:mod:`databus.sources.common.incremental`, :mod:`.incremental`),
  when the signal table (``signal_table``, default ``databus.signals``) exists
  and is in the publication (both made so with ``create_publication``; else
  :meth:`signal` says what to run). Progress is kept in
  ``<state_dir>/<relay>.postgres-snapshot.json``; a relay restarted mid-snapshot
  resumes after the last chunk it holds.

Not yet: ``snapshot_mode`` always, tables added to the database after start.

Where each part lives: this module describes the capture (configuration resolved, no
I/O) and checks the server at :meth:`PostgresSource.open`, which makes the running part
(:mod:`.capture`: the read loop, the initial snapshot, progress windows); the slot and
its acknowledgements are :mod:`.slot`, decoding :mod:`.decoder`, table versions and the
schema history :mod:`.versions`, the incremental snapshots' database side
:mod:`.incremental`.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

from databus.core.errors import ConfigError, DatabusError, InvalidRequestError, StatementError
from databus.core.schema import SchemaRegistry
from databus.core.window import Window
from databus.sources.base import Capturer, Source, SourceInfo
from databus.sources.columns import ColumnFilter
from databus.sources.common import signals
from databus.sources.common.incremental import (
    NOTIFICATIONS,
    NOTIFY_SCHEMA,
    Chunk,
    Snapshots,
    chunk_events,
)
from databus.sources.common.progress import ProgressRecords
from databus.sources.common.tables import TableFilter
from databus.sources.config import PostgresSourceConfig
from databus.sources.postgres import checks
from databus.sources.postgres.capture import Capture, idle_capture_stats
from databus.sources.postgres.connection import PgUrl, SqlSession, parse_pg_url
from databus.sources.postgres.incremental import PgChunks, signal_table_ready
from databus.sources.postgres.slot import Slot, default_name
from databus.sources.postgres.streams import Budget
from databus.sources.postgres.versions import Versions

__all__ = ["NOTIFICATIONS", "STREAM_MEMORY", "PostgresSource", "default_name", "pg_url"]

log = logging.getLogger("databus.sources.postgres")

STREAM_MEMORY = 64 << 20
"""Default bound of the streamed transactions' messages held in memory (bytes)."""


def pg_url(config: PostgresSourceConfig) -> PgUrl:
    return replace(parse_pg_url(config.url, password=config.password()),
                   timeout=config.network_timeout)


def _origin(sql: SqlSession, database: str) -> str:
    try:
        (row,) = sql.query("SELECT system_identifier::text FROM pg_control_system()")
    except (StatementError, ConfigError) as exc:  # a server hiding it from this role
        log.warning("no origin for this source (pg_control_system: %s)", exc)
        return ""
    return f"postgresql:{row[0]}/{database}"


class PostgresSource(Source):
    """Captures the tables matching ``tables`` (regexes on ``schema.table``) of the
    database in the URL; see the module docstring."""

    def __init__(self, config: PostgresSourceConfig, *, name: str = "relay",
                 state_dir: Path | None = None, slot_wait: float = 10.0,
                 compiled: bool | None = None, stream_memory: int = STREAM_MEMORY,
                 capturer: Capturer | None = None) -> None:
        """Describes the capture and does no I/O: :meth:`open` checks the server, the
        publication and the slot. ``name``: the relay's name, or ``capturer``: its
        identity (state files, slot and publication defaults, the connections'
        application name). ``slot_wait``: how long a start waits for a slot held under
        this relay's own name (its killed predecessor's server process) before refusing;
        another relay's is refused at once.
        ``compiled``: decode in C (True), in Python (False), or in C when built (None).
        ``stream_memory``: bytes of streamed transactions' messages held in memory
        before they spill to a temporary file (in ``state_dir`` when given)."""
        who = capturer if capturer is not None else Capturer(name)
        name = who.name
        self.config = config
        self.url = replace(pg_url(config), application_name=who.label(63))
        self.publication = config.publication or default_name(who.shared_name)
        # a derived name's fresh start must not pass over the slot every relay had before
        self._slot = Slot(
            config.slot or default_name(who.shared_name),
            state=state_dir / f"{name}.postgres-slot.json" if state_dir else None,
            label=self.url.application_name, wait=slot_wait,
            legacy=default_name(who.legacy) if who.legacy and not config.slot else None)
        self.signal_table = config.signal_table
        self._filter = TableFilter(config.tables, config.exclude_tables, config.signal_table)
        self._columns = ColumnFilter.of(config)
        self._compiled = compiled
        self._stream_memory = stream_memory
        self._state_dir = state_dir
        self._records_path = state_dir / f"{name}.postgres-snapshot.json" if state_dir else None
        self._versions = Versions(
            state_dir / f"{name}.postgres-schemas.json" if state_dir else None, self._columns)
        self._signals_off: str | None = "the source is not open"  # else None: signals on
        self._origin = ""
        self._capture: Capture | None = None  # the running part: open() makes it

    @property
    def slot(self) -> str:
        """The replication slot's name."""
        return self._slot.name

    # -- life cycle ----------------------------------------------------------------

    def open(self) -> None:
        """Checks the server (wal_level, REPLICATION right, encoding), the tables'
        replica identity, the publication (created or extended when allowed) and the
        slot (free, or not held by another process); loads the schema history."""
        if self._capture is not None:
            return
        if self.config.snapshot_mode == "always":
            raise ConfigError(
                "snapshot_mode always is not supported by the PostgreSQL source: a snapshot"
                " comes with a new slot (initial, initial_only, when_needed) or not at all"
                " (no_data)")
        sql = SqlSession(self.url)
        try:
            facts = checks.server_facts(sql)
            log.info("PostgreSQL %d at %s, wal_level=%s, slots %d/%d", facts.version_num,
                     self.url.where(), facts.wal_level, facts.used_slots, facts.max_slots)
            checks.check_server(facts)
            tables = [t for t in checks.matching_tables(sql, self._filter.include,
                                                        self._filter.exclude)
                      if t.full_name != self.signal_table]
            checks.check_tables(tables, self.config.tables)
            # the slot before the publication: a refused start creates nothing
            self._slot.check(sql, facts, self.url.database)
            checks.ensure_publication(sql, self.publication, tables,
                                      create=self.config.create_publication)
            self._origin = _origin(sql, self.url.database)
            self._check_column_filters(sql, tables)
            self._versions.load()
            self._signals_off = signal_table_ready(sql, self.signal_table, self.publication,
                                                   create=self.config.create_publication)
        except BaseException:
            sql.close()
            raise
        snaps = None
        if self._signals_off is None:
            chunks = PgChunks(sql, self.signal_table, self._filter,
                              lambda rel: self._versions.of(rel, sql))
            # one record per chunk window, dropped once the relay acknowledged a later SCN
            snaps = Snapshots(chunks, self.config.snapshot_chunk_size, self._filter,
                              ProgressRecords(self._records_path, keep=None),
                              _chunk_events)
            # listed from the start (as the MySQL source does), so a consumer of every
            # source knows it before the first notice
            self._versions.add(NOTIFY_SCHEMA, save=False)
        else:
            log.info("signals (incremental snapshots) off: the signal table %s is not in"
                     " publication %s; to turn them on run %s", self.signal_table,
                     self.publication, self._signals_off)
        self._capture = Capture(
            self.config, url=self.url, sql=sql, slot=self._slot, publication=self.publication,
            streaming=facts.version_num >= 140000, tables=tables, versions=self._versions,
            wanted=self._filter, snaps=snaps, compiled=self._compiled,
            budget=Budget(self._stream_memory), spill_dir=self._state_dir)

    def origin(self) -> str:
        """``postgresql:<system identifier>/<database>``: the server whose WAL positions
        the SCNs are, and the database whose changes they carry."""
        return self._origin

    def close(self) -> None:
        if self._capture is not None:
            self._capture.close()
            self._capture = None

    def _check_column_filters(self, sql: SqlSession, tables: list[checks.TableFacts]
                              ) -> None:
        """Warn about an include/exclude_columns regex that matches no column of the
        captured tables (a column named without its schema, say): it is applied, to
        columns added later too, but most likely misspelt."""
        if not self._columns:
            return
        names = [str(r[0]) for r in sql.query(
            "SELECT n.nspname || '.' || c.relname || '.' || a.attname FROM pg_attribute a"
            " JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n"
            " ON n.oid = c.relnamespace WHERE a.attnum > 0 AND NOT a.attisdropped"
            " AND n.nspname || '.' || c.relname = ANY(%s)", ([t.full_name for t in tables],))]
        for pattern in self._columns.unmatched(names):
            log.warning("column regex %r matches no column of the captured tables (columns"
                        " are named schema.table.column)", pattern)

    # -- the contract ----------------------------------------------------------------

    def sources(self) -> list[SourceInfo]:
        return self._versions.sources()

    def registry(self) -> SchemaRegistry:
        return self._versions.registry

    def read(self, after_scn: int, stop: threading.Event, timeout: float) -> list[Window]:
        if self._capture is None:
            self.open()
        capture = self._capture
        assert capture is not None
        try:
            return capture.read(after_scn, stop, timeout)
        except DatabusError:
            # the next read starts again at the relay's position (a partly read
            # transaction is dropped and sent again whole)
            capture.close_stream()
            raise

    def signal(self, kind: str, data: dict[str, Any] | None) -> str:
        """Insert a signal row on its own connection (:func:`.signals.send`: the same
        contract for every source): the capture thread meets it in the stream, in commit
        order. Thread-safe."""
        if self._signals_off is not None and kind in signals.KINDS:
            raise InvalidRequestError(
                f"signals are off for this source: the signal table {self.signal_table} is"
                f" not in publication {self.publication}; run {self._signals_off} (or set"
                " create_publication: true) and restart the relay")
        session = SqlSession(self.url)  # connects on first use
        return signals.send(
            kind, data, PgChunks(session, self.signal_table, self._filter,
                                 lambda rel: self._versions.of(rel, session)),
            name=self.signal_table, close=session.close, wanted=self._filter,
            dialect="postgres", qualifier="schema",
            columns=lambda schema, name: [str(r[0]) for r in session.query(
                "SELECT column_name FROM information_schema.columns"
                " WHERE table_schema = %s AND table_name = %s", (schema, name))])

    def acknowledge(self, scn: int) -> None:
        """The relay no longer needs what is up to ``scn``: the slot may move there (sent
        by the capture thread with its next read)."""
        self._slot.acknowledge(scn)

    def captured_until_ns(self) -> int | None:
        """The newest mark the stream has passed (:mod:`.marks`: every commit before it
        was handed over), 0 before the first; not the relay's empty-read rule, which a
        walsender decoding a long stretch of unpublished WAL would satisfy."""
        capture = self._capture
        return capture.marks.until_ns if capture is not None else None

    def stats(self) -> dict[str, float]:
        """The slot as the server sees it (read every few seconds from
        ``pg_replication_slots``): its confirmed LSN, its lag behind the server's WAL
        end (``slot_lag_bytes``) and the WAL the server keeps for it
        (``slot_retained_bytes``); TOAST fill-ins, truncates, snapshots."""
        capture = self._capture
        return capture.all_stats() if capture is not None else idle_capture_stats()


def _chunk_events(chunk: Chunk, scn: int, ts_ns: int) -> tuple[bytes, int]:
    """A finished chunk's rows as ``r`` events (its ``shape`` is a table version)."""
    return chunk_events(chunk.shape.schema, chunk.rows, scn, ts_ns), len(chunk.rows)
