"""The event buffer: windows, checkpoints, eviction, filters, persistence, corruption."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest

from databus.buffer import EventBuffer
from databus.buffer.persist import HEADER_SIZE
from databus.core import event as ev
from databus.core.checkpoint import Checkpoint
from databus.core.errors import (
    BufferCorruptError,
    BufferFullError,
    ConfigError,
    ScnAheadError,
    ScnNotFoundError,
)
from databus.core.filters import ServerFilter
from databus.core.window import Window


def window(scn: int, n: int, rng: random.Random | None = None, src: int = 1) -> Window:
    rng = rng or random.Random(scn)
    data = b"".join(
        ev.encode(scn=scn, src_id=src + (k % 2), key=scn * 100 + k,
                  payload=bytes(rng.randrange(256) for _ in range(rng.randrange(5, 150))))
        for k in range(n))
    return Window(scn, data, n, scn * 1000)


def drain(buf: EventBuffer, cp: Checkpoint, size: int, **kw: object) -> list[ev.Event]:
    """Read everything after ``cp`` like a client would."""
    out: list[ev.Event] = []
    for _ in range(100_000):
        r = buf.read(cp, size, **kw)  # type: ignore[arg-type]
        if not r.events:
            return out
        out.extend(ev.iter_events(r.data))
        cp = cp.within(r.partial_scn, r.partial_count) if r.partial else cp.window_done(r.last_scn)
    raise AssertionError("no end")


def eops(events: list[ev.Event]) -> list[int]:
    return [e.scn for e in events if e.is_eop]


def test_windows_round_trip_in_order() -> None:
    buf = EventBuffer(1 << 20)
    wins = [window(s, 3) for s in (5, 9, 12)]
    for w in wins:
        buf.append_window(w)
    got = drain(buf, Checkpoint.flexible(), 1 << 20)
    assert eops(got) == [5, 9, 12]
    assert b"".join(x for e in got if not e.is_eop for x in [ev.encode(
        scn=e.scn, src_id=e.src_id, key=e.key, payload=e.payload)]) == b"".join(
        w.events for w in wins)
    assert eops(drain(buf, Checkpoint.after(5), 1 << 20)) == [9, 12]
    assert eops(drain(buf, Checkpoint.after(7), 1 << 20)) == [9, 12]
    assert drain(buf, Checkpoint.after(12), 1 << 20) == []
    with pytest.raises(ValueError):
        buf.append_window(window(12, 1))


def test_size_budget_keeps_windows_whole_and_splits_big_ones() -> None:
    buf = EventBuffer(1 << 20)
    buf.append_window(window(1, 2))
    buf.append_window(window(2, 50))  # larger than the budget below
    buf.append_window(window(3, 2))
    first = buf.read(Checkpoint.flexible(), 1000)
    assert (first.windows, first.last_scn, first.partial) == (1, 1, False)
    part = buf.read(Checkpoint.after(1), 1000)
    assert part.partial and part.partial_scn == 2 and 0 < part.partial_count < 50
    rest = drain(buf, Checkpoint.after(1).within(2, part.partial_count), 1000)
    data2 = [e for e in rest if e.scn == 2 and not e.is_eop]
    assert len(data2) + part.partial_count == 50
    assert eops(rest) == [2, 3]
    # one event larger than the budget is still served
    tiny = buf.read(Checkpoint.after(1), 10)
    assert tiny.events == 1 and tiny.partial_count == 1


def test_eviction_whole_windows_and_scn_not_found() -> None:
    buf = EventBuffer(8 * 1024, start_scn=0)
    for s in range(1, 200):
        buf.append_window(window(s, 2))
    assert buf.prev_scn > 0 and buf.min_scn == buf.prev_scn + 1
    with pytest.raises(ScnNotFoundError, match="bootstrap"):
        buf.read(Checkpoint.after(buf.prev_scn - 1), 4096)
    assert eops(drain(buf, Checkpoint.after(buf.prev_scn), 4096))[0] == buf.min_scn
    with pytest.raises(BufferFullError):
        buf.append_window(window(500, 200))


@pytest.mark.parametrize("persistent", [False, True])
def test_wraps_many_times_against_a_model(tmp_path: Path, persistent: bool) -> None:
    rng = random.Random(7)
    path = tmp_path / "b.buf" if persistent else None
    buf = EventBuffer(32 * 1024, path=path, index_block=1024)
    model: list[int] = []
    scn = 0
    for i in range(1500):
        scn += rng.randrange(1, 4)
        buf.append_window(window(scn, rng.randrange(1, 25), rng))
        model.append(scn)
        if i % 50 == 0:
            held = [s for s in model if s > buf.prev_scn]
            assert eops(drain(buf, Checkpoint.flexible(), rng.randrange(500, 5000))) == held
            mid = held[len(held) // 2]
            assert eops(drain(buf, Checkpoint.after(mid), 3000)) == [s for s in held if s > mid]
    assert buf.stats()["index_entries"] <= 32 * 1024 // 1024 + 1
    if path is not None:
        held = [s for s in model if s > buf.prev_scn]
        buf.close()
        with EventBuffer(32 * 1024, path=path, index_block=1024) as again:
            assert not again.recovered_from_corruption
            assert eops(drain(again, Checkpoint.flexible(), 4096)) == held


def test_source_selection_and_filters() -> None:
    buf = EventBuffer(1 << 20)
    for s in range(1, 30):
        buf.append_window(window(s, 6))
    everything = [e for e in drain(buf, Checkpoint.flexible(), 5000) if not e.is_eop]
    only1 = drain(buf, Checkpoint.flexible(), 5000, sources=frozenset({1}))
    assert {e.src_id for e in only1 if not e.is_eop} == {1}
    assert len(eops(only1)) == 29  # every window still ends with its EOP
    parts = [drain(buf, Checkpoint.flexible(), 700, filter=ServerFilter.mod([1, 2], 3, b, b + 1))
             for b in range(3)]
    got = sorted((e.scn, e.key) for p in parts for e in p if not e.is_eop)
    assert got == sorted((e.scn, e.key) for e in everything)


def test_listener_and_wait_for() -> None:
    buf = EventBuffer(1 << 16)
    calls: list[int] = []
    buf.add_listener(lambda: calls.append(buf.max_scn))
    t = threading.Timer(0.1, lambda: buf.append_window(window(4, 1)))
    t.start()
    assert buf.wait_for(-1, 5)
    t.join()
    assert calls == [4]
    assert not buf.wait_for(4, 0.05)


def _filled(path: Path) -> list[int]:
    buf = EventBuffer(64 * 1024, path=path)
    for s in range(1, 40):
        buf.append_window(window(s, 3))
    buf.close()
    return list(range(1, 40))


def test_corrupt_byte_is_refused_or_with_recover_drops_from_that_window_on(tmp_path: Path) -> None:
    path = tmp_path / "b.buf"
    _filled(path)
    clean = EventBuffer(64 * 1024, path=path)
    offsets = []
    cp = Checkpoint.flexible()
    r = clean.read(cp, 1 << 20)
    clean.close()
    pos = 0
    for e in ev.iter_events(r.data):
        if e.is_eop and e.scn == 20:
            offsets.append(pos)
        pos += len(ev.encode(scn=e.scn, src_id=e.src_id, key=e.key, payload=e.payload)) \
            if not e.is_eop else len(ev.encode_eop(e.scn, e.timestamp_ns))
    with path.open("r+b") as fh:  # flip a payload byte inside window 21
        fh.seek(HEADER_SIZE + offsets[0] + 60 + 70)
        b = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([b[0] ^ 0xFF]))
    damaged = path.read_bytes()
    with pytest.raises(BufferCorruptError, match=r"b\.buf is damaged.*refusing"):
        EventBuffer(64 * 1024, path=path)  # the default: refuse, file left as it is
    assert path.read_bytes() == damaged
    with EventBuffer(64 * 1024, path=path, recover=True) as buf:
        assert buf.recovered_from_corruption and "dropped" in buf.recovery_report
        served = drain(buf, Checkpoint.flexible(), 1 << 20)
        assert eops(served) == list(range(1, 21))
        for e in served:  # all served bytes pass both CRCs
            assert not e.is_control or e.is_eop
        buf.append_window(window(21, 2))  # capture continues after the valid prefix
        assert buf.max_scn == 21


def test_bad_header_or_wrong_size_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "b.buf"
    _filled(path)
    with pytest.raises(BufferCorruptError, match="capacity"):
        EventBuffer(128 * 1024, path=path)
    with path.open("r+b") as fh:  # both header slots damaged (magic kept: still ours)
        for off in (0, 512):
            fh.seek(off + 20)
            fh.write(b"\xff\xff")
    with pytest.raises(BufferCorruptError, match="header"):
        EventBuffer(64 * 1024, path=path)
    with path.open("r+b") as fh:
        fh.write(b"\x00" * 1024)  # no magic left: not recognisably a buffer
    with pytest.raises(ConfigError, match="not a databus buffer"):
        EventBuffer(64 * 1024, path=path)


def test_torn_header_slot_falls_back_to_the_other(tmp_path: Path) -> None:
    path = tmp_path / "b.buf"
    held = _filled(path)
    buf = EventBuffer(64 * 1024, path=path)
    buf.close()
    with path.open("r+b") as fh:  # damage one of the two slots
        fh.seek(512 + 10)
        fh.write(b"\xff\xff")
    with EventBuffer(64 * 1024, path=path) as buf:
        got = eops(drain(buf, Checkpoint.flexible(), 1 << 20))
        assert got == held[: len(got)] and len(got) >= len(held) - 1


def test_a_buffer_without_a_known_position_serves_nothing_older_than_its_first_window() -> None:
    """Started fresh (prev_scn -1), the buffer cannot prove what came before its first
    window: an older checkpoint is ScnNotFound, not an answer across a gap."""
    buf = EventBuffer(64 * 1024)
    assert buf.read(Checkpoint.after(5), 1 << 20).data == b""  # nothing yet: wait
    buf.append_window(window(10, 2))
    buf.append_window(window(11, 2))
    assert buf.floor_scn == 10
    with pytest.raises(ScnNotFoundError, match="older than the relay's buffer"):
        buf.read(Checkpoint.after(5), 1 << 20)
    assert eops(drain(buf, Checkpoint.flexible(), 1 << 20)) == [10, 11]
    assert eops(drain(buf, Checkpoint.after(10), 1 << 20)) == [11]
    known = EventBuffer(64 * 1024, start_scn=7)  # resumes after a recorded position
    known.append_window(window(10, 2))
    assert eops(drain(known, Checkpoint.after(7), 1 << 20)) == [10]
    with pytest.raises(ScnNotFoundError):
        known.read(Checkpoint.after(6), 1 << 20)


def test_a_checkpoint_ahead_of_the_buffer_names_both_positions() -> None:
    buf = EventBuffer(64 * 1024)
    buf.append_window(window(10, 2))
    with pytest.raises(ScnAheadError, match=r"checkpoint scn 99 is ahead.*scn 10") as info:
        buf.read(Checkpoint.after(99), 1 << 20)
    assert (info.value.checkpoint_scn, info.value.relay_scn) == (99, 10)
    assert info.value.retryable
    assert buf.read(Checkpoint.after(10), 1 << 20).data == b""  # at the head: wait


def test_a_declared_origin_makes_older_checkpoints_servable() -> None:
    """A source that re-reads its whole history (SQLite no_data, nothing trimmed) declares
    it: checkpoints from before the first window are then provably complete."""
    buf = EventBuffer(64 * 1024)
    buf.declare_origin(-1)
    buf.append_window(window(10, 2))
    assert buf.floor_scn == -1 and buf.origin_known
    assert eops(drain(buf, Checkpoint.after(0), 1 << 20)) == [10]
    with pytest.raises(ValueError):
        buf.declare_origin(3)  # only before the first window
