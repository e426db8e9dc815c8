"""The C cutter of binlog dump packets (``_rowcodec.frames``) against
``events.parse_header``: the same events where it takes them, and nothing taken at a
packet the Python path must see (it raises or joins there as before)."""

from __future__ import annotations

import struct
import zlib

import pytest

from databus.core.errors import CorruptEventError
from databus.sources.mysql import events as be
from databus.sources.mysql import fastpath

frames = fastpath.frames()
pytestmark = pytest.mark.skipif(frames is None, reason="the C extension is not built")


def event(etype: int, body: bytes, *, next_pos: int = 100, crc: bool = True) -> bytes:
    size = 19 + len(body) + (4 if crc else 0)
    raw = struct.pack("<IBIIIH", 1_700_000_000, etype, 7, size, next_pos, 0x20) + body
    return raw + struct.pack("<I", zlib.crc32(raw)) if crc else raw


def packet(seq: int, payload: bytes) -> bytes:
    return struct.pack("<I", len(payload))[:3] + bytes([seq]) + payload


def cut(buf: bytes, seq: int = 1, checksum: bool = True) -> tuple[list[tuple[object, bytes]],
                                                                   int, int]:
    assert frames is not None
    got, off, nseq = frames(buf, 0, seq, checksum, be.EventHeader, 1000)
    return [(h, bytes(b)) for h, b in reversed(got)], off, nseq


def test_whole_packets_are_the_events_parse_header_gives() -> None:
    evs = [event(be.EventType.XID, b"\x05" * 8, next_pos=200 + i) for i in range(3)]
    fde = event(be.EventType.FORMAT_DESCRIPTION, b"\x04\x00" + b"x" * 50 + b"\x01")
    evs.insert(1, fde)
    buf = b"".join(packet(1 + i, b"\x00" + e) for i, e in enumerate(evs))
    got, off, seq = cut(buf + b"\x09\x00")  # and the start of a packet not received whole
    assert off == len(buf) and seq == 5
    want = [be.parse_header(e, True) for e in evs]
    assert got == [(h, bytes(b)) for h, b in want]
    assert all(type(h) is be.EventHeader for h, _ in got)
    bodies = frames(buf, 0, 1, True, be.EventHeader, 1000)[0]
    assert all(isinstance(b, memoryview) for _, b in bodies)


def test_without_checksums_and_a_format_description_that_states_its_own() -> None:
    plain = event(be.EventType.QUERY, b"q" * 30, crc=False)
    fde = event(be.EventType.FORMAT_DESCRIPTION, b"\x04\x00" + b"x" * 50 + b"\x01")
    buf = packet(3, b"\x00" + plain) + packet(4, b"\x00" + fde)
    got, off, seq = cut(buf, seq=3, checksum=False)
    assert off == len(buf) and seq == 5
    assert got == [(h, bytes(b)) for h, b in (be.parse_header(plain, False),
                                               be.parse_header(fde, False))]


@pytest.mark.parametrize("damage", ["crc", "size", "sequence", "eof", "error", "short",
                                    "long packet"])
def test_it_stops_where_the_python_path_must_decide(damage: str) -> None:
    good = packet(1, b"\x00" + event(be.EventType.XID, b"\x05" * 8))
    bad_event = event(be.EventType.XID, b"\x06" * 8)
    seq = 2
    if damage == "crc":
        bad_event = bad_event[:-1] + bytes([bad_event[-1] ^ 0xFF])
        with pytest.raises(CorruptEventError, match="CRC32"):
            be.parse_header(bad_event, True)
    elif damage == "size":
        bad_event = bad_event[:9] + struct.pack("<I", 99) + bad_event[13:]
    elif damage == "short":
        bad_event = bad_event[:15]
    bad = packet(seq, b"\x00" + bad_event)
    if damage == "sequence":
        bad = packet(seq + 1, b"\x00" + bad_event)
    elif damage == "eof":
        bad = packet(seq, b"\xfe\x00\x00\x02\x00")
    elif damage == "error":
        bad = packet(seq, b"\xff\x15\x04#HY000boom")
    elif damage == "long packet":
        bad = b"\xff\xff\xff" + bytes([seq]) + b"\x00" + bad_event
    got, off, nseq = cut(good + bad)
    assert len(got) == 1 and off == len(good) and nseq == seq


def test_nothing_whole_takes_nothing() -> None:
    whole = packet(1, b"\x00" + event(be.EventType.XID, b"\x05" * 8))
    for end in (0, 3, 4, 20, len(whole) - 1):
        assert cut(whole[:end]) == ([], 0, 1)


def test_at_most_limit_events_per_call() -> None:
    evs = [event(be.EventType.XID, b"\x05" * 8, next_pos=200 + i) for i in range(5)]
    buf = b"".join(packet(1 + i, b"\x00" + e) for i, e in enumerate(evs))
    assert frames is not None
    got, off, seq = frames(buf, 0, 1, True, be.EventHeader, 2)
    assert len(got) == 2 and seq == 3 and off == 2 * (len(buf) // 5)
    rest, end, _ = frames(buf, off, seq, True, be.EventHeader, 10)
    assert len(rest) == 3 and end == len(buf)
