"""on_data_events: one DataBatch per run of a source, rows or columns, results and
errors counted for the whole run (through the Dispatcher, no relay)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from databus.client import (
    ClientConfig,
    Consumer,
    ConsumerResult,
    DataEvent,
    MemoryCheckpointStore,
)
from databus.client import wiredecode as wd
from databus.client.bootstrap import BootstrapRunner, ScannedRows, parse_batch
from databus.client.consumer import DataBatch
from databus.client.dispatcher import Dispatcher, SchemaViews
from databus.client.stats import ClientStats
from databus.client.window import DecodedWindow
from databus.core import event as ev
from databus.core.checkpoint import Checkpoint, ConsumptionMode
from databus.core.errors import ConsumerCallbackError, ConsumerFatalError, CorruptEventError
from databus.core.schema import SchemaRegistry, TableSchema
from tests.support.memrelay import CUSTOMERS, ITEMS, customer, item

REG = SchemaRegistry([CUSTOMERS, ITEMS])
EVENTS = [customer(5, 1, "a"), customer(5, 2, "b", op=ev.Op.UPDATE), item(5, 7, 1),
          item(5, 7, 2, op=ev.Op.DELETE), customer(5, 3, "c", op=ev.Op.DELETE),
          customer(5, 4, "d", balance=None)]


def _window(first_offset: int = 0) -> DecodedWindow:
    return DecodedWindow(5, [ev.decode(e) for e in EVENTS], first_offset=first_offset)


class PerEvent(Consumer):
    def __init__(self) -> None:
        self.events: list[DataEvent] = []

    def on_data_event(self, event: DataEvent) -> None:
        self.events.append(event)


class Batches(Consumer):
    def __init__(self, result: Any = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.batches: list[DataBatch] = []
        self.result = result

    def on_start_source(self, source_name: str, schema: TableSchema) -> None:
        self.calls.append(("source", source_name))

    def on_data_event(self, event: DataEvent) -> None:
        raise AssertionError("a batch consumer gets no per-event calls")

    def on_data_events(self, batch: DataBatch) -> Any:
        self.calls.append(("batch", batch.source, len(batch)))
        self.batches.append(batch)
        if isinstance(self.result, Exception):
            raise self.result
        return self.result

    def on_end_source(self, source_name: str, schema: TableSchema) -> None:
        self.calls.append(("end_source", source_name))


def test_a_batch_per_run_of_a_source_between_its_source_callbacks() -> None:
    c = Batches()
    out = Dispatcher(c, SchemaViews(REG)).dispatch(_window())
    assert out.events == 6 and not out.force_checkpoint
    assert c.calls == [("source", "shop.customers"), ("batch", "shop.customers", 2),
                       ("end_source", "shop.customers"), ("source", "shop.items"),
                       ("batch", "shop.items", 2), ("end_source", "shop.items"),
                       ("source", "shop.customers"), ("batch", "shop.customers", 2),
                       ("end_source", "shop.customers")]


@pytest.mark.parametrize("first_offset", [0, 3])
def test_rows_columns_and_data_events_equal_the_per_event_view(first_offset: int) -> None:
    per = PerEvent()
    Dispatcher(per, SchemaViews(REG)).dispatch(_window(first_offset))
    c = Batches()
    Dispatcher(c, SchemaViews(REG)).dispatch(_window(first_offset))
    it = iter(per.events)
    for batch in c.batches:
        expected = [next(it) for _ in range(len(batch))]
        # the row each event carries: after image, deleted row for a delete
        images = [e.before if e.op is ev.Op.DELETE else e.after for e in expected]
        assert batch.rows == images
        assert batch.columns == {name: [r[name] if r else None for r in images]
                                 for name in batch.schema.column_names}
        assert list(batch.columns) == batch.schema.column_names
        assert batch.ops == [e.op for e in expected] and batch.keys == [e.key for e in expected]
        assert batch.scn == 5 and [e.key for e in batch.events] == batch.keys
        views = batch.data_events()
        assert [(d.key, d.total_order, d.collection_order, d.before, d.after, d.metadata)
                for d in views] == [(e.key, e.total_order, e.collection_order, e.before,
                                     e.after, e.metadata) for e in expected]


def test_a_batch_decodes_only_what_the_consumer_reads() -> None:
    c = Batches()
    Dispatcher(c, SchemaViews(REG)).dispatch(_window())
    batch = c.batches[0]
    assert batch._rows is None and batch._columns is None
    assert batch.columns["name"] == ["a", "b"]
    assert batch._rows is None  # columns without a dict per row
    assert batch.rows[1] == {"id": 2, "name": "b", "balance": 1.5}


@pytest.mark.parametrize(("result", "error"), [
    (RuntimeError("boom"), ConsumerCallbackError), (ConsumerResult.ERROR, ConsumerCallbackError),
    (ConsumerResult.ERROR_FATAL, ConsumerFatalError), ("yes", ConsumerFatalError),
])
def test_a_failing_batch_fails_the_window(result: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="on_data_events"):
        Dispatcher(Batches(result), SchemaViews(REG)).dispatch(_window())


def test_checkpoint_from_a_batch_forces_the_checkpoint() -> None:
    out = Dispatcher(Batches(ConsumerResult.CHECKPOINT), SchemaViews(REG)).dispatch(_window())
    assert out.force_checkpoint


# -- bootstrap snapshot answers: batches over the scanned body, Events built lazily -----

def _snapshot_answer() -> tuple[bytes, Checkpoint]:
    cp = Checkpoint(consumption_mode=ConsumptionMode.BOOTSTRAP_SNAPSHOT,
                    bootstrap_start_scn=40, snapshot_source="shop.customers")
    nxt = cp.model_copy(update={"snapshot_offset": 9})
    rows = [customer(40, 1, "a"), customer(40, 2, "b", balance=None), customer(40, 3, "c"),
            item(40, 7, 1), item(40, 7, 2), customer(40, 4, "é")]
    return b"".join([*rows, ev.encode_control(40, ev.SRC_CHECKPOINT,
                                              nxt.to_json().encode())]), cp


class BootBatches(Consumer):
    def __init__(self, read_events_first: bool) -> None:
        self.first = read_events_first
        self.seen: list[tuple[Any, ...]] = []
        self.built_before_rows: list[bool] = []

    def on_bootstrap_events(self, batch: DataBatch) -> None:
        if self.first:
            batch.events  # noqa: B018 - the Events first, then the rows
        self.built_before_rows.append(batch._events is not None)
        cols, rows, ops = batch.columns, batch.rows, batch.ops
        self.built_before_rows[-1] |= batch._events is not None
        views = batch.data_events()
        self.seen.append((batch.scn, batch.source, len(batch), cols, rows, ops, batch.keys,
                          batch.events, [(d.total_order, d.collection_order, d.after,
                                          d.metadata) for d in views], repr(batch)))


@pytest.mark.parametrize("native", [True, False], ids=["compiled", "python"])
@pytest.mark.parametrize("read_events_first", [False, True])
def test_lazy_snapshot_batches_equal_the_eager_view(monkeypatch: pytest.MonkeyPatch,
                                                    native: bool,
                                                    read_events_first: bool) -> None:
    if not native:
        monkeypatch.setattr(wd, "_native", None)
    body, cp = _snapshot_answer()
    eager, lazy = parse_batch(body, cp), parse_batch(body, cp, lazy=True)
    assert eager.checkpoint == lazy.checkpoint and eager.checkpoint is not None
    assert eager.checkpoint.snapshot_offset == 9
    [(scn, seq)] = lazy.sequences
    assert isinstance(seq, ScannedRows) and scn == 40 and len(seq) == 6
    assert seq.events() == eager.sequences[0][1]
    got = []
    for batch in (eager, lazy):
        consumer = BootBatches(read_events_first)
        _runner(consumer)._deliver_runs(*batch.sequences[0])
        got.append(consumer)
    assert got[0].seen == got[1].seen
    assert [s[1:3] for s in got[1].seen] == [("shop.customers", 3), ("shop.items", 2),
                                             ("shop.customers", 1)]
    # reading rows, columns and ops builds no Event
    assert got[1].built_before_rows == [read_events_first] * 3


def test_a_damaged_snapshot_answer_raises_on_the_lazy_path_too() -> None:
    body, cp = _snapshot_answer()
    damaged = bytearray(body)
    damaged[len(body) // 2] ^= 0x40
    for lazy in (False, True):
        with pytest.raises(CorruptEventError):
            parse_batch(bytes(damaged), cp, lazy=lazy)


def test_a_snapshot_answer_with_control_events_inside_is_parsed_alike() -> None:
    body, cp = _snapshot_answer()
    odd = customer(40, 1) + ev.encode_control(40, -7, b"{}") + body
    eager, lazy = parse_batch(odd, cp), parse_batch(odd, cp, lazy=True)
    assert eager.sequences == lazy.sequences and eager.checkpoint == lazy.checkpoint


def _runner(consumer: Consumer) -> BootstrapRunner:
    cfg = ClientConfig(relay="http://127.0.0.1:9", bootstrap_url="http://127.0.0.1:9")
    runner = BootstrapRunner(cfg, consumer, MemoryCheckpointStore(), ClientStats(), None,
                             threading.Event(), on_saved=lambda cp: None)
    runner.conn.close()
    runner.prefetch_conn.close()
    runner.pool.shutdown()
    runner.views = SchemaViews(REG)
    return runner
