"""Spark from Kafka and Spark from the relay build the same Delta table.

SQLite -> relay -> ``databus publish`` (``run_publish``) -> a private Kafka broker; then
two availableNow queries feed the same ``apply_changes`` into Delta: one reads the
publisher's topic with Spark's own Kafka source (the pinned ``spark-kafka`` bundle,
``read_committed``, the envelope parsed by ``tests.support.kafka.spark_kafka_changes``),
the other reads the relay with ``format("databus")``. Both tables must equal the source
table, after a first batch of transactions and again after more (each query resuming
from its checkpoint). The workload changes keys several times inside one transaction
and changes primary keys, so the order inside a window (``transaction.total_order``
from Kafka, the event index from the relay) decides the result.

The Kafka source's jars reach the shared session's JVM with ``ADD JAR`` (the session
fixture starts before this module); the test is skipped when the ``spark-kafka`` or
``kafka`` bundle is not cached (``bash scripts/java/fetch.sh spark-kafka kafka``).
"""

from __future__ import annotations

import random
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from databus import javadeps
from databus.core.errors import ConfigError
from databus.kafka.config import PublishConfig
from databus.kafka.publisher import run_publish
from databus.spark import apply_changes, read_lakehouse
from tests.support.kafka import (
    KafkaBroker,
    published_position,
    spark_kafka_changes,
    spark_kafka_jars,
)
from tests.support.sparkrelay import rows, start_relay, stream, wait_relay
from tests.support.wait import wait_until


def _cached() -> bool:
    try:
        javadeps.jars("spark-kafka")
        javadeps.jars("kafka")
    except ConfigError:
        return False
    return True


pytestmark = pytest.mark.skipif(
    not _cached(), reason="the spark-kafka or kafka Java bundle is not cached "
                          "(bash scripts/java/fetch.sh spark-kafka kafka)")

ROW_DDL = "id BIGINT, v BIGINT, note STRING"
FLAT: dict[str, Any] = {"sequence_by": "_sequence", "apply_as_deletes": "_op = 'd'",
                        "except_column_list": ["_op", "_sequence"]}


def _write(db: Path, rng: random.Random, transactions: int, counter: list[int]) -> None:
    """Random transactions on ``accounts``: inserts, updates of a key several times in one
    transaction, deletes, primary-key changes."""
    con = sqlite3.connect(db, isolation_level=None)
    con.execute("CREATE TABLE IF NOT EXISTS accounts"
                " (id INTEGER PRIMARY KEY, v INTEGER NOT NULL, note TEXT)")
    try:
        for _ in range(transactions):
            con.execute("BEGIN IMMEDIATE")
            for _ in range(rng.randint(1, 12)):
                key = rng.randrange(1, 80)
                counter[0] += 1
                n = counter[0]
                live = con.execute("SELECT 1 FROM accounts WHERE id=?", (key,)).fetchone()
                roll = rng.random()
                if live is None:
                    con.execute("INSERT INTO accounts VALUES (?,?,?)", (key, n, f"n{n}"))
                elif roll < 0.2:
                    con.execute("DELETE FROM accounts WHERE id=?", (key,))
                elif roll < 0.3:
                    new = rng.randrange(80, 160)
                    if con.execute("SELECT 1 FROM accounts WHERE id=?", (new,)).fetchone():
                        continue
                    con.execute("UPDATE accounts SET id=?, v=? WHERE id=?", (new, n, key))
                else:
                    con.execute("UPDATE accounts SET v=?, note=? WHERE id=?", (n, f"u{n}", key))
            con.execute("COMMIT")
    finally:
        con.close()


def _add_kafka_jars(spark: SparkSession) -> None:
    # ADD JAR puts them on the session's class loader (the Kafka source is looked up there)
    # and ships them to the executors; adding a jar twice is a no-op
    for jar in spark_kafka_jars():
        spark.sql(f"ADD JAR '{jar}'")


def _publish_all(relay: Any, broker: KafkaBroker) -> None:
    """``run_publish`` until the publisher's committed position reaches the relay's end."""
    end = relay.buffer.max_scn
    cfg = PublishConfig(relay=relay.url, bootstrap_servers=broker.bootstrap_servers,
                        topic_prefix="shop", name="spark-test", heartbeat_interval=0)
    stop = threading.Event()
    t = threading.Thread(target=run_publish, args=(cfg,), kwargs={"stop": stop})
    t.start()
    try:
        wait_until(lambda: published_position(broker, "spark-test") >= end, 120,
                   f"the publisher to reach scn {end}", interval=0.5)
    finally:
        stop.set()
        t.join(60)
    assert not t.is_alive()


def test_spark_from_kafka_and_from_the_relay_build_the_same_delta_table(
        spark: SparkSession, tmp_path: Path) -> None:
    _add_kafka_jars(spark)
    db = tmp_path / "shop.db"
    rng, counter = random.Random(17), [0]
    # the table is empty when the relay starts: a publisher has no bootstrap (kafka.md),
    # the relay source would read rows written before as a snapshot
    _write(db, rng, 0, counter)
    relay = start_relay(db, tmp_path, ["accounts"])
    try:
        with KafkaBroker() as broker:
            targets = {"kafka": str(tmp_path / "from-kafka"), "relay": str(tmp_path / "from-relay")}
            for round_ in range(2):
                _write(db, rng, 60, counter)
                wait_relay(relay, db)
                _publish_all(relay, broker)
                for kind, target in targets.items():
                    src = (spark_kafka_changes(spark.readStream,
                                               bootstrap_servers=broker.bootstrap_servers,
                                               topic="shop.main.accounts", row_ddl=ROW_DDL,
                                               min_partitions=2)
                           if kind == "kafka" else
                           stream(spark, relay, "accounts", envelope="flat", partitions=2))
                    q = apply_changes(target=target, source=src, keys=["id"], format="delta",
                                      checkpoint_location=str(tmp_path / f"{kind}.ckpt"),
                                      trigger={"availableNow": True}, **FLAT)
                    assert q.awaitTermination(300)
                    assert q.exception() is None
                want = rows(db, "SELECT id, v, note FROM accounts ORDER BY id")
                assert len(want) > 20
                for kind, target in targets.items():
                    got = [tuple(r) for r in read_lakehouse(spark, target, "delta")
                           .select("id", "v", "note").orderBy("id").collect()]
                    assert got == want, f"round {round_}: the table from {kind} differs"
    finally:
        relay.stop()
