"""What databus installs in a SQLite database, and installing/removing it.

Tables (all named ``_databus_*``; format 2, recorded in ``_databus_meta``):

``_databus_txlog``
    One row per changed row, written by the capture triggers inside the
    application's own transaction::

        scn   INTEGER PRIMARY KEY AUTOINCREMENT  -- the SCN (never reused)
        src   source id (_databus_sources.id)
        ver   table version the row was written with (_databus_versions)
        op    1 insert, 2 update, 3 delete
        ts    time the trigger ran: ms since the epoch, from julianday('now')
        rid   the rowid, for tables keyed by rowid (no declared primary key)
        v0 .. v(K-1)   the image, one value per column, in column order

    The ``v*`` columns are declared without a type, so SQLite applies no
    affinity and stores every value exactly as the trigger saw it (integer,
    8-byte real, text, blob, NULL). An insert or update puts the after image in
    ``v0..v(n-1)``, a delete the before image; an update adds the before image
    in ``v(n)..v(2n-1)`` (n = the version's column count). Install adds ``v*``
    columns as wider tables need them (``ALTER TABLE ADD COLUMN``).

``_databus_sources(id, name, version, columns)``
    One row per captured table: a stable id (AUTOINCREMENT: never reused,
    kept across re-installs), ``main.<table>``, its latest version and that
    version's columns (JSON).

``_databus_versions(src, version, columns, keys, created_at)``
    Every version of every table: columns as JSON ``[[name, declared type,
    notnull, pk position, hidden], ...]`` and key columns (JSON list, empty =
    keyed by rowid). Txlog rows decode with the version they name.

``_databus_relays(name, acked_scn, updated_at)``
    The position each relay acknowledged; the txlog is trimmed below the lowest.

``_databus_cuts(scn)``
    Window boundaries shared by every relay capturing the database with
    ``window_cuts: shared``: each row is the SCN of a txlog row that ended a
    window (see :mod:`databus.sources.txlog.sqlite`). Trimmed with the txlog.

``_databus_meta(k, v)``
    ``format`` (2), ``epoch`` (random id of this installation: a source notices
    capture removed or installed afresh under it) and ``trimmed_scn`` (highest
    SCN ever deleted by trimming).

Triggers, per captured table with source id S (names ``_databus_S_*``):

* ``_ins`` AFTER INSERT, ``_del`` AFTER DELETE: one txlog row;
* ``_upd`` AFTER UPDATE WHEN the key is unchanged: one update row;
* ``_updkey`` AFTER UPDATE WHEN the key changed (a primary-key column, or the
  rowid of a rowid-keyed table): a delete row with the old image and key, then
  an insert row with the new one, so key-based consumers never keep a row
  under a stale key.
"""

from __future__ import annotations

import json
import logging
import secrets
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from databus.core.errors import ConfigError
from databus.sources.base import SourceInfo
from databus.sources.txlog._db import connect, rollback_quietly, translated

log = logging.getLogger("databus.sources.sqlite")

FORMAT = 2
PREFIX = "_databus_"
OP_INSERT, OP_UPDATE, OP_DELETE = 1, 2, 3
OP_READ = 4  # a row's current image, logged by refresh_rows (a snapshot read, "r")
TXLOG_FIXED = ("scn", "src", "ver", "op", "ts", "rid")
_TS = "CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)"
_ROWID_NAMES = ("rowid", "_rowid_", "oid")
_INSTALL_BUSY_TIMEOUT = 10.0

DDL = (
    "CREATE TABLE IF NOT EXISTS _databus_meta (k TEXT PRIMARY KEY, v INTEGER NOT NULL)",
    """CREATE TABLE IF NOT EXISTS _databus_sources (
        id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL UNIQUE,
        version INTEGER NOT NULL, columns TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS _databus_versions (
        src INTEGER NOT NULL, version INTEGER NOT NULL, columns TEXT NOT NULL,
        keys TEXT NOT NULL, created_at REAL NOT NULL, PRIMARY KEY (src, version))""",
    """CREATE TABLE IF NOT EXISTS _databus_relays (
        name TEXT PRIMARY KEY, acked_scn INTEGER NOT NULL, updated_at REAL NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS _databus_txlog (
        scn INTEGER PRIMARY KEY AUTOINCREMENT, src INTEGER NOT NULL, ver INTEGER NOT NULL,
        op INTEGER NOT NULL, ts INTEGER NOT NULL, rid INTEGER)""",
    "CREATE TABLE IF NOT EXISTS _databus_cuts (scn INTEGER PRIMARY KEY)",
)
TABLES = ("txlog", "sources", "versions", "relays", "cuts", "meta")


