"""A relay restarting on a damaged buffer file never serves the damage."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from databus.buffer.persist import HEADER_SIZE
from databus.core import event as ev
from databus.core.errors import BufferCorruptError
from tests.support.relays import drain, make_relay
from tests.support.shop import Writer, txlog_max
from tests.support.wait import wait_until


def _run_and_stop(db: Path, tmp: Path, n: int) -> tuple[Writer, int]:
    relay = make_relay(db, tmp, path=str(tmp / "relay.buf"))
    relay.start()
    w = Writer(db, seed=4)
    for _ in range(n):
        w.transaction()
        if len(w.committed) % 10 == 0:
            time.sleep(0.05)  # several windows
    w.close()
    wait_until(lambda: relay.buffer.max_scn >= txlog_max(db), 10, "the relay to capture the txlog",
               interval=0.05)
    used = relay.buffer.stats()["used_bytes"]
    relay.stop()
    return w, used


def _damage_headers(buf: Path) -> None:
    """Both header slots fail their CRC (the magic stays: the file is still a buffer)."""
    with buf.open("r+b") as fh:
        for off in (0, 512):
            fh.seek(off + 20)
            fh.write(b"\xff\xff")


def _served(db: Path, tmp: Path) -> tuple[list[ev.Event], dict[str, object]]:
    relay = make_relay(db, tmp, path=str(tmp / "relay.buf"), recover=True)
    with relay:
        top = txlog_max(db)
        wait_until(lambda: relay.buffer.max_scn >= top, 10, "the relay to capture the txlog",
                   interval=0.05)
        with httpx.Client(base_url=relay.url, timeout=10) as c:
            return drain(c, {}, top), relay.buffer.stats()


def test_a_damaged_buffer_file_is_refused_and_left_unchanged(shop_db: Path,
                                                               tmp_path: Path) -> None:
    _run_and_stop(shop_db, tmp_path, 30)
    buf = tmp_path / "relay.buf"
    with buf.open("r+b") as fh:  # a byte in the middle of the data
        fh.seek(HEADER_SIZE + 3000)
        b = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([b[0] ^ 0x55]))
    damaged = buf.read_bytes()
    with pytest.raises(BufferCorruptError, match=r"relay\.buf is damaged.*buffer\.recover"):
        make_relay(shop_db, tmp_path, path=str(buf))
    _damage_headers(buf)
    damaged = buf.read_bytes()
    with pytest.raises(BufferCorruptError, match="no valid header"):
        make_relay(shop_db, tmp_path, path=str(buf))
    assert buf.read_bytes() == damaged and not list(tmp_path.glob("relay.buf.corrupt-*"))


def test_with_recover_a_corrupt_window_is_dropped_and_fetched_again(shop_db: Path,
                                                                    tmp_path: Path) -> None:
    w, used = _run_and_stop(shop_db, tmp_path, 60)
    expected = sum(len(t) for t in w.committed)
    buf = tmp_path / "relay.buf"
    with buf.open("r+b") as fh:  # a byte in the second half of the data (after the first
        # window: what a relay started without a position can prove begins there)
        fh.seek(HEADER_SIZE + used * 3 // 4)
        b = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([b[0] ^ 0x55]))
    events, _ = _served(shop_db, tmp_path)
    data = [e for e in events if not e.is_control]  # drain decoded with CRC checks
    assert len(data) == expected  # prefix kept, the rest re-read from the txlog once


def test_with_recover_an_unreadable_buffer_file_is_moved_aside(shop_db: Path,
                                                               tmp_path: Path) -> None:
    w, _ = _run_and_stop(shop_db, tmp_path, 30)
    buf = tmp_path / "relay.buf"
    _damage_headers(buf)
    events, _ = _served(shop_db, tmp_path)
    assert list(tmp_path.glob("relay.buf.corrupt-*")), "the damaged file is kept aside"
    # the SQLite source (no_data, nothing trimmed) declared its whole txlog complete,
    # so the relay state says to re-read it from the start: nothing is missing
    (state_file,) = (tmp_path / "state").glob("*.state.json")  # the relay's derived name
    state = json.loads(state_file.read_text())
    assert state["complete_from_start"] and state["floor_scn"] == -1
    assert len([e for e in events if not e.is_control]) == sum(len(t) for t in w.committed)
