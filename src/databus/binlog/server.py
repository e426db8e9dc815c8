"""The binlog dumper: a MySQL wire-protocol server that serves the store's binlog files.

Replication clients (python-mysql-replication, ``mariadb-binlog --read-from-remote-server``,
Debezium's MySQL connector, Canal, Maxwell) connect as to a MySQL 8 source: handshake,
``mysql_native_password`` with the one user of the password file, TLS when a certificate
is configured (then required: a client that does not upgrade is refused with MySQL's
error 3159), the SQL of :mod:`databus.binlog.sql`, then ``COM_REGISTER_SLAVE`` and
``COM_BINLOG_DUMP`` / ``COM_BINLOG_DUMP_GTID`` (:mod:`databus.binlog.dump`).

Built on ``mysql-mimic`` (handshake, authentication, TLS upgrade, COM_QUERY and its result
sets, through sqlglot). mysql-mimic has no replication commands and dispatches commands in
one closed loop (``Connection.command_phase``), so the extension is at the narrowest point
there is: the connection's packet stream
(:class:`~databus.binlog.transport.ReplicationStream`) hands the three replication
commands (and ``COM_CHANGE_USER``, refused: see below) to :class:`BinlogConnection`
before mysql-mimic's loop sees them; every other command is mysql-mimic's. Three corrections of mysql-mimic 3.0.5 are made here too, two of them
security:

* a failed authentication writes the error packet but then goes on to the command phase
  (a client that ignores the error could send queries): here a connection whose login
  failed is closed;
* a failed ``COM_CHANGE_USER`` leaves the session logged in as before: refused here
  (replication clients never send it);
* its TLS upgrade loses the TLS bytes a client sent right behind its SSL request when
  they were read together with it (the client's handshake then hangs until asyncio's
  60 s TLS handshake timeout): the stream's own
  :meth:`~databus.binlog.transport.ReplicationStream.start_tls` hands them to TLS.

Unknown user names get the same "Access denied" as a wrong password (no user probing).
A dump ends the connection afterwards, as in MySQL (COM_BINLOG_DUMP is a connection's
last command). Every error a client causes is a MySQL error packet; the server itself
keeps running.

Threading: one asyncio loop (:meth:`BinlogServer.run` in its own thread or the CLI's main
thread); the store is read from the loop (thread-safe), and one notifier thread wakes
waiting dumps.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import ssl
import struct
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mysql_mimic.auth import (
    IdentityProvider,
    NativePasswordAuthPlugin,
    User,
)
from mysql_mimic.connection import Connection
from mysql_mimic.control import LocalControl, TooManyConnections
from mysql_mimic.errors import ErrorCode, MysqlError
from mysql_mimic.stream import ConnectionClosed, MysqlStream

from databus.binlog.catalog import AnnouncedCatalog, Catalog
from databus.binlog.chunks import FramedChunks
from databus.binlog.config import BinlogServiceConfig
from databus.binlog.dump import Dumper, DumpOptions
from databus.binlog.framing import frame_packet
from databus.binlog.notifier import StoreNotifier
from databus.binlog.request import (
    DumpError,
    DumpRequest,
    parse_binlog_dump,
    parse_binlog_dump_gtid,
)
from databus.binlog.sql import BinlogSession, ServiceFacts
from databus.binlog.store import BinlogStore
from databus.binlog.transport import DumpWriter, ReplicationStream
from databus.core.errors import TerminalError
from databus.core.mysqlwire import COM_BINLOG_DUMP, COM_CHANGE_USER, COM_REGISTER_SLAVE
from databus.serving.config import TlsServerConfig

if TYPE_CHECKING:
    from databus.binlog.convert import BinlogConverter
    from databus.client.metrics import ConsumerMetrics
    from databus.serving.metrics_port import MetricsServer

log = logging.getLogger("databus.binlog.server")

ER_SECURE_TRANSPORT_REQUIRED = 3159
ER_ACCESS_DENIED = 1045


@dataclass(frozen=True)
class ServerOptions:
    """Where and how the dumper listens."""

    host: str = "127.0.0.1"
    port: int = 3306
    user: str = "databus"
    password: str = field(default="", repr=False)
    tls: TlsServerConfig | None = None  # with client_ca_file: mutual TLS
    max_connections: int = 256
    default_heartbeat: float = 0.0  # seconds, for clients that set no heartbeat period

    def ssl_context(self) -> ssl.SSLContext | None:
        """The server's TLS context, or None without TLS (a ConfigError naming the file
        that does not load)."""
        return self.tls.server_context() if self.tls is not None else None


class _OneUser(IdentityProvider):  # type: ignore[misc]
    """The password file's one user. Any other name gets a user whose hash matches no
    password, so it fails exactly like a wrong password."""

    def __init__(self, user: str, password: str) -> None:
        self._user = user
        self._hash = NativePasswordAuthPlugin.create_auth_string(password)
        self._nobody = secrets.token_hex(20)

    def get_plugins(self) -> list[Any]:
        return [NativePasswordAuthPlugin()]

    async def get_user(self, username: str) -> User:
        if secrets.compare_digest(username.encode(), self._user.encode()):
            return User(name=username, auth_string=self._hash,
                        auth_plugin=NativePasswordAuthPlugin.name)
        return User(name=username, auth_string=self._nobody,
                    auth_plugin=NativePasswordAuthPlugin.name)


MARIADB_VERSION_PREFIX = "5.5.5-"
"""What ``VERSION()`` starts with for MariaDB's ``mysqlbinlog`` (see :func:`client_version`)."""


