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


class AccountWriter:
    """Random inserts/updates/deletes on ``accounts``; records each key's history.

    Every upsert sets ``v`` to a new counter value, so each is a new version.
    ``history[id]`` lists ``v`` per upsert and ``None`` per delete, in commit order.
    """

    def __init__(self, db: Path, seed: int) -> None:
        import random
        import sqlite3

        self.rng = random.Random(seed)
        self.con = sqlite3.connect(db, isolation_level=None)
        self.con.execute("CREATE TABLE IF NOT EXISTS accounts"
                         " (id INTEGER PRIMARY KEY, v INTEGER NOT NULL, note TEXT)")
        self.live: set[int] = set()
        self.history: dict[int, list[int | None]] = {}
        self.counter = 0

    def transaction(self) -> None:
        self.con.execute("BEGIN IMMEDIATE")
        for _ in range(self.rng.randint(1, 6)):
            key = self.rng.randrange(1, 40)
            self.counter += 1
            if key not in self.live:
                self.con.execute("INSERT INTO accounts VALUES (?,?,?)",
                                 (key, self.counter, f"n{self.counter}"))
                self.live.add(key)
            elif self.rng.random() < 0.25:
                self.con.execute("DELETE FROM accounts WHERE id=?", (key,))
                self.live.discard(key)
                self.history.setdefault(key, []).append(None)
                continue
            else:
                self.con.execute("UPDATE accounts SET v=? WHERE id=?", (self.counter, key))
            self.history.setdefault(key, []).append(self.counter)
        self.con.execute("COMMIT")


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
        assert sorted_rows(current, ["id", "v", "note"], ["id"]) == \
            [tuple(r) for r in rows_of(db)]
        hist = read_table(spark, target).orderBy("id", "__START_AT").collect()
        by_key: dict[int, list[object]] = {}
        for r in hist:
            by_key.setdefault(r["id"], []).append(r)
        assert set(by_key) == {
            k for k, h in w.history.items() if any(v is not None for v in h)}
        for key, versions in by_key.items():
            expected = w.history[key]
            assert [r["v"] for r in versions] == [v for v in expected if v is not None], key
            # each version ends where the next starts unless a delete came between
            upserts_then = [expected[i + 1] if i + 1 < len(expected) else "end"
                            for i, v in enumerate(expected) if v is not None]
            for r, nxt_version, after in zip(versions, [*versions[1:], None], upserts_then,
                                             strict=True):
                if after == "end":
                    assert r["__END_AT"] is None and nxt_version is None
                elif after is None:  # deleted: closed before the next version starts
                    assert r["__END_AT"] is not None
                    assert nxt_version is None or r["__END_AT"] < nxt_version["__START_AT"]
                else:
                    assert nxt_version is not None and r["__END_AT"] == nxt_version["__START_AT"]
            assert (versions[-1]["__END_AT"] is None) == (key in w.live)
    finally:
        w.con.close()
        relay.stop()


def rows_of(db: Path) -> list[tuple[object, ...]]:
    from tests.support.sparkrelay import rows

    return rows(db, "SELECT id, v, note FROM accounts ORDER BY id")
