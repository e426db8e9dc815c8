"""The initial snapshot of the PostgreSQL source: the captured tables' rows as of the
slot's consistent point, read through the snapshot the slot exported.

When a relay starts fresh (no position) with ``snapshot_mode`` initial,
initial_only or when_needed, the slot is created on a replication connection
that exports its snapshot; a read-only REPEATABLE READ transaction imports it,
so it sees exactly the transactions committed before the slot's consistent
point C, and the stream sends exactly those committed after. Snapshot and
stream meet at C: no gap, no duplicate.

Rows go out as ``r`` events (snapshot attribute set) in chunk windows of
``snapshot_chunk_size`` rows. The rows are counted first (in the same
snapshot), so the number of chunks N is known and chunk i (from 0) gets SCN
``C - N + 1 + i``: increasing, the last one C, every stream window after it.
Tables are read in name order, each chunk from one table; values are the
server's text of them (the same output functions as pgoutput's), encoded with
the same table version the stream's Relation message gives.

A snapshot cannot be resumed (the exported snapshot ends with its
transaction): the range of its SCNs is recorded in the source's state before
its first window, and a relay that restarts inside it is refused with
:class:`~databus.core.errors.SourcePositionLostError`, saying how to start over.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

from databus.core import event as ev
from databus.core.errors import SchemaError
from databus.core.window import Window
from databus.sources.postgres import pgoutput as po
from databus.sources.postgres.checks import TableFacts
from databus.sources.postgres.connection import SnapshotSession, SqlSession, quote_ident
from databus.sources.postgres.types import TableVersion


def relation_of(session: SnapshotSession | SqlSession, table: TableFacts) -> po.Relation:
    """The table as a pgoutput Relation message would describe it (columns, types,
    replica identity flags), read from the catalog in the snapshot."""
    rows = session.query(
        "SELECT c.oid, c.relreplident::text, a.attname, a.atttypid, a.atttypmod,"
        " CASE c.relreplident WHEN 'f' THEN true"
        "   WHEN 'd' THEN a.attnum = ANY(coalesce((SELECT i.indkey::int2[] FROM pg_index i"
        "     WHERE i.indrelid = c.oid AND i.indisprimary), '{}'))"
        "   WHEN 'i' THEN a.attnum = ANY(coalesce((SELECT i.indkey::int2[] FROM pg_index i"
        "     WHERE i.indrelid = c.oid AND i.indisreplident), '{}'))"
        "   ELSE false END"
        " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped"
        " WHERE n.nspname = %s AND c.relname = %s ORDER BY a.attnum",
        (table.schema, table.name))
    if not rows:
        raise SchemaError(f"table {table.full_name} does not exist")
    cols = tuple(po.Column(po.KEY_FLAG if key else 0, str(name), int(oid), int(mod))
                 for _, _, name, oid, mod, key in rows)
    return po.Relation(int(rows[0][0]), table.schema, table.name, str(rows[0][1]), cols)


class InitialSnapshot:
    """The chunk windows of one snapshot, produced one at a time (:meth:`next_window`)."""

    def __init__(self, session: SnapshotSession, consistent_lsn: int, tables: list[TableFacts],
                 version_of: Callable[[po.Relation], TableVersion], chunk_size: int,
                 timestamp_ns: int) -> None:
        self.session = session
        self.lsn = consistent_lsn
        self.chunk_size = chunk_size
        self.ts_ns = timestamp_ns
        self.plan: list[tuple[TableFacts, TableVersion, int]] = []
        for t in sorted(tables, key=lambda t: (t.schema, t.name)):
            version = version_of(relation_of(session, t))
            (count,) = session.query(f"SELECT count(*) FROM {t.sql_name}")[0]
            self.plan.append((t, version, int(count)))
        self.chunks = sum(math.ceil(n / chunk_size) for _, _, n in self.plan)
        self.first_scn = consistent_lsn - self.chunks + 1
        self.rows = 0
        self._next = self.first_scn
        self._batches = self._all_batches()

    def _all_batches(self) -> Iterator[tuple[TableVersion, list[tuple[object, ...]]]]:
        for t, version, count in self.plan:
            if not count:
                continue
            names = version.schema.column_names
            select = ", ".join(f"CASE WHEN {quote_ident(n)} IS NULL THEN NULL"
                               f" ELSE concat({quote_ident(n)}) END" for n in names)
            for rows in self.session.batches(f"SELECT {select} FROM {t.sql_name}",
                                             self.chunk_size):
                yield version, rows

    def next_window(self) -> Window | None:
        """The next chunk window, or None when every row was sent."""
        got = next(self._batches, None)
        if got is None:
            return None
        version, rows = got
        scn = self._next
        if scn > self.lsn:
            raise AssertionError("a table grew inside its snapshot")  # one snapshot: never
        self._next += 1
        s = version.schema
        parts = []
        for i, texts in enumerate(rows):
            values = version.values(list(texts))
            parts.append(ev.encode(scn=scn, src_id=s.src_id, key=version.key(values, i),
                                   payload=version.encode(values), schema_id=s.id,
                                   schema_version=s.version, op=ev.Op.READ,
                                   timestamp_ns=self.ts_ns, extra_attributes=ev.ATTR_SNAPSHOT))
        self.rows += len(parts)
        return Window(scn, b"".join(parts), len(parts), self.ts_ns)

    def close(self) -> None:
        self.session.close()