def client_version(version: str, connect_attrs: dict[str, str] | None) -> str:
    """The ``VERSION()`` answered to one client: ``version`` (MySQL 8's), except for
    MariaDB's ``mariadb-binlog`` / ``mysqlbinlog`` (connection attributes ``_client_name``
    ``libmariadb`` and ``program_name`` ``mysqlbinlog`` or ``mariadb-binlog``), which
    refuses every server whose version does not start with a major version it knows
    (3, 4, 5 and MariaDB's 10, 11: ``check_master_version`` in MariaDB's
    client/mysqlbinlog.cc) and reads nothing else from it. It gets ``5.5.5-`` + version:
    the prefix MariaDB's own servers put before their 10.x versions for exactly such
    clients. Every other client (Oracle's mysqlbinlog, python-mysql-replication,
    Debezium, ...) sees MySQL 8's version, which they use to pick MySQL 8 behaviour.
    The handshake and the binlog's Format_description always carry ``version``."""
    attrs = connect_attrs or {}
    if attrs.get("_client_name") == "libmariadb" and \
            attrs.get("program_name") in ("mysqlbinlog", "mariadb-binlog"):
        return MARIADB_VERSION_PREFIX + version
    return version


def _error_packet(code: int, message: str, sqlstate: bytes = b"HY000") -> bytes:
    return b"\xff" + struct.pack("<H", code) + b"#" + sqlstate + message.encode("utf-8")


