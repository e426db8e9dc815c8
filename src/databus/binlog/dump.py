"""Streaming binlog files to one replication client, as MySQL 8's dump thread does.

A :class:`Dumper` serves one ``COM_BINLOG_DUMP`` or ``COM_BINLOG_DUMP_GTID`` request from
the files of a :class:`~databus.binlog.store.BinlogStore`:

* per file: an artificial Rotate (timestamp 0, ``LOG_EVENT_ARTIFICIAL_F``, the file's name
  and the position the stream continues at), then the file's Format_description (its
  ``LOG_EVENT_BINLOG_IN_USE_F`` cleared; when the stream starts past the file's start, its
  ``log_pos`` and created timestamp zeroed and its checksum recomputed), then the file's
  events from the position on, byte for byte as they are stored;
* a file's end (the Rotate event the converter wrote) leads to the next file with a new
  artificial Rotate, as MySQL does (``mariadb-binlog`` stops there when told to);
* at the end of the last file: the end-of-stream packet for a non-blocking dump
  (``BINLOG_DUMP_NON_BLOCK`` or replica ``server_id`` 0, MySQL's two ways), else a wait for
  more with a ``HEARTBEAT_LOG_EVENT`` every ``@master_heartbeat_period`` (none when 0);
* only whole transactions: a reader never gets bytes past the store's committed size;
* GTID dumps start where :meth:`BinlogStore.locate_gtids` says and skip every later
  transaction the client already has (a heartbeat then tells the skipped range's end);
* checksums: events keep their CRC32. A client that never set ``@master_binlog_checksum``
  cannot take them and gets MySQL's error; artificial events carry a CRC32 when the
  client asked for one (before the first Format_description) or the file has them (after).

Errors: a position that is unknown, purged, past the end or not on an event boundary, a
purged GTID range and an unusable file end the dump with :class:`DumpError` (MySQL error
1236 and MySQL's text), never with a silent jump to another position.

Threading: a dumper runs on the server's event loop; file reads are ``preadv`` calls on
the loop into one buffer per dump (the files are in the page cache just after the
converter wrote them), and the wait for new data is one
:class:`~databus.binlog.notifier.StoreNotifier` thread per server, not a thread per client.

Its parts: the request (:mod:`databus.binlog.request`), the artificial events
(:mod:`databus.binlog.events`), the packets (:mod:`databus.binlog.framing`), the chunks
shared between dumps (:mod:`databus.binlog.chunks`).
"""

from __future__ import annotations

import asyncio
import os
import struct
import uuid
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from databus.binlog.chunks import FramedChunks
from databus.binlog.events import client_fde, fake_rotate, heartbeat
from databus.binlog.framing import (
    PacketSeq,
    frame_events,
    frame_events_into,
    frame_packet,
    framed_capacity,
)
from databus.binlog.gtids import GtidSet
from databus.binlog.notifier import StoreNotifier
from databus.binlog.request import DumpError, DumpRequest
from databus.binlog.store import BinlogPos, BinlogPurgedError, BinlogStore
from databus.core.mysqlwire import (
    BIN_LOG_HEADER_SIZE,
    BINLOG_MAGIC,
    CHECKSUM_LEN,
    HEADER_LEN,
    LEN_OFFSET,
    TYPE_OFFSET,
    EventType,
)

_U32 = struct.Struct("<I")
# bytes read per preadv. Measured (a 10 MB binlog read, framed and sent to a loopback
# client reading 16 KiB at a time, sender CPU): 256 KiB chunks 4.5-5.3 ms, 1 MiB 6-8 ms
# (the chunk and its packets no longer stay in the core's cache before the socket copy)
CHUNK = 256 << 10
# a file's first read: the client has its first events ~0.1 ms after its request instead
# of after a whole chunk's read and framing (~1.5 ms, measured with strace on
# mariadb-binlog); each later read doubles up to CHUNK
_FIRST_CHUNK = 16 << 10
# the type codes the GTID skipping looks at (bound once: it reads every event's type)
_GTID = int(EventType.MYSQL_GTID)
_ROTATE = int(EventType.ROTATE)


