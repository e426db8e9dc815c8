"""The binlog service's data directory fills up under its writer (a size-limited tmpfs,
filled until less than one window's bytes are free).

The write of a window that does not fit must fail loudly, and the position map (what
readers may serve) must never claim bytes that are not in the file: nothing
half-written is ever served. When space returns, the same window is written again,
whole, and a store opened again reads back every event with a valid checksum.

What happens (measured): the window's bytes are written short (``os.pwrite`` fills
the file system and returns a short count, which ``BinlogStore._flush`` does not
check), then the position map's atomic write fails with ``StorageFull``, so the map
stays at the last whole window and readers never see the torn tail; the next append
writes the window again at the same offset. The safety rests on that second write
failing: this test holds it in place.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from databus.binlog import events as ev
from databus.binlog.binfile import Transaction, Window
from databus.binlog.store import BinlogStore
from databus.core.errors import DatabusError
from databus.core.mysqlwire import EventType
from tests.support import faults

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("mount")]

SMALL = Transaction([(EventType.TABLE_MAP, 0, b"\x01" * 20)])
BIG = Transaction([(EventType.TABLE_MAP, 0, b"\x02" * 60_000)])  # more than is left free
TS = 1_700_000_000_000_000



def _whole(store: BinlogStore) -> int:
    """Every event up to each file's served size is there, with a valid checksum; the
    number of events."""
    count = 0
    for name, size in store.files():
        data = store.path(name).read_bytes()
        assert len(data) >= size, f"{name}: the map serves {size} bytes, the file has {len(data)}"
        heads = list(ev.iter_headers(data[:size]))
        assert heads and heads[-1].pos + heads[-1].size == size
        for h in heads:
            assert ev.check_crc(data[h.pos:h.pos + h.size]), f"{name}: a torn event at {h.pos}"
        count += len(heads)
    return count


def test_a_full_disk_fails_the_binlog_write_loudly_and_serves_nothing_torn(
        tmp_path: Path) -> None:
    with faults.small_disk(1 << 20) as disk:
        store = BinlogStore(disk)
        try:
            for scn in range(1, 11):
                store.append([Window(scn, TS + scn, [SMALL])])
            before = _whole(store)
            with faults.filled(disk, leave=16 << 10):
                end = store.end()
                with pytest.raises((OSError, DatabusError)):  # loud, never a short write
                    store.append([Window(11, TS + 11, [BIG])])
                assert store.end() == end  # the map did not move
                assert _whole(store) == before
            store.append([Window(11, TS + 11, [BIG])])  # space returned: written whole
            assert store.last_scn() == 11
            after = _whole(store)
        finally:
            store.close()
        reopened = BinlogStore(disk)
        try:
            assert reopened.last_scn() == 11 and _whole(reopened) == after
        finally:
            reopened.close()
