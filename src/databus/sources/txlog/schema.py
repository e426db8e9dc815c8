"""What ``databus`` installs in a SQLite database: txlog, registry tables, triggers.

Per captured table, three AFTER triggers (insert, update, delete) append one
row per changed row to ``_databus_txlog``:

=========  =================================================================
column     meaning
=========  =================================================================
scn        INTEGER PRIMARY KEY AUTOINCREMENT: commit order (see sqlite.py)
src        the table's source id (``_databus_sources.id``, never reused)
ver        the table version the images were written with
op         1 insert, 2 update, 3 delete
ts         commit-ish time, ms since the epoch (when the row was written)
rid        the rowid (the key of a table without a primary key)
old, new   JSON arrays of the column values, in column order
=========  =================================================================

Values are exact: integers and text as JSON, reals as ``{"r": "%!.17g"}``
(SQLite's JSON would round them to 15 digits), blobs as ``{"b": hex}``.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass

DDL = [
    """CREATE TABLE IF NOT EXISTS _databus_txlog (
        scn INTEGER PRIMARY KEY AUTOINCREMENT, src INTEGER NOT NULL, ver INTEGER NOT NULL,
        op INTEGER NOT NULL, ts INTEGER NOT NULL, rid INTEGER, old TEXT, new TEXT)""",
    """CREATE TABLE IF NOT EXISTS _databus_sources (
        id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL UNIQUE,
        version INTEGER NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS _databus_versions (
        src INTEGER NOT NULL, version INTEGER NOT NULL, columns TEXT NOT NULL,
        keys TEXT NOT NULL, PRIMARY KEY (src, version))""",
    """CREATE TABLE IF NOT EXISTS _databus_relays (
        name TEXT PRIMARY KEY, acked_scn INTEGER NOT NULL, updated_at REAL NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS _databus_meta (k TEXT PRIMARY KEY, v INTEGER NOT NULL)""",
]
INTERNAL_PREFIX = "_databus_"
OP_CODES = {"INSERT": 1, "UPDATE": 2, "DELETE": 3}


@dataclass(frozen=True)
class ColumnInfo:
    name: str
    decl_type: str
    not_null: bool
    pk: int  # position in the primary key, 0 = not part of it


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def table_columns(con: sqlite3.Connection, table: str) -> list[ColumnInfo]:
    rows = con.execute(f"PRAGMA table_xinfo({quote_ident(table)})").fetchall()
    # hidden = 0 normal, 2/3 generated columns (captured too, their values are real)
    return [ColumnInfo(r[1], r[2] or "", bool(r[3]), int(r[5])) for r in rows if r[6] != 1]


def columns_json(cols: list[ColumnInfo]) -> str:
    return json.dumps([[c.name, c.decl_type, c.not_null, c.pk] for c in cols])


def columns_from_json(text: str) -> list[ColumnInfo]:
    return [ColumnInfo(n, t, bool(nn), int(pk)) for n, t, nn, pk in json.loads(text)]


def _value_expr(ref: str) -> str:
    return (f"CASE typeof({ref}) WHEN 'real' THEN json_object('r', printf('%!.17g', {ref}))"
            f" WHEN 'blob' THEN json_object('b', hex({ref})) ELSE {ref} END")


def _image(prefix: str, cols: list[ColumnInfo]) -> str:
    return "json_array(" + ", ".join(
        _value_expr(f"{prefix}.{quote_ident(c.name)}") for c in cols) + ")"


def trigger_sql(table: str, src: int, version: int, cols: list[ColumnInfo]) -> list[str]:
    """DROP + CREATE statements of the three capture triggers of ``table``."""
    t = quote_ident(table)
    ts = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)"
    out = []
    for event, code in OP_CODES.items():
        name = quote_ident(f"{INTERNAL_PREFIX}{table}_{event.lower()}")
        old = _image("OLD", cols) if event != "INSERT" else "NULL"
        new = _image("NEW", cols) if event != "DELETE" else "NULL"
        rid = "OLD.rowid" if event == "DELETE" else "NEW.rowid"
        out.append(f"DROP TRIGGER IF EXISTS {name}")
        out.append(
            f"CREATE TRIGGER {name} AFTER {event} ON {t} BEGIN "
            f"INSERT INTO _databus_txlog (src, ver, op, ts, rid, old, new) VALUES "
            f"({src}, {version}, {code}, {ts}, {rid}, {old}, {new}); END"
        )
    return out


def drop_trigger_sql(table: str) -> list[str]:
    return [f"DROP TRIGGER IF EXISTS {quote_ident(f'{INTERNAL_PREFIX}{table}_{e.lower()}')}"
            for e in OP_CODES]
