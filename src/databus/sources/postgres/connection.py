"""The PostgreSQL source's only contact with its driver, psycopg2.

Why psycopg2 and not psycopg 3 (which the replicate sink and the bootstrap
store use): psycopg 3 has no API for the streaming replication protocol, only
its libpq enum; psycopg2's ``LogicalReplicationConnection`` is maintained, runs
``START_REPLICATION`` and answers the server's keepalives itself. Everything
here is translated once (:func:`translated`): a connection that fails or goes
away is :class:`~databus.core.errors.SourceUnavailableError` (the relay retries),
a missing right is :class:`~databus.core.errors.ConfigError`, anything else the
server refuses is :class:`~databus.core.errors.StatementError`; no psycopg2
exception leaves this module.

Every connection (SQL and replication) sets the same session settings
(:data:`SESSION_SETTINGS`), so values are rendered the same way whatever the
server's or role's defaults: ISO dates, timestamps with time zone in UTC,
``bytea`` as hex, shortest exact floats.
"""

from __future__ import annotations

import contextlib
import re
import select
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg2
import psycopg2.errors
import psycopg2.extensions
import psycopg2.extras

from databus.core.errors import (
    ConfigError,
    SourceUnavailableError,
    StatementError,
)
from databus.core.redact import redact_url
from databus.sources.common.urls import parse_server_url

SESSION_SETTINGS = {"DateStyle": "ISO, MDY", "IntervalStyle": "postgres", "TimeZone": "UTC",
                    "bytea_output": "hex", "extra_float_digits": "1"}
"""Settings of every session of the source: the text form of values depends on them."""

_OBJECT_IN_USE = "55006"
_INSUFFICIENT_PRIVILEGE = "42501"
_INVALID_PASSWORD = "28P01"
_INVALID_AUTHORIZATION = "28000"
_INVALID_CATALOG = "3D000"  # no such database
_NO_SUCH_LOGIN = re.compile(r'FATAL:\s+(role|database) ".*" does not exist')


@dataclass(frozen=True)
class PgUrl:
    """Where and how to connect; ``repr`` never shows the password."""

    host: str
    port: int
    user: str
    database: str
    password: str = field(default="", repr=False)
    application_name: str = "databus"  # how the server lists the connections (pg_stat_activity)
    timeout: float = 30.0  # network_timeout: see connect_args

    def where(self) -> str:
        return f"{self.user}@{self.host}:{self.port}/{self.database}"

    def connect_args(self) -> dict[str, Any]:
        options = " ".join(f"-c {k.replace(' ', '')}={v.replace(' ', '')}"
                           for k, v in SESSION_SETTINGS.items())
        args: dict[str, Any] = {"host": self.host, "port": self.port, "user": self.user,
                                "dbname": self.database, "options": options,
                                "connect_timeout": max(2, int(self.timeout)),
                                "application_name": self.application_name,
                                # a silent network (no reset) is noticed within timeout:
                                # while data sent waits for its ACK (tcp_user_timeout),
                                # and while the connection is idle, a replication stream
                                # waiting for changes included (keepalives: the first
                                # after a third of it, then 3 unanswered, 2/9 apart)
                                "tcp_user_timeout": int(self.timeout * 1000),
                                "keepalives": 1,
                                "keepalives_idle": max(1, int(self.timeout / 3)),
                                "keepalives_interval": max(1, int(self.timeout * 2 / 9)),
                                "keepalives_count": 3}
        if self.password:
            args["password"] = self.password
        return args


def parse_pg_url(url: str, *, password: str | None = None) -> PgUrl:
    """``postgresql://USER[:PASS]@HOST[:PORT]/DB`` (URL-encoded parts); ``password``
    (from a file) replaces the URL's."""
    u = parse_server_url(url, kind="postgresql", schemes=("postgresql", "postgres"),
                         port=5432, user="postgres", password=password)
    if not u.path:
        raise ConfigError(f"postgresql URL needs a database: {redact_url(url)!r}"
                          " (postgresql://USER@HOST:PORT/DB)")
    return PgUrl(u.host, u.port, u.user, u.path, u.password)


