"""SQLite -> relay -> Spark streaming (4 partitions) -> apply_changes -> Parquet table.

The writer commits random transactions (inserts, updates, deletes, rollbacks)
to the shop database; the table materialised by Spark must equal the source
table row for row.
"""

from __future__ import annotations

import time
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from databus.relay.relay import Relay
from databus.spark import apply_changes, changes, read_table
from tests.spark.conftest import start_relay
from tests.support.shop import TABLES, Writer, create_shop, table_rows, txlog_max


def wait_relay(relay: Relay, db: Path, timeout: float = 30.0) -> None:
    want = txlog_max(db)
    deadline = time.monotonic() + timeout
    while relay.buffer.max_scn < want:
        assert time.monotonic() < deadline, f"relay stuck at {relay.buffer.max_scn} < {want}"
        time.sleep(0.05)


def stream(spark: SparkSession, relay: Relay, source: str, **opts: object) -> DataFrame:
    reader = (spark.readStream.format("databus").option("relay", relay.url)
              .option("sources", source))
    for k, v in opts.items():
        reader = reader.option(k, str(v))
    return reader.load()


def sorted_rows(df: DataFrame, columns: list[str], order: list[str]) -> list[tuple[object, ...]]:
    return [tuple(r) for r in df.select(*columns).orderBy(*order).collect()]


def test_scd1_with_four_partitions_equals_source(spark: SparkSession, tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    create_shop(db)
    relay = start_relay(db, tmp_path, TABLES)
    try:
        w = Writer(db, seed=21)
        for _ in range(300):
            w.transaction()
            if w.txn % 50 == 0:
                time.sleep(0.05)  # let the relay cut several windows
        w.close()
        wait_relay(relay, db)
        for table, keys in (("customers", ["id"]), ("items", ["order_id", "line"])):
            q = apply_changes(
                target=str(tmp_path / table), source=changes(stream(spark, relay, table,
                                                                    partitions=4)),
                keys=keys, sequence_by="_sequence", apply_as_deletes="_op = 'd'",
                except_column_list=["_op", "_sequence"],
                checkpoint_location=str(tmp_path / f"{table}.ckpt"),
                trigger={"availableNow": True})
            q.awaitTermination(120)
            assert q.exception() is None
            got = read_table(spark, str(tmp_path / table))
            cols = ["id", "name", "balance", "tx"] if table == "customers" else \
                ["order_id", "line", "sku", "qty", "tx"]
            want = table_rows(db, table)
            assert len(want) > 50
            assert sorted_rows(got, cols, keys) == want, f"{table} differs"
            parts = [p["sources"][0]["numInputRows"] for p in q.recentProgress]
            assert sum(parts) > len(want)  # updates and deletes flowed too
    finally:
        relay.stop()
