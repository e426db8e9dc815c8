"""apply_changes into Delta Lake and Iceberg: from the relay vs from Parquet vs the Kafka way.

N changes (mixed inserts, updates and deletes, 1,000 per transaction) are
committed to three SQLite tables (N/3 each) captured by a relay process. Each
table is then applied into a fresh SCD1 table of the format (Delta, Iceberg) on
``local[2]`` three ways, each an availableNow query per table, timed from the
first start to the last end:

* ``relay``: ``apply_changes(format=...)`` reading the relay
  (``envelope=flat``, ``partitions=2``) through ``format("databus")``: the JVM reader
  (databus.spark.jvm) when its jar is built, as by default;
* ``relay-columnar``: the same through the JVM reader's columnar batches
  (``columnarBatchRows=4096``; ``relay`` reads rows, the default): what they change;
* ``relay-newest``: the same with ``newestPerKey=true``: each partition's read gives one
  row per key per batch, the key's newest change (what the SCD1 MERGE keeps anyway);
* ``relay-python``: the same through the Python source (``format("databus-python")``),
  the reader before the JVM one (``--inputs`` leaves it out);
* ``parquet``: the same ``apply_changes`` reading the same changes dumped once
  to Parquet (not timed): does the source cost anything? (goal >= 0.9);
* ``kafka-way``: what a Debezium -> Kafka -> Spark user writes, fed from
  Parquet holding what Spark's Kafka source gives (``key``/``value`` JSON
  strings of a Debezium-style envelope, dumped once, not timed): parse the
  JSON, keep the newest change per key, one Delta/Iceberg MERGE per batch, no
  exactly-once bookkeeping (goal: relay >= 1.0 of it). Spark's AUTO CDC flow
  is not in the pinned pyspark 4.1 (docs/spark.md), hence this baseline.

Rounds alternate the inputs; each input's best time counts (shared machine), and
beside it the median over rounds of the ratio within the round.
The table also splits that time into the queries' batches (the sum of their
``triggerExecution``) and the rest, outside any batch: query start and stop,
which for the relay input includes the Python process Spark starts per query
for a Python streaming source.
Every resulting table is checked equal to its SQLite table. Then a steady
phase: a writer commits ``--rate`` changes/s to one table for ``--steady``
seconds while a relay -> Delta query runs with a 1 s trigger; the lag of a
batch is the time from the commit of its oldest change to the end of its MERGE.

    .venv/bin/python -m bench.spark_lakehouse [--changes 1000000] [--repeat 2]
        [--formats delta,iceberg] [--steady 30] [--rate 2000]
        [--inputs parquet,relay,relay-newest,relay-columnar,relay-python,kafka-way]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sqlite3
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from bench.spark_apply import RelayProcess
from databus.spark import (
    EvolvingQuery,
    apply_changes,
    changes,
    jvm,
    read_lakehouse,
    register,
    session,
)
from databus.spark.lakehouse import TableApplier
from databus.spark.spec import ApplySpec
from databus.spark.targets import q, table_ident

TABLES = ["t1", "t2", "t3"]
COLS = ["id", "a", "b", "c"]
FLAT = {"sequence_by": "_sequence", "apply_as_deletes": "_op = 'd'",
        "except_column_list": ["_op", "_sequence"]}


def write_changes(db: Path, n: int, seed: int = 1, per_key: int = 4) -> None:
    """``n`` changes spread over the tables: first inserts, then updates and 10% deletes,
    about ``per_key`` changes per key."""
    rng = random.Random(seed)
    keys = max(1, n // (per_key * len(TABLES)))
    con = sqlite3.connect(db, isolation_level=None)
    con.execute("PRAGMA synchronous=OFF")
    live: dict[str, set[int]] = {t: set() for t in TABLES}
    done = 0
    while done < n:
        con.execute("BEGIN")
        for _ in range(min(1000, n - done)):
            t = TABLES[done % len(TABLES)]
            k = rng.randrange(1, keys + 1)
            if k not in live[t]:
                con.execute(f"INSERT INTO {t} VALUES (?,?,?,?)",
                            (k, rng.randrange(10**9), time.time(), f"text-{rng.randrange(10**6)}"))
                live[t].add(k)
            elif rng.random() < 0.1:
                con.execute(f"DELETE FROM {t} WHERE id=?", (k,))
                live[t].discard(k)
            else:
                con.execute(f"UPDATE {t} SET a=?, b=?, c=? WHERE id=?",
                            (rng.randrange(10**9), time.time(), f"upd-{rng.randrange(10**6)}", k))
            done += 1
        con.execute("COMMIT")
    con.close()


def kafka_merge(fmt: str, target: str, schema: str) -> Callable[[DataFrame, int], None]:
    """The hand-written foreachBatch of a Kafka -> Spark CDC pipeline (the baseline)."""
    ident = table_ident(target, fmt)  # type: ignore[arg-type]
    made: list[bool] = []

    def batch(df: DataFrame, _batch_id: int) -> None:
        spark = df.sparkSession
        env = df.select(F.from_json("value", f"struct<before: struct<{schema}>, after: struct<{schema}>, "
                                    "op: string, source: struct<pos: bigint>>").alias("e"))
        rows = env.select(F.coalesce("e.after", "e.before").alias("r"), "e.op",
                          F.col("e.source.pos").alias("pos")).select("r.*", "op", "pos")
        w = Window.partitionBy("id").orderBy(F.col("pos").desc())
        top = rows.withColumn("n", F.row_number().over(w)).where("n = 1").drop("n")
        if not made:
            spark.sql(f"CREATE TABLE IF NOT EXISTS {ident} ({schema.replace(':', '')}) "
                      f"USING {fmt}")
            made.append(True)
        top.createOrReplaceTempView("kafka_batch")
        cols = ", ".join(q(c) for c in COLS)
        spark.sql(f"MERGE INTO {ident} t USING kafka_batch s ON t.id = s.id "
                  "WHEN MATCHED AND s.op = 'd' THEN DELETE "
                  f"WHEN MATCHED THEN UPDATE SET {', '.join(f'{c} = s.{c}' for c in COLS)} "
                  f"WHEN NOT MATCHED AND s.op != 'd' THEN INSERT ({cols}) "
                  f"VALUES ({', '.join('s.' + c for c in COLS)})")

    return batch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--changes", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--formats", default="delta,iceberg")
    ap.add_argument("--steady", type=float, default=30.0, help="seconds of the steady phase")
    ap.add_argument("--rate", type=int, default=2000, help="changes/s in the steady phase")
    ap.add_argument("--inputs", default="parquet,relay,relay-python,kafka-way")
    ap.add_argument("--changes-per-key", type=int, default=4,
                    help="changes per key (the tables hold changes/this/3 keys each)")
    args = ap.parse_args()
    inputs = args.inputs.split(",")
    formats = args.formats.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="databus-lakebench-"))
    db = tmp / "src.db"
    con = sqlite3.connect(db)
    for t in TABLES:
        con.execute(f"CREATE TABLE {t} (id INTEGER PRIMARY KEY, a INTEGER, b REAL, c TEXT)")
    con.close()
    t0 = time.perf_counter()
    relay = RelayProcess(db, tmp, TABLES)
    try:
        write_changes(db, args.changes, per_key=args.changes_per_key)
        top = sqlite3.connect(db).execute("SELECT max(scn) FROM _databus_txlog").fetchone()[0]
        while relay.max_scn() < top:
            time.sleep(0.1)
        windows = httpx.get(f"{relay.url}/containerStats/buffer/windows", timeout=10).json()
        print(f"setup: {args.changes} changes on {len(TABLES)} tables committed and captured in "
              f"{time.perf_counter() - t0:.1f}s, {windows} relay windows", flush=True)
        spark: SparkSession = session(
            "databus-lakebench", master="local[2]", lakehouse=formats,
            warehouse=tmp / "iceberg",
            conf={"spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false",
                  "spark.driver.memory": "4g", "spark.ui.showConsoleProgress": "false",
                  "spark.sql.session.timeZone": "UTC"})
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        want = {t: sorted(sqlite3.connect(db).execute(f"SELECT * FROM {t}").fetchall())
                for t in TABLES}

        print(f"format(\"databus\") is the {'JVM' if jvm.active(spark) else 'Python'} reader, "
              f"Spark {spark.version}", flush=True)

        def relay_stream(t: str, fmt: str = "databus", **opts: str) -> DataFrame:
            return (spark.readStream.format(fmt).option("relay", relay.url)
                    .option("sources", t).option("partitions", 2).option("envelope", "flat")
                    .options(**opts).load())

        # the inputs of the two baselines, dumped once (not timed)
        schemas: dict[str, object] = {}
        kafka_schemas: dict[str, object] = {}
        row_ddl = "struct<id: bigint, a: bigint, b: double, c: string>"
        for t in TABLES:
            src = changes(spark.readStream.format("databus").option("relay", relay.url)
                          .option("sources", t).option("partitions", 2).load())
            qq = (src.writeStream.format("parquet").option("path", str(tmp / f"dump-{t}"))
                  .option("checkpointLocation", str(tmp / f"dump-{t}.ckpt"))
                  .trigger(availableNow=True).start())
            qq.awaitTermination()
            schemas[t] = spark.read.parquet(str(tmp / f"dump-{t}")).schema
            env = spark.readStream.format("databus").option("relay", relay.url).option(
                "sources", t).option("partitions", 2).load()
            kafka = env.select(
                F.col("key").cast("string").alias("key"),
                F.to_json(F.struct("before", "after", "op", F.struct(
                    (F.col("sequence.scn") * 1_000_000 + F.col("sequence.index")).alias("pos")
                ).alias("source"))).alias("value"))
            qq = (kafka.writeStream.format("parquet").option("path", str(tmp / f"kafka-{t}"))
                  .option("checkpointLocation", str(tmp / f"kafka-{t}.ckpt"))
                  .trigger(availableNow=True).start())
            qq.awaitTermination()
            kafka_schemas[t] = spark.read.parquet(str(tmp / f"kafka-{t}")).schema

        def target(fmt: str, name: str, t: str) -> str:
            return str(tmp / f"{name}-{t}") if fmt == "delta" else f"local.bench.{name}_{t}"

        def run(fmt: str, kind: str, name: str) -> tuple[float, float]:
            """Seconds from the first start to the last end, and those inside batches."""
            start = time.perf_counter()
            in_batches = 0.0
            qq: StreamingQuery | EvolvingQuery
            for t in TABLES:
                ckpt = str(tmp / f"{name}-{t}.ckpt")
                if kind == "kafka-way":
                    src = spark.readStream.schema(kafka_schemas[t]).parquet(  # type: ignore[arg-type]
                        str(tmp / f"kafka-{t}"))
                    qq = (src.writeStream.foreachBatch(
                        kafka_merge(fmt, target(fmt, name, t), row_ddl[7:-1]))
                        .option("checkpointLocation", ckpt).trigger(availableNow=True).start())
                else:
                    src = (relay_stream(t) if kind == "relay" else relay_stream(t, "databus-python")
                           if kind == "relay-python" else relay_stream(t, columnarBatchRows="4096")
                           if kind == "relay-columnar" else relay_stream(t, newestPerKey="true")
                           if kind == "relay-newest" else spark.readStream.schema(
                               schemas[t]).parquet(str(tmp / f"dump-{t}")))  # type: ignore[arg-type]
                    qq = apply_changes(target=target(fmt, name, t), source=src, keys=["id"],
                                       format=fmt, checkpoint_location=ckpt,  # type: ignore[arg-type]
                                       trigger={"availableNow": True}, **FLAT)  # type: ignore[arg-type]
                qq.awaitTermination()
                if qq.exception() is not None:
                    raise SystemExit(f"{name} failed: {qq.exception()}")
                in_batches += sum(p["durationMs"].get("triggerExecution", 0)
                                  for p in qq.recentProgress) / 1000
            return time.perf_counter() - start, in_batches

        def check(fmt: str, name: str) -> None:
            for t in TABLES:
                df = read_lakehouse(spark, target(fmt, name, t), fmt)  # type: ignore[arg-type]
                got = sorted(tuple(r) for r in df.select(*COLS).collect())
                assert got == want[t], f"{name} {t}: table differs from the source"

        results: dict[tuple[str, str], list[float]] = {}
        batch_secs: dict[tuple[str, str], list[float]] = {}
        # JIT, Python workers, the source's imports: not timed (without the relay warm-up
        # the first relay input measured ~1.9x slower than the same input later in a run)
        run(formats[0], "parquet", "warm")
        for kind in inputs:
            if kind.startswith("relay"):
                run(formats[0], kind, "warm" + kind.replace("-", ""))
        for round_ in range(args.repeat):
            for fmt in formats:
                for kind in inputs:
                    name = f"{fmt}-{kind}-{round_}".replace("-", "_")
                    secs, inside = run(fmt, kind, name)
                    check(fmt, name)
                    load = os.getloadavg()[0]
                    print(f"round {round_}: {fmt} {kind} {secs:.2f}s ({inside:.2f}s in batches, "
                          f"load average {load:.1f})", flush=True)
                    results.setdefault((fmt, kind), []).append(secs)
                    batch_secs.setdefault((fmt, kind), []).append(inside)
        n = args.changes
        # "outside" = query start-up and shutdown: for the relay input, mostly the Python
        # process Spark starts per query for a Python streaming source (docs/spark.md)
        print(f"\n{'format':<8} | {'input':<10} | {'best s':>7} | {'changes/s':>10} | "
              f"{'in batches':>10} | {'outside':>7} | all runs (s)")
        for (fmt, kind), times in results.items():
            best = min(times)
            inside = batch_secs[(fmt, kind)][times.index(best)]
            print(f"{fmt:<8} | {kind:<10} | {best:>7.2f} | {n / best:>10,.0f} | "
                  f"{inside:>10.2f} | {best - inside:>7.2f} | "
                  + ", ".join(f"{s:.2f}" for s in times))
        # best against best, and the median of the ratios within each round (the load of a
        # shared machine drifts between rounds; within a round the inputs run minutes apart)
        for fmt in formats:
            for kind in (k for k in inputs if k.startswith("relay")):
                mine = results[(fmt, kind)]
                ratios = [f"{kind} / {base}: {min(results[(fmt, base)]) / min(mine):.2f}x best, "
                          f"{statistics.median(b / r for b, r in zip(results[(fmt, base)], mine, strict=True)):.2f}x "
                          f"median of rounds (goal {goal})"
                          for base, goal in (("parquet", ">= 1.2, #34"), ("kafka-way", ">= 2.0, #34"),
                                             ("relay", "none"))
                          if base != kind
                          if (fmt, base) in results]
                print(f"{fmt}: " + "; ".join(ratios))

        if args.steady > 0:
            steady(spark, relay, db, tmp, args.steady, args.rate)
    finally:
        relay.stop()
    shutil.rmtree(tmp, ignore_errors=True)


def steady(spark: SparkSession, relay: RelayProcess, db: Path, tmp: Path, seconds: float,
           rate: int) -> None:
    """Lag at a steady write rate: relay -> Delta SCD1, 1 s trigger."""
    spec = ApplySpec(target=str(tmp / "steady"), keys=("id",), sequence_by="_sequence",
                     apply_as_deletes="_op = 'd'", except_column_list=("_op", "_sequence"))
    applier = TableApplier(spec, "delta", lambda: "bench-steady")
    lags: list[float] = []
    rows: list[int] = []

    def batch(df: DataFrame, batch_id: int) -> None:
        df = df.persist()
        oldest = df.agg(F.min("b"), F.count(F.lit(1))).first()
        applier(df, batch_id)
        df.unpersist()
        if oldest is not None and oldest[1]:
            lags.append(time.time() - oldest[0])
            rows.append(int(oldest[1]))

    src = (spark.readStream.format("databus").option("relay", relay.url).option("sources", "t1")
           .option("partitions", 2).option("envelope", "flat")
           .option("startingPosition", "latest").load())
    qq = (src.writeStream.foreachBatch(batch).option("checkpointLocation", str(tmp / "st.ckpt"))
          .trigger(processingTime="1 second").start())
    stop = threading.Event()

    def write() -> None:
        rng = random.Random(3)
        con = sqlite3.connect(db, isolation_level=None)
        per_txn = max(1, rate // 20)
        while not stop.is_set():
            t0 = time.monotonic()
            con.execute("BEGIN")
            for _ in range(per_txn):
                con.execute("UPDATE t1 SET a=?, b=? WHERE id=?",
                            (rng.randrange(10**9), time.time(), rng.randrange(1, 1000)))
            con.execute("COMMIT")
            stop.wait(max(0.0, 0.05 - (time.monotonic() - t0)))
        con.close()

    time.sleep(5)  # the query's first (empty) batches
    writer = threading.Thread(target=write)
    writer.start()
    time.sleep(seconds)
    stop.set()
    writer.join()
    time.sleep(5)
    qq.stop()
    steady_lags = lags[2:] or lags  # the first batches include the query's warm-up
    print(f"\nsteady phase: {rate} changes/s for {seconds:.0f}s into Delta SCD1 (1 s trigger): "
          f"{len(lags)} batches, {sum(rows)} changes; lag from commit to merged: "
          f"p50 {statistics.median(steady_lags):.2f}s, max {max(steady_lags):.2f}s")


if __name__ == "__main__":
    main()
