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
converter wrote them), and the wait for new data is one :class:`StoreNotifier` thread per
server, not a thread per client.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import struct
import threading
import uuid
import zlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from databus.binlog.store import BinlogPos, BinlogPurgedError, BinlogStore, GtidSet
from databus.core.errors import TerminalError

# COM_BINLOG_DUMP(_GTID) flags
BINLOG_DUMP_NON_BLOCK = 0x01
BINLOG_THROUGH_POSITION = 0x02
BINLOG_THROUGH_GTID = 0x04

# event header (binlog v4)
HEADER_LEN = 19
TYPE_OFFSET = 4
SERVER_ID_OFFSET = 5
LEN_OFFSET = 9
LOG_POS_OFFSET = 13
FLAGS_OFFSET = 17
LOG_EVENT_BINLOG_IN_USE_F = 0x1
LOG_EVENT_ARTIFICIAL_F = 0x20
BINLOG_MAGIC = b"\xfebin"
BIN_LOG_HEADER_SIZE = 4
CHECKSUM_LEN = 4
# Format_description: binlog version (2) + server version (50), then the created timestamp
FDE_CREATED_OFFSET = HEADER_LEN + 2 + 50

QUERY_EVENT = 2
STOP_EVENT = 3
ROTATE_EVENT = 4
FORMAT_DESCRIPTION_EVENT = 15
XID_EVENT = 16
TABLE_MAP_EVENT = 19
HEARTBEAT_LOG_EVENT = 27
WRITE_ROWS_EVENT = 30
UPDATE_ROWS_EVENT = 31
DELETE_ROWS_EVENT = 32
GTID_LOG_EVENT = 33
ANONYMOUS_GTID_LOG_EVENT = 34
PREVIOUS_GTIDS_LOG_EVENT = 35

ER_MASTER_FATAL_ERROR_READING_BINLOG = 1236

_U32 = struct.Struct("<I")
# bytes read per preadv. Measured (a 10 MB binlog read, framed and sent to a loopback
# client reading 16 KiB at a time, sender CPU): 256 KiB chunks 4.5-5.3 ms, 1 MiB 6-8 ms
# (the chunk and its packets no longer stay in the core's cache before the socket copy)
CHUNK = 256 << 10
# a file's first read: the client has its first events ~0.1 ms after its request instead
# of after a whole chunk's read and framing (~1.5 ms, measured with strace on
# mariadb-binlog); each later read doubles up to CHUNK
_FIRST_CHUNK = 16 << 10
MAX_PACKET = 0xFFFFFF  # a MySQL packet's largest payload

try:  # the compiled half of frame_events (client/_wiredecode.c: the measured reason)
    _native: Any = importlib.import_module("databus.client._wiredecode").frame_binlog
except (ImportError, AttributeError):  # not built here: the Python half, same output
    _native = None

Framed = tuple[bytes, int, int, int, int]


def frame_events(events: bytes | memoryview, seq: int, *,
                 native: bool = True) -> Framed:
    """The MySQL packets of a binlog dump for the whole events at the start of
    ``events`` (consecutive binlog v4 events, the first at offset 0), numbered from
    sequence number ``seq``: ``(framed, consumed, count, next_seq, bad)``.

    Each event is one packet payload, the OK byte (0x00) then the event, split into
    ``MAX_PACKET``-byte packets when that long (then an empty packet after a piece of
    exactly that size), each packet with its 3-byte length and a sequence number (mod
    256, counting on from ``seq``; ``next_seq`` is the one after the last). Framing stops
    before an event that does not end inside ``events`` (``consumed`` is where it
    starts: the caller reads on from there) and at an event whose length field is below
    the 19-byte header: ``bad`` is that event's offset (else -1), and the events before
    it are framed. ``count`` is the number of events framed.

    The compiled half (``databus.client._wiredecode.frame_binlog``) is used where it was
    built, unless ``native`` is false; both give the same output
    (``tests/unit/test_binlog_framing.py``)."""
    if native and _native is not None:
        out: Framed = _native(events, seq)
        return out
    buf = memoryview(events)
    parts = bytearray()
    s = seq & 0xFF
    i, n, count, bad = 0, len(buf), 0, -1
    unpack = _U32.unpack_from
    pack = _U32.pack
    while i + HEADER_LEN <= n:
        (length,) = unpack(buf, i + LEN_OFFSET)
        if length < HEADER_LEN:
            bad = i
            break
        if i + length > n:
            break
        if length + 1 < MAX_PACKET:
            parts += pack((length + 1) | (s << 24))
            parts.append(0)
            parts += buf[i:i + length]
            s = (s + 1) & 0xFF
        else:
            payload = b"\x00" + bytes(buf[i:i + length])
            for k in range(0, len(payload) + 1, MAX_PACKET):
                piece = payload[k:k + MAX_PACKET]
                parts += pack(len(piece) | (s << 24)) + piece
                s = (s + 1) & 0xFF
                if len(piece) < MAX_PACKET:
                    break
        i += length
        count += 1
    return bytes(parts), i, count, s, bad


