"""The relay's default buffer holds minutes of a busy source (1 GiB) without taking that
memory at start (a buffer file takes its disk space at start), and a buffer file made with another capacity (the old 64 MiB default)
is adopted with its own when none is given."""

from __future__ import annotations

from pathlib import Path

from databus.buffer import EventBuffer
from databus.relay.config import parse_config
from databus.relay.relay import Relay
from tests.support.shop import TABLES


def _config(db: Path, tmp: Path, **buffer: object) -> dict[str, object]:
    return {"name": "default-buffer",
            "source": {"url": f"sqlite:///{db}", "tables": TABLES, "snapshot_mode": "no_data"},
            "buffer": buffer, "http": {"port": 0}, "state_dir": str(tmp / "state")}


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_the_default_memory_buffer_is_large_and_taken_as_it_fills(
        shop_db: Path, tmp_path: Path) -> None:
    before = _rss()
    with Relay(parse_config(_config(shop_db, tmp_path))) as relay:
        assert relay.buffer.capacity == 1 << 30
        assert _rss() - before < 200 << 20


def test_a_buffer_file_keeps_its_capacity_unless_one_is_given(
        shop_db: Path, tmp_path: Path) -> None:
    path = tmp_path / "old.buf"
    EventBuffer(64 << 20, path=path).close()  # made when 64 MiB was the default
    with Relay(parse_config(_config(shop_db, tmp_path, path=str(path)))) as relay:
        assert relay.buffer.capacity == 64 << 20
    new = tmp_path / "new.buf"
    with Relay(parse_config(_config(shop_db, tmp_path, path=str(new)))) as relay:
        assert relay.buffer.capacity == 1 << 30
    # its disk blocks are reserved at open, memory is not taken (the RSS test above): a
    # store into a page never needs space that a full disk no longer has
    # (tests/faults/test_disk_full.py; docs/relay.md)
    assert new.stat().st_blocks * 512 >= 1 << 30
