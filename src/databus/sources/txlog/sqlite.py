"""SQLite capture through triggers and a txlog table (the embedded default).

Design (the seeds' "Databus for Oracle", adapted to SQLite): triggers append
every changed row to ``_databus_txlog`` inside the application's own
transaction (see :mod:`databus.sources.txlog.schema`), so a change is in the
txlog exactly when its transaction committed. The reader takes, in one read of
a WAL snapshot, every txlog row above the last SCN; those rows are whole
committed transactions, because SQLite has a single writer that holds its lock
from its first write to its commit: txlog SCNs grow in commit order and a
snapshot never shows part of a transaction.

Windows: SQLite does not tell transactions apart, so one window = everything
committed since the previous read (one or more whole transactions). Its SCN is
the highest txlog SCN in it. ``read(after_scn=S)`` returns exactly the rows
with SCN > S; ``S = -1`` means from the oldest row still in the txlog.

Trimming: ``acknowledge(S)`` records this relay's position in
``_databus_relays`` and deletes txlog rows at or below the lowest position of
all registered relays. Reading from a trimmed position raises
:class:`SourcePositionLostError`.

Types: each column's Avro type follows its declared type's affinity (INTEGER
-> long, REAL -> double, TEXT -> string, BLOB or none -> bytes, NUMERIC -> long),
as the first branch of a union that also admits the other storage classes,
because SQLite lets any column hold any value. Nothing is ever coerced.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from databus.core import event as ev
from databus.core.errors import (
    ConfigError,
    SchemaError,
    SourcePositionLostError,
    SourceUnavailableError,
)
from databus.core.schema import ColumnSpec, MetadataCodec, SchemaRegistry, TableSchema, table_schema
from databus.sources.base import Source, SourceInfo, Window
from databus.sources.txlog import schema as txs

_STORAGE = ["long", "double", "string", "bytes"]
_OPS = {1: ev.Op.INSERT, 2: ev.Op.UPDATE, 3: ev.Op.DELETE}


def affinity_type(decl: str) -> str:
    """The Avro type of SQLite's column affinity rules (section 3.1 of its docs)."""
    d = decl.upper()
    if "INT" in d:
        return "long"
    if any(s in d for s in ("CHAR", "CLOB", "TEXT")):
        return "string"
    if d == "" or "BLOB" in d:
        return "bytes"
    if any(s in d for s in ("REAL", "FLOA", "DOUB")):
        return "double"
    return "long"  # NUMERIC affinity: integers, reals and text all occur


def _avro_type(col: txs.ColumnInfo) -> list[str]:
    first = affinity_type(col.decl_type)
    return [first, *[t for t in _STORAGE if t != first]]


def _connect(path: Path) -> sqlite3.Connection:
    con = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
    con.execute("PRAGMA busy_timeout=30000")
    return con


def install(path: Path | str, tables: list[str]) -> None:
    """Install or update capture of ``tables`` (idempotent; switches the file to WAL)."""
    con = _connect(Path(path))
    try:
        _install(con, tables)
    except sqlite3.Error as exc:
        raise SourceUnavailableError(f"cannot install capture in {path}: {exc}") from exc
    finally:
        con.close()


def uninstall(path: Path | str) -> None:
    """Remove every databus trigger and table from the database."""
    con = _connect(Path(path))
    try:
        con.execute("BEGIN IMMEDIATE")
        names = [r[0] for r in con.execute("SELECT name FROM _databus_sources")]
        for name in names:
            for stmt in txs.drop_trigger_sql(name.split(".", 1)[1]):
                con.execute(stmt)
        for t in ("txlog", "sources", "versions", "relays", "meta"):
            con.execute(f"DROP TABLE IF EXISTS _databus_{t}")
        con.execute("COMMIT")
    finally:
        con.close()