def framed_capacity(n: int) -> int:
    """Bytes that the packets of any ``n`` bytes of events fit in (each event of at least
    the 19-byte header adds 5, each 0xFFFFFF-byte piece 4 more)."""
    return n + 5 * (n // HEADER_LEN + 1) + 4 * (n // MAX_PACKET + 2)


def frame_events_into(events: bytes | memoryview, seq: int, out: bytearray, *,
                      native: bool = True) -> tuple[int, int, int, int, int]:
    """:func:`frame_events` written at the start of ``out`` instead of a new bytes:
    ``(length, consumed, count, next_seq, bad)``; ValueError when the packets do not fit
    (:func:`framed_capacity` of ``len(events)`` always does). A dump frames every chunk
    into one buffer: a fresh one per chunk, its allocation and page faults, cost ~8% of
    the dumper's CPU (perf, four clients)."""
    if native and _native is not None:
        done: tuple[int, int, int, int, int] = _native(events, seq, out)
        return done
    framed, consumed, count, nxt, bad = frame_events(events, seq, native=False)
    if len(framed) > len(out):
        raise ValueError(f"frame_events_into: out holds {len(out)} bytes, the packets take"
                         f" {len(framed)}")
    out[:len(framed)] = framed
    return len(framed), consumed, count, nxt, bad


class DumpError(TerminalError):
    """A dump that cannot go on exactly; ``errno`` and the text are MySQL's (1236)."""

    code = "BinlogDumpError"

    def __init__(self, message: str, errno: int = ER_MASTER_FATAL_ERROR_READING_BINLOG) -> None:
        super().__init__(message)
        self.errno = errno


# -- GTID sets ---------------------------------------------------------------------------


def decode_gtid_set(data: bytes) -> str:
    """The binary SID-block format of ``COM_BINLOG_DUMP_GTID`` (n_sids u64, then per sid:
    uuid 16 bytes, n_intervals u64, intervals as u64 start, u64 exclusive end) as MySQL's
    text form (``uuid:1-5:7``)."""
    try:
        (n_sids,) = struct.unpack_from("<Q", data, 0)
        off = 8
        parts = []
        for _ in range(n_sids):
            sid = uuid.UUID(bytes=bytes(data[off:off + 16]))
            (n,) = struct.unpack_from("<Q", data, off + 16)
            off += 24
            ivs = []
            for _ in range(n):
                start, end = struct.unpack_from("<QQ", data, off)
                off += 16
                if not 0 < start < end:
                    raise ValueError(f"interval {start}-{end}")
                ivs.append(f"{start}" if end == start + 1 else f"{start}-{end - 1}")
            if ivs:
                parts.append(f"{sid}:" + ":".join(ivs))
    except (struct.error, ValueError) as exc:
        raise DumpError(f"Malformed GTID set in COM_BINLOG_DUMP_GTID: {exc}",
                        errno=1835) from exc
    return ",".join(parts)


# -- dump requests -----------------------------------------------------------------------


@dataclass(frozen=True)
class DumpRequest:
    """One parsed ``COM_BINLOG_DUMP`` / ``COM_BINLOG_DUMP_GTID`` (command byte removed)."""

    file: str
    pos: int
    flags: int
    replica_server_id: int
    gtids: str | None = None  # GTID dumps: the client's executed set (text form)

    @property
    def non_blocking(self) -> bool:
        # MySQL's two ways: the flag, or server_id 0 (mysqlbinlog -R since forever)
        return bool(self.flags & BINLOG_DUMP_NON_BLOCK) or self.replica_server_id == 0


def parse_binlog_dump(data: bytes) -> DumpRequest:
    """``COM_BINLOG_DUMP``: pos u32, flags u16, server_id u32, file name (rest)."""
    if len(data) < 10:
        raise DumpError("Malformed COM_BINLOG_DUMP packet", errno=1835)
    pos, flags, sid = struct.unpack_from("<IHI", data, 0)
    return DumpRequest(data[10:].rstrip(b"\x00").decode("utf-8", "replace"), pos, flags, sid)


def parse_binlog_dump_gtid(data: bytes) -> DumpRequest:
    """``COM_BINLOG_DUMP_GTID``: flags u16, server_id u32, name size u32, name, pos u64,
    then the data size u32 and the GTID set's SID blocks. The set is read whenever it is
    there, as MySQL's server does (``com_binlog_dump_gtid`` reads it unconditionally):
    Debezium's client (mysql-binlog-connector-java) sends it with flags 0, without
    ``BINLOG_THROUGH_GTID``; ignoring it restarted that client from the first file."""
    try:
        flags, sid, name_len = struct.unpack_from("<HII", data, 0)
        off = 10
        name = data[off:off + name_len].rstrip(b"\x00").decode("utf-8", "replace")
        off += name_len
        (pos,) = struct.unpack_from("<Q", data, off)
        off += 8
        gtids = ""
        if flags & BINLOG_THROUGH_GTID or len(data) >= off + 4:
            (size,) = struct.unpack_from("<I", data, off)
            off += 4
            gtids = decode_gtid_set(data[off:off + size])
    except struct.error as exc:
        raise DumpError("Malformed COM_BINLOG_DUMP_GTID packet", errno=1835) from exc
    return DumpRequest(name, pos, flags, sid, gtids)


# -- artificial events -------------------------------------------------------------------


def _finish(event: bytearray, checksum: bool) -> bytes:
    if checksum:
        event += _U32.pack(zlib.crc32(event) & 0xFFFFFFFF)
    _U32.pack_into(event, LEN_OFFSET, len(event))
    return bytes(event)


def fake_rotate(server_id: int, file: str, pos: int, checksum: bool) -> bytes:
    """MySQL's artificial Rotate: timestamp 0, log_pos 0, ``LOG_EVENT_ARTIFICIAL_F``."""
    ev = bytearray(struct.pack("<IBIIIH", 0, ROTATE_EVENT, server_id, 0, 0,
                               LOG_EVENT_ARTIFICIAL_F))
    ev += struct.pack("<Q", pos) + file.encode()
    return _finish(ev, checksum)


def heartbeat(server_id: int, file: str, pos: int, checksum: bool) -> bytes:
    """``HEARTBEAT_LOG_EVENT``: log_pos = where the stream is, body = the file's name."""
    ev = bytearray(struct.pack("<IBIIIH", 0, HEARTBEAT_LOG_EVENT, server_id, 0,
                               pos & 0xFFFFFFFF, 0))
    ev += file.encode()
    return _finish(ev, checksum)


def client_fde(raw: bytes, clear_log_pos: bool) -> tuple[bytes, bool]:
    """The Format_description as sent (see the module docstring) and whether the file's
    events carry a CRC32."""
    ev = bytearray(raw)
    with_crc = len(ev) > HEADER_LEN + 57 + 5 and ev[-5] == 1
    ev[FLAGS_OFFSET] &= ~LOG_EVENT_BINLOG_IN_USE_F & 0xFF
    if clear_log_pos:
        _U32.pack_into(ev, LOG_POS_OFFSET, 0)
        _U32.pack_into(ev, FDE_CREATED_OFFSET, 0)
    if with_crc:
        _U32.pack_into(ev, len(ev) - 4, zlib.crc32(ev[:-4]) & 0xFFFFFFFF)
    return bytes(ev), with_crc


# -- waiting for new data ----------------------------------------------------------------


class StoreNotifier:
    """One thread that waits on the store and wakes every dumper of an event loop.

    A dumper takes :attr:`changed` *before* it looks at the store's sizes, then awaits it:
    data committed between the look and the wait is never missed.
    """

    def __init__(self, store: BinlogStore, loop: asyncio.AbstractEventLoop) -> None:
        self._store = store
        self._loop = loop
        self.changed = asyncio.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="binlog-notifier", daemon=True)
        self._thread.start()

    def _pulse(self) -> None:
        old, self.changed = self.changed, asyncio.Event()
        old.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                end = self._store.end()
                moved = self._store.wait_beyond(end, 0.5)
            except Exception:  # a closed store at shutdown: nothing left to wait for
                if self._stop.wait(0.5):
                    return
                continue
            if moved and not self._loop.is_closed():
                self._loop.call_soon_threadsafe(self._pulse)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


