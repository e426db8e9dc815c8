"""The event: one binary layout for the relay buffer, the wire and the stores.

Layout version 2 (DbusEvent V2 family), all integers big-endian. The exact
table is in ``docs/event-format.md``; keep the two in step.

Header, 45 bytes::

    off size field
    0   1    version (= 2)
    1   4    magic 0xCAFEDEED
    5   4    header length (= 45)
    9   4    header CRC: CRC-32 of bytes [0, 9) + [13, 45)
    13  4    body CRC: CRC-32 of bytes [45, total length)
    17  4    total length (header + body)
    21  2    attributes (bit flags, see ``ATTR_*``)
    23  8    timestamp, ns since the epoch
    31  4    source id (int32; negative = control event)
    35  2    physical partition id (int16)
    37  8    sequence = SCN (int64)

Body::

    key         int64, or (attribute KEY_BYTES) int32 length + bytes
    [metadata]  present when attribute HAS_METADATA: a part
    payload     a part

    part = int32 data length, int16 schema version, uint8 digest length,
           digest bytes, data bytes

Data events carry the Avro binary of the row in the payload part (schema id =
digest). The metadata part is Avro of :data:`databus.core.schema.METADATA_SCHEMA`
(before image, source position). Control events have negative source ids and
a payload without schema: EOP (-2) ends a window, CHECKPOINT (-3) carries a
checkpoint JSON, -4..-50 are errors whose payload is JSON.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from enum import IntEnum

from databus.core.errors import CorruptEventError

VERSION = 2
MAGIC = 0xCAFEDEED
HEADER_LEN = 45

# struct for the whole header; fields in layout order
_HEADER = struct.Struct(">BIIIIIHqihq")
_PART_HEAD = struct.Struct(">ihB")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_U32 = struct.Struct(">I")
assert _HEADER.size == HEADER_LEN

# offsets used by fast scanners
OFF_TOTAL_LEN = 17
OFF_ATTRIBUTES = 21
OFF_TIMESTAMP = 23
OFF_SRC_ID = 31
OFF_PARTITION = 35
OFF_SCN = 37

# attributes
ATTR_OPCODE_MASK = 0x0007
ATTR_KEY_BYTES = 0x0008
ATTR_HAS_METADATA = 0x0010
ATTR_SNAPSHOT = 0x0020  # the row comes from a snapshot read, not the log
ATTR_TRACE = 0x0040

# control source ids
SRC_EOP = -2
SRC_CHECKPOINT = -3
SRC_ERROR_FIRST = -4
SRC_ERROR_LAST = -50
# in a reduced answer (/stream newest=true): key = the window's data events left out
# before the next one, so a reader's index of each event in its window stays exact
SRC_DROPPED = -51


class Op(IntEnum):
    """Row operation, stored in the low three attribute bits."""

    NONE = 0  # control events
    INSERT = 1
    UPDATE = 2
    DELETE = 3
    READ = 4  # snapshot read ("r")
    TRUNCATE = 5

    @property
    def letter(self) -> str:
        """The Debezium envelope letter for this op."""
        return _OP_LETTERS[self]


_OP_LETTERS = {
    Op.NONE: "",
    Op.INSERT: "c",
    Op.UPDATE: "u",
    Op.DELETE: "d",
    Op.READ: "r",
    Op.TRUNCATE: "t",
}


@dataclass(frozen=True, slots=True)
class Event:
    """A decoded event. ``key`` is ``int`` or ``bytes`` (see ATTR_KEY_BYTES)."""

    scn: int
    src_id: int
    key: int | bytes
    attributes: int = 0
    timestamp_ns: int = 0
    partition: int = 0
    schema_id: bytes = b""
    schema_version: int = 0
    payload: bytes = b""
    metadata_schema_id: bytes = b""
    metadata: bytes | None = None

    @property
    def op(self) -> Op:
        return Op(self.attributes & ATTR_OPCODE_MASK)

    @property
    def is_control(self) -> bool:
        return self.src_id < 0

    @property
    def is_eop(self) -> bool:
        return self.src_id == SRC_EOP

    @property
    def is_snapshot(self) -> bool:
        return bool(self.attributes & ATTR_SNAPSHOT)


def _part(schema_version: int, digest: bytes, data: bytes) -> bytes:
    return _PART_HEAD.pack(len(data), schema_version, len(digest)) + digest + data


def encode(
    *,
    scn: int,
    src_id: int,
    key: int | bytes,
    payload: bytes,
    schema_id: bytes = b"",
    schema_version: int = 0,
    op: Op = Op.NONE,
    timestamp_ns: int = 0,
    partition: int = 0,
    metadata: bytes | None = None,
    metadata_schema_id: bytes = b"",
    extra_attributes: int = 0,
) -> bytes:
    """Serialise one event; returns its complete bytes (header + body)."""
    attributes = (int(op) & ATTR_OPCODE_MASK) | extra_attributes
    if isinstance(key, bytes):
        attributes |= ATTR_KEY_BYTES
        key_part = _I32.pack(len(key)) + key
    else:
        key_part = _I64.pack(key)
    body = key_part
    if metadata is not None:
        attributes |= ATTR_HAS_METADATA
        body += _part(0, metadata_schema_id, metadata)
    body += _part(schema_version, schema_id, payload)
    total = HEADER_LEN + len(body)
    body_crc = zlib.crc32(body)
    head = _HEADER.pack(
        VERSION, MAGIC, HEADER_LEN, 0, body_crc, total, attributes,
        timestamp_ns, src_id, partition, scn,
    )
    header_crc = zlib.crc32(head[13:], zlib.crc32(head[:9]))
    return head[:9] + _U32.pack(header_crc) + head[13:] + body


def encode_eop(scn: int, timestamp_ns: int = 0, partition: int = 0) -> bytes:
    """The end-of-window control event for window ``scn``."""
    return encode(scn=scn, src_id=SRC_EOP, key=0, payload=b"", timestamp_ns=timestamp_ns,
                  partition=partition)


def encode_control(scn: int, src_id: int, payload: bytes, timestamp_ns: int = 0) -> bytes:
    """A control event (checkpoint, error) with a schema-less payload."""
    if src_id >= 0:
        raise ValueError("control events have negative source ids")
    return encode(scn=scn, src_id=src_id, key=0, payload=payload, timestamp_ns=timestamp_ns)


def check_header(buf: bytes | bytearray | memoryview, offset: int = 0) -> int:
    """Validate the header at ``offset`` and return the event's total length.

    Checks version, magic, header length and header CRC, and that the whole
    event lies inside ``buf``. Raises :class:`CorruptEventError`.
    """
    end = len(buf)
    if end - offset < HEADER_LEN:
        raise CorruptEventError(f"truncated header at offset {offset}")
    (version, magic, header_len, header_crc, _body_crc, total, *_rest) = _HEADER.unpack_from(
        buf, offset
    )
    if version != VERSION or magic != MAGIC or header_len != HEADER_LEN:
        raise CorruptEventError(
            f"not a v{VERSION} event at offset {offset} (version={version}, magic={magic:#x})"
        )
    mv = memoryview(buf)
    crc = zlib.crc32(mv[offset + 13 : offset + HEADER_LEN], zlib.crc32(mv[offset : offset + 9]))
    if crc != header_crc:
        raise CorruptEventError(f"header CRC mismatch at offset {offset}")
    if total < HEADER_LEN + 8 + _PART_HEAD.size or offset + total > end:
        raise CorruptEventError(f"bad total length {total} at offset {offset}")
    return int(total)


def check_event(buf: bytes | bytearray | memoryview, offset: int = 0) -> int:
    """Validate header and body CRC of the event at ``offset``; return its length."""
    total = check_header(buf, offset)
    body_crc = _U32.unpack_from(buf, offset + 13)[0]
    if zlib.crc32(memoryview(buf)[offset + HEADER_LEN : offset + total]) != body_crc:
        raise CorruptEventError(f"body CRC mismatch at offset {offset}")
    return total


def _check_length(buf: bytes | bytearray | memoryview, offset: int) -> int:
    """The event's total length, checked against ``buf`` (no version, magic or CRC)."""
    end = len(buf)
    if end - offset < HEADER_LEN:
        raise CorruptEventError(f"truncated header at offset {offset}")
    total = int(_I32.unpack_from(buf, offset + OFF_TOTAL_LEN)[0])
    if total < HEADER_LEN + 8 + _PART_HEAD.size or offset + total > end:
        raise CorruptEventError(f"bad total length {total} at offset {offset}")
    return total


