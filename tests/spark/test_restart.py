"""Killing the streaming queries and the relay at random points, then restarting.

A relay process (persistent buffer) over SQLite, a writer committing all the
while, and two queries on the ``customers`` stream with 4 partitions: one
applies changes into an SCD1 table, one writes the raw envelope to a Parquet
file sink (exactly-once only if a replayed batch reads the same events).
Each round stops the queries at a random moment (``StreamingQuery.stop``
interrupts a batch that is running; the Spark session itself stays up, one per
test run) and every other round kills the relay with SIGKILL. At the end the
table must equal the source table and the raw sink must hold every event the
relay holds exactly once.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from databus.spark import apply_changes, changes, read_table
from tests.support.procs import DATABUS, free_port, kill9, spawn, stop, wait_http
from tests.support.shop import TABLES, Writer, create_shop, table_rows, txlog_max
from tests.support.sparkrelay import relay_events
from tests.support.wait import wait_until


class _RelayProc:
    def __init__(self, tmp: Path, db: Path) -> None:
        self.tmp, self.port = tmp, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (tmp / "relay.yaml").write_text(yaml.safe_dump({
            "name": "spark-e2e",
            "source": {"url": f"sqlite:///{db}", "tables": TABLES, "poll_interval": 0.01},
            "buffer": {"capacity_bytes": 64 * 1024 * 1024, "path": str(tmp / "relay.buf"),
                       "flush_interval": 0.2},
            "http": {"port": self.port},
        }))
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        self.proc = spawn([*DATABUS, "relay", "--config", str(self.tmp / "relay.yaml")],
                          self.tmp / "relay.log")
        wait_http(f"{self.url}/admin", self.proc)

    @property
    def buffer_max(self) -> int:
        import httpx

        return int(httpx.get(f"{self.url}/containerStats/buffer/max_scn", timeout=10).json())


def _start(spark: SparkSession, url: str, tmp: Path, trigger: dict[str, object]
           ) -> list[StreamingQuery]:
    def src() -> DataFrame:
        return (spark.readStream.format("databus").option("relay", url)
                .option("sources", "customers").option("partitions", 4)
                .option("maxRowsPerBatch", 300).option("relayRetrySeconds", 20).load())

    table = apply_changes(
        target=str(tmp / "customers"), source=changes(src()), keys=["id"],
        sequence_by="_sequence", apply_as_deletes="_op = 'd'",
        except_column_list=["_op", "_sequence"], checkpoint_location=str(tmp / "apply.ckpt"),
        trigger=trigger)
    raw = (src().select("scn", "key", "op", "sequence").writeStream.format("parquet")
           .option("path", str(tmp / "raw")).option("checkpointLocation", str(tmp / "raw.ckpt"))
           .trigger(**trigger).start())
    return [table, raw]


def _drain(start: Callable[[], list[StreamingQuery]]) -> None:
    """Run availableNow queries until a run reads nothing.

    On Spark 4.1 an availableNow run that finds an unfinished batch in its
    checkpoint (the last run was stopped or killed mid-batch) ends after
    re-running that batch (docs/spark.md), so one run is not enough.
    """
    for _run in range(5):
        rows = 0
        for q in start():
            q.awaitTermination(300)
            assert q.exception() is None
            rows += sum(p["numInputRows"] for p in q.recentProgress)
        if rows == 0:
            return
    raise AssertionError("five availableNow runs in a row still read rows")


@pytest.mark.slow
def test_kill_queries_and_relay_at_random_points(spark: SparkSession, tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    create_shop(db)
    relay = _RelayProc(tmp_path, db)
    w = Writer(db, seed=41)
    done = threading.Event()

    def write() -> None:
        while not done.is_set() and len(w.committed) < 1500:
            w.transaction()
            done.wait(0.004)

    writer = threading.Thread(target=write)
    writer.start()
    rng = random.Random(7)
    relay_kills = 0
    try:
        for round_ in range(6):
            queries = _start(spark, relay.url, tmp_path, {"processingTime": "300 milliseconds"})
            if round_ == 0:
                # Spark cannot restart a query stopped inside its very first batch (on the
                # next start: STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY, "offsets should be
                # empty on batch 0"; seen on a loaded machine): that is Spark's, not the
                # source's, so the random stops start after each query committed batch 0
                wait_until(lambda: all((tmp_path / c / "commits" / "0").exists()
                                       for c in ("apply.ckpt", "raw.ckpt")), 120,
                           "each query's first batch", interval=0.1)
            done.wait(rng.uniform(1.0, 5.0))
            if round_ % 2 == 1:
                assert relay.proc is not None
                kill9(relay.proc)
                relay_kills += 1
                done.wait(rng.uniform(0.0, 1.5))
                relay.start()
                done.wait(rng.uniform(0.5, 2.0))
            for q in queries:
                q.stop()
    finally:
        done.set()
        writer.join()
        w.close()
    try:
        wait_until(lambda: relay.buffer_max >= txlog_max(db), 60, "the relay to catch up",
                   interval=0.1)
        _drain(lambda: _start(spark, relay.url, tmp_path, {"availableNow": True}))
        got = [tuple(r) for r in read_table(spark, str(tmp_path / "customers"))
               .select("id", "name", "balance", "tx").orderBy("id").collect()]
        assert got == table_rows(db, "customers")
        raw = sorted((r.scn, r.key, r.op) for r in spark.read.parquet(str(tmp_path / "raw"))
                     .collect())
        assert raw == sorted(relay_events(relay.url, "customers"))
        assert relay_kills == 3 and len(w.committed) > 200
    finally:
        assert relay.proc is not None
        stop(relay.proc)


@pytest.mark.slow
def test_sigkill_of_the_spark_driver_mid_stream(spark: SparkSession, tmp_path: Path) -> None:
    """The whole Spark application (driver, JVM, workers) SIGKILLed while it applies."""
    db = tmp_path / "shop.db"
    create_shop(db)
    relay = _RelayProc(tmp_path, db)
    try:  # the relay is stopped whatever fails (a leaked process fails a later test)
        w = Writer(db, seed=43)
        done = threading.Event()

        def write() -> None:
            while not done.is_set() and len(w.committed) < 2000:
                w.transaction()
                done.wait(0.004)

        writer = threading.Thread(target=write)
        writer.start()
        target, ckpt = tmp_path / "customers", tmp_path / "apply.ckpt"
        rng = random.Random(9)
        applied_before_kill = []
        try:
            for _ in range(2):
                log = (tmp_path / "consumer.log").open("ab")
                proc = subprocess.Popen(
                    [sys.executable, "-m", "tests.spark.consumer_proc", relay.url, str(target),
                     str(ckpt)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                    cwd=Path(__file__).resolve().parents[2])
                try:
                    # session start takes seconds; then let it run a random while
                    def committed(proc: subprocess.Popen[bytes] = proc) -> bool:
                        # the log's tail in the message: a CI run's tmp dir is gone when read
                        assert proc.poll() is None, "consumer died: " + "\n".join(
                            (tmp_path / "consumer.log").read_text(errors="replace")
                            .splitlines()[-25:])
                        return (ckpt / "commits").is_dir() and any((ckpt / "commits").iterdir())

                    wait_until(committed, 120, "the consumer's first commit", interval=0.2)
                    done.wait(rng.uniform(0.5, 3.0))
                finally:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(30)
                    log.close()
                applied_before_kill.append(len(list((ckpt / "commits").iterdir())))
        finally:
            done.set()
            writer.join()
            w.close()
        wait_until(lambda: relay.buffer_max >= txlog_max(db), 60, "the relay to catch up",
                   interval=0.1)

        def start() -> list[StreamingQuery]:
            src = (spark.readStream.format("databus").option("relay", relay.url)
                   .option("sources", "customers").option("partitions", 4).load())
            return [apply_changes(target=str(target), source=changes(src), keys=["id"],
                                  sequence_by="_sequence", apply_as_deletes="_op = 'd'",
                                  except_column_list=["_op", "_sequence"],
                                  checkpoint_location=str(ckpt),
                                  trigger={"availableNow": True})]

        _drain(start)
        got = [tuple(r) for r in read_table(spark, str(target))
               .select("id", "name", "balance", "tx").orderBy("id").collect()]
        assert got == table_rows(db, "customers")
        assert applied_before_kill == sorted(applied_before_kill) and applied_before_kill[0] > 0
    finally:
        assert relay.proc is not None
        stop(relay.proc)
