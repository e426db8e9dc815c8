"""``apply_changes`` on Spark Connect (Spark 4.2, ``SparkSession.builder.remote``).

A Connect client has no JVM of its own: the server runs the query and starts a Python
worker for ``foreachBatch`` (the pickled applier, with the client's ``databus``). Runs on
the second Spark line (``.venv-spark42``, which has pyspark's ``connect`` extra) in a
separate process whose local Connect server takes the line's properties from
``python -m databus.spark.properties`` (static settings cannot be set from a Connect
client); skipped when that venv is not set up. Into a Delta path the table equals the
source; a Delta target given as a URI is refused with the ``ConfigError`` that says why
(Hadoop is reached through the driver's JVM; docs/spark.md).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.shop import TABLES, Writer, create_shop, table_rows
from tests.support.sparkline import VENV, environment, write_defaults
from tests.support.sparkrelay import start_relay, wait_relay

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (VENV / "python").exists(),
                       reason="no .venv-spark42 (bash scripts/spark-line.sh makes it)"),
]

CLIENT = '''
import json, sys
from pyspark.sql import SparkSession
from databus.spark import apply_changes, read_lakehouse

relay, tmp = sys.argv[1], sys.argv[2]
spark = SparkSession.builder.remote("local[2]").getOrCreate()
print("SESSION", type(spark).__module__, flush=True)

def run(target, ckpt):
    src = (spark.readStream.format("databus").option("relay", relay)
           .option("sources", "customers").option("envelope", "flat")
           .option("partitions", 2).load())
    q = apply_changes(target=target, source=src, keys=["id"], format="delta",
                      sequence_by="_sequence", apply_as_deletes="_op = 'd'",
                      except_column_list=["_op", "_sequence"], checkpoint_location=ckpt,
                      trigger={"availableNow": True})
    try:
        q.awaitTermination()  # raises the query's failure
    except Exception as exc:
        return exc
    return q.exception()

assert run(tmp + "/table", tmp + "/ckpt") is None
got = read_lakehouse(spark, tmp + "/table", "delta").select("id", "name", "balance", "tx")
print("ROWS", json.dumps([list(r) for r in got.orderBy("id").collect()]), flush=True)
print("URI", json.dumps(str(run("file://" + tmp + "/uri_table", tmp + "/ckpt2"))), flush=True)
'''


def test_apply_changes_on_spark_connect(tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    create_shop(db)
    relay = start_relay(db, tmp_path, TABLES)
    try:
        with Writer(db, seed=36) as w:
            for _ in range(60):
                w.transaction()
        wait_relay(relay, db)
        env = environment(tmp_path / "conf")
        write_defaults(env, lines=["spark.ui.enabled false", "spark.driver.memory 1g",
                                   "spark.sql.shuffle.partitions 2"])
        done = subprocess.run([str(VENV / "python"), "-c", CLIENT, relay.url, str(tmp_path)],
                              env=env, capture_output=True, text=True, timeout=420,
                              check=False)
    finally:
        relay.stop()
    out = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in done.stdout.splitlines()
           if line.startswith(("SESSION ", "ROWS ", "URI "))}
    assert done.returncode == 0 and "URI" in out, done.stderr[-4000:]
    assert out["SESSION"] == "pyspark.sql.connect.session"  # a Connect client, not classic
    want = table_rows(db, "customers")
    assert len(want) > 20
    assert [tuple(r) for r in json.loads(out["ROWS"])] == want
    assert "is a URI, read through Hadoop in the driver's JVM" in json.loads(out["URI"])
