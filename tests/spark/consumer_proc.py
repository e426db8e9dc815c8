"""A Spark driver process for crash tests: applies a relay's changes to a table.

    python -m tests.spark.consumer_proc RELAY_URL TARGET CHECKPOINT
    python -m tests.spark.consumer_proc RELAY_URL TARGETS CHECKPOINT FORMATS SCD SOURCE WAREHOUSE

The first form applies ``customers`` into a Parquet table (SCD1); the second
applies SOURCE into one table per format of FORMATS (``delta,iceberg``: one
query each, TARGETS in the same order, checkpoints ``CHECKPOINT-<format>``;
Iceberg catalog ``local`` at WAREHOUSE). With ``KILL_AFTER_COMMIT=N`` in the
environment the process kills its own process group right after the N-th table
commit of its queries, before Spark records that batch in the checkpoint: the
crash the exactly-once argument is about.

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
from tests.support.sparkrelay import LEAN_JVM

CONF = {"spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false",
        "spark.driver.memory": "1g", **LEAN_JVM}


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
        s = session("databus-crash", master="local[2]", lakehouse=fmt.split(","),
                    warehouse=warehouse, conf=CONF)
    s.sparkContext.setLogLevel("ERROR")
    register(s)

    def src() -> DataFrame:
        return changes(s.readStream.format("databus").option("relay", url)
                       .option("sources", source).option("partitions", 4)
                       .option("maxRowsPerBatch", 200).load())

    flat = {"sequence_by": "_sequence", "apply_as_deletes": "_op = 'd'",
            "except_column_list": ("_op", "_sequence")}
    if fmt == "parquet":
        q = apply_changes(target=target, source=src(), keys=["id"], checkpoint_location=ckpt,
                          trigger={"processingTime": "200 milliseconds"}, **flat)  # type: ignore[arg-type]
    else:
        kill_after = int(os.environ.get("KILL_AFTER_COMMIT", "0"))
        appliers: list[TableApplier] = []
        for one, one_target in zip(fmt.split(","), target.split(","), strict=True):
            one_ckpt = f"{ckpt}-{one}"
            applier = TableApplier(ApplySpec(target=one_target, keys=("id",),
                                             stored_as_scd_type=int(scd), **flat),  # type: ignore[arg-type]
                                   one, query_app_id(one_ckpt))  # type: ignore[arg-type]
            appliers.append(applier)

            def batch(df: DataFrame, batch_id: int, applier: TableApplier = applier) -> None:
                applier(df, batch_id)
                if kill_after and sum(a.batches for a in appliers) >= kill_after:
                    print(f"killed after committing batch {batch_id} to {applier.ident}",
                          flush=True)
                    os.killpg(0, signal.SIGKILL)

            q = (src().writeStream.foreachBatch(batch).option("checkpointLocation", one_ckpt)
                 .trigger(processingTime="200 milliseconds").start())
    print("started", flush=True)
    q.awaitTermination()


if __name__ == "__main__":
    main()