def _install(con: sqlite3.Connection, tables: list[str]) -> None:
    if not tables:
        raise ConfigError("no tables to capture")
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("BEGIN IMMEDIATE")
    try:
        for stmt in txs.DDL:
            con.execute(stmt)
        for table in tables:
            if table.startswith(txs.INTERNAL_PREFIX):
                raise ConfigError(f"{table} is databus's own table")
            cols = txs.table_columns(con, table)
            if not cols:
                raise ConfigError(f"table {table!r} does not exist in the database")
            name = f"main.{table}"
            row = con.execute("SELECT id, version FROM _databus_sources WHERE name=?",
                              (name,)).fetchone()
            if row is None:
                src = con.execute("INSERT INTO _databus_sources (name, version) VALUES (?, 0)",
                                  (name,)).lastrowid
                assert src is not None
                version = 0
            else:
                src, version = row
            current = txs.columns_json(cols)
            latest = con.execute("SELECT columns FROM _databus_versions WHERE src=? AND"
                                 " version=?", (src, version)).fetchone()
            if latest is None or latest[0] != current:
                version += 1
                keys = json.dumps([c.name for c in sorted(cols, key=lambda c: c.pk) if c.pk])
                con.execute("INSERT INTO _databus_versions VALUES (?,?,?,?)",
                            (src, version, current, keys))
                con.execute("UPDATE _databus_sources SET version=? WHERE id=?", (version, src))
            for stmt in txs.trigger_sql(table, src, version, cols):
                con.execute(stmt)
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


class _Version:
    """Decoding of one table version: columns, Avro schema, key extraction."""

    def __init__(self, src: int, name: str, version: int, cols: list[txs.ColumnInfo],
                 keys: list[str]) -> None:
        self.src = src
        self.cols = cols
        specs = [ColumnSpec(c.name, _avro_type(c), nullable=True, sql_type=c.decl_type)
                 for c in cols]
        table = name.split(".", 1)[1]
        self.schema = TableSchema(src, name, version, table_schema("main", table, specs),
                                  tuple(keys))
        self.fields = [f["name"] for f in self.schema.avro["fields"]]
        names = [c.name for c in cols]
        self.key_idx = [names.index(k) for k in keys]

    def row(self, values: list[Any]) -> dict[str, Any]:
        return dict(zip(self.fields, (_value(v) for v in values), strict=True))

    def key(self, values: list[Any], rowid: int) -> int | bytes:
        if not self.key_idx:
            return rowid
        kv = [_value(values[i]) for i in self.key_idx]
        if len(kv) == 1 and isinstance(kv[0], int):
            return kv[0]
        return json.dumps([v.hex() if isinstance(v, bytes) else v for v in kv],
                          separators=(",", ":")).encode()


def _value(v: Any) -> Any:
    if isinstance(v, dict):
        if "r" in v:
            return float(v["r"])
        if "b" in v:
            return bytes.fromhex(v["b"])
    return v


