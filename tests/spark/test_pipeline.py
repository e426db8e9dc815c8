"""SQLite -> relay -> Spark streaming (4 partitions) -> apply_changes -> Parquet table.

The writer commits random transactions (inserts, updates, deletes, rollbacks)
to the shop database; the table materialised by Spark must equal the source
table row for row.
"""

from __future__ import annotations

import time
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from databus.spark import apply_changes, changes, read_table
from tests.support.accounts import AccountWriter, check_history, rows_of
from tests.support.shop import TABLES, Writer, create_shop, table_rows
from tests.support.sparkrelay import start_relay, stream, wait_relay


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


def test_scd2_history_matches_the_sequence_of_updates(spark: SparkSession,
                                                      tmp_path: Path) -> None:
    db = tmp_path / "acc.db"
    w = AccountWriter(db, seed=4)
    relay = start_relay(db, tmp_path, ["accounts"])
    try:
        def write(n: int) -> None:
            for i in range(n):
                w.transaction()
                if i % 10 == 0:
                    time.sleep(0.03)
            wait_relay(relay, db)

        write(50)
        target = str(tmp_path / "hist")
        q = apply_changes(
            target=target, source=changes(stream(spark, relay, "accounts", partitions=4,
                                                 maxRowsPerBatch=120)),
            keys=["id"], sequence_by="_sequence", apply_as_deletes="_op = 'd'",
            except_column_list=["_op", "_sequence"], stored_as_scd_type=2,
            checkpoint_location=str(tmp_path / "ckpt"),
            trigger={"processingTime": "50 milliseconds"})
        try:
            q.processAllAvailable()  # the first batch of a reader is not capped on Spark 4.1
            write(50)  # these arrive as further, capped batches
            q.processAllAvailable()
        finally:
            q.stop()
        assert q.exception() is None
        assert len([p for p in q.recentProgress if p["numInputRows"]]) >= 2
        current = read_table(spark, target, current_only=True)
        assert sorted_rows(current, ["id", "v", "note"], ["id"]) == rows_of(db)
        check_history(read_table(spark, target).collect(), w)
    finally:
        w.con.close()
        relay.stop()
