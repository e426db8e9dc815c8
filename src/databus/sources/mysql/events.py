"""Binlog event framing: the common header and the events that steer a reader.

Every binlog event starts with a 19-byte little-endian header::

    timestamp u32 | type u8 | server_id u32 | event_size u32 | log_pos u32 | flags u16

``log_pos`` is the position of the *next* event in the binlog file. With
``binlog_checksum=CRC32`` the last 4 bytes of an event are the CRC-32 of the
rest; :func:`parse_header` checks it. Row events are decoded elsewhere (per
table version); this module parses what a reader needs to follow the stream:
rotation, format description, GTIDs, transaction ends, table maps.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import NamedTuple

from databus.core.errors import CorruptEventError
from databus.core.mysqlwire import EVENT_HEADER as HEADER
from databus.core.mysqlwire import LOG_EVENT_IGNORABLE_F as LOG_EVENT_IGNORABLE_F
from databus.core.mysqlwire import EventType as EventType

# events that carry nothing this source needs: read and passed over by name; any other
# type stops capture (UnsupportedEventError) unless its header flags say it is ignorable
PASSED_OVER = frozenset({
    3,    # STOP: the server stopped; the next file follows
    5,    # INTVAR: statement-based context (the source requires ROW)
    13,   # RAND: statement-based context
    14,   # USER_VAR: statement-based context
    15,   # FORMAT_DESCRIPTION: read by parse_header for its checksum flag
    27,   # HEARTBEAT: the server is idle (the source may send a progress window)
    29,   # ROWS_QUERY (MySQL): the statement text of the rows that follow
    34,   # ANONYMOUS_GTID (MySQL, gtid_mode=OFF): a transaction starts
    35,   # PREVIOUS_GTIDS (MySQL): the GTID set of earlier files
    160,  # ANNOTATE_ROWS (MariaDB): the statement text of the rows that follow
    161,  # BINLOG_CHECKPOINT (MariaDB)
    163,  # GTID_LIST (MariaDB): the GTID state at the file's start
})
_NAMES = {26: "INCIDENT", 39: "PARTIAL_UPDATE_ROWS (binlog_row_value_options=PARTIAL_JSON)",
          40: "TRANSACTION_PAYLOAD (binlog_transaction_compression=ON)",
          164: "START_ENCRYPTION (encrypt_binlog=ON)"}


def event_name(event_type: int) -> str:
    """A readable name of an event type, for error messages."""
    if event_type in _NAMES:
        return _NAMES[event_type]
    try:
        return EventType(event_type).name
    except ValueError:
        return "unknown"


ROW_EVENTS = frozenset({EventType.WRITE_ROWS_V1, EventType.UPDATE_ROWS_V1,
                        EventType.DELETE_ROWS_V1, EventType.WRITE_ROWS,
                        EventType.UPDATE_ROWS, EventType.DELETE_ROWS})


class EventHeader(NamedTuple):
    """The common header (a tuple: one is made per event, four per one-row transaction)."""

    timestamp: int
    type: int
    server_id: int
    size: int
    next_pos: int
    flags: int


_make_header = EventHeader._make
_unpack_header = HEADER.unpack_from
_unpack_u32 = struct.Struct("<I").unpack_from
_crc32 = zlib.crc32


def parse_header(event: bytes, checksum: bool) -> tuple[EventHeader, memoryview]:
    """The header and the body (checksum removed) of one event; checks size and CRC."""
    end = len(event)
    if end < 19:
        raise CorruptEventError(f"binlog event shorter than its header ({end} bytes)")
    h = _make_header(_unpack_header(event, 0))
    if h.size != end:
        raise CorruptEventError(f"binlog event says {h.size} bytes, got {end}")
    # a format description event states its own algorithm (the byte before the CRC)
    has_crc = event[-5] == 1 if h.type == EventType.FORMAT_DESCRIPTION else checksum
    view = memoryview(event)
    if has_crc:
        end -= 4
        if _crc32(view[:end]) != _unpack_u32(event, end)[0]:
            raise CorruptEventError(f"binlog event CRC32 mismatch (type {h.type},"
                                    f" next pos {h.next_pos})")
    return h, view[19:end]


@dataclass(frozen=True, slots=True)
class Rotate:
    position: int
    file: str


def parse_rotate(body: memoryview) -> Rotate:
    return Rotate(struct.unpack_from("<Q", body, 0)[0], bytes(body[8:]).decode())


@dataclass(frozen=True, slots=True)
class MariadbGtid:
    """MariaDB GTID event: starts a transaction (``domain-server-seq``)."""

    seq_no: int
    domain_id: int
    flags: int

    def text(self, server_id: int) -> str:
        return f"{self.domain_id}-{server_id}-{self.seq_no}"


def parse_mysql_gtid(body: memoryview) -> str:
    """MySQL GTID event: ``flags u8 | server uuid (16) | gno i64 | ...`` -> ``uuid:gno``."""
    if len(body) < 25:
        raise CorruptEventError("MySQL GTID event shorter than 25 bytes")
    raw = bytes(body[1:17]).hex()
    uuid = f"{raw[:8]}-{raw[8:12]}-{raw[12:16]}-{raw[16:20]}-{raw[20:]}"
    return f"{uuid}:{struct.unpack_from('<q', body, 17)[0]}"


def mysql_gtid_set(text: str) -> bytes:
    """A MySQL GTID set (``uuid:1-5:7,uuid2:1-3``) in the binary form of
    ``COM_BINLOG_DUMP_GTID``: n_sids u64, then per sid: uuid (16), n_intervals
    u64, intervals as [start, end) i64 pairs."""
    out = bytearray()
    sids = [p.strip() for p in text.split(",") if p.strip()]
    out += struct.pack("<Q", len(sids))
    for sid in sids:
        uuid, *ranges = sid.split(":")
        raw = bytes.fromhex(uuid.replace("-", ""))
        if len(raw) != 16 or not ranges:
            raise ValueError(f"bad MySQL GTID set element {sid!r}")
        out += raw + struct.pack("<Q", len(ranges))
        for r in ranges:
            start, _, end = r.partition("-")
            lo = int(start)
            hi = int(end) if end else lo
            if hi < lo or lo < 1:
                raise ValueError(f"bad GTID interval {r!r}")
            out += struct.pack("<qq", lo, hi + 1)
    return bytes(out)


def parse_mariadb_gtid(body: memoryview) -> MariadbGtid:
    seq, domain, flags = struct.unpack_from("<QIB", body, 0)
    return MariadbGtid(seq, domain, flags)


@dataclass(frozen=True, slots=True)
class TableMap:
    table_id: int
    schema: str
    table: str
    column_types: bytes


def parse_table_map(body: memoryview) -> TableMap:
    """Table id, names and column types (column metadata is read by the row decoder)."""
    table_id = int.from_bytes(body[0:6], "little")
    pos = 8  # 6-byte table id + 2 flag bytes
    slen = body[pos]
    schema = bytes(body[pos + 1 : pos + 1 + slen]).decode()
    pos += 2 + slen  # length, name, NUL
    tlen = body[pos]
    table = bytes(body[pos + 1 : pos + 1 + tlen]).decode()
    pos += 2 + tlen
    ncols, pos = read_lenenc(body, pos)
    return TableMap(table_id, schema, table, bytes(body[pos : pos + ncols]))


def parse_query(body: memoryview) -> tuple[str, str]:
    """(default schema, statement) of a QUERY event."""
    _thread, _exec, db_len, _err, status_len = struct.unpack_from("<IIBHH", body, 0)
    pos = 13 + status_len
    db = bytes(body[pos : pos + db_len]).decode()
    return db, bytes(body[pos + db_len + 1 :]).decode("utf-8", "replace")


def read_lenenc(buf: memoryview | bytes, pos: int) -> tuple[int, int]:
    """A length-encoded integer at ``pos``: (value, position after it)."""
    first = buf[pos]
    if first < 0xFB:
        return first, pos + 1
    if first == 0xFC:
        return int.from_bytes(buf[pos + 1 : pos + 3], "little"), pos + 3
    if first == 0xFD:
        return int.from_bytes(buf[pos + 1 : pos + 4], "little"), pos + 4
    if first == 0xFE:
        return int.from_bytes(buf[pos + 1 : pos + 9], "little"), pos + 9
    raise CorruptEventError(f"bad length-encoded integer prefix {first:#x}")
