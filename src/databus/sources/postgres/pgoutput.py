"""Decoding of pgoutput's messages (logical replication protocol, versions 1 and 2).

Written here rather than taken from a library: the maintained Python drivers
carry the replication protocol's framing (psycopg2) but not pgoutput's message
bodies, and the decoders on PyPI are unmaintained or absent. The format is
small and fixed by PostgreSQL's "Logical Replication Message Formats": one
type byte, then big-endian integers, NUL-terminated strings and tuple data.

Pure and without I/O: :func:`decode` turns one payload into one message object.
Tuple values are ``None`` (SQL NULL), :data:`UNCHANGED` (a TOASTed value the
update did not change, which the server does not send) or the value's text
(the type's output function, as ``SELECT`` returns it) as UTF-8 bytes, left
undecoded: most of it is copied into Avro as it is. Binary-format values
(``binary`` option) are never asked for and refused. A message type
this module does not know raises
:class:`~databus.core.errors.UnsupportedEventError`: nothing is skipped.

Protocol 2 adds streamed transactions: Stream Start, Stop, Commit and Abort
messages, and, inside a stream block (between Start and Stop), the id of the
(sub)transaction after the type byte of every other message
(:func:`streamed_xid`, :func:`unstreamed`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from databus.core.errors import CorruptEventError, UnsupportedEventError

PG_EPOCH_US: Final = 946_684_800_000_000
"""PostgreSQL timestamps count microseconds from 2000-01-01 UTC."""


class _Unchanged:
    __slots__ = ()

    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED: Final = _Unchanged()
"""An unchanged TOASTed value in an update's new tuple (not sent by the server)."""

Value = bytes | None | _Unchanged

KEY_FLAG: Final = 1
"""A Relation column flag: the column is part of the replica identity."""


@dataclass(frozen=True, slots=True)
class Column:
    flags: int
    name: str
    type_oid: int
    typmod: int

    @property
    def in_identity(self) -> bool:
        return bool(self.flags & KEY_FLAG)


@dataclass(frozen=True, slots=True)
class Relation:
    """A table's shape as the server describes it before its first change (and after
    every change of its definition)."""

    oid: int
    namespace: str
    name: str
    replica_identity: str  # d(efault), n(othing), f(ull), i(ndex)
    columns: tuple[Column, ...]


@dataclass(frozen=True, slots=True)
class Begin:
    final_lsn: int
    commit_ts_us: int
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_ts_us: int


@dataclass(frozen=True, slots=True)
class Origin:
    lsn: int
    name: str


@dataclass(frozen=True, slots=True)
class TypeInfo:
    oid: int
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class Insert:
    rel: int
    new: list[Value]


@dataclass(frozen=True, slots=True)
class Update:
    rel: int
    old_kind: str  # "" (no old tuple), "K" (identity columns only), "O" (whole old row)
    old: list[Value] | None
    new: list[Value]


@dataclass(frozen=True, slots=True)
class Delete:
    rel: int
    old_kind: str  # "K" or "O"
    old: list[Value]


@dataclass(frozen=True, slots=True)
class Truncate:
    options: int  # 1: CASCADE, 2: RESTART IDENTITY
    rels: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class LogicalMessage:
    transactional: bool
    lsn: int
    prefix: str
    content: bytes


@dataclass(frozen=True, slots=True)
class StreamStart:
    xid: int
    first: bool  # the first block of this transaction


@dataclass(frozen=True, slots=True)
class StreamStop:
    pass


@dataclass(frozen=True, slots=True)
class StreamCommit:
    xid: int
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_ts_us: int


@dataclass(frozen=True, slots=True)
class StreamAbort:
    xid: int
    subxid: int  # == xid: the whole transaction


Message = (Begin | Commit | Origin | Relation | TypeInfo | Insert | Update | Delete | Truncate
           | LogicalMessage | StreamStart | StreamStop | StreamCommit | StreamAbort)

STREAM_START, STREAM_STOP, STREAM_COMMIT, STREAM_ABORT = 0x53, 0x45, 0x63, 0x41

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_U64 = struct.Struct(">Q")


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 1  # after the type byte

    def byte(self) -> int:
        if self.pos >= len(self.buf):
            raise CorruptEventError("pgoutput message truncated")
        b = self.buf[self.pos]
        self.pos += 1
        return b

    def _fixed(self, st: struct.Struct) -> int:
        try:
            (v,) = st.unpack_from(self.buf, self.pos)
        except struct.error:
            raise CorruptEventError("pgoutput message truncated") from None
        self.pos += st.size
        return int(v)

    def i16(self) -> int:
        return self._fixed(_I16)

    def i32(self) -> int:
        return self._fixed(_I32)

    def u32(self) -> int:
        return self._fixed(_U32)

    def i64(self) -> int:
        return self._fixed(_I64)

    def u64(self) -> int:
        return self._fixed(_U64)

    def string(self) -> str:
        end = self.buf.find(b"\0", self.pos)
        if end < 0:
            raise CorruptEventError("pgoutput string without its terminator")
        s = self.buf[self.pos:end].decode("utf-8")
        self.pos = end + 1
        return s

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise CorruptEventError("pgoutput value runs past the message")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def tuple(self) -> list[Value]:
        out, self.pos = _tuple(self.buf, self.pos)
        return out


