"""The DDL statements of mapped table versions: CREATE TABLE, ALTER TABLE, quoting.

The converter writes a DDL transaction when a table's schema version is new to the
binlog: :func:`create_table_sql` the first time the table appears, then
:func:`alter_table_sql` from the previous version's columns to the new ones (dropped,
modified and added columns in place, or only a new order). Names are quoted with
:func:`quote`, so any relay name is a valid identifier. Pure functions.
"""

from __future__ import annotations

from databus.binlog.types import MysqlColumn


def create_table_sql(db: str, table: str, cols: list[MysqlColumn],
                     key_columns: tuple[str, ...]) -> str:
    """The CREATE TABLE of a mapped table version."""
    parts = [f"{quote(c.name)} {c.definition}{'' if c.nullable else ' NOT NULL'}" for c in cols]
    names = {c.name for c in cols}
    if key_columns and all(k in names for k in key_columns):
        parts.append("PRIMARY KEY (" + ", ".join(quote(k) for k in key_columns) + ")")
    return f"CREATE TABLE IF NOT EXISTS {quote(db)}.{quote(table)} (" + ", ".join(parts) + ")"


def alter_table_sql(db: str, table: str, old: list[MysqlColumn],
                    new: list[MysqlColumn]) -> str | None:
    """An ALTER TABLE that turns the ``old`` columns into the ``new`` ones (dropped
    columns, modified definitions, added columns in place); None when equal."""
    old_by = {c.name: c for c in old}
    new_names = {c.name for c in new}
    clauses = [f"DROP COLUMN {quote(c.name)}" for c in old if c.name not in new_names]
    prev: str | None = None
    for c in new:
        d = f"{quote(c.name)} {c.definition}{'' if c.nullable else ' NOT NULL'}"
        where = f" AFTER {quote(prev)}" if prev else " FIRST"
        o = old_by.get(c.name)
        if o is None:
            clauses.append(f"ADD COLUMN {d}{where}")
        elif (o.definition, o.nullable) != (c.definition, c.nullable):
            clauses.append(f"MODIFY COLUMN {d}")
        prev = c.name
    if not clauses and [c.name for c in old] == [c.name for c in new]:
        return None
    if not clauses:  # only the order changed
        prev = None
        for c in new:
            d = f"{quote(c.name)} {c.definition}{'' if c.nullable else ' NOT NULL'}"
            clauses.append(f"MODIFY COLUMN {d}" + (f" AFTER {quote(prev)}" if prev else " FIRST"))
            prev = c.name
    return f"ALTER TABLE {quote(db)}.{quote(table)} " + ", ".join(clauses)


def quote(name: str) -> str:
    """A MySQL identifier in backquotes."""
    return "`" + name.replace("`", "``") + "`"
