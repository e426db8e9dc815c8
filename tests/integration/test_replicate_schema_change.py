"""ReplicateSink follows the source's table versions: added and dropped columns.

Runs against SQLite, PostgreSQL and MariaDB (fresh database per test, see
the suite's ``sql_url`` fixture).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from databus.client import ClientConfig, DatabusClient, MemoryCheckpointStore, ReplicateSink
from databus.core import event as ev
from databus.core.schema import ColumnSpec, TableSchema, table_schema
from tests.support.memrelay import MemoryRelay, data_event
from tests.support.sql import sql_engine


def _version(version: int, *columns: ColumnSpec) -> TableSchema:
    specs = [ColumnSpec("id", "long", nullable=False), *columns]
    return TableSchema(src_id=7, name="app.acct", version=version,
                       avro=table_schema("app", "acct", specs), key_columns=("id",))


V1 = _version(1, ColumnSpec("name", "string"), ColumnSpec("doc", "string"))
V2 = _version(2, ColumnSpec("name", "string"))  # ALTER TABLE acct DROP COLUMN doc
V3 = _version(3, ColumnSpec("name", "string"), ColumnSpec("tier", "long"))  # ADD COLUMN tier


def _state(url: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    with sql_engine(url) as engine, engine.connect() as conn:
        cols = sorted(c["name"] for c in sa.inspect(conn).get_columns("acct"))
        res = conn.execute(sa.text(f"SELECT {', '.join(cols)} FROM acct ORDER BY id"))
        return cols, [tuple(r) for r in res]


def _run(relay: MemoryRelay, sink: ReplicateSink, windows: int, store: Any = None) -> None:
    cfg = ClientConfig(relay=relay.url, poll_timeout=0.1, backoff_initial=0.01,
                       backoff_max=0.02)
    DatabusClient(cfg, sink, store or sink.checkpoint_store).run(max_windows=windows)


def test_dropped_and_added_columns_follow_the_source(sql_url: str) -> None:
    target = sql_url
    with MemoryRelay(schemas=[V1, V2, V3], sources=[(7, "app.acct")]) as relay:
        relay.add_window(1, [data_event(V1, 1, ev.Op.INSERT, {"id": 1, "name": "a", "doc": "{}"}),
                             data_event(V1, 1, ev.Op.INSERT, {"id": 2, "name": "b", "doc": "[]"})])
        relay.add_window(2, [data_event(V2, 2, ev.Op.UPDATE, {"id": 1, "name": "a2"},
                                        before={"id": 1, "name": "a"}),
                             data_event(V2, 2, ev.Op.INSERT, {"id": 3, "name": "c"})])
        with ReplicateSink(target) as sink:
            _run(relay, sink, 2)
        # the source's table no longer has doc: neither has the replica
        assert _state(target) == (["id", "name"], [(1, "a2"), (2, "b"), (3, "c")])

        # windows 1-2 delivered again (a second client without the target's
        # checkpoint): already applied, so the old shape must not come back
        with ReplicateSink(target) as sink:
            _run(relay, sink, 2, MemoryCheckpointStore())
            assert sink.windows_skipped == 2 and sink.windows_applied == 0
        assert _state(target)[0] == ["id", "name"]

        relay.add_window(3, [data_event(V3, 3, ev.Op.UPDATE, {"id": 2, "name": "b", "tier": 5},
                                        before={"id": 2, "name": "b", "tier": None})])
        with ReplicateSink(target) as sink:
            _run(relay, sink, 1)
        assert _state(target) == (["id", "name", "tier"],
                                  [(1, "a2", None), (2, "b", 5), (3, "c", None)])


def test_drop_columns_false_keeps_them(sql_url: str) -> None:
    target = sql_url
    with MemoryRelay(schemas=[V1, V2], sources=[(7, "app.acct")]) as relay:
        relay.add_window(1, [data_event(V1, 1, ev.Op.INSERT, {"id": 1, "name": "a", "doc": "{}"})])
        relay.add_window(2, [data_event(V2, 2, ev.Op.INSERT, {"id": 2, "name": "b"})])
        with ReplicateSink(target, drop_columns=False) as sink:
            _run(relay, sink, 2)
        assert _state(target) == (["doc", "id", "name"], [("{}", 1, "a"), (None, 2, "b")])
