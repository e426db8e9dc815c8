"""The v2 event codec: layout, round trips, and CRC checks on read."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from databus.core import event as ev
from databus.core.errors import CorruptEventError


def test_header_layout_matches_the_documented_offsets() -> None:
    data = ev.encode(scn=0x0102030405060708, src_id=7, key=42, payload=b"abc",
                     schema_id=b"\x01" * 16, schema_version=3, op=ev.Op.UPDATE,
                     timestamp_ns=123456789, partition=5)
    assert data[0] == 2
    assert struct.unpack_from(">I", data, 1)[0] == 0xCAFEDEED
    assert struct.unpack_from(">I", data, 5)[0] == 45
    assert struct.unpack_from(">I", data, 17)[0] == len(data)
    assert struct.unpack_from(">H", data, 21)[0] & ev.ATTR_OPCODE_MASK == ev.Op.UPDATE
    assert struct.unpack_from(">q", data, 23)[0] == 123456789
    assert struct.unpack_from(">i", data, 31)[0] == 7
    assert struct.unpack_from(">h", data, 35)[0] == 5
    assert struct.unpack_from(">q", data, 37)[0] == 0x0102030405060708
    header_crc = zlib.crc32(data[13:45], zlib.crc32(data[:9]))
    assert struct.unpack_from(">I", data, 9)[0] == header_crc
    assert struct.unpack_from(">I", data, 13)[0] == zlib.crc32(data[45:])
    # body: int64 key, then the payload part
    assert struct.unpack_from(">q", data, 45)[0] == 42
    assert struct.unpack_from(">ihB", data, 53) == (3, 3, 16)
    assert data[60:76] == b"\x01" * 16 and data[76:] == b"abc"


@given(
    scn=st.integers(0, (1 << 63) - 1),
    src=st.integers(-(1 << 31), (1 << 31) - 1),
    key=st.one_of(st.integers(-(1 << 63), (1 << 63) - 1), st.binary(max_size=64)),
    payload=st.binary(max_size=300),
    meta=st.one_of(st.none(), st.binary(max_size=100)),
    op=st.sampled_from(list(ev.Op)),
)
def test_round_trip(scn: int, src: int, key: int | bytes, payload: bytes,
                    meta: bytes | None, op: ev.Op) -> None:
    data = ev.encode(scn=scn, src_id=src, key=key, payload=payload, schema_id=b"d" * 16,
                     op=op, metadata=meta, metadata_schema_id=b"m" * 16)
    out = ev.decode(data)
    assert (out.scn, out.src_id, out.key, out.payload, out.metadata, out.op) == (
        scn, src, key, payload, meta, op)
    assert ev.peek_scn(data) == scn and ev.peek_key(data) == key
    assert ev.peek_length(data) == len(data)


def test_every_single_bit_flip_is_detected() -> None:
    data = ev.encode(scn=9, src_id=1, key=b"k", payload=b"payload", schema_id=b"s" * 16)
    for i in range(len(data)):
        for bit in (0, 3, 7):
            bad = bytearray(data)
            bad[i] ^= 1 << bit
            with pytest.raises(CorruptEventError):
                ev.decode(bad)


def test_truncated_and_garbage_input() -> None:
    data = ev.encode(scn=1, src_id=1, key=1, payload=b"x" * 10)
    for cut in (0, 10, 44, 45, len(data) - 1):
        with pytest.raises(CorruptEventError):
            ev.decode(data[:cut])
    with pytest.raises(CorruptEventError):
        ev.decode(b"\x00" * 100)


def test_iter_events_and_eop() -> None:
    stream = b"".join(ev.encode(scn=5, src_id=1, key=i, payload=b"") for i in range(3))
    stream += ev.encode_eop(5, timestamp_ns=77)
    events = list(ev.iter_events(stream))
    assert [e.key for e in events[:3]] == [0, 1, 2]
    assert events[-1].is_eop and events[-1].scn == 5 and events[-1].timestamp_ns == 77
    with pytest.raises(ValueError):
        ev.encode_control(1, 3, b"")
