"""Binlog v4 event encoders (MySQL 8.0 layout), a header parser for tests and readers,
the events a dump makes up, and what ``SHOW BINLOG EVENTS`` prints of each.

Every event is ``header (19 bytes) + body + CRC32 (4 bytes)``; all integers little-endian.
The header's layout, the type codes and the flags are MySQL's, shared with the MySQL
source: :mod:`databus.core.mysqlwire`. ``log_pos`` is the position of the *end* of the
event in its file.

The checksum is ``zlib.crc32`` of header + body (binlog_checksum=CRC32). A
Format_description event that carries ``LOG_EVENT_BINLOG_IN_USE_F`` has its checksum
computed with that flag cleared (MySQL clears the flag in place when it closes a file,
and readers clear it before they verify), so the flag can be reset without rewriting
the checksum.

No maintained Python library *writes* binlog events (python-mysql-replication and
mysql-mimic only read or relay them), so the encoders are written here, after MySQL
8.0's ``libbinlogevents`` layouts: each function returns the body of one event; the
store frames bodies with :func:`frame` because only it knows ``log_pos``. The events a
dump thread makes up (its artificial Rotate, heartbeats, a file's Format_description as
sent) are whole events: :func:`fake_rotate`, :func:`heartbeat`, :func:`client_fde`.
"""

from __future__ import annotations

import struct
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from databus.core.mysqlwire import (
    BINLOG_CHECKSUM_ALG_CRC32,
    CHECKSUM_LEN,
    EVENT_HEADER,
    FLAGS_OFFSET,
    HEADER_LEN,
    LEN_OFFSET,
    LOG_EVENT_ARTIFICIAL_F,
    LOG_EVENT_BINLOG_IN_USE_F,
    LOG_POS_OFFSET,
    TYPE_OFFSET,
    EventType,
)

TYPE_NAMES: dict[int, str] = {
    EventType.QUERY: "Query", EventType.STOP: "Stop", EventType.ROTATE: "Rotate",
    EventType.FORMAT_DESCRIPTION: "Format_desc", EventType.XID: "Xid",
    EventType.TABLE_MAP: "Table_map", EventType.ROWS_QUERY: "Rows_query",
    EventType.WRITE_ROWS: "Write_rows", EventType.UPDATE_ROWS: "Update_rows",
    EventType.DELETE_ROWS: "Delete_rows", EventType.MYSQL_GTID: "Gtid",
    EventType.ANONYMOUS_GTID: "Anonymous_Gtid", EventType.PREVIOUS_GTIDS: "Previous_gtids",
    EventType.HEARTBEAT: "Heartbeat",
}
"""The names MySQL's ``SHOW BINLOG EVENTS`` prints in its ``Event_type`` column."""

STMT_END_F = 0x0001  # rows event flag: the last rows event of a statement
TM_BIT_LEN_EXACT_F = 0x0001  # Table_map flag MySQL always sets
# Format_description: binlog version (2) + server version (50), then the created timestamp
FDE_CREATED_OFFSET = HEADER_LEN + 2 + 50

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
    head = EVENT_HEADER.pack(timestamp & 0xFFFFFFFF, type_code, server_id, size,
                        (start + size) & 0xFFFFFFFF, flags)
    if type_code == EventType.FORMAT_DESCRIPTION and flags & LOG_EVENT_BINLOG_IN_USE_F:
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
    ts, tc, sid, size, log_pos, flags = EVENT_HEADER.unpack_from(data, offset)
    return EventHeader(pos, ts, tc, sid, size, log_pos, flags)


def check_crc(event: bytes | bytearray | memoryview) -> bool:
    """Whether a whole event's CRC32 matches (clearing the in-use flag of a
    Format_description first, as readers do)."""
    raw = bytearray(event)
    if raw[TYPE_OFFSET] == EventType.FORMAT_DESCRIPTION:
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


# -- events a dump makes up (MySQL's dump thread sends them; no file holds them) -----------


def _finish(event: bytearray, checksum: bool) -> bytes:
    """``event`` with its size in its header and, with ``checksum``, its CRC32 over the
    whole event, size included (the size first: a reader checks the CRC of the bytes it
    received)."""
    _U32.pack_into(event, LEN_OFFSET, len(event) + (CHECKSUM_LEN if checksum else 0))
    if checksum:
        event += _U32.pack(zlib.crc32(event) & 0xFFFFFFFF)
    return bytes(event)


