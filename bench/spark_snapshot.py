"""``databus-snapshot`` read throughput: rows/s from a bootstrap store into Spark.

A SQLite bootstrap store holds N snapshot rows (the 4-column table of
:mod:`bench.bootstrap_snapshot`, ~150-byte events). Each run materialises the
whole DataFrame (``write.format("noop")``, every column decoded) on
``local[2]``:

* ``databus-snapshot`` read by the JVM reader (the default: ``store`` = the
  bootstrap server's URL; a :class:`BootstrapServer` over the same store, served
  over HTTP by a thread of this process) with 1, 2 (one per core) and 4
  partitions (HTTP pages of stored events, decoded in the executors' JVM);
* ``databus-snapshot-python`` (``store`` = the SQLAlchemy URL) with 1, 2 and 4
  partitions (store queries, the compiled decoder, Arrow batches);
* baseline 1: the same rows (``after.*``) read from a Parquet file by Spark
  (what Spark's own columnar reader achieves on this machine);
* baseline 2: ``SELECT *`` of the snapshot table through the store's
  SQLAlchemy engine in the driver, rows fetched and dropped (no decoding);
* floor: a Python data source that yields one row: what any query through
  Spark's Python data source API costs before it reads anything (planning
  round trips to Python workers, the task's worker, the Arrow stream back).
  A databus-snapshot run minus the floor is its per-row part.

    .venv/bin/python -m bench.spark_snapshot [--rows 200000] [--runs 3]

Each figure is the best of ``--runs`` interleaved runs; the row count of every
Spark run is checked. The last lines are the best run of each reader against
baseline 1; the very last is the default reader's (the JVM one):
``ratio snapshot/parquet: X``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from starlette.applications import Starlette

from bench.bootstrap_snapshot import fill
from databus.bootstrap.server import BootstrapServer, build_app
from databus.bootstrap.store import BootstrapStore
from databus.serving import HttpServerConfig, HttpService
from databus.spark import jvm, register_snapshot


class StoreServer(HttpService):
    """The bootstrap server's HTTP API over the bench's store (no producer, no applier)."""

    def __init__(self, url: str) -> None:
        super().__init__(HttpServerConfig(), "bootstrap")
        self.store = BootstrapStore(url, create=False)

    def build_app(self) -> Starlette:
        return build_app(BootstrapServer(self.store))

    async def on_shutdown(self) -> None:
        self.store.close()


def session() -> SparkSession:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    reader = jvm.jar()
    if reader is None:
        raise SystemExit("the JVM reader could not be built here (a JDK 17 is needed)")
    spark = (SparkSession.builder.master("local[2]").appName("databus-bench-snapshot")
             .config("spark.jars", str(reader))
             .config("spark.ui.enabled", "false").config("spark.driver.memory", "2g")
             .config("spark.ui.showConsoleProgress", "false")
             # as databus.spark.session() sets it: workers import pyspark from its package
             .config("spark.python.daemon.module", "databus.spark.workerd").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register_snapshot(spark)
    spark.dataSource.register(OneRowSource)
    return spark


class _OneRowReader(DataSourceReader):
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield pa.RecordBatch.from_pydict({"x": [1]})


class OneRowSource(DataSource):
    """The floor: a Python data source of one row, one partition."""

    @classmethod
    def name(cls) -> str:
        return "databus-bench-one-row"

    def schema(self) -> str:
        return "x long"

    def reader(self, schema: object) -> DataSourceReader:
        return _OneRowReader()


def timed(df: Callable[[], DataFrame], rows: int) -> float:
    """Seconds to materialise every column of ``df()``; checks it has ``rows`` rows."""
    start = time.perf_counter()
    frame = df()
    frame.write.format("noop").mode("overwrite").save()
    secs = time.perf_counter() - start
    assert frame.count() == rows
    return secs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        url = f"sqlite:///{tmp / 'bs.db'}"
        store = BootstrapStore(url)
        fill(store, args.rows)
        spark = session()
        server = StoreServer(url)
        server.start()

        def snap(parts: int) -> DataFrame:
            return (spark.read.format("databus-snapshot-python").option("store", url)
                    .option("sources", "bench.rows").option("partitions", parts).load())

        def jsnap(parts: int) -> DataFrame:
            return (spark.read.format("databus-snapshot").option("store", server.url)
                    .option("sources", "bench.rows").option("partitions", parts).load())

        snap(2).select("after.*").write.parquet(str(tmp / "rows.parquet"))
        timed(lambda: snap(2), args.rows)  # warm the Python workers
        timed(lambda: jsnap(2), args.rows)  # and the JVM reader's classes
        cases: dict[str, Callable[[], float]] = {
            "SELECT * in the driver (baseline 2)": lambda: _select(store, args.rows),
            "Parquet file (baseline 1)": lambda: timed(
                lambda: spark.read.parquet(str(tmp / "rows.parquet")), args.rows),
            "one-row Python data source (floor)": lambda: timed(
                lambda: spark.read.format(OneRowSource.name()).load(), 1),
            "databus-snapshot JVM, 1 partition": lambda: timed(lambda: jsnap(1), args.rows),
            "databus-snapshot JVM, 2 partitions": lambda: timed(lambda: jsnap(2), args.rows),
            "databus-snapshot JVM, 4 partitions": lambda: timed(lambda: jsnap(4), args.rows),
            "databus-snapshot-python, 1 partition": lambda: timed(lambda: snap(1), args.rows),
            "databus-snapshot-python, 2 partitions": lambda: timed(lambda: snap(2), args.rows),
            "databus-snapshot-python, 4 partitions": lambda: timed(lambda: snap(4), args.rows),
        }
        best = {name: float("inf") for name in cases}
        for _ in range(args.runs):
            for name, run in cases.items():
                best[name] = min(best[name], run())
        spark.stop()
        server.stop()
        store.close()
    base1 = best["Parquet file (baseline 1)"]
    base2 = best["SELECT * in the driver (baseline 2)"]
    floor = best.pop("one-row Python data source (floor)")
    print(f"{'input':38} | {'rows':>8} | {'seconds':>7} | {'rows/s':>9} | vs 1 | vs 2")
    for name, secs in best.items():
        print(f"{name:38} | {args.rows:8d} | {secs:7.2f} | {args.rows / secs:9,.0f} | "
              f"{base1 / secs:4.2f} | {base2 / secs:4.2f}")
    python = min(secs for name, secs in best.items()
                 if name.startswith("databus-snapshot-python"))
    fastest = min(secs for name, secs in best.items() if name.startswith("databus-snapshot JVM"))
    print(f"one-row Python data source (floor): {floor:.2f} s, {floor / python:.0%} of the "
          f"fastest databus-snapshot-python run; beyond it "
          f"{args.rows / max(python - floor, 1e-9):,.0f} rows/s")
    print(f"ratio python-snapshot/parquet: {base1 / python:.2f}")
    print(f"ratio snapshot/parquet: {base1 / fastest:.2f}")


def _select(store: BootstrapStore, rows: int) -> float:
    start = time.perf_counter()
    got = store.select_all_snapshot()
    secs = time.perf_counter() - start
    assert got == rows
    return secs


if __name__ == "__main__":
    main()
