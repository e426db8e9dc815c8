"""The client against the real relay (HTTP app + event buffer + fetcher thread),
fed by an in-memory Source, so it runs without any capture database."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from databus.client import (
    ClientConfig,
    Consumer,
    DatabusClient,
    DataEvent,
    MemoryCheckpointStore,
    ReplicateSink,
)
from databus.core import event as ev
from databus.core.checkpoint import Checkpoint
from databus.core.errors import ScnNotFoundError
from databus.core.schema import SchemaRegistry
from databus.core.window import Window
from databus.relay.config import parse_config
from databus.relay.relay import Relay
from databus.sources.base import Source, SourceInfo
from tests.support.memrelay import CUSTOMERS, ITEMS, customer, item
from tests.support.wait import wait_until


class ListSource(Source):
    """Windows appended by the test, read by the relay's fetcher."""

    def __init__(self) -> None:
        self._windows: list[Window] = []
        self._cond = threading.Condition()

    def add(self, scn: int, events: list[bytes]) -> None:
        with self._cond:
            self._windows.append(Window(scn, b"".join(events), len(events), scn * 1000))
            self._cond.notify_all()

    def sources(self) -> list[SourceInfo]:
        return [SourceInfo(1, "shop.customers"), SourceInfo(2, "shop.items")]

    def registry(self) -> SchemaRegistry:
        return SchemaRegistry([CUSTOMERS, ITEMS])

    def read(self, after_scn: int, stop: threading.Event, timeout: float) -> list[Window]:
        with self._cond:
            self._cond.wait_for(lambda: any(w.scn > after_scn for w in self._windows)
                                or stop.is_set(), timeout=min(timeout, 0.05))
            return [w for w in self._windows if w.scn > after_scn]


@pytest.fixture
def real_relay(tmp_path: Path) -> Iterator[tuple[Relay, ListSource]]:
    cfg = parse_config({
        # the source is injected below: the section only has to be a valid one
        "source": {"url": f"sqlite:///{tmp_path / 'unused.db'}", "poll_interval": 0.01},
        "buffer": {"capacity_bytes": 64 * 1024, "flush_interval": 0.2},
        "http": {"port": 0},
        "state_dir": str(tmp_path / "state"),
        "stream": {"default_timeout": 0.5},
    })
    src = ListSource()
    relay = Relay(cfg, source=src)
    with relay:
        yield relay, src


def _wait(relay: Relay, scn: int) -> None:
    wait_until(lambda: relay.buffer.max_scn >= scn, 10, "the relay to capture the writes",
               interval=0.01)


class Keep(Consumer):
    def __init__(self) -> None:
        self.windows: list[tuple[int, list[Any]]] = []
        self.current: list[Any] = []
        self.failed = False

    def on_start_data_event_sequence(self, scn: int) -> None:
        self.current = []

    def on_data_event(self, event: DataEvent) -> None:
        if event.scn == 30 and not self.failed:
            self.failed = True
            raise RuntimeError("fail once")
        self.current.append((event.source, event.key, event.after))

    def on_end_data_event_sequence(self, scn: int) -> None:
        self.windows.append((scn, self.current))


def test_client_on_the_real_relay(real_relay: tuple[Relay, ListSource], tmp_path: Path) -> None:
    relay, src = real_relay
    src.add(10, [customer(10, 1), item(10, 1, 1)])
    src.add(20, [customer(20, i) for i in range(60)])  # larger than fetch_size: split
    src.add(30, [item(30, 2, 1), customer(30, 2, op=ev.Op.UPDATE)])
    _wait(relay, 30)
    keep = Keep()
    store = MemoryCheckpointStore()
    cfg = ClientConfig(relay=relay.url, poll_timeout=0.2, fetch_size=2048,
                       backoff_initial=0.01, backoff_max=0.02)
    client = DatabusClient(cfg, keep, store)
    client.run(max_windows=3)
    assert [w[0] for w in keep.windows] == [10, 20, 30]
    assert [len(w[1]) for w in keep.windows] == [2, 60, 2]
    assert keep.windows[1][1][59] == ("shop.customers", 59, {"id": 59, "name": "n",
                                                               "balance": 1.5})
    assert client.stats.rollbacks == 1
    assert store.checkpoint is not None and store.checkpoint.window_scn == 30

    # replicate through the real relay
    with ReplicateSink(f"sqlite:///{tmp_path / 'r.db'}") as sink:
        DatabusClient(cfg, sink).run(max_windows=3)
        assert sink.windows_applied == 3

    # falling off the buffer: fill it past capacity, then ask for an old position
    for scn in range(100, 160):
        src.add(scn, [customer(scn, k, name="x" * 200) for k in range(5)])
    _wait(relay, 159)
    with pytest.raises(ScnNotFoundError, match="bootstrap"):
        DatabusClient(cfg, Keep(), MemoryCheckpointStore(Checkpoint.after(10))).run()


def _relay(tmp: Path, name: str, capacity: int) -> tuple[Relay, ListSource]:
    cfg = parse_config({
        "source": {"url": f"sqlite:///{tmp / 'unused.db'}", "poll_interval": 0.01},
        "buffer": {"capacity_bytes": capacity, "flush_interval": 0.2},
        "http": {"port": 0},
        "state_dir": str(tmp / name),
        "stream": {"default_timeout": 0.5},
    })
    src = ListSource()
    return Relay(cfg, source=src), src


def test_a_member_that_no_longer_holds_the_position_hands_over_to_one_that_does(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Members of a list (or a cluster) hold the same windows, not equally far back: the
    read moves to a member that still holds the position; ScnNotFound only when none
    does."""
    small, small_src = _relay(tmp_path, "small", 64 * 1024)
    large, large_src = _relay(tmp_path, "large", 256 * 1024)
    def same_windows(scns: range) -> None:  # both relays get them, as members of one
        for scn in scns:
            events = [customer(scn, k, name="x" * 200) for k in range(10)]
            small_src.add(scn, events)
            large_src.add(scn, events)
        _wait(small, scns[-1])
        _wait(large, scns[-1])

    with small, large:
        same_windows(range(10, 60))
        assert small.buffer.min_scn > 11  # the small one evicted the position
        cfg = ClientConfig(relay=f"{small.url},{large.url}", poll_timeout=0.2,
                           backoff_initial=0.01, backoff_max=0.02)
        keep = Keep()
        caplog.set_level(logging.WARNING, logger="databus.client")
        DatabusClient(cfg, keep, MemoryCheckpointStore(Checkpoint.after(10))).run(
            max_windows=49)
        assert [w[0] for w in keep.windows] == list(range(11, 60))
        assert any("no longer holds this position" in r.getMessage() and large.url in
                   r.getMessage() for r in caplog.records)
        # neither holds it: the consumer falls off, as with one relay
        same_windows(range(60, 260))
        cfg = ClientConfig(relay=f"{large.url},{small.url}", poll_timeout=0.2,
                           backoff_initial=0.01, backoff_max=0.02)
        with pytest.raises(ScnNotFoundError, match="bootstrap"):
            DatabusClient(cfg, Keep(), MemoryCheckpointStore(Checkpoint.after(
                large.buffer.min_scn - 30))).run()
