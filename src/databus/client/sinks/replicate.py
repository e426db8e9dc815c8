"""Replicate a stream into same-named tables of a SQL database (SQLite, PostgreSQL,
MariaDB/MySQL), with an exactly-once effect, many windows per target transaction.

Contract:

* Source ``db.table`` goes to table ``table`` of the target (``table_map``
  can rename); ``databus.*`` sources (DDL and snapshot notices) are not rows
  and are skipped. A missing table is created from the source's Avro schema
  (types: :mod:`databus.client.sinks.sqltypes`), primary key = the schema's
  key columns.
* Schema changes: before a window is applied, each of its tables is made to
  match the schema its events carry (the source's table version at that
  point of the stream): columns the schema adds are added (nullable);
  columns the target has but the schema lacks (dropped at the source) are
  dropped, unless ``drop_columns=False`` (then they stay, and rows written
  from then on leave them NULL or unchanged). Key columns are never dropped.
  A column added at the source with a DEFAULT gets NULL in the rows written
  before (the binlog carries no row images for them).
* insert / update / snapshot read -> upsert by primary key; an update whose
  before image has another key first deletes the old row; delete -> delete by
  key; truncate -> delete every row. How, per dialect, and the net effect of
  a batch (a key's last image wins; a truncate cuts the batch):
  :mod:`databus.client.sinks.apply`.
* **Batches** (``batch``, :class:`~databus.client.config.BatchConfig`): whole
  windows are gathered into one target transaction, committed with the
  checkpoint of its last window (table ``databus_checkpoint``, row ``name``)
  when it holds ``batch.rows`` row changes or ``batch.bytes`` bytes, or is
  ``batch.linger`` seconds old; a writer thread commits one batch while the
  next is gathered (:mod:`databus.client.sinks.batches`). Windows whose SCN
  is not after the checkpoint stored in the target (read, locked, in the
  batch's transaction) are left out. So a crash at any point applies a batch
  fully or not at all, and a replayed window has no effect: exactly-once
  effect on the target.
* The sink is also the client's :class:`CheckpointStore`: it loads its
  position from the target when the client starts, and its ``save`` commits
  the open batch and waits for it (the position was committed with the
  windows). The sink asks for a save (``CHECKPOINT``) every ``SAVE_EVERY``
  (5) seconds while batches are committed, so the client's own position, from
  which it replays after a failure, stays close behind the target's (a save
  drains the pipeline: more often costs throughput). A client should
  save only then (``ReplicateConfig.client_config()``): saving every window
  commits every window on its own.
* A target that cannot be reached raises
  :class:`~databus.core.errors.SinkUnavailableError` (transient): the client
  rolls back and replays after a backoff. A batch that fails is applied
  again window by window, so a window that keeps failing is named and
  retried on its own.

Bootstrap (:mod:`databus.client.bootstrap`): a snapshot bootstrap first
empties the replicated tables (in the transaction of its first checkpoint:
rows deleted before the snapshot's start are not sent), snapshot rows (op
READ) are upserts like inserts, catch-up events are applied like a window's. The events
of a bootstrap batch are applied in ONE target transaction together with the
bootstrap checkpoint, when the client saves it (:meth:`save`), so a crash
during a bootstrap resumes exactly after the last batch applied.

Table creation and ALTERs run in their own transaction (MariaDB commits DDL
implicitly, so it never shares one); an ALTER, and on SQLite any of them, after
every window before is committed (a table no batch in flight writes is created
at once); and only for a window not yet applied (checked against the target's
checkpoint), so a replayed old window never takes the table back to an old
shape.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from operator import attrgetter

import sqlalchemy as sa

from databus.client.checkpoints import CheckpointStore, SqlCheckpointStore
from databus.client.config import BatchConfig
from databus.client.consumer import Consumer, ConsumerResult, DataBatch, Result, WindowBatch
from databus.client.dispatcher import schema_runs
from databus.client.sinks.apply import (
    TableWriter,
    Writers,
    apply_changes,
    plan_changes,
    run_plan,
    writer_key,
)
from databus.client.sinks.batches import Batch, BatchPipeline
from databus.client.sinks.sqltypes import Converter, column_type
from databus.client.sql import make_engine, redacted, translate_db_errors
from databus.core.checkpoint import Checkpoint
from databus.core.errors import ConsumerCallbackError, DatabusError, SchemaError, TransientError
from databus.core.event import ATTR_OPCODE_MASK, Event, Op
from databus.core.schema import INTERNAL_PREFIX, TableSchema

log = logging.getLogger("databus.client.replicate")

SAVE_EVERY = 5.0
"""Seconds between the client saves the sink asks for while batches are committed: a
save waits until every batch is committed (the pipeline drains), and bounds what the
client fetches again after a failure (windows the target holds, skipped)."""
_READ = int(Op.READ)
_payload = attrgetter("payload")


class ReplicateSink(Consumer, CheckpointStore):
    """Applies windows to a SQL target; see the module docstring.

    ``target``: a SQLAlchemy URL (an engine is made and disposed by
    :meth:`close`) or an Engine. ``sources``: the sources to replicate, by
    ``db.table`` or table name; None = every source received. ``name``: the
    checkpoint row, so several sinks can share a target. ``batch``: windows per
    target transaction (default :class:`~databus.client.config.BatchConfig`).
    Building one does no I/O.
    """

    def __init__(self, target: str | sa.Engine, sources: Iterable[str] | None = None, *,
                 name: str = "replicate", checkpoint_table: str = "databus_checkpoint",
                 table_map: dict[str, str] | None = None, drop_columns: bool = True,
                 batch: BatchConfig | None = None) -> None:
        self._owned = isinstance(target, str)
        self.engine = make_engine(target) if isinstance(target, str) else target
        self.dialect = self.engine.dialect.name
        self.sources = set(sources) if sources is not None else None
        self.table_map = dict(table_map or {})
        self.store = SqlCheckpointStore(self.engine, name, checkpoint_table)
        self.drop_columns = drop_columns
        self.batch = batch if batch is not None else BatchConfig()
        self._pipe = BatchPipeline(self._commit, self.batch, name, prepare=self._plan)
        self._writers: dict[bytes, TableWriter] = {}
        self._shape: dict[str, bytes] = {}  # target table -> schema id it was last altered to
        # the window's runs: (writer when its table has that shape, schema, events)
        self._window: list[tuple[TableWriter | None, TableSchema, list[Event]]] = []
        self._ready: dict[bytes, TableWriter] = {}  # schema id -> writer, table in shape
        self._unwanted: set[bytes] = set()  # schema ids of sources not replicated
        self._unready = False  # a run of the window has no ready writer
        self._saved_at = (time.monotonic(), 0)  # last save: when, batches committed then
        self.windows_applied = 0
        self.windows_skipped = 0
        self.windows_in_bulk = 0
        """Windows added by :meth:`on_windows` in one piece (every table in shape)."""
        self._bootstrapping = False
        self._boot: list[Event] = []  # the bootstrap batch being gathered
        self._boot_writers: Writers = {}
        self._reset: list[TableWriter] = []  # tables emptied with the next bootstrap save

    @property
    def batches_committed(self) -> int:
        """Target transactions of online windows committed so far."""
        return self._pipe.committed

    # -- CheckpointStore ---------------------------------------------------------

    @property
    def checkpoint_store(self) -> CheckpointStore:
        """The store to give the client: the sink itself (position lives in the target)."""
        return self

    def load(self) -> Checkpoint | None:
        """The checkpoint committed in the target with the last applied window."""
        return self.store.load()

    def save(self, checkpoint: Checkpoint) -> None:
        """Online: commit the open batch (every window up to ``checkpoint``) and wait
        for it. During a bootstrap: apply the bootstrap batch's events and the
        checkpoint in one transaction. A failure makes the client replay."""
        if self._bootstrapping:
            self._save_bootstrap(checkpoint)
            return
        self._flush()

    def _flush(self) -> None:
        try:
            self._pipe.flush()
        except (TransientError, ConsumerCallbackError):
            raise
        except DatabusError as exc:  # replayed like a failing window, not the end
            raise ConsumerCallbackError(str(exc)) from exc
        self._saved_at = (time.monotonic(), self._pipe.committed)

    def _save_bootstrap(self, checkpoint: Checkpoint) -> None:
        try:  # the batch's operations were gathered by on_bootstrap_events
            with (translate_db_errors("applying a bootstrap batch", self.engine),
                  self.engine.connect() as conn, conn.begin()):
                self.store.load_in(conn, for_update=True)
                for writer in self._reset:
                    writer.truncate(conn)
                apply_changes(conn, self._boot, self._boot_writers)
                self.store.save_in(conn, checkpoint)
        finally:
            self._boot = []
            self._boot_writers = {}
        self._reset = []

    def close(self) -> None:
        """Stop the writer (windows not committed are dropped: they come again) and
        dispose the engine if the sink created it. Idempotent."""
        self._pipe.close()
        self._window.clear()
        self._boot = []
        if self._owned:
            self.engine.dispose()

    def __enter__(self) -> ReplicateSink:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- Consumer ------------------------------------------------------------------

    def _wanted(self, source: str) -> bool:
        if source.startswith(INTERNAL_PREFIX):  # DDL and snapshot notices, not rows
            return False
        return (self.sources is None or source in self.sources
                or source.partition(".")[2] in self.sources)

    def on_data_events(self, batch: DataBatch) -> Result:
        schema = batch.schema
        writer = self._ready.get(schema.id)
        if writer is None:
            if schema.id in self._unwanted:
                return None
            if not self._wanted(schema.name):
                self._unwanted.add(schema.id)
                return None
            self._unready = True
        self._window.append((writer, schema, batch.events))
        return None

    def on_end_data_event_sequence(self, scn: int) -> Result:
        window, self._window = self._window, []
        if self._unready:
            # tables to create or alter, only for a window the target does not hold yet;
            # a table that batches in flight write is altered after they are committed
            # (one table new to this run is not: its creation need not wait; on SQLite
            # every change waits, the database has one writer at a time)
            self._unready = False
            if self.dialect == "sqlite" or any(
                    self.table_name(schema.name) in self._shape
                    for writer, schema, _ in window if writer is None):
                self._pipe.flush()
            if self._applied(scn):
                self.windows_skipped += 1
                log.info("window %d already applied; skipped", scn)
                return None
            window = [(self._writer(schema), schema, events) for _, schema, events in window]
        changes: list[Event] = []
        writers: Writers = {}
        nbytes = 0
        for writer, _, events in window:
            assert writer is not None
            changes += events
            for e in events:
                writers[writer_key(e)] = writer
            nbytes += sum(map(len, map(_payload, events)))
        self._pipe.add(scn, changes, nbytes, writers)
        return self._due_save()

    def _due_save(self) -> Result:
        when, committed = self._saved_at
        if self._pipe.committed != committed and time.monotonic() - when >= SAVE_EVERY:
            return ConsumerResult.CHECKPOINT  # the client saves: see the module docstring
        return None

    def on_windows(self, batch: WindowBatch) -> Result:
        """An answer's windows into the open batch at once, when every table they write
        is in shape (the usual case); else window by window as the per-window callbacks
        do (a table to create or alter, a window a failed batch held)."""
        windows = batch.windows
        pipe = self._pipe
        ready = self._ready
        keys = {e.schema_id for w in windows for e in w.events}
        if (b"" in keys or pipe.careful(windows[-1].scn)
                or not keys <= ready.keys() | self._unwanted):
            return self._one_by_one(batch)
        events = [e for w in windows for e in w.events]
        if not keys.isdisjoint(self._unwanted):
            unwanted = self._unwanted
            events = [e for e in events if e.schema_id not in unwanted]
        nbytes = sum(map(len, map(_payload, events)))
        pipe.add_windows([w.scn for w in windows], events, nbytes,
                         {k: ready[k] for k in keys if k in ready})
        self.windows_in_bulk += len(windows)
        return self._due_save()

    def _one_by_one(self, batch: WindowBatch) -> Result:
        out: Result = None
        view = batch.view
        for w in batch.windows:
            for v, start, end in schema_runs(w.events, view):
                self.on_data_events(DataBatch(w.scn, w.events[start:end], v))
            if self.on_end_data_event_sequence(w.scn) is ConsumerResult.CHECKPOINT:
                out = ConsumerResult.CHECKPOINT
        return out

    def on_checkpoint(self, scn: int) -> Result:
        """Commit every window up to ``scn`` before the client persists its checkpoint,
        whichever store keeps it (with another store than the sink, the client's
        position is then never ahead of the target)."""
        if not self._bootstrapping:
            self._flush()
        return None

    def _applied(self, scn: int) -> bool:
        """True when the target's checkpoint says window ``scn`` is already in."""
        with (translate_db_errors(f"reading the checkpoint before window {scn}", self.engine),
              self.engine.connect() as conn, conn.begin()):
            stored = self.store.load_in(conn)
        return stored is not None and not stored.in_window and scn <= stored.window_scn

    def _commit(self, batch: Batch) -> None:
        """One batch and the checkpoint of its last window, in one transaction; the
        windows the target already holds are left out (the writer thread)."""
        scns = batch.scns
        with (translate_db_errors(f"applying {batch.describe()}", self.engine),
              self.engine.connect() as conn, conn.begin()):
            stored = self.store.load_in(conn, for_update=True)
            done = stored.window_scn if stored is not None and not stored.in_window else -1
            new = scns if scns[0] > done else [s for s in scns if s > done]
            if not new:
                self.windows_skipped += len(scns)
                log.info("%s already applied (target checkpoint %d); skipped",
                         batch.describe(), done)
                return
            if len(new) == len(scns) and batch.plan is not None:
                run_plan(conn, batch.plan)
            else:
                apply_changes(conn, [e for e in batch.events if e.scn > done], batch.writers)
            cp = stored if stored is not None else Checkpoint.flexible()
            if len(new) > 1:
                cp = cp.window_done(new[-2])
            self.store.save_in(conn, cp.window_done(new[-1]))
        self.windows_applied += len(new)
        if len(new) < len(scns):
            self.windows_skipped += len(scns) - len(new)
            log.info("%d windows of %s already applied (target checkpoint %d); skipped",
                     len(scns) - len(new), batch.describe(), done)

    @staticmethod
    def _plan(batch: Batch) -> None:
        """A batch's statements, planned on the client's thread as it is sealed (the
        writer thread meanwhile writes the batch before)."""
        try:
            batch.plan = plan_changes(batch.events, batch.writers)
        except DatabusError:  # a bad event: the writer meets it and the window is named
            batch.plan = None

    def on_rollback(self, scn: int) -> Result:
        self._pipe.discard()
        self._window.clear()
        self._writers.clear()  # re-inspect the target: it may have been changed
        self._shape.clear()
        self._ready.clear()
        self._unready = False
        return None

    # -- bootstrap -------------------------------------------------------------------

    def on_start_bootstrap(self) -> Result:
        self._pipe.flush()
        self._bootstrapping = True
        self._boot = []
        return None

    def on_bootstrap_snapshot_start(self, sources: list[TableSchema]) -> Result:
        """Empty the replicated tables of ``sources``, in the transaction that saves
        the bootstrap's first checkpoint: the snapshot replaces them."""
        self._reset = [self._writer(s) for s in sources if self._wanted(s.name)]
        return None

    def on_bootstrap_events(self, batch: DataBatch) -> Result:
        """Queue the events for the batch's transaction (:meth:`save`). Snapshot rows
        (op READ) carry the schema version they were last written with, so one
        batch mixes versions: their tables only gain columns (rows of an older
        version leave the newer columns NULL, as at the source); catch-up events
        shape tables like online windows."""
        if not self._wanted(batch.source):
            return None
        events = batch.events
        schema = batch.schema
        if all(e.attributes & ATTR_OPCODE_MASK == _READ for e in events):
            writer = self._writers.get(schema.id)
            if writer is None:
                drop, self.drop_columns = self.drop_columns, False
                try:
                    with translate_db_errors(f"preparing the table of {schema.name}",
                                             self.engine):
                        writer = self._writers[schema.id] = self._prepare(schema)
                finally:
                    self.drop_columns = drop
        else:
            writer = self._writer(schema)
        self._boot += events
        for e in events:
            self._boot_writers[writer_key(e)] = writer
        return None

    def on_bootstrap_rollback(self, scn: int) -> Result:
        self._reset = []
        self._boot = []
        self._boot_writers = {}
        return self.on_rollback(scn)

    def on_end_bootstrap(self) -> Result:
        self._bootstrapping = False
        return None

    def on_stop_consumption(self) -> Result:
        """The writer thread ends (a next run starts another); windows not saved by
        then come again."""
        self._window.clear()
        pipe = self._pipe
        if pipe.committed:
            log.info("%d windows committed in %d transactions (writer thread: %.1f s of CPU)",
                     pipe.windows, pipe.committed, pipe.writer_cpu)
        pipe.close()
        return None

    # -- tables ------------------------------------------------------------------

    def _writer(self, schema: TableSchema) -> TableWriter:
        """The writer of ``schema``'s rows, its table altered to that schema's shape."""
        w = self._writers.get(schema.id)
        name = self.table_name(schema.name)
        if w is None or self._shape.get(name) != schema.id:
            with translate_db_errors(f"preparing the table of {schema.name}", self.engine):
                if w is None:
                    w = self._writers[schema.id] = self._prepare(schema)
                else:
                    self._create_or_alter(w.table, w.key)
            self._shape[name] = schema.id
            self._ready = {k: r for k, r in self._ready.items() if r.name != name}
            self._ready[schema.id] = w
        return w

    def table_name(self, source: str) -> str:
        return self.table_map.get(source) or source.partition(".")[2] or source

    def _prepare(self, schema: TableSchema) -> TableWriter:
        key = tuple(schema.key_columns)
        if not key:
            raise SchemaError(f"{schema.name} has no key columns; replicate needs a primary key")
        names = schema.column_names
        missing = [k for k in key if k not in names]
        if missing:
            raise SchemaError(f"{schema.name}: key columns {missing} are not in its schema")
        columns: list[sa.Column[object]] = []
        converters: list[Converter | None] = []
        for f, name in zip(schema.avro["fields"], names, strict=True):
            ct = column_type(f["type"], key=name in key, dialect=self.dialect,
                             sql_type=str(f.get("sql_type", "")))
            columns.append(sa.Column(name, ct.type, primary_key=name in key,
                                     nullable=ct.nullable, autoincrement=False))
            converters.append(ct.convert)
        table = sa.Table(self.table_name(schema.name), sa.MetaData(), *columns)
        self._create_or_alter(table, key)
        return TableWriter(table, schema, key, converters, self.engine.dialect)

    def _create_or_alter(self, table: sa.Table, key: tuple[str, ...]) -> None:
        """Create ``table``, or add (and, with ``drop_columns``, drop) columns so
        the target's columns are those of ``table``."""
        with self.engine.begin() as conn:
            insp = sa.inspect(conn)
            if not insp.has_table(table.name):
                table.create(conn, checkfirst=True)
                log.info("created table %s in %s", table.name, redacted(self.engine))
                return
            have = {c["name"] for c in insp.get_columns(table.name)}
            prep = conn.dialect.identifier_preparer
            for col in table.columns:
                if col.name not in have:
                    ddl = (f"ALTER TABLE {prep.format_table(table)} ADD COLUMN "
                           f"{prep.format_column(col)} {col.type.compile(conn.dialect)}")
                    conn.execute(sa.text(ddl))
                    log.info("added column %s.%s", table.name, col.name)
            if not self.drop_columns:
                return
            wanted = {c.name for c in table.columns} | set(key)
            for name in sorted(have - wanted):
                conn.execute(sa.text(f"ALTER TABLE {prep.format_table(table)} DROP COLUMN "
                                     f"{prep.quote(name)}"))
                log.info("dropped column %s.%s (no longer in the source's schema)",
                         table.name, name)
