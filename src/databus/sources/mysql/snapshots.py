"""The MySQL side of incremental snapshots (:mod:`databus.sources.common.incremental`):
signal table, watermarks, chunks, and a finished chunk's events (:func:`encode_chunk`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from databus.core.errors import SchemaError, StatementError
from databus.sources.common.incremental import Chunk, ChunkReader, chunk_events
from databus.sources.common.names import split_name
from databus.sources.mysql import chunks, fastpath
from databus.sources.mysql import rows as br
from databus.sources.mysql.connection import SqlSession

_SYSTEM = ("mysql", "information_schema", "performance_schema", "sys")


def split(name: str) -> tuple[str, str]:
    return split_name(name, "db.table")


def encode_chunk(chunk: Chunk, scn: int, ts_ns: int) -> tuple[bytes, int]:
    """A finished chunk's rows (event key -> Avro payload) as ``r`` events, by the table's
    compiled codec when it has one (the same bytes as :func:`chunk_events`)."""
    shape = chunk.shape
    if shape.codec is not None:
        return shape.codec.snapshot_events(list(chunk.rows.items()), scn, ts_ns), len(chunk.rows)
    return chunk_events(shape.version.schema, chunk.rows, scn, ts_ns), len(chunk.rows)


class SnapshotIO(ChunkReader):
    """Chunks and watermarks through one SQL session.

    ``shape_of(td)`` gives the table version that encodes a table's rows (the
    source's, so that snapshot rows and streamed rows share schema and keys):
    a :class:`~.tables.Shape`.

    Table definitions (two information_schema queries) are read once per table
    and kept until :meth:`forget` names the table: the source calls it for
    every DDL statement it meets in the binlog, and drops a chunk it read with
    a definition that a DDL has since changed (see ``MysqlSource._ddl_seen``).
    A chunk whose SELECT fails, or whose result columns differ from those seen
    with the fresh definition, is read again once with a fresh definition, so
    a DDL the binlog has not shown yet does not abort the snapshot.
    Chunk rows are read as text-protocol packets and encoded by the table's
    compiled codec when it has one (:func:`.fastpath.text_compatible`), else
    converted by pymysql and encoded by fastavro; both give the same bytes.
    """

    def __init__(self, session: SqlSession, signal_table: str, wanted: Callable[[str], bool],
                 shape_of: Callable[[br.TableDef], Any]) -> None:
        self.session = session
        self.signal_table = signal_table
        self.wanted = wanted
        self.shape_of = shape_of
        self._tables: dict[str, tuple[br.TableDef, Any]] = {}
        self._signatures: dict[str, tuple[tuple[int, ...], ...]] = {}  # of chunk results

    def forget(self, table: str | None = None) -> None:
        """Drop the kept definition of ``table`` (None: of every table)."""
        if table is None:
            self._tables.clear()
            self._signatures.clear()
        else:
            self._tables.pop(table, None)
            self._signatures.pop(table, None)

    def ensure_signal_table(self) -> None:
        db, table = split(self.signal_table)
        q = f"{chunks.quote(db)}.{chunks.quote(table)}"
        try:
            self.session.query(f"CREATE DATABASE IF NOT EXISTS {chunks.quote(db)}")
            self.session.query(f"CREATE TABLE IF NOT EXISTS {q} (id VARCHAR(64) PRIMARY KEY,"
                               " type VARCHAR(32) NOT NULL, data TEXT)")
        except StatementError as exc:
            raise StatementError(
                f"incremental snapshots need the signal table {self.signal_table} ({exc});"
                f" create it (id VARCHAR(64) PRIMARY KEY, type VARCHAR(32) NOT NULL,"
                f" data TEXT) and grant INSERT on it, or set snapshot_mode: no_data") from exc

    def write_watermark(self, wid: str, kind: str, data: str) -> None:
        db, table = split(self.signal_table)
        self.session.query(f"INSERT INTO {chunks.quote(db)}.{chunks.quote(table)}"
                           " (id, type, data) VALUES (%s, %s, %s)", (wid, kind, data))

    def tables(self) -> list[str]:
        rows = self.session.query(
            "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES"
            " WHERE TABLE_TYPE = 'BASE TABLE' ORDER BY TABLE_SCHEMA, TABLE_NAME")
        names = [f"{r[0]}.{r[1]}" for r in rows if str(r[0]) not in _SYSTEM]
        return [n for n in names if n != self.signal_table and self.wanted(n)]

    def table_defs(self, names: Sequence[str]) -> dict[str, br.TableDef | SchemaError]:
        """The definition of each table of ``names`` (``db.table``, existing tables) as
        information_schema gives it now, read with two queries whatever their number;
        a table whose definition cannot be built (a column type snapshots do not read)
        maps to the error. Tables without a primary key have an empty key."""
        if not names:
            return {}
        dbs = sorted({split(n)[0] for n in names})
        marks = ", ".join(["%s"] * len(dbs))
        columns: dict[str, list[tuple[Any, ...]]] = {}
        for row in self.session.query(chunks.ALL_COLUMNS_SQL.format(marks), dbs):
            columns.setdefault(f"{row[0]}.{row[1]}", []).append(tuple(row[2:]))
        keys: dict[str, list[str]] = {}
        for row in self.session.query(chunks.ALL_KEYS_SQL.format(marks), dbs):
            keys.setdefault(f"{row[0]}.{row[1]}", []).append(str(row[2]))
        out: dict[str, br.TableDef | SchemaError] = {}
        for name in names:
            db, table = split(name)
            try:
                out[name] = chunks.table_def(db, table, columns.get(name, []),
                                             keys.get(name, []))
            except SchemaError as exc:
                out[name] = exc
        return out

    def _table(self, table: str) -> tuple[br.TableDef, Any]:
        kept = self._tables.get(table)
        if kept is not None:
            return kept
        db, name = split(table)
        cols = self.session.query(chunks.COLUMNS_SQL, (db, name))
        key = [str(r[0]) for r in self.session.query(chunks.KEY_SQL, (db, name))]
        td = chunks.table_def(db, name, cols, key)
        if not td.primary_key:
            raise SchemaError(f"{table} has no primary key: snapshots need one to match"
                              " streamed changes")
        self._tables[table] = (td, self.shape_of(td))
        return self._tables[table]

    def max_key(self, table: str, key: Sequence[str] | None, condition: str | None
                ) -> tuple[list[Any] | None, list[str]]:
        td, _ = self._table(table)
        cols = list(key) if key else [td.names[i] for i in td.primary_key]
        q = ", ".join(chunks.quote(c) for c in cols)
        db, name = split(table)
        rows = self.session.query(
            f"SELECT {q} FROM {chunks.quote(db)}.{chunks.quote(name)}"
            + (f" WHERE ({condition})" if condition else "")
            + f" ORDER BY {', '.join(f'{chunks.quote(c)} DESC' for c in cols)} LIMIT 1")
        return (list(rows[0]) if rows else None), cols

    def read_chunk(self, table: str, key: Sequence[str], after: Sequence[Any] | None,
                   max_key: Sequence[Any] | None, limit: int, condition: str | None
                   ) -> tuple[list[tuple[int | bytes, Any, Any]], Any]:
        """(event key, Avro payload, chunk-key values) per row, and the Shape that
        encodes them. Only the last row carries its chunk-key values (the
        coordinator seeks from it); the others have an empty tuple."""
        kept = table in self._tables
        td, shape = self._table(table)
        cols = list(key) if key else [td.names[i] for i in td.primary_key]
        sql, params = chunks.chunk_query(td, cols, after, max_key, limit, condition)
        idx = [td.names.index(c) for c in cols]
        try:
            result = self.session.query_raw(sql, params)
        except StatementError:
            if not kept:
                raise
            result = None
        if result is None or self._signatures.setdefault(table, result.signature) \
                != result.signature:
            # a DDL the binlog has not shown yet changed the table: read it afresh once
            self.forget(table)
            return self.read_chunk(table, key, after, max_key, limit, condition)
        if not result.rows:
            return [], shape
        last = result.convert(result.rows[-1])
        tail = [last[i] for i in idx]
        out: list[tuple[int | bytes, Any, Any]]
        if shape.codec is not None and fastpath.text_compatible(td, result.columns):
            out = fastpath.encode_text(shape.codec, result.rows, shape.name)
        else:
            out = [(*self._encode_py(td, shape, result.convert(raw)), ())
                   for raw in result.rows]
        out[-1] = (out[-1][0], out[-1][1], tail)
        return out, shape

    @staticmethod
    def _encode_py(td: br.TableDef, shape: Any, row: Sequence[Any]) -> tuple[int | bytes, bytes]:
        """The Python path (the reference): pymysql values -> decoder values ->
        (event key, fastavro payload)."""
        values = chunks.to_binlog_values(td, row)
        payload: bytes = shape.version.schema.encode(shape.row(values))
        return shape.key(values, 0), payload
