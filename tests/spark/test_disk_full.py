"""A full disk under a Spark query's checkpoint and its Delta table (issue 35's fault
table, docs/guarantees.md): the query that cannot write fails loudly (Spark ends it with
the file system's error; nothing is acknowledged to the relay, which keeps no consumer
state), and the same query restarted from its checkpoint once space returns ends with
the table equal to the source: no change lost, none applied twice.

The checkpoint and the table live on a size-limited tmpfs (tests/support/faults.py)
filled up while changes wait in the relay."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from databus.spark import apply_changes, changes, read_lakehouse
from tests.spark.lines import needs
from tests.support import faults
from tests.support.shop import Writer, create_shop
from tests.support.sparkrelay import rows, start_relay, stream, wait_relay

DISK = 96 << 20
COLUMNS = "id, name, balance, tx"


@needs("delta")
def test_a_full_disk_under_the_checkpoint_and_table_fails_the_query_and_a_restart_recovers(
        spark: SparkSession, tmp_path: Path) -> None:
    why = faults.mount_unavailable()
    if why:
        pytest.skip(why)
    db = tmp_path / "shop.db"
    create_shop(db)
    relay = start_relay(db, tmp_path, ["customers"])
    with faults.small_disk(DISK) as disk, Writer(db, seed=23) as w:
        target, ckpt = str(disk / "customers"), str(disk / "customers.ckpt")

        def run() -> BaseException | None:
            q = apply_changes(
                target=target, format="delta", keys=["id"], sequence_by="_sequence",
                source=changes(stream(spark, relay, "customers", partitions=2)),
                apply_as_deletes="_op = 'd'", except_column_list=["_op", "_sequence"],
                checkpoint_location=ckpt, trigger={"availableNow": True})
            try:
                q.awaitTermination(300)
            except Exception as exc:  # broad: the query's own failure is what is checked
                return exc
            return q.exception()

        def table() -> list[tuple[object, ...]]:
            df = read_lakehouse(spark, target, "delta")
            return [tuple(r) for r in df.selectExpr(*COLUMNS.split(", ")).orderBy("id")
                    .collect()]

        try:
            for _ in range(40):
                w.transaction()
            wait_relay(relay, db)
            assert run() is None
            assert table() == rows(db, f"SELECT {COLUMNS} FROM customers ORDER BY id")
            for _ in range(60):
                w.transaction()
            wait_relay(relay, db)
            with faults.filled(disk):
                error = run()
                assert error is not None, "a query writing a full disk did not fail"
                assert "space" in str(error).lower() or "No space" in repr(error), error
            for _ in range(5):  # space is back: the same query, from its checkpoint
                assert run() is None
                if table() == rows(db, f"SELECT {COLUMNS} FROM customers ORDER BY id"):
                    break
            assert table() == rows(db, f"SELECT {COLUMNS} FROM customers ORDER BY id")
        finally:
            for q in spark.streams.active:
                q.stop()
            relay.stop()
