"""``on_windows`` through the pull loop against a relay over HTTP: an answer's whole
windows in one call instead of the per-window callbacks, a failure replaying them all
from the persisted checkpoint, ``max_windows`` honoured, and a subclass that overrides a
per-window callback getting the per-window calls it expects."""

from __future__ import annotations

from typing import Any

import pytest

from databus.client import (
    ClientConfig,
    Consumer,
    DatabusClient,
    MemoryCheckpointStore,
    WindowBatch,
)
from databus.client.dispatcher import takes_many
from databus.core.errors import RetriesExhaustedError
from tests.support.memrelay import MemoryRelay, customer, item


def _config(relay: MemoryRelay, **kw: Any) -> ClientConfig:
    base: dict[str, Any] = {"relay": relay.url, "poll_timeout": 0.2,
                            "backoff_initial": 0.01, "backoff_max": 0.05}
    base.update(kw)
    return ClientConfig(**base)


class Windows(Consumer):
    """Records each on_windows call: the windows' SCNs and their events' sources."""

    def __init__(self, fail: int = 0) -> None:
        self.calls: list[list[int]] = []
        self.sources: list[str] = []
        self.per_window: list[int] = []
        self.rollbacks: list[int] = []
        self.fail = fail

    def on_windows(self, batch: WindowBatch) -> None:
        self.calls.append([w.scn for w in batch.windows])
        self.sources += [batch.view(e).schema.name for w in batch.windows for e in w.events]
        if self.fail:
            self.fail -= 1
            raise RuntimeError("boom")

    def on_end_data_event_sequence(self, scn: int) -> None:
        self.per_window.append(scn)

    def on_rollback(self, scn: int) -> None:
        self.rollbacks.append(scn)


class PerWindowToo(Windows):
    def on_start_data_event_sequence(self, scn: int) -> None:
        self.per_window.append(-scn)


def _windows(relay: MemoryRelay) -> None:
    relay.add_window(10, [customer(10, 1), item(10, 7, 1)])
    relay.add_window(20, [customer(20, 2)])
    relay.add_window(30, [item(30, 8, 1), customer(30, 3)])


def test_an_answer_s_windows_come_in_one_call_and_are_persisted_after_it(
        memrelay: MemoryRelay) -> None:
    _windows(memrelay)
    c, store = Windows(), MemoryCheckpointStore()
    client = DatabusClient(_config(memrelay), c, store)
    client.run(max_windows=3)
    assert c.calls == [[10, 20, 30]] and not c.per_window
    assert c.sources == ["shop.customers", "shop.items", "shop.customers", "shop.items",
                         "shop.customers"]
    assert store.checkpoint is not None and store.checkpoint.window_scn == 30
    assert (client.stats.windows, client.stats.events) == (3, 5)


def test_max_windows_cuts_an_answer_and_the_rest_comes_next_run(memrelay: MemoryRelay) -> None:
    _windows(memrelay)
    c, store = Windows(), MemoryCheckpointStore()
    DatabusClient(_config(memrelay), c, store).run(max_windows=2)
    assert c.calls == [[10, 20]]
    assert store.checkpoint is not None and store.checkpoint.window_scn == 20
    DatabusClient(_config(memrelay), c, store).run(max_windows=1)
    assert c.calls == [[10, 20], [30]]


def test_a_failing_call_replays_all_its_windows(memrelay: MemoryRelay) -> None:
    _windows(memrelay)
    c, store = Windows(fail=2), MemoryCheckpointStore()
    client = DatabusClient(_config(memrelay), c, store)
    client.run(max_windows=3)
    assert c.calls == [[10, 20, 30]] * 3 and c.rollbacks == [-1, -1]
    assert client.stats.rollbacks == 2 and store.checkpoint is not None
    assert store.checkpoint.window_scn == 30
    c = Windows(fail=5)
    with pytest.raises(RetriesExhaustedError, match="window 10"):
        DatabusClient(_config(memrelay, max_retries=1), c, MemoryCheckpointStore()).run()


def test_a_subclass_overriding_a_per_window_callback_gets_the_per_window_calls(
        memrelay: MemoryRelay) -> None:
    _windows(memrelay)
    assert takes_many(Windows()) and not takes_many(PerWindowToo())
    replaced = Windows()
    replaced.on_start_source = lambda *a: None  # type: ignore[method-assign]
    assert not takes_many(replaced) and not takes_many(Consumer())
    c = PerWindowToo()
    DatabusClient(_config(memrelay), c, MemoryCheckpointStore()).run(max_windows=3)
    assert not c.calls and c.per_window == [-10, 10, -20, 20, -30, 30]
