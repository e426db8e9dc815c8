"""The binlog dump's framing (``databus.binlog.framing.frame_events``): binlog events as MySQL
packets, the compiled half (client/_wiredecode.c) equal to the Python half, both equal to
a frame built by hand from the protocol's rule, on every case: small events, events at
and around the 16 MiB packet limit, a torn last event, a damaged length, sequence numbers
wrapping past 255."""

from __future__ import annotations

import random
import struct

import pytest

from databus.binlog import framing
from databus.binlog.framing import frame_events, frame_events_into, framed_capacity
from databus.core.mysqlwire import MAX_PACKET

HEADER = 19


def event(length: int, rng: random.Random) -> bytes:
    """A binlog v4 event of ``length`` bytes: a header with that length, random body."""
    head = struct.pack("<IBIIIH", rng.getrandbits(32), rng.randrange(1, 40), 7, length,
                       rng.getrandbits(32), 0)
    return head + rng.randbytes(length - HEADER)


def by_rule(events: list[bytes], seq: int) -> tuple[bytes, int]:
    """MySQL's rule, one packet at a time: payload = 0x00 + event, pieces of at most
    0xFFFFFF bytes, an empty piece after one of exactly that size."""
    out = bytearray()
    for e in events:
        payload = b"\x00" + e
        k = 0
        while True:
            piece = payload[k:k + MAX_PACKET]
            out += struct.pack("<I", len(piece))[:3] + bytes([seq]) + piece
            seq = (seq + 1) & 0xFF
            k += MAX_PACKET
            if len(piece) < MAX_PACKET:
                break
    return bytes(out), seq


def both(data: bytes | memoryview, seq: int) -> framing.Framed:
    """Both halves, each also into a reused buffer (``frame_events_into``, sized by
    ``framed_capacity``, left-over bytes from an earlier use at its end)."""
    py = frame_events(data, seq, native=False)
    natives = [True] if framing._native is not None else []
    if natives:
        assert frame_events(data, seq) == py
    for native in [False, *natives]:
        out = bytearray(b"\xee" * framed_capacity(len(data)))
        length, *rest = frame_events_into(data, seq, out, native=native)
        assert (bytes(out[:length]), *rest) == py
    return py


def test_the_compiled_half_is_built_here() -> None:
    # setup.py builds it wherever a compiler is; the suite runs where one is
    assert framing._native is not None


@pytest.mark.parametrize("seed", range(20))
def test_small_events_frame_as_one_packet_each_with_wrapping_sequence_numbers(
        seed: int) -> None:
    rng = random.Random(seed)
    events = [event(rng.choice([HEADER, HEADER + 1, rng.randrange(HEADER, 9000)]), rng)
              for _ in range(rng.randrange(0, 700))]
    data = b"".join(events)
    seq = rng.randrange(256)
    want, nxt = by_rule(events, seq)
    assert both(data, seq) == (want, len(data), len(events), nxt, -1)
    assert both(memoryview(data), seq)[0] == want


@pytest.mark.parametrize("extra", [-2, -1, 0, 1, 5, MAX_PACKET])
def test_events_at_the_packet_limit_split_as_mysql_splits_them(extra: int) -> None:
    rng = random.Random(extra)
    # payload = event + 1: extra -1 is a payload of exactly 0xFFFFFF (then an empty packet)
    events = [event(30, rng), event(MAX_PACKET + extra, rng), event(25, rng)]
    data = b"".join(events)
    want, nxt = by_rule(events, 250)
    assert both(data, 250) == (want, len(data), 3, nxt, -1)


def test_a_torn_last_event_is_left_for_the_next_read() -> None:
    rng = random.Random(1)
    events = [event(100, rng) for _ in range(5)]
    data = b"".join(events)
    for cut in (1, HEADER - 1, HEADER, 99):  # inside the header or the body of the last
        torn = data[:-cut]
        want, nxt = by_rule(events[:-1], 3)
        assert both(torn, 3) == (want, 400, 4, nxt, -1)
    assert both(b"", 9) == (b"", 0, 0, 9, -1)


@pytest.mark.parametrize("bad_length", [0, 1, HEADER - 1])
def test_a_length_below_the_header_stops_at_that_event_after_framing_those_before(
        bad_length: int) -> None:
    rng = random.Random(2)
    events = [event(60, rng) for _ in range(3)]
    broken = bytearray(event(60, rng))
    struct.pack_into("<I", broken, 9, bad_length)
    data = b"".join(events) + bytes(broken) + event(60, rng)
    want, nxt = by_rule(events, 0)
    assert both(data, 0) == (want, 180, 3, nxt, 180)


@pytest.mark.parametrize("native", [False, True])
def test_a_buffer_too_small_for_the_packets_is_an_error_not_a_short_frame(
        native: bool) -> None:
    if native and framing._native is None:
        pytest.skip("the compiled half is not built")
    rng = random.Random(3)
    data = b"".join(event(HEADER, rng) for _ in range(50))  # the densest: 5 bytes each more
    need = len(frame_events(data, 0)[0])
    assert need <= framed_capacity(len(data))
    with pytest.raises(ValueError, match="out holds"):
        frame_events_into(data, 0, bytearray(need - 1), native=native)
