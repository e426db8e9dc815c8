"""Snapshots of captured SQLite tables in chunks, interleaved with the stream.

Used by :class:`~databus.sources.txlog.sqlite.SqliteSource` for the snapshot
modes (``initial``, ``initial_only``, ``when_needed``, ``always``; see
docs/snapshots.md). The method, and why it is exact:

**One read transaction per chunk window.** SQLite in WAL mode gives a reader a
commit-consistent snapshot of the whole database. In ONE read transaction the
source takes (1) the txlog rows above its position up to the highest txlog SCN
``T`` visible, and (2) the next chunk of the table being snapshotted: up to
``snapshot_chunk_size`` rows after the last key sent, by a seek on the key
(``WHERE (k1, k2) > (?, ?) ORDER BY k1, k2 LIMIT n``; never ``OFFSET``). It
emits ONE window at SCN ``T``: first the stream events, then the chunk's rows
as ``r`` events (op READ, the snapshot attribute). Every transaction that
committed before the read transaction began has its txlog rows at or below
``T`` (the triggers write them inside it), every later one above ``T``. So
the chunk's rows are the table's state as of exactly ``T``: applied after the
stream events of the same window and before those of later windows, an ``r``
event never overwrites a newer change and never misses an older one. No
watermark matching and no de-duplication are needed, unlike the binlog method
(:mod:`databus.sources.common.incremental`), because SQLite lets a reader see
the txlog and the table at the same instant. Readers never block the writer
in WAL mode, so the application keeps writing while chunks are read.

Why every row ends right: a row a consumer should hold at the end either was
at its key position when that position's chunk was read at ``T`` (it gets an
``r`` event with its state at ``T``, later changes stream after it), or got
there after ``T`` (an insert or a key update, streamed after ``T``). A row
deleted before its chunk was read only has its delete streamed (a no-op for a
consumer that never held it).

**A fresh SCN for every chunk window.** A window's SCN must be above the
previous one. When no txlog row was committed since the last window, the
source first inserts a *marker* row into the txlog (source id 0, which no
table has; every reader skips it like rows of tables it does not capture; it
is trimmed like any row), in its own short write transaction, and reads again.

**Keys.** Tables with a declared primary key (single, composite, ``WITHOUT
ROWID``) are chunked by that key, in the key columns' own order and
collation; tables without one by rowid (which is also their event key).

**Progress** (:class:`SnapshotState`: tables still to do, last key sent) is
recorded with the SCN of every chunk window in the relay's state directory
(:class:`~databus.sources.common.progress.ProgressRecords`, written atomically before
the window is handed to the relay), so a relay restarted after SCN ``S``
resumes after the last chunk whose window it holds.

**Columns** left out by ``include_columns``/``exclude_columns`` are selected as
NULL and not encoded: their values are never read by a snapshot.

**Schema changes.** A chunk is always read and encoded with the table's
current version (the source re-installs capture before reading when the
table's columns changed), so rows sent after an ``ALTER TABLE`` carry the new
version; rows sent before keep the version they were sent with until they
change again. When a table's key columns change (a table re-created with
another primary key) its snapshot restarts from its first row; a table dropped
during its snapshot is skipped.
"""

from __future__ import annotations

import logging
import sqlite3
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from databus.sources.txlog import catalog as cat
from databus.sources.txlog.rows import VersionCodec

log = logging.getLogger("databus.sources.sqlite")

MARKER_SRC = 0
"""Source id of marker rows in the txlog (table source ids start at 1)."""

_ROWID = "<rowid>"  # key_cols of a rowid-keyed table


