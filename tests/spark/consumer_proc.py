"""A Spark driver process for crash tests: applies a relay's ``customers`` changes.

    python -m tests.spark.consumer_proc RELAY_URL TARGET CHECKPOINT

Runs until killed (the test SIGKILLs its whole process group: this Python
driver, the JVM and the Python workers).
"""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from databus.spark import apply_changes, changes, register


def main() -> None:
    url, target, ckpt = sys.argv[1:4]
    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (SparkSession.builder.master("local[2]").appName("databus-crash")
             .config("spark.sql.shuffle.partitions", "4").config("spark.ui.enabled", "false")
             .config("spark.driver.memory", "1g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    src = (spark.readStream.format("databus").option("relay", url)
           .option("sources", "customers").option("partitions", 4)
           .option("maxRowsPerBatch", 200).load())
    q = apply_changes(target=target, source=changes(src), keys=["id"], sequence_by="_sequence",
                      apply_as_deletes="_op = 'd'", except_column_list=["_op", "_sequence"],
                      checkpoint_location=ckpt, trigger={"processingTime": "200 milliseconds"})
    print("started", flush=True)
    q.awaitTermination()


if __name__ == "__main__":
    main()
