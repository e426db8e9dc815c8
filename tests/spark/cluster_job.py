"""A Spark application as a user submits it (tests/spark/test_cluster_submit.py):

    spark-submit --master spark://... --jars user.jar cluster_job.py RELAY OUT

``databus.spark.session()`` under spark-submit, the relay's ``customers`` applied into a
Delta table (availableNow), then a query of ``orders`` started on that query's checkpoint.
Writes ``OUT/report.json``: the session's master and jars, where pyspark was imported
from, which reader served, the table's rows, and the error of the reused checkpoint.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pyspark

from databus.core.errors import DatabusError
from databus.spark import apply_changes, errors, jvm, read_lakehouse, register, session


def main(relay: str, out: Path) -> None:
    t0 = time.monotonic()

    def mark(what: str) -> None:  # in the job's log: where its time goes
        print(f"cluster_job: {time.monotonic() - t0:6.1f}s {what}", flush=True)

    spark = session("databus-cluster-job", lakehouse=["delta"],
                    conf={"spark.executor.memory": "512m", "spark.sql.shuffle.partitions": "2",
                          "spark.ui.enabled": "false", "spark.sql.session.timeZone": "UTC"})
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    mark("session")
    gw = spark.sparkContext._jvm
    assert gw is not None
    loader = gw.java.lang.Thread.currentThread().getContextClassLoader()
    report: dict[str, Any] = {
        "pyspark": pyspark.__file__,
        "master": spark.sparkContext.master,
        "jars": spark.conf.get("spark.jars"),
        "user_jar_on_driver": loader.getResource("databus-user-marker.txt") is not None,
        "jvm_active": jvm.active(spark),
    }

    def apply(table: str, ckpt: Path) -> Any:
        flat = (spark.readStream.format("databus").option("relay", relay)
                .option("sources", table).option("partitions", 2).option("envelope", "flat")
                .load())
        q = apply_changes(target=str(out / table), format="delta", source=flat, keys=["id"],
                          sequence_by="_sequence", apply_as_deletes="_op = 'd'",
                          except_column_list=["_op", "_sequence"],
                          checkpoint_location=str(ckpt), trigger={"availableNow": True})
        q.awaitTermination()
        return q

    q = apply("customers", out / "ckpt")
    mark("customers applied")
    report["served_by"] = jvm.served_by(q)
    jsc = spark.sparkContext._jsc
    assert jsc is not None
    report["executors"] = jsc.sc().getExecutorMemoryStatus().size() - 1  # the driver's too
    report["rows"] = [list(r) for r in read_lakehouse(spark, str(out / "customers"), "delta")
                      .select("id", "name", "balance", "tx").collect()]
    mark("table read")
    try:
        with errors():
            apply("orders", out / "ckpt")  # the customers query's checkpoint
        report["reused"] = None
    except DatabusError as exc:
        report["reused"] = {"type": type(exc).__name__, "message": str(exc)}
    mark("reused checkpoint tried")
    (out / "report.json").write_text(json.dumps(report))
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
