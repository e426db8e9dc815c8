"""The databus source in Spark Declarative Pipelines (``spark-pipelines run``, Spark Connect).

Runs on the second Spark line (``.venv-spark42``, made by ``scripts/spark-line.sh``: the
first line with ``pyspark.pipelines``), as a separate ``spark-pipelines`` process whose
Spark properties come from ``python -m databus.spark.properties`` (Delta 4.2 and the JVM
reader built for 4.2); skipped when that venv is not set up. The pipeline reads a relay
over SQLite into a Delta streaming table of every change (an append flow), and a
materialized view folds it into the current rows (SCD1), which must equal the source.

AUTO CDC flows (``create_auto_cdc_flow``, SCD1: 4.2.1 has no SCD2; 4.3 has, tested in
``test_spark_scd2.py``) read databus with no column mapping, from the flat envelope and from
Spark's changelog API (``changes()``), and their tables must equal the source. Their target
is Spark's in-memory table with row-level operations (Spark's test jar, in a catalog shared
by the run's sessions: ``tests/spark/java``), copied by a materialized view into Delta to be
compared: the one target AUTO CDC takes on open-source Spark 4.2. Into a Delta streaming
table Spark 4.2.1 refuses the flow before it reads anything (Delta 4.4.0's ``DeltaTableV2``
has no row-level operations; no Iceberg runtime exists for 4.2): the tests pin that refusal,
so the day a Delta release lifts it they fail and say to assert the Delta table instead
(docs/spark.md, "Spark lines").
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.support import sparkline
from tests.support.shop import TABLES, Writer, create_shop, table_rows
from tests.support.sparkline import VENV
from tests.support.sparkrelay import source_name, start_relay, wait_relay

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (VENV / "spark-pipelines").exists(),
                       reason="no .venv-spark42 (bash scripts/spark-line.sh makes it)"),
]

# the in-memory AUTO CDC table, copied into Delta to be read after the run
COPY = '''

@dp.materialized_view(name="customers_scd1_copy", format="delta")
def customers_scd1_copy():
    return spark.read.table("mem.db.customers_scd1")
'''


DEFINITIONS = '''
from pyspark import pipelines as dp
from pyspark.sql import SparkSession, functions as F

spark = SparkSession.active()


@dp.table(name="customers_changes", format="delta")
def customers_changes():
    return (spark.readStream.format("databus").option("relay", {relay!r})
            .option("sources", "customers").option("envelope", "flat")
            .option("partitions", "2").load())


@dp.materialized_view(name="customers_current", format="delta")
def customers_current():
    last = (spark.read.table("customers_changes").groupBy("id")
            .agg(F.max_by(F.struct("*"), "_sequence").alias("r")))
    return last.where("r._op != 'd'").select("r.id", "r.name", "r.balance", "r.tx")


dp.create_streaming_table("customers_auto_cdc", format="delta")
dp.create_auto_cdc_flow(target="customers_auto_cdc", source="customers_changes",
                        keys=["id"], sequence_by="_sequence",
                        apply_as_deletes=F.expr("_op = 'd'"),
                        except_column_list=["_op", "_sequence"], stored_as_scd_type=1)


@dp.temporary_view(name="customers_feed")
def customers_feed():
    # the AUTO CDC flow's source is databus itself, the flat envelope as it comes
    return (spark.readStream.format("databus").option("relay", {relay!r})
            .option("sources", "customers").option("envelope", "flat")
            .option("partitions", "2").load())


dp.create_streaming_table("mem.db.customers_scd1")
dp.create_auto_cdc_flow(target="mem.db.customers_scd1", source="customers_feed",
                        keys=["id"], sequence_by="_sequence",
                        apply_as_deletes=F.expr("_op = 'd'"),
                        except_column_list=["_op", "_sequence"], stored_as_scd_type=1)
''' + COPY


CHANGELOG_DEFINITIONS = '''
from pyspark import pipelines as dp
from pyspark.sql import SparkSession

spark = SparkSession.active()


@dp.temporary_view(name="customers_cdf")
def customers_cdf():
    # Spark's changelog API over the relay: no column mapping, only the pre-images out
    return (spark.readStream.changes("databus.{source}")
            .where("_change_type != 'update_preimage'"))


# into Delta (refused) and into the in-memory table with row-level operations
for target, fmt in (("customers_auto_cdc", "delta"), ("mem.db.customers_scd1", None)):
    dp.create_streaming_table(target, format=fmt)
    dp.create_auto_cdc_flow(target=target, source="customers_cdf",
                            keys=["id"], sequence_by="_commit_version",
                            apply_as_deletes="_change_type = 'delete'",
                            except_column_list=["_change_type", "_commit_version",
                                                "_commit_timestamp"],
                            stored_as_scd_type=1)
''' + COPY


def run_pipeline(tmp: Path, relay_url: str, definitions: str = DEFINITIONS,
                 **fields: str) -> subprocess.CompletedProcess[str]:
    return sparkline.run_pipeline(tmp, relay_url, definitions, **fields)


def scd1_copy(spark: SparkSession, tmp: Path) -> list[tuple[object, ...]]:
    """The AUTO CDC table's rows, as its materialized view copied them into Delta."""
    got = spark.read.format("delta").load(str(tmp / "warehouse" / "customers_scd1_copy"))
    # Spark's own bookkeeping column rides along (each row's upsert/delete sequence)
    assert "__spark_autocdc_metadata" in got.columns
    return [tuple(r) for r in got.select("id", "name", "balance", "tx").orderBy("id").collect()]