@dataclass(frozen=True, slots=True)
class Column:
    """One column as ``PRAGMA table_xinfo`` describes it."""

    name: str
    decl_type: str
    not_null: bool
    pk: int  # position in the primary key (1-based), 0 = not part of it
    hidden: int  # 0 ordinary, 2 virtual generated, 3 stored generated

    def to_json(self) -> list[object]:
        return [self.name, self.decl_type, self.not_null, self.pk, self.hidden]


@dataclass(frozen=True, slots=True)
class TableVersion:
    """One version of one captured table, as recorded in ``_databus_versions``."""

    src: int
    name: str  # "main.<table>"
    version: int
    columns: tuple[Column, ...]
    keys: tuple[str, ...]  # primary key columns in key order; () = keyed by rowid

    @property
    def table(self) -> str:
        return self.name.split(".", 1)[1]


def quote(name: str) -> str:
    """An SQL identifier, quoted."""
    return '"' + name.replace('"', '""') + '"'


def columns_to_json(cols: list[Column] | tuple[Column, ...]) -> str:
    return json.dumps([c.to_json() for c in cols], separators=(",", ":"))


def columns_from_json(text: str) -> tuple[Column, ...]:
    return tuple(Column(str(n), str(t), bool(nn), int(pk), int(h))
                 for n, t, nn, pk, h in json.loads(text))


def load_versions(con: sqlite3.Connection, after: int = 0) -> list[TableVersion]:
    """Every recorded table version whose rowid in ``_databus_versions`` > ``after``."""
    rows = con.execute(
        "SELECT v.src, s.name, v.version, v.columns, v.keys FROM _databus_versions v"
        " JOIN _databus_sources s ON s.id = v.src WHERE v.rowid > ? ORDER BY v.rowid",
        (after,)).fetchall()
    return [TableVersion(src, name, ver, columns_from_json(cols), tuple(json.loads(keys)))
            for src, name, ver, cols, keys in rows]


def table_columns(con: sqlite3.Connection, table: str) -> list[Column]:
    """The capturable columns of ``table`` (hidden columns of virtual tables excluded)."""
    rows = con.execute(f"PRAGMA main.table_xinfo({quote(table)})").fetchall()
    return [Column(r[1], r[2] or "", bool(r[3]), int(r[5]), int(r[6])) for r in rows
            if r[6] != 1]


def canonical_table(con: sqlite3.Connection, table: str) -> str:
    """The table's name as the database spells it; ConfigError if it cannot be captured."""
    if table.lower().startswith(PREFIX):
        raise ConfigError(f"{table} is one of databus's own tables")
    row = con.execute("SELECT name, type, sql FROM main.sqlite_master WHERE name = ?"
                      " COLLATE NOCASE AND type IN ('table', 'view')", (table,)).fetchone()
    if row is None:
        raise ConfigError(f"table {table!r} does not exist in the database")
    name, kind, sql = row
    if kind != "table" or (sql or "").upper().startswith("CREATE VIRTUAL"):
        raise ConfigError(f"{name!r} is a {kind if kind != 'table' else 'virtual table'};"
                          " only ordinary tables can be captured")
    return str(name)


def _rowid_name(cols: list[Column] | tuple[Column, ...]) -> str:
    taken = {c.name.lower() for c in cols}
    for name in _ROWID_NAMES:
        if name not in taken:
            return name
    raise ConfigError("table has no primary key and columns named rowid, _rowid_ and oid;"
                      " its rows cannot be told apart")


