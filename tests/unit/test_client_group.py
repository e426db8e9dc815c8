"""ConsumerGroup: per-key order on N threads, control to all, atomic windows."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest

from databus.client import Consumer, ConsumerGroup, ConsumerResult, DataEvent
from databus.client.dispatcher import Dispatcher, SchemaViews
from databus.client.window import DecodedWindow
from databus.core import event as ev
from databus.core.errors import ConsumerCallbackError, ConsumerFatalError
from databus.core.schema import SchemaRegistry
from tests.support.memrelay import CUSTOMERS, ITEMS, customer, item

REG = SchemaRegistry([CUSTOMERS, ITEMS])


class Worker(Consumer):
    """Records per key the order of values, with random small delays."""

    def __init__(self, seed: int, shared: dict[str, Any]) -> None:
        self.rng = random.Random(seed)
        self.shared = shared
        self.threads: set[str] = set()
        self.controls: list[tuple[str, int]] = []
        self.keys: set[Any] = set()

    def on_start_data_event_sequence(self, scn: int) -> None:
        self.controls.append(("start", scn))

    def on_data_event(self, event: DataEvent) -> Any:
        self.threads.add(threading.current_thread().name)
        if self.rng.random() < 0.05:
            time.sleep(0.001)
        after = event.after
        assert after is not None
        with self.shared["lock"]:
            self.shared["seen"].setdefault(event.key, []).append((event.scn, after.get("qty",
                                                                  after.get("name"))))
            self.shared["done"] += 1
        self.keys.add(event.key)
        return self.shared.get("result")

    def on_end_data_event_sequence(self, scn: int) -> None:
        self.controls.append(("end", scn))

    def on_checkpoint(self, scn: int) -> None:
        self.controls.append(("checkpoint", scn))
        # windows are atomic: every event of the window was handled by every thread
        assert self.shared["done"] == self.shared["expected_by_scn"][scn]


def _windows() -> tuple[list[DecodedWindow], dict[int, int]]:
    windows: list[DecodedWindow] = []
    expected: dict[int, int] = {}
    total = 0
    rng = random.Random(3)
    for scn in range(1, 21):
        raw = []
        for i in range(200):
            if rng.random() < 0.5:
                raw.append(customer(scn, rng.randrange(50), name=f"{scn}-{i}"))
            else:
                raw.append(item(scn, rng.randrange(20), rng.randrange(3), qty=scn * 1000 + i))
        windows.append(DecodedWindow(scn, [ev.decode(e) for e in raw]))
        total += len(raw)
        expected[scn] = total
    return windows, expected


def test_group_of_four_keeps_key_order_and_window_atomicity() -> None:
    windows, expected = _windows()
    shared: dict[str, Any] = {"lock": threading.Lock(), "seen": {}, "done": 0,
                              "expected_by_scn": expected}
    members = [Worker(i, shared) for i in range(4)]
    group = ConsumerGroup(members)
    d = Dispatcher(group, SchemaViews(REG))
    group.on_start_consumption()
    try:
        for w in windows:
            d.dispatch(w)
            assert d.checkpoint(w.scn)  # only after every worker finished the window
    finally:
        group.on_stop_consumption()
    # every event delivered once, per key in commit order
    want: dict[Any, list[Any]] = {}
    for w in windows:
        for e in w.events:
            de = DataEvent(e, SchemaViews(REG).view(e))
            after = de.after
            assert after is not None
            want.setdefault(e.key, []).append((e.scn, after.get("qty", after.get("name"))))
    assert shared["seen"] == want
    assert shared["done"] == 4000
    # each key on exactly one worker, each worker on its own thread, control to all
    for a in members:
        assert len(a.threads) == 1
        assert a.controls[:3] == [("start", 1), ("end", 1), ("checkpoint", 1)]
        assert len(a.controls) == 60
        for b in members:
            if a is not b:
                assert not a.keys & b.keys
    assert len({t for m in members for t in m.threads}) == 4


@pytest.mark.parametrize(("result", "error"), [(ConsumerResult.ERROR, ConsumerCallbackError),
                                               (ConsumerResult.ERROR_FATAL, ConsumerFatalError)])
def test_a_failing_worker_fails_the_window(result: ConsumerResult,
                                           error: type[Exception]) -> None:
    windows, expected = _windows()
    shared: dict[str, Any] = {"lock": threading.Lock(), "seen": {}, "done": 0,
                              "expected_by_scn": expected, "result": result}
    with ConsumerGroup([Worker(i, shared) for i in range(4)]) as group:
        d = Dispatcher(group, SchemaViews(REG))
        with pytest.raises(error):
            d.dispatch(windows[0])
        d.rollback(0)  # clears the failure; the window can be replayed
        shared["result"] = None
        d.dispatch(windows[0])


def test_shared_consumer_and_sizes() -> None:
    shared: dict[str, Any] = {"lock": threading.Lock(), "seen": {}, "done": 0,
                              "expected_by_scn": {}}
    one = Worker(0, shared)
    with ConsumerGroup(one, threads=3) as group:
        assert group.size == 3
        d = Dispatcher(group, SchemaViews(REG))
        d.dispatch(DecodedWindow(5, [ev.decode(customer(5, k)) for k in range(30)]))
    assert shared["done"] == 30 and len(one.threads) == 3
    with pytest.raises(ValueError):
        ConsumerGroup([one], threads=2)
    with pytest.raises(ValueError):
        ConsumerGroup([])


def test_a_dynamic_group_fences_each_consumer_as_it_takes_windows() -> None:
    """A group member's partition consumer keeps the way it takes windows: one with
    per-window callbacks gets them (the fence must not turn it into an ``on_windows``
    consumer whose inherited no-op drops every window), one that takes many gets its
    ``on_windows`` with the ownership checked before and after each call."""
    from databus.client.consumer import Consumer, WindowBatch
    from databus.client.dispatcher import takes_many
    from databus.client.membership import fenced

    class PerWindow(Consumer):
        def on_data_event(self, event: object) -> None:
            pass

    class Many(Consumer):
        def __init__(self) -> None:
            self.batches = 0

        def on_windows(self, batch: WindowBatch) -> None:
            self.batches += 1

    checks: list[str] = []
    assert not takes_many(fenced(PerWindow(), lambda: checks.append("x")))
    many = Many()
    f = fenced(many, lambda: checks.append("check"))
    assert takes_many(f)
    f.on_windows(WindowBatch([], lambda e: None))  # type: ignore[arg-type,return-value]
    assert many.batches == 1 and checks == ["check", "check"]
