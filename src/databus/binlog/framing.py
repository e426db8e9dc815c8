"""MySQL packets around binlog events: how a dump's bytes go on the wire.

A MySQL packet is a 3-byte little-endian payload length, a 1-byte sequence number (mod
256, counted on through a command's exchange) and at most ``MAX_PACKET`` (0xFFFFFF) bytes
of payload; a longer payload continues in the next packets, and one that ends exactly at
a piece's limit is followed by an empty packet. In a binlog dump each event is one
payload: the OK byte (0x00), then the event.

:func:`frame_packet` frames one payload (an error, an artificial event); the dump's hot
path frames whole runs of events at once (:func:`frame_events`,
:func:`frame_events_into`), in C where ``databus.client._wiredecode`` was built, with a
Python half that gives the same bytes (``tests/unit/test_binlog_framing.py``). Pure
functions: no I/O, no state but the caller's sequence number.
"""

from __future__ import annotations

import importlib
import struct
from typing import Any, Protocol

from databus.core.mysqlwire import HEADER_LEN, LEN_OFFSET, MAX_PACKET

_U32 = struct.Struct("<I")

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
            s = _split(b"\x00" + bytes(buf[i:i + length]), s, parts)
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


class PacketSeq(Protocol):
    """A connection's packet sequence number (mysql-mimic's ``seq``): the next one to use."""

    value: int


def _split(payload: bytes, s: int, out: bytearray) -> int:
    """``payload``'s packets from sequence number ``s`` appended to ``out``; the next number."""
    for i in range(0, len(payload) + 1, MAX_PACKET):
        piece = payload[i:i + MAX_PACKET]
        out += _U32.pack(len(piece) | (s << 24)) + piece
        s = (s + 1) & 0xFF
        if len(piece) < MAX_PACKET:
            break
    return s


def frame_packet(payload: bytes, seq: PacketSeq) -> bytes:
    """``payload`` as MySQL packets: 0xFFFFFF-byte pieces (and an empty one after a piece of
    exactly that size), each with its length and the next sequence number."""
    out = bytearray()
    seq.value = _split(payload, seq.value, out)
    return bytes(out)