@dataclass
class DumpOptions:
    """A client's session settings that shape its dump."""

    # @master_binlog_checksum: None = never set (MySQL's UNDEF), False = NONE, True = CRC32
    checksum: bool | None = None
    heartbeat_period: float = 0.0  # seconds; @master_heartbeat_period is in nanoseconds


def _unset_write(data: bytes | memoryview) -> None:
    raise RuntimeError("Dumper.run sets where packets go")


class Dumper:
    """Serves one dump request (see the module docstring): frames what it sends as MySQL
    packets numbered from the connection's ``seq`` (left at the next number to use)."""

    def __init__(self, store: BinlogStore, notifier: StoreNotifier, request: DumpRequest,
                 options: DumpOptions, *, server_id: int,
                 chunks: FramedChunks | None = None) -> None:
        self._store = store
        self._notifier = notifier
        self._req = request
        self._opts = options
        self._server_id = server_id
        self._chunks = chunks
        self.events_sent = 0
        self._write: Callable[[bytes | memoryview], None] = _unset_write
        self._seq: PacketSeq | None = None
        self._exclude: GtidSet | None = None  # the client's GTIDs not yet passed
        self._own_uuid = store.server_uuid
        # every read of the dump, reused; it grows with the reads (a dump of a few
        # events does not allocate and zero a whole chunk)
        self._inbuf = bytearray(_FIRST_CHUNK)
        self._packets = bytearray()  # a lone dump's framing buffer, reused (FramedChunks)
        self._started: tuple[str, int, int] | None = None
        self._events_at = 0  # the current file's first event after its Format_description

    def _start(self) -> tuple[str, int]:
        req = self._req
        try:
            if req.gtids is not None and not req.file:
                start = self._store.locate_gtids(req.gtids)
                return start.file, start.pos
            if req.pos < BIN_LOG_HEADER_SIZE:
                raise DumpError("Client requested source to start replication from"
                                " position < 4")
            files = [name for name, _ in self._store.files()]
            if not files:
                raise DumpError("Binary log is not open")
            name = req.file or files[0]
            if name not in files:
                raise DumpError("Could not find first log file name in binary log index"
                                " file")
            if req.pos > self._store.committed_size(name):
                raise DumpError("Client requested source to start replication from"
                                " position > file size")
            self._store.check(BinlogPos(name, req.pos))
            return name, req.pos
        except BinlogPurgedError as exc:
            raise DumpError(str(exc)) from exc

    async def run(self, write: Callable[[bytes | memoryview], None],
                  flush: Callable[[], Awaitable[None]], seq: PacketSeq) -> None:
        """Stream until the client leaves (the caller cancels), the end of a non-blocking
        dump (returns normally, its last packets possibly still queued: the caller
        writes the end-of-stream packet and flushes), or an error (:class:`DumpError`).
        ``write`` queues packets (bytes, or a view of the dump's framing buffer,
        unchanged until ``flush`` returned), ``flush`` sends what is queued; ``seq`` is
        the connection's packet sequence number, the next one to use (also after an
        error: the error packet follows)."""
        self._write, self._seq = write, seq
        file, pos = self._start()
        chunks = self._chunks
        start = (file, pos, seq.value)
        if chunks is not None:
            self._started = start
            chunks.join(start)
        try:
            await self._run(file, pos, flush)
        finally:
            if chunks is not None:
                chunks.leave(start)

    async def _run(self, file: str, pos: int, flush: Callable[[], Awaitable[None]]) -> None:
        # the algorithm of artificial events: the client's until a file says otherwise
        art_crc = bool(self._opts.checksum)
        self._exclude = GtidSet.parse(self._req.gtids) if self._req.gtids else None
        while True:
            self._send(fake_rotate(self._server_id, file, pos, art_crc))
            fd = self._open(file)
            try:
                fde = self._read_fde(fd, file)
                clear = pos > BIN_LOG_HEADER_SIZE
                fde_bytes, with_crc = client_fde(fde, clear_log_pos=clear)
                if with_crc and self._opts.checksum is None:
                    raise DumpError(
                        "Replica can not handle replication events with the checksum that"
                        " source is configured to log; the first event"
                        f" '{file}' at {pos}, the last event read from '{file}' at 4,"
                        f" the last byte read from '{file}' at 4.")
                art_crc = with_crc
                self._events_at = BIN_LOG_HEADER_SIZE + len(fde)
                if pos > BIN_LOG_HEADER_SIZE:
                    self._check_start(fd, file, pos, with_crc)
                self._send(fde_bytes)
                offset = pos if pos > BIN_LOG_HEADER_SIZE else self._events_at
                nxt = await self._stream_file(fd, file, offset, flush, art_crc)
            finally:
                os.close(fd)
            if nxt is None:
                return
            file, pos = nxt, BIN_LOG_HEADER_SIZE

    def _check_start(self, fd: int, file: str, pos: int, with_crc: bool) -> None:
        """A dump from ``pos`` (past the file's start) starts at an event: one after the
        Format_description whose header fits below the committed end and whose CRC32
        holds (the files carry them); else MySQL's 1236 for an impossible position,
        never events read from the middle of one. The committed end itself is a start
        (a replica that has everything waits there)."""
        end = self._store.committed_size(file)
        if pos == end:
            return
        event = b""
        if pos >= self._events_at:
            head = os.pread(fd, HEADER_LEN, pos)
            if len(head) == HEADER_LEN:
                (length,) = _U32.unpack_from(head, LEN_OFFSET)
                if HEADER_LEN + (CHECKSUM_LEN if with_crc else 0) <= length <= end - pos:
                    event = os.pread(fd, length, pos)
        if len(event) < HEADER_LEN or (with_crc and (
                zlib.crc32(event[:-CHECKSUM_LEN]) & 0xFFFFFFFF
                != _U32.unpack_from(event, len(event) - CHECKSUM_LEN)[0])):
            raise DumpError("Client requested source to start replication from impossible"
                            f" position; the first event '{file}' at {pos}, the last event"
                            f" read from '{file}' at 4, the last byte read from '{file}'"
                            " at 4.")

    def _send(self, event: bytes) -> None:
        """One event (an artificial one, a heartbeat) as its packet."""
        assert self._seq is not None
        self._write(frame_packet(b"\x00" + event, self._seq))

    def _send_events(self, buf: memoryview, events: list[tuple[int, int]]) -> None:
        """The given ``(offset, length)`` events of ``buf``, each run of consecutive ones
        framed in one call."""
        seq = self._seq
        assert seq is not None
        k = 0
        while k < len(events):
            start, length = events[k]
            stop = start + length
            k += 1
            while k < len(events) and events[k][0] == stop:
                stop += events[k][1]
                k += 1
            framed, _, _, seq.value, _ = frame_events(buf[start:stop], seq.value)
            self._write(framed)

    def _open(self, file: str) -> int:
        try:
            return os.open(self._store.path(file), os.O_RDONLY)
        except FileNotFoundError as exc:
            raise DumpError(f"could not open log file '{file}' (it was purged)") from exc
        except OSError as exc:
            raise DumpError(f"I/O error reading log event: {exc.strerror}") from exc

    @staticmethod
    def _read_fde(fd: int, file: str) -> bytes:
        head = os.pread(fd, BIN_LOG_HEADER_SIZE + HEADER_LEN, 0)
        if len(head) < BIN_LOG_HEADER_SIZE + HEADER_LEN or head[:4] != BINLOG_MAGIC:
            raise DumpError(f"Binlog has bad magic number; It's not a binary log file"
                            f" that can be used by this version of MySQL ('{file}')")
        if head[BIN_LOG_HEADER_SIZE + TYPE_OFFSET] != EventType.FORMAT_DESCRIPTION:
            raise DumpError("Could not find format_description_event in binlog file")
        (length,) = _U32.unpack_from(head, BIN_LOG_HEADER_SIZE + LEN_OFFSET)
        return os.pread(fd, length, BIN_LOG_HEADER_SIZE)

    def _send_excluding(self, buf: memoryview, file: str, offset: int, art_crc: bool,
                        skipped_to: int, in_excluded: bool) -> tuple[int, int, bool]:
        """The whole events at the start of ``buf`` (at ``offset`` of ``file``) one by one,
        without the transactions of the client's GTID set, and a heartbeat where a skipped
        range ends; returns (bytes consumed, skipped_to, in_excluded). Past the set's last
        GNO of this binlog's server UUID no later transaction can be in it (GNOs grow
        with the position, and only that UUID is written here): the dump leaves this path
        for the framing of whole chunks."""
        exclude = self._exclude
        events: list[tuple[int, int]] = []
        i, n = 0, len(buf)
        while i + HEADER_LEN <= n:
            (length,) = _U32.unpack_from(buf, i + LEN_OFFSET)
            if length < HEADER_LEN:
                self._send_events(buf, events)
                raise DumpError("bogus data in log event; the first event"
                                f" '{file}' at {offset + i}")
            if i + length > n:
                break
            if exclude is not None:
                etype = buf[i + TYPE_OFFSET]
                if etype == _GTID:
                    sid = str(uuid.UUID(bytes=bytes(buf[i + HEADER_LEN + 1:
                                                         i + HEADER_LEN + 17])))
                    (gno,) = struct.unpack_from("<q", buf, i + HEADER_LEN + 17)
                    in_excluded = exclude.contains(sid, gno)
                    if not in_excluded and sid == self._own_uuid and all(
                            gno > b for _, b in exclude.intervals(sid)):
                        self._exclude = exclude = None
                elif etype == _ROTATE:
                    in_excluded = False
                if in_excluded:
                    skipped_to = offset + i + length
                    i += length
                    continue
                if skipped_to:
                    # MySQL: a heartbeat tells the replica where skipped events end
                    self._send_events(buf, events)
                    events = []
                    self._send(heartbeat(self._server_id, file, skipped_to, art_crc))
                    skipped_to = 0
            events.append((i, length))
            i += length
        self._send_events(buf, events)
        self.events_sent += len(events)
        return i, skipped_to, in_excluded

    async def _stream_file(self, fd: int, file: str, offset: int,
                           flush: Callable[[], Awaitable[None]], art_crc: bool) -> str | None:
        """Send ``file`` from ``offset``; the next file's name, or None at the end of a
        non-blocking dump."""
        store = self._store
        in_excluded = False
        skipped_to = 0
        need = 0  # the length of the event at offset when it is longer than a chunk
        chunk = _FIRST_CHUNK
        while True:
            changed = self._notifier.changed  # before the look (see StoreNotifier)
            end = store.committed_size(file)
            if offset < end:
                # an event cut by the chunk's end is read again whole with the next chunk
                # (re-reading its head costs less than joining two buffers)
                want = min(end - offset, max(chunk, need))
                chunk = min(chunk * 2, CHUNK)
                if self._exclude is None:
                    i = self._send_chunk(fd, file, offset, want)
                else:
                    self._read(fd, file, offset, want)
                    with memoryview(self._inbuf) as view, view[:want] as buf:
                        i, skipped_to, in_excluded = self._send_excluding(
                            buf, file, offset, art_crc, skipped_to, in_excluded)
                if i < want and offset + want >= end:
                    # the committed end is never inside an event
                    raise DumpError("binlog truncated in the middle of event; the last event"
                                    f" read from '{file}' at {offset + i}")
                need = 0
                if i == 0:  # an event longer than the chunk: the next read takes it whole
                    (need,) = _U32.unpack_from(self._inbuf, LEN_OFFSET)
                offset += i
                if offset >= end and not skipped_to and self._req.non_blocking and \
                        store.next_file(file) is None:
                    # a non-blocking dump's last events: queued, for the caller to send
                    # with the end-of-stream packet in one write (a wake of the client
                    # less; nothing is framed into the dump's buffer after this)
                    return None
                await flush()
                continue
            if skipped_to:
                self._send(heartbeat(self._server_id, file, skipped_to, art_crc))
                skipped_to = 0
            nxt = store.next_file(file)
            if nxt is not None and store.committed_size(file) <= offset:
                return nxt
            if self._req.non_blocking:
                await flush()
                return None
            await flush()
            period = self._opts.heartbeat_period
            try:
                await asyncio.wait_for(changed.wait(), timeout=period if period > 0 else None)
            except TimeoutError:
                self._send(heartbeat(self._server_id, file, offset, art_crc))
                await flush()

    def _read(self, fd: int, file: str, offset: int, want: int) -> None:
        """``want`` bytes of ``file`` (all below its committed end) from ``offset`` into
        the dump's read buffer."""
        if len(self._inbuf) < want:
            self._inbuf = bytearray(max(want, min(2 * len(self._inbuf), CHUNK)))
        try:
            got = os.preadv(fd, [memoryview(self._inbuf)[:want]], offset)
        except OSError as exc:
            raise DumpError(f"I/O error reading log event: {exc.strerror}") from exc
        if got < want:
            raise DumpError(f"I/O error reading log event: '{file}' ends at"
                            f" {offset + got}, before its committed end {offset + want}")

    def _send_chunk(self, fd: int, file: str, offset: int, want: int) -> int:
        """The dump's hot path (every event of a file when no GTID is skipped): the whole
        events of the ``want`` bytes at ``offset``, framed in one pass or taken framed
        from the server's :class:`FramedChunks`; returns the bytes consumed. The read
        buffer's head (an event longer than the chunk) is only valid after a read: an
        entry with nothing consumed is never shared."""
        seq = self._seq
        assert seq is not None
        chunks = self._chunks
        if chunks is None or self._started is None or offset < self._events_at or \
                not chunks.shared(self._started):
            self._read(fd, file, offset, want)
            need = framed_capacity(want)
            if len(self._packets) < need:  # grows as the reads do
                self._packets = bytearray(need)
            with memoryview(self._inbuf) as view, view[:want] as buf:
                length, consumed, count, nxt, bad = frame_events_into(buf, seq.value,
                                                                      self._packets)
            self._sent(memoryview(self._packets)[:length], nxt, count, bad, file, offset)
            return consumed
        key = (file, offset, want, seq.value)
        hit = chunks.get(key)
        if hit is None:
            self._read(fd, file, offset, want)
            with memoryview(self._inbuf) as view, view[:want] as buf:
                packets, consumed, count, nxt, bad = frame_events(buf, seq.value)
            self._sent(packets, nxt, count, bad, file, offset)
            if consumed:
                chunks.put(key, (packets, consumed, count, nxt))
            return consumed
        packets, consumed, count, nxt = hit
        self._sent(packets, nxt, count, -1, file, offset)
        return consumed

    def _sent(self, packets: bytes | memoryview, nxt: int, count: int, bad: int, file: str,
              offset: int) -> None:
        """Queue a chunk's packets; at an event too short to be one (``bad``, its offset
        in the chunk) the events before it go first, then the dump ends."""
        assert self._seq is not None
        if packets:
            self._write(packets)
        self._seq.value = nxt
        self.events_sent += count
        if bad >= 0:
            raise DumpError("bogus data in log event; the first event"
                            f" '{file}' at {offset + bad}")
