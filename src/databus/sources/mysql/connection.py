"""The driver boundary of the MySQL source: the only module importing pymysql.

Driver errors are translated here, by ONE classifier (:func:`translated` /
:func:`classify`) on named error numbers: a server that cannot be reached, a lost
connection or a server shutting down is a :class:`SourceUnavailableError`
(transient); wrong credentials a :class:`ConfigError`; a purged binlog position
:class:`SourcePositionLostError`; any other statement the server refuses a
:class:`StatementError` (terminal) naming what was being done. Another replica
connecting with this one's ``server_id`` (MariaDB's error 4052, MySQL's 1236 "A slave
with the same server_uuid/server_id") is a :class:`ConfigError` naming the id and the
remedy: retrying would only take the connection back from the other replica, which
then does the same.
"""

from __future__ import annotations

import contextlib
import select
import ssl
import struct
from collections.abc import Iterator
from typing import Any

import pymysql
import pymysql.connections
import pymysql.protocol
from pymysql.constants import COMMAND

from databus.core.errors import (
    ConfigError,
    DatabusError,
    SourcePositionLostError,
    SourceUnavailableError,
    StatementError,
)
from databus.sources.mysql import events as be
from databus.sources.mysql import fastpath
from databus.sources.mysql.checks import MysqlUrl, ServerFacts

# server error numbers this module decides on (MariaDB's mysqld_error.h)
ER_CON_COUNT_ERROR = 1040  # too many connections
ER_ACCESS_DENIED_ERROR = 1045
ER_SERVER_SHUTDOWN = 1053
ER_ABORTING_CONNECTION = 1152
ER_NET_READ_ERROR = 1158
ER_NET_READ_INTERRUPTED = 1159
ER_NET_ERROR_ON_WRITE = 1160
ER_NET_WRITE_INTERRUPTED = 1161
ER_MASTER_FATAL_ERROR_READING_BINLOG = 1236  # the position was purged (or is invalid)
ER_SLAVE_SAME_ID = 4052  # MariaDB: another replica connected with this server_id
_SAME_ID_TEXT = "same server_uuid/server_id"  # MySQL says it with 1236
CR_MIN_CLIENT_ERROR = 2000  # 2000 and up: the client library's (connection) errors
CR_SERVER_LOST = 2013
_TRANSIENT_SERVER_ERRORS = frozenset({
    ER_CON_COUNT_ERROR, ER_SERVER_SHUTDOWN, ER_ABORTING_CONNECTION, ER_NET_READ_ERROR,
    ER_NET_READ_INTERRUPTED, ER_NET_ERROR_ON_WRITE, ER_NET_WRITE_INTERRUPTED})


