"""A Spark application submitted to the standalone cluster by
tests/spark/test_cluster_pipelines.py:

    spark-submit --master spark://... cluster_pipeline_job.py MODE RELAY OUT

``MODE`` ``formats``: for each reader (the JVM reader and the Python source, whose
executors import databus) and each lakehouse format of the Spark line (Delta, Iceberg on
4.1; Delta on 4.2), the relay's ``customers`` applied by ``apply_changes`` (SCD1,
availableNow); on a line with Spark's changelog API (4.2) also ``readStream.changes`` of
the relay's catalog (``io.databus.spark.DatabusCatalog``) applied into Delta with no column
mapping. Writes ``OUT/report.json`` with each table's rows, the reader that served it and
the last progress of each JVM reader query (its lag metrics and description).

``MODE`` ``kill``: one query (JVM reader, Delta, 25 rows a batch, availableNow) whose second
batch runs tasks on both workers that wait (``OUT/holding`` says they started) until the
test has SIGKILLed a worker and its executor (``OUT/worker-killed``): the batch's lost tasks run
again on the remaining worker, the query must finish there; writes the table's rows and the
batches run to ``OUT/report.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from databus.spark import apply_changes, jvm, lines, read_lakehouse, register, session
from databus.spark.lakehouse import TableApplier
from databus.spark.spec import ApplySpec


def main(mode: str, relay: str, out: Path, source: str = "") -> None:
    line = lines.current()
    conf = {"spark.executor.memory": "512m", "spark.sql.shuffle.partitions": "2",
            "spark.ui.enabled": "false", "spark.sql.session.timeZone": "UTC",
            "spark.task.maxFailures": "8"}
    if line.changelog:  # the relay as a catalog: Spark's changelog API (4.2)
        conf.update({"spark.sql.catalog.databus": "io.databus.spark.DatabusCatalog",
                     "spark.sql.catalog.databus.relay": relay,
                     "spark.sql.catalog.databus.partitions": "2"})
    spark = session(f"databus-cluster-{mode}", warehouse=out / "iceberg", conf=conf)
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    report: dict[str, Any] = {}

    def read(fmt_name: str, **opts: object) -> Any:
        r = (spark.readStream.format(fmt_name).option("relay", relay)
             .option("sources", "customers").option("partitions", 2).option("envelope", "flat"))
        for k, v in opts.items():
            r = r.option(k, str(v))
        return r.load()

    def target(fmt: str, name: str) -> str:
        return str(out / name) if fmt == "delta" else f"local.db.{name}"

    def rows(fmt: str, name: str) -> list[list[Any]]:
        return [list(r) for r in read_lakehouse(spark, target(fmt, name), fmt)
                .select("id", "name", "balance", "tx").collect()]

    common = dict(keys=["id"], sequence_by="_sequence", apply_as_deletes="_op = 'd'",
                  except_column_list=["_op", "_sequence"], trigger={"availableNow": True})
    if mode == "formats":
        for reader, fmt_name in (("jvm", "databus"), ("python", "databus-python")):
            for fmt in lines.formats(line):
                name = f"{reader}_{fmt}"
                q = apply_changes(target=target(fmt, name), format=fmt, source=read(fmt_name),
                                  checkpoint_location=str(out / f"{name}.ckpt"), **common)
                q.awaitTermination()
                assert q.exception() is None, q.exception()
                report[name] = {"rows": rows(fmt, name), "served_by": jvm.served_by(q),
                                "progress": json.loads(q.lastProgress.json)}
        if line.changelog:  # change rows, pre-images left out: no column mapping
            feed = (spark.readStream.changes(f"databus.{source}")
                    .where("_change_type != 'update_preimage'"))
            q = apply_changes(target=target("delta", "changelog_delta"), format="delta",
                              source=feed, keys=["id"], sequence_by="_commit_version",
                              apply_as_deletes="_change_type = 'delete'",
                              except_column_list=["_change_type", "_commit_version",
                                                  "_commit_timestamp"],
                              checkpoint_location=str(out / "changelog_delta.ckpt"),
                              trigger={"availableNow": True})
            q.awaitTermination()
            assert q.exception() is None, q.exception()
            report["changelog_delta"] = {"rows": rows("delta", "changelog_delta")}
    else:
        spec = ApplySpec(target=target("delta", "kill_table"), keys=("id",), sequence_by="_sequence",
                         apply_as_deletes="_op = 'd'", except_column_list=("_op", "_sequence"))
        applier = TableApplier(spec, "delta", lambda: "cluster-kill")
        killed = str(out / "worker-killed")

        def hold(_: Any) -> None:  # on the executors: a task of batch 1 waits for the kill
            import os
            import time as t

            deadline = t.monotonic() + 120
            while not os.path.exists(killed) and t.monotonic() < deadline:
                t.sleep(0.1)

        def on_batch(batch: Any, batch_id: int) -> None:
            if batch_id == 1:  # (batch 0 made the table)
                (out / "holding").touch()
                batch.foreachPartition(hold)  # its tasks run on both workers, mid-batch
            applier(batch, batch_id)

        q = (read("databus", maxRowsPerBatch=25).writeStream.foreachBatch(on_batch)
             .option("checkpointLocation", str(out / "kill_table.ckpt"))
             .trigger(availableNow=True).start())
        q.awaitTermination()
        assert q.exception() is None, q.exception()
        report["rows"] = rows("delta", "kill_table")
        report["batches"] = len([p for p in q.recentProgress if p["numInputRows"] > 0])
    (out / "report.json").write_text(json.dumps(report))
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], Path(sys.argv[3]), *sys.argv[4:])
