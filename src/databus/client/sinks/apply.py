"""Row changes into SQL tables: the statements of one table version, compiled once, and
the net effect of many windows applied in one transaction.

Contract of :func:`apply_changes` (``changes``: the events of several whole windows, in
commit order, each with the :class:`TableWriter` of its table version):

* **Order.** The tables end as applying every change in commit order would leave them
  (for tables whose one unique constraint is the primary key). A truncate cuts the
  changes: those before it are applied, then its table is emptied, then those after.
* **Net effect.** Between two cuts, each table gets one change per key: the key's last
  image is upserted, or, when its last change is a delete, the key is deleted. An update
  whose before image has another key (a key change sent as one update) first deletes
  the old key, as a change of its own in commit order. A delete then a re-insert of the
  same key is therefore one upsert; an insert then a delete, one delete.
* **Statements** (per table: the deletes, then the upserts of each table version): a
  delete is ``DELETE .. WHERE key IN (..)`` of up to :data:`DELETE_CHUNK` keys; an upsert
  on PostgreSQL through psycopg, of :data:`COPY_MIN` rows or more, is a ``COPY`` into a
  temporary table (one per table version and session, ``ON COMMIT DELETE ROWS``) and one
  ``INSERT .. SELECT .. ON CONFLICT DO UPDATE``, and of fewer rows one multi-row
  ``INSERT .. ON CONFLICT DO UPDATE``; on MariaDB/MySQL an ``executemany`` of ``INSERT ..
  ON DUPLICATE KEY UPDATE`` (pymysql sends it as multi-row statements); on SQLite an
  ``executemany`` of ``INSERT .. ON CONFLICT DO UPDATE``; elsewhere a delete and an
  insert. ``bench/replicate_statements.py`` measured these against the other forms.
* **Values** are decoded from the events' Avro payloads in one call per table version,
  then converted as the table's column types say
  (:mod:`databus.client.sinks.sqltypes`) and bound with SQLAlchemy's bind processing for
  the dialect: the stored values are those a SQLAlchemy ``insert`` would store.
* **Errors** are SQLAlchemy's (a driver error from ``COPY`` is wrapped as SQLAlchemy
  wraps the others); the caller translates them (:mod:`databus.client.sql`). An event
  without the row its operation needs is a :class:`~databus.core.errors.SchemaError`.

A :class:`TableWriter` is immutable once built and may be used by any thread; statement
texts are built when first needed and kept.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from databus.client.sinks.sqltypes import Converter
from databus.client.wiredecode import RowDecoder
from databus.core.errors import SchemaError
from databus.core.event import ATTR_OPCODE_MASK, Event, Op
from databus.core.schema import MetadataCodec, TableSchema

COPY_MIN = 50
"""Upserts of this many rows or more go through ``COPY`` on PostgreSQL (fewer: one
multi-row ``INSERT``, one round trip instead of three). Measured with
``bench/replicate_statements.py --batch 10,25,50,100,200``: from 50 rows the ``COPY``
form costs the client and the server less CPU per row than the multi-row ``INSERT`` and
is faster; at 25 it is not."""
DELETE_CHUNK = 1000
"""Keys per ``DELETE`` statement."""
VALUES_CHUNK = 1000
"""Rows per multi-row ``INSERT`` statement on PostgreSQL."""

_DELETE, _UPDATE, _TRUNCATE = int(Op.DELETE), int(Op.UPDATE), int(Op.TRUNCATE)
_META_ID = MetadataCodec.ID



def _compose(convert: Converter | None, bind: Callable[[Any], Any] | None
             ) -> Callable[[Any], Any] | None:
    if convert is None:
        return bind
    if bind is None:
        return convert
    return lambda v: bind(convert(v))


class TableWriter:
    """How the rows of one table version land in the target (see the module docstring).

    ``table``: the target table as SQLAlchemy knows it (created or altered to this
    version's columns, in the schema's order); ``converters``: per column, the value
    conversion of its type (:func:`databus.client.sinks.sqltypes.column_type`).
    """

    __slots__ = ("_key_index", "_prepare", "_sql", "decoder", "dialect", "key", "key_of", "name", "names",
                 "schema", "table")

    def __init__(self, table: sa.Table, schema: TableSchema, key: tuple[str, ...],
                 converters: Sequence[Converter | None], dialect: sa.Dialect) -> None:
        self.table = table
        self.schema = schema
        self.name = table.name
        self.dialect = dialect
        self.names = tuple(c.name for c in table.columns)
        self.key = key
        self.decoder = RowDecoder(schema)
        if self.decoder.names != self.names:
            raise SchemaError(f"{schema.name}: the table's columns {self.names} are not the"
                              f" schema's {self.decoder.names}")
        index = self._key_index = [self.names.index(k) for k in key]
        self.key_of: Callable[[tuple[Any, ...]], Any] = itemgetter(*index)
        """A row's key: the value of a one-column key, else a tuple of the values."""
        self._prepare = [
            _compose(conv, col.type.dialect_impl(dialect).bind_processor(dialect))
            for conv, col in zip(converters, table.columns, strict=True)]
        self._sql = _Statements(dialect, table, key, schema.id)

    def rows(self, payloads: Sequence[bytes]) -> list[tuple[Any, ...]]:
        """The rows of Avro ``payloads``, as tuples of the values to bind."""
        columns = self.decoder.columns(payloads)
        lists: list[list[Any]] = []
        for values, prepare in zip(columns.values(), self._prepare, strict=True):
            lists.append(values if prepare is None else [prepare(v) for v in values])
        return list(zip(*lists, strict=True))

    def keys(self, payloads: Sequence[bytes]) -> list[Any]:
        """The keys of Avro ``payloads``, as :attr:`key_of` gives them from :meth:`rows`."""
        columns = self.decoder.columns(payloads)
        lists: list[list[Any]] = []
        for k in self._key_index:
            values, prepare = columns[self.names[k]], self._prepare[k]
            lists.append(values if prepare is None else [prepare(v) for v in values])
        return lists[0] if len(lists) == 1 else list(zip(*lists, strict=True))

    def delete(self, conn: sa.Connection, keys: list[Any]) -> None:
        sql = self._sql
        for i in range(0, len(keys), DELETE_CHUNK):
            chunk = keys[i:i + DELETE_CHUNK]
            params = chunk if len(self.key) == 1 else [v for k in chunk for v in k]
            conn.exec_driver_sql(sql.delete(len(chunk)), tuple(params))

    def upsert(self, conn: sa.Connection, rows: list[tuple[Any, ...]], used: set[str]) -> None:
        """Insert ``rows``, or update the rows of their keys (keys are distinct)."""
        sql = self._sql
        kind = sql.kind
        if kind == "postgresql":
            if len(rows) >= COPY_MIN and sql.copy is not None:
                self._copy_upsert(conn, rows, used)
                return
            for i in range(0, len(rows), VALUES_CHUNK):
                chunk = rows[i:i + VALUES_CHUNK]
                conn.exec_driver_sql(sql.values_upsert(len(chunk)),
                                     tuple(v for r in chunk for v in r))
        elif kind in ("mysql", "sqlite"):
            conn.exec_driver_sql(sql.upsert, rows)
        else:  # no upsert known: delete the keys, then insert
            self.delete(conn, [self.key_of(r) for r in rows])
            conn.exec_driver_sql(sql.insert, rows)

    def truncate(self, conn: sa.Connection) -> None:
        conn.exec_driver_sql(self._sql.truncate)

    def _copy_upsert(self, conn: sa.Connection, rows: list[tuple[Any, ...]],
                     used: set[str]) -> None:
        sql = self._sql
        assert sql.copy is not None and sql.merge is not None
        # the temporary table lives as long as the session; its rows until the commit
        conn.exec_driver_sql(sql.create_temp)
        if sql.temp in used:  # a second upsert of this version in one transaction
            conn.exec_driver_sql(sql.clear_temp)
        used.add(sql.temp)
        raw = conn.connection.driver_connection
        dbapi_error: type[Exception] = conn.dialect.loaded_dbapi.Error
        try:
            with raw.cursor() as cur, cur.copy(sql.copy) as copy:  # type: ignore[union-attr]
                write = copy.write_row
                for r in rows:
                    write(r)
        except dbapi_error as exc:  # as SQLAlchemy wraps a driver error
            raise sa_exc.DBAPIError.instance(sql.copy, None, exc, dbapi_error,
                                             dialect=conn.dialect) from exc
        conn.exec_driver_sql(sql.merge)


