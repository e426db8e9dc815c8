"""The pipelines that matter on a standalone cluster (a master and two workers, separate
JVMs and Python workers: tests/support/spark_cluster.py), submitted with ``spark-submit``
as a user does (tests/spark/cluster_pipeline_job.py):

* both readers (the JVM reader; the Python source, whose executors import databus from
  the same ``PYSPARK_PYTHON``) applying a relay's changes into Delta and Iceberg SCD1
  tables, each equal to the SQLite source;
* a worker and its executor SIGKILLed while tasks of a batch run on it: the batch's lost
  tasks run again on the other worker and the query ends with its table equal to the source.
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

import pytest

from databus.spark import jvm
from tests.spark.lines import needs
from tests.support.shop import TABLES, Writer, create_shop
from tests.support.spark_cluster import VENV_BIN, environment, spark_cluster, submit
from tests.support.sparkrelay import start_relay, wait_relay
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