def _trigger_sql(tv: TableVersion) -> dict[str, str]:
    """Name -> CREATE TRIGGER statement of the capture triggers of ``tv``."""
    t = quote(tv.table)
    n = len(tv.columns)
    names = [quote(c.name) for c in tv.columns]
    slots = ", ".join(f"v{i}" for i in range(2 * n))
    head = "INSERT INTO _databus_txlog (src, ver, op, ts, rid, "
    rowid = None if tv.keys else _rowid_name(tv.columns)

    def row(op: int, image: str, before: str | None = None) -> str:
        cols = slots if before is not None else ", ".join(f"v{i}" for i in range(n))
        vals = [f"{image}.{c}" for c in names]
        if before is not None:
            vals += [f"{before}.{c}" for c in names]
        rid = f"{image}.{rowid}" if rowid else "NULL"
        return (f"{head}{cols}) VALUES ({tv.src}, {tv.version}, {op}, {_TS}, {rid}, "
                f"{', '.join(vals)});")

    if rowid:
        changed = f"OLD.{rowid} <> NEW.{rowid}"
    else:
        changed = " OR ".join(
            f"OLD.{q} IS NOT NEW.{q} COLLATE BINARY OR typeof(OLD.{q}) <> typeof(NEW.{q})"
            for q in (quote(k) for k in tv.keys))
    base = f"{PREFIX}{tv.src}_"
    return {
        f"{base}ins": f"AFTER INSERT ON {t} BEGIN {row(OP_INSERT, 'NEW')} END",
        f"{base}del": f"AFTER DELETE ON {t} BEGIN {row(OP_DELETE, 'OLD')} END",
        f"{base}upd": f"AFTER UPDATE ON {t} WHEN NOT ({changed}) BEGIN"
                      f" {row(OP_UPDATE, 'NEW', 'OLD')} END",
        f"{base}updkey": f"AFTER UPDATE ON {t} WHEN {changed} BEGIN"
                         f" {row(OP_DELETE, 'OLD')} {row(OP_INSERT, 'NEW')} END",
    }


def _check_format(con: sqlite3.Connection) -> None:
    cols = {r[1] for r in con.execute("PRAGMA main.table_info(_databus_txlog)")}
    row = con.execute("SELECT v FROM _databus_meta WHERE k = 'format'").fetchone()
    if row is None and cols and "old" in cols:
        raise ConfigError("this database has capture installed by an older databus (txlog"
                          " with JSON images); run databus.sources.txlog.uninstall(path) first")
    if row is not None and row[0] != FORMAT:
        raise ConfigError(f"capture format {row[0]} installed; this databus writes {FORMAT}")
    con.execute("INSERT OR IGNORE INTO _databus_meta VALUES ('format', ?)", (FORMAT,))
    con.execute("INSERT OR IGNORE INTO _databus_meta VALUES ('epoch', ?)",
                (secrets.randbits(62),))


def epoch(con: sqlite3.Connection) -> int | None:
    """The random id of this installation (None when capture is not installed)."""
    if con.execute("SELECT 1 FROM main.sqlite_master WHERE type = 'table'"
                   " AND name = '_databus_meta'").fetchone() is None:
        return None
    row = con.execute("SELECT v FROM _databus_meta WHERE k = 'epoch'").fetchone()
    return None if row is None else int(row[0])


def _ensure_slots(con: sqlite3.Connection, table: str, needed: int) -> None:
    limit = con.getlimit(sqlite3.SQLITE_LIMIT_COLUMN)
    if needed + len(TXLOG_FIXED) > limit:
        raise ConfigError(f"{table} has {needed // 2} columns; the txlog holds at most"
                          f" {(limit - len(TXLOG_FIXED)) // 2} (SQLite's column limit {limit})")
    have = sum(1 for r in con.execute("PRAGMA main.table_info(_databus_txlog)")
               if r[1] not in TXLOG_FIXED)
    for i in range(have, needed):
        con.execute(f"ALTER TABLE _databus_txlog ADD COLUMN v{i}")


