"""Incremental snapshots by watermarks (DBLog), driven by signals.

A snapshot reads tables in primary-key chunks while the binlog keeps
streaming; nothing is locked. For each chunk the coordinator

1. writes a *low watermark* row to the signal table,
2. selects the chunk (:mod:`.chunks`) into a buffer keyed by event key,
3. writes a *high watermark* row.

The log reader (binlog, WAL) then meets both watermarks in the stream. Every row change
committed between them removes its key from the buffer (the stream carries a
state at least as new as the chunk's). When the high watermark's transaction
commits, the rest of the buffer becomes ``r`` events (marked snapshot) in a
window at that transaction's SCN. So a consumer that applies stream and ``r``
events in order ends with the source's state, whatever the writers did.

Progress (tables left, last key, maximum key) is recorded with the SCN of the
chunk window that finished it; a relay restarted after SCN ``S`` resumes from
the newest record at or before ``S``, i.e. after the last chunk it holds.

Signals are rows inserted into the signal table, seen in the log in commit order
(their contract: :mod:`.signals`).

Every step is announced as a notification (logical source :data:`NOTIFICATIONS`,
one event keyed by the snapshot id, :func:`notice_event`): STARTED, CHUNK_DONE,
TABLE_DONE, COMPLETED, ABORTED, PAUSED, RESUMED, and ERROR naming a bad signal; a
bad signal never stops streaming.

Every server source runs its snapshots the same way: :class:`Snapshots` holds the
coordinator, the progress records and the notices waiting for a window, and
:meth:`Snapshots.commit` is what a committed transaction of the log adds to its window
(chunk rows, notices) and records; the source gives the database side
(:class:`ChunkReader`) and how a chunk's rows become events.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from databus.core import event as ev
from databus.core.errors import DatabusError, InvalidRequestError
from databus.core.schema import ColumnSpec, TableSchema, table_schema
from databus.sources.common.names import source_id
from databus.sources.common.progress import ProgressRecords
from databus.sources.common.signals import (
    CLOSE,
    EXECUTE,
    MARKS,
    NOTIFY,
    OPEN,
    PAUSE,
    RESUME,
    STOP,
    Signal,
    matched_tables,
)

log = logging.getLogger("databus.sources")

Notice = dict[str, Any]

NOTIFICATIONS = "databus.notifications"
"""Logical source of snapshot notifications."""

NOTIFICATION_AVRO = table_schema("databus", "notifications", [
    ColumnSpec("kind", "string", nullable=False), ColumnSpec("snapshot", "string"),
    ColumnSpec("table", "string"), ColumnSpec("data", "string", nullable=False)])

NOTIFY_SCHEMA = TableSchema(source_id(NOTIFICATIONS), NOTIFICATIONS, 1, NOTIFICATION_AVRO,
                            ("snapshot",))
"""Its one version, the same in every source (listed from the start)."""


@dataclass
class Progress:
    """Where a snapshot is: JSON-serialisable, recorded with an SCN."""

    id: str
    tables: list[str]  # still to do, the current one first
    conditions: dict[str, str] = field(default_factory=dict)
    surrogate_key: str | None = None
    last_key: list[Any] | None = None  # of the current table; None = from the start
    max_key: list[Any] | None = None  # of the current table when it started
    paused: bool = False
    chunks: int = 0


@dataclass
class Chunk:
    """A chunk between its watermarks: rows by event key, waiting for the high one."""

    open_id: str
    close_id: str
    table: str
    rows: dict[int | bytes, Any]  # event key -> what the reader gave (an Avro payload)
    last_key: list[Any] | None
    complete: bool  # the table has no rows after this chunk
    shape: Any = None  # the table version that encodes the rows
    opened: bool = False  # the low watermark was seen in the binlog


class ChunkReader:
    """What the coordinator needs from the database (each source's own)."""

    def write_watermark(self, wid: str, kind: str, data: str) -> None:
        raise NotImplementedError

    def tables(self) -> list[str]:
        """Captured tables that exist now, ``db.table``."""
        raise NotImplementedError

    def read_chunk(self, table: str, key: Sequence[str], after: Sequence[Any] | None,
                   max_key: Sequence[Any] | None, limit: int, condition: str | None
                   ) -> tuple[list[tuple[int | bytes, Any, Any]], Any]:
        """((event key, binlog values, chunk-key values) per row, and the table
        version that encodes them)."""
        raise NotImplementedError

    def max_key(self, table: str, key: Sequence[str] | None, condition: str | None
                ) -> tuple[list[Any] | None, list[str]]:
        raise NotImplementedError


class Coordinator:
    """The snapshot state machine, driven by the source's capture thread."""

    def __init__(self, reader: ChunkReader, chunk_size: int,
                 wanted: Callable[[str], bool]) -> None:
        self.reader = reader
        self.chunk_size = chunk_size
        self.wanted = wanted
        self.progress: Progress | None = None
        self.chunk: Chunk | None = None

    # -- state ---------------------------------------------------------------------

    def restore(self, state: dict[str, Any] | None) -> None:
        self.progress = Progress(**state) if state else None
        self.chunk = None

    def state(self) -> dict[str, Any] | None:
        return asdict(self.progress) if self.progress else None

    @property
    def active(self) -> bool:
        return self.progress is not None

    # -- signals -------------------------------------------------------------------

    def start(self, tables: list[str], sid: str | None = None,
              conditions: dict[str, str] | None = None,
              surrogate_key: str | None = None) -> list[Notice]:
        if self.progress is not None:
            return [_notice("ERROR", sid, message=f"snapshot {self.progress.id} is running")]
        sid = sid or uuid.uuid4().hex
        if not tables:
            return [_notice("ERROR", sid, message="no captured table matches")]
        self.progress = Progress(sid, tables, conditions or {}, surrogate_key)
        self.chunk = None
        return [_notice("STARTED", sid, tables=tables)]

    def signal(self, sid: str, kind: str, data: str | None) -> list[Notice]:
        """A signal row committed in the binlog."""
        if kind in MARKS:
            return []
        try:
            payload = json.loads(data) if data else {}
            if not isinstance(payload, dict):
                raise ValueError("data must be a JSON object")
        except ValueError as exc:
            return [_notice("ERROR", sid, signal=kind, message=f"malformed data: {exc}")]
        if kind == EXECUTE:
            return self._execute(sid, payload)
        if kind not in (STOP, PAUSE, RESUME):
            return [_notice("ERROR", sid, signal=kind, message=f"unknown signal type {kind!r}")]
        if self.progress is None:
            return [_notice("ERROR", sid, signal=kind, message="no snapshot is running")]
        if kind == STOP:
            done = self.progress.id
            self.progress = None
            self.chunk = None
            return [_notice("ABORTED", done, signal=sid)]
        if kind == PAUSE:
            self.progress.paused = True
            return [_notice("PAUSED", self.progress.id, signal=sid)]
        self.progress.paused = False
        return [_notice("RESUMED", self.progress.id, signal=sid)]

    def _execute(self, sid: str, payload: dict[str, Any]) -> list[Notice]:
        try:
            tables = matched_tables(payload, self.reader.tables())
        except InvalidRequestError as exc:
            return [_notice("ERROR", sid, signal=EXECUTE, message=str(exc))]
        conditions: dict[str, str] = {}
        for c in payload.get("additional-conditions") or []:
            if not isinstance(c, dict) or "data-collection" not in c or "filter" not in c:
                return [_notice("ERROR", sid, signal=EXECUTE,
                                message="additional-conditions entries need data-collection"
                                        " and filter")]
            conditions[str(c["data-collection"])] = str(c["filter"])
        key = payload.get("surrogate-key")
        return self.start(tables, sid, conditions, str(key) if key else None)

    # -- chunks --------------------------------------------------------------------

    def wants_chunk(self) -> bool:
        return self.progress is not None and not self.progress.paused and self.chunk is None

    def open_chunk(self) -> list[Notice]:
        """Low watermark, SELECT, high watermark. Errors become notices."""
        p = self.progress
        assert p is not None
        table = p.tables[0]
        cond = p.conditions.get(table)
        try:
            if p.max_key is None and p.last_key is None:
                max_key, _ = self.reader.max_key(table, _key_cols(p), cond)
                if max_key is None:  # empty table (or nothing matches)
                    return self._table_done([])
                p.max_key = max_key
            open_id, close_id = uuid.uuid4().hex, uuid.uuid4().hex
            self.reader.write_watermark(open_id, OPEN, json.dumps({"snapshot": p.id}))
            rows, shape = self.reader.read_chunk(table, _key_cols(p) or [], p.last_key,
                                                 p.max_key, self.chunk_size, cond)
            self.reader.write_watermark(close_id, CLOSE, json.dumps({"snapshot": p.id}))
        except DatabusError as exc:
            failed = p.id
            self.progress = None
            # the database's own words stay in the relay's log: they may quote values or
            # names a consumer was not given; the stream only says what failed, by code
            log.error("snapshot %s of %s stopped: %s", failed, table, exc)
            return [_notice("ERROR", failed, table=table,
                            message=f"reading a chunk of {table} failed ({exc.code}); the"
                                    " snapshot stopped: see the relay's log"),
                    _notice("ABORTED", failed, table=table)]
        self.chunk = Chunk(open_id, close_id, table, {k: v for k, v, _ in rows},
                           rows[-1][2] if rows else p.last_key,
                           complete=len(rows) < self.chunk_size, shape=shape)
        return []

    def on_commit(self, signal_ids: Sequence[str], keys: Callable[[str], list[int | bytes]]
                  ) -> tuple[Chunk | None, list[Notice]]:
        """A transaction committed: ``signal_ids`` are its signal-table rows,
        ``keys(table)`` the event keys it changed in a table. Returns the chunk
        to emit now (its high watermark committed) and notices."""
        c = self.chunk
        if c is None:
            return None, []
        if c.opened:
            for k in keys(c.table):
                c.rows.pop(k, None)
        if c.open_id in signal_ids:
            c.opened = True
        if c.close_id not in signal_ids:
            return None, []
        self.chunk = None
        p = self.progress
        assert p is not None
        p.chunks += 1
        p.last_key = c.last_key
        notices = [_notice("CHUNK_DONE", p.id, table=c.table, rows=len(c.rows))]
        if c.complete:
            notices += self._table_done([])
        return c, notices

    def _table_done(self, notices: list[Notice]) -> list[Notice]:
        p = self.progress
        assert p is not None
        done = p.tables.pop(0)
        notices.append(_notice("TABLE_DONE", p.id, table=done))
        p.last_key = p.max_key = None
        if not p.tables:
            notices.append(_notice("COMPLETED", p.id, chunks=p.chunks))
            self.progress = None
        return notices


def _key_cols(p: Progress) -> list[str] | None:
    return [p.surrogate_key] if p.surrogate_key else None


NOTICE_KINDS = ("STARTED", "CHUNK_DONE", "TABLE_DONE", "COMPLETED", "ABORTED", "PAUSED",
                "RESUMED", "ERROR")


def _notice(kind: str, sid: str | None, **fields: Any) -> Notice:
    return {"kind": kind, "snapshot": sid, **fields}


def notice_event(schema: TableSchema, notice: dict[str, Any], scn: int, ts_ns: int) -> bytes:
    """The ``databus.notifications`` event of a snapshot ``notice`` (kind, snapshot id,
    table; the rest as JSON in ``data``), keyed by the snapshot id; logged too."""
    rest = {k: v for k, v in notice.items() if k not in ("kind", "snapshot", "table")}
    row = {"kind": notice["kind"], "snapshot": notice.get("snapshot"),
           "table": notice.get("table"), "data": json.dumps(rest, default=str)}
    log.info("snapshot %s: %s %s", row["snapshot"], row["kind"], row["data"])
    key = json.dumps([row["snapshot"]]).encode()
    return ev.encode(scn=scn, src_id=schema.src_id, key=key, payload=schema.encode(row),
                     schema_id=schema.id, schema_version=schema.version, op=ev.Op.INSERT,
                     timestamp_ns=ts_ns)


def event_keys(parts: Iterable[bytes], table: str) -> list[int | bytes]:
    """The event keys of ``table``'s rows among encoded events (a window's parts)."""
    src = source_id(table)
    out: list[int | bytes] = []
    for data in parts:
        off = 0
        while off < len(data):
            if ev.peek_src_id(data, off) == src:
                out.append(ev.peek_key(data, off))
            off += ev.peek_length(data, off)
    return out


def chunk_events(schema: TableSchema, rows: dict[int | bytes, Any], scn: int, ts_ns: int
                 ) -> bytes:
    """A chunk's rows (event key -> Avro payload of ``schema``) as ``r`` events, marked
    snapshot."""
    return b"".join(
        ev.encode(scn=scn, src_id=schema.src_id, key=key, payload=payload,
                  schema_id=schema.id, schema_version=schema.version, op=ev.Op.READ,
                  timestamp_ns=ts_ns, extra_attributes=ev.ATTR_SNAPSHOT)
        for key, payload in rows.items())


class Snapshots:
    """A running source's incremental snapshots (module docstring), made by its
    ``open()``: the :class:`Coordinator` over ``reader``, the progress ``records``, the
    notices waiting for the next window, and counters for the source's stats.

    ``encode(chunk, scn, ts_ns)`` gives a finished chunk's rows as events and their
    number (a source may have a faster encoder than :func:`chunk_events`). Driven by the
    capture thread; :meth:`stats` may be called from others."""

    def __init__(self, reader: ChunkReader, chunk_size: int, wanted: Callable[[str], bool],
                 records: ProgressRecords,
                 encode: Callable[[Chunk, int, int], tuple[bytes, int]]) -> None:
        self.coord = Coordinator(reader, chunk_size, wanted)
        self.reader = reader
        self.records = records
        self.encode = encode
        self.notices: list[Notice] = []
        # every key from the start: the relay's metrics thread copies the dict
        self.counters: dict[str, float] = dict.fromkeys(
            [f"snapshot_{k.lower()}_total" for k in NOTICE_KINDS] + ["snapshot_rows_total"],
            0.0)

    @property
    def active(self) -> bool:
        """A snapshot is running (paused or not)."""
        return self.coord.active

    @property
    def quiet(self) -> bool:
        """A commit without signals has nothing to add: no notice waits, no chunk is
        between its watermarks."""
        return not self.notices and self.coord.chunk is None

    def restore(self, after_scn: int) -> None:
        """A stream (re)starts after ``after_scn``: the snapshot as of that position (none
        on a fresh start); notices of windows never sent are dropped."""
        self.coord.restore(self.records.at(after_scn) if after_scn >= 0 else None)
        self.notices = []

    def start(self, tables: list[str]) -> None:
        """Start a snapshot of ``tables`` (a snapshot mode's own)."""
        self.notices += self.coord.start(tables)

    def step(self) -> None:
        """Open the next chunk when one is wanted (between transactions). Notices with no
        watermark to commit them (the snapshot ended, or failed) get a marker row, so a
        window carries them."""
        if not self.coord.wants_chunk():
            return
        self.notices += self.coord.open_chunk()
        if self.notices and self.coord.chunk is None:
            self.reader.write_watermark(uuid.uuid4().hex, NOTIFY, "{}")

    def commit(self, signals: Sequence[Signal], parts: list[bytes], scn: int, ts_ns: int,
               notify: TableSchema) -> int:
        """A transaction committed at ``scn`` with its ``signals`` (signal-table rows) and
        its events ``parts``: appends to ``parts`` the chunk it finished and the notices
        (events of ``notify``), records the snapshot's state when it changed; returns
        the number of events appended."""
        coord = self.coord
        notices, self.notices = self.notices, []
        marks = [sid for sid, kind, _ in signals if kind in MARKS]
        for sid, kind, text in signals:
            if kind not in MARKS:
                notices += coord.signal(sid, kind, text)
        events = list(parts)
        chunk, more = coord.on_commit(marks, lambda table: event_keys(events, table))
        notices += more
        added = 0
        if chunk is not None:
            data, n = self.encode(chunk, scn, ts_ns)
            parts.append(data)
            added += n
            self.counters["snapshot_rows_total"] += len(chunk.rows)
        for notice in notices:
            parts.append(notice_event(notify, notice, scn, ts_ns))
            added += 1
            self.counters[f"snapshot_{notice['kind'].lower()}_total"] += 1
        if chunk is not None or signals or notices:
            self.records.add(scn, coord.state())
        return added

    def acknowledge(self, scn: int) -> None:
        """The relay restarts at or after ``scn``: older progress records can go."""
        self.records.forget_before(scn)

    def stats(self) -> dict[str, float]:
        """The counters, and the running snapshot's state (the keys of :func:`idle_stats`)."""
        p = self.coord.progress
        return {**self.counters, "snapshot_running": float(p is not None),
                "snapshot_paused": float(bool(p and p.paused)),
                "snapshot_tables_left": float(len(p.tables) if p else 0)}


def idle_stats() -> dict[str, float]:
    """What :meth:`Snapshots.stats` gives with no snapshot ever run: every key, zero (a
    source's stats before its ``open()``)."""
    return dict.fromkeys([*(f"snapshot_{k.lower()}_total" for k in NOTICE_KINDS),
                          "snapshot_rows_total", "snapshot_running", "snapshot_paused",
                          "snapshot_tables_left"], 0.0)
