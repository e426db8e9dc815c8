"""The converter: reads a relay like any client and appends its windows to the binlog.

:class:`BinlogConverter` is a :class:`~databus.client.Consumer` *and* the client's
:class:`~databus.client.CheckpointStore`: the binlog's position map is the checkpoint.
``load()`` returns "after the last window the map records", and the windows are written
to the files, fsynced and recorded (:meth:`databus.binlog.store.BinlogStore.append`) in
batches. So the relay position and the binlog can never disagree: after a crash the
client resumes after the map's SCN, and the store has cut its files back to the map (see
:mod:`databus.binlog.store`).

**Where a new binlog starts.** A data directory without a window starts at the relay's
*oldest* window (never its newest: what was committed before the service started is in
the binlog). Before that, the converter asks the relay whether it holds its source's
changes from the source's very beginning (a read after SCN 0, which a relay refuses with
ScnNotFound unless it can prove that). If it cannot (the relay started with a snapshot,
whose first windows carry every existing row as inserts; or at its source's end; or it
dropped older windows), the binlog still starts at the oldest window and the converter
logs a WARNING naming that window; with ``require_complete_history`` it refuses to start
instead (:class:`~databus.core.errors.ScnNotFoundError`). A relay that no longer holds
the binlog's end (the service was down longer than the relay's buffer) stops the
converter with ScnNotFoundError saying so: writing on would leave a gap. The client's
bootstrap path is not used (see docs/binlog-service.md).

**When windows become visible** (readers see only what the map records): a batch is
written when the client goes back to the relay after dispatching what one relay answer
held (detected as ``flush_delay`` seconds without a new window, by a flusher thread), when
``checkpoint_every`` windows are pending (a backlog: fsyncs stay batched), when the relay
is idle and when the client stops. The flusher and the client's own saves take one lock,
so windows are appended in order by one writer at a time. The schema versions announced
are recorded with each batch as of its last window, never ahead of what was written.
After a rollback the client replays windows from its own checkpoint, which may be behind
the map (the flusher wrote them): windows at or below the map's SCN are skipped (a relay
replays identical windows).

Per relay window, in commit order:

* for each table whose schema version is new to the binlog: a DDL transaction (GTID +
  Query) with ``CREATE TABLE IF NOT EXISTS`` the first time the table appears, else the
  ``ALTER TABLE`` that turns the previous version's columns into this one's
  (:func:`databus.binlog.ddl.alter_table_sql`); a truncate: ``TRUNCATE TABLE``;
* one row transaction: GTID, ``Query BEGIN``, for each statement (a run of one kind of
  change of one table) a Table_map and Write/Update/Delete rows v2 events (several when
  a run passes ~8 KiB, as MySQL splits them; the last has STMT_END_F, after which the
  next statement maps its table again, as MySQL does), ``Xid`` = the window's SCN. Inserts and
  snapshot reads are Write_rows; updates carry the before image (the relay's, which every
  SQLite and MySQL update has; an update without one is written with the after image as
  its before image), deletes the deleted row.

Database and table names come from the relay's ``db.table``; internal sources
(``databus.*``) are skipped. The schema versions already announced are kept in the
position map with the end, so a restart does not announce them again, with each
table's current definition (its Table_map body: what ``information_schema`` and ``SHOW
CREATE TABLE`` answer, as of the map's end, purged files or not).

Run it with :meth:`run` (blocking, stops when ``stop`` is set) on a thread of its own;
it owns the store's writer side and purges files older than ``retention`` seconds.
Relay client settings forced here: ``from_start`` (the oldest window), no
``bootstrap_url``, ``checkpoint_every_windows`` = ``checkpoint_every``.
Errors: a value that cannot be written exactly (:class:`~databus.core.errors.SchemaError`)
stops the converter (it is retried ``max_retries`` times by the client, then raised);
relay outages are retried forever.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from databus.binlog import events as ev
from databus.binlog.binfile import Transaction, Window
from databus.binlog.ddl import alter_table_sql, create_table_sql, quote
from databus.binlog.rowevents import row_image, rows_body_head, table_map_body
from databus.binlog.store import BinlogStore
from databus.binlog.types import MysqlColumn, mysql_columns
from databus.client.checkpoints import CheckpointStore
from databus.client.client import DatabusClient
from databus.client.config import ClientConfig
from databus.client.consumer import Consumer, DataBatch, Result
from databus.client.relay import RelayConnection
from databus.core.checkpoint import Checkpoint
from databus.core.errors import SchemaError, ScnNotFoundError
from databus.core.event import Op
from databus.core.mysqlwire import EventType
from databus.core.schema import INTERNAL_PREFIX, TableSchema

log = logging.getLogger("databus.binlog")

ROWS_EVENT_BYTES = 8192
"""Rows per rows event up to about this many bytes (MySQL's binlog-row-event-max-size)."""


@dataclass
class _Mapped:
    db: str
    table: str
    cols: list[MysqlColumn]
    schema: TableSchema
    table_id: int


class BinlogConverter(Consumer, CheckpointStore):
    """Relay -> binlog files (see the module docstring).

    ``client_config``: how to reach the relay (its ``sources`` = the tables to convert,
    empty = all); ``store``: the binlog (this is its only writer).
    """

    def __init__(self, client_config: ClientConfig, store: BinlogStore, *,
                 retention: float = 7 * 86400, checkpoint_every: int = 1000,
                 purge_interval: float = 60.0, flush_delay: float = 0.002,
                 require_complete_history: bool = False) -> None:
        super().__init__()
        self.config = client_config.model_copy(update={
            "checkpoint_every_windows": checkpoint_every, "from_start": True,
            "bootstrap_url": None})
        self.store = store
        self.retention = retention
        self.purge_interval = purge_interval
        self.flush_delay = flush_delay
        self.require_complete_history = require_complete_history
        self._mapped: dict[bytes, _Mapped] = {}
        self._table_ids: dict[bytes, int] = {}
        meta = store.writer_meta()
        # table name -> schema id (hex) of the version last announced in the binlog;
        # replaced, never changed in place: a pending window keeps the dict of its end
        self._announced: dict[str, str] = dict(meta.get("announced", {}))
        # table name -> hex Table_map body of that version: the catalog's definitions
        self._defs: dict[str, str] = dict(meta.get("tables", {}))
        # whole windows not yet written, each with the writer meta as of its end
        self._pending: list[tuple[Window, dict[str, Any]]] = []
        self._write = threading.Condition(threading.Lock())  # pending + the store's writes
        self._last_end = 0.0  # monotonic time of the last window end
        self._skip = False  # the window being dispatched is in the binlog already
        self._cur: list[Transaction] = []
        self._ddl: list[Transaction] = []
        self._rows: list[tuple[int, int, bytes]] = []
        self._ts_us = 0
        self._last_purge = 0.0
        self._probed = False
        self.client: DatabusClient | None = None

    # -- running ---------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Convert until ``stop`` is set (returns within one long poll), or raise a
        terminal error. Purges old files every ``purge_interval`` seconds."""
        self.client = DatabusClient(self.config, self, self)
        done = threading.Event()
        flusher = threading.Thread(target=self._flusher, args=(done,), name="binlog-flusher",
                                   daemon=True)
        flusher.start()
        try:
            self.client.run(stop)
        except ScnNotFoundError as exc:
            raise ScnNotFoundError(
                f"relay {self.config.relay.url} no longer holds the windows after scn "
                f"{self.store.last_scn()}, where this binlog ends ({exc}); converting on "
                "would leave a gap in the binlog. Point the service at a relay that holds "
                "them, or start a new data directory (a new server UUID: its clients "
                "start over)") from exc
        finally:
            done.set()
            with self._write:
                self._write.notify_all()
            flusher.join()

    def _flusher(self, done: threading.Event) -> None:
        """Writes the pending windows once ``flush_delay`` passed without a new one:
        the client went back to the relay, so what its answer held becomes visible now
        instead of at the next idle poll."""
        with self._write:
            while not done.is_set():
                if not self._pending:
                    self._write.wait()
                    continue
                quiet = time.monotonic() - self._last_end
                if quiet < self.flush_delay:
                    self._write.wait(self.flush_delay - quiet)
                    continue
                try:
                    self._append_pending()
                except Exception:  # broad: the client's next save retries and reports it
                    log.exception("writing binlog windows failed; retried at the next save")
                    self._write.wait(1.0)

    def _append_pending(self) -> None:
        """Write every pending window (call with ``_write`` held)."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        try:
            self.store.append([w for w, _ in pending], meta=pending[-1][1])
        except BaseException:
            self._pending = pending + self._pending
            raise

    # -- CheckpointStore: the binlog's map ---------------------------------------

    def load(self) -> Checkpoint | None:
        scn = self.store.last_scn()
        if scn >= 0:
            return Checkpoint.after(scn)
        if not self._probed:
            self._probe_history()
            self._probed = True
        return None

    def _probe_history(self) -> None:
        """A new binlog: whether the relay holds its source's changes from the start
        (see the module docstring); logs where the binlog starts, or raises
        ScnNotFoundError with ``require_complete_history``. Relay outages are
        TransientErrors (the client retries ``load``)."""
        cfg = self.config
        with RelayConnection(cfg.relay.url, http_timeout=cfg.http_timeout,
                             credentials=cfg.credentials()) as conn:
            ids = [sid for sid, name in conn.sources()
                   if not cfg.sources or name in cfg.sources or sid in cfg.sources]
            try:
                resp = conn.stream(Checkpoint.after(0), ids or None, size=1024, timeout=0)
            except ScnNotFoundError as exc:
                if self.require_complete_history:
                    raise ScnNotFoundError(
                        f"relay {cfg.relay.url} cannot prove it holds its source's changes "
                        f"from the beginning ({exc}), and require_complete_history is set: "
                        "not starting a binlog that may miss earlier changes") from exc
                log.warning(
                    "new binlog: it starts at relay %s's oldest window; the relay cannot "
                    "prove it holds its source's changes before that window (it started "
                    "with a snapshot, whose first windows carry every existing row as "
                    "inserts; or at its source's end; or it dropped older windows): "
                    "changes older than its oldest window are not in this binlog (%s)",
                    cfg.relay.url, exc)
                return
        log.info("new binlog: relay %s holds its source's changes from the beginning; the "
                 "binlog starts with the first (oldest window now: scn %d)",
                 cfg.relay.url, resp.min_scn)

    def save(self, checkpoint: Checkpoint) -> None:
        with self._write:
            self._append_pending()
        now = time.time()
        if now - self._last_purge >= self.purge_interval:
            self._last_purge = now
            with self._write:
                gone = self.store.purge(now - self.retention)
            if gone:
                log.info("purged binlog files %s", ", ".join(gone))

    # -- Consumer callbacks -------------------------------------------------------

    def on_rollback(self, scn: int) -> Result:
        # the client replays every window after its persisted checkpoint; those the
        # flusher wrote already are skipped (on_start_data_event_sequence)
        with self._write:
            self._pending.clear()
            meta = self.store.writer_meta()
            self._announced = dict(meta.get("announced", {}))
            self._defs = dict(meta.get("tables", {}))
        return None

    def on_start_data_event_sequence(self, scn: int) -> Result:
        self._ddl, self._rows, self._cur = [], [], []
        self._ts_us = 0
        with self._write:
            last = self._pending[-1][0].scn if self._pending else self.store.last_scn()
        self._skip = scn <= last
        return None

    def on_data_events(self, batch: DataBatch) -> Result:
        schema = batch.schema
        if self._skip or schema.name.startswith(INTERNAL_PREFIX) or not len(batch):
            return None
        events = batch.data_events()
        if not self._ts_us:
            self._ts_us = events[0].timestamp_ns // 1000
        m = self._map(schema)
        where = f"{schema.name} (window {batch.scn})"
        names = [c.name for c in m.cols]
        table_map = (EventType.TABLE_MAP, 0,
                     table_map_body(m.table_id, m.db, m.table, m.cols, schema.key_columns))
        kind = 0
        images: list[bytes] = []
        size = 0
        mapped = False

        def flush(last: bool) -> None:
            nonlocal images, size, mapped
            if images:
                if not mapped:
                    self._rows.append(table_map)
                    mapped = True
                head = rows_body_head(m.table_id, len(m.cols), kind == EventType.UPDATE_ROWS,
                                      last)
                self._rows.append((kind, 0, head + b"".join(images)))
                images, size = [], 0
                # a statement's end (STMT_END_F) ends its table maps, as in MySQL, whose
                # applier forgets them there: the next statement maps the table again
                mapped = mapped and not last

        for de in events:
            op = de.op
            if op == Op.TRUNCATE:
                flush(True)
                self._ddl_txn(f"TRUNCATE TABLE {quote(m.db)}.{quote(m.table)}", m.db)
                mapped, kind = False, 0
                continue
            if op in (Op.INSERT, Op.READ):
                k = EventType.WRITE_ROWS
                img = row_image(m.cols, _values(de.after, names), where)
            elif op == Op.DELETE:
                k = EventType.DELETE_ROWS
                img = row_image(m.cols, _values(de.before or de.after, names), where)
            elif op == Op.UPDATE:
                k = EventType.UPDATE_ROWS
                img = (row_image(m.cols, _values(de.before or de.after, names), where)
                       + row_image(m.cols, _values(de.after, names), where))
            else:
                continue
            if images and (k != kind or size + len(img) > ROWS_EVENT_BYTES):
                flush(k != kind)  # a new kind of change starts a new statement
            kind = k
            images.append(img)
            size += len(img)
        flush(True)
        return None

    def on_end_data_event_sequence(self, scn: int) -> Result:
        if self._skip:
            return None
        txns = list(self._ddl)
        if self._rows:
            txns.append(Transaction(self._rows))
        ts = self._ts_us or time.time_ns() // 1000
        with self._write:
            self._pending.append((Window(scn=scn, timestamp_us=ts, transactions=txns),
                                  {"announced": self._announced, "tables": self._defs}))
            self._last_end = time.monotonic()
            self._write.notify_all()
        self._ddl, self._rows = [], []
        return None

    # -- helpers ------------------------------------------------------------------

    def _map(self, schema: TableSchema) -> _Mapped:
        m = self._mapped.get(schema.id)
        if m is None:
            db, _, table = schema.name.rpartition(".")
            try:
                cols = mysql_columns(schema)
            except (ValueError, KeyError) as exc:
                raise SchemaError(f"{schema.name} v{schema.version}: {exc}") from exc
            tid = self._table_ids.setdefault(schema.id, 100 + len(self._table_ids))
            m = _Mapped(db or "databus", table, cols, schema, tid)
            self._mapped[schema.id] = m
        announced = self._announced.get(schema.name)
        if announced != schema.id.hex():
            sql: str | None
            if announced is None:
                sql = create_table_sql(m.db, m.table, m.cols, schema.key_columns)
            else:
                old = self._old_columns(schema, announced)
                sql = (alter_table_sql(m.db, m.table, old, m.cols) if old is not None
                       else create_table_sql(m.db, m.table, m.cols, schema.key_columns))
            if sql is not None:
                self._ddl_txn(sql, m.db)
            self._announced = {**self._announced, schema.name: schema.id.hex()}
            self._defs = {**self._defs, f"{m.db}.{m.table}": table_map_body(
                m.table_id, m.db, m.table, m.cols, schema.key_columns).hex()}
        return m

    def _old_columns(self, schema: TableSchema, schema_hex: str) -> list[MysqlColumn] | None:
        if self.client is None:
            return None
        try:
            old = self.client.registry.get(bytes.fromhex(schema_hex))
        except SchemaError:
            return None
        return mysql_columns(old)

    def _ddl_txn(self, sql: str, db: str) -> None:
        if self._rows:  # DDL between row changes of one window: commit the rows first
            self._ddl.append(Transaction(self._rows))
            self._rows = []
        self._ddl.append(Transaction([(EventType.QUERY, 0, ev.query(sql, db=db))],
                                     ddl=True))


def _values(row: dict[str, Any] | None, names: list[str]) -> list[Any]:
    if row is None:
        raise SchemaError("a row change without its row image")
    return [row.get(n) for n in names]