def decode(buf: bytes | bytearray | memoryview, offset: int = 0, *, verify: bool = True) -> Event:
    """Decode the event at ``offset``. Both CRCs are checked unless ``verify`` is false;
    lengths always are: a truncated or malformed event is a :class:`CorruptEventError`."""
    total = check_event(buf, offset) if verify else _check_length(buf, offset)
    (_v, _m, _hl, _hc, _bc, _t, attributes, ts, src_id, partition, scn) = _HEADER.unpack_from(
        buf, offset
    )
    pos = offset + HEADER_LEN
    key: int | bytes
    try:
        if attributes & ATTR_KEY_BYTES:
            klen = _I32.unpack_from(buf, pos)[0]
            if klen < 0 or pos + 4 + klen > offset + total:
                raise CorruptEventError(f"bad key length at offset {offset}")
            key = bytes(buf[pos + 4 : pos + 4 + klen])
            pos += 4 + klen
        else:
            key = _I64.unpack_from(buf, pos)[0]
            pos += 8
        metadata: bytes | None = None
        meta_digest = b""
        if attributes & ATTR_HAS_METADATA:
            _sv, meta_digest, metadata, pos = _read_part(buf, pos, offset + total)
        schema_version, digest, payload, pos = _read_part(buf, pos, offset + total)
    except struct.error as exc:
        raise CorruptEventError(f"truncated body at offset {offset}") from exc
    if pos != offset + total:
        raise CorruptEventError(f"body length mismatch at offset {offset}")
    return Event(
        scn=scn, src_id=src_id, key=key, attributes=attributes, timestamp_ns=ts,
        partition=partition, schema_id=digest, schema_version=schema_version,
        payload=payload, metadata_schema_id=meta_digest, metadata=metadata,
    )


