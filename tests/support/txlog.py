"""Helpers for tests of the SQLite txlog source against real database files: make a
database, commit as the application does, open a streaming source, read everything
it has, and decode windows into (table, op, key, before, after)."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

from databus.core import event as ev
from databus.core.window import Window
from databus.sources.txlog import SqliteSource
from tests.support.sources import sqlite_source

Change = tuple[str, str, Any, Any, Any]
"""(table, op letter, key, before, after) of one event, decoded."""


def make_db(path: Path, *ddl: str) -> Path:
    """A new database file with the tables of ``ddl``."""
    with closing(sqlite3.connect(path)) as con:
        for stmt in ddl:
            con.execute(stmt)
        con.commit()
    return path


def commit(path: Path, *stmts: tuple[str, tuple[Any, ...]] | str) -> None:
    """Run the statements in one committed transaction of a new connection."""
    with closing(sqlite3.connect(path, isolation_level=None, timeout=30)) as con:
        con.execute("BEGIN IMMEDIATE")
        for s in stmts:
            sql, args = (s, ()) if isinstance(s, str) else s
            con.execute(sql, args)
        con.execute("COMMIT")


@contextmanager
def stream_source(path: Path, tables: list[str], **kw: Any) -> Iterator[SqliteSource]:
    """An opened source, ``snapshot_mode: no_data`` unless given (``kw``: the
    arguments of :func:`~tests.support.sources.sqlite_source`)."""
    kw.setdefault("snapshot_mode", "no_data")
    with sqlite_source(path, tables, **kw) as src:
        yield src


def read_all(src: SqliteSource, after: int = -1, timeout: float = 0.0) -> list[Window]:
    """Every window after ``after``, until a read returns nothing."""
    out: list[Window] = []
    while True:
        got = src.read(out[-1].scn if out else after, threading.Event(), timeout)
        if not got:
            return out
        out.extend(got)


def changes(src: SqliteSource, windows: list[Window]) -> list[Change]:
    """Every event of ``windows``, decoded (checking its SCN and metadata)."""
    reg = src.registry()
    names = {s.id: s.name.split(".", 1)[1] for s in src.sources()}
    out: list[Change] = []
    for w in windows:
        for i, e in enumerate(ev.iter_events(w.events)):
            assert e.scn == w.scn
            schema = reg.get(e.schema_id)
            assert (schema.src_id, schema.version) == (e.src_id, e.schema_version)
            row = schema.decode(e.payload)
            assert e.metadata is not None
            meta = reg.metadata.decode(e.metadata)
            assert meta["row"] == i and meta["txid"] == f"sqlite:{w.scn}"
            before = schema.decode(meta["before"]) if meta["before"] is not None else None
            key = json.loads(e.key) if isinstance(e.key, bytes) else e.key
            if e.op == ev.Op.DELETE:
                out.append((names[e.src_id], "d", key, row, None))
            else:
                out.append((names[e.src_id], e.op.letter, key, before, row))
    return out
