"""Spark from Kafka versus Spark from the relay, into Delta through the same apply_changes.

N changes (``bench.spark_lakehouse``'s workload: inserts, updates, 10% deletes, 1,000 per
transaction) are committed to three SQLite tables captured by a ``databus relay`` process,
and ``run_publish`` (the code of ``databus publish``: JSON with Connect's schema part,
databus values, Kafka transactions) copies every window into a private single-node Kafka
broker (``tests.support.kafka``; not timed). Then, on ``local[2]``, each table is applied
into a fresh Delta SCD1 table by ``apply_changes`` (availableNow, one query per table,
timed from the first start to the last end) from two inputs:

* ``kafka``: Spark's own Kafka source (``format("kafka")``, the pinned bundle
  ``scripts/java/spark-kafka.pom.xml``, ``read_committed``, ``minPartitions`` 2) on the
  publisher's topic ``bench.main.<table>``, the envelope parsed with ``from_json`` into the
  change shape of the relay source (``tests.support.kafka.spark_kafka_changes``: row
  columns, ``_op``, ``_sequence`` = (``source.scn``, ``transaction.total_order``));
* ``relay``: ``format("databus")`` on the relay (``envelope=flat``, ``partitions`` 2);
* ``relay-newest``: the same with ``newestPerKey=true`` (one row per key per batch, the
  key's newest change: docs/spark.md).

Rounds alternate the inputs; each input's best time counts; every table is checked equal
to its SQLite table. Then the lag: a writer commits ``--rate`` changes/s to one table
(20 transactions/s) for ``--steady`` seconds, while one query (1 s trigger) applies them
into Delta: first from the relay, then (with a ``databus publish`` process running) from
Kafka; the publisher first catches up what the relay phase wrote, each phase starts with
10 s of the same writes applied to the end (warm-up, not counted), and rows committed
before the measured writer started are not counted. Each row carries its commit time; its
lag is the time from its commit to the end of the MERGE that applied it: p50/p99 over
all rows the writer changed.

    flock /tmp/databus-bench.lock .venv/bin/python -m bench.spark_kafka [--changes 300000]
        [--repeat 2] [--steady 30] [--rate 2000] [--skip-throughput]

Its last line is machine-readable: ``ratio relay/kafka: X`` (changes/s, best of each).
"""

from __future__ import annotations

import argparse
import random
import shutil
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from pyspark.sql import DataFrame, SparkSession
from tests.support.kafka import (
    KafkaBroker,
    published_position,
    spark_kafka_changes,
    spark_kafka_jars,
)
from tests.support.procs import DATABUS, spawn, stop

from bench.spark_apply import RelayProcess
from bench.spark_lakehouse import COLS, FLAT, TABLES, write_changes
from databus.kafka.config import PublishConfig
from databus.kafka.publisher import run_publish
from databus.spark import apply_changes, jvm, read_lakehouse, register, session
from databus.spark.lakehouse import TableApplier
from databus.spark.spec import ApplySpec

ROW_DDL = "id BIGINT, a BIGINT, b DOUBLE, c STRING"
PREFIX = "bench"