def _first_line(exc: BaseException) -> str:
    diag = getattr(exc, "diag", None)
    primary = getattr(diag, "message_primary", None)
    text = primary if primary else str(exc)
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a psycopg2 error (None for client-side errors)."""
    code = getattr(exc, "pgcode", None)
    return code if isinstance(code, str) else None


@contextlib.contextmanager
def translated(what: str, url: PgUrl | None = None) -> Iterator[None]:
    """Translate psycopg2 (and socket) errors raised inside (see the module docstring)."""
    where = f" at {url.where()}" if url is not None else ""
    try:
        yield
    except psycopg2.Error as exc:
        code = sqlstate(exc)
        text = _first_line(exc)
        if code in (_INSUFFICIENT_PRIVILEGE, _INVALID_PASSWORD, _INVALID_AUTHORIZATION,
                    _INVALID_CATALOG):
            raise ConfigError(f"{what}{where}: {text}") from exc
        if code == _OBJECT_IN_USE:
            raise SourceUnavailableError(f"{what}{where}: {text}") from exc
        if code is None or isinstance(exc, (psycopg2.OperationalError,
                                            psycopg2.InterfaceError)):
            if ("password authentication failed" in text or "no pg_hba.conf entry" in text
                    or _NO_SUCH_LOGIN.search(text)):
                # libpq reports a refused login (a wrong password, no such role or
                # database) without an SQLSTATE: retrying cannot help
                raise ConfigError(f"{what}{where}: {text}") from exc
            raise SourceUnavailableError(f"{what} failed{where}: {text}") from exc
        raise StatementError(f"{what} failed{where} ({code}): {text}") from exc
    except OSError as exc:
        raise SourceUnavailableError(f"{what} failed{where}: {exc}") from exc


class SqlSession:
    """One autocommit SQL connection, opened on first use and again after it broke."""

    def __init__(self, url: PgUrl) -> None:
        self.url = url
        self._conn: Any = None

    def _connection(self) -> Any:
        if self._conn is None or self._conn.closed:
            with translated("connecting", self.url):
                conn = psycopg2.connect(**self.url.connect_args())
                conn.autocommit = True
            self._conn = conn
        return self._conn

    def query(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        """Rows of one statement (none for statements without a result)."""
        conn = self._connection()
        try:
            with translated("a query", self.url), conn.cursor() as cur:
                cur.execute(sql, params)
                return list(cur.fetchall()) if cur.description is not None else []
        except SourceUnavailableError:
            self.close()
            raise

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg2.Error):
                self._conn.close()
            self._conn = None


def quote_ident(name: str) -> str:
    """An SQL identifier, quoted (``"`` doubled)."""
    return '"' + name.replace('"', '""') + '"'


class ReplicationStream:
    """``START_REPLICATION`` of a logical slot with pgoutput: protocol version 1, or 2
    with ``streaming 'on'`` when ``streaming`` (PostgreSQL 14+).

    :meth:`read` returns the payload of the next message, waiting at most
    ``timeout`` seconds; :meth:`read_many` the payloads of every message already
    received (one translation and no object per message but its payload); :attr:`server_lsn` is where the server says it has
    decoded to (its keepalives); :meth:`confirm` tells the server the slot may
    move to an LSN (it keeps that value and repeats it every ``status_interval``).
    """

    def __init__(self, url: PgUrl, *, slot: str, publication: str, start_lsn: int,
                 status_interval: float = 10.0, streaming: bool = False) -> None:
        self.url = url
        self._conn: Any = None
        self._cur: Any = None
        with translated(f"starting replication of slot {slot}", url):
            conn = psycopg2.connect(
                connection_factory=psycopg2.extras.LogicalReplicationConnection,
                **url.connect_args())
            try:
                cur = conn.cursor()
                cur.start_replication(
                    slot_name=slot, decode=False, start_lsn=max(start_lsn, 0),
                    status_interval=status_interval,
                    options=({"proto_version": "2", "streaming": "on",
                              "publication_names": publication} if streaming else
                             {"proto_version": "1", "publication_names": publication}))
            except BaseException:
                conn.close()
                raise
        self._conn, self._cur = conn, cur

    def read(self, timeout: float) -> tuple[int, bytes] | None:
        """(the message's WAL position, its payload), or None after ``timeout``."""
        cur = self._cur
        with translated("reading the replication stream", self.url):
            msg = cur.read_message()
            if msg is None and timeout > 0:
                select.select([self._conn], [], [], timeout)
                msg = cur.read_message()
        if msg is None:
            return None
        return int(msg.data_start), bytes(msg.payload)

    def read_many(self, timeout: float, limit: int) -> list[bytes]:
        """The payloads of up to ``limit`` messages: those already received, else what
        arrives within ``timeout`` seconds (none: an empty list)."""
        cur = self._cur
        out: list[bytes] = []
        with translated("reading the replication stream", self.url):
            read = cur.read_message
            msg = read()
            if msg is None and timeout > 0:
                select.select([self._conn], [], [], timeout)
                msg = read()
            while msg is not None:
                out.append(msg.payload)
                if len(out) >= limit:
                    break
                msg = read()
        return out

    @property
    def server_lsn(self) -> int:
        """The server's last reported position (keepalives and commits)."""
        return int(self._cur.wal_end or 0)

    def confirm(self, lsn: int) -> None:
        """Let the slot's confirmed flush LSN move up to ``lsn``."""
        with translated("confirming a position to the slot", self.url):
            self._cur.send_feedback(flush_lsn=lsn, force=True)

    def ask_position(self) -> None:
        """Ask the server for a keepalive now (its position: :attr:`server_lsn`)."""
        with translated("asking the server for its position", self.url):
            self._cur.send_feedback(reply=True, force=True)

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg2.Error, OSError):
                self._conn.close()
            self._conn = self._cur = None