def fake_rotate(server_id: int, file: str, pos: int, checksum: bool) -> bytes:
    """MySQL's artificial Rotate: timestamp 0, log_pos 0, ``LOG_EVENT_ARTIFICIAL_F``."""
    ev = bytearray(EVENT_HEADER.pack(0, EventType.ROTATE, server_id, 0, 0,
                                     LOG_EVENT_ARTIFICIAL_F))
    ev += _U64.pack(pos) + file.encode()
    return _finish(ev, checksum)


def heartbeat(server_id: int, file: str, pos: int, checksum: bool) -> bytes:
    """``HEARTBEAT_LOG_EVENT``: log_pos = where the stream is, body = the file's name."""
    ev = bytearray(EVENT_HEADER.pack(0, EventType.HEARTBEAT, server_id, 0,
                                     pos & 0xFFFFFFFF, 0))
    ev += file.encode()
    return _finish(ev, checksum)


def client_fde(raw: bytes, clear_log_pos: bool) -> tuple[bytes, bool]:
    """A file's Format_description as a dump sends it (its in-use flag cleared; with
    ``clear_log_pos``, for a dump that starts past the file's start, its ``log_pos`` and
    created timestamp zeroed; its CRC32 recomputed), and whether the file's events carry
    a CRC32."""
    ev = bytearray(raw)
    with_crc = len(ev) > HEADER_LEN + 57 + 5 and ev[-5] == BINLOG_CHECKSUM_ALG_CRC32
    ev[FLAGS_OFFSET] &= ~LOG_EVENT_BINLOG_IN_USE_F & 0xFF
    if clear_log_pos:
        _U32.pack_into(ev, LOG_POS_OFFSET, 0)
        _U32.pack_into(ev, FDE_CREATED_OFFSET, 0)
    if with_crc:
        _U32.pack_into(ev, len(ev) - 4, zlib.crc32(ev[:-4]) & 0xFFFFFFFF)
    return bytes(ev), with_crc


# -- what SHOW BINLOG EVENTS prints ---------------------------------------------------------


def event_info(type_code: int, event: bytes) -> str:
    """The Info column of ``SHOW BINLOG EVENTS`` for one whole event, MySQL's wording for
    the common events ("" for the others and for a body that does not parse)."""
    body = event[HEADER_LEN:]
    try:
        if type_code == EventType.FORMAT_DESCRIPTION:
            version = body[2:52].rstrip(b"\x00").decode()
            return f"Server ver: {version}, Binlog ver: {_U16.unpack_from(body)[0]}"
        if type_code == EventType.ROTATE:
            (pos,) = _U64.unpack_from(body)
            return f"{body[8:-4].decode()};pos={pos}"
        if type_code == EventType.MYSQL_GTID:
            sid = uuid.UUID(bytes=bytes(body[1:17]))
            (gno,) = struct.unpack_from("<q", body, 17)
            return f"SET @@SESSION.GTID_NEXT= '{sid}:{gno}'"
        if type_code == EventType.XID:
            return f"COMMIT /* xid={_U64.unpack_from(body)[0]} */"
        if type_code == EventType.QUERY:
            db_len, n_status = body[8], _U16.unpack_from(body, 11)[0]
            start = 13 + n_status
            db = body[start:start + db_len].decode("utf-8", "replace")
            sql = body[start + db_len + 1:-4].decode("utf-8", "replace")
            return f"use `{db}`; {sql}" if db and sql.upper() != "BEGIN" else sql
        if type_code == EventType.TABLE_MAP:
            table_id = int.from_bytes(body[:6], "little")
            db_len = body[8]
            db = body[9:9 + db_len].decode("utf-8", "replace")
            t_len = body[10 + db_len]
            table = body[11 + db_len:11 + db_len + t_len].decode("utf-8", "replace")
            return f"table_id: {table_id} ({db}.{table})"
        if type_code in (EventType.WRITE_ROWS, EventType.UPDATE_ROWS, EventType.DELETE_ROWS):
            table_id = int.from_bytes(body[:6], "little")
            flags = _U16.unpack_from(body, 6)[0]
            return f"table_id: {table_id}" + (" flags: STMT_END_F" if flags & STMT_END_F
                                              else "")
    except (struct.error, IndexError, UnicodeDecodeError, ValueError):
        return ""
    return ""