class BinlogConnection(Connection):  # type: ignore[misc]
    """One client: mysql-mimic's connection plus the replication commands."""

    def __init__(self, *args: Any, server: BinlogServer, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._server = server
        self.replica: dict[str, object] = {}

    def _tls_active(self) -> bool:
        return self.stream.writer.get_extra_info("ssl_object") is not None

    async def authenticate(self, *args: Any, **kwargs: Any) -> None:
        if self.ssl is not None and not self._tls_active():
            await self.stream.write(_error_packet(
                ER_SECURE_TRANSPORT_REQUIRED,
                "Connections using insecure transport are prohibited while"
                " --require_secure_transport=ON."))
            return
        version = client_version(self._server.facts.version, kwargs.get("connect_attrs"))
        if version != self._server.facts.version:
            self.session.variables.set("version", version, force=True)
        try:
            await super().authenticate(*args, **kwargs)
        finally:
            # the plugin's exchange is an async generator mysql-mimic leaves at its last
            # answer; closed here, not by the loop's finalizer in a task of its own woken
            # through its self-pipe (~0.05 ms of every connection). A client answering
            # with another plugin gets a second exchange this does not see (the
            # finalizer closes that one); the clients tested here answer with the server's
            state = kwargs.get("auth_state")
            if state is not None:
                await state.aclose()

    async def command_phase(self) -> None:
        if self.session.username is None:
            return  # login failed: the error packet is written; close (see module doc)
        self.stream.intercept = self._replication_command
        await super().command_phase()

    async def _replication_command(self, data: bytes) -> None:
        command, body = data[0], data[1:]
        if command == COM_CHANGE_USER:
            await self.stream.write(self.error(
                msg="COM_CHANGE_USER is not supported by the databus binlog server",
                code=ErrorCode.UNKNOWN_COM_ERROR))
            return
        if command == COM_REGISTER_SLAVE:
            self._register(body)
            await self.stream.write(self.ok())
            return
        try:
            request = (parse_binlog_dump(body) if command == COM_BINLOG_DUMP
                       else parse_binlog_dump_gtid(body))
            await self._dump(request)
        except DumpError as exc:
            log.info("binlog dump for %s ended: %s", self._peer(), exc)
            await self.stream.write(_error_packet(exc.errno, str(exc)))
            await self.stream.drain()
        except (ConnectionError, ConnectionClosed):
            pass
        raise ConnectionClosed()  # a dump is a connection's last command, as in MySQL

    def _peer(self) -> str:
        peer = self.stream.writer.get_extra_info("peername")
        return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)

    def _register(self, body: bytes) -> None:
        """COM_REGISTER_SLAVE: server_id u32, host, user, password (length-prefixed),
        port u16; kept for SHOW REPLICAS, and a malformed one is ignored as MySQL does."""
        try:
            (sid,) = struct.unpack_from("<I", body, 0)
            off, parts = 4, []
            for _ in range(3):
                n = body[off]
                parts.append(body[off + 1:off + 1 + n].decode("utf-8", "replace"))
                off += 1 + n
            (port,) = struct.unpack_from("<H", body, off)
        except (IndexError, struct.error):
            return
        self.replica = {"server_id": sid, "host": parts[0], "port": port,
                        "connection_id": self.connection_id}

    async def _dump(self, request: DumpRequest) -> None:
        session = self.session
        assert isinstance(session, BinlogSession)
        period = session.heartbeat_period()
        options = DumpOptions(checksum=session.checksum_choice(),
                              heartbeat_period=(self._server.options.default_heartbeat
                                                if period is None else period))
        srv = self._server
        dumper = Dumper(srv.store, srv.notifier, request, options, server_id=srv.server_id,
                        chunks=srv.chunks)
        stream = self.stream
        seq = stream.seq
        stream.intercept = None
        out = DumpWriter(stream.writer)
        srv.dumps += 1
        log.info("binlog dump for %s from %s", self._peer(),
                 f"GTIDs {request.gtids}" if request.gtids is not None
                 else f"{request.file or '(first file)'}:{request.pos}")
        if request.non_blocking:
            # it ends by itself at the binlog's end; a client that left fails a write.
            # No watcher task: ~0.1 ms less of every mariadb-binlog run's set-up
            try:
                try:
                    await dumper.run(out.write, out.flush, seq)
                except DumpError:
                    await out.flush()  # the events before the error, then its packet
                    raise
                # the end of a non-blocking dump, sent with its last events
                out.write(frame_packet(self.ok_or_eof(), seq))
                await out.flush()
            finally:
                srv.dumps -= 1
                out.close()
            return
        # a replication client sends nothing during a dump: a read that returns means it
        # left, which ends a dump waiting for data that may never come
        gone = asyncio.ensure_future(stream.reader.read(1))
        work = asyncio.ensure_future(dumper.run(out.write, out.flush, seq))
        try:
            await asyncio.wait({gone, work}, return_when=asyncio.FIRST_COMPLETED)
            if work.done():
                # a blocking dump ends only by an error: DumpError and socket errors
                # propagate (the non-blocking ends are the branch above)
                try:
                    work.result()
                except DumpError:
                    await out.flush()  # the events before the error, then its packet
                    raise
        finally:
            srv.dumps -= 1
            for task in (gone, work):
                task.cancel()
            await asyncio.gather(gone, work, return_exceptions=True)
            out.close()


