"""``databus.spark.session()`` under ``spark-submit`` on a standalone cluster.

A master and two workers started from the venv's pyspark (tests/support/spark_cluster.py);
a job (tests/spark/cluster_job.py) submitted with ``--master spark://... --jars user.jar``
as a user submits it: pyspark comes from ``pyspark.zip``, the session keeps the
cluster's master and the user's jar (on ``spark.jars`` and on the driver), the JVM reader
serves ``format("databus")`` on the executors, the Delta table that ``apply_changes``
writes equals the SQLite source, and a query of other sources started on the same
checkpoint is refused with an error naming both.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from databus.spark import jvm
from tests.support.shop import TABLES, Writer, create_shop
from tests.support.spark_cluster import SparkCluster, spark_cluster, submit
from tests.support.sparkrelay import start_relay, wait_relay

pytestmark = pytest.mark.skipif(jvm.jar() is None, reason="no JDK here to build the JVM reader")

JOB = Path(__file__).with_name("cluster_job.py")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    with spark_cluster(tmp_path_factory.mktemp("spark-cluster")) as c:
        yield c


def user_jar(where: Path) -> Path:
    """A jar of the user's own (one resource), as ``--jars`` would bring."""
    (where / "res").mkdir()
    (where / "res" / "databus-user-marker.txt").write_text("mine\n")
    jar = where / "user-lib.jar"
    subprocess.run(["jar", "--create", "--file", str(jar), "-C", str(where / "res"), "."],
                   check=True)
    return jar


def test_a_submitted_job_reads_with_the_jvm_reader_into_delta_and_refuses_a_reused_checkpoint(
        cluster: SparkCluster, tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    create_shop(db)
    relay = start_relay(db, tmp_path, TABLES)
    try:
        with Writer(db, seed=41) as w:
            for _ in range(120):
                w.transaction()
        wait_relay(relay, db)
        jar = user_jar(tmp_path)
        out = tmp_path / "out"
        out.mkdir()
        done = submit(cluster, JOB, [relay.url, str(out)], log=tmp_path / "submit.log",
                      spark_args=["--jars", str(jar), "--conf", "spark.cores.max=2"])
        assert done.returncode == 0, (tmp_path / "submit.log").read_text()[-5000:]
    finally:
        relay.stop()
    report = json.loads((out / "report.json").read_text())
    assert "pyspark.zip" in report["pyspark"]  # as spark-submit runs a Python application
    assert report["master"] == cluster.master  # kept, not local[*]
    assert str(jar) in report["jars"] and "databus-spark-source.jar" in report["jars"]
    assert "delta-spark" in report["jars"]
    assert report["jars"].count("databus-spark-source.jar") == 1
    assert report["user_jar_on_driver"]
    assert report["jvm_active"] and report["served_by"] == "jvm"
    assert report["executors"] == 2  # the two workers ran it

    with closing(sqlite3.connect(db)) as con:
        want = sorted(list(r) for r in con.execute("SELECT id, name, balance, tx FROM customers"))
    assert want and sorted(report["rows"]) == want

    reused = report["reused"]
    assert reused is not None and reused["type"] == "ConfigError", reused
    assert "this checkpoint was written for relay" in reused["message"]
    assert "sources main.customers" in reused["message"]
    assert "sources main.orders" in reused["message"]