@dataclass
class SnapshotState:
    """A running snapshot: JSON-serialisable, recorded with chunk window SCNs."""

    id: str
    tables: list[int]  # source ids still to snapshot, the current one first
    last_key: list[Any] | None = None  # of the current table; None = from its first row
    key_cols: list[str] | None = None  # the key last_key is a value of
    fresh: bool = False  # no chunk window yet: the first one skips the txlog backlog
    chunks: int = 0
    rows: int = 0
    done_tables: list[int] = field(default_factory=list)

    @staticmethod
    def start(tables: list[int], *, fresh: bool) -> SnapshotState:
        return SnapshotState(uuid.uuid4().hex, list(tables), fresh=fresh)

    @staticmethod
    def restore(state: dict[str, Any] | None) -> SnapshotState | None:
        return SnapshotState(**state) if state else None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def chunk_query(tv: cat.TableVersion, after: list[Any] | None, limit: int | None,
                keep: Sequence[bool] | None = None) -> tuple[str, list[Any]]:
    """``SELECT rowid-or-NULL, columns...`` of the rows after key ``after``, in key order.

    The first column is the rowid for a rowid-keyed table (its event key),
    NULL otherwise; then the image in column order. A column whose ``keep`` flag is
    false (include/exclude_columns) is selected as NULL: its values are never read.
    """
    names = ", ".join(cat.quote(c.name) if keep is None or keep[i] else "NULL"
                      for i, c in enumerate(tv.columns))
    if tv.keys:
        head, keys = "NULL", [cat.quote(k) for k in tv.keys]
    else:
        head = cat._rowid_name(tv.columns)
        keys = [head]
    sql = f"SELECT {head}, {names} FROM {cat.quote(tv.table)}"
    params: list[Any] = []
    if after is not None:
        sql += f" WHERE ({', '.join(keys)}) > ({', '.join('?' for _ in keys)})"
        params += after
    sql += f" ORDER BY {', '.join(keys)}"
    if limit is not None:
        sql += " LIMIT ?"
        params.append(limit)
    return sql, params


def key_columns(tv: cat.TableVersion) -> list[str]:
    return list(tv.keys) or [_ROWID]


def read_chunks(con: sqlite3.Connection, state: SnapshotState, latest: dict[int, VersionCodec],
                missing: set[int], chunk_size: int, *, scn: int, timestamp_ns: int
                ) -> tuple[SnapshotState, list[bytes]]:
    """Up to ``chunk_size`` rows (in ``con``'s open read transaction) as ``r``
    events at ``scn``, and the state after them (``state`` is not changed).

    A table that ends within the budget is finished and the next one started
    in the same read. ``latest``: the current version of each source;
    ``missing``: sources whose table no longer exists (skipped).
    """
    s = SnapshotState(**{**asdict(state), "tables": list(state.tables),
                         "done_tables": list(state.done_tables)})
    s.fresh = False
    s.chunks += 1
    parts: list[bytes] = []
    budget = chunk_size
    while s.tables and budget > 0:
        src = s.tables[0]
        codec = latest.get(src)
        if codec is None or src in missing:
            _table_done(s, src, "gone")
            continue
        tv = codec.tv
        keys = key_columns(tv)
        if s.key_cols != keys:  # a new table, or its key changed: from its first row
            if s.key_cols is not None:
                log.warning("snapshot %s: key of %s changed; snapshotting it again from the"
                            " start", s.id, tv.table)
            s.last_key, s.key_cols = None, keys
        sql, params = chunk_query(tv, s.last_key, budget, codec.keep_mask())
        rows = con.execute(sql, params).fetchall()
        names = [c.name for c in tv.columns]
        for r in rows:
            image = r[1:]
            parts.append(codec.read_event(image, r[0], scn=scn, timestamp_ns=timestamp_ns)[1])
        if rows:
            last = rows[-1]
            s.last_key = ([last[0]] if not tv.keys
                          else [last[1 + names.index(k)] for k in tv.keys])
        budget -= len(rows)
        s.rows += len(rows)
        if budget > 0:  # fewer rows than asked: the table has no more
            _table_done(s, src, "done")
    return s, parts


def _table_done(s: SnapshotState, src: int, how: str) -> None:
    s.tables.pop(0)
    s.done_tables.append(src)
    s.last_key = s.key_cols = None
    log.info("snapshot %s: table %d %s (%d rows so far)", s.id, src, how, s.rows)
