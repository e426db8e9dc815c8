"""Spark's AUTO CDC flow building SCD2 tables from databus (Spark 4.3, ``.venv-spark43``).

SCD2 AUTO CDC (``stored_as_scd_type=2``, SPARK-58247) is in pyspark 4.3.0, not in 4.2.1.
A ``spark-pipelines run`` of the 4.3 line (``scripts/spark-line.sh 4.3``; skipped when
that venv is not set up) reads an ``accounts`` table, whose every upsert is a new version,
from the relay twice with no column mapping: the ``databus`` format's flat envelope
(``sequence_by`` its ``_sequence``) and Spark's changelog API over the JVM reader's catalog
(``readStream.changes``, ``sequence_by`` ``_commit_version``). Each flow builds an SCD2 table
that must hold exactly the source's history: one version per upsert, each ending where the
next starts, closed by a delete. No Delta or Iceberg exists for 4.3, so the target is
Spark's in-memory table with row-level operations (as on 4.2, ``tests/spark/java``), copied
by materialized views into Parquet tables, read here with pyarrow (no Spark session).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.support import sparkline
from tests.support.accounts import AccountWriter, check_history, rows_of
from tests.support.sparkrelay import source_name, start_relay, wait_relay

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (sparkline.venv("4.3") / "spark-pipelines").exists(),
                       reason="no .venv-spark43 (bash scripts/spark-line.sh 4.3 makes it)"),
]

DEFINITIONS = '''
from pyspark import pipelines as dp
from pyspark.sql import SparkSession, functions as F

spark = SparkSession.active()


@dp.temporary_view(name="accounts_feed")
def accounts_feed():
    # the flat envelope as it comes: the table's columns, _op and _sequence
    return (spark.readStream.format("databus").option("relay", {relay!r})
            .option("sources", "accounts").option("envelope", "flat")
            .option("partitions", "2").load())


@dp.temporary_view(name="accounts_cdf")
def accounts_cdf():
    # Spark's changelog API over the relay; updates as their post-images
    return (spark.readStream.changes("databus.{source}")
            .where("_change_type != 'update_preimage'"))


FLOWS = (
    ("accounts_scd2", "accounts_feed", "_sequence", "_op = 'd'", ["_op", "_sequence"]),
    ("accounts_scd2_cdf", "accounts_cdf", "_commit_version", "_change_type = 'delete'",
     ["_change_type", "_commit_version", "_commit_timestamp"]),
)
for name, source, sequence, deletes, drop in FLOWS:
    dp.create_streaming_table(f"mem.db.{{name}}")
    dp.create_auto_cdc_flow(target=f"mem.db.{{name}}", source=source, keys=["id"],
                            sequence_by=sequence, apply_as_deletes=F.expr(deletes),
                            except_column_list=drop, stored_as_scd_type=2)
    dp.materialized_view(name=f"{{name}}_copy", format="parquet")(
        lambda n=name: spark.read.table(f"mem.db.{{n}}"))
'''


def as_key(value: Any) -> Any:
    """A sequence value pyarrow gives (a struct as a dict) as something ordered."""
    return tuple(value.values()) if isinstance(value, dict) else value


def versions(tmp: Path, name: str) -> list[dict[str, Any]]:
    """The SCD2 table ``name``'s rows, as its materialized view copied them."""
    return pq.read_table(tmp / "warehouse" / f"{name}_copy").to_pylist()


def test_auto_cdc_scd2_from_the_flat_envelope_and_the_changelog_api_is_the_history(
        tmp_path: Path) -> None:
    db = tmp_path / "acc.db"
    w = AccountWriter(db, seed=43, one_change_per_key=True)
    relay = start_relay(db, tmp_path, ["accounts"])
    try:
        for _ in range(80):
            # each transaction its own window: a SQLite relay cuts one window per poll, and
            # the changelog API gives one net change per key and window (version)
            w.transaction()
            wait_relay(relay, db)
        done = sparkline.run_pipeline(tmp_path, relay.url, DEFINITIONS, line="4.3",
                                      source=source_name(relay, "accounts"))
    finally:
        w.con.close()
        relay.stop()
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    for name in ("accounts_scd2", "accounts_scd2_cdf"):
        assert f"Flow mem.db.{name} has COMPLETED" in out, out[-4000:]
        got = versions(tmp_path, name)
        assert sum(1 for h in w.history.values() for v in h if v is not None) == len(got)
        check_history(got, w, order=as_key)
        current = sorted((r["id"], r["v"], r["note"]) for r in got if r["__END_AT"] is None)
        assert current == rows_of(db)
    assert any(None in h for h in w.history.values())  # deletes flowed too
