"""DatabusClient against a real HTTP server (MemoryRelay): order, replay, errors."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from databus.client import (
    ClientConfig,
    Consumer,
    ConsumerResult,
    DatabusClient,
    DataEvent,
    FileCheckpointStore,
    MemoryCheckpointStore,
)
from databus.core.checkpoint import Checkpoint
from databus.core.errors import (
    ConsumerFatalError,
    RetriesExhaustedError,
    ScnNotFoundError,
    UnknownSourceError,
)
from databus.core.event import Op
from databus.core.schema import ColumnSpec, TableSchema, table_schema
from tests.support.memrelay import (
    CUSTOMERS,
    MemoryRelay,
    customer,
    data_event,
    item,
)
from tests.support.wait import wait_until

_FAILED = (ConsumerResult.ERROR, ConsumerResult.ERROR_FATAL)


class Recorder(Consumer):
    """Records every callback; ``fail`` maps a callback name to how it should fail."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.completed: list[int] = []  # windows whose end-of-sequence succeeded
        self.checkpointed: list[int] = []  # windows whose on_checkpoint succeeded
        self.errors: list[BaseException] = []
        self.fail_at: dict[tuple[str, int], list[Any]] = {}  # (callback, scn) -> results

    def _outcome(self, name: str, scn: int) -> Any:
        queue = self.fail_at.get((name, scn))
        if queue:
            r = queue.pop(0)
            if isinstance(r, Exception):
                raise r
            return r
        return None

    def on_start_consumption(self) -> None:
        self.calls.append(("start_consumption",))

    def on_stop_consumption(self) -> None:
        self.calls.append(("stop_consumption",))

    def on_start_data_event_sequence(self, scn: int) -> Any:
        self.calls.append(("start", scn))
        return self._outcome("start", scn)

    def on_start_source(self, source_name: str, schema: TableSchema) -> None:
        self.calls.append(("source", source_name, schema.version))

    def on_data_event(self, event: DataEvent) -> Any:
        self.calls.append(("event", event.scn, event.source, event.key, event.total_order,
                           event.collection_order))
        return self._outcome("event", event.scn)

    def on_end_source(self, source_name: str, schema: TableSchema) -> None:
        self.calls.append(("end_source", source_name))

    def on_end_data_event_sequence(self, scn: int) -> Any:
        self.calls.append(("end", scn))
        r = self._outcome("end", scn)
        if r not in _FAILED:
            self.completed.append(scn)
        return r

    def on_checkpoint(self, scn: int) -> Any:
        self.calls.append(("checkpoint", scn))
        r = self._outcome("checkpoint", scn)
        if r not in _FAILED:
            self.checkpointed.append(scn)
        return r

    def on_rollback(self, scn: int) -> None:
        self.calls.append(("rollback", scn))

    def on_error(self, exc: BaseException) -> None:
        self.errors.append(exc)


def _config(relay: MemoryRelay, **kw: Any) -> ClientConfig:
    base: dict[str, Any] = {"relay": relay.url, "poll_timeout": 0.2, "fetch_size": 1024,
                            "backoff_initial": 0.01, "backoff_max": 0.05}
    base.update(kw)
    return ClientConfig(**base)


def _three_windows(relay: MemoryRelay) -> None:
    relay.add_window(10, [customer(10, 1), customer(10, 2), item(10, 7, 1), customer(10, 3)])
    relay.add_window(20, [customer(20, i) for i in range(100, 140)])  # ~4.5 kB: split
    relay.add_window(30, [item(30, 8, 1), item(30, 8, 2, op=Op.UPDATE)])