# -- the dumper --------------------------------------------------------------------------


@dataclass
class DumpOptions:
    """A client's session settings that shape its dump."""

    # @master_binlog_checksum: None = never set (MySQL's UNDEF), False = NONE, True = CRC32
    checksum: bool | None = None
    heartbeat_period: float = 0.0  # seconds; @master_heartbeat_period is in nanoseconds


class PacketSeq(Protocol):
    """A connection's packet sequence number (mysql-mimic's ``seq``): the next one to use."""

    value: int


ChunkKey = tuple[str, int, int, int]  # file, offset, bytes read, first sequence number


class FramedChunks:
    """The packets of recently framed file chunks, shared by the dumps of one server.

    Dumps that start at the same place (file, position, packet sequence number: replicas
    started together, several tools reading one history) read the same chunks and frame
    them into the same packets: the first dump at a chunk reads and frames it, the
    others send its packets without a read or a framing of their own. The packets are a
    function of the key alone (file, offset, bytes read, first sequence number): a
    file's bytes after its Format_description and below its committed size never change
    while the server runs (the store truncates only when it opens; a rotation rewrites
    the Format_description's in-use flag, which no shared chunk holds: chunks from
    inside the Format_description, which only a position that is no event boundary
    gives, are never shared; a purge removes whole files, whose names are never
    reused). Only dumps that share their start with another live dump use it: a dump
    alone frames into its own reused buffer, which stays in the CPU's cache (packets
    kept for others are written to fresh memory: ~30 % more of a lone dump's CPU,
    measured).

    Measured reason (bench/RESULTS.md): with four ``mariadb-binlog`` clients reading one
    binlog, the file reads' copy was ~23 % of the server's CPU and the framing ~14 %;
    sharing took the server's CPU per four-client read from 49-51 ms to 40-41 ms.

    Holds at most ``max_bytes`` of packets (plus Python's per-entry overhead, which
    matters only for the small chunks of dumps tailing the binlog together), the least
    recently used going first, and none once no two live dumps share a start; an
    entry's bytes stay valid for a dump that still sends them after it went (bytes
    objects). Event-loop only (not thread-safe).
    """

    def __init__(self, max_bytes: int = 16 << 20) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[ChunkKey, tuple[bytes, int, int, int]] = OrderedDict()
        self._size = 0
        self._starts: dict[tuple[str, int, int], int] = {}
        self.hits = 0
        self.misses = 0

    def join(self, start: tuple[str, int, int]) -> None:
        """A dump starting at ``start`` (file, position, sequence number) begins."""
        self._starts[start] = self._starts.get(start, 0) + 1

    def leave(self, start: tuple[str, int, int]) -> None:
        """That dump ended; once no two live dumps share a start, the packets go too (no
        memory held for dumps that are gone)."""
        left = self._starts.pop(start, 1) - 1
        if left:
            self._starts[start] = left
        if self._entries and all(n < 2 for n in self._starts.values()):
            self._entries.clear()
            self._size = 0

    def shared(self, start: tuple[str, int, int]) -> bool:
        """Whether another live dump started at ``start``."""
        return self._starts.get(start, 0) > 1

    def get(self, key: ChunkKey) -> tuple[bytes, int, int, int] | None:
        """``(packets, consumed, count, next_seq)`` framed before for ``key``, or None."""
        got = self._entries.get(key)
        if got is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end(key)
        return got

    def put(self, key: ChunkKey, framed: tuple[bytes, int, int, int]) -> None:
        if len(framed[0]) > self.max_bytes:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self._size -= len(old[0])
        self._entries[key] = framed
        self._size += len(framed[0])
        while self._size > self.max_bytes:
            _, (packets, *_) = self._entries.popitem(last=False)
            self._size -= len(packets)

    def __len__(self) -> int:
        return len(self._entries)


