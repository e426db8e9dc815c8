"""EventBuffer.read_pinned: the same answer as read() as views, and the pin: the
writer does not evict a pinned window (it waits, then revokes), and a file-backed
buffer closed while pinned closes its file at the last release."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest

from databus.buffer import EventBuffer
from databus.core import event as ev
from databus.core.checkpoint import Checkpoint
from databus.core.window import Window


def window(scn: int, n: int = 5, size: int = 100) -> Window:
    rng = random.Random(scn)
    data = b"".join(ev.encode(scn=scn, src_id=1, key=scn * 100 + k,
                              payload=bytes(rng.randrange(256) for _ in range(size)))
                    for k in range(n))
    return Window(scn, data, n, scn * 1000)


def full_buffer(capacity: int = 64 * 1024, path: Path | None = None) -> EventBuffer:
    buf = EventBuffer(capacity, path=path, index_block=1024)
    scn = 0
    while buf.stats()["evicted_windows"] < 3:  # wrapped
        scn += 1
        buf.append_window(window(scn, 1 + scn % 7))
    return buf


@pytest.mark.parametrize("budget", [200, 1000, 5000, 40_000, 1 << 20])
def test_a_pinned_read_is_the_read_as_views(budget: int) -> None:
    buf = full_buffer()
    scns = list(range(buf.min_scn, buf.max_scn + 1))
    cps = [Checkpoint.flexible(), Checkpoint.after(scns[3]), Checkpoint.after(scns[-1]),
           Checkpoint.after(scns[2]).within(scns[3], 2)]
    for cp in cps:
        copied = buf.read(cp, budget)
        pinned = buf.read_pinned(cp, budget)
        try:
            assert b"".join(pinned.parts) == copied.data and pinned.size == len(copied.data)
            assert (pinned.events, pinned.data_events, pinned.windows, pinned.last_scn,
                    pinned.partial, pinned.partial_scn, pinned.partial_count) == (
                copied.events, copied.data_events, copied.windows, copied.last_scn,
                copied.partial, copied.partial_scn, copied.partial_count)
            assert buf.pinned_reads == (1 if copied.data else 0)
        finally:
            pinned.release()
        pinned.release()  # twice: nothing more
        assert buf.pinned_reads == 0


def test_the_writer_waits_for_a_pin_then_revokes_it() -> None:
    buf = full_buffer()
    buf.pin_grace = 0.2
    pinned = buf.read_pinned(Checkpoint.flexible(), 4096)
    before = b"".join(pinned.parts)
    revoked = threading.Event()
    pinned.on_revoke(revoked.set)
    scn = buf.max_scn

    def write() -> None:
        for k in range(1, 4):
            buf.append_window(window(scn + k, 7, 300))  # needs the oldest windows' room

    writer = threading.Thread(target=write)
    writer.start()
    assert revoked.wait(5)  # after the grace
    assert writer.is_alive() and b"".join(pinned.parts) == before  # still waiting
    pinned.release()
    writer.join(5)
    assert not writer.is_alive() and buf.max_scn == scn + 3


def test_a_release_within_the_grace_is_no_revoke() -> None:
    buf = full_buffer()
    buf.pin_grace = 5.0
    pinned = buf.read_pinned(Checkpoint.flexible(), 4096)
    revoked = threading.Event()
    pinned.on_revoke(revoked.set)
    writer = threading.Thread(target=lambda: buf.append_window(window(buf.max_scn + 1, 7, 300)))
    writer.start()
    time.sleep(0.2)
    assert writer.is_alive()
    pinned.release()
    writer.join(5)
    assert not writer.is_alive() and not revoked.is_set()


def test_closing_a_file_buffer_while_pinned_closes_the_file_at_the_release(
        tmp_path: Path) -> None:
    buf = full_buffer(path=tmp_path / "buf")
    pinned = buf.read_pinned(Checkpoint.flexible(), 4096)
    revoked = threading.Event()
    pinned.on_revoke(revoked.set)
    data = b"".join(pinned.parts)
    buf.close()  # the views stay readable until released
    assert revoked.is_set() and b"".join(pinned.parts) == data
    pinned.release()
    assert buf.pinned_reads == 0
    again = EventBuffer(64 * 1024, path=tmp_path / "buf", index_block=1024)  # closed cleanly
    assert again.max_scn == buf.max_scn
    again.close()


def test_repeated_pinned_reads_stay_the_read_while_windows_come_and_go() -> None:
    """Pinned reads at the same position share one walk (fan-out); appends, evictions
    and wrap-arounds in between never make one differ from read()."""
    rng = random.Random(7)
    buf = EventBuffer(32 * 1024, index_block=512)
    scn = 0
    for _ in range(400):
        if rng.random() < 0.5 or scn < 3:
            scn += 1
            buf.append_window(window(scn, rng.randrange(1, 9), rng.randrange(20, 400)))
        held = list(range(buf.min_scn, buf.max_scn + 1))
        choices = [Checkpoint.flexible(), Checkpoint.after(rng.choice(held)),
                   Checkpoint.after(held[-1]), Checkpoint.after(held[0]).within(held[-1], 1)]
        for cp in choices:
            budget = rng.choice([300, 2000, 8000, 1 << 20])
            upto = rng.choice([None, None, held[len(held) // 2]])
            for _again in range(2):
                copied = buf.read(cp, budget, upto_scn=upto)
                pinned = buf.read_pinned(cp, budget, upto_scn=upto)
                assert b"".join(pinned.parts) == copied.data
                assert (pinned.events, pinned.windows, pinned.last_scn, pinned.partial_count) == (
                    copied.events, copied.windows, copied.last_scn, copied.partial_count)
                pinned.release()