class BinlogServer:
    """The dumper over one store: accepts clients until :meth:`stop`.

    ``catalog`` gives the captured tables' columns (information_schema.COLUMNS, SHOW
    CREATE TABLE); ``facts`` the service's values that SQL answers (version, ids, ...).
    """

    def __init__(self, store: BinlogStore, options: ServerOptions, facts: ServiceFacts,
                 catalog: Catalog | None = None) -> None:
        self.store = store
        self.options = options
        self.facts = facts
        self.catalog = catalog
        self.server_id = facts.server_id
        self._ssl = options.ssl_context()
        self._identity = _OneUser(options.user, options.password)
        self._control = LocalControl(server_id=facts.server_id & 0xFFFF)
        self._tasks: set[asyncio.Task[None]] = set()
        self._connections: dict[int, BinlogConnection] = {}
        self._server: asyncio.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self.notifier: StoreNotifier
        self.dumps = 0
        self.chunks = FramedChunks()  # shared by every dump (see FramedChunks)
        self.ready = threading.Event()
        self.port = options.port

    def replicas(self) -> list[dict[str, object]]:
        """The registered replicas now connected (SHOW REPLICAS)."""
        return [c.replica for c in self._connections.values() if c.replica]

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        stream = ReplicationStream(MysqlStream(reader, writer))
        conn: BinlogConnection | None = None
        session: BinlogSession | None = None
        conn_id = 0
        try:
            session = BinlogSession(self.facts, self.store, self.catalog, self.replicas)
            conn = BinlogConnection(stream=stream, session=session, control=self._control,
                                    identity_provider=self._identity, ssl=self._ssl,
                                    server=self)
            if len(self._connections) >= self.options.max_connections:
                raise TooManyConnections()
            conn_id = await self._control.add(conn)
            conn.connection_id = conn_id
            self._connections[conn_id] = conn
            await conn.start()
        except TooManyConnections:
            await _write_raw(writer, _error_packet(1040, "Too many connections", b"08004"))
        except (ConnectionError, ConnectionClosed, asyncio.IncompleteReadError, ssl.SSLError):
            pass  # the client went away
        except asyncio.CancelledError:
            pass  # shutdown
        except MysqlError as exc:  # a malformed handshake: mimic wrote the error already
            log.debug("client %s: %s", writer.get_extra_info("peername"), exc)
        except Exception:  # broad: one client's surprise must not stop the server
            log.exception("binlog server: connection failed")
        finally:
            if session is not None:
                self.store.release(session)  # a read lock ends with its connection
            if conn_id:
                self._connections.pop(conn_id, None)
                await self._control.remove(conn_id)
            writer.close()
            with contextlib.suppress(ConnectionError, ssl.SSLError, asyncio.CancelledError):
                await writer.wait_closed()
            self._tasks.discard(task)

    async def serve(self) -> None:
        """Listen, serve until :meth:`stop`, then close every connection."""
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self.notifier = StoreNotifier(self.store, self._loop)
        try:
            try:
                self._server = await asyncio.start_server(
                    self._client, self.options.host, self.options.port)
            except OSError as exc:
                raise TerminalError(f"binlog server cannot listen on {self.options.host}:"
                                    f"{self.options.port}: {exc.strerror}") from exc
            self.port = self._server.sockets[0].getsockname()[1]
            log.info("binlog server listening on %s:%d%s", self.options.host, self.port,
                     " (TLS)" if self._ssl else "")
            self.ready.set()
            await self._stopping.wait()
        finally:
            if self._server is not None:
                self._server.close()
            for task in list(self._tasks):
                task.cancel()
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
            if self._server is not None:
                await self._server.wait_closed()
            self.notifier.close()

    def stop(self) -> None:
        """Stop serving (thread-safe; from a signal handler's helper thread too)."""
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None and not loop.is_closed():
            loop.call_soon_threadsafe(stopping.set)

    def run(self) -> None:
        """:meth:`serve` on a new event loop in this thread."""
        asyncio.run(self.serve())


