"""Dispatcher and DataEvent: callback order, results, lazy row decoding."""

from __future__ import annotations

from typing import Any

import pytest

from databus.client import Consumer, ConsumerResult, DataEvent
from databus.client.dispatcher import Dispatcher, SchemaViews
from databus.client.window import DecodedWindow
from databus.core import event as ev
from databus.core.errors import ConsumerCallbackError, ConsumerFatalError
from databus.core.schema import ColumnSpec, SchemaRegistry, TableSchema, table_schema
from tests.support.memrelay import (
    CUSTOMERS,
    ITEMS,
    customer,
    data_event,
    item,
)

REG = SchemaRegistry([CUSTOMERS, ITEMS])


def _window(scn: int, events: list[bytes]) -> DecodedWindow:
    return DecodedWindow(scn, [ev.decode(e) for e in events])


class Calls(Consumer):
    def __init__(self, results: dict[str, Any] | None = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.results = results or {}

    def _r(self, name: str) -> Any:
        r = self.results.get(name)
        if isinstance(r, Exception):
            raise r
        return r

    def on_start_data_event_sequence(self, scn: int) -> Any:
        self.calls.append(("start", scn))
        return self._r("start")

    def on_start_source(self, source_name: str, schema: TableSchema) -> Any:
        self.calls.append(("source", source_name))
        return self._r("source")

    def on_data_event(self, event: DataEvent) -> Any:
        self.calls.append(("event", event.key, event.total_order, event.collection_order))
        return self._r("event")

    def on_end_source(self, source_name: str, schema: TableSchema) -> Any:
        self.calls.append(("end_source", source_name))

    def on_end_data_event_sequence(self, scn: int) -> Any:
        self.calls.append(("end", scn))
        return self._r("end")


def test_runs_of_sources_in_commit_order() -> None:
    c = Calls()
    d = Dispatcher(c, SchemaViews(REG))
    out = d.dispatch(_window(7, [customer(7, 1), item(7, 1, 1), item(7, 1, 2), customer(7, 2)]))
    assert c.calls == [
        ("start", 7), ("source", "shop.customers"), ("event", 1, 1, 1),
        ("end_source", "shop.customers"), ("source", "shop.items"), ("event", b"[1,1]", 2, 1),
        ("event", b"[1,2]", 3, 2), ("end_source", "shop.items"), ("source", "shop.customers"),
        ("event", 2, 4, 2), ("end_source", "shop.customers"), ("end", 7)]
    assert out.events == 4 and not out.force_checkpoint
    c.calls.clear()
    d.dispatch(_window(8, []))  # an empty window still has its sequence callbacks
    assert c.calls == [("start", 8), ("end", 8)]


@pytest.mark.parametrize(("where", "result", "error"), [
    ("event", ConsumerResult.ERROR, ConsumerCallbackError),
    ("event", ValueError("bad row"), ConsumerCallbackError),
    ("start", ConsumerResult.ERROR_FATAL, ConsumerFatalError),
    ("end", ConsumerFatalError("stop now"), ConsumerFatalError),
    ("source", "yes", ConsumerFatalError),  # not a ConsumerResult: a programming error
])
def test_results_become_typed_errors(where: str, result: Any, error: type[Exception]) -> None:
    d = Dispatcher(Calls({where: result}), SchemaViews(REG))
    with pytest.raises(error):
        d.dispatch(_window(7, [customer(7, 1)]))


def test_checkpoint_result_forces_a_checkpoint() -> None:
    d = Dispatcher(Calls({"event": ConsumerResult.CHECKPOINT}), SchemaViews(REG))
    assert d.dispatch(_window(7, [customer(7, 1)])).force_checkpoint
    d = Dispatcher(Calls({"event": ConsumerResult.SKIP_CHECKPOINT}), SchemaViews(REG))
    assert not d.dispatch(_window(7, [customer(7, 1)])).force_checkpoint


def test_data_event_images_metadata_and_envelope() -> None:
    schema = TableSchema(src_id=3, name="db.t", version=1, avro=table_schema("db", "t", [
        ColumnSpec("id", "long", nullable=False), ColumnSpec("full name", "string")]),
        key_columns=("id",))
    reg = SchemaRegistry([schema])
    seen: list[DataEvent] = []

    class Keep(Consumer):
        def on_data_event(self, event: DataEvent) -> None:
            seen.append(event)

    Dispatcher(Keep(), SchemaViews(reg)).dispatch(_window(9, [
        data_event(schema, 9, ev.Op.INSERT, {"id": 1, "full_name": "A"}),
        data_event(schema, 9, ev.Op.UPDATE, {"id": 1, "full_name": "B"},
                   before={"id": 1, "full_name": "A"}),
        data_event(schema, 9, ev.Op.DELETE, {"id": 1, "full_name": "B"}),
    ]))
    ins, upd, dele = seen
    assert ins.after == {"id": 1, "full name": "A"} and ins.before is None
    assert upd.after == {"id": 1, "full name": "B"} and upd.before == {"id": 1, "full name": "A"}
    assert dele.after is None and dele.before == {"id": 1, "full name": "B"}
    assert upd.metadata["txid"] == "tx9" and "before" not in upd.metadata
    assert (upd.source, upd.op, upd.scn, upd.key, upd.schema) == ("db.t", ev.Op.UPDATE, 9, 1, schema)
    env = upd.envelope()
    assert env["op"] == "u" and env["before"] == {"id": 1, "full name": "A"}
    assert env["transaction"] == {"id": "tx9", "total_order": 2, "data_collection_order": 2}
    assert env["source"]["db"] == "db" and env["source"]["table"] == "t"
    assert "DataEvent(scn=9" in repr(upd)


def test_distinct_schemas_gives_the_first_event_of_each_schema_or_source() -> None:
    from databus.client.dispatcher import distinct_schemas
    from databus.client.wiredecode import scan

    no_schema = ev.encode(scn=5, src_id=2, key=9, payload=b"", op=ev.Op.TRUNCATE)
    events = scan(b"".join([customer(5, 1), customer(5, 2), item(5, 7, 1), no_schema,
                            customer(5, 3), no_schema, item(5, 7, 2)]))
    assert distinct_schemas(events) == [events[0], events[2], events[3]]
    # digests not shared between objects (events decoded one by one) give the same
    separate = [ev.decode(ev.encode(scn=e.scn, src_id=e.src_id, key=e.key, payload=e.payload,
                                    schema_id=bytes(e.schema_id), op=e.op)) for e in events]
    assert distinct_schemas(separate) == [separate[0], separate[2], separate[3]]
    assert distinct_schemas([]) == []


class Forwarding(Consumer):
    """Forwards every callback to ``inner``, the batch ones included (as a wrapper such
    as a dynamic group's fencing consumer does)."""

    def __init__(self, inner: Consumer) -> None:
        self.inner = inner

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("on_"):
            return getattr(object.__getattribute__(self, "inner"), name)
        return object.__getattribute__(self, name)

    def on_data_events(self, batch: Any) -> Any:  # an override: the client sends batches
        return self.inner.on_data_events(batch)


def test_a_wrapper_forwarding_batches_still_delivers_every_event_to_a_per_event_consumer(
        ) -> None:
    inner = Calls()
    d = Dispatcher(Forwarding(inner), SchemaViews(REG))
    assert d.batched
    d.dispatch(_window(7, [customer(7, 1), item(7, 1, 1), item(7, 1, 2)]))
    assert [c for c in inner.calls if c[0] == "event"] == [
        ("event", 1, 1, 1), ("event", b"[1,1]", 2, 1), ("event", b"[1,2]", 3, 2)]


@pytest.mark.parametrize(("result", "error"), [
    (ConsumerResult.ERROR, ConsumerCallbackError),
    (ValueError("bad row"), ConsumerCallbackError),
    (ConsumerResult.ERROR_FATAL, ConsumerFatalError),
    ("yes", ConsumerFatalError),
])
def test_per_event_results_through_a_forwarded_batch_keep_their_meaning(
        result: Any, error: type[Exception]) -> None:
    d = Dispatcher(Forwarding(Calls({"event": result})), SchemaViews(REG))
    with pytest.raises(error):
        d.dispatch(_window(7, [customer(7, 1)]))
    d = Dispatcher(Forwarding(Calls({"event": ConsumerResult.CHECKPOINT})), SchemaViews(REG))
    assert d.dispatch(_window(7, [customer(7, 1)])).force_checkpoint