def _read_part(
    buf: bytes | bytearray | memoryview, pos: int, end: int
) -> tuple[int, bytes, bytes, int]:
    dlen, schema_version, digest_len = _PART_HEAD.unpack_from(buf, pos)
    pos += _PART_HEAD.size
    if dlen < 0 or pos + digest_len + dlen > end:
        raise CorruptEventError("bad part length")
    digest = bytes(buf[pos : pos + digest_len])
    pos += digest_len
    data = bytes(buf[pos : pos + dlen])
    return schema_version, digest, data, pos + dlen


def iter_events(buf: bytes | bytearray | memoryview, *, verify: bool = True) -> Iterator[Event]:
    """Decode every event of a concatenation (e.g. a ``/stream`` response body)."""
    offset = 0
    end = len(buf)
    while offset < end:
        ev = decode(buf, offset, verify=verify)
        offset += _I32.unpack_from(buf, offset + OFF_TOTAL_LEN)[0]
        yield ev


def peek_scn(buf: bytes | bytearray | memoryview, offset: int = 0) -> int:
    """The SCN of the event at ``offset`` without validating it."""
    return int(_I64.unpack_from(buf, offset + OFF_SCN)[0])


def peek_src_id(buf: bytes | bytearray | memoryview, offset: int = 0) -> int:
    return int(_I32.unpack_from(buf, offset + OFF_SRC_ID)[0])


def peek_length(buf: bytes | bytearray | memoryview, offset: int = 0) -> int:
    return int(_I32.unpack_from(buf, offset + OFF_TOTAL_LEN)[0])


def peek_timestamp(buf: bytes | bytearray | memoryview, offset: int = 0) -> int:
    """The timestamp (ns) of the event at ``offset`` without validating it."""
    return int(_I64.unpack_from(buf, offset + OFF_TIMESTAMP)[0])


def peek_key(buf: bytes | bytearray | memoryview, offset: int = 0) -> int | bytes:
    """The key of the event at ``offset`` without decoding the rest."""
    attributes = struct.unpack_from(">H", buf, offset + OFF_ATTRIBUTES)[0]
    pos = offset + HEADER_LEN
    if attributes & ATTR_KEY_BYTES:
        klen = _I32.unpack_from(buf, pos)[0]
        return bytes(buf[pos + 4 : pos + 4 + klen])
    return int(_I64.unpack_from(buf, pos)[0])


def peek_schema_id(buf: bytes | bytearray | memoryview, offset: int = 0) -> bytes:
    """The payload's schema id (digest) of the event at ``offset``, reading only the
    key and part headers (the event must have been checked: no bounds are tested)."""
    attributes = struct.unpack_from(">H", buf, offset + OFF_ATTRIBUTES)[0]
    pos = offset + HEADER_LEN
    pos += 4 + _I32.unpack_from(buf, pos)[0] if attributes & ATTR_KEY_BYTES else 8
    if attributes & ATTR_HAS_METADATA:
        dlen, _sv, digest_len = _PART_HEAD.unpack_from(buf, pos)
        pos += _PART_HEAD.size + digest_len + dlen
    _dlen, _sv, digest_len = _PART_HEAD.unpack_from(buf, pos)
    pos += _PART_HEAD.size
    return bytes(buf[pos : pos + digest_len])
