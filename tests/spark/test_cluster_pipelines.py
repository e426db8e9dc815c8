"""The pipelines that matter on a standalone cluster (a master and two workers, separate
JVMs and Python workers: tests/support/spark_cluster.py), submitted with ``spark-submit``
as a user does (tests/spark/cluster_pipeline_job.py):

* both readers (the JVM reader; the Python source, whose executors import databus from
  the same ``PYSPARK_PYTHON``) applying a relay's changes into Delta and Iceberg SCD1
  tables, each equal to the SQLite source;
* a worker and its executor SIGKILLed while tasks of a batch run on it: the batch's lost
  tasks run again on the other worker and the query ends with its table equal to the source;
* the newest line (Spark 4.2, ``.venv-spark42``) on a cluster of its own: the same job with
  Delta and ``readStream.changes``, then AUTO CDC flows of ``spark-pipelines`` run through a
  Spark Connect server on that cluster (skipped without that venv).
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import pytest

from databus.spark import jvm
from tests.spark.lines import needs
from tests.support import sparkline
from tests.support.shop import TABLES, Writer, create_shop
from tests.support.spark_cluster import VENV_BIN, environment, spark_cluster, submit
from tests.support.sparkrelay import source_name, start_relay, wait_relay
from tests.support.wait import wait_until

JOB = Path(__file__).with_name("cluster_pipeline_job.py")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(jvm.jar() is None, reason="no JDK here to build the JVM reader"),
    needs("delta", "iceberg"),
]


def source_rows(db: Path) -> list[list[Any]]:
    with closing(sqlite3.connect(db)) as con:
        return sorted(list(r) for r in con.execute("SELECT id, name, balance, tx FROM customers"))


@pytest.mark.timeout(1200)  # a cluster's start and four queries
def test_both_readers_into_delta_and_iceberg_on_a_cluster(tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    create_shop(db)
    relay = start_relay(db, tmp_path, TABLES)
    try:
        with Writer(db, seed=8) as w:
            for _ in range(120):
                w.transaction()
        wait_relay(relay, db)
        out = tmp_path / "out"
        out.mkdir()
        with spark_cluster(tmp_path / "cluster") as cluster:
            done = submit(cluster, JOB, ["formats", relay.url, str(out)],
                          log=tmp_path / "submit.log", timeout=900,
                          spark_args=["--conf", "spark.cores.max=2"])
        assert done.returncode == 0, (tmp_path / "submit.log").read_text()[-5000:]
    finally:
        relay.stop()
    report = json.loads((out / "report.json").read_text())
    want = source_rows(db)
    assert len(want) > 20
    for reader in ("jvm", "python"):
        for fmt in ("delta", "iceberg"):
            got = report[f"{reader}_{fmt}"]
            assert got["served_by"] == reader, (reader, fmt)
            assert sorted(got["rows"]) == want, f"{reader} into {fmt} differs"


@pytest.mark.timeout(1200)  # a cluster's start and a lost executor's tasks run again
def test_a_worker_killed_mid_batch_and_the_query_ends_equal(tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    create_shop(db)
    relay = start_relay(db, tmp_path, TABLES)
    try:
        with Writer(db, seed=9) as w:
            for _ in range(100):
                w.transaction()
        wait_relay(relay, db)
        out = tmp_path / "out"
        out.mkdir()
        with spark_cluster(tmp_path / "cluster") as cluster:
            log = tmp_path / "submit.log"
            with log.open("w") as fh:
                job = subprocess.Popen(
                    [str(VENV_BIN / "spark-submit"), "--master", cluster.master, "--conf",
                     "spark.cores.max=2", str(JOB), "kill", relay.url, str(out)],
                    env=environment(), cwd=tmp_path, stdout=fh, stderr=subprocess.STDOUT)
            try:
                # batch 1's tasks hold on both workers: kill the first worker under them
                wait_until(lambda: (out / "holding").exists() or job.poll() is not None,
                           480, "batch 1 to start")
                assert job.poll() is None, log.read_text()[-5000:]
                time.sleep(1.0)  # the held tasks are running on both executors
                cluster.kill_worker(0)
                (out / "worker-killed").touch()
                assert job.wait(480) == 0, log.read_text()[-5000:]
            finally:
                if job.poll() is None:
                    job.kill()
                    job.wait()
    finally:
        relay.stop()
    report = json.loads((out / "report.json").read_text())
    assert report["batches"] >= 2
    assert sorted(report["rows"]) == source_rows(db)
    # the driver saw the executor go while batch 1's tasks were held on it (its id is
    # whichever the killed worker's executor got: 0 or 1)
    assert re.search(r"Lost executor \d+ on .*worker lost", log.read_text()), \
        log.read_text()[-3000:]


# the pipeline of the newest line on the cluster: AUTO CDC flows reading databus, from the
# flat envelope and from Spark's changelog API, into the in-memory table with row-level
# operations (the one target open-source Spark 4.2 takes: tests/spark/test_spark_pipelines.py)
# and copied into Delta to be compared
CLUSTER_DEFINITIONS = '''
from pyspark import pipelines as dp
from pyspark.sql import SparkSession, functions as F

spark = SparkSession.active()


@dp.temporary_view(name="customers_feed")
def customers_feed():
    return (spark.readStream.format("databus").option("relay", {relay!r})
            .option("sources", "customers").option("envelope", "flat")
            .option("partitions", "2").load())


@dp.temporary_view(name="customers_cdf")
def customers_cdf():
    return (spark.readStream.changes("databus.{source}")
            .where("_change_type != 'update_preimage'"))


dp.create_streaming_table("mem.db.flat_scd1")
dp.create_auto_cdc_flow(target="mem.db.flat_scd1", source="customers_feed", keys=["id"],
                        sequence_by="_sequence", apply_as_deletes=F.expr("_op = 'd'"),
                        except_column_list=["_op", "_sequence"], stored_as_scd_type=1)
dp.create_streaming_table("mem.db.cdf_scd1")
dp.create_auto_cdc_flow(target="mem.db.cdf_scd1", source="customers_cdf", keys=["id"],
                        sequence_by="_commit_version",
                        apply_as_deletes="_change_type = 'delete'",
                        except_column_list=["_change_type", "_commit_version",
                                            "_commit_timestamp"], stored_as_scd_type=1)


@dp.materialized_view(name="flat_scd1_copy", format="delta")
def flat_scd1_copy():
    return spark.read.table("mem.db.flat_scd1")


@dp.materialized_view(name="cdf_scd1_copy", format="delta")
def cdf_scd1_copy():
    return spark.read.table("mem.db.cdf_scd1")
'''


READ_COPIES = '''
import json, sys
from pyspark.sql import SparkSession

spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
print("ROWS " + json.dumps({
    name: [list(r) for r in spark.read.format("delta").load(f"{sys.argv[2]}/{name}")
           .select("id", "name", "balance", "tx").collect()]
    for name in ("flat_scd1_copy", "cdf_scd1_copy")}))
'''


@pytest.mark.skipif(not (sparkline.VENV / "spark-pipelines").exists(),
                    reason="no .venv-spark42 (bash scripts/spark-line.sh makes it)")
@pytest.mark.timeout(1200)  # a cluster's start, a job of five queries and a pipeline run
def test_the_newest_line_on_a_cluster_of_its_own(tmp_path: Path) -> None:
    """Spark 4.2 (the newest workable line, ``.venv-spark42``) as a user runs it on a
    standalone cluster started from that venv: ``spark-submit`` of both readers applying
    into Delta and of ``readStream.changes`` applied with no column mapping, each table
    equal to the source and the JVM reader's lag in its progress; then ``spark-pipelines``
    on the same cluster, AUTO CDC flows reading databus (flat envelope and ``changes()``)
    whose tables equal the source. Both applications ran on the cluster's executors (the
    master lists them)."""
    db = tmp_path / "shop.db"
    create_shop(db)
    relay = start_relay(db, tmp_path, TABLES)
    try:
        with Writer(db, seed=42) as w:
            for _ in range(120):
                w.transaction()
        wait_relay(relay, db)
        source = source_name(relay, "customers")
        out = tmp_path / "out"
        out.mkdir()
        # each process of the line with a conf dir of its own (nothing of this 4.1 process)
        for d in ("conf-cluster", "conf-job", "conf-server"):
            (tmp_path / d).mkdir()
        with spark_cluster(tmp_path / "cluster", bin_dir=sparkline.VENV,
                           base=sparkline.environment(tmp_path / "conf-cluster")) as cluster:
            done = submit(cluster, JOB, ["formats", relay.url, str(out), source],
                          log=tmp_path / "submit.log", timeout=900, bin_dir=sparkline.VENV,
                          env=sparkline.environment(tmp_path / "conf-job"),
                          spark_args=["--conf", "spark.cores.max=2"])
            assert done.returncode == 0, (tmp_path / "submit.log").read_text()[-5000:]
            # the pipeline: a Connect server on the cluster holds the settings, the
            # spark-pipelines CLI is its client
            server_env = sparkline.environment(tmp_path / "conf-server")
            sparkline.write_defaults(server_env, jars=sparkline.auto_cdc_target_jars(), lines=[
                *sparkline.pipeline_settings(tmp_path / "sdp" / "warehouse", relay.url),
                "spark.cores.max 2", "spark.executor.memory 512m"])
            with sparkline.connect_server(server_env, cluster.master,
                                          tmp_path / "connect.log") as remote:
                ran = sparkline.run_pipeline(tmp_path / "sdp", relay.url, CLUSTER_DEFINITIONS,
                                             remote=remote, source=source)
                # the copies read back through the same server (a Connect client of the
                # line: no Spark JVM of this process, so the test is not in the Spark chain)
                copies = subprocess.run(
                    [str(sparkline.VENV / "python"), "-c", READ_COPIES, remote,
                     str(tmp_path / "sdp" / "warehouse")],
                    env=sparkline.environment(tmp_path / "conf-client"), capture_output=True,
                    text=True, timeout=300, check=False)
            (tmp_path / "sdp.log").write_text(ran.stdout + ran.stderr)
            apps = httpx.get(f"{cluster.ui}/json/", timeout=5).json()
    finally:
        relay.stop()
    want = source_rows(db)
    assert len(want) > 20
    report = json.loads((out / "report.json").read_text())
    assert set(report) == {"jvm_delta", "python_delta", "changelog_delta"}
    for reader in ("jvm", "python"):
        assert report[f"{reader}_delta"]["served_by"] == reader
        assert sorted(report[f"{reader}_delta"]["rows"]) == want, f"{reader} into Delta differs"
    assert sorted(report["changelog_delta"]["rows"]) == want
    src = report["jvm_delta"]["progress"]["sources"][0]
    assert src["description"].startswith(f"databus[relay={relay.url}, ")
    assert src["metrics"]["windowsBehindRelay"] == "0"  # the run ended caught up
    assert int(src["metrics"]["consumedScn"]) == int(src["metrics"]["relayNewestScn"])
    # the pipeline: AUTO CDC tables, copied into Delta, equal to the source
    log = (tmp_path / "sdp.log").read_text()
    assert ran.returncode == 0, log[-5000:]
    rows = [line[5:] for line in copies.stdout.splitlines() if line.startswith("ROWS ")]
    assert copies.returncode == 0 and rows, copies.stderr[-4000:]
    for name, got in json.loads(rows[0]).items():
        assert sorted(got) == want, name
    names = [a["name"] for a in apps.get("completedapps", []) + apps.get("activeapps", [])]
    assert "databus-cluster-formats" in names and len(names) == 2, names
