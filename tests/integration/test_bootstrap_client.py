"""The client's side of the bootstrap with a plain consumer and a file checkpoint.

A consumer that keeps every row in memory (insert/update/snapshot read ->
image, delete -> gone) must end with exactly the source's rows; the callbacks
must come in the documented order; failures roll back and replay; a restart
in the middle of the bootstrap resumes it.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from databus.client import (
    ClientConfig,
    Consumer,
    DataBatch,
    DatabusClient,
    DataEvent,
    FileCheckpointStore,
)
from databus.client.consumer import ConsumerResult, Result
from databus.core.checkpoint import Checkpoint, ConsumptionMode
from databus.core.errors import ConfigError, ConsumerFatalError
from databus.core.event import Op
from tests.support.bootstrap import make_bootstrap, preload
from tests.support.bulk import BulkWriter
from tests.support.relays import make_relay
from tests.support.shop import TABLES, table_rows, txlog_max
from tests.support.wait import wait_until


def source_state(db: Path) -> dict[tuple[str, Any], tuple[Any, ...]]:
    out: dict[tuple[str, Any], tuple[Any, ...]] = {}
    for t in TABLES:
        for r in table_rows(db, t):
            key: Any = r[0] if t != "items" else json.dumps(
                [r[0], r[1]], separators=(",", ":")).encode()
            out[(f"main.{t}", key)] = tuple(r)
    return out


class StateConsumer(Consumer):
    """Applies every event to a dict; records the callback order."""

    def __init__(self, stop: threading.Event, fail_once_at: int | None = None,
                 stop_after_batches: int | None = None) -> None:
        self.state: dict[tuple[str, Any], tuple[Any, ...]] = {}
        self.calls: list[str] = []
        self.stop = stop
        self.fail_once_at = fail_once_at
        self.stop_after_batches = stop_after_batches
        self.boot_events = 0
        self.pending: list[DataEvent] = []
        self.batches = 0
        self.seq_scns: list[int] = []
        self.crash_at: int | None = None  # the client dies at this bootstrap event

    def _apply(self, e: DataEvent) -> None:
        k = (e.source, e.key)
        if e.op == Op.DELETE:
            self.state.pop(k, None)
        else:
            assert e.after is not None
            self.state[k] = tuple(e.after.values())

    # bootstrap: keep a batch's events until its checkpoint, like a transactional sink
    def on_start_bootstrap(self) -> Result:
        self.calls.append("start_bootstrap")
        return None

    def on_start_bootstrap_sequence(self, scn: int) -> Result:
        self.calls.append("start_seq")
        self.seq_scns.append(scn)
        return None

    def on_bootstrap_event(self, event: DataEvent) -> Result:
        self.boot_events += 1
        if self.boot_events == self.crash_at:
            raise ConsumerFatalError("crash")
        if self.fail_once_at is not None and self.boot_events == self.fail_once_at:
            self.fail_once_at = None
            return ConsumerResult.ERROR
        self.pending.append(event)
        return None

    def on_end_bootstrap_sequence(self, scn: int) -> Result:
        self.calls.append("end_seq")
        return None

    def on_bootstrap_checkpoint(self, scn: int) -> Result:
        for e in self.pending:
            self._apply(e)
        self.pending.clear()
        self.batches += 1
        if self.stop_after_batches is not None and self.batches >= self.stop_after_batches:
            self.stop.set()
        return None

    def on_bootstrap_rollback(self, scn: int) -> Result:
        self.calls.append("rollback")
        self.pending.clear()
        return None

    def on_end_bootstrap(self) -> Result:
        self.calls.append("end_bootstrap")
        return None

    def on_start_data_event_sequence(self, scn: int) -> Result:
        self.calls.append("online")
        return None

    def on_data_event(self, event: DataEvent) -> Result:
        self._apply(event)
        return None


class BatchStateConsumer(StateConsumer):
    """The same state through ``on_bootstrap_events``; every batch is checked
    against the per-event view of its events (rows, columns, ops, keys, orders)."""

    def __init__(self, stop: threading.Event, fail_once_at: int | None = None,
                 stop_after_batches: int | None = None) -> None:
        super().__init__(stop, fail_once_at, stop_after_batches)
        self.run_sizes: list[int] = []
        self.position = 0  # events delivered in the current sequence

    def on_start_bootstrap_sequence(self, scn: int) -> Result:
        self.position = 0
        return super().on_start_bootstrap_sequence(scn)

    def on_bootstrap_event(self, event: DataEvent) -> Result:
        raise AssertionError("a batch consumer got on_bootstrap_event")

    def on_bootstrap_events(self, batch: DataBatch) -> Result:
        events = batch.data_events()
        rows, cols = batch.rows, batch.columns
        assert len(batch) == len(events) == len(rows) > 0 and list(cols) == list(
            batch.schema.column_names)
        for i, e in enumerate(events):
            image = e.before if e.op == Op.DELETE else e.after  # the row the event carries
            assert rows[i] == image
            assert {name: col[i] for name, col in cols.items()} == (
                image if image is not None else dict.fromkeys(cols))
            assert (batch.ops[i], batch.keys[i], e.source, e.scn) == (
                e.op, e.key, batch.source, e.scn)
            # orders as the per-event path numbers them: positions in the sequence
            assert e.total_order == e.collection_order == self.position + i + 1
        self.position += len(events)
        self.run_sizes.append(len(events))
        before = self.boot_events
        self.boot_events += len(events)
        if self.crash_at is not None and before < self.crash_at <= self.boot_events:
            raise ConsumerFatalError("crash")
        if self.fail_once_at is not None and before < self.fail_once_at <= self.boot_events:
            self.fail_once_at = None
            return ConsumerResult.ERROR
        self.pending.extend(events)
        return None


@pytest.fixture(params=[StateConsumer, BatchStateConsumer], ids=["per_event", "batch"])
def consumer_type(request: pytest.FixtureRequest) -> type[StateConsumer]:
    return request.param  # type: ignore[no-any-return]


def run_until_equal(client: DatabusClient, consumer: StateConsumer, db: Path,
                    stop: threading.Event, timeout: float = 60,
                    writer: threading.Thread | None = None) -> None:
    """Run the client until it is online and its state equals the source."""
    t = threading.Thread(target=client.run, kwargs={"stop": stop}, daemon=True)
    t.start()
    try:
        if writer is not None:
            writer.start()
            writer.join(timeout)
        def equal_and_online() -> bool:
            assert t.is_alive()
            return (consumer.state == source_state(db) and client.persisted.consumption_mode
                    == ConsumptionMode.ONLINE_CONSUMPTION)

        wait_until(equal_and_online, timeout, "the consumer's state to equal the source",
                   interval=0.1)
    finally:
        stop.set()
        t.join(30)


@pytest.fixture
def setup(shop_db: Path, tmp_path: Path):  # type: ignore[no-untyped-def]
    preload(shop_db, 1500)
    relay = make_relay(shop_db, tmp_path, capacity_bytes=1024 * 1024)
    relay.start()
    bs = make_bootstrap(shop_db, tmp_path, relay)
    bs.start()
    w = BulkWriter(shop_db, seed=41, per_tx=50)
    w.run_until(12_000, threading.Event(), 0.001)
    top = txlog_max(shop_db)
    wait_until(lambda: relay.buffer.max_scn >= top, 30, "the relay to catch up with the writer",
               interval=0.05)
    assert relay.buffer.min_scn > 2000
    try:
        yield relay, bs, w
    finally:
        w.close()
        bs.stop()
        relay.stop()


def config(relay: Any, bs: Any, **kw: Any) -> ClientConfig:
    return ClientConfig(relay=relay.url, bootstrap_url=bs.url, poll_timeout=0.3,
                        backoff_initial=0.02, backoff_max=0.1, **kw)


def test_callback_order_and_no_gap(setup: Any, shop_db: Path, tmp_path: Path) -> None:
    relay, bs, w = setup
    stop = threading.Event()
    c = StateConsumer(stop)
    client = DatabusClient(config(relay, bs, bootstrap_batch_size=700), c,
                           FileCheckpointStore(tmp_path / "c.ckpt"))
    # writes go on while the consumer bootstraps and after it switched
    writer = threading.Thread(target=w.run_until, args=(16_000, threading.Event(), 0.01))
    run_until_equal(client, c, shop_db, stop, writer=writer)
    calls = c.calls
    assert calls[0] == "start_bootstrap" and calls.count("end_bootstrap") == 1
    end = calls.index("end_bootstrap")
    assert "online" not in calls[:end] and set(calls[1:end]) == {"start_seq", "end_seq"}
    assert calls.count("start_seq") > 5  # several batches
    assert "online" in calls[end:]  # windows from the relay after the switch


def test_batch_callback_gets_every_row_as_the_per_event_view(
        setup: Any, shop_db: Path, tmp_path: Path) -> None:
    """on_bootstrap_events: snapshot and catch-up in batches whose rows and columns
    equal the per-event view, and a state equal to the source."""
    relay, bs, w = setup
    stop = threading.Event()
    c = BatchStateConsumer(stop)
    client = DatabusClient(config(relay, bs, bootstrap_batch_size=700), c,
                           FileCheckpointStore(tmp_path / "c.ckpt"))
    writer = threading.Thread(target=w.run_until, args=(16_000, threading.Event(), 0.01))
    run_until_equal(client, c, shop_db, stop, writer=writer)
    assert c.calls.count("end_bootstrap") == 1 and c.boot_events == sum(c.run_sizes)
    assert max(c.run_sizes) > 100  # snapshot pages come as large runs
    assert client.stats.events >= c.boot_events


def test_error_in_a_batch_rolls_back_and_replays(setup: Any, shop_db: Path, tmp_path: Path,
                                                 consumer_type: type[StateConsumer]) -> None:
    relay, bs, _ = setup
    stop = threading.Event()
    c = consumer_type(stop, fail_once_at=1234)
    client = DatabusClient(config(relay, bs, bootstrap_batch_size=500), c,
                           FileCheckpointStore(tmp_path / "c.ckpt"))
    run_until_equal(client, c, shop_db, stop)
    assert c.calls.count("rollback") == 1
    assert client.stats.rollbacks == 1


def test_restart_mid_snapshot_resumes_it(setup: Any, shop_db: Path, tmp_path: Path,
                                        consumer_type: type[StateConsumer]) -> None:
    relay, bs, w = setup
    store = FileCheckpointStore(tmp_path / "c.ckpt")
    stop = threading.Event()
    c = consumer_type(stop, stop_after_batches=3)
    DatabusClient(config(relay, bs, bootstrap_batch_size=400), c, store).run(stop=stop)
    cp = store.load()
    assert cp is not None and cp.consumption_mode == ConsumptionMode.BOOTSTRAP_SNAPSHOT
    assert cp.snapshot_offset > 0
    # the store moves on meanwhile: a fresh bootstrap would start at a newer SCN
    w.run_until(13_000, threading.Event(), 0.001)
    wait_until(lambda: bs.store.state().applied_scn >= w.changes, 30,
               "the bootstrap applier to fold every change",
               interval=0.05)
    # a new process: same checkpoint file, the state the consumer had committed
    stop2 = threading.Event()
    c2 = consumer_type(stop2)
    c2.state = dict(c.state)
    run_until_equal(DatabusClient(config(relay, bs, bootstrap_batch_size=400), c2, store),
                    c2, shop_db, stop2)
    assert c2.calls[0] == "start_bootstrap"
    # it resumed the same bootstrap (same start SCN) after the persisted batches
    assert c2.seq_scns[0] == cp.bootstrap_start_scn < bs.store.state().applied_scn


def test_crash_inside_a_snapshot_batch_resumes_after_the_last_persisted_one(
        setup: Any, shop_db: Path, tmp_path: Path, consumer_type: type[StateConsumer]) -> None:
    """The client dies in the middle of delivering a snapshot batch: a new client
    on the same checkpoint file and the state committed so far ends equal."""
    relay, bs, _ = setup
    store = FileCheckpointStore(tmp_path / "c.ckpt")
    c = consumer_type(threading.Event())
    c.crash_at = 1000  # inside the third batch of 400
    with pytest.raises(ConsumerFatalError):
        DatabusClient(config(relay, bs, bootstrap_batch_size=400), c, store).run()
    cp = store.load()
    assert cp is not None and cp.consumption_mode == ConsumptionMode.BOOTSTRAP_SNAPSHOT
    assert c.batches == 2 and len(c.state) == 800  # two batches committed, not the third
    stop2 = threading.Event()
    c2 = consumer_type(stop2)
    c2.state = dict(c.state)
    run_until_equal(DatabusClient(config(relay, bs, bootstrap_batch_size=400), c2, store),
                    c2, shop_db, stop2)
    assert c2.seq_scns[0] == cp.bootstrap_start_scn


def test_bootstrap_checkpoint_without_bootstrap_url_is_a_config_error(
        setup: Any, tmp_path: Path) -> None:
    relay, _, _ = setup
    store = FileCheckpointStore(tmp_path / "c.ckpt")
    store.save(Checkpoint(consumption_mode=ConsumptionMode.BOOTSTRAP_SNAPSHOT,
                          bootstrap_start_scn=5, snapshot_source="main.customers"))
    with pytest.raises(ConfigError, match="bootstrap_url"):
        DatabusClient(ClientConfig(relay=relay.url), Consumer(), store).run()


def test_json_lines_sink_prints_the_snapshot(setup: Any, shop_db: Path) -> None:
    import io

    from databus.client.checkpoints import MemoryCheckpointStore
    from databus.client.sinks import JsonLinesSink

    relay, bs, _ = setup
    out = io.StringIO()
    stop = threading.Event()

    class Until(JsonLinesSink):
        def on_end_bootstrap(self) -> Result:
            stop.set()
            return None

    DatabusClient(config(relay, bs), Until(out), MemoryCheckpointStore()).run(stop=stop)
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    snap = [x for x in lines if x["op"] == "r"]
    assert snap and all(x["source"]["snapshot"] for x in snap)
    ids = [x["after"]["id"] for x in snap if x["source"]["table"] == "customers"]
    assert len(ids) == len(set(ids))  # each snapshot row once
    # snapshot then catch-up, applied in order, is the source's table (no writes since)
    customers: dict[int, tuple[Any, ...]] = {}
    for x in lines:
        if x["source"]["table"] != "customers":
            continue
        if x["op"] == "d":
            customers.pop(x["before"]["id"], None)
        else:
            customers[x["after"]["id"]] = tuple(x["after"].values())
    assert customers == {k[1]: v for k, v in source_state(shop_db).items()
                         if k[0] == "main.customers"}


def test_progress_is_logged(shop_db: Path, tmp_path: Path,
                            caplog: pytest.LogCaptureFixture) -> None:
    """Long snapshot reads report rows, rate and ETA: the initial load and a
    consumer's snapshot."""
    import logging

    caplog.set_level(logging.INFO, logger="databus")
    preload(shop_db, 3000)
    relay = make_relay(shop_db, tmp_path)
    relay.start()
    bs = make_bootstrap(shop_db, tmp_path, relay)
    bs.start()
    try:
        stop = threading.Event()
        c = StateConsumer(stop)
        client = DatabusClient(config(relay, bs, bootstrap_batch_size=100,
                                      bootstrap_progress_interval=0.001), c,
                               FileCheckpointStore(tmp_path / "c.ckpt"))
        run_until_equal(client, c, shop_db, stop)
    finally:
        bs.stop()
        relay.stop()
    lines = [r.getMessage() for r in caplog.records]
    load = [m for m in lines if m.startswith("initial load of")]
    assert load and "4499/4499 rows" in load[-1] and "rows/s, ETA" in load[-1], load
    snap = [m for m in lines if m.startswith("bootstrap snapshot of")]
    assert len(snap) > 3 and all(" rows/s, ETA " in m for m in snap), snap[:3]
    assert any("/4499 rows" in m for m in snap)  # the total announced by /startSCN
