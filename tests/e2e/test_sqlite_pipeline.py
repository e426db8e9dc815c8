"""SQLite -> relay -> consumers, each in its own process, with crashes.

What the database committed (recorded by the writer) is compared with what a
recording consumer received and with the rows of a replicate sink's target.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.pipeline import (
    RelayPipeline,
    recorder_args,
    relay_args,
    replicate_args,
    write_config,
)
from tests.support.procs import free_port
from tests.support.shop import TABLES, Writer, create_shop, table_rows
from tests.support.verify import check_delivery, read_windows
from tests.support.writers import Repeating


@dataclass
class Pipeline(RelayPipeline):
    tmp: Path
    db: Path
    port: int

    @property
    def replica(self) -> Path:
        return self.tmp / "replica.db"

    def args(self, name: str) -> list[str]:
        if name == "relay":
            return relay_args(self.port, config=self.tmp / "relay.yaml")
        if name == "replicate":
            return replicate_args(self.url, f"sqlite:///{self.replica}")
        return recorder_args(self.url, self.record, self.tmp / "recorder.ckpt")

    def wait_caught_up(self, writer: Writer, timeout: float = 180.0) -> None:
        """Until the relay holds everything and both consumers have it."""
        def caught_up() -> bool:
            top = self.max_scn()
            recorded = read_windows(self.record)
            if (recorded and recorded[-1][0] == top and self.replica.exists()
                    and _replica_equal(self.db, self.replica)):
                time.sleep(1.0)
                return self.max_scn() == top
            return False

        self.wait("the consumers to catch up with the relay", caught_up, timeout, interval=0.5)

    def start_all(self, seed: int) -> Writer:
        """Relay, replicate sink and recorder running; a writer on the source."""
        for name in ("relay", "replicate", "recorder"):
            self.start(name)
        w = Writer(self.db, seed=seed)
        w.con.execute("PRAGMA synchronous=NORMAL")
        return w


def _replica_equal(db: Path, replica: Path) -> bool:
    try:
        return all(table_rows(db, t) == table_rows(replica, t) for t in TABLES)
    except Exception:  # replica tables not created yet
        return False


@pytest.fixture
def pipeline(tmp_path: Path) -> Iterator[Pipeline]:
    db = tmp_path / "shop.db"
    create_shop(db)
    p = Pipeline(tmp_path, db, free_port())
    write_config(tmp_path / "relay.yaml", {
        "name": "e2e",
        "source": {"url": f"sqlite:///{db}", "tables": TABLES, "poll_interval": 0.01,
                   "snapshot_mode": "no_data"},  # exact delivery of each transaction
        "buffer": {"capacity_bytes": 256 * 1024 * 1024, "path": str(tmp_path / "relay.buf"),
                   "flush_interval": 0.2},
        "http": {"port": p.port},
    })
    try:
        yield p
    finally:
        p.close()


def _assert_all(p: Pipeline, w: Writer) -> dict[str, int]:
    for t in TABLES:
        assert table_rows(p.db, t) == table_rows(p.replica, t), f"replica differs in {t}"
    return check_delivery(read_windows(p.record), w.committed, w.rolled_back)


@pytest.mark.slow
def test_ten_thousand_transactions(pipeline: Pipeline) -> None:
    p = pipeline
    with p.start_all(seed=11) as w:
        for _ in range(10_000):
            w.transaction()
    p.wait_caught_up(w)
    stats = _assert_all(p, w)
    assert stats["changes"] > 50_000 and stats["rolled_back_transactions"] > 500
    print("e2e:", stats)


@pytest.mark.slow
def test_kill_relay_and_consumers_at_random_points(pipeline: Pipeline) -> None:
    p = pipeline
    w = p.start_all(seed=12)
    rng = random.Random(5)
    kills = {"relay": 0, "replicate": 0, "recorder": 0}
    try:
        with Repeating(w.transaction, 0.002, until=lambda: len(w.committed) >= 20_000) as wr:
            for i in range(24):
                name = ["relay", "replicate", "recorder"][i % 3]
                wr.done.wait(rng.uniform(0.3, 1.5))
                p.kill(name)
                kills[name] += 1
                p.start(name)
    finally:
        w.close()
    p.wait_caught_up(w)
    stats = _assert_all(p, w)
    assert min(kills.values()) >= 8 and sum(kills.values()) >= 20
    print("crashes:", kills, stats)