def _unset_write(data: bytes | memoryview) -> None:
    raise RuntimeError("Dumper.run sets where packets go")


def frame_packet(payload: bytes, seq: PacketSeq) -> bytes:
    """``payload`` as MySQL packets: 0xFFFFFF-byte pieces (and an empty one after a piece of
    exactly that size), each with its length and the next sequence number."""
    out = bytearray()
    s = seq.value
    for i in range(0, len(payload) + 1, MAX_PACKET):
        piece = payload[i:i + MAX_PACKET]
        out += _U32.pack(len(piece) | (s << 24)) + piece
        s = (s + 1) & 0xFF
        if len(piece) < MAX_PACKET:
            break
    seq.value = s
    return bytes(out)


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
        if head[4 + TYPE_OFFSET] != FORMAT_DESCRIPTION_EVENT:
            raise DumpError("Could not find format_description_event in binlog file")
        (length,) = _U32.unpack_from(head, 4 + LEN_OFFSET)
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
                if etype == GTID_LOG_EVENT:
                    sid = str(uuid.UUID(bytes=bytes(buf[i + HEADER_LEN + 1:
                                                         i + HEADER_LEN + 17])))
                    (gno,) = struct.unpack_from("<q", buf, i + HEADER_LEN + 17)
                    in_excluded = exclude.contains(sid, gno)
                    if not in_excluded and sid == self._own_uuid and all(
                            gno > b for _, b in exclude.intervals(sid)):
                        self._exclude = exclude = None
                elif etype == ROTATE_EVENT:
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
