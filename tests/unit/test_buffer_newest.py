"""A read reduced to each key's last event (databus.buffer.select.newest): the compiled
reduction and its Python twin keep the same events, and they are the right ones."""

from __future__ import annotations

import random

import pytest

from databus.buffer import select
from databus.core import event as ev

KEYS = [0, 1, -1, -(2**63), 2**63 - 1, b"", b"abc", b'["k",1]', b"\xff" * 40, 7, b"7"]


def windows(rng: random.Random, n: int) -> bytes:
    """``n`` windows of random events: a few keys, so most repeat; truncates; an empty
    window now and then."""
    out: list[bytes] = []
    for scn in range(1, n + 1):
        for _ in range(rng.randrange(0, 12)):
            truncate = rng.random() < 0.03
            out.append(ev.encode(scn=scn, src_id=rng.choice([1, 2]),
                                 key=0 if truncate else rng.choice(KEYS),
                                 op=ev.Op.TRUNCATE if truncate else ev.Op.UPDATE,
                                 payload=bytes(rng.randrange(256)
                                               for _ in range(rng.randrange(8, 40)))))
        out.append(ev.encode_eop(scn))
    return b"".join(out)


def expected(data: bytes) -> tuple[bytes, int]:
    """What the reduction must give, from decoded events: each key's last event, every
    EOP and truncate, and a dropped-count event before a kept one that follows left-out
    ones of its window."""
    events = list(ev.iter_events(data))
    last = {(e.src_id, e.key): i for i, e in enumerate(events)
            if e.src_id >= 0 and e.op != ev.Op.TRUNCATE}
    raw = [data[o:o + ev.peek_length(data, o)] for o in offsets(data)]
    out, kept, dropped = [], 0, 0
    for i, e in enumerate(events):
        if e.src_id >= 0 and e.op != ev.Op.TRUNCATE and last[(e.src_id, e.key)] != i:
            dropped += 1
            continue
        if e.src_id == ev.SRC_EOP:
            dropped = 0
        elif e.src_id >= 0 and dropped:
            out.append(ev.encode(scn=e.scn, src_id=ev.SRC_DROPPED, key=dropped, payload=b""))
            dropped = 0
        out.append(raw[i])
        kept += e.src_id >= 0
    return b"".join(out), kept


def indexes(data: bytes) -> list[tuple[int, object, int]]:
    """Each data event's (scn, key, index in its window), as a reader counts them,
    dropped-count events included."""
    out, nxt = [], 0
    for e in ev.iter_events(data):
        if e.src_id == ev.SRC_EOP:
            nxt = 0
        elif e.src_id == ev.SRC_DROPPED:
            assert isinstance(e.key, int)
            nxt += e.key
        elif e.src_id >= 0:
            out.append((e.scn, e.key, nxt))
            nxt += 1
    return out


def offsets(data: bytes) -> list[int]:
    out, off = [], 0
    while off < len(data):
        out.append(off)
        off += ev.peek_length(data, off)
    return out


@pytest.mark.parametrize("seed", range(40))
def test_both_reductions_keep_each_keys_last_event_and_every_eop_and_truncate(seed: int) -> None:
    data = windows(random.Random(seed), 1 + seed % 9)
    want = expected(data)
    assert select.newest_python(data) == want
    if select.available():
        assert select.newest(data) == want
    # every kept event has the index it has in the whole data
    assert set(indexes(want[0])) <= set(indexes(data))
    assert len(indexes(want[0])) == want[1]
    # an int key and a bytes key of the same digits are two keys; so are two sources
    reduced = list(ev.iter_events(want[0]))
    assert len({(e.src_id, e.key) for e in reduced if e.src_id >= 0
                and e.op != ev.Op.TRUNCATE}) == len(
        [e for e in reduced if e.src_id >= 0 and e.op != ev.Op.TRUNCATE])
    assert sum(1 for e in reduced if e.src_id == ev.SRC_EOP) == sum(
        1 for e in ev.iter_events(data) if e.src_id == ev.SRC_EOP)


def test_nothing_and_eops_only() -> None:
    assert select.newest_python(b"") == (b"", 0)
    eops = ev.encode_eop(1) + ev.encode_eop(2)
    assert select.newest_python(eops) == (eops, 0)
    if select.available():
        assert select.newest(b"") == (b"", 0)
        assert select.newest(eops) == (eops, 0)


@pytest.mark.parametrize("cut", [1, 20, 44, -1])
def test_an_event_leaving_the_data_is_an_error(cut: int) -> None:
    data = ev.encode(scn=1, src_id=1, key=b"abcdef", payload=b"x") + ev.encode_eop(1)
    for fn in (select.newest_python, *((select.newest,) if select.available() else ())):
        with pytest.raises(ValueError, match="leaves the data"):
            fn(data[:cut])
    # a bytes key whose length runs past its event
    bad = bytearray(ev.encode(scn=1, src_id=1, key=b"ab", payload=b""))
    bad[ev.HEADER_LEN:ev.HEADER_LEN + 4] = (10**6).to_bytes(4, "big")
    for fn in (select.newest_python, *((select.newest,) if select.available() else ())):
        with pytest.raises(ValueError, match="leaves the data"):
            fn(bytes(bad))
