"""Replicate a stream into same-named tables of a SQL database (SQLite, PostgreSQL,
MariaDB/MySQL), with an exactly-once effect.

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
* insert / update / snapshot read -> upsert by primary key (the dialect's
  ``INSERT .. ON CONFLICT`` / ``ON DUPLICATE KEY UPDATE``; delete + insert
  elsewhere); an update whose before image has another key first deletes the
  old row; delete -> delete by key; truncate -> delete every row.
* Each whole window is applied in ONE target transaction that also writes the
  checkpoint row (table ``databus_checkpoint``, row ``name``). A window whose
  SCN is not after the checkpoint stored in the target is skipped. So a crash
  at any point applies a window fully or not at all, and a replayed window
  has no effect: exactly-once effect on the target.
* The sink is also the client's :class:`CheckpointStore`: it loads its
  position from the target when the client starts, and its ``save`` has
  nothing left to do (the position was committed with the window).
* A target that cannot be reached raises
  :class:`~databus.core.errors.SinkUnavailableError` (transient): the client
  rolls back and replays the window after a backoff.

Bootstrap (:mod:`databus.client.bootstrap`): a snapshot bootstrap first
empties the replicated tables (in the transaction of its first checkpoint:
rows deleted before the snapshot's start are not sent), snapshot rows (op
READ) are upserts like inserts, catch-up events are applied like a window's. The events
of a bootstrap batch are applied in ONE target transaction together with the
bootstrap checkpoint, when the client saves it (:meth:`save`), so a crash
during a bootstrap resumes exactly after the last batch applied.

Table creation and ALTERs run in their own transaction just before a window's
data transaction (MariaDB commits DDL implicitly, so it never shares one), and
only for a window not yet applied (checked against the target's checkpoint),
so a replayed old window never takes the table back to an old shape.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql, sqlite

from databus.client.checkpoints import CheckpointStore, SqlCheckpointStore
from databus.client.consumer import Consumer, DataEvent, Result
from databus.client.sinks.sqltypes import Converter, column_type
from databus.client.sql import make_engine, redacted, translate_db_errors
from databus.core.checkpoint import Checkpoint
from databus.core.errors import SchemaError
from databus.core.event import Op
from databus.core.schema import INTERNAL_PREFIX, TableSchema

log = logging.getLogger("databus.client.replicate")

_UPSERT, _DELETE, _TRUNCATE = "upsert", "delete", "truncate"


@dataclass(frozen=True)
class _Target:
    """How rows of one schema version land in one target table."""

    table: sa.Table
    key: tuple[str, ...]
    columns: tuple[tuple[str, Converter | None], ...]
    upsert: Any  # an executable INSERT .. ON CONFLICT, or None (delete + insert)
    delete: Any


class ReplicateSink(Consumer, CheckpointStore):
    """Applies windows to a SQL target; see the module docstring.

    ``target``: a SQLAlchemy URL (an engine is made and disposed by
    :meth:`close`) or an Engine. ``sources``: the sources to replicate, by
    ``db.table`` or table name; None = every source received. ``name``: the
    checkpoint row, so several sinks can share a target.
    """

    def __init__(self, target: str | sa.Engine, sources: Iterable[str] | None = None, *,
                 name: str = "replicate", checkpoint_table: str = "databus_checkpoint",
                 table_map: dict[str, str] | None = None, drop_columns: bool = True) -> None:
        self._owned = isinstance(target, str)
        self.engine = make_engine(target) if isinstance(target, str) else target
        self.dialect = self.engine.dialect.name
        self.sources = set(sources) if sources is not None else None
        self.table_map = dict(table_map or {})
        self.store = SqlCheckpointStore(self.engine, name, checkpoint_table)
        self.drop_columns = drop_columns
        self._targets: dict[bytes, _Target] = {}
        self._shape: dict[str, bytes] = {}  # target table -> schema id it was last altered to
        self._events: list[DataEvent] = []
        self._ops: list[tuple[DataEvent, _Target]] = []
        self.windows_applied = 0
        self.windows_skipped = 0
        self._bootstrapping = False
        self._reset: list[_Target] = []  # tables emptied with the next bootstrap save

    # -- CheckpointStore ---------------------------------------------------------

    @property
    def checkpoint_store(self) -> CheckpointStore:
        """The store to give the client: the sink itself (position lives in the target)."""
        return self

    def load(self) -> Checkpoint | None:
        """The checkpoint committed in the target with the last applied window."""
        return self.store.load()

    def save(self, checkpoint: Checkpoint) -> None:
        """Online: nothing to do, the checkpoint was committed with its window.
        During a bootstrap: apply the batch's events and the checkpoint in one
        transaction."""
        if not self._bootstrapping:
            return
        try:  # the batch's operations were gathered by on_bootstrap_event
            with (translate_db_errors("applying a bootstrap batch", self.engine),
                  self.engine.connect() as conn, conn.begin()):
                self.store.load_in(conn, for_update=True)
                for target in self._reset:
                    conn.execute(sa.delete(target.table))
                self._apply(conn)
                self.store.save_in(conn, checkpoint)
        finally:
            self._clear()
        self._reset = []

    def close(self) -> None:
        """Dispose the engine if the sink created it. Idempotent."""
        self._clear()
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

    def _clear(self) -> None:
        self._events.clear()
        self._ops.clear()

    def on_start_data_event_sequence(self, scn: int) -> Result:
        self._clear()
        return None

    def on_data_event(self, event: DataEvent) -> Result:
        if self._wanted(event.source):
            self._events.append(event)
        return None

    def on_end_data_event_sequence(self, scn: int) -> Result:
        try:
            self._end(scn)
        finally:
            self._clear()
        return None

    def _applied(self, scn: int) -> bool:
        """True when the target's checkpoint says window ``scn`` is already in."""
        with (translate_db_errors(f"reading the checkpoint before window {scn}", self.engine),
              self.engine.connect() as conn, conn.begin()):
            stored = self.store.load_in(conn)
        return stored is not None and not stored.in_window and scn <= stored.window_scn

    def _end(self, scn: int) -> None:
        needs_ddl = any(self._shape.get(self.table_name(e.source)) != e.schema.id
                        for e in self._events)
        if needs_ddl and self._applied(scn):
            self.windows_skipped += 1
            log.info("window %d already applied; skipped", scn)
            return
        self._ops = [(e, self._target(e.schema)) for e in self._events]
        with (translate_db_errors(f"applying window {scn}", self.engine),
              self.engine.connect() as conn, conn.begin()):
            stored = self.store.load_in(conn, for_update=True)
            if stored is not None and not stored.in_window and scn <= stored.window_scn:
                self.windows_skipped += 1
                log.info("window %d already applied (target checkpoint %d); skipped",
                         scn, stored.window_scn)
            else:
                self._apply(conn)
                base = stored if stored is not None else Checkpoint.flexible()
                self.store.save_in(conn, base.window_done(scn))
                self.windows_applied += 1

    def on_rollback(self, scn: int) -> Result:
        self._clear()
        self._targets.clear()  # re-inspect the target: it may have been changed
        self._shape.clear()
        return None

    # -- bootstrap -------------------------------------------------------------------

    def on_start_bootstrap(self) -> Result:
        self._bootstrapping = True
        self._clear()
        return None

    def on_bootstrap_snapshot_start(self, sources: list[TableSchema]) -> Result:
        """Empty the replicated tables of ``sources``, in the transaction that saves
        the bootstrap's first checkpoint: the snapshot replaces them."""
        self._reset = [self._target(s) for s in sources if self._wanted(s.name)]
        return None

    def on_bootstrap_event(self, event: DataEvent) -> Result:
        """Queue the event for the batch's transaction (:meth:`save`). Snapshot rows
        (op READ) carry the schema version they were last written with, so one
        batch mixes versions: their tables only gain columns (rows of an older
        version leave the newer columns NULL, as at the source); catch-up events
        shape tables like online windows."""
        if not self._wanted(event.source):
            return None
        if event.op == Op.READ:
            target = self._targets.get(event.schema.id)
            if target is None:
                drop, self.drop_columns = self.drop_columns, False
                try:
                    with translate_db_errors(f"preparing the table of {event.source}",
                                             self.engine):
                        target = self._targets[event.schema.id] = self._prepare(event.schema)
                finally:
                    self.drop_columns = drop
        else:
            target = self._target(event.schema)
        self._ops.append((event, target))
        return None

    def on_bootstrap_rollback(self, scn: int) -> Result:
        self._reset = []
        return self.on_rollback(scn)

    def on_end_bootstrap(self) -> Result:
        self._bootstrapping = False
        return None

    def on_stop_consumption(self) -> Result:
        self._clear()
        return None

    # -- applying ----------------------------------------------------------------

    def _apply(self, conn: sa.Connection) -> None:
        """Run the window's operations in order, batching runs of one kind."""
        batch: list[Any] = []
        batch_key: tuple[str, int] | None = None
        batch_target: _Target | None = None
        for event, target in self._ops:
            for kind, row in self._operations(event, target):
                key = (kind, id(target))
                if key != batch_key:
                    if batch_target is not None and batch_key is not None:
                        self._flush(conn, batch_key[0], batch_target, batch)
                    batch, batch_key, batch_target = [], key, target
                batch.append(row)
        if batch_target is not None and batch_key is not None:
            self._flush(conn, batch_key[0], batch_target, batch)

    def _operations(self, event: DataEvent, target: _Target) -> list[tuple[str, Any]]:
        op = event.op
        if op == Op.TRUNCATE:
            return [(_TRUNCATE, None)]
        if op == Op.DELETE:
            before = event.before
            if before is None:
                raise SchemaError(f"delete on {event.source} at scn {event.scn} has no row")
            return [(_DELETE, self._key_of(before, target))]
        after = event.after
        if after is None:
            raise SchemaError(f"{op.name.lower()} on {event.source} at scn {event.scn} has no row")
        row = {col: (conv(after.get(col)) if conv else after.get(col))
               for col, conv in target.columns}
        out: list[tuple[str, Any]] = []
        if op == Op.UPDATE:
            before = event.before
            if before is not None:
                old = self._key_of(before, target)
                if old != self._key_of(row, target):
                    out.append((_DELETE, old))
        out.append((_UPSERT, row))
        return out

    @staticmethod
    def _key_of(row: dict[str, Any], target: _Target) -> dict[str, Any]:
        conv = dict(target.columns)
        out = {}
        for i, col in enumerate(target.key):
            c = conv.get(col)
            out[f"k{i}"] = c(row.get(col)) if c else row.get(col)
        return out

    def _flush(self, conn: sa.Connection, kind: str, target: _Target, rows: list[Any]) -> None:
        if kind == _TRUNCATE:
            conn.execute(sa.delete(target.table))
            return
        if kind == _DELETE:
            unique = {tuple(r.values()): r for r in rows}
            conn.execute(target.delete, list(unique.values()))
            return
        # upserts: the last image of a key wins, as applying them in order would
        last: dict[tuple[Any, ...], dict[str, Any]] = {}
        for r in rows:
            last[tuple(r[k] for k in target.key)] = r
        values = list(last.values())
        if target.upsert is not None:
            conn.execute(target.upsert, values)
        else:
            keys = [{f"k{i}": r[k] for i, k in enumerate(target.key)} for r in values]
            conn.execute(target.delete, keys)
            conn.execute(sa.insert(target.table), values)

    # -- tables ------------------------------------------------------------------

    def _target(self, schema: TableSchema) -> _Target:
        """The target of ``schema``'s rows, its table altered to that schema's shape."""
        t = self._targets.get(schema.id)
        name = self.table_name(schema.name)
        if t is None or self._shape.get(name) != schema.id:
            with translate_db_errors(f"preparing the table of {schema.name}", self.engine):
                if t is None:
                    t = self._targets[schema.id] = self._prepare(schema)
                else:
                    self._create_or_alter(t.table, t.key)
            self._shape[name] = schema.id
        return t

    def table_name(self, source: str) -> str:
        return self.table_map.get(source) or source.partition(".")[2] or source

    def _prepare(self, schema: TableSchema) -> _Target:
        key = tuple(schema.key_columns)
        if not key:
            raise SchemaError(f"{schema.name} has no key columns; replicate needs a primary key")
        fields = schema.avro["fields"]
        names = [f.get("column", f["name"]) for f in fields]
        missing = [k for k in key if k not in names]
        if missing:
            raise SchemaError(f"{schema.name}: key columns {missing} are not in its schema")
        columns: list[sa.Column[Any]] = []
        converters: list[tuple[str, Converter | None]] = []
        for f, name in zip(fields, names, strict=True):
            ct = column_type(f["type"], key=name in key, dialect=self.dialect,
                             sql_type=str(f.get("sql_type", "")))
            columns.append(sa.Column(name, ct.type, primary_key=name in key,
                                     nullable=ct.nullable, autoincrement=False))
            converters.append((name, ct.convert))
        table = sa.Table(self.table_name(schema.name), sa.MetaData(), *columns)
        self._create_or_alter(table, key)
        cond = sa.and_(*(table.c[k] == sa.bindparam(f"k{i}") for i, k in enumerate(key)))
        return _Target(table, key, tuple(converters), self._upsert(table, key),
                       sa.delete(table).where(cond))

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

    def _upsert(self, table: sa.Table, key: tuple[str, ...]) -> Any:
        others = [c.name for c in table.columns if c.name not in key]
        if self.dialect in ("sqlite", "postgresql"):
            ins = (sqlite.insert(table) if self.dialect == "sqlite"
                   else postgresql.insert(table))
            if not others:
                return ins.on_conflict_do_nothing(index_elements=list(key))
            return ins.on_conflict_do_update(
                index_elements=list(key), set_={c: ins.excluded[c] for c in others})
        if self.dialect in ("mysql", "mariadb"):
            mins = mysql.insert(table)
            cols = others or list(key)
            return mins.on_duplicate_key_update({c: mins.inserted[c] for c in cols})
        return None
