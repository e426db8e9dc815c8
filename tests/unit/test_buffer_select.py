"""The compiled window selection keeps exactly the events the Python path keeps."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from databus.buffer import EventBuffer, ReadResult, ring, select
from databus.core import event as ev
from databus.core.checkpoint import Checkpoint
from databus.core.filters import ServerFilter
from databus.core.window import Window

EDGE_KEYS = [0, 1, -1, -(2**63), 2**63 - 1, b"", b"abc", b'["k",1]', b"\xff" * 40]


def window(rng: random.Random, scn: int) -> Window:
    n = rng.randrange(0, 30)
    keys = [rng.choice([*EDGE_KEYS, rng.randrange(-(2**63), 2**63),
                        bytes(rng.randrange(256) for _ in range(rng.randrange(8)))])
            for _ in range(n)]
    data = b"".join(ev.encode(scn=scn, src_id=rng.choice([1, 2, 3]), key=k,
                              payload=bytes(rng.randrange(256) for _ in range(rng.randrange(90))))
                    for k in keys)
    return Window(scn, data, n, scn)


def filters(rng: random.Random) -> ServerFilter | None:
    return rng.choice([
        None,
        ServerFilter.mod([1, 2], 4, 1, 3),
        ServerFilter.mod([1], 7, 0, 1),
        ServerFilter.parse('{"2": {"partitionType": "RANGE", "filters": ['
                           '{"keyRange": {"start": -9223372036854775808, "end": -5}},'
                           '{"keyRange": {"start": 0, "end": 3000000000}}]}}'),
    ])


def reads(buf: EventBuffer, cp: Checkpoint, size: int, **kw: object) -> list[ReadResult]:
    """Every read of a drain from ``cp`` (data and counters)."""
    out = []
    for _ in range(10_000):
        r = buf.read(cp, size, **kw)  # type: ignore[arg-type]
        if not r.events:
            return out
        out.append(r)
        cp = cp.within(r.partial_scn, r.partial_count) if r.partial else cp.window_done(r.last_scn)
    raise AssertionError("no end")


@pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("cc") is None,
                    reason="no C compiler on this machine: the Python selection is used")
def test_the_compiled_selection_is_built() -> None:
    assert select.available(), "run scripts/setup.sh: the _select extension did not build"


@pytest.mark.parametrize("seed", range(6))
def test_reads_are_byte_identical_with_and_without_the_extension(
        seed: int, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    rng = random.Random(seed)
    # small: wraps and evicts; odd seeds use a memory-mapped (persistent) buffer
    buf = EventBuffer(1 << 16, path=tmp_path / "buf" if seed % 2 else None)
    for scn in range(10, 400, 3):
        buf.append_window(window(rng, scn))
    for _ in range(8):
        sources = rng.choice([None, frozenset({1}), frozenset({1, 2}), frozenset({9})])
        filt = filters(rng)
        if sources is None and filt is None:
            sources = frozenset({2, 3})
        cp = rng.choice([Checkpoint.flexible(),
                         Checkpoint.after(rng.randrange(buf.prev_scn, 400), -1)])
        size = rng.choice([200, 3000, 1 << 20])
        with monkeypatch.context() as m:
            compiled = reads(buf, cp, size, sources=sources, filter=filt)
            m.setattr(ring, "compile_selection", lambda _s, _f: None)
            python = reads(buf, cp, size, sources=sources, filter=filt)
        assert compiled == python
        assert compiled or sources == frozenset({9}) or filt is not None


def test_spans_hold_exactly_the_matching_events() -> None:
    rng = random.Random(9)
    w = window(rng, 5)
    data = w.events + ev.encode_eop(5)
    filt = ServerFilter.mod([1, 2, 3], 3, 1, 2)
    sel = select.compile_selection(frozenset({1, 3}), filt)
    assert sel is not None
    spans, eop, total = sel.window(data, 0)
    kept = [e for s, e, _c in spans for e in ev.iter_events(data[s:e])]
    want = [e for e in ev.iter_events(data[:eop])
            if e.src_id in (1, 3) and filt.matches(e.src_id, e.key)]
    assert kept == want and total == w.count and ev.peek_src_id(data, eop) == ev.SRC_EOP
    assert sum(c for _s, _e, c in spans) == len(want)


def test_windows_are_the_selected_events_and_eops_of_the_windows_that_fit() -> None:
    rng = random.Random(11)
    ws = [window(rng, scn) for scn in (5, 6, 9)]
    parts = [w.events + ev.encode_eop(w.scn) for w in ws]
    data = b"x" * 7 + b"".join(parts)  # the windows at an offset
    starts = [7 + sum(map(len, parts[:i])) for i in range(4)]
    filt = ServerFilter.mod([1, 2], 2, 0, 1)
    sel = select.compile_selection(frozenset({1, 2}), filt)
    assert sel is not None
    for skip in (0, 1, 3):
        want, kept = [], []
        for i, off in enumerate(starts[:3]):
            spans, eop_off, _total = sel.window(data, off, skip if i == 0 else 0)
            want.append(b"".join(data[s:e] for s, e, _c in spans) + data[eop_off:starts[i + 1]])
            kept.append(sum(c for _s, _e, c in spans))
        whole = b"".join(want)
        assert sel.windows(data, 7, len(data), skip, 1 << 30, 1 << 62) == (
            whole, starts[3], 3, sum(kept), 9)
        # the budget, max_scn and stop each end the read after whole windows
        assert sel.windows(data, 7, len(data), skip, len(whole) - 1, 1 << 62) == (
            b"".join(want[:2]), starts[2], 2, sum(kept[:2]), 6)
        assert sel.windows(data, 7, len(data), skip, 1 << 30, 8) == (
            b"".join(want[:2]), starts[2], 2, sum(kept[:2]), 6)
        assert sel.windows(data, 7, starts[1], skip, 1 << 30, 1 << 62) == (
            want[0], starts[1], 1, kept[0], 5)
        # nothing fits, or the first window is past max_scn: nothing taken
        assert sel.windows(data, 7, len(data), skip, len(want[0]) - 1, 1 << 62) == (
            None, 7, 0, 0, -1)
        assert sel.windows(data, 7, len(data), skip, 1 << 30, 4) == (None, 7, 0, 0, -1)


def test_a_length_leaving_the_buffer_is_refused() -> None:
    data = bytearray(ev.encode(scn=1, src_id=1, key=1, payload=b"x" * 20) + ev.encode_eop(1))
    data[17:21] = (10_000).to_bytes(4, "big")
    sel = select.compile_selection(frozenset({1}), None)
    assert sel is not None
    with pytest.raises(ValueError, match="offset 0"):
        sel.window(bytes(data), 0)
    with pytest.raises(ValueError, match="offset 0"):
        sel.windows(bytes(data), 0, len(data), 0, 1 << 20, 1 << 62)


@pytest.mark.parametrize("seed", range(6))
def test_unselected_reads_are_byte_identical_with_and_without_the_compiled_walk(
        seed: int, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    rng = random.Random(100 + seed)
    # small: wraps and evicts; odd seeds use a memory-mapped (persistent) buffer
    buf = EventBuffer(1 << 16, path=tmp_path / "buf" if seed % 2 else None)
    for scn in range(10, 700, 3):
        buf.append_window(window(rng, scn))
    assert buf.prev_scn > 10  # evicted: the data wraps
    for _ in range(12):
        cp = rng.choice([Checkpoint.flexible(),
                         Checkpoint.after(rng.randrange(buf.prev_scn, 700), -1)])
        size = rng.choice([100, 700, 3000, 20_000, 1 << 20])
        upto = rng.choice([None, None, rng.randrange(buf.prev_scn, 720)])
        with monkeypatch.context() as m:
            compiled = reads(buf, cp, size, upto_scn=upto)
            m.setattr(select, "walk_windows", None)
            python = reads(buf, cp, size, upto_scn=upto)
        assert compiled == python
        assert compiled or upto is not None or cp.window_scn >= 697
        if compiled and upto is None:  # a drain ends at the newest window
            assert compiled[-1].last_scn == buf.max_scn or compiled[-1].partial


def test_the_compiled_walk_stops_at_scn_budget_and_count() -> None:
    walk = select.walk_windows
    if walk is None:
        pytest.skip("the _select extension is not built")
    rng = random.Random(3)
    ws = [window(rng, scn) for scn in (5, 6, 9)]
    parts = [w.events + ev.encode_eop(w.scn) for w in ws]
    data = b"".join(parts)
    ends = [sum(map(len, parts[: i + 1])) for i in range(3)]
    counts = [w.count for w in ws]
    assert walk(data, 0, len(data), 1 << 30, 1 << 62, 1 << 30) == (ends[2], 3, sum(counts), 9)
    assert walk(data, 0, len(data), 1 << 30, 8, 1 << 30) == (ends[1], 2, sum(counts[:2]), 6)
    assert walk(data, 0, len(data), ends[1], 1 << 62, 1 << 30) == (ends[1], 2, sum(counts[:2]), 6)
    assert walk(data, 0, len(data), ends[1] - 1, 1 << 62, 9) == (ends[0], 1, counts[0], 5)
    assert walk(data, 0, len(data), 1 << 30, 1 << 62, 1) == (ends[0], 1, counts[0], 5)
    assert walk(data, ends[0], len(data), 10, 1 << 62, 9) == (ends[0], 0, 0, -1)
    assert walk(data, 0, len(data), 1 << 30, 4, 9) == (0, 0, 0, -1)


def test_the_compiled_walk_refuses_a_window_leaving_the_buffer_or_its_segment() -> None:
    walk = select.walk_windows
    if walk is None:
        pytest.skip("the _select extension is not built")
    good = ev.encode(scn=1, src_id=1, key=1, payload=b"x" * 20) + ev.encode_eop(1)
    data = bytearray(good)
    data[17:21] = (10_000).to_bytes(4, "big")
    with pytest.raises(ValueError, match="offset 0"):
        walk(bytes(data), 0, len(data), 1 << 30, 1 << 62, 9)
    with pytest.raises(ValueError):  # the window crosses the end of its segment
        walk(good, 0, len(good) - 1, 1 << 30, 1 << 62, 9)
    with pytest.raises(ValueError, match="leaves the buffer"):
        walk(good + b"\0" * 10, len(good), len(good) + 10, 1 << 30, 1 << 62, 9)
