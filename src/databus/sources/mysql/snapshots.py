"""The database side of incremental snapshots: signal table, watermarks, chunks
(see :mod:`.incremental`); progress records are :mod:`databus.sources.progress`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from databus.core.errors import SchemaError, StatementError
from databus.sources.mysql import chunks
from databus.sources.mysql import rows as br
from databus.sources.mysql.connection import SqlSession
from databus.sources.mysql.incremental import ChunkReader
from databus.sources.progress import ProgressRecords

__all__ = ["ProgressRecords", "SnapshotIO", "split"]

_SYSTEM = ("mysql", "information_schema", "performance_schema", "sys")


def split(name: str) -> tuple[str, str]:
    db, _, table = name.partition(".")
    if not db or not table:
        raise SchemaError(f"table names are db.table, got {name!r}")
    return db, table


class SnapshotIO(ChunkReader):
    """Chunks and watermarks through one SQL session.

    ``shape_of(td)`` gives the table version that encodes a table's rows (the
    source's, so that snapshot rows and streamed rows share schema and keys);
    it returns an object with ``key(values, index)``.
    """

    def __init__(self, session: SqlSession, signal_table: str, wanted: Callable[[str], bool],
                 shape_of: Callable[[br.TableDef], Any]) -> None:
        self.session = session
        self.signal_table = signal_table
        self.wanted = wanted
        self.shape_of = shape_of

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

    def _table(self, table: str) -> tuple[br.TableDef, Any]:
        db, name = split(table)
        cols = self.session.query(chunks.COLUMNS_SQL, (db, name))
        key = [str(r[0]) for r in self.session.query(chunks.KEY_SQL, (db, name))]
        td = chunks.table_def(db, name, cols, key)
        if not td.primary_key:
            raise SchemaError(f"{table} has no primary key: snapshots need one to match"
                              " streamed changes")
        return td, self.shape_of(td)

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
                   ) -> tuple[list[tuple[int | bytes, list[Any], list[Any]]], Any]:
        td, shape = self._table(table)
        cols = list(key) if key else [td.names[i] for i in td.primary_key]
        sql, params = chunks.chunk_query(td, cols, after, max_key, limit, condition)
        idx = [td.names.index(c) for c in cols]
        out = []
        for row in self.session.query(sql, params):
            values = chunks.to_binlog_values(td, row)
            out.append((shape.key(values, 0), values, [row[i] for i in idx]))
        return out, shape
