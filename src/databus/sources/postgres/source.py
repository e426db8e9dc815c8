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
  signal-table contract, chunk windows and watermarks (:mod:`.incremental`),
  when the signal table (``signal_table``, default ``databus.signals``) exists
  and is in the publication (both made so with ``create_publication``; else
  :meth:`signal` says what to run). Progress is kept in
  ``<state_dir>/<relay>.postgres-snapshot.json``; a relay restarted mid-snapshot
  resumes after the last chunk it holds.

Not yet: ``snapshot_mode`` always, tables added to the database after start.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from databus.core import event as ev
from databus.core.atomic import write_atomic
from databus.core.errors import (
    ConfigError,
    CorruptEventError,
    DatabusError,
    InvalidRequestError,
    SchemaError,
    SourcePositionLostError,
    SourceUnavailableError,
    StatementError,
)
from databus.core.schema import ColumnSpec, SchemaRegistry, TableSchema, table_schema
from databus.core.window import Window
from databus.sources.base import Capturer, Source, SourceInfo
from databus.sources.columns import ColumnFilter
from databus.sources.config import PostgresSourceConfig
from databus.sources.mysql import incremental as inc
from databus.sources.postgres import checks, fastpath
from databus.sources.postgres import pgoutput as po
from databus.sources.postgres.connection import (
    PgUrl,
    ReplicationStream,
    SnapshotSession,
    SqlSession,
    close_quietly,
    create_slot_exporting,
    parse_pg_url,
    quote_ident,
)
from databus.sources.postgres.incremental import PgChunks, signal_table_ready
from databus.sources.postgres.snapshot import InitialSnapshot
from databus.sources.postgres.streams import Budget, Spool
from databus.sources.postgres.types import TableVersion, source_id, version_schema
from databus.sources.progress import ProgressRecords
from databus.sources.sqlfilter import checked_conditions

log = logging.getLogger("databus.sources.postgres")

_MAX_WINDOWS_PER_READ = 64
_BATCH = 1024  # messages taken from the socket at once
_SLOT_PROBE_INTERVAL = 5.0
"""Seconds between two reads of the slot's position as the server sees it (stats)."""
_CHANGES = frozenset({b"I", b"U", b"D"})
NOTIFICATIONS = "databus.notifications"
"""Logical source of snapshot progress notifications (as the MySQL source's)."""

NOTIFICATION_AVRO = table_schema("databus", "notifications", [
    ColumnSpec("kind", "string", nullable=False), ColumnSpec("snapshot", "string"),
    ColumnSpec("table", "string"), ColumnSpec("data", "string", nullable=False)])

STREAM_MEMORY = 64 << 20
"""Default bound of the streamed transactions' messages held in memory (bytes)."""


def pg_url(config: PostgresSourceConfig) -> PgUrl:
    return parse_pg_url(config.url, password=config.password())


def _origin(sql: SqlSession, database: str) -> str:
    try:
        (row,) = sql.query("SELECT system_identifier::text FROM pg_control_system()")
    except (StatementError, ConfigError) as exc:  # a server hiding it from this role
        log.warning("no origin for this source (pg_control_system: %s)", exc)
        return ""
    return f"postgresql:{row[0]}/{database}"


def default_name(relay_name: str) -> str:
    """``databus_<relay name>`` as a slot/publication name (lowercase, [a-z0-9_])."""
    base = re.sub(r"[^a-z0-9_]", "_", relay_name.lower())
    return f"databus_{base}"[:63]


@dataclass
class _Rel:
    """A relation of this session: its message and, when captured, its version."""

    msg: po.Relation
    version: TableVersion | None


@dataclass
class _Txn:
    """The transaction being decoded (its rows wait in the source's ``_rows``)."""

    xid: int
    commit_ts_us: int
    origin: str | None = None
    # rows inserted into the signal table: (id, type, data)
    signals: list[tuple[str, str, str | None]] = field(default_factory=list)


