"""``databus-snapshot`` read throughput: rows/s from a bootstrap store into Spark.

A SQLite bootstrap store holds N snapshot rows (the 4-column table of
:mod:`bench.bootstrap_snapshot`, ~150-byte events). Each run materialises the
whole DataFrame (``write.format("noop")``, every column decoded) on
``local[2]``:

* ``databus-snapshot`` with 1 and 4 partitions (store queries, Avro decoding,
  Arrow batches);
* baseline 1: the same rows (``after.*``) read from a Parquet file by Spark
  (what Spark's own columnar reader achieves on this machine);
* baseline 2: ``SELECT *`` of the snapshot table through the store's
  SQLAlchemy engine in the driver, rows fetched and dropped (no decoding).

    .venv/bin/python -m bench.spark_snapshot [--rows 200000] [--runs 2]

Each figure is the best of ``--runs`` interleaved runs; the row count of every
Spark run is checked.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from bench.bootstrap_snapshot import fill
from databus.bootstrap.store import BootstrapStore
from databus.spark import register_snapshot


def session() -> SparkSession:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (SparkSession.builder.master("local[2]").appName("databus-bench-snapshot")
             .config("spark.ui.enabled", "false").config("spark.driver.memory", "2g")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register_snapshot(spark)
    return spark


def timed(df: Callable[[], DataFrame], rows: int) -> float:
    start = time.perf_counter()
    frame = df()
    frame.write.format("noop").mode("overwrite").save()
    secs = time.perf_counter() - start
    assert frame.count() == rows
    return secs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        url = f"sqlite:///{tmp / 'bs.db'}"
        store = BootstrapStore(url)
        fill(store, args.rows)
        spark = session()

        def snap(parts: int) -> DataFrame:
            return (spark.read.format("databus-snapshot").option("store", url)
                    .option("sources", "bench.rows").option("partitions", parts).load())

        snap(2).select("after.*").write.parquet(str(tmp / "rows.parquet"))
        timed(lambda: snap(2), args.rows)  # warm the Python workers
        cases: dict[str, Callable[[], float]] = {
            "SELECT * in the driver (baseline 2)": lambda: _select(store, args.rows),
            "Parquet file (baseline 1)": lambda: timed(
                lambda: spark.read.parquet(str(tmp / "rows.parquet")), args.rows),
            "databus-snapshot, 1 partition": lambda: timed(lambda: snap(1), args.rows),
            "databus-snapshot, 4 partitions": lambda: timed(lambda: snap(4), args.rows),
        }
        best = {name: float("inf") for name in cases}
        for _ in range(args.runs):
            for name, run in cases.items():
                best[name] = min(best[name], run())
        spark.stop()
        store.close()
    base1 = best["Parquet file (baseline 1)"]
    base2 = best["SELECT * in the driver (baseline 2)"]
    print(f"{'input':38} | {'rows':>8} | {'seconds':>7} | {'rows/s':>9} | vs 1 | vs 2")
    for name, secs in best.items():
        print(f"{name:38} | {args.rows:8d} | {secs:7.2f} | {args.rows / secs:9,.0f} | "
              f"{base1 / secs:4.2f} | {base2 / secs:4.2f}")


def _select(store: BootstrapStore, rows: int) -> float:
    start = time.perf_counter()
    got = store.select_all_snapshot()
    secs = time.perf_counter() - start
    assert got == rows
    return secs


if __name__ == "__main__":
    main()