def test_callback_order_over_windows_sources_and_split_windows(memrelay: MemoryRelay) -> None:
    _three_windows(memrelay)
    rec = Recorder()
    store = MemoryCheckpointStore()
    client = DatabusClient(_config(memrelay), rec, store)
    client.run(max_windows=3)
    expected: list[tuple[Any, ...]] = [("start_consumption",), ("start", 10),
                                       ("source", "shop.customers", 1)]
    expected += [("event", 10, "shop.customers", 1, 1, 1), ("event", 10, "shop.customers", 2, 2, 2)]
    expected += [("end_source", "shop.customers"), ("source", "shop.items", 1),
                 ("event", 10, "shop.items", b"[7,1]", 3, 1), ("end_source", "shop.items"),
                 ("source", "shop.customers", 1), ("event", 10, "shop.customers", 3, 4, 3),
                 ("end_source", "shop.customers"), ("end", 10), ("checkpoint", 10),
                 ("start", 20), ("source", "shop.customers", 1)]
    expected += [("event", 20, "shop.customers", 100 + i, i + 1, i + 1) for i in range(40)]
    expected += [("end_source", "shop.customers"), ("end", 20), ("checkpoint", 20),
                 ("start", 30), ("source", "shop.items", 1),
                 ("event", 30, "shop.items", b"[8,1]", 1, 1),
                 ("event", 30, "shop.items", b"[8,2]", 2, 2),
                 ("end_source", "shop.items"), ("end", 30), ("checkpoint", 30),
                 ("stop_consumption",)]
    assert rec.calls == expected
    assert store.checkpoint is not None and store.checkpoint.window_scn == 30
    assert store.checkpoint.prev_scn == 20 and store.saves == 3
    # window 20 arrived in pieces, continued with windowOffset
    offsets = [Checkpoint.from_json(q["checkPoint"]).window_offset
               for q in memrelay.stream_requests if "checkPoint" in q]
    assert any(o > 0 for o in offsets)
    assert client.stats.windows == 3 and client.stats.events == 46


@pytest.mark.parametrize("how", ["raise", "error_result", "end_raise", "checkpoint_error"])
def test_failure_once_rolls_back_and_replays_the_same_window(
        memrelay: MemoryRelay, how: str) -> None:
    _three_windows(memrelay)
    rec = Recorder()
    key = {"raise": ("event", 20), "error_result": ("event", 20), "end_raise": ("end", 20),
           "checkpoint_error": ("checkpoint", 20)}[how]
    rec.fail_at[key] = [RuntimeError("boom") if "raise" in how else ConsumerResult.ERROR]
    store = MemoryCheckpointStore()
    client = DatabusClient(_config(memrelay), rec, store)
    client.run(max_windows=3)
    assert ("rollback", 10) in rec.calls
    assert rec.calls.count(("rollback", 10)) == 1
    # every window passes successfully exactly once, in order
    assert rec.checkpointed == [10, 20, 30]
    starts = [c[1] for c in rec.calls if c[0] == "start"]
    assert starts == [10, 20, 20, 30]  # replay of the same window only
    assert store.checkpoint is not None and store.checkpoint.window_scn == 30
    assert client.stats.rollbacks == 1 and not rec.errors


def test_replay_starts_from_the_persisted_checkpoint_when_batching(memrelay: MemoryRelay) -> None:
    _three_windows(memrelay)
    rec = Recorder()
    rec.fail_at[("event", 20)] = [RuntimeError("once")]
    store = MemoryCheckpointStore()
    DatabusClient(_config(memrelay, checkpoint_every_windows=2), rec, store).run(
        max_windows=4)  # successful passes, the replayed window 10 included
    assert ("rollback", -1) in rec.calls  # nothing persisted yet
    assert [c[1] for c in rec.calls if c[0] == "start"] == [10, 20, 10, 20, 30]
    assert [c[1] for c in rec.calls if c[0] == "checkpoint"] == [20, 30]
    assert store.checkpoint is not None and store.checkpoint.window_scn == 30


def test_error_fatal_stops_without_checkpointing_that_window(memrelay: MemoryRelay) -> None:
    _three_windows(memrelay)
    rec = Recorder()
    rec.fail_at[("event", 20)] = [ConsumerResult.ERROR_FATAL]
    store = MemoryCheckpointStore()
    with pytest.raises(ConsumerFatalError, match="ERROR_FATAL"):
        DatabusClient(_config(memrelay), rec, store).run()
    assert store.checkpoint is not None and store.checkpoint.window_scn == 10
    assert len(rec.errors) == 1 and isinstance(rec.errors[0], ConsumerFatalError)
    assert rec.calls[-1] == ("stop_consumption",)
    assert ("rollback", 10) not in rec.calls


