"""Backoff, ClientConfig validation, Avro -> SQL column types."""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Any

import pytest
import sqlalchemy as sa

from databus.client import ClientConfig
from databus.client.retry import Backoff
from databus.client.sinks.sqltypes import column_type
from databus.core.errors import ConfigError, InvalidFilterError


def test_backoff_grows_with_jitter_and_caps() -> None:
    b = Backoff(0.1, 1.0, seed=1)
    delays = [b.next_delay() for _ in range(8)]
    for n, d in enumerate(delays):
        nominal = min(1.0, 0.1 * 2**n)
        assert nominal / 2 <= d <= nominal
    b.reset()
    assert b.next_delay() <= 0.1
    with pytest.raises(ValueError):
        Backoff(0, 1)


def test_backoff_wait_is_interrupted_by_stop() -> None:
    stop = threading.Event()
    b = Backoff(30, 30)
    threading.Timer(0.05, stop.set).start()
    t0 = time.monotonic()
    assert b.wait(stop) is True
    assert time.monotonic() - t0 < 5


def test_config_validation() -> None:
    cfg = ClientConfig(relay="http://h:1/", sources=["db.t", 3])
    assert cfg.relay.url == "http://h:1" and cfg.sources == ["db.t", 3]
    assert cfg.from_start and cfg.checkpoint_every_windows == 1
    # config problems are ConfigError (the one exception tree), naming the field
    with pytest.raises(ConfigError, match="relay"):
        ClientConfig(relay="h:1")
    with pytest.raises(ConfigError, match="fetch_size"):
        ClientConfig(relay="http://h", fetch_size=10)
    with pytest.raises(ConfigError):
        ClientConfig(relay="http://h", backoff_initial=5, backoff_max=1)
    with pytest.raises(InvalidFilterError):
        ClientConfig(relay="http://h", filter='{"1": {"partitionType": "X"}}')
    f = {"1": {"partitionType": "RANGE", "filters": [{"keyRange": {"start": 0, "end": 9}}]}}
    assert "RANGE" in (ClientConfig(relay="http://h", filter=f).filter or "")


@pytest.mark.parametrize(("avro", "dialect", "sql", "nullable"), [
    ("long", "sqlite", "BIGINT", False),
    (["null", "long"], "postgresql", "BIGINT", True),
    (["null", "double"], "postgresql", "DOUBLE PRECISION", True),
    ("string", "mariadb", "TEXT", False),
    ({"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}, "postgresql",
     "NUMERIC(10, 2)", False),
    ({"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}, "sqlite",
     "TEXT", False),
    ({"type": "int", "logicalType": "date"}, "postgresql", "DATE", False),
    ({"type": "long", "logicalType": "timestamp-micros"}, "postgresql",
     "TIMESTAMP WITH TIME ZONE", False),
    ({"type": "long", "logicalType": "timestamp-micros"}, "mariadb", "DATETIME(6)", False),
    ({"type": "long", "logicalType": "time-micros"}, "mariadb", "TIME(6)", False),
    ("string", "sqlite", "TEXT", False),
    ("double", "sqlite", "DOUBLE", False),
    ({"type": "string", "logicalType": "uuid"}, "postgresql", "UUID", False),
    (["null", "long", "string"], "postgresql", "TEXT", True),
    (["null", "long", "string"], "sqlite", "INTEGER", True),
    ({"type": "array", "items": "long"}, "sqlite", "TEXT", False),
    ("bytes", "postgresql", "BYTEA", False),
])
def test_avro_to_sql_types(avro: object, dialect: str, sql: str, nullable: bool) -> None:
    from sqlalchemy.dialects import mysql, postgresql, sqlite

    dialects: dict[str, Any] = {"sqlite": sqlite.dialect(), "postgresql": postgresql.dialect(),  # type: ignore[no-untyped-call]
                "mariadb": mysql.dialect()}
    ct = column_type(avro, dialect=dialect)
    assert ct.type.compile(dialect=dialects[dialect]) == sql
    assert ct.nullable is nullable


def test_key_columns_and_converters() -> None:
    assert isinstance(column_type("string", key=True, dialect="mariadb").type, sa.String)
    assert column_type("string", key=True, dialect="mariadb").type.length == 255  # type: ignore[attr-defined]
    assert column_type(["null", "string"], key=True, dialect="sqlite").nullable is False
    conv = column_type(["null", "long", "string"], dialect="mariadb").convert
    assert conv is not None and conv(5) == "5" and conv("x") == "x" and conv(None) is None
    to_json = column_type({"type": "map", "values": "long"}).convert
    assert to_json is not None and to_json({"a": 1}) == '{"a":1}'
    ts = column_type({"type": "long", "logicalType": "timestamp-micros"}, dialect="sqlite")
    aware = dt.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert ts.convert is not None and ts.convert(aware) == dt.datetime(2024, 1, 2, 1, 4, 5, 6)
    assert column_type({"type": "string", "logicalType": "uuid"}).convert is None


def test_sqlite_union_columns_keep_the_declared_type_and_raw_values() -> None:
    from sqlalchemy.dialects import sqlite

    union = ["null", "long", "double", "string", "bytes"]
    ct = column_type(union, dialect="sqlite", sql_type="INTEGER")
    assert ct.type.compile(dialect=sqlite.dialect()) == "INTEGER"
    assert ct.convert is None and ct.nullable
    assert column_type(union[1:], dialect="sqlite").type.compile(  # first branch's affinity
        dialect=sqlite.dialect()) == "INTEGER"
    odd = column_type(union, dialect="sqlite", sql_type="x); DROP TABLE t; --")
    assert odd.type.compile(dialect=sqlite.dialect()) == "INTEGER"
    assert column_type(union, dialect="postgresql", sql_type="INTEGER").convert is not None
