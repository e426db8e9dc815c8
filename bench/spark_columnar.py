"""The JVM reader's columnar batches against its row reader: N changes read from a relay.

N changes (inserts, then updates and 10% deletes over N/4 keys, 1,000 per transaction,
``bench.spark_apply``'s workload) are committed to a SQLite table captured by a relay
process. One ``local[2]`` Spark session (``databus.spark.session()``: the JVM reader)
then reads them all with one availableNow query per run, ``format("databus")``,
``partitions=2``, into a sink, two ways:

* ``rows``: ``columnarBatchRows=0``, the row reader (an ``InternalRow`` per change);
* ``columnar``: ``columnarBatchRows=4096`` (the default), Spark column vectors.

Sinks: ``noop`` (Spark's ``format("noop")``: the rows are produced and dropped, so the
read is all that is measured) and ``parquet`` (a fresh Parquet directory per run). Each
(envelope, sink, reader) runs ``--repeat`` times, the readers alternating within a
round; each one's best time counts (shared machine), and the ratio is rows / columnar
time (> 1: columnar is faster). Every run's row count is checked against the relay's.

    .venv/bin/python -m bench.spark_columnar [--changes 1000000] [--repeat 3]
        [--envelopes flat,full] [--sinks noop,parquet]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from pyspark.sql import SparkSession

from bench.spark_apply import captured_changes
from databus.spark import jvm, session

READERS = {"rows": 0, "columnar": 4096}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--changes", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--envelopes", default="flat,full")
    ap.add_argument("--sinks", default="noop,parquet")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="databus-colbench-"))
    t0 = time.perf_counter()
    _db, relay = captured_changes(tmp, args.changes)
    try:
        print(f"setup: {args.changes} changes committed and captured in "
              f"{time.perf_counter() - t0:.1f}s", flush=True)
        os.environ["PYSPARK_PYTHON"] = sys.executable
        spark: SparkSession = session(
            "databus-colbench", master="local[2]",
            conf={"spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false",
                  "spark.driver.memory": "4g", "spark.ui.showConsoleProgress": "false",
                  "spark.sql.session.timeZone": "UTC"})
        spark.sparkContext.setLogLevel("ERROR")
        if not jvm.active(spark):
            raise SystemExit("the JVM reader is not active (no JDK?): nothing to compare")
        runs = 0

        def run(envelope: str, sink: str, rows: int) -> float:
            nonlocal runs
            runs += 1
            df = (spark.readStream.format("databus").option("relay", relay.url)
                  .option("sources", "t").option("partitions", 2).option("envelope", envelope)
                  .option("columnarBatchRows", rows).load())
            w = df.writeStream.format(sink).option(
                "checkpointLocation", str(tmp / f"ckpt-{runs}")).trigger(availableNow=True)
            if sink == "parquet":
                w = w.option("path", str(tmp / f"out-{runs}"))
            start = time.perf_counter()
            q = w.start()
            q.awaitTermination()
            secs = time.perf_counter() - start
            if q.exception() is not None:
                raise SystemExit(f"run failed: {q.exception()}")
            got = sum(p["numInputRows"] for p in q.recentProgress)
            if got != args.changes:
                raise SystemExit(f"read {got} changes, want {args.changes}")
            shutil.rmtree(tmp / f"out-{runs}", ignore_errors=True)
            shutil.rmtree(tmp / f"ckpt-{runs}", ignore_errors=True)
            return secs

        envelopes = args.envelopes.split(",")
        sinks = args.sinks.split(",")
        for rows in READERS.values():  # JIT and the first query's set-up: not timed
            run(envelopes[0], "noop", rows)
        results: dict[tuple[str, str, str], list[float]] = {}
        for round_ in range(args.repeat):
            for envelope in envelopes:
                for sink in sinks:
                    for reader, rows in READERS.items():
                        secs = run(envelope, sink, rows)
                        results.setdefault((envelope, sink, reader), []).append(secs)
                        print(f"round {round_}: {envelope} {sink} {reader} {secs:.2f}s "
                              f"(load average {os.getloadavg()[0]:.1f})", flush=True)
        n = args.changes
        print(f"\n{'envelope':<8} | {'sink':<8} | {'reader':<8} | {'best s':>7} | "
              f"{'changes/s':>10} | all runs (s)")
        for (envelope, sink, reader), times in results.items():
            best = min(times)
            print(f"{envelope:<8} | {sink:<8} | {reader:<8} | {best:>7.2f} | {n / best:>10,.0f} | "
                  + ", ".join(f"{s:.2f}" for s in times))
        for envelope in envelopes:
            for sink in sinks:
                ratio = (min(results[(envelope, sink, "rows")])
                         / min(results[(envelope, sink, "columnar")]))
                print(f"{envelope} into {sink}: columnar / rows throughput {ratio:.2f}x best of "
                      f"{args.repeat}")
    finally:
        relay.stop()
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
