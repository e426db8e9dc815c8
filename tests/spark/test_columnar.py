"""The JVM reader's columnar batches (``columnarBatchRows`` > 0) against its row reader
(``columnarBatchRows=0``, the default): the same rows for every column type, the same
offsets, and a checkpoint that moves between the two (docs/spark.md, the JVM reader)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from databus.core.errors import ConfigError
from databus.relay.relay import Relay
from databus.spark import jvm
from databus.spark.options import parse_options
from tests.support.mariadb import MariaDB
from tests.support.shop import TABLES, Writer, create_shop
from tests.support.sparkrelay import batch_read, drain, read, relay_events, start_relay, wait_relay
from tests.support.typematrix import ROWS, matrix_relay
from tests.support.wait import wait_until

pytestmark = pytest.mark.skipif(jvm.jar() is None, reason="no JDK here to build the JVM reader")


def columnar(df: DataFrame) -> bool:
    """Whether Spark reads ``df``'s scan as columnar batches (a ColumnarToRow above it)."""
    return "ColumnarToRow" in str(df._jdf.queryExecution().executedPlan().toString())


def test_columnar_and_row_readers_give_the_same_rows_for_every_type(
        spark: SparkSession, tmp_path: Path, mariadb: MariaDB) -> None:
    with matrix_relay(mariadb, tmp_path, "coltm") as (relay, table, cur):
        cur.execute("UPDATE tm SET i = i - 1, vc = 'changed', d2 = NULL WHERE id = 2")
        # a key change (a delete and an insert) of the row of nulls
        cur.execute("UPDATE tm SET id = 30 WHERE id = 3")
        cur.execute("DELETE FROM tm WHERE id = 1")
        want = len(ROWS) + 4

        def held() -> int:
            return int(batch_read(spark, relay.url, table,
                                  columnarBatchRows=0).count())

        wait_until(lambda: held() >= want, 60, "the relay to hold the changes")
        for opts in ({"partitions": 1}, {"partitions": 2, "envelope": "flat"},
                     {"valueFormat": "json"}):
            rows = batch_read(spark, relay.url, table, columnarBatchRows=0, **opts)
            assert not columnar(rows)
            expected = sorted(rows.collect(), key=repr)
            assert len(expected) == want, opts
            for size in (4096, 1):
                df = batch_read(spark, relay.url, table, columnarBatchRows=size, **opts)
                assert columnar(df), (opts, size)
                assert df.schema == rows.schema
                assert sorted(df.collect(), key=repr) == expected, (opts, size)


def _shop(tmp: Path) -> Any:
    db = tmp / "shop.db"
    create_shop(db)
    relay = start_relay(db, tmp, TABLES)
    with Writer(db, seed=31, rollback_ratio=0.1) as w:
        for _ in range(60):
            w.transaction()
    wait_relay(relay, db)
    yield relay, db
    relay.stop()


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A relay over a shop, for the tests that only read it."""
    yield from _shop(tmp_path_factory.mktemp("colshop"))


@pytest.fixture
def own_shop(tmp_path: Path) -> Any:
    """Like ``shop``, for a test that writes to the shop."""
    yield from _shop(tmp_path)


def test_a_checkpoint_moves_between_the_row_and_the_columnar_reader(
        spark: SparkSession, tmp_path: Path, own_shop: tuple[Relay, Path]) -> None:
    relay, db = own_shop
    out = tmp_path / "both"
    # items: composite keys (text event keys), 2 buckets, pages ending inside windows
    opts = {"partitions": 2, "fetchBytes": 4096}
    seen: list[Any] = []
    for round_, size in enumerate((0, 1, 0)):
        if round_:
            with Writer(db, seed=40 + round_) as w:
                for _ in range(25):
                    w.transaction()
            wait_relay(relay, db)
        rows, _ = drain(read(spark, "databus-jvm", relay.url, "items",
                             columnarBatchRows=size, **opts), out)
        assert len(rows) > len(seen), size  # each run read what the last one left
        seen = rows
    # nothing lost, nothing read twice: every change the relay holds, once (its text keys
    # come as bytes' repr from relay_events)
    held = [(scn, ast.literal_eval(key).decode(), op) for scn, key, op in relay_events(
        relay.url, "items")]
    assert sorted((r["scn"], r["key"], r["op"]) for r in seen) == sorted(held)


def test_a_bad_columnar_batch_size_fails_load(
        spark: SparkSession, shop: tuple[Relay, Path]) -> None:
    relay, _ = shop
    for value in ("-1", str(2**20 + 1), "many"):
        with pytest.raises(ConfigError, match="columnarBatchRows"), jvm.errors():
            read(spark, "databus-jvm", relay.url, "orders", columnarBatchRows=value)
    # the Python source takes the option (unused there) with the same bounds
    assert parse_options({"relay": relay.url, "sources": "orders",
                          "columnarBatchRows": "0"}).columnar_batch_rows == 0
    with pytest.raises(ConfigError, match="columnarBatchRows"):
        parse_options({"relay": relay.url, "sources": "orders", "columnarBatchRows": "-1"})