class _Statements:
    """The SQL texts of one table version in one dialect, built once."""

    def __init__(self, dialect: sa.Dialect, table: sa.Table, key: tuple[str, ...],
                 schema_id: bytes) -> None:
        prep = dialect.identifier_preparer
        percent = dialect.paramstyle in ("format", "pyformat")

        def q(name: str) -> str:
            quoted = prep.quote(name)
            return quoted.replace("%", "%%") if percent else quoted

        self.mark = "?" if dialect.paramstyle == "qmark" else "%s"
        name = prep.format_table(table)
        self.table = name.replace("%", "%%") if percent else name
        cols = [c.name for c in table.columns]
        self.cols = ", ".join(q(c) for c in cols)
        self.ncols = len(cols)
        self.keys = ", ".join(q(k) for k in key)
        self.nkeys = len(key)
        others = [c for c in cols if c not in key]
        self._values: dict[int, str] = {}
        self._deletes: dict[int, str] = {}
        self.truncate = f"DELETE FROM {self.table}"
        row = "(" + ", ".join([self.mark] * self.ncols) + ")"
        self.insert = f"INSERT INTO {self.table} ({self.cols}) VALUES {row}"
        self.copy: str | None = None
        self.merge: str | None = None
        self.temp = ""
        if dialect.name == "postgresql":
            self.kind = "postgresql"
            self.conflict = (f" ON CONFLICT ({self.keys}) DO " + (
                "UPDATE SET " + ", ".join(f"{q(c)} = EXCLUDED.{q(c)}" for c in others)
                if others else "NOTHING"))
            if dialect.driver == "psycopg":
                digest = hashlib.sha256(table.name.encode() + schema_id).hexdigest()[:16]
                self.temp = f"databus_batch_{digest}"
                self.create_temp = (f"CREATE TEMPORARY TABLE IF NOT EXISTS {self.temp} ON COMMIT"
                                    f" DELETE ROWS AS SELECT {self.cols} FROM {self.table}"
                                    " WITH NO DATA")
                self.clear_temp = f"DELETE FROM {self.temp}"
                self.copy = f"COPY {self.temp} ({self.cols}) FROM STDIN"
                self.merge = (f"INSERT INTO {self.table} ({self.cols}) SELECT {self.cols}"
                              f" FROM {self.temp}{self.conflict}")
        elif dialect.name in ("mysql", "mariadb"):
            self.kind = "mysql"
            update = others or list(key)  # a table of key columns only: a no-op update
            self.upsert = (f"{self.insert} ON DUPLICATE KEY UPDATE "
                           + ", ".join(f"{q(c)} = VALUES({q(c)})" for c in update))
        elif dialect.name == "sqlite":
            self.kind = "sqlite"
            self.upsert = (f"{self.insert} ON CONFLICT ({self.keys}) DO " + (
                "UPDATE SET " + ", ".join(f"{q(c)} = excluded.{q(c)}" for c in others)
                if others else "NOTHING"))
        else:
            self.kind = "other"

    def values_upsert(self, n: int) -> str:
        sql = self._values.get(n)
        if sql is None:
            row = "(" + ", ".join([self.mark] * self.ncols) + ")"
            sql = self._values[n] = (f"INSERT INTO {self.table} ({self.cols}) VALUES "
                                     + ", ".join([row] * n) + self.conflict)
        return sql

    def delete(self, n: int) -> str:
        sql = self._deletes.get(n)
        if sql is None:
            if self.nkeys == 1:
                where = f"{self.keys} IN (" + ", ".join([self.mark] * n) + ")"
            else:
                row = "(" + ", ".join([self.mark] * self.nkeys) + ")"
                where = f"({self.keys}) IN (" + ", ".join([row] * n) + ")"
            sql = self._deletes[n] = f"DELETE FROM {self.table} WHERE {where}"
        return sql