def error_number(exc: BaseException) -> int | None:
    """The MySQL error number of a pymysql error (None when it has none)."""
    args = getattr(exc, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def classify(exc: BaseException, what: str, url: MysqlUrl | None = None, *,
             server_id: int | None = None
             ) -> ConfigError | SourcePositionLostError | SourceUnavailableError | StatementError:
    """The project's error for a pymysql error (or OSError) raised while doing ``what``
    (``server_id``: the replica id of a binlog dump, named when another replica takes it)."""
    number = error_number(exc)
    where = f" at {url.host}:{url.port}" if url is not None else ""
    text = str(exc.args[1]) if number is not None and len(exc.args) > 1 else str(exc)
    if number == ER_ACCESS_DENIED_ERROR and url is not None:
        return ConfigError(f"access denied for {url.user}@{url.host}:{url.port}")
    if number == ER_SLAVE_SAME_ID or (number == ER_MASTER_FATAL_ERROR_READING_BINLOG
                                      and _SAME_ID_TEXT in text):
        sid = f"server_id {server_id}" if server_id is not None else "this relay's server_id"
        return ConfigError(
            f"another replica connected{where} with {sid} and the server dropped this"
            f" relay's binlog dump ({text.split(';')[0]}): each relay needs its own"
            " server_id: set server_id: (--server-id) or give each relay its own name"
            " (--name, name:), from which the id is derived")
    if number == ER_MASTER_FATAL_ERROR_READING_BINLOG:
        return SourcePositionLostError(
            f"binlog position is gone (purged?) while {what}: {text}; consumers must bootstrap")
    if (isinstance(exc, OSError) or number is None or number >= CR_MIN_CLIENT_ERROR
            or number in _TRANSIENT_SERVER_ERRORS):
        return SourceUnavailableError(f"{what} failed{where}: {text}")
    return StatementError(f"{what} failed{where} (error {number}): {text}")


@contextlib.contextmanager
def translated(what: str, url: MysqlUrl | None = None) -> Iterator[None]:
    """Translate pymysql errors (and socket errors) raised inside (see :func:`classify`)."""
    try:
        yield
    except (pymysql.err.Error, OSError) as exc:
        raise classify(exc, what, url) from exc


def tls_context(url: MysqlUrl) -> ssl.SSLContext | None:
    """The TLS context of ``url`` (None: plain). Built here rather than by pymysql,
    which verifies nothing when no CA file is given: asking for TLS verifies the
    server (the system's CAs by default) unless ``verify`` is false."""
    tls = url.tls
    if tls is None:
        return None
    try:
        ctx = ssl.create_default_context(cafile=str(tls.ca_file) if tls.ca_file else None)
        if tls.cert_file is not None:
            ctx.load_cert_chain(str(tls.cert_file),
                                str(tls.key_file) if tls.key_file is not None else None)
    except (OSError, ssl.SSLError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"source TLS files unusable: {why}") from exc
    if not tls.verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def connect(url: MysqlUrl) -> Any:
    """A pymysql connection (autocommit), over TLS when ``url.tls`` asks for it, else
    plain: pymysql (1.2) would otherwise try an unverified TLS upgrade on its own, and build
    a default TLS context (the system's CA store, ~45 ms) for every connection.

    Every wait on the server has ``url.timeout`` as its deadline: the connect, each read
    and each send. Without a read deadline a query sent just before the network dropped
    packets silently (no reset) would wait for as long as the kernel retransmits (~15
    minutes), capture stalled and reported running (tests/faults/test_mariadb_cut.py)."""
    ctx = tls_context(url)
    with translated("connecting to MySQL/MariaDB", url):
        return pymysql.connect(host=url.host, port=url.port, user=url.user,
                               password=url.password, autocommit=True,
                               connect_timeout=max(1, int(url.timeout)),
                               read_timeout=url.timeout, write_timeout=url.timeout,
                               ssl=ctx, ssl_disabled=ctx is None)


def server_facts(url: MysqlUrl) -> ServerFacts:
    """Version, binlog-related global variables and the user's grants."""
    con = connect(url)
    try:
        with translated("reading server settings", url), con.cursor() as cur:
            cur.execute("SELECT VERSION()")
            version = str(cur.fetchone()[0])
            cur.execute("SHOW GLOBAL VARIABLES WHERE Variable_name IN ('log_bin',"
                        " 'binlog_format', 'binlog_row_image', 'binlog_row_metadata',"
                        " 'server_id', 'binlog_checksum', 'gtid_mode', 'log_bin_compress',"
                        " 'binlog_transaction_compression', 'binlog_row_value_options',"
                        " 'encrypt_binlog')")
            variables = {str(k): str(v) for k, v in cur.fetchall()}
            cur.execute("SHOW GRANTS")
            grants = [str(r[0]) for r in cur.fetchall()]
    finally:
        con.close()
    return ServerFacts(version, variables, grants)


_COM_BINLOG_DUMP = 0x12
_COM_REGISTER_SLAVE = 0x15
_ER_SPECIFIC_ACCESS_DENIED = 1227  # SHOW SLAVE HOSTS needs REPLICATION MASTER ADMIN


def check_replica_id(con: Any, url: MysqlUrl, server_id: int, report_host: str) -> None:
    """Refuse (:class:`ConfigError`, naming both) to dump as ``server_id`` while another
    replica registered it (``SHOW SLAVE HOSTS``): the server would drop that replica's
    connection for this one. A replica registered under ``report_host`` is this relay's
    own earlier connection (a restart before the server noticed the old one go): the
    new dump replaces it. Without the right to list replicas (MariaDB's REPLICATION
    MASTER ADMIN, MySQL's REPLICATION SLAVE) nothing is checked here; a clash then
    shows as the server's error when the dump starts (:func:`classify`)."""
    try:
        with con.cursor() as cur:
            cur.execute("SHOW SLAVE HOSTS")
            rows = cur.fetchall()
    except pymysql.err.Error as exc:
        err = classify(exc, "listing replicas", url)
        if isinstance(err, SourceUnavailableError):
            raise err from exc
        return  # not allowed to look (or no such statement): the dump's error tells
    for row in rows:
        other, host = int(row[0]), str(row[1] or "")
        if other == server_id and host != report_host:
            raise ConfigError(
                f"server_id {server_id} is already used by replica {host or '(unnamed)'!r}"
                f" of {url.host}:{url.port}; this relay ({report_host!r}) would take its"
                " connection: give each relay its own server_id (server_id:, --server-id)"
                " or its own name (--name, name:), from which the id is derived")


def _register_replica(con: Any, server_id: int, report_host: str) -> None:
    """``COM_REGISTER_SLAVE``: listed by ``SHOW SLAVE HOSTS`` as ``report_host`` while
    the connection lives."""
    host = report_host.encode()[:60]
    # server id u32, host (length-prefixed), user and password (empty), port u16,
    # replication rank u32, master id u32
    payload = (struct.pack("<I", server_id) + bytes([len(host)]) + host + b"\x00\x00"
               + struct.pack("<HII", 0, 0, 0))
    con._execute_command(_COM_REGISTER_SLAVE, payload)
    con._read_packet()  # OK, or an error packet pymysql raises
_COM_BINLOG_DUMP_GTID = 0x1E
_THROUGH_GTID = 0x04  # flag: the GTID set is given as data


def dump_gtid_packet(server_id: int, gtid_set: str) -> bytes:
    """The ``COM_BINLOG_DUMP_GTID`` request: start after ``gtid_set`` (MySQL)."""
    from databus.sources.mysql.events import mysql_gtid_set

    try:
        data = mysql_gtid_set(gtid_set)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    # command, flags u16, server id u32, file name length u32 (0), position u64 (4),
    # data size u32, data
    return (struct.pack("<BHIIQ", _COM_BINLOG_DUMP_GTID, _THROUGH_GTID, server_id, 0, 4)
            + struct.pack("<I", len(data)) + data)


_MAX_PACKET = 0xFFFFFF  # a payload this long continues in the next packet
_CHUNK = 256 * 1024  # bytes asked of the socket per receive
_MAX_RECV = 4 << 20  # at most, when a long event is missing more
_U32 = struct.Struct("<I").unpack_from
_CUT = 32  # events cut per C call: more alive at once cost the garbage collector more


class BinlogStream:
    """Reads the binlog as a replica (``COM_BINLOG_DUMP``) from ``file``/``pos``.

    :meth:`read` returns the bytes of the next event (header included), or
    ``None`` when the server ended the stream. With ``gtid`` the dump starts
    right after that GTID state instead, wherever it is in the server's binlog
    files: MariaDB's ``0-1-100`` (``@slave_connect_state``), or with
    ``mariadb=False`` a MySQL GTID set ``uuid:1-100`` (``COM_BINLOG_DUMP_GTID``,
    written to the protocol's documentation; no MySQL server is tested here). The checksum algorithm the
    server uses is announced (``@master_binlog_checksum``) so events arrive
    with their CRC32, and ``checksum`` tells whether they carry one. A
    heartbeat event arrives every ``heartbeat`` seconds while the server is
    idle, so a dead connection is noticed within ``read_timeout``.

    After the dump command the stream reads the socket itself, in chunks of up to
    256 KiB, and cuts packets out of what it received: an event costs a slice, not
    a socket read (pymysql reads each packet's header and payload apart). Every
    event received whole is returned by :meth:`read` without waiting, and
    :meth:`pending` is True while any is held. :meth:`next_event` gives the same events
    with their headers parsed (:func:`.events.parse_header`), cutting up to 32 whole
    ones the stream holds per C call (``_rowcodec.frames``). Errors are those of
    pymysql's reader, classified the same way (:func:`classify`).
    """

    def __init__(self, url: MysqlUrl, *, server_id: int, file: str, pos: int,
                 heartbeat: float = 1.0, read_timeout: float = 10.0,
                 gtid: str | None = None, mariadb: bool = True,
                 report_host: str = "") -> None:
        """``report_host``: register as a replica under this name (``COM_REGISTER_SLAVE``,
        shown by ``SHOW SLAVE HOSTS``) after checking no other replica registered
        ``server_id`` (:func:`check_replica_id`); empty: neither."""
        self.server_id = server_id
        self._con = connect(url)
        try:
            if report_host:
                check_replica_id(self._con, url, server_id, report_host)
                _register_replica(self._con, server_id, report_host)
            with self._con.cursor() as cur:
                cur.execute("SELECT @@global.binlog_checksum")
                self.checksum = str(cur.fetchone()[0]).upper() == "CRC32"
                cur.execute("SET @master_binlog_checksum = @@global.binlog_checksum")
                cur.execute("SET @mariadb_slave_capability = 4")  # GTID-aware replica
                cur.execute(f"SET @master_heartbeat_period = {int(heartbeat * 1e9)}")
                if gtid is not None and mariadb:
                    # MariaDB: start after this GTID state (domain-server-seq, ...);
                    # the server then ignores file and position
                    cur.execute("SET @slave_connect_state = %s", (gtid,))
                    cur.execute("SET @slave_gtid_strict_mode = 1")
                    file, pos = "", 4
            if gtid is not None and not mariadb:
                payload = dump_gtid_packet(server_id, gtid)
            else:
                payload = struct.pack("<BIHI", _COM_BINLOG_DUMP, pos, 0, server_id) + file.encode()
            self._con._write_bytes(struct.pack("<I", len(payload))[:3] + b"\x00" + payload)
            # every answer to the statements above was read whole (pymysql's buffered
            # reader holds nothing): from here on the socket is read here only
            self._sock = self._con._sock
            self._sock.settimeout(read_timeout)
        except pymysql.err.Error as exc:
            self._con.close()
            raise classify(exc, "starting the binlog dump", server_id=server_id) from exc
        except BaseException:
            self._con.close()
            raise
        self._buf = b""  # received, not yet returned: packets from _off on
        self._off = 0
        self._seq = 1  # the sequence number of the next packet
        self._frames = fastpath.frames()
        self._ready: list[tuple[be.EventHeader, memoryview]] = []  # cut, not yet returned

    def next_event(self) -> tuple[be.EventHeader, memoryview] | None:
        """:meth:`read` and :func:`.events.parse_header` in one: the next event's header
        and body, or None when the server ended the stream. Never mix with :meth:`read`."""
        ready = self._ready
        if ready:  # cut in C, last first
            return ready.pop()
        if self._frames is not None and len(self._buf) - self._off >= 24:
            cut: list[tuple[be.EventHeader, memoryview]]
            cut, self._off, self._seq = self._frames(self._buf, self._off, self._seq,
                                                     self.checksum, be.EventHeader, _CUT)
            if cut:
                self._ready = cut
                return cut.pop()
        raw = self.read()  # a partial, long or special packet: as always
        return None if raw is None else be.parse_header(raw, self.checksum)

    def read(self) -> bytes | None:
        buf, off = self._buf, self._off
        if len(buf) - off >= 5:  # the common case: one whole packet, already received
            word = _U32(buf, off)[0]
            length = word & _MAX_PACKET
            end = off + 4 + length
            if (end <= len(buf) and word >> 24 == self._seq and length < _MAX_PACKET
                    and buf[off + 4] == 0):
                self._seq = (self._seq + 1) & 0xFF
                self._off = end
                return buf[off + 5 : end]  # after the OK marker
        return self._read_packet()

    def _read_packet(self) -> bytes | None:
        """One whole payload (packets of 16 MiB joined), waiting for it as needed."""
        parts: list[bytes] = []
        while True:
            self._need(4)
            word = _U32(self._buf, self._off)[0]
            length, seq = word & _MAX_PACKET, word >> 24
            if seq != self._seq:
                self._con._force_close()
                raise SourceUnavailableError(
                    "reading the binlog stream failed: the server ended the connection"
                    if seq == 0 else  # MariaDB sends an error numbered 0 when it shuts down
                    f"reading the binlog stream failed: packet number {seq}, expected"
                    f" {self._seq}")
            self._seq = (seq + 1) & 0xFF
            self._off += 4
            self._need(length)
            parts.append(self._buf[self._off : self._off + length])
            self._off += length
            if length < _MAX_PACKET:
                break
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        if data[:1] == b"\xfe" and len(data) < 9:
            return None  # EOF: the server ended the dump
        if data[:1] == b"\xff":
            try:
                pymysql.err.raise_mysql_exception(data)
            except pymysql.err.Error as exc:
                raise classify(exc, "reading the binlog stream",
                               server_id=self.server_id) from exc
        return data[1:]

    def _need(self, n: int) -> None:
        """Receive until ``n`` bytes from ``_off`` on are held (joined once: an event of
        many chunks is not copied per chunk)."""
        have = len(self._buf) - self._off
        if have >= n:
            return
        parts = [self._buf[self._off:]] if have else []
        while have < n:
            try:
                data = self._sock.recv(min(max(_CHUNK, n - have), _MAX_RECV))
            except OSError as exc:
                self._con._force_close()
                raise classify(exc, "reading the binlog stream") from exc
            if not data:
                self._con._force_close()
                raise SourceUnavailableError(
                    "reading the binlog stream failed: the server closed the connection")
            parts.append(data)
            have += len(data)
        self._buf = parts[0] if len(parts) == 1 else b"".join(parts)
        self._off = 0

    def pending(self) -> bool:
        """Whether the server has sent more than what was read (no blocking)."""
        if self._ready or self._off < len(self._buf):
            return True
        sock = self._sock
        try:
            if sock.fileno() < 0:
                return False
            if isinstance(sock, ssl.SSLSocket) and sock.pending():
                return True  # decrypted bytes select cannot see
            return bool(select.select([sock], [], [], 0)[0])
        except (OSError, ValueError):
            return False

    def __enter__(self) -> BinlogStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Idempotent; also after the stream failed (the socket is then closed)."""
        with contextlib.suppress(pymysql.err.Error):
            self._con.close()


def collations(url: MysqlUrl) -> dict[int, str]:
    """Collation id -> character set name, from the server's own table."""
    con = connect(url)
    try:
        with translated("reading the server's collations", url), con.cursor() as cur:
            cur.execute("SELECT ID, CHARACTER_SET_NAME FROM information_schema.COLLATIONS"
                        " WHERE ID IS NOT NULL")
            out = {int(r[0]): str(r[1]) for r in cur.fetchall()}
            try:  # MariaDB 10.10+: collations shared by several character sets
                cur.execute("SELECT ID, CHARACTER_SET_NAME FROM"
                            " information_schema.COLLATION_CHARACTER_SET_APPLICABILITY"
                            " WHERE ID IS NOT NULL")
                out.update({int(r[0]): str(r[1]) for r in cur.fetchall()})
            except pymysql.err.Error:
                pass  # MySQL: the table has no ID column
            return out
    finally:
        con.close()


def binary_logs(url: MysqlUrl) -> list[tuple[str, int]]:
    """``SHOW BINARY LOGS``: (file, size) oldest first."""
    con = connect(url)
    try:
        with translated("SHOW BINARY LOGS", url), con.cursor() as cur:
            cur.execute("SHOW BINARY LOGS")
            return [(str(r[0]), int(r[1])) for r in cur.fetchall()]
    finally:
        con.close()


def binlog_behind(url: MysqlUrl, file: str, pos: int) -> int | None:
    """Bytes of binlog after ``pos`` of ``file`` up to the server's end (``SHOW BINARY
    LOGS``); None when it cannot be read now or ``file`` is no longer listed (a gauge:
    never worth an error)."""
    try:
        logs = binary_logs(url)
    except DatabusError:
        return None
    names = [n for n, _ in logs]
    if file not in names:
        return None
    i = names.index(file)
    return max(logs[i][1] - pos, 0) + sum(size for _, size in logs[i + 1:])


def master_status(url: MysqlUrl) -> tuple[str, int]:
    """The server's current binlog file and position (where new changes will go)."""
    con = connect(url)
    try:
        with translated("SHOW MASTER STATUS", url), con.cursor() as cur:
            cur.execute("SHOW MASTER STATUS")
            row = cur.fetchone()
    finally:
        con.close()
    if row is None:
        raise SourceUnavailableError("SHOW MASTER STATUS returned nothing: is log_bin on?")
    return str(row[0]), int(row[1])


class SqlSession:
    """One autocommit SQL connection, reopened after a failure; session in UTC.

    Errors are translated: a lost server is :class:`SourceUnavailableError`,
    a statement the server refuses is :class:`StatementError` (the message
    names the statement's error).
    """

    def __init__(self, url: MysqlUrl) -> None:
        self.url = url
        self._con: Any = None

    def _connection(self) -> Any:
        if self._con is None:
            con = connect(self.url)
            try:
                with con.cursor() as cur:
                    cur.execute("SET time_zone = '+00:00'")
            except pymysql.err.Error as exc:
                con.close()
                raise classify(exc, "setting up a SQL session", self.url) from exc
            self._con = con
        return self._con

    def query(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        con = self._connection()
        with self._errors(), con.cursor() as cur:
            cur.execute(sql, params)
            return list(cur.fetchall())

    def query_raw(self, sql: str, params: Any = None) -> RawResult:
        """A ``SELECT`` whose rows stay as the server's text-protocol row packets
        (for the compiled snapshot reader); :meth:`RawResult.convert` gives a row
        as :meth:`query` would."""
        con = self._connection()
        with self._errors():
            with con.cursor() as cur:
                text = cur.mogrify(sql, params)
            # pymysql's Connection.query, with a result class that keeps the packets
            con._execute_command(COMMAND.COM_QUERY, text.encode(con.encoding))
            con._result = None
            result = _RawRows(con)
            result.read()
            con._result = result
            if result.server_status is not None:
                con.server_status = result.server_status
            return RawResult(result, str(con.encoding))

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except pymysql.err.Error as exc:
            err = classify(exc, "a SQL statement")
            if isinstance(err, SourceUnavailableError):
                self.close()  # the connection is gone: the next statement reconnects
            raise err from exc

    def close(self) -> None:
        if self._con is not None:
            with contextlib.suppress(Exception):
                self._con.close()
            self._con = None


class _RawRows(pymysql.connections.MySQLResult):
    """A pymysql result whose rows are the row packets' bytes, unconverted.

    With the compiled codec, the row packets the socket has buffered are split
    off in C (``_rowcodec.scan_rows``); pymysql reads the rest (a packet that
    straddles the buffer, the EOF or error packet, packets of 16 MB or more),
    so the sequence numbers and errors are checked as pymysql checks them."""

    def _read_row_from_packet(self, packet: Any) -> bytes:
        return bytes(packet.get_all_data())

    def _read_rowdata_packet(self) -> None:
        base: Any = pymysql.connections.MySQLResult  # what the stubs leave out
        scan = fastpath.scan_rows()
        if scan is None:
            base._read_rowdata_packet(self)
            return
        con: Any = self.connection
        rows: list[bytes] = []
        while True:
            try:
                data = con._rfile.peek(1)
            except OSError as exc:
                con._force_close()
                raise pymysql.err.OperationalError(
                    CR_SERVER_LOST, f"Lost connection to MySQL server during query ({exc})") from exc
            got, used, seq = scan(data, con._next_seq_id)
            if used:
                con._rfile.read(used)
                con._next_seq_id = seq
                rows += got
                continue
            packet = con._read_packet()  # not a plain buffered row: pymysql's way
            if base._check_packet_is_eof(self, packet):
                self.connection = None
                break
            rows.append(self._read_row_from_packet(packet))
        self.affected_rows = len(rows)
        self.rows = tuple(rows)


class RawResult:
    """Rows of a ``SELECT`` as text-protocol packets (see :meth:`SqlSession.query_raw`).

    ``columns``: per column ``(field type, charset number, encoding)``, where the
    encoding is the one pymysql decodes the column's text with (None: kept as
    bytes); ``signature``: the result's column descriptions, compared to tell
    a changed table definition.
    """

    def __init__(self, result: Any, encoding: str) -> None:
        self._result = result
        self.encoding = encoding
        self.rows: list[bytes] = list(result.rows or ())
        self.columns: list[tuple[int, int, str | None]] = [
            (int(f.type_code), int(f.charsetnr), enc)
            for f, (enc, _conv) in zip(result.fields or [], result.converters or [],
                                       strict=True)]
        # what a column-changing DDL changes: type, charset, length, scale, flags
        self.signature: tuple[tuple[int, ...], ...] = tuple(
            (int(f.type_code), int(f.charsetnr), int(f.length), int(f.scale), int(f.flags))
            for f in result.fields or [])

    def convert(self, raw: bytes) -> tuple[Any, ...]:
        """One row packet -> the row :meth:`SqlSession.query` gives."""
        packet = pymysql.protocol.MysqlPacket(raw, self.encoding)
        base: Any = pymysql.connections.MySQLResult  # the converting row reader
        return tuple(base._read_row_from_packet(self._result, packet))
