"""Binlog v4 event encoders (MySQL 8.0 layout), and a header parser for tests and readers.

Every event is ``header (19 bytes) + body + CRC32 (4 bytes)``; all integers little-endian.
Header::

    off size field
    0   4    timestamp (seconds since the epoch)
    4   1    type code
    5   4    server id
    9   4    event size (header + body + checksum)
    13  4    log_pos: the position of the *end* of this event in its file
    17  2    flags

The checksum is ``zlib.crc32`` of header + body (binlog_checksum=CRC32). A
Format_description event that carries ``LOG_EVENT_BINLOG_IN_USE_F`` has its checksum
computed with that flag cleared (MySQL clears the flag in place when it closes a file,
and readers clear it before they verify), so the flag can be reset without rewriting
the checksum.

No maintained Python library *writes* binlog events (python-mysql-replication and
mysql-mimic only read or relay them), so the encoders are written here, after MySQL
8.0's ``libbinlogevents`` layouts: each function returns the body of one event; the
store frames bodies with :func:`frame` because only it knows ``log_pos``.
"""

from __future__ import annotations

import struct
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

# -- type codes (MySQL's Log_event_type) -------------------------------------
QUERY = 2
STOP = 3
ROTATE = 4
FORMAT_DESCRIPTION = 15
XID = 16
TABLE_MAP = 19
ROWS_QUERY = 29
WRITE_ROWS = 30  # v2
UPDATE_ROWS = 31
DELETE_ROWS = 32
GTID = 33
ANONYMOUS_GTID = 34
PREVIOUS_GTIDS = 35
HEARTBEAT = 27

TYPE_NAMES = {
    QUERY: "Query", STOP: "Stop", ROTATE: "Rotate", FORMAT_DESCRIPTION: "Format_desc",
    XID: "Xid", TABLE_MAP: "Table_map", ROWS_QUERY: "Rows_query",
    WRITE_ROWS: "Write_rows", UPDATE_ROWS: "Update_rows", DELETE_ROWS: "Delete_rows",
    GTID: "Gtid", ANONYMOUS_GTID: "Anonymous_Gtid", PREVIOUS_GTIDS: "Previous_gtids",
    HEARTBEAT: "Heartbeat",
}
"""The names MySQL's ``SHOW BINLOG EVENTS`` prints in its ``Event_type`` column."""

# -- header flags ------------------------------------------------------------
LOG_EVENT_BINLOG_IN_USE_F = 0x0001
LOG_EVENT_SUPPRESS_USE_F = 0x0008
LOG_EVENT_IGNORABLE_F = 0x0080

HEADER_LEN = 19
CHECKSUM_LEN = 4
MAGIC = b"\xfebin"
FLAGS_OFFSET = 17  # of the flags field within a header

BINLOG_CHECKSUM_ALG_CRC32 = 1
STMT_END_F = 0x0001  # rows event flag: the last rows event of a statement
TM_BIT_LEN_EXACT_F = 0x0001  # Table_map flag MySQL always sets

_HEADER = struct.Struct("<IBIIIH")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

# Post-header lengths MySQL 8.0.36 announces in its Format_description, indexed by
# type code - 1 (types 1..41); a reader uses them to find each event's body.
POST_HEADER_LENGTHS = bytes([
    56, 13, 0, 8, 0, 18, 0, 4, 4, 4, 4, 18, 0, 0, 98, 0, 4, 26, 8, 0, 0, 0, 8, 8, 8, 2, 0, 0,
    0, 10, 10, 10, 42, 42, 0, 18, 52, 0, 10, 40, 0,
])
assert len(POST_HEADER_LENGTHS) == 41


def frame(type_code: int, body: bytes, *, timestamp: int, server_id: int, start: int,
          flags: int = 0) -> bytes:
    """The whole event (header + body + CRC32) for one starting at file offset ``start``."""
    size = HEADER_LEN + len(body) + CHECKSUM_LEN
    head = _HEADER.pack(timestamp & 0xFFFFFFFF, type_code, server_id, size,
                        (start + size) & 0xFFFFFFFF, flags)
    if type_code == FORMAT_DESCRIPTION and flags & LOG_EVENT_BINLOG_IN_USE_F:
        crc_head = head[:FLAGS_OFFSET] + _U16.pack(flags & ~LOG_EVENT_BINLOG_IN_USE_F)
        crc = zlib.crc32(body, zlib.crc32(crc_head))
    else:
        crc = zlib.crc32(body, zlib.crc32(head))
    return head + body + _U32.pack(crc)


def packed_int(n: int) -> bytes:
    """MySQL's length-encoded integer (``net_store_length``)."""
    if n < 251:
        return bytes([n])
    if n < 1 << 16:
        return b"\xfc" + _U16.pack(n)
    if n < 1 << 24:
        return b"\xfd" + n.to_bytes(3, "little")
    return b"\xfe" + _U64.pack(n)


# -- control events ----------------------------------------------------------


def format_description(server_version: str, *, create_timestamp: int = 0) -> bytes:
    """Format_description body: binlog v4, the server version, CRC32 announced."""
    ver = server_version.encode("ascii")[:49].ljust(50, b"\0")
    return (_U16.pack(4) + ver + _U32.pack(create_timestamp) + bytes([HEADER_LEN])
            + POST_HEADER_LENGTHS + bytes([BINLOG_CHECKSUM_ALG_CRC32]))


