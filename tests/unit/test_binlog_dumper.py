"""The dumper on a real store: dumps that start at the same place share their chunks'
packets (``FramedChunks``) and every client still gets exactly the stream a dump of its
own would send; a dump starts only at an event, never in the middle of one."""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from databus.binlog import events as ev
from databus.binlog.binfile import Transaction, Window
from databus.binlog.chunks import ChunkKey, FramedChunks
from databus.binlog.dump import CHUNK, Dumper, DumpOptions
from databus.binlog.notifier import StoreNotifier
from databus.binlog.request import DumpError, DumpRequest
from databus.binlog.store import BinlogStore
from databus.core.mysqlwire import BINLOG_DUMP_NON_BLOCK, EventType


def _store(tmp_path: Path, transactions: int = 120) -> BinlogStore:
    """A store of two files, several read chunks each, events of mixed sizes (some
    longer than a chunk)."""
    rng = random.Random(5)
    store = BinlogStore(tmp_path, rotate_bytes=3 * CHUNK)
    for scn in range(1, transactions + 1):
        size = rng.choice([30, 700, 9_000]) if scn % 40 else CHUNK + 333
        body = Transaction([(EventType.TABLE_MAP, 0, os.urandom(size)),
                            (EventType.WRITE_ROWS, 0, os.urandom(rng.randint(20, 4_000)))])
        store.append([Window(scn, 1_700_000_000_000_000 + scn, [body])])
    assert len(store.files()) >= 2
    return store


async def _dump(store: BinlogStore, notifier: StoreNotifier, start: tuple[str, int, int],
                chunks: FramedChunks | None) -> bytes:
    """A non-blocking dump from (file, position, first sequence number): what its client
    got. Every flush lets other dumps on the loop go on."""
    file, pos, seq0 = start
    got = bytearray()
    dumper = Dumper(store, notifier, DumpRequest(file, pos, BINLOG_DUMP_NON_BLOCK, 7),
                    DumpOptions(checksum=True), server_id=1, chunks=chunks)

    async def flush() -> None:
        await asyncio.sleep(0)

    await dumper.run(got.extend, flush, SimpleNamespace(value=seq0))
    return bytes(got)


async def _dumps(store: BinlogStore, starts: list[tuple[str, int, int]],
                 chunks: FramedChunks | None) -> list[bytes]:
    """Dumps from each start side by side on one loop."""
    notifier = StoreNotifier(store, asyncio.get_running_loop())
    try:
        return list(await asyncio.gather(*(_dump(store, notifier, s, chunks)
                                           for s in starts)))
    finally:
        notifier.close()


def _second_event(store: BinlogStore) -> tuple[str, int]:
    name = store.files()[0][0]
    heads = list(ev.iter_headers(store.path(name).read_bytes()))
    return name, heads[5].pos


def test_four_dumps_from_one_start_get_a_lone_dumps_stream_from_shared_packets(
        tmp_path: Path) -> None:
    store = _store(tmp_path)
    try:
        first = store.files()[0][0]
        alone = asyncio.run(_dumps(store, [(first, 4, 1)], None))[0]
        assert len(alone) > 4 * CHUNK
        chunks = FramedChunks()
        got = asyncio.run(_dumps(store, [(first, 4, 1)] * 4, chunks))
        assert all(g == alone for g in got)
        # the first dump reads and frames, the three behind it send its packets (an
        # event longer than a chunk is read by each: nothing of it was framed)
        assert chunks.hits > chunks.misses > 0, (chunks.hits, chunks.misses)
        # every dump has left: nothing is shared with a later one, no packets are kept
        assert not chunks.shared((first, 4, 1)) and len(chunks) == 0
    finally:
        store.close()


def test_dumps_from_different_places_or_sequence_numbers_never_take_each_others_packets(
        tmp_path: Path) -> None:
    store = _store(tmp_path)
    try:
        first = store.files()[0][0]
        later = _second_event(store)
        starts = [(first, 4, 1), (*later, 1), (first, 4, 3)]
        alone = [asyncio.run(_dumps(store, [s], None))[0] for s in starts]
        assert len(set(alone)) == 3
        # two dumps of each start side by side: each pair shares, no pair takes another's
        chunks = FramedChunks()
        got = asyncio.run(_dumps(store, [s for s in starts for _ in range(2)], chunks))
        assert got == [a for a in alone for _ in range(2)]
        assert chunks.hits > 0
        # a dump alone frames into its own buffer: nothing kept for others
        chunks = FramedChunks()
        assert asyncio.run(_dumps(store, starts, chunks)) == alone
        assert chunks.hits == 0 and len(chunks) == 0
    finally:
        store.close()


