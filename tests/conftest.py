"""Fixtures shared by the suite: SQLite shop databases and in-process relays."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from databus.relay.config import parse_config
from databus.relay.relay import Relay
from tests.support.shop import TABLES, create_shop


@pytest.fixture
def shop_db(tmp_path: Path) -> Path:
    path = tmp_path / "shop.db"
    create_shop(path)
    return path


def make_relay(db: Path, tmp: Path, *, snapshot_mode: str = "no_data",
               **buffer: object) -> Relay:
    """A relay on ``db``; stream-only unless ``snapshot_mode`` says otherwise (the
    tests using it check the exact delivery of each committed transaction)."""
    cfg = parse_config({
        "source": {"url": f"sqlite:///{db}", "tables": TABLES, "poll_interval": 0.01,
                   "snapshot_mode": snapshot_mode},
        "buffer": {"capacity_bytes": 4 * 1024 * 1024, "flush_interval": 0.2, **buffer},
        "http": {"port": 0},
        "state_dir": str(tmp / "state"),
        "stream": {"default_timeout": 0.5},
    })
    return Relay(cfg)


@pytest.fixture
def relay(shop_db: Path, tmp_path: Path) -> Iterator[Relay]:
    r = make_relay(shop_db, tmp_path)
    r.start()
    try:
        yield r
    finally:
        r.stop()