def previous_gtids(sets: list[tuple[str, list[tuple[int, int]]]]) -> bytes:
    """Previous_gtids body (MySQL 8): per server UUID its GNO intervals, each
    ``(first, last)`` inclusive (encoded half-open, as MySQL does)."""
    out = bytearray(_U64.pack(len(sets)))
    for sid, intervals in sets:
        out += uuid.UUID(sid).bytes + _U64.pack(len(intervals))
        for first, last in intervals:
            out += _U64.pack(first) + _U64.pack(last + 1)
    return bytes(out)


def _ts7(us: int) -> bytes:
    return (us & ((1 << 55) - 1)).to_bytes(7, "little")


def gtid(sid: str, gno: int, *, last_committed: int, sequence_number: int, commit_us: int,
         transaction_length: int, server_version: int) -> bytes:
    """GTID event body (MySQL 8.0.14+): flags, SID, GNO, the logical clock, the commit
    timestamp (original = immediate: written once, as a source does), the transaction's
    length in bytes (this event included) and the server version (written once)."""
    return (b"\x00" + uuid.UUID(sid).bytes + _U64.pack(gno) + b"\x02"
            + _U64.pack(last_committed) + _U64.pack(sequence_number) + _ts7(commit_us)
            + packed_int(transaction_length) + _U32.pack(server_version & 0x7FFFFFFF))


GTID_FIXED_LEN = 1 + 16 + 8 + 1 + 8 + 8 + 7 + 4
"""Bytes of a GTID event body besides the packed transaction length."""


def gtid_event_size(transaction_rest: int) -> int:
    """The size of the framed GTID event of a transaction whose other events take
    ``transaction_rest`` bytes (transaction_length counts the GTID event itself)."""
    size = HEADER_LEN + GTID_FIXED_LEN + 1 + CHECKSUM_LEN
    while True:
        total = transaction_rest + size
        want = HEADER_LEN + GTID_FIXED_LEN + len(packed_int(total)) + CHECKSUM_LEN
        if want == size:
            return size
        size = want


def query(sql: str, *, db: str = "", thread_id: int = 1, exec_time: int = 0,
          sql_mode: int = 0, charset: int = 45) -> bytes:
    """Query body: thread id, exec time, db, error 0, status variables (flags2, sql_mode,
    catalog ``std``, charsets) - only codes every MySQL and MariaDB reader knows."""
    status = (b"\x00" + _U32.pack(0)  # Q_FLAGS2_CODE
              + b"\x01" + _U64.pack(sql_mode)  # Q_SQL_MODE_CODE
              + b"\x06" + bytes([3]) + b"std"  # Q_CATALOG_NZ_CODE
              + b"\x04" + _U16.pack(charset) * 3)  # Q_CHARSET_CODE: client, connection, server
    dbb = db.encode("utf-8")
    return (_U32.pack(thread_id) + _U32.pack(exec_time) + bytes([len(dbb)]) + _U16.pack(0)
            + _U16.pack(len(status)) + status + dbb + b"\0" + sql.encode("utf-8"))


def xid(xid_value: int) -> bytes:
    """Xid body: the transaction id (here: the relay SCN of the transaction)."""
    return _U64.pack(xid_value)


def rotate(next_file: str, position: int = 4) -> bytes:
    """Rotate body: where the next file starts and its name."""
    return _U64.pack(position) + next_file.encode("ascii")


# -- parsing -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EventHeader:
    """One event's header fields and where it is (``pos`` = its start)."""

    pos: int
    timestamp: int
    type_code: int
    server_id: int
    size: int
    log_pos: int
    flags: int

    @property
    def name(self) -> str:
        return TYPE_NAMES.get(self.type_code, f"Unknown({self.type_code})")


def parse_header(data: bytes | bytearray | memoryview, offset: int, pos: int) -> EventHeader:
    """The header at ``data[offset:]``, an event starting at file position ``pos``."""
    ts, tc, sid, size, log_pos, flags = _HEADER.unpack_from(data, offset)
    return EventHeader(pos, ts, tc, sid, size, log_pos, flags)


def check_crc(event: bytes | bytearray | memoryview) -> bool:
    """Whether a whole event's CRC32 matches (clearing the in-use flag of a
    Format_description first, as readers do)."""
    raw = bytearray(event)
    if raw[4] == FORMAT_DESCRIPTION:
        raw[FLAGS_OFFSET] &= ~LOG_EVENT_BINLOG_IN_USE_F & 0xFF
    stored: int = _U32.unpack_from(raw, len(raw) - CHECKSUM_LEN)[0]
    return zlib.crc32(raw[:-CHECKSUM_LEN]) == stored


def iter_headers(data: bytes | bytearray | memoryview, start: int = 4) -> Iterator[EventHeader]:
    """Headers of the whole events in ``data`` (a file's bytes) from ``start``; stops
    at a torn tail (an event that does not fit)."""
    pos = start
    end = len(data)
    while pos + HEADER_LEN <= end:
        h = parse_header(data, pos, pos)
        if h.size < HEADER_LEN or pos + h.size > end:
            return
        yield h
        pos += h.size