def test_retries_exhausted(memrelay: MemoryRelay) -> None:
    _three_windows(memrelay)
    rec = Recorder()
    rec.fail_at[("event", 20)] = [RuntimeError(f"fail {i}") for i in range(10)]
    store = MemoryCheckpointStore()
    with pytest.raises(RetriesExhaustedError, match=r"window 20 failed 3 times.*fail 2"):
        DatabusClient(_config(memrelay, max_retries=2), rec, store).run()
    assert rec.calls.count(("rollback", 10)) == 3
    assert [type(e) for e in rec.errors] == [RetriesExhaustedError]
    assert store.checkpoint is not None and store.checkpoint.window_scn == 10


def test_scn_not_found_is_a_clear_error(memrelay: MemoryRelay, tmp_path: Path) -> None:
    _three_windows(memrelay)
    memrelay.trim(20)
    path = tmp_path / "c.ckpt"
    FileCheckpointStore(path).save(Checkpoint.after(10))
    rec = Recorder()
    with pytest.raises(ScnNotFoundError) as info:
        DatabusClient(_config(memrelay, checkpoint_path=path), rec).run()
    msg = str(info.value)
    assert "windowScn=10" in msg and "bootstrap" in msg and memrelay.url in msg
    assert rec.errors == [info.value]
    assert FileCheckpointStore(path).load() == Checkpoint.after(10).model_copy(
        update={"ts_nsecs": FileCheckpointStore(path).load().ts_nsecs})  # type: ignore[union-attr]


def test_relay_errors_are_retried(memrelay: MemoryRelay) -> None:
    _three_windows(memrelay)
    memrelay.fail_next = 3
    rec = Recorder()
    client = DatabusClient(_config(memrelay), rec, MemoryCheckpointStore())
    client.run(max_windows=3)
    assert rec.completed == [10, 20, 30]
    assert client.stats.relay_errors == 3


