"""A consistent initial snapshot of captured SQLite tables, at a known SCN.

For tables that already had rows when capture started: :func:`read_snapshot`
installs capture (idempotent; a no-op when the relay already did), then opens
ONE read transaction in which it takes the highest SCN the txlog ever assigned
(``sqlite_sequence``) and reads every row of every table. In WAL mode that
transaction sees exactly the transactions committed before it began, and
every one of them has a txlog SCN at or below that one (triggers are in place),
while every later change gets a higher SCN. So the rows are the tables' state
as of SCN S, and the relay's windows after S carry everything since.

Rows come out as snapshot events (op READ, ATTR_SNAPSHOT, sequence S) encoded
exactly as the source encodes its change events (same Avro payload, key and
schema id, :meth:`VersionCodec.read_event`), in key order per table (rowid
order for tables without a primary key). Given the relay's column filter
(``columns``), columns it leaves out are neither read nor sent.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from databus.core.errors import TerminalError
from databus.core.schema import SchemaRegistry
from databus.sources.columns import ColumnFilter
from databus.sources.txlog import catalog as cat
from databus.sources.txlog._db import connect, rollback_quietly, translated
from databus.sources.txlog.rows import VersionCodec, keep_of
from databus.sources.txlog.snapshot import chunk_query
from databus.sources.txlog.sqlite import _text


@dataclass(frozen=True, slots=True)
class SnapshotEvent:
    src_id: int
    key: int | bytes
    data: bytes  # the encoded event


class InitialSnapshot:
    """An open read transaction over the captured tables; use as a context manager."""

    def __init__(self, path: Path | str, tables: list[str], *, busy_timeout: float = 30.0,
                 columns: ColumnFilter | None = None) -> None:
        """``columns``: the relay's include/exclude_columns, so the snapshot's rows and
        schemas are the relay's (columns left out are never read)."""
        self.path = Path(path)
        self._columns = columns or ColumnFilter()
        infos = cat.install(self.path, list(tables))
        self._con = connect(self.path, busy_timeout=busy_timeout)
        self._con.text_factory = _text
        try:
            with translated("starting the initial snapshot"):
                self._con.execute("BEGIN")
                seq = self._con.execute(
                    "SELECT seq FROM sqlite_sequence WHERE name = '_databus_txlog'").fetchone()
                self.scn = int(seq[0]) if seq is not None else 0
                latest: dict[int, cat.TableVersion] = {}
                own = {i.id for i in infos}
                for tv in cat.load_versions(self._con):
                    if tv.src in own and (tv.src not in latest
                                          or tv.version > latest[tv.src].version):
                        latest[tv.src] = tv
                self._versions = [latest[i.id] for i in sorted(infos, key=lambda i: i.id)]
                self._codecs = [VersionCodec(tv, keep_of(self._columns, tv))
                                for tv in self._versions]
                for tv in self._versions:
                    cols = tuple(cat.table_columns(self._con, tv.table))
                    if cols != tv.columns:
                        raise TerminalError(f"{self.path}: table {tv.table} changed since its "
                                            "capture was installed; start the relay first")
        except BaseException:
            self.close()
            raise

    def count(self) -> int:
        """Rows in all tables (for progress reports)."""
        with translated("counting rows"):
            return sum(int(self._con.execute(
                f"SELECT count(*) FROM {cat.quote(tv.table)}").fetchone()[0])
                for tv in self._versions)

    def registry(self) -> SchemaRegistry:
        """The schemas the snapshot's events are encoded with."""
        return SchemaRegistry(codec.schema for codec in self._codecs)

    def events(self) -> Iterator[SnapshotEvent]:
        """Every row as a snapshot event, table by table (source id order), in key order."""
        now = time.time_ns()
        for codec in self._codecs:
            tv = codec.tv
            sql, params = chunk_query(tv, None, None, codec.keep_mask())
            with translated(f"reading {tv.table}"):
                cur = self._con.execute(sql, params)
                while True:
                    rows = cur.fetchmany(5000)
                    if not rows:
                        break
                    for r in rows:
                        key, data = codec.read_event(r[1:], r[0], scn=self.scn,
                                                     timestamp_ns=now)
                        yield SnapshotEvent(tv.src, key, data)

    def close(self) -> None:
        rollback_quietly(self._con)
        self._con.close()

    def __enter__(self) -> InitialSnapshot:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
