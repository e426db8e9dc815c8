"""A Spark driver process for crash tests: applies a relay's changes to a table.

    python -m tests.spark.consumer_proc RELAY_URL TARGET CHECKPOINT
    python -m tests.spark.consumer_proc RELAY_URL TARGET CHECKPOINT FORMAT SCD SOURCE WAREHOUSE

The first form applies ``customers`` into a Parquet table (SCD1); the second
applies SOURCE into a Delta or Iceberg table (Iceberg catalog ``local`` at
WAREHOUSE). With ``KILL_AFTER_COMMIT=N`` in the environment the process kills
its own process group right after its N-th table commit, before Spark records
the batch in the checkpoint: the crash the exactly-once argument is about.

Runs until killed (the test SIGKILLs its whole process group: this Python
driver, the JVM and the Python workers).
"""

from __future__ import annotations

import os
import signal
import sys

from pyspark.sql import DataFrame, SparkSession

from databus.spark import apply_changes, changes, register, session
from databus.spark.lakehouse import TableApplier, query_app_id
from databus.spark.spec import ApplySpec

CONF = {"spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false",
        "spark.driver.memory": "1g"}


def main() -> None:
    url, target, ckpt = sys.argv[1:4]
    fmt, scd, source, warehouse = (sys.argv[4:8] if len(sys.argv) > 4
                                   else ("parquet", "1", "customers", ""))
    os.environ["PYSPARK_PYTHON"] = sys.executable
    if fmt == "parquet":
        spark = SparkSession.builder.master("local[2]").appName("databus-crash")
        for k, v in CONF.items():
            spark = spark.config(k, v)
        s = spark.getOrCreate()
    else:
        s = session("databus-crash", master="local[2]", lakehouse=[fmt], warehouse=warehouse,
                    conf=CONF)
    s.sparkContext.setLogLevel("ERROR")
    register(s)
    src = changes(s.readStream.format("databus").option("relay", url)
                  .option("sources", source).option("partitions", 4)
                  .option("maxRowsPerBatch", 200).load())
    flat = {"sequence_by": "_sequence", "apply_as_deletes": "_op = 'd'",
            "except_column_list": ("_op", "_sequence")}
    if fmt == "parquet":
        q = apply_changes(target=target, source=src, keys=["id"], checkpoint_location=ckpt,
                          trigger={"processingTime": "200 milliseconds"}, **flat)  # type: ignore[arg-type]
    else:
        applier = TableApplier(ApplySpec(target=target, keys=("id",), stored_as_scd_type=int(scd),
                                         **flat), fmt, query_app_id(ckpt))  # type: ignore[arg-type]
        kill_after = int(os.environ.get("KILL_AFTER_COMMIT", "0"))

        def batch(df: DataFrame, batch_id: int) -> None:
            applier(df, batch_id)
            if kill_after and applier.batches >= kill_after:
                print(f"killed after committing batch {batch_id}", flush=True)
                os.killpg(0, signal.SIGKILL)

        q = (src.writeStream.foreachBatch(batch).option("checkpointLocation", ckpt)
             .trigger(processingTime="200 milliseconds").start())
    print("started", flush=True)
    q.awaitTermination()


if __name__ == "__main__":
    main()