def _regexes(patterns: list[str]) -> list[re.Pattern[str]]:
    try:
        return [re.compile(p) for p in patterns]
    except re.error as exc:
        raise ConfigError(f"bad table regex: {exc}") from exc


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
        self.slot = config.slot or default_name(who.shared_name)
        self.publication = config.publication or default_name(who.shared_name)
        # a derived name's fresh start must not pass over the slot every relay had before
        self._legacy_slot = (default_name(who.legacy) if who.legacy and not config.slot
                             else None)
        self._origin = ""
        self._include = _regexes(config.tables or [".*"])
        self._exclude = _regexes(config.exclude_tables)
        self._columns = ColumnFilter.of(config)
        self._slot_wait = slot_wait
        self._compiled = compiled
        self._rows: fastpath.Rows = fastpath.rows(compiled)
        self._budget = Budget(stream_memory)
        self._spill_dir = state_dir
        self._spools: dict[int, Spool] = {}  # open streamed transactions
        self._in_stream: int | None = None  # inside a stream block of this transaction
        self._streaming = False  # protocol 2 (PostgreSQL 14+)
        self.signal_table = config.signal_table
        self._signals_off: str | None = "the source is not open"  # else None: signals on
        self._signal_rels: set[int] = set()
        self._coord: inc.Coordinator | None = None
        self._chunks: PgChunks | None = None
        self._records = ProgressRecords(
            state_dir / f"{name}.postgres-snapshot.json" if state_dir else None, keep=None)
        self._notices: list[dict[str, Any]] = []
        self._notify: TableSchema | None = None
        self._history = state_dir / f"{name}.postgres-schemas.json" if state_dir else None
        self._acked_path = state_dir / f"{name}.postgres-slot.json" if state_dir else None
        self._registry = SchemaRegistry()
        self._by_src: dict[int, SourceInfo] = {}
        self._versions: dict[tuple[Any, ...], TableVersion] = {}
        self._rels: dict[int, _Rel] = {}
        self._types: dict[int, str] = {}  # Type messages: oid -> namespace.name
        self._progress_every = config.progress_interval
        self._sql: SqlSession | None = None
        self._tables: list[checks.TableFacts] = []
        self._snap: InitialSnapshot | None = None
        self._snapshot_done = False  # initial_only: nothing more after it
        self._slot_floor = 0  # the slot's confirmed LSN when this session started
        self._stream: ReplicationStream | None = None
        self._stream_scn = -2
        self._last_scn = -1
        self._last_out = time.monotonic()
        self._txn: _Txn | None = None
        self._server_lsn = 0  # the server's position between transactions
        self._next_probe = 0.0  # when the slot's position is read again (stats)
        self._lock = threading.Lock()
        self._ack = -1  # what the relay acknowledged
        self._confirmed = -1  # what was confirmed to the slot
        self._opened = False
        self._stats: dict[str, float] = dict.fromkeys(
            ["slot_confirmed_lsn", "slot_lag_bytes", "slot_retained_bytes", "server_lsn",
             "server_wal_lsn", "toast_fetched_total",
             "toast_carried_total", "toast_unavailable_total", "truncates_total",
             "snapshot_rows_total", "snapshot_running", "streamed_transactions_total",
             "streamed_aborts_total", "stream_spilled_bytes_total", "streams_open",
             # every key from the start: the relay's metrics thread copies the dict
             *(f"snapshot_{k.lower()}_total" for k in inc.NOTICE_KINDS)], 0.0)

    # -- life cycle ----------------------------------------------------------------

    def open(self) -> None:
        """Checks the server (wal_level, REPLICATION right, encoding), the tables'
        replica identity, the publication (created or extended when allowed) and the
        slot (free, or not held by another process); loads the schema history."""
        if self._opened:
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
            self._streaming = facts.version_num >= 140000
            tables = [t for t in checks.matching_tables(sql, self._include, self._exclude)
                      if t.full_name != self.signal_table]
            checks.check_tables(tables, self.config.tables)
            # the slot before the publication: a refused start creates nothing
            if self._legacy_slot is not None:
                checks.check_legacy_slot(sql, self.slot, self._legacy_slot, self.url.database)
            checks.check_slot(sql, self.slot, self.url.database, facts, wait=self._slot_wait,
                              label=self.url.application_name)
            checks.ensure_publication(sql, self.publication, tables,
                                      create=self.config.create_publication)
            self._origin = _origin(sql, self.url.database)
        except BaseException:
            sql.close()
            raise
        self._sql = sql
        self._tables = tables
        self._check_column_filters(sql, tables)
        self._load_history()
        self._signals_off = signal_table_ready(sql, self.signal_table, self.publication,
                                               create=self.config.create_publication)
        if self._signals_off is None:
            self._chunks = PgChunks(sql, self.signal_table, self._wanted,
                                    self._version_for)
            self._coord = inc.Coordinator(self._chunks, self.config.snapshot_chunk_size,
                                          self._wanted)
            # listed from the start (as the MySQL source does), so a consumer of every
            # source knows it before the first notice
            self._notify = TableSchema(source_id(NOTIFICATIONS), NOTIFICATIONS, 1,
                                       NOTIFICATION_AVRO, ("snapshot",))
            self._registry.add(self._notify)
            self._by_src[self._notify.src_id] = SourceInfo(self._notify.src_id, NOTIFICATIONS)
        else:
            log.info("signals (incremental snapshots) off: the signal table %s is not in"
                     " publication %s; to turn them on run %s", self.signal_table,
                     self.publication, self._signals_off)
        self._opened = True

    def origin(self) -> str:
        """``postgresql:<system identifier>/<database>``: the server whose WAL positions
        the SCNs are, and the database whose changes they carry."""
        return self._origin

    def close(self) -> None:
        self._close_stream()
        if self._sql is not None:
            self._sql.close()
            self._sql = None
        self._opened = False

    def _close_stream(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        if self._snap is not None:
            self._snap.close()
            self._snap = None
            self._stats["snapshot_running"] = 0.0
        self._txn = None
        self._rows.clear()
        self._end_streams()
        self._stream_scn = -2

    def _end_streams(self) -> None:
        for spool in self._spools.values():
            spool.close()
        self._spools.clear()
        self._in_stream = None
        self._stats["streams_open"] = 0.0

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

    # -- schemas -------------------------------------------------------------------

    def _load_history(self) -> None:
        if self._history is None or not self._history.exists():
            return
        try:
            saved = SchemaRegistry.from_json(self._history.read_bytes())
        except (OSError, SchemaError) as exc:
            raise SchemaError(f"schema history {self._history} is unreadable: {exc}") from exc
        for src in saved.source_ids():
            for s in saved.versions(src):
                self._add_version(s, save=False)

    def _add_version(self, schema: TableSchema, *, save: bool = True) -> None:
        self._registry.add(schema)
        self._by_src[schema.src_id] = SourceInfo(schema.src_id, schema.name)
        if save and self._history is not None:
            write_atomic(self._history, self._registry.to_json().encode())

    def sources(self) -> list[SourceInfo]:
        return sorted(self._by_src.values(), key=lambda s: s.id)

    def registry(self) -> SchemaRegistry:
        return self._registry

    def _wanted(self, name: str) -> bool:
        return (any(p.fullmatch(name) for p in self._include)
                and not any(p.fullmatch(name) for p in self._exclude)
                and name != self.signal_table)

    def _relation(self, msg: po.Relation) -> None:
        name = f"{msg.namespace}.{msg.name}"
        self._signal_rels.discard(msg.oid)
        if name == self.signal_table:
            self._rels[msg.oid] = _Rel(msg, None)
            self._signal_rels.add(msg.oid)
            self._rows.forget(msg.oid)  # its rows come to _change
            return
        if not self._wanted(name):
            self._rels[msg.oid] = _Rel(msg, None)
            self._rows.relate(msg.oid, None)
            return
        version = self._version_for(msg)
        self._rels[msg.oid] = _Rel(msg, version)
        self._rows.relate(msg.oid, version)

    def _version_for(self, msg: po.Relation) -> TableVersion:
        """The table version of a shape (made and recorded when new); the stream's
        relation map is left as it is."""
        sig = (msg.namespace, msg.name, msg.replica_identity,
               tuple((c.name, c.type_oid, c.typmod, c.flags) for c in msg.columns))
        version = self._versions.get(sig)
        if version is None:
            version = self._new_version(msg, sig)
        return version

    def _new_version(self, msg: po.Relation, sig: tuple[Any, ...]) -> TableVersion:
        assert self._sql is not None
        names = [c.name for c in msg.columns]
        oids = [c.type_oid for c in msg.columns]
        rows = self._sql.query(
            "SELECT format_type(t.oid, NULLIF(t.mod, -1)) FROM unnest(%s::oid[], %s::int[])"
            " WITH ORDINALITY AS t(oid, mod, n) ORDER BY t.n",
            (oids, [c.typmod for c in msg.columns]))
        sql_types = [str(r[0]) for r in rows]
        pk = [str(r[0]) for r in self._sql.query(
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid"
            " AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s AND i.indisprimary"
            " ORDER BY array_position(i.indkey, a.attnum)", (msg.oid,))]
        if pk and all(k in names for k in pk):
            keys = pk
        elif msg.replica_identity in ("d", "i"):
            keys = [c.name for c in msg.columns if c.in_identity]
        else:
            keys = []
        # include/exclude_columns: the version holds the kept columns only
        keep = self._columns.keep(f"{msg.namespace}.{msg.name}", names,
                                  {names.index(k) for k in keys})
        wire = None if all(keep) else tuple(i for i, k in enumerate(keep) if k)
        if wire is not None:
            names = [names[i] for i in wire]
            oids = [oids[i] for i in wire]
            sql_types = [sql_types[i] for i in wire]
        probe = version_schema(msg.namespace, msg.name, names, oids, sql_types, keys, 0)
        src = probe.src_id
        known = self._registry.versions(src) if src in self._registry.source_ids() else []
        schema = next((s for s in known if s.id == probe.id and s.key_columns == tuple(keys)),
                      None)
        if schema is None:
            number = max((s.version for s in known), default=0) + 1
            schema = version_schema(msg.namespace, msg.name, names, oids, sql_types, keys,
                                    number)
            self._add_version(schema)
            log.info("table %s.%s: version %d (%d columns%s)", msg.namespace, msg.name,
                     number, len(names), "" if wire is None else
                     f" of {len(msg.columns)}: include/exclude_columns")
        version = TableVersion(schema, oids, [names.index(k) for k in keys], wire,
                               len(msg.columns))
        self._versions[sig] = version
        return version

    # -- the stream ----------------------------------------------------------------

    def _start(self, after_scn: int) -> None:
        """Check the slot against ``after_scn`` (create it on a fresh start, with the
        initial snapshot when the mode asks for one) and start replication after it."""
        self._close_stream()
        assert self._sql is not None
        found = checks.slot_facts(self._sql, self.slot)
        if found is None:
            if after_scn >= 0:
                raise SourcePositionLostError(
                    f"replication slot {self.slot} is gone: the changes after scn {after_scn}"
                    f" (LSN {po.lsn_text(after_scn)}) cannot be read; consumers must"
                    " bootstrap")
            if self.config.snapshot_mode != "no_data":
                self._start_snapshot()
                return
            (row,) = self._sql.query(
                "SELECT (lsn - '0/0')::bigint FROM pg_create_logical_replication_slot(%s,"
                " 'pgoutput')", (self.slot,))
            floor = int(row[0])
            log.info("created replication slot %s at %s", self.slot, po.lsn_text(floor))
        else:
            floor = found.confirmed_lsn or 0
            if after_scn >= 0:
                self._check_interrupted_snapshot(after_scn)
                if floor > after_scn:
                    self._check_skip(after_scn, floor)
        self._open_stream(after_scn, floor)

    def _open_stream(self, after_scn: int, floor: int) -> None:
        self._slot_floor = floor
        try:
            self._stream = ReplicationStream(self.url, slot=self.slot,
                                             publication=self.publication,
                                             start_lsn=max(after_scn, 0),
                                             streaming=self._streaming)
        except SourceUnavailableError:
            self._refuse_if_taken()
            raise
        self._stream_scn = after_scn
        self._last_scn = after_scn
        self._rels.clear()  # the server sends every Relation again in a new session
        self._rows = fastpath.rows(self._compiled)
        self._signal_rels.clear()
        self._end_streams()
        self._txn = None
        self._notices = []
        if self._coord is not None:
            self._coord.restore(self._records.at(after_scn) if after_scn >= 0 else None)
        with self._lock:
            self._confirmed = -1  # a new session: say it again
        log.info("replication of slot %s started after %s", self.slot,
                 po.lsn_text(after_scn) if after_scn >= 0 else "its confirmed position")

    def _refuse_if_taken(self) -> None:
        """Replication could not start: when another relay holds the slot now, that is
        terminal (retrying would only fight it for the slot), naming both."""
        assert self._sql is not None
        found = checks.slot_facts(self._sql, self.slot)
        if found is None or found.active_pid is None:
            return
        holder = checks.slot_holder(self._sql, found.active_pid)
        if not holder.startswith(f"{self.url.application_name} from "):
            raise ConfigError(
                f"replication slot {self.slot} is in use by another process (pid"
                f" {found.active_pid}: {holder or 'not visible to this role'}); this relay"
                f" is {self.url.application_name}: two relays cannot share a slot: give"
                " each its own name (--name, name:) or slot (slot:)")

    def _start_snapshot(self) -> None:
        """Create the slot exporting its snapshot and start reading the tables in it."""
        lsn, name, holder = create_slot_exporting(self.url, self.slot)
        try:
            session = SnapshotSession(self.url, name)
        finally:
            close_quietly(holder)  # the import keeps the snapshot
        try:
            snap = InitialSnapshot(session, lsn, self._tables, self._snapshot_version,
                                   self.config.snapshot_chunk_size, time.time_ns())
        except BaseException:
            session.close()
            raise
        self._save_slot_state(snapshot=[snap.first_scn, lsn])
        log.info("created replication slot %s at %s; initial snapshot of %d table(s) in %d"
                 " chunk window(s)", self.slot, po.lsn_text(lsn), len(snap.plan), snap.chunks)
        self._snap = snap
        self._slot_floor = lsn
        self._stream_scn = -1
        self._stats["snapshot_running"] = 1.0

    def _snapshot_version(self, rel: po.Relation) -> TableVersion:
        self._relation(rel)
        version = self._rels[rel.oid].version
        assert version is not None  # a captured table
        return version

    def _snapshot_read(self, after_scn: int) -> list[Window]:
        snap = self._snap
        assert snap is not None
        if after_scn != self._stream_scn:
            raise SourcePositionLostError(
                f"the initial snapshot of slot {self.slot} was asked to resume after scn"
                f" {after_scn}; it cannot (see _check_interrupted_snapshot)")
        window = snap.next_window()
        if window is not None:
            self._stream_scn = window.scn
            self._stats["snapshot_rows_total"] += window.count
            return [window]
        log.info("initial snapshot done: %d rows", snap.rows)
        snap.close()
        self._snap = None
        self._stats["snapshot_running"] = 0.0
        if self.config.snapshot_mode == "initial_only":
            self._snapshot_done = True
            return []
        self._open_stream(after_scn, snap.lsn)
        return []

    def _slot_state(self) -> dict[str, Any]:
        if self._acked_path is None or not self._acked_path.exists():
            return {}
        try:
            raw = json.loads(self._acked_path.read_text(encoding="utf-8"))
            if not isinstance(raw, dict):
                raise ValueError("not an object")
            return raw
        except (OSError, ValueError) as exc:
            raise SourcePositionLostError(
                f"slot state {self._acked_path} is unreadable ({exc}): cannot prove the slot"
                " holds every change after this relay's position") from exc

    def _save_slot_state(self, **fields: Any) -> None:
        if self._acked_path is not None:
            state = {**self._slot_state(), **fields}
            write_atomic(self._acked_path, json.dumps(state).encode())

    def _check_interrupted_snapshot(self, after_scn: int) -> None:
        span = self._slot_state().get("snapshot")
        if span and int(span[0]) <= after_scn < int(span[1]):
            raise SourcePositionLostError(
                f"the initial snapshot was interrupted (this relay holds it up to scn"
                f" {after_scn} of {span[0]}..{span[1]}) and cannot be resumed: drop the slot"
                f" (SELECT pg_drop_replication_slot('{self.slot}')), the relay's buffer and"
                " state, and start the relay again")

    def _saved_ack(self) -> int | None:
        ack = self._slot_state().get("acknowledged")
        return None if ack is None else int(ack)

    def _check_skip(self, after_scn: int, confirmed: int) -> None:
        """The slot was confirmed past ``after_scn``: a loss when this relay had
        acknowledged more than it now holds, else WAL without captured changes."""
        saved = self._saved_ack()
        if saved is not None and after_scn < saved:
            raise SourcePositionLostError(
                f"this relay acknowledged up to {po.lsn_text(saved)} but resumes after"
                f" {po.lsn_text(after_scn)}, and replication slot {self.slot} was confirmed"
                f" up to {po.lsn_text(confirmed)}: the changes between are gone; consumers"
                " must bootstrap")
        if saved is None:
            log.warning("replication slot %s was confirmed up to %s, past this relay's"
                        " position %s; without a record of its acknowledgements (state_dir)"
                        " the source cannot prove nothing captured lies between",
                        self.slot, po.lsn_text(confirmed), po.lsn_text(after_scn))
        else:
            log.info("replication slot %s was moved to %s over WAL without captured changes",
                     self.slot, po.lsn_text(confirmed))

    def read(self, after_scn: int, stop: threading.Event, timeout: float) -> list[Window]:
        try:
            return self._read(after_scn, stop, timeout)
        except DatabusError:
            # the next read starts again at the relay's position (a partly read
            # transaction is dropped and sent again whole)
            self._close_stream()
            raise

    def _read(self, after_scn: int, stop: threading.Event, timeout: float) -> list[Window]:
        if not self._opened:
            self.open()
        if self._snapshot_done:
            stop.wait(timeout)  # initial_only: nothing more after the snapshot
            return []
        if self._snap is None and (self._stream is None or after_scn != self._stream_scn):
            self._start(after_scn)
        if self._snap is not None:
            return self._snapshot_read(after_scn)
        stream = self._stream
        assert stream is not None
        deadline = time.monotonic() + timeout
        out: list[Window] = []
        while not stop.is_set() and len(out) < _MAX_WINDOWS_PER_READ:
            self._confirm(stream)
            if self._coord is not None and self._coord.wants_chunk():
                self._open_chunk()
            wait = 0.0 if out else max(0.0, min(deadline - time.monotonic(), 0.25))
            batch = stream.read_many(wait, _BATCH)
            if not batch:
                if self._txn is None and not self._spools:
                    self._server_lsn = max(self._server_lsn, stream.server_lsn)
                if out:
                    break
                progress = self._progress()
                if progress is not None:
                    out.append(progress)
                    break
                if time.monotonic() >= deadline:
                    break
                continue
            change = self._rows.change
            for payload in batch:
                # the hot path: a row change of a transaction, decoded in C when built
                if (self._txn is not None and payload[:1] in _CHANGES
                        and change(payload, 0) >= 0):
                    continue
                window = self._payload(payload)
                if window is not None and window.scn > after_scn:
                    out.append(window)
        if out:
            self._stream_scn = self._last_scn = out[-1].scn
            self._last_out = time.monotonic()
        self._stats["server_lsn"] = float(self._server_lsn)
        if time.monotonic() >= self._next_probe:
            self._probe_slot()
        return out

    def _probe_slot(self) -> None:
        """The slot as the server sees it (``pg_replication_slots``): what it confirmed,
        and how much WAL it keeps for this relay, for the stats. A failed probe is
        logged and tried again later: capture does not depend on it."""
        self._next_probe = time.monotonic() + _SLOT_PROBE_INTERVAL
        assert self._sql is not None
        try:
            rows = self._sql.query(
                "SELECT (s.confirmed_flush_lsn - '0/0'::pg_lsn)::bigint,"
                " (s.restart_lsn - '0/0'::pg_lsn)::bigint, (w.lsn - '0/0'::pg_lsn)::bigint"
                " FROM pg_replication_slots s, (SELECT CASE WHEN pg_is_in_recovery()"
                " THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END AS lsn) w"
                " WHERE s.slot_name = %s", (self.slot,))
        except DatabusError as exc:  # the stats wait for the next probe; capture goes on
            log.debug("slot %s: position not read: %s", self.slot, exc)
            return
        if not rows or rows[0][0] is None:
            return
        confirmed, restart, wal = (int(v or 0) for v in rows[0])
        self._stats["slot_confirmed_lsn"] = float(confirmed)
        self._stats["slot_lag_bytes"] = float(max(0, wal - confirmed))
        self._stats["slot_retained_bytes"] = float(max(0, wal - restart))
        self._stats["server_wal_lsn"] = float(wal)

    def _progress(self) -> Window | None:
        # never inside a transaction, nor while a streamed one is open (the slot cannot
        # release its WAL before that transaction's start anyway)
        if (not self._progress_every or self._txn is not None or self._spools
                or (self._coord is not None and self._coord.active)
                or time.monotonic() - self._last_out < self._progress_every
                or self._server_lsn <= max(self._last_scn, self._stream_scn)):
            return None
        return Window(self._server_lsn, b"", 0, time.time_ns())

    def _payload(self, payload: bytes) -> Window | None:
        """One message outside the hot path (see :meth:`_read`)."""
        if self._in_stream is not None:
            self._streamed(payload)
            return None
        msg = po.decode(payload)
        if isinstance(msg, po.StreamStart):
            if self._txn is not None:
                raise CorruptEventError("pgoutput Stream Start inside a transaction")
            spool = self._spools.get(msg.xid)
            if spool is None or msg.first:
                if spool is not None:
                    spool.close()
                spool = self._spools[msg.xid] = Spool(msg.xid, self._budget, self._spill_dir)
            self._in_stream = msg.xid
            self._stats["streams_open"] = float(len(self._spools))
            return None
        if isinstance(msg, po.StreamCommit):
            return self._stream_commit(msg)
        if isinstance(msg, po.StreamAbort):
            self._stream_abort(msg)
            return None
        if isinstance(msg, po.StreamStop):
            raise CorruptEventError("pgoutput Stream Stop outside a stream block")
        return self._message(msg)

    def _streamed(self, payload: bytes) -> None:
        """A message inside a stream block: held until its transaction ends."""
        t = payload[:1]
        if t == b"E":  # Stream Stop
            self._in_stream = None
            return
        if t in (b"S", b"c", b"A", b"B", b"C"):
            raise CorruptEventError(f"pgoutput message {t!r} inside a stream block")
        assert self._in_stream is not None
        spool = self._spools[self._in_stream]
        before = spool.spilled_bytes
        spool.append(payload, po.streamed_xid(payload))
        self._stats["stream_spilled_bytes_total"] += spool.spilled_bytes - before

    def _stream_abort(self, msg: po.StreamAbort) -> None:
        spool = self._spools.get(msg.xid)
        if spool is None:
            return  # nothing of it was streamed in this session
        if msg.subxid == msg.xid:
            spool.close()
            del self._spools[msg.xid]
            self._stats["streamed_aborts_total"] += 1
            self._stats["streams_open"] = float(len(self._spools))
        else:
            spool.abort_subxact(msg.subxid)

    def _stream_commit(self, msg: po.StreamCommit) -> Window | None:
        """Decode a streamed transaction's messages, in order, into its one window."""
        spool = self._spools.pop(msg.xid, None)
        self._stats["streams_open"] = float(len(self._spools))
        if spool is None:
            raise CorruptEventError(
                f"pgoutput Stream Commit of transaction {msg.xid}, never streamed")
        if self._txn is not None:
            raise CorruptEventError("pgoutput Stream Commit inside a transaction")
        self._txn = _Txn(msg.xid, msg.commit_ts_us)
        change = self._rows.change
        try:
            for payload in spool.messages():
                if payload[:1] in _CHANGES and change(payload, 4) >= 0:
                    continue
                inner = po.decode(po.unstreamed(payload))
                if isinstance(inner, (po.Begin, po.Commit, po.StreamStart, po.StreamStop,
                                      po.StreamCommit, po.StreamAbort)):
                    raise CorruptEventError(f"pgoutput {type(inner).__name__} inside a"
                                            " streamed transaction")
                self._message(inner)
        finally:
            spool.close()
        self._stats["streamed_transactions_total"] += 1
        return self._commit(po.Commit(msg.flags, msg.commit_lsn, msg.end_lsn,
                                      msg.commit_ts_us))

    def _message(self, msg: po.Message) -> Window | None:
        if isinstance(msg, po.Begin):
            self._txn = _Txn(msg.xid, msg.commit_ts_us)
        elif isinstance(msg, po.Commit):
            return self._commit(msg)
        elif isinstance(msg, po.Relation):
            self._relation(msg)
        elif isinstance(msg, (po.Insert, po.Update, po.Delete)):
            self._change(msg)
        elif isinstance(msg, po.Truncate):
            self._truncate(msg)
        elif isinstance(msg, po.Origin):
            if self._txn is not None:
                self._txn.origin = f"{msg.name}/{po.lsn_text(msg.lsn)}"
        elif isinstance(msg, po.TypeInfo):
            self._types[msg.oid] = f"{msg.namespace}.{msg.name}"
        # LogicalMessage: only sent when asked for (messages option), never here
        return None

    def _version_of(self, rel: int) -> TableVersion | None:
        entry = self._rels.get(rel)
        if entry is None:
            raise SchemaError(f"pgoutput change of relation {rel} before its Relation message")
        return entry.version

    def _change(self, msg: po.Insert | po.Update | po.Delete) -> None:
        txn = self._txn
        if txn is None:
            raise SchemaError("pgoutput change outside a transaction")
        if msg.rel in self._signal_rels:
            if isinstance(msg, po.Insert):  # signals and watermarks are inserted rows
                self._signal_row(txn, msg)
            return
        version = self._version_of(msg.rel)
        if version is None:
            return
        rows = self._rows
        index = rows.pending
        # columns left out (include/exclude_columns) go here, before anything else
        if isinstance(msg, po.Insert):
            after, payload = version.typed(version.project(msg.new))
            rows.add(version, ev.Op.INSERT, version.key(after, index), payload, None)
        elif isinstance(msg, po.Delete):
            before, payload = version.typed(version.project(msg.old))
            rows.add(version, ev.Op.DELETE, version.key(before, index), payload, None)
        else:
            old_texts = version.project(msg.old) if msg.old is not None else None
            new = self._untoasted(version.project(msg.new), old_texts, msg.old_kind, version)
            after = version.values(new)
            old = version.values(old_texts) if old_texts is not None else None
            new_key = version.key(after, index)
            if old is not None and version.key_index:
                old_key = version.key(old, index)
                if old_key != new_key:
                    rows.add(version, ev.Op.DELETE, old_key, version.encode(old), None)
                    rows.add(version, ev.Op.INSERT, new_key, version.encode(after), None)
                    return
            image = version.encode(old) if old is not None and msg.old_kind == "O" else None
            rows.add(version, ev.Op.UPDATE, new_key, version.encode(after), image)

    def _untoasted(self, new_texts: list[Any], old: list[Any] | None, old_kind: str,
                   version: TableVersion) -> list[Any]:
        """The new tuple (kept columns) with unchanged TOASTed values filled in (module
        docstring); ``old``: the old tuple's kept columns, ``old_kind`` its kind."""
        new = list(new_texts)
        missing = [i for i, v in enumerate(new) if v is po.UNCHANGED]
        if not missing:
            return new
        if old_kind == "O" and old is not None:
            for i in missing:
                new[i] = old[i]
            if all(new[i] is not po.UNCHANGED for i in missing):
                self._stats["toast_carried_total"] += len(missing)
                return new
            missing = [i for i in missing if new[i] is po.UNCHANGED]
        fetched = self._fetch(version, new, missing)
        for i in missing:
            new[i] = fetched.get(i) if fetched is not None else None
        if fetched is None:
            self._stats["toast_unavailable_total"] += len(missing)
            log.warning("%s: unchanged TOASTed column(s) %s of an updated row not found (row"
                        " deleted since?): sent as NULL", version.schema.name,
                        [version.fields[i] for i in missing])
        else:
            self._stats["toast_fetched_total"] += len(missing)
        return new

    def _fetch(self, version: TableVersion, new: list[Any], columns: list[int]
               ) -> dict[int, Any] | None:
        assert self._sql is not None
        names = version.schema.column_names
        if not version.key_index:
            return None
        schema, _, table = version.schema.name.partition(".")
        select = ", ".join(f"CASE WHEN {quote_ident(names[i])} IS NULL THEN NULL"
                           f" ELSE concat({quote_ident(names[i])}) END" for i in columns)
        where = " AND ".join(f"{quote_ident(names[i])} = %s" for i in version.key_index)
        rows = self._sql.query(
            f"SELECT {select} FROM {quote_ident(schema)}.{quote_ident(table)} WHERE {where}",
            tuple(new[i].decode("utf-8") if isinstance(new[i], bytes) else new[i]
                  for i in version.key_index))
        if not rows:
            return None
        return dict(zip(columns, rows[0], strict=True))

    def _truncate(self, msg: po.Truncate) -> None:
        txn = self._txn
        if txn is None:
            raise SchemaError("pgoutput truncate outside a transaction")
        for rel in msg.rels:
            version = self._version_of(rel)
            if version is not None:
                self._rows.add(version, ev.Op.TRUNCATE, 0, b"", None)
                self._stats["truncates_total"] += 1

    def _commit(self, msg: po.Commit) -> Window | None:
        txn, self._txn = self._txn, None
        self._server_lsn = max(self._server_lsn, msg.end_lsn)
        coord = self._coord
        if txn is None or (not self._rows.pending and not txn.signals and not self._notices
                           and (coord is None or coord.chunk is None)):
            self._rows.clear()
            return None
        scn = msg.end_lsn
        ts_ns = (msg.commit_ts_us + po.PG_EPOCH_US) * 1000
        origin = None if txn.origin is None else txn.origin.encode("utf-8")
        data, count = self._rows.commit(scn, ts_ns, str(txn.xid).encode(), origin)
        if coord is None:
            return Window(scn, data, count, ts_ns) if count else None
        parts, rows = [data], count
        notices, self._notices = self._notices, []
        marks = [sid for sid, kind, _ in txn.signals if kind in inc.MARKS]
        for sid, kind, text in txn.signals:
            if kind not in inc.MARKS:
                notices += coord.signal(sid, kind, text)
        chunk, more = coord.on_commit(marks, lambda table: _keys(data, table))
        notices += more
        if chunk is not None:
            version: TableVersion = chunk.shape
            s = version.schema
            parts += [ev.encode(scn=scn, src_id=s.src_id, key=key, payload=payload,
                                schema_id=s.id, schema_version=s.version, op=ev.Op.READ,
                                timestamp_ns=ts_ns, extra_attributes=ev.ATTR_SNAPSHOT)
                      for key, payload in chunk.rows.items()]
            rows += len(chunk.rows)
            self._stats["snapshot_rows_total"] += len(chunk.rows)
        for notice in notices:
            parts.append(self._notice_event(notice, scn, ts_ns))
            rows += 1
            name = f"snapshot_{notice['kind'].lower()}_total"
            self._stats[name] += 1
        if chunk is not None or txn.signals or notices:
            self._records.add(scn, coord.state())
        if not rows:
            return None
        return Window(scn, b"".join(parts), rows, ts_ns)

    # -- incremental snapshots -----------------------------------------------------

    def _signal_row(self, txn: _Txn, msg: po.Insert) -> None:
        rel = self._rels[msg.rel].msg
        row = {c.name: v for c, v in zip(rel.columns, msg.new, strict=False)}

        def text(v: Any) -> str | None:
            return v.decode("utf-8") if isinstance(v, bytes) else None

        txn.signals.append((str(text(row.get("id"))), str(text(row.get("type"))),
                            text(row.get("data"))))

    def _open_chunk(self) -> None:
        assert self._coord is not None and self._chunks is not None
        self._notices += self._coord.open_chunk()
        if self._notices and self._coord.chunk is None:
            # no watermark will commit: a marker row carries the notices to the stream
            self._chunks.write_watermark(uuid.uuid4().hex, inc.NOTIFY, "{}")

    def _notice_event(self, notice: dict[str, Any], scn: int, ts_ns: int) -> bytes:
        s = self._notify
        assert s is not None  # signals on
        return inc.notice_event(s, notice, scn, ts_ns)

    def signal(self, kind: str, data: dict[str, Any] | None) -> str:
        """Insert a signal row (the MySQL source's contract, :mod:`.incremental`) on its
        own connection: the capture thread meets it in the stream, in commit order.
        Thread-safe."""
        if kind not in (inc.EXECUTE, inc.STOP, inc.PAUSE, inc.RESUME):
            raise InvalidRequestError(
                f"unknown signal {kind!r}; one of {inc.EXECUTE}, {inc.STOP}, {inc.PAUSE},"
                f" {inc.RESUME}")
        if self._signals_off is not None:
            raise InvalidRequestError(
                f"signals are off for this source: the signal table {self.signal_table} is"
                f" not in publication {self.publication}; run {self._signals_off} (or set"
                " create_publication: true) and restart the relay")
        sid = uuid.uuid4().hex
        session = SqlSession(self.url)
        try:
            chunks = PgChunks(session, self.signal_table, self._wanted, self._version_for)
            if kind == inc.EXECUTE:
                # refused here (400, nothing written) rather than an ERROR notice later
                inc.matched_tables(data, chunks.tables())
                data = self._checked_conditions(session, data or {})
            chunks.write_watermark(sid, kind, json.dumps(data or {}))
        except DatabusError as exc:
            if isinstance(exc, InvalidRequestError):
                raise
            raise InvalidRequestError(f"cannot write to {self.signal_table}: {exc}") from exc
        finally:
            session.close()
        return sid

    def _checked_conditions(self, session: SqlSession, data: dict[str, Any]
                            ) -> dict[str, Any]:
        """:func:`~databus.sources.sqlfilter.checked_conditions` (PostgreSQL dialect)."""
        return checked_conditions(
            data, wanted=self._wanted, dialect="postgres", qualifier="schema",
            columns=lambda schema, name: [str(r[0]) for r in session.query(
                "SELECT column_name FROM information_schema.columns"
                " WHERE table_schema = %s AND table_name = %s", (schema, name))])

    # -- positions -----------------------------------------------------------------

    def acknowledge(self, scn: int) -> None:
        """The relay no longer needs what is up to ``scn``: the slot may move there (sent
        by the capture thread with its next read)."""
        with self._lock:
            self._ack = max(self._ack, scn)

    def _confirm(self, stream: ReplicationStream) -> None:
        with self._lock:
            ack = self._ack
            if ack <= self._confirmed:
                return
            self._confirmed = ack
        self._save_slot_state(acknowledged=ack)  # recorded before the server hears of it
        self._records.forget_before(ack)  # a restart never goes back before it
        if ack > self._slot_floor:  # never back: the server would take a lower LSN
            stream.confirm(ack)

    def stats(self) -> dict[str, float]:
        """The slot as the server sees it (read every few seconds from
        ``pg_replication_slots``): its confirmed LSN, its lag behind the server's WAL
        end (``slot_lag_bytes``) and the WAL the server keeps for it
        (``slot_retained_bytes``); TOAST fill-ins, truncates, snapshots."""
        out = dict(self._stats)
        p = self._coord.progress if self._coord is not None else None
        out["snapshot_running"] = float(bool(out["snapshot_running"]) or p is not None)
        out["snapshot_paused"] = float(bool(p and p.paused))
        out["snapshot_tables_left"] = float(len(p.tables) if p else 0)
        return out


def _keys(data: bytes, table: str) -> list[int | bytes]:
    """Event keys of ``table``'s rows among encoded events."""
    src = source_id(table)
    out: list[int | bytes] = []
    off = 0
    while off < len(data):
        if ev.peek_src_id(data, off) == src:
            out.append(ev.peek_key(data, off))
        off += ev.peek_length(data, off)
    return out
