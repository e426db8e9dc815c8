"""The database side of the PostgreSQL source's incremental (signal) snapshots.

The snapshot itself is every server source's: :mod:`databus.sources.common.incremental`
(the DBLog watermark method, notifications, progress records), with the same
signal-table contract (:mod:`databus.sources.common.signals`) (``id``, ``type``, ``data`` JSON; default
``databus.signals``, here schema ``databus``, table ``signals``), the same
chunk windows and the same watermark semantics: each chunk is selected between
a low and a high watermark row inserted into the signal table; the stream
meets both in commit order; every row the stream shows changing between them
is dropped from the chunk, and the rest go out as ``r`` events in the window
of the high watermark's commit. A consumer applying events in order ends with
the table's state.

This module gives the coordinator what it needs from PostgreSQL
(:class:`PgChunks`): the signal table (created when allowed), watermark rows,
the captured tables, and key-ordered chunks. A chunk is one ``SELECT`` in its
own (autocommit, READ COMMITTED) statement, seeking on the key with a row
comparison ``(k1, k2) > (...)`` (an index range scan, never ``OFFSET``), up to
the table's maximum key when it started. Key values are carried as their text
and cast back to the column's type (exact: every type's output reads back as
the same value). Row values are the server's text of them (the output
functions pgoutput uses, same session settings), encoded by the table version
the stream uses, so snapshot rows and streamed rows have the same schema and
keys.

For the signal and watermark rows to reach the stream, the signal table must
be in the source's publication (:func:`signal_table_ready`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from databus.core.errors import ConfigError, SchemaError, StatementError
from databus.sources.common.incremental import ChunkReader
from databus.sources.common.names import split_name
from databus.sources.postgres import checks
from databus.sources.postgres import pgoutput as po
from databus.sources.postgres.connection import SqlSession, quote_ident
from databus.sources.postgres.snapshot import relation_of
from databus.sources.postgres.types import TableVersion


def split(name: str) -> tuple[str, str]:
    return split_name(name, "schema.table")


def sql_name(name: str) -> str:
    schema, table = split(name)
    return f"{quote_ident(schema)}.{quote_ident(table)}"


def signal_table_ready(session: SqlSession, signal_table: str, publication: str, *,
                       create: bool) -> str | None:
    """None when the signal table exists and is in the publication (both made so when
    ``create``), else the statements to run to make it so."""
    schema, table = split(signal_table)
    name = sql_name(signal_table)
    add = f"ALTER PUBLICATION {quote_ident(publication)} ADD TABLE {name};"
    exists = bool(session.query("SELECT to_regclass(%s) IS NOT NULL", (name,))[0][0])
    if not exists:
        make = (f"CREATE SCHEMA IF NOT EXISTS {quote_ident(schema)}; CREATE TABLE {name}"
                " (id varchar(64) PRIMARY KEY, type varchar(32) NOT NULL, data text);")
        if not create:
            return f"{make} {add}"
        try:
            session.query(f"CREATE SCHEMA IF NOT EXISTS {quote_ident(schema)}")
            session.query(f"CREATE TABLE IF NOT EXISTS {name} (id varchar(64) PRIMARY KEY,"
                          " type varchar(32) NOT NULL, data text)")
        except (StatementError, ConfigError) as exc:
            return f"{make} {add} (creating it failed: {exc})"
    try:
        checks.ensure_publication(session, publication,
                                  [checks.TableFacts(schema, table, "d", True)], create=create)
    except (StatementError, ConfigError):
        return add
    return None


class PgChunks(ChunkReader):
    """Watermarks and chunks through one SQL session (see the module docstring).

    ``version_of(relation)`` gives the table version the stream uses for a table's
    shape; ``tables()`` lists what ``wanted`` selects now.
    """

    def __init__(self, session: SqlSession, signal_table: str, wanted: Callable[[str], bool],
                 version_of: Callable[[po.Relation], TableVersion]) -> None:
        self.session = session
        self.signal_table = signal_table
        self.wanted = wanted
        self.version_of = version_of

    def write_watermark(self, wid: str, kind: str, data: str) -> None:
        self.session.query(f"INSERT INTO {sql_name(self.signal_table)} (id, type, data)"
                           " VALUES (%s, %s, %s)", (wid, kind, data))

    def tables(self) -> list[str]:
        rows = self.session.query(
            "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n"
            " ON n.oid = c.relnamespace WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition"
            " AND n.nspname NOT IN ('pg_catalog', 'information_schema')"
            " AND n.nspname NOT LIKE 'pg\\_%%' ORDER BY 1, 2")
        names = [f"{r[0]}.{r[1]}" for r in rows]
        return [n for n in names if n != self.signal_table and self.wanted(n)]

    def _shape(self, table: str) -> tuple[TableVersion, list[str], list[str]]:
        """The table's version, its primary key columns and their types."""
        schema, name = split(table)
        rel = relation_of(self.session, checks.TableFacts(schema, name, "d", True))
        version = self.version_of(rel)
        pk = self.session.query(
            "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_index i"
            " JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)"
            " WHERE i.indrelid = %s::regclass AND i.indisprimary"
            " ORDER BY array_position(i.indkey, a.attnum)", (sql_name(table),))
        if not pk:
            raise SchemaError(f"{table} has no primary key: snapshots need one to match"
                              " streamed changes")
        return version, [str(r[0]) for r in pk], [str(r[1]) for r in pk]

    def _key_types(self, table: str, cols: Sequence[str]) -> list[str]:
        rows = self.session.query(
            "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a"
            " WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped",
            (sql_name(table),))
        types = {str(n): str(t) for n, t in rows}
        missing = [c for c in cols if c not in types]
        if missing:
            raise SchemaError(f"{table} has no column {missing[0]!r} (surrogate-key)")
        return [types[c] for c in cols]

    def max_key(self, table: str, key: Sequence[str] | None, condition: str | None
                ) -> tuple[list[Any] | None, list[str]]:
        _, pk, _ = self._shape(table)
        cols = list(key) if key else pk
        # aliased: ORDER BY a bare name would sort the text output column of that name
        texts = ", ".join(f"{quote_ident(c)}::text AS databus_k{i}" for i, c in enumerate(cols))
        rows = self.session.query(
            f"SELECT {texts} FROM {sql_name(table)}"
            + (f" WHERE ({condition})" if condition else "")
            + f" ORDER BY {', '.join(f'{quote_ident(c)} DESC' for c in cols)} LIMIT 1")
        return (list(rows[0]) if rows else None), cols

    def read_chunk(self, table: str, key: Sequence[str], after: Sequence[Any] | None,
                   max_key: Sequence[Any] | None, limit: int, condition: str | None
                   ) -> tuple[list[tuple[int | bytes, Any, Any]], Any]:
        """(event key, Avro payload, chunk-key texts) per row, and the table version."""
        version, pk, pk_types = self._shape(table)
        cols = list(key) if key else pk
        types = pk_types if not key else self._key_types(table, cols)
        names = version.schema.column_names
        values = ", ".join(f"CASE WHEN {quote_ident(n)} IS NULL THEN NULL"
                           f" ELSE concat({quote_ident(n)}) END AS databus_v{i}"
                           for i, n in enumerate(names))
        row = "(" + ", ".join(quote_ident(c) for c in cols) + ")"
        typed = "(" + ", ".join(f"%s::{t}" for t in types) + ")"
        where, params = [], []
        if after is not None:
            where.append(f"{row} > {typed}")
            params += list(after)
        if max_key is not None:
            where.append(f"{row} <= {typed}")
            params += list(max_key)
        if condition:  # % is psycopg2's placeholder mark: the condition's are literal
            where.append(f"({condition.replace('%', '%%')})")
        # aliased: ORDER BY a bare name would sort the text output column of that name
        keys = ", ".join(f"{quote_ident(c)}::text AS databus_k{i}" for i, c in enumerate(cols))
        sql = (f"SELECT {values}, {keys} FROM {sql_name(table)}"
               + (f" WHERE {' AND '.join(where)}" if where else "")
               + f" ORDER BY {', '.join(quote_ident(c) for c in cols)} LIMIT {int(limit)}")
        rows = self.session.query(sql, tuple(params))
        n = len(names)
        out: list[tuple[int | bytes, Any, Any]] = []
        for i, r in enumerate(rows):
            typed_values = version.values(list(r[:n]))
            out.append((version.key(typed_values, i), version.encode(typed_values),
                        list(r[n:])))
        return out, version
