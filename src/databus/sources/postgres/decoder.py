"""One replication session's decoding: pgoutput messages into windows.

Contract (the **Window**, **Keys**, **Events** and **Unchanged TOASTed values** parts of
:mod:`.source`):

* Relation messages give the table versions (:mod:`.versions`); Type messages name
  types; a change of a relation not described in this session is a
  :class:`~databus.core.errors.SchemaError`.
* Row changes of a transaction are held (by the C decoder when built, :mod:`.fastpath`:
  the read loop hands it the change messages directly) and become one window at the
  transaction's Commit, with SCN = its end LSN; a transaction with nothing captured
  gives no window (its position moves the server LSN on).
* Rows of the signal table are never events: inserted ones are the transaction's
  signals, handed to the incremental snapshots (:class:`~databus.sources.common.
  incremental.Snapshots`) at the commit.
* Streamed transactions (protocol 2): their messages are held (:mod:`.streams`) from
  Stream Start to Stream Stop, dropped at Stream Abort (a subtransaction's part of
  them), and decoded in order into the one window of their Stream Commit.
* Counters (TOAST fill-ins, truncates, streamed transactions) go to the source's stats
  dict, whose keys exist from the start.

A decoder belongs to the capture thread and to one replication session: a new session
gets a new one (the server describes every relation again).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from databus.core import event as ev
from databus.core.errors import CorruptEventError, SchemaError
from databus.core.window import Window
from databus.sources.common.incremental import NOTIFY_SCHEMA, Snapshots
from databus.sources.common.signals import Signal
from databus.sources.postgres import fastpath
from databus.sources.postgres import pgoutput as po
from databus.sources.postgres.connection import SqlSession, quote_ident
from databus.sources.postgres.streams import Budget, Spool
from databus.sources.postgres.types import TableVersion

log = logging.getLogger("databus.sources.postgres")

CHANGES = frozenset({b"I", b"U", b"D"})
"""The first bytes of row change messages (the C decoder's)."""

DECODER_STATS = ("toast_fetched_total", "toast_carried_total", "toast_unavailable_total",
                 "truncates_total", "streamed_transactions_total", "streamed_aborts_total",
                 "stream_spilled_bytes_total", "streams_open")


@dataclass
class Rel:
    """A relation of this session: its message and, when captured, its version."""

    msg: po.Relation
    version: TableVersion | None


@dataclass
class Txn:
    """The transaction being decoded (its rows wait in the decoder's ``rows``)."""

    xid: int
    commit_ts_us: int
    origin: str | None = None
    signals: list[Signal] = field(default_factory=list)  # rows inserted into the signal table


class Decoder:
    """Decodes one session's messages (module docstring).

    ``version_of(relation)``: the version of a captured table's shape; ``wanted(name)``:
    whether a table is captured; ``sql``: the source's session (TOAST fetches);
    ``snaps``: the incremental snapshots (None: signals off); ``stats``: the counters;
    ``budget``/``spill_dir``: where streamed transactions are held."""

    def __init__(self, *, compiled: bool | None, version_of: Callable[[po.Relation],
                 TableVersion], wanted: Callable[[str], bool], signal_table: str,
                 sql: SqlSession, snaps: Snapshots | None, stats: dict[str, float],
                 budget: Budget, spill_dir: Path | None) -> None:
        self.rows: fastpath.Rows = fastpath.rows(compiled)
        self.version_of = version_of
        self.wanted = wanted
        self.signal_table = signal_table
        self.sql = sql
        self.snaps = snaps
        self.stats = stats
        self.budget = budget
        self.spill_dir = spill_dir
        self.txn: Txn | None = None
        self.rels: dict[int, Rel] = {}
        self.types: dict[int, str] = {}  # Type messages: oid -> namespace.name
        self.signal_rels: set[int] = set()
        self.spools: dict[int, Spool] = {}  # open streamed transactions
        self.in_stream: int | None = None  # inside a stream block of this transaction
        self.server_lsn = 0  # the server's position between transactions

    @property
    def between(self) -> bool:
        """No transaction open, streamed or not: a position here is safe to restart at."""
        return self.txn is None and not self.spools

    def close(self) -> None:
        """Drop what is held (the session ended, or failed)."""
        self.txn = None
        self.rows.clear()
        for spool in self.spools.values():
            spool.close()
        self.spools.clear()
        self.in_stream = None
        self.stats["streams_open"] = 0.0

    # -- messages ------------------------------------------------------------------

    def payload(self, payload: bytes) -> Window | None:
        """One message outside the read loop's hot path (a change the C decoder did not
        take, or any other message)."""
        if self.in_stream is not None:
            self._streamed(payload)
            return None
        msg = po.decode(payload)
        if isinstance(msg, po.StreamStart):
            if self.txn is not None:
                raise CorruptEventError("pgoutput Stream Start inside a transaction")
            spool = self.spools.get(msg.xid)
            if spool is None or msg.first:
                if spool is not None:
                    spool.close()
                spool = self.spools[msg.xid] = Spool(msg.xid, self.budget, self.spill_dir)
            self.in_stream = msg.xid
            self.stats["streams_open"] = float(len(self.spools))
            return None
        if isinstance(msg, po.StreamCommit):
            return self._stream_commit(msg)
        if isinstance(msg, po.StreamAbort):
            self._stream_abort(msg)
            return None
        if isinstance(msg, po.StreamStop):
            raise CorruptEventError("pgoutput Stream Stop outside a stream block")
        return self.message(msg)

    def message(self, msg: po.Message) -> Window | None:
        if isinstance(msg, po.Begin):
            self.txn = Txn(msg.xid, msg.commit_ts_us)
        elif isinstance(msg, po.Commit):
            return self.commit(msg)
        elif isinstance(msg, po.Relation):
            self.relation(msg)
        elif isinstance(msg, (po.Insert, po.Update, po.Delete)):
            self._change(msg)
        elif isinstance(msg, po.Truncate):
            self._truncate(msg)
        elif isinstance(msg, po.Origin):
            if self.txn is not None:
                self.txn.origin = f"{msg.name}/{po.lsn_text(msg.lsn)}"
        elif isinstance(msg, po.TypeInfo):
            self.types[msg.oid] = f"{msg.namespace}.{msg.name}"
        # LogicalMessage: only sent when asked for (messages option), never here
        return None

    def relation(self, msg: po.Relation) -> None:
        name = f"{msg.namespace}.{msg.name}"
        self.signal_rels.discard(msg.oid)
        if name == self.signal_table:
            self.rels[msg.oid] = Rel(msg, None)
            self.signal_rels.add(msg.oid)
            self.rows.forget(msg.oid)  # its rows come to _change
            return
        if not self.wanted(name):
            self.rels[msg.oid] = Rel(msg, None)
            self.rows.relate(msg.oid, None)
            return
        version = self.version_of(msg)
        self.rels[msg.oid] = Rel(msg, version)
        self.rows.relate(msg.oid, version)

    def _version(self, rel: int) -> TableVersion | None:
        entry = self.rels.get(rel)
        if entry is None:
            raise SchemaError(f"pgoutput change of relation {rel} before its Relation message")
        return entry.version

    def _change(self, msg: po.Insert | po.Update | po.Delete) -> None:
        txn = self.txn
        if txn is None:
            raise SchemaError("pgoutput change outside a transaction")
        if msg.rel in self.signal_rels:
            if isinstance(msg, po.Insert):  # signals and watermarks are inserted rows
                self._signal_row(txn, msg)
            return
        version = self._version(msg.rel)
        if version is None:
            return
        rows = self.rows
        index = rows.pending
        # columns left out (include/exclude_columns) go here, before anything else
        if isinstance(msg, po.Insert):
            after, payload = version.typed(version.project(msg.new))
            rows.add(version, ev.Op.INSERT, version.key(after, index), payload, None)
        elif isinstance(msg, po.Delete):
            before, payload = version.typed(version.project(msg.old))
            rows.add(version, ev.Op.DELETE, version.key(before, index), payload, None)
        else:
            old_texts = version.project(msg.old) if msg.old is not None else None
            new = self._untoasted(version.project(msg.new), old_texts, msg.old_kind, version)
            after = version.values(new)
            old = version.values(old_texts) if old_texts is not None else None
            new_key = version.key(after, index)
            if old is not None and version.key_index:
                old_key = version.key(old, index)
                if old_key != new_key:
                    rows.add(version, ev.Op.DELETE, old_key, version.encode(old), None)
                    rows.add(version, ev.Op.INSERT, new_key, version.encode(after), None)
                    return
            image = version.encode(old) if old is not None and msg.old_kind == "O" else None
            rows.add(version, ev.Op.UPDATE, new_key, version.encode(after), image)

    def _signal_row(self, txn: Txn, msg: po.Insert) -> None:
        rel = self.rels[msg.rel].msg
        row = {c.name: v for c, v in zip(rel.columns, msg.new, strict=False)}

        def text(v: Any) -> str | None:
            return v.decode("utf-8") if isinstance(v, bytes) else None

        txn.signals.append((str(text(row.get("id"))), str(text(row.get("type"))),
                            text(row.get("data"))))

    def _untoasted(self, new_texts: list[Any], old: list[Any] | None, old_kind: str,
                   version: TableVersion) -> list[Any]:
        """The new tuple (kept columns) with unchanged TOASTed values filled in (module
        docstring of :mod:`.source`); ``old``: the old tuple's kept columns, ``old_kind``
        its kind."""
        new = list(new_texts)
        missing = [i for i, v in enumerate(new) if v is po.UNCHANGED]
        if not missing:
            return new
        if old_kind == "O" and old is not None:
            for i in missing:
                new[i] = old[i]
            if all(new[i] is not po.UNCHANGED for i in missing):
                self.stats["toast_carried_total"] += len(missing)
                return new
            missing = [i for i in missing if new[i] is po.UNCHANGED]
        fetched = self._fetch(version, new, missing)
        for i in missing:
            new[i] = fetched.get(i) if fetched is not None else None
        if fetched is None:
            self.stats["toast_unavailable_total"] += len(missing)
            log.warning("%s: unchanged TOASTed column(s) %s of an updated row not found (row"
                        " deleted since?): sent as NULL", version.schema.name,
                        [version.fields[i] for i in missing])
        else:
            self.stats["toast_fetched_total"] += len(missing)
        return new

    def _fetch(self, version: TableVersion, new: list[Any], columns: list[int]
               ) -> dict[int, Any] | None:
        names = version.schema.column_names
        if not version.key_index:
            return None
        schema, _, table = version.schema.name.partition(".")
        select = ", ".join(f"CASE WHEN {quote_ident(names[i])} IS NULL THEN NULL"
                           f" ELSE concat({quote_ident(names[i])}) END" for i in columns)
        where = " AND ".join(f"{quote_ident(names[i])} = %s" for i in version.key_index)
        rows = self.sql.query(
            f"SELECT {select} FROM {quote_ident(schema)}.{quote_ident(table)} WHERE {where}",
            tuple(new[i].decode("utf-8") if isinstance(new[i], bytes) else new[i]
                  for i in version.key_index))
        if not rows:
            return None
        return dict(zip(columns, rows[0], strict=True))

    def _truncate(self, msg: po.Truncate) -> None:
        if self.txn is None:
            raise SchemaError("pgoutput truncate outside a transaction")
        for rel in msg.rels:
            version = self._version(rel)
            if version is not None:
                self.rows.add(version, ev.Op.TRUNCATE, 0, b"", None)
                self.stats["truncates_total"] += 1

    def commit(self, msg: po.Commit) -> Window | None:
        """The window of the transaction ``msg`` commits (None: nothing captured)."""
        txn, self.txn = self.txn, None
        self.server_lsn = max(self.server_lsn, msg.end_lsn)
        snaps = self.snaps
        if txn is None or (not self.rows.pending and not txn.signals
                           and (snaps is None or snaps.quiet)):
            self.rows.clear()
            return None
        scn = msg.end_lsn
        ts_ns = (msg.commit_ts_us + po.PG_EPOCH_US) * 1000
        origin = None if txn.origin is None else txn.origin.encode("utf-8")
        data, count = self.rows.commit(scn, ts_ns, str(txn.xid).encode(), origin)
        if snaps is None:
            return Window(scn, data, count, ts_ns) if count else None
        parts = [data]
        count += snaps.commit(txn.signals, parts, scn, ts_ns, NOTIFY_SCHEMA)
        if not count:
            return None
        return Window(scn, b"".join(parts), count, ts_ns)

    # -- streamed transactions -------------------------------------------------------

    def _streamed(self, payload: bytes) -> None:
        """A message inside a stream block: held until its transaction ends."""
        t = payload[:1]
        if t == b"E":  # Stream Stop
            self.in_stream = None
            return
        if t in (b"S", b"c", b"A", b"B", b"C"):
            raise CorruptEventError(f"pgoutput message {t!r} inside a stream block")
        assert self.in_stream is not None
        spool = self.spools[self.in_stream]
        before = spool.spilled_bytes
        spool.append(payload, po.streamed_xid(payload))
        self.stats["stream_spilled_bytes_total"] += spool.spilled_bytes - before

    def _stream_abort(self, msg: po.StreamAbort) -> None:
        spool = self.spools.get(msg.xid)
        if spool is None:
            return  # nothing of it was streamed in this session
        if msg.subxid == msg.xid:
            spool.close()
            del self.spools[msg.xid]
            self.stats["streamed_aborts_total"] += 1
            self.stats["streams_open"] = float(len(self.spools))
        else:
            spool.abort_subxact(msg.subxid)

    def _stream_commit(self, msg: po.StreamCommit) -> Window | None:
        """Decode a streamed transaction's messages, in order, into its one window."""
        spool = self.spools.pop(msg.xid, None)
        self.stats["streams_open"] = float(len(self.spools))
        if spool is None:
            raise CorruptEventError(
                f"pgoutput Stream Commit of transaction {msg.xid}, never streamed")
        if self.txn is not None:
            raise CorruptEventError("pgoutput Stream Commit inside a transaction")
        self.txn = Txn(msg.xid, msg.commit_ts_us)
        change = self.rows.change
        try:
            for payload in spool.messages():
                if payload[:1] in CHANGES and change(payload, 4) >= 0:
                    continue
                inner = po.decode(po.unstreamed(payload))
                if isinstance(inner, (po.Begin, po.Commit, po.StreamStart, po.StreamStop,
                                      po.StreamCommit, po.StreamAbort)):
                    raise CorruptEventError(f"pgoutput {type(inner).__name__} inside a"
                                            " streamed transaction")
                self.message(inner)
        finally:
            spool.close()
        self.stats["streamed_transactions_total"] += 1
        return self.commit(po.Commit(msg.flags, msg.commit_lsn, msg.end_lsn,
                                     msg.commit_ts_us))