def _session(tmp: Path) -> SparkSession:
    # session() adds Delta's jars and the JVM reader's to these (until the joints fix of
    # issue #30, a spark.jars here replaced them: the "relay" figures were the Python source's)
    spark = session("databus-spark-kafka", master="local[2]", lakehouse=["delta"],
                    conf={"spark.jars": ",".join(spark_kafka_jars()),
                          "spark.sql.shuffle.partitions": "4",
                          "spark.ui.enabled": "false", "spark.driver.memory": "4g",
                          "spark.ui.showConsoleProgress": "false",
                          "spark.sql.session.timeZone": "UTC",
                          "spark.sql.warehouse.dir": str(tmp / "warehouse")})
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    print(f"format(\"databus\") is the {'JVM reader' if jvm.active(spark) else 'Python source'}"
          f", Spark {spark.version}", flush=True)
    return spark


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--changes", type=int, default=300_000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--steady", type=float, default=30.0, help="seconds of each lag phase")
    ap.add_argument("--rate", type=int, default=2000, help="changes/s in the lag phases")
    ap.add_argument("--skip-throughput", action="store_true", help="the lag phases only")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="databus-spark-kafka-"))
    db = tmp / "src.db"
    con = sqlite3.connect(db)
    for t in TABLES:
        con.execute(f"CREATE TABLE {t} (id INTEGER PRIMARY KEY, a INTEGER, b REAL, c TEXT)")
    con.close()
    relay = RelayProcess(db, tmp, TABLES)
    broker = KafkaBroker()
    try:
        broker.start()
        t0 = time.perf_counter()
        write_changes(db, args.changes)
        top = sqlite3.connect(db).execute("SELECT max(scn) FROM _databus_txlog").fetchone()[0]
        while relay.max_scn() < top:
            time.sleep(0.1)
        windows = int(httpx.get(f"{relay.url}/containerStats/buffer/windows", timeout=10).json())
        t1 = time.perf_counter()
        run_publish(PublishConfig(relay=relay.url, bootstrap_servers=broker.bootstrap_servers,
                                  topic_prefix=PREFIX, heartbeat_interval=0),
                    max_windows=windows)
        print(f"setup: {args.changes} changes on {len(TABLES)} tables committed and captured in"
              f" {t1 - t0:.1f}s ({windows} relay windows), published to Kafka in"
              f" {time.perf_counter() - t1:.1f}s", flush=True)
        spark = _session(tmp)
        want = {t: sorted(sqlite3.connect(db).execute(f"SELECT * FROM {t}").fetchall())
                for t in TABLES}

        def source(kind: str, t: str) -> DataFrame:
            if kind.startswith("relay"):
                return (spark.readStream.format("databus").option("relay", relay.url)
                        .option("sources", t).option("partitions", 2)
                        .option("envelope", "flat")
                        .option("newestPerKey", str(kind == "relay-newest").lower()).load())
            df: DataFrame = spark_kafka_changes(spark.readStream,
                                                bootstrap_servers=broker.bootstrap_servers,
                                                topic=f"{PREFIX}.main.{t}", row_ddl=ROW_DDL,
                                                min_partitions=2)
            return df

        served: set[str | None] = set()

        def run(kind: str, name: str) -> tuple[float, float]:
            """Seconds from the first start to the last end, and those inside batches."""
            start = time.perf_counter()
            inside = 0.0
            for t in TABLES:
                qq = apply_changes(target=str(tmp / f"{name}-{t}"), source=source(kind, t),
                                   keys=["id"], format="delta",
                                   checkpoint_location=str(tmp / f"{name}-{t}.ckpt"),
                                   trigger={"availableNow": True}, **FLAT)  # type: ignore[arg-type]
                qq.awaitTermination()
                if qq.exception() is not None:
                    raise SystemExit(f"{name} failed: {qq.exception()}")
                if kind.startswith("relay"):
                    served.add(jvm.served_by(qq))
                inside += sum(p["durationMs"].get("triggerExecution", 0)
                              for p in qq.recentProgress) / 1000
            return time.perf_counter() - start, inside

        def check(name: str) -> None:
            for t in TABLES:
                df = read_lakehouse(spark, str(tmp / f"{name}-{t}"), "delta")
                got = sorted(tuple(r) for r in df.select(*COLS).collect())
                assert got == want[t], f"{name} {t}: table differs from the source"

        times: dict[str, list[tuple[float, float]]] = {"kafka": [], "relay": [],
                                                       "relay-newest": []}
        if not args.skip_throughput:
            # JIT, Python workers, the sources' imports: not timed
            run("relay", "warmrelay")
            run("relay-newest", "warmnewest")
            run("kafka", "warmkafka")
        for round_ in range(0 if args.skip_throughput else args.repeat):
            order = ("kafka", "relay", "relay-newest")
            for kind in order if round_ % 2 == 0 else order[::-1]:
                name = f"{kind.replace('-', '')}{round_}"
                secs, inside = run(kind, name)
                check(name)
                times[kind].append((secs, inside))
                print(f"round {round_}: {kind} {secs:.2f}s ({inside:.2f}s in batches)"
                      + (f", served by the {'/'.join(map(str, sorted(served, key=str)))} reader"
                         if kind.startswith("relay") else ""), flush=True)
        n = args.changes
        print(f"\n{'input -> apply_changes -> Delta':<44} | {'best s':>7} | {'changes/s':>10} |"
              f" {'in batches':>10} | all runs (s)")
        best = {}
        for kind, label in (("kafka", "Spark Kafka source (publish -> Kafka)"),
                            ("relay", f"format(\"databus\") (relay, {'/'.join(map(str, served))})"),
                            ("relay-newest", "the same, newestPerKey=true")):
            if not times[kind]:
                continue
            secs, inside = min(times[kind])
            best[kind] = secs
            print(f"{label:<44} | {secs:>7.2f} | {n / secs:>10,.0f} | {inside:>10.2f} | "
                  + ", ".join(f"{s:.2f}" for s, _ in times[kind]))
        lags = {}
        if args.steady > 0:
            for kind in ("relay", "kafka"):
                lags[kind] = steady(spark, kind, relay, broker, db, tmp, args.steady,
                                    args.rate)
        if lags:
            print(f"lag relay / Kafka: p50 {lags['relay'][0] / lags['kafka'][0]:.2f}x,"
                  f" p99 {lags['relay'][1] / lags['kafka'][1]:.2f}x")
        if best:
            print(f"\nrows/s relay / Kafka: {best['kafka'] / best['relay']:.2f}x"
                  " (same apply_changes, same Delta, best of each)")
            print(f"rows/s relay newestPerKey / Kafka: {best['kafka'] / best['relay-newest']:.2f}x")
            print(f"ratio relay/kafka: {best['kafka'] / best['relay']:.2f}")
    finally:
        broker.close()
        relay.stop()
    shutil.rmtree(tmp, ignore_errors=True)


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def steady(spark: SparkSession, kind: str, relay: RelayProcess, broker: KafkaBroker, db: Path,
           tmp: Path, seconds: float, rate: int) -> tuple[float, float]:
    """Commit -> merged lag per row (p50, p99 in seconds) from ``kind``, 1 s trigger."""
    spec = ApplySpec(target=str(tmp / f"steady-{kind}"), keys=("id",),
                     sequence_by="_sequence", apply_as_deletes="_op = 'd'",
                     except_column_list=("_op", "_sequence"))
    applier = TableApplier(spec, "delta", lambda: f"bench-steady-{kind}")
    lags: list[float] = []
    batches: list[int] = []
    since = [float("inf")]  # the writer's start: rows committed before it are not counted

    def batch(df: DataFrame, batch_id: int) -> None:
        df = df.persist()
        committed = [r[0] for r in df.select("b").collect()]
        applier(df, batch_id)
        df.unpersist()
        end = time.time()
        lags.extend(end - b for b in committed if b >= since[0])
        batches.append(len(committed))

    publisher = None
    if kind == "relay":
        src = (spark.readStream.format("databus").option("relay", relay.url)
               .option("sources", "t1").option("partitions", 2).option("envelope", "flat")
               .option("startingPosition", "latest").load())
    else:
        # the live path: relay -> databus publish (its defaults but no heartbeats) -> Kafka;
        # the publisher first catches up what the relay phase wrote, before the query starts
        publisher = spawn([*DATABUS, "publish", "--relay", relay.url, "--bootstrap-servers",
                           broker.bootstrap_servers, "--topic-prefix", PREFIX,
                           "--heartbeat-interval", "0"], tmp / "publish.log")
        end_scn = relay.max_scn()
        deadline = time.monotonic() + 300
        while published_position(broker, PREFIX) < end_scn:
            if publisher.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the publisher did not catch up with the relay")
            time.sleep(0.5)
        src = spark_kafka_changes(spark.readStream, bootstrap_servers=broker.bootstrap_servers,
                                  topic=f"{PREFIX}.main.t1", row_ddl=ROW_DDL, min_partitions=2,
                                  starting_offsets="latest")
    run: Callable[[DataFrame, int], None] = batch
    qq = (src.writeStream.foreachBatch(run)
          .option("checkpointLocation", str(tmp / f"steady-{kind}.ckpt"))
          .trigger(processingTime="1 second").start())
    halt = threading.Event()

    written = [0]

    def write() -> None:
        rng = random.Random(3)
        con = sqlite3.connect(db, isolation_level=None)
        per_txn = max(1, rate // 20)
        while not halt.is_set():
            t0 = time.monotonic()
            con.execute("BEGIN")
            n = 0
            for _ in range(per_txn):
                n += con.execute("UPDATE t1 SET a=?, b=? WHERE id=?",
                                 (rng.randrange(10**9), time.time(),
                                  rng.randrange(1, 1000))).rowcount
            con.execute("COMMIT")
            written[0] += n  # a deleted id updates nothing
            halt.wait(max(0.0, 0.05 - (time.monotonic() - t0)))
        con.close()

    try:
        time.sleep(5)  # the query's first (empty) batches
        # a warm-up of 10 s at the rate, applied to the end, then the measured phase: the
        # query's first batches pay the JIT, the Python workers, the first Delta commits
        for phase, length in (("warm-up", 10.0), ("measured", seconds)):
            since[0] = time.time()
            lags.clear()
            batches.clear()
            written[0] = 0
            halt.clear()
            writer = threading.Thread(target=write)
            writer.start()
            time.sleep(length)
            halt.set()
            writer.join()
            deadline = time.monotonic() + 180  # until every row written is merged
            while len(lags) < written[0] and time.monotonic() < deadline:
                time.sleep(0.5)
            if phase == "warm-up":
                print(f"{kind} warm-up: {len(lags)} of {written[0]} rows merged", flush=True)
    finally:
        qq.stop()
        if publisher is not None:
            stop(publisher)
    p50, p99 = _pct(lags, 0.5), _pct(lags, 0.99)
    if kind == "relay":
        print(f"lag from relay: served by the {jvm.served_by(qq)} reader", flush=True)
    print(f"lag from {kind}: {rate} changes/s for {seconds:.0f}s into Delta SCD1 (1 s trigger):"
          f" {len(lags)} of {written[0]} rows written, {len(batches)} batches; commit -> merged p50 {p50:.2f}s,"
          f" p99 {p99:.2f}s, max {max(lags):.2f}s", flush=True)
    return p50, p99


if __name__ == "__main__":
    main()