# -- the net effect of a batch -----------------------------------------------------------


def before_image(event: Event) -> bytes | None:
    """The before image an update carries in its metadata (Avro of the row), if any.

    The metadata part's first field is ``before``, a union of null and bytes
    (:data:`databus.core.schema.METADATA_SCHEMA`): read in place, without decoding the
    rest, when the event says it is of that schema.
    """
    md = event.metadata
    if not md:
        return None
    if event.metadata_schema_id != _META_ID:
        raw = MetadataCodec().decode(bytes(md)).get("before")
        return bytes(raw) if raw is not None else None
    if md[0] != 2:  # union branch 0 (null), zigzag-encoded
        return None
    length = shift = 0
    i = 1
    while True:  # the bytes' length, a zigzag varint
        b = md[i]
        length |= (b & 0x7F) << shift
        i += 1
        if not b & 0x80:
            break
        shift += 7
    length = (length >> 1) ^ -(length & 1)
    return bytes(md[i:i + length])


def writer_key(event: Event) -> bytes | int:
    """What :func:`apply_changes` finds an event's :class:`TableWriter` by: its schema
    id, or its source id for an event without one (a truncate)."""
    return event.schema_id or event.src_id


Writers = dict[bytes | int, "TableWriter"]


Step = tuple[int, "TableWriter", Any]
"""One statement group of a plan: (``TRUNCATE``/``DELETE``/``UPSERT``, writer, keys or rows)."""
TRUNCATE, DELETE, UPSERT = 0, 1, 2