def _install_table(con: sqlite3.Connection, requested: str) -> SourceInfo:
    table = canonical_table(con, requested)
    cols = table_columns(con, table)
    name = f"main.{table}"
    current = columns_to_json(cols)
    row = con.execute("SELECT id, version, columns FROM _databus_sources WHERE name = ?",
                      (name,)).fetchone()
    if row is None:
        cur = con.execute("INSERT INTO _databus_sources (name, version, columns) VALUES (?,0,?)",
                          (name, current))
        src, version, latest = int(cur.lastrowid or 0), 0, None
    else:
        src, version, latest = int(row[0]), int(row[1]), row[2]
    keys = tuple(c.name for c in sorted((c for c in cols if c.pk), key=lambda c: c.pk))
    if latest != current:
        version += 1
        con.execute("INSERT INTO _databus_versions VALUES (?,?,?,?,?)",
                    (src, version, current, json.dumps(keys), time.time()))
        con.execute("UPDATE _databus_sources SET version = ?, columns = ? WHERE id = ?",
                    (version, current, src))
        log.info("capture of %s: version %d (%d columns)", name, version, len(cols))
    tv = TableVersion(src, name, version, tuple(cols), keys)
    _ensure_slots(con, table, 2 * len(cols))
    wanted = {n: f"CREATE TRIGGER {quote(n)} {body}" for n, body in _trigger_sql(tv).items()}
    have = dict(con.execute(
        "SELECT name, sql FROM main.sqlite_master WHERE type = 'trigger' AND tbl_name = ?"
        " AND substr(name, 1, ?) = ?", (table, len(PREFIX), PREFIX)).fetchall())
    for trig, sql in have.items():
        if wanted.get(trig) != sql:
            con.execute(f"DROP TRIGGER {quote(trig)}")
    for trig, sql in wanted.items():
        if have.get(trig) != sql:
            con.execute(sql)
    return SourceInfo(src, name)


def refresh_rows(con: sqlite3.Connection, src: int, after_scn: int) -> int:
    """Log the current image of rows an out-of-date capture logged; returns how many.

    To run in ``con``'s open write transaction, right after capture of source
    ``src`` was re-installed at a new version. Every row that the txlog holds
    above ``after_scn`` under an older version of ``src`` is read from the table
    now and logged again with op READ and the newest version (a row no longer
    there is not: its delete is in the txlog).

    Why: rows the application wrote between its ``ALTER TABLE ... ADD COLUMN``
    and the re-install were logged by the old triggers, without the new
    columns. Their events stay as they were logged (old version); the READ rows
    that follow them carry every column, so a consumer applying changes in
    order ends with the table's rows as they are. ``after_scn`` is a position up
    to which the caller knows every row was logged before the change (-1: none
    known, every older-version row of ``src`` in the txlog is read again).
    """
    versions = {tv.version: tv for tv in load_versions(con) if tv.src == src}
    new = versions[max(versions)]
    table = quote(new.table.removeprefix("main."))
    names = [quote(c.name) for c in new.columns]
    rowid = None if new.keys else _rowid_name(new.columns)
    match = (" AND ".join(f"{quote(k)} IS ?" for k in new.keys) if new.keys
             else f"{rowid} = ?")
    insert = (f"INSERT INTO _databus_txlog (src, ver, op, ts, rid, "
              f"{', '.join(f'v{i}' for i in range(len(names)))}) SELECT {src}, {new.version},"
              f" {OP_READ}, {_TS}, {rowid or 'NULL'}, {', '.join(names)} FROM main.{table}"
              f" WHERE {match}")
    seen: set[tuple[object, ...]] = set()
    logged = 0
    for version, tv in sorted(versions.items()):
        if version == new.version:
            continue
        old = [c.name for c in tv.columns]
        if new.keys:
            if any(k not in old for k in new.keys):
                raise ConfigError(f"{new.table}: its primary key {list(new.keys)} is not in"
                                  f" version {version}'s columns; re-snapshot the table")
            picks = ", ".join(f"v{old.index(k)}" for k in new.keys)
        else:
            picks = "rid"
        for key in con.execute(f"SELECT DISTINCT {picks} FROM _databus_txlog WHERE src = ?"
                               " AND ver = ? AND scn > ?", (src, version, after_scn)):
            if key not in seen:
                seen.add(key)
                logged += con.execute(insert, key).rowcount
    if logged:
        log.warning("capture of %s was out of date for some writes (ALTER TABLE before the"
                    " re-install): logged the current image of %d row(s) again", new.table,
                    logged)
    return logged