def test_relay_down_with_a_bound_gives_up(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nobody listens there
    cfg = ClientConfig(relay=f"http://127.0.0.1:{port}", relay_max_retries=2,
                       backoff_initial=0.01, backoff_max=0.02)
    rec = Recorder()
    with pytest.raises(RetriesExhaustedError, match="listing sources failed 3 times"):
        DatabusClient(cfg, rec, MemoryCheckpointStore()).run()
    assert len(rec.errors) == 1


def test_restart_resumes_after_the_file_checkpoint(memrelay: MemoryRelay, tmp_path: Path) -> None:
    _three_windows(memrelay)
    path = tmp_path / "ckpt" / "consumer.json"
    first = Recorder()
    DatabusClient(_config(memrelay, checkpoint_path=path), first).run(max_windows=2)
    assert first.completed == [10, 20]
    second = Recorder()
    DatabusClient(_config(memrelay, checkpoint_path=path), second).run(max_windows=1)
    assert second.completed == [30]
    cp = FileCheckpointStore(path).load()
    assert cp is not None and cp.window_scn == 30 and cp.prev_scn == 20


def test_skip_checkpoint_and_forced_checkpoint(memrelay: MemoryRelay) -> None:
    _three_windows(memrelay)
    rec = Recorder()
    rec.fail_at[("checkpoint", 10)] = [ConsumerResult.SKIP_CHECKPOINT]
    store = MemoryCheckpointStore()
    DatabusClient(_config(memrelay), rec, store).run(max_windows=3)
    assert store.saves == 2 and store.checkpoint is not None

    rec2 = Recorder()
    rec2.fail_at[("end", 20)] = [ConsumerResult.CHECKPOINT]
    store2 = MemoryCheckpointStore()
    saved: list[int] = []

    class Spy(MemoryCheckpointStore):
        def save(self, checkpoint: Checkpoint) -> None:
            saved.append(checkpoint.window_scn)
            super().save(checkpoint)

    DatabusClient(_config(memrelay, checkpoint_every_windows=100), rec2, Spy()).run(
        max_windows=3)
    assert saved == [20, 30]  # forced at 20, final at exit
    assert store2.checkpoint is None


def test_schema_change_fetches_register_again(memrelay: MemoryRelay) -> None:
    memrelay.add_window(10, [customer(10, 1)])
    v2 = TableSchema(src_id=1, name="shop.customers", version=2, avro=table_schema(
        "shop", "customers", [ColumnSpec("id", "long", nullable=False), ColumnSpec("name", "string"),
                              ColumnSpec("balance", "double"), ColumnSpec("full name", "string")]),
        key_columns=("id",))
    seen: list[dict[str, Any] | None] = []

    class Reader(Recorder):
        def on_data_event(self, event: DataEvent) -> Any:
            seen.append(event.after)
            return super().on_data_event(event)

    rec = Reader()
    stop = threading.Event()
    client = DatabusClient(_config(memrelay), rec, MemoryCheckpointStore())
    t = threading.Thread(target=client.run, kwargs={"stop": stop, "max_windows": 2})
    t.start()
    try:
        wait_until(lambda: rec.completed == [10], 10, "window 10 to complete",
                   interval=0.01)
        memrelay.registry.add(v2)  # DDL at the source: a new version appears
        row = {"id": 5, "name": "x", "balance": None, "full_name": "Ada L"}
        memrelay.add_window(20, [data_event(v2, 20, Op.INSERT, row)])
        t.join(10)
    finally:
        stop.set()
        t.join(10)
    assert rec.completed == [10, 20]
    assert ("source", "shop.customers", 2) in rec.calls
    assert seen[-1] == {"id": 5, "name": "x", "balance": None, "full name": "Ada L"}


def test_stop_event_ends_a_long_poll(memrelay: MemoryRelay) -> None:
    rec = Recorder()
    stop = threading.Event()
    client = DatabusClient(_config(memrelay, poll_timeout=0.5), rec, MemoryCheckpointStore())
    t = threading.Thread(target=client.run, kwargs={"stop": stop})
    t.start()
    wait_until(lambda: memrelay.stream_requests, 10, "the client's first long poll")
    t0 = time.monotonic()
    stop.set()
    t.join(10)
    assert not t.is_alive() and time.monotonic() - t0 < 2.0
    assert rec.calls == [("start_consumption",), ("stop_consumption",)]


def test_from_start_false_skips_what_is_already_there(memrelay: MemoryRelay) -> None:
    _three_windows(memrelay)
    rec = Recorder()
    rec.fail_at[("event", 50)] = [RuntimeError("replay me")]
    stop = threading.Event()
    client = DatabusClient(_config(memrelay, from_start=False), rec, MemoryCheckpointStore())
    t = threading.Thread(target=client.run, kwargs={"stop": stop, "max_windows": 2})
    t.start()
    # a few idle polls: the client has taken the relay's newest SCN as its start
    wait_until(lambda: len(memrelay.stream_requests) >= 3, 10, "three idle polls")
    memrelay.add_window(40, [customer(40, 9)])
    memrelay.add_window(50, [customer(50, 9)])
    t.join(10)
    stop.set()
    t.join(10)
    assert rec.completed == [40, 50]  # 50 failed once and was replayed, not skipped
    assert ("rollback", 40) in rec.calls


def test_from_start_false_failure_in_the_first_window_replays_it(memrelay: MemoryRelay) -> None:
    rec = Recorder()
    memrelay.add_window(60, [customer(60, 1)])

    stop = threading.Event()
    client = DatabusClient(_config(memrelay, from_start=False), rec, MemoryCheckpointStore())
    # the first answer already carries windows: the relay's newest is 60 when the
    # request arrives, so "latest" begins after it; window 70 comes during the poll
    t = threading.Thread(target=client.run, kwargs={"stop": stop, "max_windows": 1})
    t.start()
    wait_until(lambda: memrelay.stream_requests, 10, "the first /stream request",
               interval=0.002)
    memrelay.add_window(70, [customer(70, 2)])
    rec.fail_at[("event", 70)] = [RuntimeError("replay me")]
    t.join(10)
    stop.set()
    t.join(10)
    assert rec.completed == [70] and rec.calls.count(("start", 70)) == 2


def test_sources_by_name_and_unknown_source(memrelay: MemoryRelay) -> None:
    _three_windows(memrelay)
    rec = Recorder()
    DatabusClient(_config(memrelay, sources=["shop.items"]), rec,
                  MemoryCheckpointStore()).run(max_windows=3)
    assert {c[2] for c in rec.calls if c[0] == "event"} == {"shop.items"}
    assert rec.completed == [10, 20, 30]  # window 20 arrives empty (EOP only)
    assert all(q.get("sources") == "2" for q in memrelay.stream_requests)
    with pytest.raises(UnknownSourceError, match=r"shop\.nope"):
        DatabusClient(_config(memrelay, sources=["shop.nope"]), Recorder(),
                      MemoryCheckpointStore()).run()


def test_server_filter_is_sent(memrelay: MemoryRelay) -> None:
    memrelay.add_window(10, [customer(10, i) for i in range(10)])
    rec = Recorder()
    filt = {"1": {"partitionType": "MOD", "filters": [{"numBuckets": 2,
                                                        "bktRange": {"start": 0, "end": 1}}]}}
    DatabusClient(_config(memrelay, filter=filt), rec, MemoryCheckpointStore()).run(max_windows=1)
    assert [c[3] for c in rec.calls if c[0] == "event"] == [0, 2, 4, 6, 8]
    assert CUSTOMERS.src_id == 1


def test_consumer_group_of_four_through_the_client(memrelay: MemoryRelay) -> None:
    from databus.client import ConsumerGroup

    for scn in range(1, 31):
        memrelay.add_window(scn, [customer(scn, k, name=f"{scn}") for k in range(12)]
                            + [item(scn, k % 3, k, qty=scn) for k in range(6)])
    lock = threading.Lock()
    seen: dict[Any, list[int]] = {}
    handled = {"n": 0}
    failed = {"done": False}

    class Member(Consumer):
        def on_data_event(self, event: DataEvent) -> None:
            if event.scn == 17 and not failed["done"]:
                failed["done"] = True
                raise RuntimeError("one worker fails once")
            with lock:
                seen.setdefault(event.key, []).append(event.scn)
                handled["n"] += 1

        def on_checkpoint(self, scn: int) -> None:
            with lock:  # all workers finished window scn before its checkpoint
                assert all(v[-1] >= scn for v in seen.values())

    store = MemoryCheckpointStore()
    group = ConsumerGroup([Member() for _ in range(4)])
    client = DatabusClient(_config(memrelay, fetch_size=8192), group, store)
    client.run(max_windows=30)
    assert client.stats.rollbacks == 1
    assert store.checkpoint is not None and store.checkpoint.window_scn == 30
    # per key: every window in order; window 17 possibly partly twice (replayed whole)
    for _key, scns in seen.items():
        assert scns == sorted(scns)
        assert sorted(set(scns)) == list(range(1, 31))
    assert group._workers is None  # threads ended with on_stop_consumption


def test_client_stop_method(memrelay: MemoryRelay) -> None:
    from databus.client import ReplicateSink

    rec = Recorder()
    client = DatabusClient(_config(memrelay, poll_timeout=0.5), rec, MemoryCheckpointStore())
    t = threading.Thread(target=client.run)
    t.start()
    wait_until(lambda: memrelay.stream_requests, 10, "the client's first long poll")
    client.stop()
    t.join(10)
    assert not t.is_alive()
    assert rec.calls[-1] == ("stop_consumption",)
    with ReplicateSink("sqlite://") as sink:
        assert sink.checkpoint_store is sink


class _Events(Consumer):
    """Only ``on_data_event`` and ``on_rollback``: checkpoints are nobody's business but
    the store's, so the client persists them once per answer."""

    def __init__(self, fail_at: dict[int, int] | None = None) -> None:
        self.seen: list[int] = []
        self.rollbacks: list[int] = []
        self.fail_at = fail_at or {}  # scn -> failures left

    def on_data_event(self, event: DataEvent) -> Any:
        if self.fail_at.get(event.scn):
            self.fail_at[event.scn] -= 1
            raise RuntimeError(f"fail at {event.scn}")
        self.seen.append(event.scn)
        return None

    def on_rollback(self, scn: int) -> None:
        self.rollbacks.append(scn)


class _Saves(MemoryCheckpointStore):
    def __init__(self) -> None:
        super().__init__()
        self.saved: list[int] = []

    def save(self, checkpoint: Checkpoint) -> None:
        self.saved.append(checkpoint.window_scn)
        super().save(checkpoint)


def _ten_windows(relay: MemoryRelay) -> None:
    for k in range(1, 11):
        relay.add_window(10 * k, [customer(10 * k, k)])


def test_checkpoints_of_one_answer_are_persisted_once_when_nobody_sees_them(
        memrelay: MemoryRelay) -> None:
    _ten_windows(memrelay)
    consumer, store = _Events(), _Saves()
    client = DatabusClient(_config(memrelay, fetch_size=1 << 20), consumer, store)
    client.run(max_windows=10)
    assert consumer.seen == [10 * k for k in range(1, 11)]
    assert store.saved == [100]  # one answer held all ten windows: one save, after the last
    assert store.checkpoint is not None
    assert (store.checkpoint.window_scn, store.checkpoint.prev_scn) == (100, 90)
    assert store.checkpoint.window_offset == -1


def test_a_failure_within_an_answer_persists_the_windows_before_it_and_replays_it_only(
        memrelay: MemoryRelay) -> None:
    _ten_windows(memrelay)
    consumer, store = _Events(fail_at={50: 1}), _Saves()
    client = DatabusClient(_config(memrelay, fetch_size=1 << 20), consumer, store)
    client.run(max_windows=10)
    # windows 10-40 were persisted before the rollback; window 50 alone was replayed
    assert consumer.rollbacks == [40]
    assert store.saved[0] == 40 and store.saved[-1] == 100
    assert consumer.seen == [10 * k for k in range(1, 11)]
    assert client.stats.rollbacks == 1


def test_a_consumer_that_sees_checkpoints_gets_one_per_window(memrelay: MemoryRelay) -> None:
    _ten_windows(memrelay)
    seen: list[int] = []
    consumer = _Events()
    consumer.on_checkpoint = lambda scn: seen.append(scn)  # type: ignore[method-assign]
    store = _Saves()
    DatabusClient(_config(memrelay, fetch_size=1 << 20), consumer, store).run(max_windows=10)
    assert seen == [10 * k for k in range(1, 11)]
    assert store.saved == seen


_LINGER = 0.4  # long enough to be told from a request sent at once


class _Chain(Consumer):
    """Adds window ``then`` to the relay when it sees window ``at`` (times recorded)."""

    def __init__(self, relay: MemoryRelay, at: int, then: int) -> None:
        self.relay, self.at, self.then = relay, at, then
        self.times: dict[int, float] = {}

    def on_data_event(self, event: DataEvent) -> None:
        self.times[event.scn] = time.monotonic()
        if event.scn == self.at:
            self.relay.add_window(self.then, [customer(self.then, self.then)])


def test_after_an_answer_of_many_windows_the_next_request_waits(memrelay: MemoryRelay) -> None:
    _ten_windows(memrelay)  # one answer of ten windows
    consumer = _Chain(memrelay, 100, 110)
    DatabusClient(_config(memrelay, fetch_size=1 << 20, linger=_LINGER), consumer,
                  MemoryCheckpointStore()).run(max_windows=11)
    assert consumer.times[110] - consumer.times[100] >= 0.35


def test_linger_zero_never_waits(memrelay: MemoryRelay) -> None:
    _ten_windows(memrelay)
    consumer = _Chain(memrelay, 100, 110)
    DatabusClient(_config(memrelay, fetch_size=1 << 20, linger=0), consumer,
                  MemoryCheckpointStore()).run(max_windows=11)
    assert consumer.times[110] - consumer.times[100] < 0.3


def test_after_an_answer_of_one_window_the_next_request_goes_at_once(
        memrelay: MemoryRelay) -> None:
    memrelay.add_window(10, [customer(10, 1)])
    consumer = _Chain(memrelay, 10, 20)
    DatabusClient(_config(memrelay, fetch_size=1 << 20, linger=_LINGER), consumer,
                  MemoryCheckpointStore()).run(max_windows=2)
    assert consumer.times[20] - consumer.times[10] < 0.3
