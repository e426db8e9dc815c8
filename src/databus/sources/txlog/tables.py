"""The tables one SQLite source captures, as it reads them: their versions, the codecs
that turn their txlog rows into events, and keeping capture current when they change.

Contract (the **Schema changes**, **Columns** and **Events** parts of :mod:`.sqlite`):

* Versions are read from ``_databus_versions`` (:func:`~.catalog.load_versions`) as
  they appear; each gets a codec with the column filters applied
  (:class:`~.rows.VersionCodec`) and its schema joins the registry, and through
  :class:`~.history.SchemaHistory` the recorded history.
* :meth:`Captured.check` runs inside every read transaction that found new data: when
  ``PRAGMA schema_version`` moved and a captured table's columns or capture triggers
  no longer match the newest version (``ALTER TABLE``, a dropped and re-created
  table), capture is re-installed in one write transaction that also logs again, as
  ``r`` events of the new version, the rows written since the last read that found
  every table as installed (:func:`~.catalog.refresh_rows`); the read is then
  abandoned with :class:`Retry` and polled again. Capture that still differs after two
  re-installs in a row, or was uninstalled or re-installed from scratch under the
  source (another epoch), is a :class:`~databus.core.errors.TerminalError`.
* :meth:`Captured.window` encodes txlog rows (the source's own) into one window.

Threading: used under the source's read lock; :meth:`Captured.reinstall` takes its
write lock.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from databus.core import event as ev
from databus.core.errors import ConfigError, TerminalError
from databus.core.schema import MetadataCodec, SchemaRegistry
from databus.core.window import Window
from databus.sources.base import SourceInfo
from databus.sources.columns import ColumnFilter
from databus.sources.txlog import catalog as cat
from databus.sources.txlog._db import begin_immediate, rollback_quietly, translated
from databus.sources.txlog.history import SchemaHistory
from databus.sources.txlog.rows import VersionCodec, WindowMetadata, keep_of

log = logging.getLogger("databus.sources.sqlite")

_OPS = {cat.OP_INSERT: ev.Op.INSERT, cat.OP_UPDATE: ev.Op.UPDATE, cat.OP_DELETE: ev.Op.DELETE,
        cat.OP_READ: ev.Op.READ}


class Retry(Exception):
    """Internal: capture was re-installed; poll again."""


class Captured:
    """The captured tables of one opened source (module docstring)."""

    def __init__(self, path: Path, infos: Sequence[SourceInfo], columns: ColumnFilter,
                 history: SchemaHistory, *, busy_timeout: float) -> None:
        self.path = path
        self.own = frozenset(i.id for i in infos)
        self.tables = {i.id: i.name.split(".", 1)[1] for i in infos}  # src -> table
        self.columns = columns
        self.history = history
        self.busy_timeout = busy_timeout
        self.meta = MetadataCodec()
        self.registry = SchemaRegistry()
        self.codecs: dict[tuple[int, int], VersionCodec] = {}
        self.latest: dict[int, VersionCodec] = {}
        self.missing: set[str] = set()  # captured tables that no longer exist
        self.width = 0  # txlog v* columns read: twice the widest own version
        self.epoch: int | None = None
        # the txlog's top in a read that found every captured table as installed:
        # rows up to it were logged before any later ALTER TABLE (refresh_rows)
        self.clean_upto = -1
        self._versions_seen = 0
        self._schema_version: int | None = None
        self._reinstalls = 0  # consecutive re-installs that did not make capture current

    def start(self, con: sqlite3.Connection) -> None:
        """At open: the installation's epoch, the versions, the column filters checked,
        and the schemas of earlier runs (other column filters) served too."""
        self.epoch = cat.epoch(con)
        self.load_versions(con)
        self._check_column_filters()
        self.registry = self.history.start(self.registry, self.own)

    def load_versions(self, con: sqlite3.Connection) -> None:
        newest = con.execute("SELECT max(rowid) FROM _databus_versions").fetchone()[0] or 0
        if newest <= self._versions_seen:
            return
        for tv in cat.load_versions(con, self._versions_seen):
            if tv.src not in self.own or (tv.src, tv.version) in self.codecs:
                continue
            # include/exclude_columns apply to every version, those of later ALTERs too
            codec = VersionCodec(tv, keep_of(self.columns, tv))
            self.codecs[(tv.src, tv.version)] = codec
            self.registry.add(codec.schema)
            if tv.src not in self.latest or tv.version > self.latest[tv.src].tv.version:
                self.latest[tv.src] = codec
            self.width = max(self.width, 2 * codec.width)
        self._versions_seen = int(newest)
        self.history.record(self.registry)  # a no-op until start() started it

    def _check_column_filters(self) -> None:
        """Warn about an include/exclude_columns regex that matches no column of the
        captured tables: it is applied, to columns added later too, but most likely
        misspelt."""
        if not self.columns:
            return
        names = [f"{t}.{col.name}" for c in self.latest.values() for col in c.tv.columns
                 for t in (c.tv.name, c.tv.table)]
        for pattern in self.columns.unmatched(names):
            log.warning("column regex %r matches no column of the captured tables (columns"
                        " are named table.column or main.table.column)", pattern)

    # -- schema changes ----------------------------------------------------------

    def check(self, con: sqlite3.Connection, writer: sqlite3.Connection,
              write_lock: threading.Lock) -> None:
        """In an open read transaction: re-install capture (and raise :class:`Retry`) when
        a captured table changed; load new versions."""
        sv = int(con.execute("PRAGMA schema_version").fetchone()[0])
        if sv != self._schema_version:
            self._check_epoch(con)
            if self._capture_stale(con):
                if self._reinstalls >= 2:
                    raise TerminalError(f"{self.path}: capture still differs from the tables"
                                        " after re-installing it")
                rollback_quietly(con)
                self.reinstall(writer, write_lock)
                self._reinstalls += 1
                raise Retry
            self._schema_version = sv
            self._reinstalls = 0
        top = con.execute("SELECT max(scn) FROM _databus_txlog").fetchone()[0]
        self.clean_upto = max(self.clean_upto, -1 if top is None else int(top))
        self.load_versions(con)

    def _check_epoch(self, con: sqlite3.Connection) -> None:
        now = cat.epoch(con)
        if now == self.epoch:
            return
        if now is None:
            raise TerminalError(f"{self.path}: capture was uninstalled under this source")
        raise TerminalError(f"{self.path}: capture was re-installed from scratch under this"
                            " source (new source ids and SCNs); restart the relay")

    def _capture_stale(self, con: sqlite3.Connection) -> bool:
        """Whether a captured table's columns or capture triggers changed since install."""
        self.load_versions(con)
        for src, table in self.tables.items():
            cols = cat.table_columns(con, table)
            if not cols:
                if table not in self.missing:
                    log.warning("captured table %s no longer exists in %s", table, self.path)
                    self.missing.add(table)
                continue
            self.missing.discard(table)
            latest = self.latest.get(src)
            if latest is None or tuple(cols) != latest.tv.columns:
                return True
            prefix = f"{cat.PREFIX}{src}_"
            n = con.execute("SELECT count(*) FROM sqlite_master WHERE type = 'trigger'"
                            " AND tbl_name = ? AND substr(name, 1, ?) = ?",
                            (table, len(prefix), prefix)).fetchone()[0]
            if n != 4:
                return True
        return False

    def reinstall(self, con: sqlite3.Connection, write_lock: threading.Lock) -> None:
        """Install capture again on the tables that exist, logging again the rows written
        since :attr:`clean_upto` (module docstring)."""
        tables = [t for t in self.tables.values() if t not in self.missing]
        log.info("schema of %s changed: re-installing capture of %s", self.path, tables)
        with write_lock, translated("re-installing capture"):
            if tables:
                begin_immediate(con, busy_timeout=self.busy_timeout)
                try:
                    before = dict(con.execute("SELECT id, version FROM _databus_sources"))
                    for table in tables:
                        if not con.execute("SELECT 1 FROM sqlite_master WHERE type = 'trigger'"
                                           " AND tbl_name = ? AND substr(name, 1, ?) = ?",
                                           (table, len(cat.PREFIX), cat.PREFIX)).fetchone():
                            log.warning(
                                "%s: capture triggers of %s were gone (table dropped and"
                                " re-created?): writes to it since then were not logged;"
                                " restart the relay with snapshot_mode: always to send its"
                                " rows as they are", self.path, table)
                    infos = cat.install_on(con, tables)
                    changed = [i for i in infos if self.tables.get(i.id) is None]
                    if changed:  # a table re-created under another name cannot happen
                        raise ConfigError(f"capture re-install gave new sources {changed}")
                    after = dict(con.execute("SELECT id, version FROM _databus_sources"))
                    for info in infos:
                        if before.get(info.id) != after[info.id]:
                            cat.refresh_rows(con, info.id, self.clean_upto)
                    con.execute("COMMIT")
                except BaseException:
                    rollback_quietly(con)
                    raise
        self._schema_version = None

    # -- rows ----------------------------------------------------------------------

    def own_rows(self, con: sqlite3.Connection, start: int, top: int,
                 limit: int = -1) -> list[tuple[Any, ...]]:
        """Txlog rows of the captured tables with ``start < scn <= top``, the first
        ``limit`` (-1: all)."""
        slots = "".join(f", v{i}" for i in range(self.width))
        own = ",".join(str(i) for i in sorted(self.own))
        rows = con.execute(
            f"SELECT scn, src, ver, op, ts, rid{slots} FROM _databus_txlog"
            f" WHERE scn > ? AND scn <= ? AND src IN ({own}) ORDER BY scn LIMIT ?",
            (start, top, limit)).fetchall()
        return rows

    def window(self, top: int, top_ts: int, rows: list[tuple[Any, ...]]) -> Window:
        """Own txlog rows (:meth:`own_rows`) as the window at ``top``."""
        meta = WindowMetadata(self.meta, f"sqlite:{top}")
        meta_id = self.meta.id
        parts: list[bytes] = []
        for index, r in enumerate(rows):
            codec = self.codecs.get((r[1], r[2]))
            if codec is None:
                raise TerminalError(f"{self.path}: txlog row {r[0]} names unknown version"
                                    f" {r[2]} of source {r[1]}")
            n = codec.width
            image = r[6 : 6 + n]
            op = r[3]
            before = codec.encode(r[6 + n : 6 + 2 * n]) if op == cat.OP_UPDATE else None
            parts.append(ev.encode(
                scn=top, src_id=r[1], key=codec.key(image, r[5]), payload=codec.encode(image),
                schema_id=codec.schema.id, schema_version=r[2], op=_OPS[op],
                timestamp_ns=r[4] * 1_000_000, metadata=meta.encode(before, index),
                metadata_schema_id=meta_id,
                # a row read again by refresh_rows: read from the table, not the log
                extra_attributes=ev.ATTR_SNAPSHOT if op == cat.OP_READ else 0))
        return Window(top, b"".join(parts), len(parts), top_ts * 1_000_000)
