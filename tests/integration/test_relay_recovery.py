"""A relay restarting on a damaged buffer file never serves the damage."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from databus.buffer.persist import HEADER_SIZE
from databus.core import event as ev
from tests.conftest import make_relay
from tests.integration.test_relay_api import _drain
from tests.support.shop import Writer, txlog_max


def _run_and_stop(db: Path, tmp: Path, n: int) -> Writer:
    relay = make_relay(db, tmp, path=str(tmp / "relay.buf"))
    relay.start()
    w = Writer(db, seed=4)
    for _ in range(n):
        w.transaction()
        if len(w.committed) % 10 == 0:
            time.sleep(0.05)  # several windows
    w.close()
    deadline = time.monotonic() + 10
    while relay.buffer.max_scn < txlog_max(db) and time.monotonic() < deadline:
        time.sleep(0.05)
    relay.stop()
    return w


def _served(db: Path, tmp: Path) -> tuple[list[ev.Event], dict[str, object]]:
    relay = make_relay(db, tmp, path=str(tmp / "relay.buf"))
    relay.start()
    try:
        top = txlog_max(db)
        deadline = time.monotonic() + 10
        while relay.buffer.max_scn < top and time.monotonic() < deadline:
            time.sleep(0.05)
        with httpx.Client(base_url=relay.url, timeout=10) as c:
            return _drain(c, {}, top), relay.buffer.stats()
    finally:
        relay.stop()


def test_corrupt_window_is_dropped_and_fetched_again(shop_db: Path, tmp_path: Path) -> None:
    w = _run_and_stop(shop_db, tmp_path, 60)
    expected = sum(len(t) for t in w.committed)
    buf = tmp_path / "relay.buf"
    with buf.open("r+b") as fh:  # a byte in the middle of the data
        fh.seek(HEADER_SIZE + 3000)
        b = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([b[0] ^ 0x55]))
    events, _ = _served(shop_db, tmp_path)
    data = [e for e in events if not e.is_control]  # _drain decoded with CRC checks
    assert len(data) == expected  # prefix kept, the rest re-read from the txlog once


def test_unreadable_buffer_file_is_moved_aside(shop_db: Path, tmp_path: Path) -> None:
    w = _run_and_stop(shop_db, tmp_path, 30)
    buf = tmp_path / "relay.buf"
    with buf.open("r+b") as fh:
        fh.write(b"\x00" * HEADER_SIZE)
    events, _ = _served(shop_db, tmp_path)
    assert list(tmp_path.glob("relay.buf.corrupt-*")), "the damaged file is kept aside"
    assert len([e for e in events if not e.is_control]) == sum(len(t) for t in w.committed)
