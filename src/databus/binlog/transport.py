"""A binlog connection's bytes: the command stream read, a dump's packets written.

:class:`ReplicationStream` wraps mysql-mimic's packet stream of one connection: it hands
the replication commands (``COM_BINLOG_DUMP[_GTID]``, ``COM_REGISTER_SLAVE``,
``COM_CHANGE_USER``) to a hook before mysql-mimic's command loop reads them, and upgrades
the connection to TLS without losing the bytes a client sends right behind its SSL
request (mysql-mimic 3.0.5 loses them: see :meth:`ReplicationStream.start_tls`).

:class:`DumpWriter` sends a dump's packets in order, straight to the socket on plain TCP
(without asyncio's copies of what the kernel does not take at once), through the
transport with TLS. Both run on the server's event loop only.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from asyncio import sslproto
from collections.abc import Awaitable, Callable
from typing import Any

from databus.core.mysqlwire import (
    COM_BINLOG_DUMP,
    COM_BINLOG_DUMP_GTID,
    COM_CHANGE_USER,
    COM_REGISTER_SLAVE,
)

REPLICATION_COMMANDS = frozenset({COM_CHANGE_USER, COM_BINLOG_DUMP, COM_REGISTER_SLAVE,
                                  COM_BINLOG_DUMP_GTID})
"""The commands :class:`ReplicationStream` hands to its hook."""


class ReplicationStream:
    """mysql-mimic's packet stream, with a hook that takes the replication commands
    before mysql-mimic's command loop reads them (see the module docstring). A wrapper,
    not a subclass: mysql-mimic's stream is compiled (mypyc) and cannot be subclassed."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.intercept: Callable[[bytes], Awaitable[None]] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def start_tls(self, context: ssl.SSLContext) -> None:
        """Upgrade the connection to TLS (server side) after the client's SSL request;
        replaces mysql-mimic's ``MysqlStream.start_tls``, which its connection phase calls.

        Every byte the client sent after its SSL request reaches the TLS handshake,
        including bytes already read from the socket into the stream's reader. A client
        sends its TLS ClientHello right behind the SSL request without waiting for an
        answer (the protocol has none), so one socket read often returns both (always when
        the event loop is late, e.g. while the converter is busy); mysql-mimic's upgrade
        (``loop.start_tls`` on the transport) hands TLS only what the socket delivers
        afterwards, so that ClientHello was lost and both sides waited for each other until
        asyncio's 60 s handshake timeout. Returns once the handshake is done; raises the
        handshake's error (the connection is then closed)."""
        reader, writer = self._inner.reader, self._inner.writer
        transport = writer.transport
        assert isinstance(transport, asyncio.Transport)
        # StreamReader has no public way to take back what it buffered; its bytearray is
        # the one place those bytes are
        buffered = reader._buffer
        early = bytes(buffered)
        buffered.clear()
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        # what loop.start_tls does (call_connection_made=False: the stream's protocol
        # keeps serving the reader), plus feeding the early bytes between the TLS
        # protocol's start and the socket's next read, so they come first, in order
        tls = sslproto.SSLProtocol(loop, transport.get_protocol(), context, waiter,
                                   server_side=True, call_connection_made=False)
        try:
            transport.set_protocol(tls)
            tls.connection_made(transport)
            view = memoryview(early)
            while view:
                chunk = tls.get_buffer(len(view))
                n = min(len(chunk), len(view))
                chunk[:n] = view[:n]
                tls.buffer_updated(n)
                view = view[n:]
            # the reader may have paused the socket (a full buffer); TLS reads it now
            transport.resume_reading()
            await waiter
        except BaseException:
            transport.close()
            raise
        upgraded = tls._app_transport  # what loop.start_tls returns
        if upgraded is None or upgraded.is_closing():
            # a client that leaves mid-handshake without an error still wakes the waiter
            transport.close()
            raise ConnectionResetError("the client left during the TLS handshake")
        # mysql-mimic's own way of moving its reader and writer onto the TLS transport
        writer._transport = upgraded
        reader._transport = upgraded

    async def read(self) -> bytes:
        while True:
            data: bytes = await self._inner.read()
            hook = self.intercept
            if hook is None or not data or data[0] not in REPLICATION_COMMANDS:
                return data
            await hook(data)
            self._inner.reset_seq()


class DumpWriter:
    """Writes a dump's packets in order: :meth:`write` queues, :meth:`flush` sends.

    Plain TCP: straight to the socket (a duplicate of its descriptor, so that asyncio's
    transport, which keeps reading it to see the client leave, is not bypassed for
    reading), each queued buffer sent from where the kernel stopped taking it, waiting
    for the socket to be writable in between. Measured reason (perf on the dumper with
    four ``mariadb-binlog`` clients, bench/RESULTS.md): asyncio 3.11's transport copies
    every byte the kernel does not take at once into a bytearray, whose growth and
    shrinking copy what it holds again (19 % of the dumper's CPU in memmove, ~8 % more
    in the page faults of the fresh buffers). TLS: through the transport (its own
    buffering), which wakes the dump every 1 MiB instead of asyncio's 64 KiB.
    Packets written to the transport before (the handshake's, mysql-mimic's) are sent
    before any queued here: :meth:`flush` waits for the transport's buffer to empty.
    """

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._loop = asyncio.get_running_loop()
        self._queue: list[bytes | memoryview] = []
        self._fd = -1
        sock = writer.get_extra_info("socket")
        if writer.get_extra_info("ssl_object") is None and sock is not None:
            self._fd = os.dup(sock.fileno())
            # drain() then returns only once the transport's buffer is empty
            writer.transport.set_write_buffer_limits(high=0, low=0)
        else:
            writer.transport.set_write_buffer_limits(high=4 << 20, low=1 << 20)

    def write(self, data: bytes | memoryview) -> None:
        """Queue ``data``; a memoryview's buffer must stay unchanged until :meth:`flush`
        returned (the dump reuses its framing buffer after that)."""
        if self._fd < 0:
            # the TLS transport may keep what it is given beyond drain(): a copy
            self._writer.write(bytes(data) if isinstance(data, memoryview) else data)
        elif data:
            self._queue.append(data)

    async def flush(self) -> None:
        """Send everything written (raises ConnectionError when the client is gone)."""
        await self._writer.drain()
        queue = self._queue
        while queue:
            # one writev for what is queued (a dump's first write: the artificial Rotate,
            # the Format_description and the first chunk); a partial one goes on from
            # where the kernel stopped once the socket is writable again
            try:
                sent = os.writev(self._fd, queue[:_IOV_MAX])
            except (BlockingIOError, InterruptedError):
                sent = 0
            while queue and sent >= len(queue[0]):
                sent -= len(queue.pop(0))
            if sent:
                queue[0] = memoryview(queue[0])[sent:]
            if queue:
                await self._writable()

    async def _writable(self) -> None:
        ready = self._loop.create_future()
        self._loop.add_writer(self._fd, _wake, ready)
        try:
            await ready
        finally:
            self._loop.remove_writer(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


_IOV_MAX = 1024  # buffers per writev (Linux's IOV_MAX)


def _wake(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_result(None)