def test_a_pipeline_reads_databus_and_its_scd1_view_and_auto_cdc_table_equal_the_source(
        spark: SparkSession, tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    create_shop(db)
    relay = start_relay(db, tmp_path, TABLES)
    try:
        w = Writer(db, seed=34)
        for _ in range(200):
            w.transaction()
        w.close()
        wait_relay(relay, db)
        done = run_pipeline(tmp_path, relay.url)
    finally:
        relay.stop()
    out = done.stdout + done.stderr
    # the append flow and the view ran to completion, read through the JVM reader
    assert "Flow spark_catalog.default.customers_changes has COMPLETED" in out, out[-4000:]
    assert "Flow spark_catalog.default.customers_current has COMPLETED" in out, out[-4000:]
    want = table_rows(db, "customers")
    assert len(want) > 50
    # the tables are Delta 4.4.0 tables: this session's Delta (for 4.1) reads them
    changes = spark.read.format("delta").load(str(tmp_path / "warehouse" / "customers_changes"))
    assert changes.count() > len(want)  # updates and deletes flowed too
    got = spark.read.format("delta").load(str(tmp_path / "warehouse" / "customers_current"))
    assert [tuple(r) for r in got.select("id", "name", "balance", "tx").orderBy("id")
            .collect()] == want
    # AUTO CDC reading databus (no column mapping) into a table with row-level operations
    assert "Flow mem.db.customers_scd1 has COMPLETED" in out, out[-4000:]
    assert scd1_copy(spark, tmp_path) == want
    # AUTO CDC into Delta: refused by Spark 4.2.1 (see the module docstring); when this
    # fails, a Delta with row-level operations has come: assert customers_auto_cdc == want
    assert done.returncode != 0
    assert "AUTOCDC_TARGET_DOES_NOT_SUPPORT_MERGE" in out, out[-4000:]


def test_an_auto_cdc_flow_reading_the_changelog_api_equals_the_source(
        spark: SparkSession, tmp_path: Path) -> None:
    """AUTO CDC reading ``readStream.changes`` of the databus catalog: the flow's source
    needs no column mapping; its table with row-level operations equals the source, and
    Spark 4.2.1 refuses the Delta target as before."""
    db = tmp_path / "shop.db"
    create_shop(db)
    relay = start_relay(db, tmp_path, TABLES)
    try:
        with Writer(db, seed=35) as w:
            for _ in range(50):
                w.transaction()
        wait_relay(relay, db)
        source = source_name(relay, "customers")
        done = run_pipeline(tmp_path, relay.url, CHANGELOG_DEFINITIONS, source=source)
    finally:
        relay.stop()
    out = done.stdout + done.stderr
    assert "Flow mem.db.customers_scd1 has COMPLETED" in out, out[-4000:]
    want = table_rows(db, "customers")
    assert len(want) > 20
    assert scd1_copy(spark, tmp_path) == want
    # when this fails, Delta supports AUTO CDC's MERGE: assert customers_auto_cdc equals
    # table_rows(db, "customers") instead (docs/spark.md, "Spark lines")
    assert done.returncode != 0
    assert "AUTOCDC_TARGET_DOES_NOT_SUPPORT_MERGE" in out, out[-4000:]