class SqliteSource(Source):
    """Captures ``tables`` of the SQLite database at ``path``. See the module docstring."""

    def __init__(self, path: Path | str, tables: list[str], *, poll_interval: float = 0.05,
                 relay_name: str = "relay") -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise ConfigError(f"SQLite database {self.path} does not exist")
        self.tables = list(tables)
        self.poll_interval = poll_interval
        self.relay_name = relay_name
        install(self.path, self.tables)
        self._lock = threading.Lock()
        self._con = _connect(self.path)
        self._meta = MetadataCodec()
        self._versions: dict[tuple[int, int], _Version] = {}
        self._registry = SchemaRegistry()
        self._infos: list[SourceInfo] = []
        self._empty_at: tuple[int, int] | None = None
        self._guard(self._load_versions)
        wanted = {f"main.{t}" for t in self.tables}
        self._infos = [i for i in self._infos if i.name in wanted]

    def _guard(self, fn: Any, *args: Any) -> Any:
        try:
            with self._lock:
                return fn(*args)
        except sqlite3.OperationalError as exc:
            raise SourceUnavailableError(f"SQLite {self.path}: {exc}") from exc
        except sqlite3.Error as exc:
            raise SchemaError(f"SQLite {self.path}: {exc}") from exc

    def _load_versions(self) -> None:
        names = dict(self._con.execute("SELECT id, name FROM _databus_sources").fetchall())
        for src, version, cols, keys in self._con.execute(
                "SELECT src, version, columns, keys FROM _databus_versions ORDER BY src, version"):
            if (src, version) not in self._versions:
                v = _Version(src, names[src], version, txs.columns_from_json(cols),
                             json.loads(keys))
                self._versions[(src, version)] = v
                self._registry.add(v.schema)
        self._infos = sorted((SourceInfo(i, n) for i, n in names.items()), key=lambda s: s.id)

    def sources(self) -> list[SourceInfo]:
        return list(self._infos)

    def registry(self) -> SchemaRegistry:
        return self._registry

    def read(self, after_scn: int, stop: threading.Event, timeout: float) -> list[Window]:
        deadline = time.monotonic() + timeout
        while True:
            window = self._guard(self._read_once, after_scn)
            if window is not None:
                return [window]
            remaining = deadline - time.monotonic()
            if remaining <= 0 or stop.wait(min(self.poll_interval, remaining)):
                return []

    def _read_once(self, after_scn: int) -> Window | None:
        con = self._con
        dv = con.execute("PRAGMA data_version").fetchone()[0]
        if (dv, after_scn) == self._empty_at:
            return None  # nothing committed by anyone since the last empty read
        con.execute("BEGIN")
        try:
            trimmed = con.execute("SELECT v FROM _databus_meta WHERE k='trimmed_scn'").fetchone()
            if after_scn >= 0 and trimmed is not None and after_scn < trimmed[0]:
                raise SourcePositionLostError(
                    f"scn {after_scn} was trimmed from {self.path}'s txlog (kept: after"
                    f" {trimmed[0]}); consumers behind it must bootstrap")
            rows = con.execute("SELECT scn, src, ver, op, ts, rid, old, new FROM _databus_txlog"
                               " WHERE scn > ? ORDER BY scn", (after_scn,)).fetchall()
        finally:
            con.execute("COMMIT")
        if not rows:
            self._empty_at = (dv, after_scn)
            return None
        return self._window(rows)

    def _window(self, rows: list[tuple[Any, ...]]) -> Window:
        scn = rows[-1][0]
        txid = f"sqlite:{rows[0][0]}-{scn}"
        parts: list[bytes] = []
        ts_ms = 0
        for index, (_scn, src, ver, op, ts, rid, old, new) in enumerate(rows):
            v = self._versions.get((src, ver))
            if v is None:
                self._load_versions()
                v = self._versions[(src, ver)]
            ts_ms = max(ts_ms, ts)
            old_vals = json.loads(old) if old is not None else None
            new_vals = json.loads(new) if new is not None else None
            image = new_vals if new_vals is not None else old_vals
            assert image is not None
            meta: dict[str, Any] = {"txid": txid, "row": index}
            if op == 2 and old_vals is not None:
                meta["before"] = v.schema.encode(v.row(old_vals))
            parts.append(ev.encode(
                scn=scn, src_id=src, key=v.key(image, rid), payload=v.schema.encode(v.row(image)),
                schema_id=v.schema.id, schema_version=ver, op=_OPS[op],
                timestamp_ns=ts * 1_000_000, metadata=self._meta.encode(meta),
                metadata_schema_id=self._meta.id,
            ))
        return Window(scn, b"".join(parts), len(parts), ts_ms * 1_000_000)

    def acknowledge(self, scn: int) -> None:
        self._guard(self._acknowledge, scn)

    def _acknowledge(self, scn: int) -> None:
        con = self._con
        con.execute("BEGIN IMMEDIATE")
        try:
            con.execute("INSERT INTO _databus_relays VALUES (?,?,?) ON CONFLICT(name) DO UPDATE"
                        " SET acked_scn=excluded.acked_scn, updated_at=excluded.updated_at",
                        (self.relay_name, scn, time.time()))
            low = con.execute("SELECT min(acked_scn) FROM _databus_relays").fetchone()[0]
            con.execute("DELETE FROM _databus_txlog WHERE scn <= ?", (low,))
            con.execute("INSERT INTO _databus_meta VALUES ('trimmed_scn', ?) ON CONFLICT(k)"
                        " DO UPDATE SET v=max(v, excluded.v)", (low,))
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise

    def close(self) -> None:
        with self._lock:
            self._con.close()