def apply_changes(conn: sa.Connection, events: list[Event], writers: Writers) -> None:
    """Apply ``events`` in ``conn``'s transaction (see the module docstring); ``writers``
    holds the writer of each event's :func:`writer_key`."""
    run_plan(conn, plan_changes(events, writers))


def run_plan(conn: sa.Connection, plan: list[Step]) -> None:
    """Run the statements of ``plan`` (:func:`plan_changes`) in ``conn``'s transaction."""
    used: set[str] = set()  # temporary tables filled in this transaction
    for kind, writer, arg in plan:
        if kind == UPSERT:
            writer.upsert(conn, arg, used)
        elif kind == DELETE:
            writer.delete(conn, arg)
        else:
            writer.truncate(conn)


def plan_changes(events: list[Event], writers: Writers) -> list[Step]:
    """What applying ``events`` takes, in order: each table's net change between the
    truncates (decoded, keys compared; no I/O, so it can run on another thread than the
    statements)."""
    plan: list[Step] = []
    ops = [e.attributes & ATTR_OPCODE_MASK for e in events]
    start = 0
    if _TRUNCATE in ops:
        for i, op in enumerate(ops):
            if op == _TRUNCATE:
                _plan_net(plan, events[start:i], ops[start:i], writers)
                plan.append((TRUNCATE, writers[writer_key(events[i])], None))
                start = i + 1
    if start:
        events, ops = events[start:], ops[start:]
    _plan_net(plan, events, ops, writers)
    return plan


def _plan_net(plan: list[Step], events: list[Event], ops: list[int],
              writers: Writers) -> None:
    """Changes without a truncate: each table's net change per key."""
    if not events:
        return
    groups: dict[bytes | int, list[int]] = {}
    for i, e in enumerate(events):
        k = e.schema_id or e.src_id
        group = groups.get(k)
        if group is None:
            group = groups[k] = []
        group.append(i)
    tables: dict[str, list[tuple[TableWriter, list[int]]]] = {}
    for k, idx in groups.items():
        writer = writers[k]
        versions = tables.get(writer.name)
        if versions is None:
            tables[writer.name] = [(writer, idx)]
        elif versions[-1][0] is writer:  # one version under two keys: one group
            versions[-1] = (writer, sorted(versions[-1][1] + idx))
        else:
            versions.append((writer, idx))
    for versions in tables.values():
        if len(versions) == 1:
            writer, idx = versions[0]
            if _plan_table(plan, writer, [events[i] for i in idx], [ops[i] for i in idx]):
                continue
        _plan_ordered(plan, versions, events, ops)