def _open(target: Path | str | sqlite3.Connection) -> tuple[sqlite3.Connection, bool]:
    if isinstance(target, sqlite3.Connection):
        return target, False
    return connect(Path(target), busy_timeout=_INSTALL_BUSY_TIMEOUT), True


def install_on(con: sqlite3.Connection, tables: list[str]) -> list[SourceInfo]:
    """Install or update capture of ``tables`` using ``con`` (see :func:`install`).

    Runs inside ``con``'s open transaction when it has one (the caller
    commits), else in its own ``BEGIN IMMEDIATE`` transaction.
    """
    if not tables:
        raise ConfigError("no tables to capture")
    own = not con.in_transaction
    with translated("installing capture"):
        if own:
            con.execute("BEGIN IMMEDIATE")
        try:
            for stmt in DDL:
                con.execute(stmt)
            _check_format(con)
            infos = [_install_table(con, t) for t in tables]
            if own:
                con.execute("COMMIT")
        except BaseException:
            if own:
                rollback_quietly(con)
            raise
    return infos


def install(target: Path | str | sqlite3.Connection, tables: list[str]) -> list[SourceInfo]:
    """Install or update capture of ``tables``; idempotent. Returns their sources.

    ``target`` is the database file, or an open connection: then the work joins
    that connection's open transaction, if any, so ``ALTER TABLE`` and the new
    capture version can commit together (no change is logged with a stale
    column list). Given a path, the database is switched to WAL mode (a
    persistent setting of the file) so the reader never blocks the
    application's writers.

    Per table: registers a stable source id (kept on re-install), a new table
    version when the columns changed since the last install, adds ``v*`` slots
    to the txlog as needed, and (re)creates the triggers only when their text
    changed (so an unchanged re-install does not touch the schema). Tables
    captured before and not named here stay captured. Raises ConfigError for
    a table that does not exist or cannot be captured.
    """
    con, own = _open(target)
    try:
        if own:
            with translated("switching to WAL"):
                mode = con.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                log.warning("could not switch %s to WAL (journal_mode=%s); capture works,"
                            " but reads briefly block writers", target, mode)
        return install_on(con, tables)
    finally:
        if own:
            con.close()


def uninstall(target: Path | str | sqlite3.Connection, tables: list[str] | None = None) -> None:
    """Remove capture.

    ``tables=None`` removes everything databus installed: triggers and
    ``_databus_*`` tables (source ids and SCNs then start afresh on the next
    install, so relays must start over). With a list, only the triggers of
    those tables are dropped; their source ids, versions and logged rows stay.
    """
    con, own = _open(target)
    try:
        with translated("uninstalling capture"):
            in_tx = con.in_transaction
            if not in_tx:
                con.execute("BEGIN IMMEDIATE")
            try:
                rows = con.execute(
                    "SELECT name, tbl_name FROM main.sqlite_master WHERE type = 'trigger'"
                    " AND substr(name, 1, ?) = ?", (len(PREFIX), PREFIX)).fetchall()
                wanted = None if tables is None else {t.lower() for t in tables}
                for trig, tbl in rows:
                    if wanted is None or str(tbl).lower() in wanted:
                        con.execute(f"DROP TRIGGER {quote(trig)}")
                if tables is None:
                    for t in TABLES:
                        con.execute(f"DROP TABLE IF EXISTS {PREFIX}{t}")
                if not in_tx:
                    con.execute("COMMIT")
            except BaseException:
                if not in_tx:
                    rollback_quietly(con)
                raise
    finally:
        if own:
            con.close()


def forget_relay(target: Path | str, name: str) -> None:
    """Delete a relay's registration, so it no longer holds back trimming."""
    con, _ = _open(target)
    try:
        with translated("forgetting a relay"):
            con.execute("DELETE FROM _databus_relays WHERE name = ?", (name,))
    finally:
        con.close()