async def _write_raw(writer: asyncio.StreamWriter, payload: bytes) -> None:
    writer.write(struct.pack("<I", len(payload)) + payload)
    with contextlib.suppress(ConnectionError):
        await writer.drain()


def run_service(cfg: BinlogServiceConfig, password: str, stop: threading.Event) -> None:
    """``databus binlog-server``: the converter on a thread, the server on this one,
    until ``stop`` is set (then both end and the store is closed) or the converter fails
    (then the server stops too and the converter's error is raised)."""
    import socket

    from databus.binlog.convert import BinlogConverter

    store = BinlogStore(cfg.data_dir, base=cfg.base, server_id=cfg.server_id,
                        rotate_bytes=cfg.rotate_bytes)
    failed: list[BaseException] = []
    conv_stop = threading.Event()
    try:
        options = ServerOptions(
            host=cfg.host, port=cfg.port, user=cfg.user, password=password,
            tls=cfg.tls,
            default_heartbeat=cfg.heartbeat)
        facts = ServiceFacts(
            server_id=cfg.server_id, server_uuid=store.server_uuid,
            hostname=socket.gethostname(), port=cfg.port,
            log_bin_basename=str(cfg.data_dir / cfg.base), max_binlog_size=cfg.rotate_bytes,
            expire_logs_seconds=int(cfg.retention))
        server = BinlogServer(store, options, facts, AnnouncedCatalog(store))
        converter = BinlogConverter(cfg.client_config(), store, retention=cfg.retention,
                                    checkpoint_every=cfg.checkpoint_every,
                                    purge_interval=cfg.purge_interval,
                                    flush_delay=cfg.flush_delay,
                                    require_complete_history=cfg.require_complete_history)

        def convert() -> None:
            try:
                converter.run(conv_stop)
            except BaseException as exc:  # broad: a thread's top; reported by the main thread
                failed.append(exc)
                stop.set()

        def watch() -> None:
            stop.wait()
            server.stop()

        metrics = _metrics_port(cfg, converter)
        conv_thread = threading.Thread(target=convert, name="binlog-converter")
        conv_thread.start()
        threading.Thread(target=watch, name="binlog-stop", daemon=True).start()
        try:
            server.run()
        finally:
            stop.set()
            conv_stop.set()
            conv_thread.join()
            if metrics is not None:
                metrics.stop()
    finally:
        store.close()
    if failed:
        raise failed[0]


__all__ = ["BinlogConnection", "BinlogServer", "ServerOptions", "client_version", "run_service"]


def _metrics_port(cfg: BinlogServiceConfig, converter: BinlogConverter) -> MetricsServer | None:
    """``metrics_port``: the converter's relay client's numbers on ``/metrics`` and its
    state on ``/health/ready`` (docs/operations.md), started; else None."""
    if cfg.metrics_port is None:
        return None
    from databus.client.metrics import readiness, render
    from databus.serving.health import Check
    from databus.serving.metrics_port import MetricsServer

    def rows() -> list[ConsumerMetrics]:
        client = converter.client
        return [client.metrics()] if client is not None else []

    def checks() -> list[Check]:
        now = rows()
        if not now:
            return [Check("consumer", False, "not started")]
        return [Check(*c) for c in readiness(now)]

    server = MetricsServer("binlog-server", lambda: render(rows()), checks,
                           port=cfg.metrics_port, host=cfg.metrics_host)
    server.start()
    return server