def create_slot_exporting(url: PgUrl, slot: str) -> tuple[int, str, Any]:
    """Create logical slot ``slot`` (pgoutput) on a replication connection, exporting
    the snapshot of its consistent point: (that LSN, the snapshot's name, the
    connection, which must stay open until the snapshot was imported; close it
    with :func:`close_quietly`)."""
    with translated(f"creating replication slot {slot}", url):
        conn = psycopg2.connect(
            connection_factory=psycopg2.extras.LogicalReplicationConnection,
            **url.connect_args())
        try:
            cur = conn.cursor()
            cur.create_replication_slot(slot, output_plugin="pgoutput")
            row = cur.fetchone()
        except BaseException:
            conn.close()
            raise
    hi, _, lo = str(row[1]).partition("/")
    return (int(hi, 16) << 32) | int(lo, 16), str(row[2]), conn


def close_quietly(conn: Any) -> None:
    with contextlib.suppress(psycopg2.Error, OSError):
        conn.close()


class SnapshotSession:
    """A read-only REPEATABLE READ transaction on an exported snapshot: every query
    sees the database exactly at the slot's consistent point."""

    def __init__(self, url: PgUrl, snapshot: str) -> None:
        self.url = url
        with translated("importing the slot's snapshot", url):
            conn = psycopg2.connect(**url.connect_args())
            try:
                conn.set_session(isolation_level="REPEATABLE READ", readonly=True)
                with conn.cursor() as cur:
                    cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot,))
            except BaseException:
                conn.close()
                raise
        self._conn = conn
        self._cursors = 0

    def query(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        with translated("a snapshot query", self.url), self._conn.cursor() as cur:
            cur.execute(sql, params)
            return list(cur.fetchall())

    def batches(self, sql: str, size: int) -> Iterator[list[tuple[Any, ...]]]:
        """The rows of ``sql`` in lists of at most ``size`` (a server-side cursor)."""
        self._cursors += 1
        with translated("a snapshot read", self.url):
            cur = self._conn.cursor(name=f"databus_snapshot_{self._cursors}")
        try:
            with translated("a snapshot read", self.url):
                cur.execute(sql)
            while True:
                with translated("a snapshot read", self.url):
                    rows = cur.fetchmany(size)
                if not rows:
                    return
                yield list(rows)
        finally:
            with contextlib.suppress(psycopg2.Error):
                cur.close()

    def close(self) -> None:
        with contextlib.suppress(psycopg2.Error, OSError):
            self._conn.rollback()
            self._conn.close()