def test_shared_packets_stay_within_their_byte_budget(tmp_path: Path) -> None:
    store = _store(tmp_path)
    try:
        first = store.files()[0][0]
        alone = asyncio.run(_dumps(store, [(first, 4, 1)], None))[0]
        chunks = FramedChunks(max_bytes=CHUNK + CHUNK // 2)  # about one chunk's packets
        put, kept = chunks.put, []

        def put_checked(key: ChunkKey, framed: tuple[bytes, int, int, int]) -> None:
            put(key, framed)
            kept.append(key)
            assert chunks._size == sum(len(v[0]) for v in chunks._entries.values())
            assert chunks._size <= chunks.max_bytes

        chunks.put = put_checked  # type: ignore[method-assign]
        assert asyncio.run(_dumps(store, [(first, 4, 1)] * 3, chunks)) == [alone] * 3
        assert kept and chunks.hits > 0
    finally:
        store.close()


def test_the_cache_is_least_recently_used_first_and_skips_what_cannot_fit() -> None:
    chunks = FramedChunks(max_bytes=100)
    chunks.put(("f", 4, 10, 1), (b"a" * 40, 10, 1, 2))
    chunks.put(("f", 14, 10, 2), (b"b" * 40, 10, 1, 3))
    assert chunks.get(("f", 4, 10, 1)) == (b"a" * 40, 10, 1, 2)  # now the most recent
    chunks.put(("f", 24, 10, 3), (b"c" * 40, 10, 1, 4))  # 120 > 100: the oldest goes
    assert chunks.get(("f", 14, 10, 2)) is None
    assert chunks.get(("f", 4, 10, 1)) is not None
    chunks.put(("f", 34, 200, 4), (b"d" * 101, 200, 1, 5))  # larger than the whole budget
    assert chunks.get(("f", 34, 200, 4)) is None and len(chunks) == 2
    assert (chunks.hits, chunks.misses) == (2, 2)


@pytest.mark.parametrize("others", [0, 1, 3])
def test_a_start_is_shared_only_while_another_dump_of_it_runs(others: int) -> None:
    chunks = FramedChunks()
    start = ("databus-bin.000001", 4, 1)
    for _ in range(others + 1):
        chunks.join(start)
    assert chunks.shared(start) == (others > 0)
    for _ in range(others + 1):
        chunks.leave(start)
    assert not chunks.shared(start) and not chunks._starts


def test_a_dump_starts_at_every_event_and_nowhere_else(tmp_path: Path) -> None:
    """Every event boundary of a file (and its committed end) starts a dump whose events
    are the file's from there; every other position, inside the Format_description or
    inside an event, is MySQL's 1236, before any event is sent."""
    store = BinlogStore(tmp_path)
    try:
        for scn in range(1, 4):
            body = Transaction([(EventType.TABLE_MAP, 0, os.urandom(40)),
                                (EventType.WRITE_ROWS, 0, os.urandom(60))])
            store.append([Window(scn, 1_700_000_000_000_000 + scn, [body])])
        name, size = store.files()[0]
        data = store.path(name).read_bytes()
        heads = list(ev.iter_headers(data))
        starts = {h.pos for h in heads[1:]} | {size}  # past the Format_description

        async def every_position() -> None:
            notifier = StoreNotifier(store, asyncio.get_running_loop())
            try:
                for pos in range(5, size + 1):
                    if pos in starts:
                        got = await _dump(store, notifier, (name, pos, 1), None)
                        # after the artificial Rotate and the Format_description: the
                        # file's events from pos, one packet each (OK byte, then event)
                        assert b"".join(p[1:] for p in _payloads(got)[2:]) == \
                            data[pos:size]
                    else:
                        with pytest.raises(DumpError, match="impossible position") as err:
                            await _dump(store, notifier, (name, pos, 1), None)
                        assert err.value.errno == 1236
            finally:
                notifier.close()

        asyncio.run(every_position())
    finally:
        store.close()


def _payloads(stream: bytes) -> list[bytes]:
    """The payloads of a stream of MySQL packets (each under 16 MiB here)."""
    out, i = [], 0
    while i < len(stream):
        n = int.from_bytes(stream[i:i + 3], "little")
        out.append(stream[i + 4:i + 4 + n])
        i += 4 + n
    return out