def _tuple(buf: bytes, pos: int) -> tuple[list[Value], int]:
    """TupleData at ``pos``: its values and the position after it (the hot path of
    decoding: one loop, no calls per column but the slicing)."""
    end = len(buf)
    try:
        n = (buf[pos] << 8) | buf[pos + 1]
        pos += 2
        out: list[Value] = []
        for _ in range(n):
            kind = buf[pos]
            pos += 1
            if kind == 0x74:  # 't'
                size = int.from_bytes(buf[pos:pos + 4], "big")
                pos += 4
                if pos + size > end:
                    raise CorruptEventError("pgoutput value runs past the message")
                out.append(buf[pos:pos + size])
                pos += size
            elif kind == 0x6E:  # 'n'
                out.append(None)
            elif kind == 0x75:  # 'u'
                out.append(UNCHANGED)
            else:
                raise CorruptEventError(f"pgoutput tuple column of unknown kind {kind:#x}")
    except IndexError:
        raise CorruptEventError("pgoutput tuple truncated") from None
    return out, pos


def decode(payload: bytes) -> Message:
    """One pgoutput message."""
    if not payload:
        raise CorruptEventError("empty pgoutput message")
    r = _Reader(payload)
    t = payload[0]
    if t == 0x42:  # 'B'
        return Begin(r.u64(), r.i64(), r.u32())
    if t == 0x43:  # 'C'
        return Commit(r.byte(), r.u64(), r.u64(), r.i64())
    if t == 0x49:  # 'I'
        if len(payload) < 6 or payload[5] != 0x4E:
            raise CorruptEventError("pgoutput Insert without its new tuple")
        return Insert(int.from_bytes(payload[1:5], "big"), _tuple(payload, 6)[0])
    if t == 0x55:  # 'U'
        rel = r.u32()
        kind = r.byte()
        old: list[Value] | None = None
        old_kind = ""
        if kind in (0x4B, 0x4F):  # 'K', 'O'
            old_kind = chr(kind)
            old = r.tuple()
            kind = r.byte()
        if kind != 0x4E:
            raise CorruptEventError("pgoutput Update without its new tuple")
        return Update(rel, old_kind, old, r.tuple())
    if t == 0x44:  # 'D'
        rel = r.u32()
        kind = r.byte()
        if kind not in (0x4B, 0x4F):
            raise CorruptEventError("pgoutput Delete without its old tuple")
        return Delete(rel, chr(kind), r.tuple())
    if t == 0x52:  # 'R'
        oid = r.u32()
        namespace, name = r.string(), r.string()
        ident = chr(r.byte())
        cols = []
        for _ in range(r.i16()):
            flags = r.byte()
            cols.append(Column(flags, r.string(), r.u32(), r.i32()))
        return Relation(oid, namespace, name, ident, tuple(cols))
    if t == 0x59:  # 'Y'
        return TypeInfo(r.u32(), r.string(), r.string())
    if t == 0x4F:  # 'O'
        return Origin(r.u64(), r.string())
    if t == 0x54:  # 'T'
        n = r.i32()
        options = r.byte()
        return Truncate(options, tuple(r.u32() for _ in range(n)))
    if t == 0x4D:  # 'M'
        flags = r.byte()
        lsn = r.u64()
        prefix = r.string()
        return LogicalMessage(bool(flags & 1), lsn, prefix, r.take(r.i32()))
    if t == STREAM_START:
        return StreamStart(r.u32(), r.byte() == 1)
    if t == STREAM_STOP:
        return StreamStop()
    if t == STREAM_COMMIT:
        return StreamCommit(r.u32(), r.byte(), r.u64(), r.u64(), r.i64())
    if t == STREAM_ABORT:
        return StreamAbort(r.u32(), r.u32())
    raise UnsupportedEventError(
        f"pgoutput message type {chr(t)!r} is not supported by this source (protocol"
        " versions 1 and 2); capture stopped before it, nothing was skipped")


def streamed_xid(payload: bytes) -> int:
    """The (sub)transaction id of a message inside a stream block."""
    if len(payload) < 5:
        raise CorruptEventError("pgoutput streamed message truncated")
    return int.from_bytes(payload[1:5], "big")


def unstreamed(payload: bytes) -> bytes:
    """A message of a stream block without its transaction id: as protocol 1 sends it."""
    if len(payload) < 5:
        raise CorruptEventError("pgoutput streamed message truncated")
    return payload[:1] + payload[5:]


def lsn_text(lsn: int) -> str:
    """An LSN as PostgreSQL writes it (``16/B374D848``)."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    hi, _, lo = text.partition("/")
    return (int(hi, 16) << 32) | int(lo, 16)
