"""Bootstrap over a real relay on the SQLite source, in one process.

Relay (small buffer, so history falls off), bootstrap service (initial load,
producer, applier, server on a SQLite store) and a replicate sink whose
replica is compared with the source.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from databus.bootstrap.config import parse_config
from databus.bootstrap.service import BootstrapService
from databus.client import ClientConfig, DatabusClient
from databus.client.sinks import ReplicateSink
from databus.core.checkpoint import ConsumptionMode
from databus.core.errors import ScnNotFoundError
from databus.relay.relay import Relay
from tests.support.bootstrap import Consumer, make_bootstrap, preload, rows, wait_equal
from tests.support.bulk import BulkWriter
from tests.support.relays import make_relay
from tests.support.shop import TABLES
from tests.support.wait import wait_until


@pytest.fixture
def relay_small(shop_db: Path, tmp_path: Path) -> Iterator[Relay]:
    r = make_relay(shop_db, tmp_path, capacity_bytes=1024 * 1024)
    with r:
        yield r


def test_new_consumer_bootstraps_while_writes_continue(shop_db: Path, tmp_path: Path) -> None:
    """Rows from before capture (initial load) + 20,000 changes that fell off the
    relay; the consumer starts late, writes continue during its bootstrap."""
    preload(shop_db, 3000)
    relay = make_relay(shop_db, tmp_path, capacity_bytes=1024 * 1024)
    relay.start()
    bs = make_bootstrap(shop_db, tmp_path, relay)
    bs.start()
    w = BulkWriter(shop_db, seed=3, per_tx=50)
    stop = threading.Event()
    consumer = None
    try:
        w.run_until(20_000, stop, 0.001)
        # the relay no longer holds the start of the history
        assert relay.buffer.min_scn > 1000
        writer = threading.Thread(target=w.run_until, args=(40_000, stop, 0.01))
        writer.start()
        consumer = Consumer(relay, bs, tmp_path / "replica.db", batch=500)
        writer.join(120)
        assert not writer.is_alive()
        wait_equal(shop_db, tmp_path / "replica.db", [consumer])
        stored = consumer.sink.load()
        assert stored is not None and stored.consumption_mode == ConsumptionMode.ONLINE_CONSUMPTION
        assert consumer.client.stats.checkpoints > 10  # it really went through batches
    finally:
        stop.set()
        if consumer is not None:
            consumer.stop()
        w.close()
        bs.stop()
        relay.stop()


def test_fallen_off_consumer_catches_up(shop_db: Path, tmp_path: Path) -> None:
    """A consumer with an old checkpoint gets ScnNotFound and catches up from the log."""
    relay = make_relay(shop_db, tmp_path, capacity_bytes=1024 * 1024)
    relay.start()
    bs = make_bootstrap(shop_db, tmp_path, relay)
    bs.start()
    w = BulkWriter(shop_db, seed=4, per_tx=50)
    replica = tmp_path / "replica.db"
    try:
        w.run_until(2000, threading.Event(), 0.001)
        c = Consumer(relay, bs, replica)
        wait_equal(shop_db, replica, [c])
        c.stop()
        old = ReplicateSink(f"sqlite:///{replica}").load()
        assert old is not None
        w.run_until(20_000, threading.Event(), 0.001)
        assert relay.buffer.min_scn > old.window_scn + 1000
        # without a bootstrap server that is a terminal error
        sink = ReplicateSink(f"sqlite:///{replica}")
        plain = DatabusClient(ClientConfig(relay=relay.url, poll_timeout=0.3), sink, sink)
        with pytest.raises(ScnNotFoundError):
            plain.run()
        sink.close()
        c = Consumer(relay, bs, replica)
        wait_equal(shop_db, replica, [c])
        c.stop()
    finally:
        w.close()
        bs.stop()
        relay.stop()


def test_admin_reports_positions(shop_db: Path, tmp_path: Path, relay_small: Relay) -> None:
    bs = make_bootstrap(shop_db, tmp_path, relay_small)
    with bs:
        w = BulkWriter(shop_db, seed=5)
        w.run_until(500)
        w.close()
        def applied() -> dict[str, int] | None:
            st: dict[str, int] = httpx.get(f"{bs.url}/admin", timeout=5).json()
            return st if st["applied_scn"] >= w.changes else None

        st = wait_until(applied, 30, "the bootstrap applier to fold every change", interval=0.1)
        assert st["log_max_scn"] >= w.changes
        assert httpx.get(f"{bs.url}/targetSCN", timeout=5).json()["targetScn"] >= w.changes


@pytest.mark.parametrize("initial", [True, False])
def test_rows_from_before_capture_need_the_initial_load(shop_db: Path, tmp_path: Path,
                                                        initial: bool) -> None:
    """Rows that existed before capture are in the replica with the initial load; without
    it they are missing (so the check can fail), while later changes are there."""
    preload(shop_db, 2000)
    relay = make_relay(shop_db, tmp_path, capacity_bytes=1024 * 1024)
    relay.start()
    bs = make_bootstrap(shop_db, tmp_path, relay, initial=initial)
    bs.start()
    replica = tmp_path / "replica.db"
    c = None
    try:
        con = sqlite3.connect(shop_db)
        con.execute("INSERT INTO customers VALUES (100000, 'after capture', 1.0, 1)")
        con.commit()
        con.close()
        c = Consumer(relay, bs, replica)
        if initial:
            wait_equal(shop_db, replica, [c])
            assert len(rows(replica, "customers")) == 2001
        else:
            def arrived() -> bool:
                assert c is not None and c.error is None
                return any(r[0] == 100000 for r in rows(replica, "customers"))

            wait_until(arrived, 30, "the later change at the replica", interval=0.1)
            assert len(rows(replica, "customers")) == 1
    finally:
        if c is not None:
            c.stop()
        bs.stop()
        relay.stop()


@pytest.mark.parametrize("initial", [False, True])
def test_producer_that_fell_off_the_relay(shop_db: Path, tmp_path: Path, initial: bool) -> None:
    """Without an initial load the producer stops with ScnNotFound and the server keeps
    serving; with one, the store is rebuilt and a consumer still ends equal."""
    preload(shop_db, 500)
    relay = make_relay(shop_db, tmp_path, capacity_bytes=1024 * 1024)
    relay.start()
    w = BulkWriter(shop_db, seed=6, per_tx=50)
    c = None
    try:
        bs = make_bootstrap(shop_db, tmp_path, relay, initial=initial)
        bs.start()
        w.run_until(1000, threading.Event(), 0.001)
        wait_until(lambda: bs.store.state().applied_scn >= w.changes, 30,
               "the bootstrap applier to fold every change",
                   interval=0.05)
        bs.stop()
        w.run_until(20_000, threading.Event(), 0.001)  # the relay drops the producer's position
        assert relay.buffer.min_scn > 2000
        bs = make_bootstrap(shop_db, tmp_path, relay, initial=initial)
        bs.start()
        try:
            if not initial:
                err = wait_until(lambda: httpx.get(f"{bs.url}/admin", timeout=5).json()
                                 ["producer"]["error"], 30, "the producer's error")
                assert err.startswith("ScnNotFound")
                # what the store holds is still served
                r = httpx.get(f"{bs.url}/startSCN", timeout=5)
                assert r.status_code == 200 and r.json()["startScn"] > 1000
            else:
                wait_until(lambda: httpx.get(f"{bs.url}/admin", timeout=5).json()["rebuilds"]
                           >= 1, 30, "the bootstrap store's rebuild")
                c = Consumer(relay, bs, tmp_path / "replica.db")
                w.run_until(21_000, threading.Event(), 0.01)
                wait_equal(shop_db, tmp_path / "replica.db", [c])
                assert bs.store.state().log_start_scn > 1000
        finally:
            if c is not None:
                c.stop()
            bs.stop()
    finally:
        w.close()
        relay.stop()


def test_log_retention_trims_and_far_behind_consumers_get_a_snapshot(
        shop_db: Path, tmp_path: Path) -> None:
    from databus.core.checkpoint import Checkpoint

    relay = make_relay(shop_db, tmp_path, capacity_bytes=1024 * 1024)
    relay.start()
    bs = BootstrapService(parse_config({
        "relay": relay.url, "store": {"url": f"sqlite:///{tmp_path / 'bs.db'}"},
        "initial_load": {"url": f"sqlite:///{shop_db}", "tables": TABLES},
        "http": {"port": 0}, "poll_timeout": 0.5, "apply_interval": 0.05,
        "log_retention": 0.5, "trim_interval": 0.2}))
    bs.start()
    w = BulkWriter(shop_db, seed=8, per_tx=50)
    replica = tmp_path / "replica.db"
    try:
        w.run_until(2000, threading.Event(), 0.001)
        c = Consumer(relay, bs, replica)
        wait_equal(shop_db, replica, [c])
        c.stop()
        old = ReplicateSink(f"sqlite:///{replica}").load()
        assert old is not None
        w.run_until(20_000, threading.Event(), 0.001)
        wait_until(lambda: bs.store.state().log_start_scn > old.window_scn + 1000, 30,
                   "the bootstrap log to be trimmed",
                   interval=0.1)
        # the consumer's position is gone from the relay and from the log: a snapshot
        r = httpx.get(f"{bs.url}/startSCN", params={"checkPoint": old.to_json()}, timeout=5)
        assert r.status_code == 200, r.text
        assert r.json()["checkpoint"]["consumption_mode"] == "BOOTSTRAP_SNAPSHOT"
        stale = Checkpoint(consumption_mode=ConsumptionMode.BOOTSTRAP_CATCHUP,
                           bootstrap_start_scn=old.window_scn + 1,
                           bootstrap_target_scn=old.window_scn + 10)
        r = httpx.get(f"{bs.url}/bootstrap", params={"checkPoint": stale.to_json()}, timeout=5)
        assert r.status_code == 410 and r.json()["error"] == "BootstrapTooYoung"
        c = Consumer(relay, bs, replica)
        wait_equal(shop_db, replica, [c])
        c.stop()
        # a consumer stopped in a catch-up whose log was trimmed since: BootstrapTooYoung,
        # it starts its bootstrap again and still ends equal
        from databus.client.checkpoints import SqlCheckpointStore

        online = ReplicateSink(f"sqlite:///{replica}").load()
        assert online is not None
        SqlCheckpointStore(f"sqlite:///{replica}", "replicate").save(Checkpoint(
            consumption_mode=ConsumptionMode.BOOTSTRAP_CATCHUP,
            bootstrap_since_scn=old.window_scn, bootstrap_start_scn=old.window_scn + 1,
            bootstrap_target_scn=online.window_scn))
        w.run_until(22_000, threading.Event(), 0.001)
        c = Consumer(relay, bs, replica)
        wait_equal(shop_db, replica, [c])
        assert c.client.stats.rollbacks >= 1
        c.stop()
    finally:
        w.close()
        bs.stop()
        relay.stop()
