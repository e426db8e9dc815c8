"""on_data_events through the pull loop against a relay over HTTP: whole windows,
split windows reassembled, rollback and replay of a failing batch, checkpoints only
after every callback of a window returned."""

from __future__ import annotations

from typing import Any

from databus.client import ClientConfig, Consumer, DatabusClient, MemoryCheckpointStore
from databus.client.consumer import DataBatch
from databus.core.event import Op
from databus.core.schema import TableSchema
from tests.support.memrelay import MemoryRelay, customer, item


def _config(relay: MemoryRelay, **kw: Any) -> ClientConfig:
    base: dict[str, Any] = {"relay": relay.url, "poll_timeout": 0.2, "fetch_size": 1024,
                            "backoff_initial": 0.01, "backoff_max": 0.05}
    base.update(kw)
    return ClientConfig(**base)


def _three_windows(relay: MemoryRelay) -> None:
    relay.add_window(10, [customer(10, 1), customer(10, 2), item(10, 7, 1), customer(10, 3)])
    relay.add_window(20, [customer(20, i) for i in range(100, 140)])  # ~4.5 kB: split
    relay.add_window(30, [item(30, 8, 1), item(30, 8, 2, op=Op.UPDATE)])


class Columns(Consumer):
    """Keeps the id column of every batch; fails the first ``fail`` batches of window 20."""

    def __init__(self, fail: int = 0) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.ids: dict[int, list[Any]] = {}
        self.fail = fail
        self.store: MemoryCheckpointStore | None = None

    def on_start_data_event_sequence(self, scn: int) -> None:
        self.calls.append(("start", scn))
        self.ids[scn] = []

    def on_start_source(self, source_name: str, schema: TableSchema) -> None:
        self.calls.append(("source", source_name))

    def on_data_events(self, batch: DataBatch) -> None:
        self.calls.append(("batch", batch.scn, len(batch)))
        col = batch.columns["id" if batch.source == "shop.customers" else "order_id"]
        self.ids[batch.scn] += col
        if batch.scn == 20 and self.fail:
            self.fail -= 1
            raise RuntimeError("boom")
        # nothing of this window is persisted while its callbacks run
        assert self.store is not None
        assert self.store.checkpoint is None or self.store.checkpoint.window_scn < batch.scn

    def on_end_data_event_sequence(self, scn: int) -> None:
        self.calls.append(("end", scn))

    def on_rollback(self, scn: int) -> None:
        self.calls.append(("rollback", scn))

    def on_checkpoint(self, scn: int) -> None:
        self.calls.append(("checkpoint", scn))


def _at_window_end(store: MemoryCheckpointStore, scn: int) -> None:
    assert store.checkpoint is not None
    assert store.checkpoint.window_scn == scn and not store.checkpoint.in_window


def _run(memrelay: MemoryRelay, consumer: Columns, windows: int = 3,
         **kw: Any) -> MemoryCheckpointStore:
    store = MemoryCheckpointStore()
    consumer.store = store
    DatabusClient(_config(memrelay, **kw), consumer, store).run(max_windows=windows)
    return store


def test_batches_get_whole_windows_in_order(memrelay: MemoryRelay) -> None:
    _three_windows(memrelay)
    c = Columns()
    store = _run(memrelay, c)
    assert c.ids == {10: [1, 2, 7, 3], 20: list(range(100, 140)), 30: [8, 8]}
    # window 20 arrives in pieces (fetch_size 1 kB) and is dispatched as one run
    assert ("batch", 20, 40) in c.calls
    assert [x[1] for x in c.calls if x[0] == "checkpoint"] == [10, 20, 30]
    _at_window_end(store, 30)


def test_a_failing_batch_rolls_back_and_replays_the_window(memrelay: MemoryRelay) -> None:
    _three_windows(memrelay)
    c = Columns(fail=1)
    store = _run(memrelay, c)
    assert c.calls.count(("rollback", 10)) == 1
    assert [x[1] for x in c.calls if x[0] == "start"] == [10, 20, 20, 30]
    assert [x[1] for x in c.calls if x[0] == "checkpoint"] == [10, 20, 30]
    assert c.ids[20] == list(range(100, 140))  # the replay delivered the whole window again
    _at_window_end(store, 30)


def test_checkpoint_only_after_the_windows_with_batching(memrelay: MemoryRelay) -> None:
    _three_windows(memrelay)
    c = Columns(fail=1)
    store = _run(memrelay, c, 4, checkpoint_every_windows=2)  # the replayed 10 counts
    assert ("rollback", -1) in c.calls  # nothing persisted when window 20 failed
    assert [x[1] for x in c.calls if x[0] == "start"] == [10, 20, 10, 20, 30]
    assert [x[1] for x in c.calls if x[0] == "checkpoint"] == [20, 30]
    _at_window_end(store, 30)