def _decode(writer: TableWriter, events: list[Event]) -> list[tuple[Any, ...]]:
    payloads = [e.payload for e in events]
    if not all(payloads):
        e = events[payloads.index(next(p for p in payloads if not p))]
        raise SchemaError(f"{e.op.name.lower()} on {writer.schema.name} at scn {e.scn}"
                          " has no row")
    return writer.rows(payloads)


def _moved(writer: TableWriter, events: list[Event], ops: list[int],
           rows: list[tuple[Any, ...]]) -> dict[int, Any]:
    """Index -> old key, of the updates whose before image has another key."""
    befores = [(i, b) for i, op in enumerate(ops) if op == _UPDATE
               and (b := before_image(events[i])) is not None]
    if not befores:
        return {}
    key_of = writer.key_of
    old_keys = writer.keys([b for _, b in befores])  # decoding the key columns only
    return {i: old for (i, _), old in zip(befores, old_keys, strict=True)
            if old != key_of(rows[i])}


def _plan_table(plan: list[Step], writer: TableWriter, events: list[Event],
                ops: list[int]) -> bool:
    """The net change of one table written by one version, in bulk: False (nothing
    done) when an update changed a key (the ordered path applies those)."""
    rows = _decode(writer, events)
    if _UPDATE in ops and _moved(writer, events, ops, rows):
        return False
    # key -> the index of its last change
    last = dict(zip(map(writer.key_of, rows), range(len(rows)), strict=True))
    if _DELETE in ops:
        deletes = [k for k, i in last.items() if ops[i] == _DELETE]
        if deletes:
            plan.append((DELETE, writer, deletes))
        upserts = [rows[i] for i in last.values() if ops[i] != _DELETE]
    else:
        upserts = [rows[i] for i in last.values()]
    if upserts:
        plan.append((UPSERT, writer, upserts))
    return True


def _plan_ordered(plan: list[Step], versions: list[tuple[TableWriter, list[int]]],
                  events: list[Event], ops: list[int]) -> None:
    """One table's net change, change by change in commit order: several versions of
    it in one batch, or a key change."""
    rows: dict[int, tuple[Any, ...]] = {}
    moved: dict[int, Any] = {}  # change index -> the old key an update moved its row from
    writer_at: dict[int, TableWriter] = {}
    for writer, idx in versions:
        mine = [events[i] for i in idx]
        my_ops = [ops[i] for i in idx]
        decoded = _decode(writer, mine)
        for j, i in enumerate(idx):
            rows[i] = decoded[j]
            writer_at[i] = writer
        for j, old in _moved(writer, mine, my_ops, decoded).items():
            moved[idx[j]] = old
    # key -> (writer, row to upsert, or None to delete), in last-change order
    net: dict[Any, tuple[TableWriter, tuple[Any, ...] | None]] = {}
    for i in sorted(rows):
        writer = writer_at[i]
        if i in moved:
            old = moved[i]
            net.pop(old, None)
            net[old] = (writer, None)
        row = rows[i]
        key = writer.key_of(row)
        net.pop(key, None)
        net[key] = (writer, None if ops[i] == _DELETE else row)
    deletes: list[Any] = []
    upserts: dict[TableWriter, list[tuple[Any, ...]]] = {}
    last: TableWriter | None = None
    for key, (writer, image) in net.items():
        last = writer
        if image is None:
            deletes.append(key)
        else:
            upserts.setdefault(writer, []).append(image)
    if deletes and last is not None:
        plan.append((DELETE, last, deletes))
    for writer, group_rows in upserts.items():
        plan.append((UPSERT, writer, group_rows))
