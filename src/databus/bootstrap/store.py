"""The bootstrap store: log and snapshot tables in one SQL database.

One contract for SQLite (default), PostgreSQL and MariaDB/MySQL, written with
SQLAlchemy Core (the only module of the bootstrap that imports it).

Tables (prefix ``dbus_bs_``):

* ``meta(k, v)``: ``producer_checkpoint`` (the producer's relay checkpoint),
  ``applied_scn`` (every log window with an SCN at or below it is folded into
  the snapshot), ``log_start_scn`` (the log holds every window with an SCN
  above it), ``initial_scn`` (set once the initial load finished),
  ``sources`` and ``registry`` (copies of the relay's ``/sources`` and
  ``/register``).
* ``log(scn, part, stored_ns, data)``: each window the producer received, as
  the exact bytes of its events and EOP (the shared event codec), cut into
  parts; ``stored_ns`` is when it was stored (for the retention, :meth:`trim`).
* ``snapshot(id, src, k, scn, ev)``: the latest image of each key, one row per
  (source, key); ``ev`` is an event with op READ and the snapshot attribute;
  ``scn`` the window that wrote it; ``id`` grows with first insertion and is
  kept by updates, so a reader resuming "after id N" never misses a row that
  existed when it started.

Serving reads (:meth:`snapshot_chunks`): the stored events are already the
bytes a consumer receives, so a snapshot page is read as a few concatenations
made by the database itself (``group_concat`` on SQLite, ``string_agg`` on
PostgreSQL, ``GROUP_CONCAT`` on MariaDB/MySQL) of about :data:`CHUNK_BYTES`
each (the row count per chunk follows the average event size read so far): no
Python object per row on the server. Each concatenation's length is checked
against the sum of its rows' lengths, and a chunk the database did not
concatenate whole (MariaDB cuts ``GROUP_CONCAT`` at half its
``max_allowed_packet``) is read row by row instead. Limit: the answer is held
in memory, as before, and one chunk must stay under the database's value limit
(1 GB on PostgreSQL and SQLite): a run of rows hundreds of times larger than
the rows before it could exceed it.

Guarantees: :meth:`append` writes windows and the producer checkpoint in one
transaction; :meth:`fold` writes snapshot changes and ``applied_scn`` in one
transaction. So a crash at any point leaves the store consistent and each
component resumes where its last transaction ended.

Errors (classified once, in ``databus.client.sql``): a database that cannot be
reached, a lock or deadlock raises :class:`~databus.core.errors.StoreUnavailableError`
(transient); a statement the database refuses raises
:class:`~databus.core.errors.SqlStatementError` (terminal, with its context).
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
import struct
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event as sa_event
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import mysql, postgresql, sqlite

from databus.client.sql import translate_db_errors
from databus.core.checkpoint import Checkpoint
from databus.core.errors import ConfigError, StoreUnavailableError
from databus.core.redact import redact_url

log = logging.getLogger("databus.bootstrap.store")

_PART = 1 << 20  # bytes per log row: keeps each statement well under packet limits
# bytes one snapshot concatenation aims at: well under MariaDB's max_allowed_packet
# (16 MiB by default), large enough that a usual page is one query
CHUNK_BYTES = 4 << 20
_MAX_ID = (1 << 63) - 1  # no upper id bound
_CHUNK_ROWS = 32_768  # rows per concatenation at most, whatever the average size
_I64 = struct.Struct(">q")

_BLOB = sa.LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")
_KEY = sa.LargeBinary().with_variant(mysql.VARBINARY(300), "mysql", "mariadb")
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def key_bytes(key: int | bytes) -> bytes:
    """The stored form of an event key (unique per key, bounded length)."""
    if isinstance(key, int):
        return b"\x00" + _I64.pack(key)
    if len(key) <= 250:
        return b"\x01" + key
    return b"\x02" + hashlib.sha256(key).digest()


@dataclass(frozen=True, slots=True)
class StoreState:
    """Positions of a store (-1 = none)."""

    log_start_scn: int
    log_max_scn: int
    applied_scn: int
    initialized: bool  # log_start_scn was fixed (initial load or first window)


class BootstrapStore:
    """A bootstrap store at a SQLAlchemy URL (``sqlite:///bs.db``, ``postgresql+psycopg://``,
    ``mysql+pymysql://``). Safe to use from several threads (pooled connections)."""

    def __init__(self, url: str, *, create: bool = True) -> None:
        """``create=False`` (readers): leave the schema alone; a database without
        the tables then fails on first use with :class:`StoreUnavailableError`."""
        self.url = url
        try:
            self._w = sa.create_engine(url, pool_pre_ping=True)
        except (sa_exc.ArgumentError, ImportError) as exc:
            raise ConfigError(f"bootstrap store url {redact_url(url)!r}: {exc}") from exc
        self.dialect = self._w.dialect.name
        self._r = self._w
        if self.dialect == "sqlite":
            self._r = sa.create_engine(url)
            _sqlite_setup(self._w, immediate=True)
            _sqlite_setup(self._r, immediate=False)
        md = sa.MetaData()
        self.meta = sa.Table("dbus_bs_meta", md, sa.Column("k", sa.String(64), primary_key=True),
                             sa.Column("v", sa.Text().with_variant(mysql.LONGTEXT(), "mysql",
                                                                   "mariadb")))
        self.log = sa.Table("dbus_bs_log", md,
                            sa.Column("scn", sa.BigInteger, primary_key=True,
                                      autoincrement=False),
                            sa.Column("part", sa.Integer, primary_key=True, autoincrement=False),
                            sa.Column("stored_ns", sa.BigInteger, nullable=False),
                            sa.Column("data", _BLOB, nullable=False))
        self.snap = sa.Table("dbus_bs_snapshot", md,
                             sa.Column("id", _ID, primary_key=True, autoincrement=True),
                             sa.Column("src", sa.Integer, nullable=False),
                             sa.Column("k", _KEY, nullable=False),
                             sa.Column("scn", sa.BigInteger, nullable=False),
                             sa.Column("ev", _BLOB, nullable=False),
                             sa.UniqueConstraint("src", "k", name="dbus_bs_snapshot_key"),
                             sa.Index("dbus_bs_snapshot_src_id", "src", "id"))
        if self.dialect in ("mysql", "mariadb"):
            _mysql_setup(self._w)
        if create:
            with self._tx("creating the bootstrap tables") as conn:
                md.create_all(conn, checkfirst=True)
        self._upsert = self._make_upsert()
        self._concat = sa.text(_concat_sql(self.dialect))
        self._concat_warned = False
        # average bytes per snapshot event read so far: sizes the next chunk (a hint;
        # threads may overwrite each other's value)
        self._event_bytes = 512.0

    def __enter__(self) -> BootstrapStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._w.dispose()
        if self._r is not self._w:
            self._r.dispose()

    # -- plumbing -------------------------------------------------------------------

    @contextmanager
    def _tx(self, what: str, *, read: bool = False) -> Iterator[sa.Connection]:
        engine = self._r if read else self._w
        with translate_db_errors(what, engine, StoreUnavailableError), engine.begin() as conn:
            yield conn

    def _make_upsert(self) -> Any:
        t = self.snap
        if self.dialect in ("sqlite", "postgresql"):
            ins = sqlite.insert(t) if self.dialect == "sqlite" else postgresql.insert(t)
            return ins.on_conflict_do_update(
                index_elements=["src", "k"], set_={"scn": ins.excluded.scn, "ev": ins.excluded.ev})
        if self.dialect in ("mysql", "mariadb"):
            mins = mysql.insert(t)
            return mins.on_duplicate_key_update(scn=mins.inserted.scn, ev=mins.inserted.ev)
        raise ConfigError(f"bootstrap store: unsupported database {self.dialect}")

    def _set(self, conn: sa.Connection, key: str, value: str) -> None:
        done = conn.execute(sa.update(self.meta).where(self.meta.c.k == key).values(v=value))
        if done.rowcount == 0:
            conn.execute(sa.insert(self.meta).values(k=key, v=value))

    @staticmethod
    def _get(conn: sa.Connection, table: sa.Table, key: str) -> str | None:
        row = conn.execute(sa.select(table.c.v).where(table.c.k == key)).first()
        return None if row is None else str(row[0])

    # -- meta ---------------------------------------------------------------------------

    def get(self, key: str) -> str | None:
        with self._tx(f"reading {key}", read=True) as conn:
            return self._get(conn, self.meta, key)

    def put(self, key: str, value: str) -> None:
        self.put_all({key: value})

    def put_all(self, items: dict[str, str]) -> None:
        """Write every key in one transaction: a reader sees all of them or none."""
        with self._tx(f"writing {', '.join(items)}") as conn:
            for key, value in items.items():
                self._set(conn, key, value)

    def state(self) -> StoreState:
        with self._tx("reading the store positions", read=True) as conn:
            start = self._get(conn, self.meta, "log_start_scn")
            applied = self._get(conn, self.meta, "applied_scn")
            top = conn.execute(sa.select(sa.func.max(self.log.c.scn))).scalar()
        s = int(start) if start is not None else -1
        return StoreState(s, int(top) if top is not None else s,
                          int(applied) if applied is not None else s, start is not None)

    def producer_checkpoint(self) -> Checkpoint | None:
        raw = self.get("producer_checkpoint")
        return Checkpoint.from_json(raw) if raw is not None else None

    # -- producer --------------------------------------------------------------------

    def append(self, windows: list[tuple[int, bytes]], checkpoint: Checkpoint,
               log_start_scn: int | None = None) -> None:
        """Add whole windows (SCN, bytes incl. EOP) and the producer checkpoint, atomically.

        ``log_start_scn`` is recorded when given and none is recorded yet.
        """
        now = time.time_ns()
        rows = [{"scn": scn, "part": i // _PART, "stored_ns": now, "data": data[i:i + _PART]}
                for scn, data in windows for i in range(0, max(len(data), 1), _PART)]
        with self._tx("appending to the bootstrap log") as conn:
            if rows:
                conn.execute(sa.insert(self.log), rows)
            if log_start_scn is not None and self._get(conn, self.meta, "log_start_scn") is None:
                self._set(conn, "log_start_scn", str(log_start_scn))
                self._set(conn, "applied_scn", str(log_start_scn))
            self._set(conn, "producer_checkpoint", checkpoint.to_json())

    def trim(self, stored_before_ns: int, upto_scn: int) -> int | None:
        """Delete the log's windows stored before ``stored_before_ns`` and at or below
        ``upto_scn`` (the applied position), and move ``log_start_scn`` to the last
        one deleted, atomically. Returns the new log start, None when nothing went."""
        log = self.log
        with self._tx("trimming the bootstrap log") as conn:
            cutoff = conn.execute(sa.select(sa.func.max(log.c.scn)).where(
                log.c.stored_ns < stored_before_ns, log.c.scn <= upto_scn)).scalar()
            if cutoff is None:
                return None
            conn.execute(sa.delete(log).where(log.c.scn <= cutoff))
            self._set(conn, "log_start_scn", str(int(cutoff)))
        return int(cutoff)

    # -- applier ----------------------------------------------------------------------

    def log_after(self, after_scn: int, max_windows: int,
                  upto_scn: int | None = None) -> list[tuple[int, bytes]]:
        """Up to ``max_windows`` whole windows with SCN > ``after_scn`` (and <= ``upto_scn``)."""
        log = self.log
        with self._tx("reading the bootstrap log", read=True) as conn:
            q = sa.select(log.c.scn).where(log.c.scn > after_scn)
            if upto_scn is not None:
                q = q.where(log.c.scn <= upto_scn)
            scns = list(conn.execute(q.distinct().order_by(log.c.scn).limit(max_windows))
                        .scalars())
            if not scns:
                return []
            rows = conn.execute(sa.select(log.c.scn, log.c.data)
                                .where(log.c.scn >= scns[0], log.c.scn <= scns[-1])
                                .order_by(log.c.scn, log.c.part)).all()
        out: list[tuple[int, bytes]] = []
        for scn, data in rows:
            if out and out[-1][0] == scn:
                out[-1] = (scn, out[-1][1] + bytes(data))
            else:
                out.append((int(scn), bytes(data)))
        return out

    def fold(self, upserts: list[dict[str, Any]], deletes: list[dict[str, Any]],
             truncated: list[int], applied_scn: int) -> None:
        """Apply one batch to the snapshot and move ``applied_scn``, atomically.

        Order inside the batch: truncations, then deletes, then upserts (the
        caller collapses a batch to the last operation per key, see
        :mod:`databus.bootstrap.applier`). Upsert rows: ``src, k, scn, ev``;
        delete rows: ``src, k``.
        """
        s = self.snap
        with self._tx("applying to the snapshot") as conn:
            for src in truncated:
                conn.execute(sa.delete(s).where(s.c.src == src))
            if deletes:
                conn.execute(sa.delete(s).where(s.c.src == sa.bindparam("d_src"),
                                                s.c.k == sa.bindparam("d_k")),
                             [{"d_src": d["src"], "d_k": d["k"]} for d in deletes])
            if upserts:
                conn.execute(self._upsert, upserts)
            self._set(conn, "applied_scn", str(applied_scn))

    # -- initial load -----------------------------------------------------------------

    def start_initial_load(self) -> None:
        """Empty the store before an initial load (also after an interrupted one)."""
        with self._tx("clearing the store for the initial load") as conn:
            conn.execute(sa.delete(self.snap))
            conn.execute(sa.delete(self.log))
            conn.execute(sa.delete(self.meta).where(self.meta.c.k.in_(
                ["log_start_scn", "applied_scn", "initial_scn", "producer_checkpoint"])))

    def load_rows(self, rows: list[dict[str, Any]]) -> None:
        """Snapshot rows of the initial load (``src, k, scn, ev``)."""
        with self._tx("writing initial snapshot rows") as conn:
            conn.execute(self._upsert, rows)

    def finish_initial_load(self, scn: int) -> None:
        """The snapshot now holds every row as of ``scn``; the log continues after it."""
        with self._tx("finishing the initial load") as conn:
            for k in ("log_start_scn", "applied_scn", "initial_scn"):
                self._set(conn, k, str(scn))
            self._set(conn, "producer_checkpoint", Checkpoint.after(scn).to_json())

    # -- server -----------------------------------------------------------------------

    def snapshot_batch(self, src: int, after_id: int, below_scn: int,
                       limit: int) -> tuple[list[bytes], int]:
        """Up to ``limit`` events of ``src``'s rows with id > ``after_id`` and
        scn < ``below_scn``, in id order, and the id of the last one
        (``after_id`` when none is left)."""
        with self._tx("reading the snapshot", read=True) as conn:
            return self._rows_after(conn, src, after_id, below_scn, limit)

    def snapshot_chunks(self, src: int, after_id: int, below_scn: int,
                        limit: int, upto_id: int = _MAX_ID) -> tuple[list[bytes], int, int]:
        """The events of :meth:`snapshot_batch` as concatenations: ``(chunks, last
        id, rows)``; ``b"".join(chunks)`` is the rows' events in id order.

        Up to ``limit`` rows of ``src`` with ``after_id < id <= upto_id`` and scn <
        ``below_scn``; ``last id`` is that of the last row (``after_id`` when
        none is left). All chunks are read in one read transaction.
        """
        chunks: list[bytes] = []
        rows, last = 0, after_id
        with self._tx("reading the snapshot", read=True) as conn:
            while rows < limit:
                n = max(1, min(limit - rows, _CHUNK_ROWS,
                               int(CHUNK_BYTES / self._event_bytes)))
                data, top, count, size = conn.execute(self._concat, {
                    "src": src, "after": last, "upto": upto_id, "below": below_scn,
                    "n": n}).one()
                if not count:
                    break
                self._event_bytes = max(int(size) / int(count), 1.0)
                if data is None or len(data) != int(size):
                    # the database did not concatenate it whole (a result over its
                    # packet or length limit): read these rows one by one
                    self._warn_concat(count, size, data)
                    evs, top = self._rows_after(conn, src, last, below_scn, n, upto_id)
                    data, count = b"".join(evs), len(evs)
                chunks.append(bytes(data))
                rows += int(count)
                last = int(top)
        return chunks, last, rows

    def _rows_after(self, conn: sa.Connection, src: int, after_id: int, below_scn: int,
                    limit: int, upto_id: int = _MAX_ID) -> tuple[list[bytes], int]:
        s = self.snap
        rows = conn.execute(sa.select(s.c.id, s.c.ev)
                            .where(s.c.src == src, s.c.id > after_id, s.c.id <= upto_id,
                                   s.c.scn < below_scn)
                            .order_by(s.c.id).limit(limit)).all()
        return [bytes(r[1]) for r in rows], int(rows[-1][0]) if rows else after_id

    def _warn_concat(self, count: int, size: int, data: bytes | None) -> None:
        if not self._concat_warned:
            self._concat_warned = True
            log.warning("the %s store did not concatenate %d snapshot rows (%s of %d bytes); "
                        "reading them row by row (logged once)", self.dialect, count,
                        "none" if data is None else len(data), size)

    # -- partitioned snapshot readers (databus.spark.snapshot) -------------------------

    def snapshot_id_span(self, sources: list[int], upto_scn: int) -> tuple[int, int]:
        """(lowest, highest) row id of ``sources``' rows with scn <= ``upto_scn``;
        (0, -1) when there is none. Readers split this span into id ranges."""
        s = self.snap
        ends: list[int] = []
        with self._tx("reading the snapshot id span", read=True) as conn:
            # per source, the first and the last row in id order that passes the scn
            # test, walked from each end of the (src, id) index: that stops at once
            # when the ends pass (usual: a row's scn is at most the applied SCN), where
            # MIN/MAX with the scn test read every row of the sources (SQLite, 200k
            # rows: 37 ms, now under 0.1 ms; asked once per Spark snapshot read)
            for src in sorted(set(sources)):
                for order in (s.c.id, s.c.id.desc()):
                    end = conn.execute(sa.select(s.c.id)
                                       .where(s.c.src == src, s.c.scn <= upto_scn)
                                       .order_by(order).limit(1)).scalar()
                    if end is not None:
                        ends.append(int(end))
        return (min(ends), max(ends)) if ends else (0, -1)

    def snapshot_page(self, sources: list[int], after_id: int, last_id: int, upto_scn: int,
                      limit: int) -> list[tuple[int, int, int, bytes]]:
        """Up to ``limit`` rows ``(id, src, scn, ev)`` of ``sources`` with
        ``after_id < id <= last_id`` and scn <= ``upto_scn``, in id order (keyset
        paging over the ``(src, id)`` index: a reader resumes after the last id)."""
        s = self.snap
        with self._tx("reading the snapshot", read=True) as conn:
            rows = conn.execute(sa.select(s.c.id, s.c.src, s.c.scn, s.c.ev)
                                .where(s.c.src.in_(sources), s.c.id > after_id,
                                       s.c.id <= last_id, s.c.scn <= upto_scn)
                                .order_by(s.c.id).limit(limit)).all()
        return [(int(r[0]), int(r[1]), int(r[2]), bytes(r[3])) for r in rows]

    def count_snapshot(self, sources: list[int] | None = None) -> int:
        """Snapshot rows (of ``sources``, all when None)."""
        q = sa.select(sa.func.count()).select_from(self.snap)
        if sources is not None:
            q = q.where(self.snap.c.src.in_(sources))
        with self._tx("counting snapshot rows", read=True) as conn:
            return int(conn.execute(q).scalar() or 0)

    def select_all_snapshot(self) -> int:
        """``SELECT *`` of the snapshot table through this store's driver (the
        benchmark's baseline); returns the number of rows fetched."""
        n = 0
        with self._r.connect() as conn:
            result = conn.execution_options(stream_results=True, yield_per=10_000).execute(
                sa.select(self.snap))
            for part in result.partitions():
                n += len(part)
        return n


def _concat_sql(dialect: str) -> str:
    """One snapshot chunk: the concatenated events of ``src``'s next rows (``after``
    < id <= ``upto``, scn < ``below``, at most ``n``) in id order, with the last id, the
    row count and the sum of the rows' lengths (to check the concatenation)."""
    if dialect == "postgresql":
        agg = "string_agg(ev, ''::bytea ORDER BY id)"
    elif dialect in ("mysql", "mariadb"):
        agg = "GROUP_CONCAT(ev ORDER BY id SEPARATOR '')"
    elif sqlite3.sqlite_version_info >= (3, 44):
        agg = "CAST(group_concat(ev, '' ORDER BY id) AS BLOB)"
    else:
        # before 3.44 group_concat takes no ORDER BY; it concatenates in the order
        # the subquery yields (a LIMITed subquery is not flattened into an
        # aggregate, so it runs as a co-routine in its ORDER BY order). CAST
        # only relabels the bytes (no conversion in a UTF-8 database)
        agg = "CAST(group_concat(ev, '') AS BLOB)"
    return (f"SELECT {agg}, MAX(id), COUNT(*), SUM(LENGTH(ev)) FROM ("
            " SELECT id, ev FROM dbus_bs_snapshot"
            " WHERE src = :src AND id > :after AND id <= :upto AND scn < :below"
            " ORDER BY id LIMIT :n) page")


def _mysql_setup(engine: sa.Engine) -> None:
    """GROUP_CONCAT's result limit at half the packet limit (the default, 1 KiB,
    would cut every snapshot chunk; a result near the packet limit could not be
    sent): a longer chunk comes back cut, and is read row by row."""

    @sa_event.listens_for(engine, "connect")
    def _connect(dbapi_con: Any, _rec: Any) -> None:
        with dbapi_con.cursor() as cur:
            cur.execute("SET SESSION group_concat_max_len = @@max_allowed_packet DIV 2")


def _sqlite_setup(engine: sa.Engine, *, immediate: bool) -> None:
    """WAL, a busy timeout, and transactions that take the write lock up front
    (``immediate``): a deferred transaction upgrading to a writer could fail at
    once with SQLITE_BUSY instead of waiting."""

    @sa_event.listens_for(engine, "connect")
    def _connect(dbapi_con: Any, _rec: Any) -> None:
        dbapi_con.isolation_level = None
        cur = dbapi_con.cursor()
        cur.execute("PRAGMA busy_timeout=60000")
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    @sa_event.listens_for(engine, "begin")
    def _begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")
