"""SQLite -> relay -> bootstrap service (SQLite store) -> ``format("databus-snapshot")``.

The snapshot read with 1 and 4 partitions must equal the source tables; a
Parquet table initialised from the snapshot at SCN X and then fed the stream
after X must equal the source after more writes, with the stream reading
exactly the changes after X (no gap, no duplicate); bad options fail at
``load()`` with a clear message.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from databus.bootstrap.config import parse_config
from databus.bootstrap.service import BootstrapService
from databus.relay.relay import Relay
from databus.spark import (
    apply_changes,
    changes,
    initial_load,
    read_lakehouse,
    read_table,
    register_snapshot,
    snapshot_scn,
    table_versions,
)
from databus.spark.apply import ChangeApplier
from databus.spark.lakehouse import Format
from databus.spark.spec import ApplySpec
from databus.spark.targets import table_ident
from tests.spark.lines import FORMATS
from tests.support.procs import free_port
from tests.support.shop import TABLES, Writer, create_shop, table_rows, txlog_max
from tests.support.sparkrelay import start_relay, wait_relay
from tests.support.wait import wait_until

COLUMNS = {"customers": ["id", "name", "balance", "tx"],
           "items": ["order_id", "line", "sku", "qty", "tx"]}
KEYS = {"customers": ["id"], "items": ["order_id", "line"]}


class Pipeline:
    def __init__(self, db: Path, relay: Relay, bs: BootstrapService, store: str,
                 writer: Writer) -> None:
        self.db, self.relay, self.bs, self.store, self.writer = db, relay, bs, store, writer

    def write(self, n: int) -> None:
        for i in range(n):
            self.writer.transaction()
            if i % 40 == 0:
                time.sleep(0.03)  # several relay windows
        wait_relay(self.relay, self.db)
        want = txlog_max(self.db)
        wait_until(lambda: snapshot_scn(self.store) >= want, 30, "the bootstrap applier to fold",
                   interval=0.05)


@pytest.fixture(scope="module")
def pipe(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    tmp = tmp_path_factory.mktemp("snapshot")
    db = tmp / "shop.db"
    create_shop(db)
    writer = Writer(db, seed=11)
    for _ in range(30):  # rows from before capture: the initial load brings them
        writer.transaction()
    relay = start_relay(db, tmp, TABLES)
    store = f"sqlite:///{tmp / 'bs.db'}"
    bs = BootstrapService(parse_config({
        "relay": relay.url, "store": {"url": store}, "http": {"port": 0},
        "poll_timeout": 0.5, "apply_interval": 0.05, "apply_batch_windows": 7,
        "initial_load": {"url": f"sqlite:///{db}", "tables": TABLES}}))
    bs.start()
    register_snapshot(spark)
    p = Pipeline(db, relay, bs, store, writer)
    try:
        p.write(250)
        yield p
    finally:
        writer.close()
        bs.stop()
        relay.stop()


def snapshot(spark: SparkSession, store: str, table: str, **opts: object) -> DataFrame:
    reader = spark.read.format("databus-snapshot").option("store", store).option("sources", table)
    for k, v in opts.items():
        reader = reader.option(k, str(v))
    return reader.load()


def rows_of(df: DataFrame, table: str) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in df.select(*COLUMNS[table]).orderBy(*KEYS[table]).collect()]


@pytest.mark.parametrize("partitions", [1, 4])
def test_snapshot_equals_the_source(spark: SparkSession, pipe: Pipeline, partitions: int) -> None:
    scn = snapshot_scn(pipe.store)
    assert scn == txlog_max(pipe.db)
    for table in ("customers", "items"):
        df = snapshot(spark, pipe.store, table, partitions=partitions)
        assert df.rdd.getNumPartitions() == partitions
        want = table_rows(pipe.db, table)
        assert len(want) > 30
        assert rows_of(df.select("after.*"), table) == want, table
        meta = df.agg(F.collect_set("op"), F.max("scn"), F.min(F.col("source.snapshot").cast(
            "int")), F.count_distinct("key")).first()
        assert meta is not None
        assert list(meta[0]) == ["r"] and meta[1] <= scn and meta[2] == 1
        assert meta[3] == len(want)  # one row per key
        if partitions > 1:  # every range holds rows: the split is over the real id span
            sizes = df.rdd.glom().map(len).collect()
            assert all(s > 0 for s in sizes) and sum(sizes) == len(want)


def changes_after(db: Path, table: str, scn: int) -> int:
    """Row changes of ``table`` the source logged after ``scn``."""
    with closing(sqlite3.connect(db)) as con:
        got = con.execute("SELECT count(*) FROM _databus_txlog t JOIN _databus_sources s"
                          " ON s.id = t.src WHERE s.name LIKE ? AND t.scn > ?",
                          (f"%{table}", scn)).fetchone()
    return int(got[0])


def test_table_from_snapshot_then_stream_after_its_scn(spark: SparkSession, pipe: Pipeline,
                                                       tmp_path: Path) -> None:
    x = snapshot_scn(pipe.store)
    pipe.write(150)  # folded into the store too: the snapshot at X must ignore those rows
    assert snapshot_scn(pipe.store) > x
    for table in ("customers", "items"):
        snap = snapshot(spark, pipe.store, table, partitions=4, scn=x)
        assert snap.agg(F.max("scn")).first()[0] <= x  # type: ignore[index]
        target = str(tmp_path / table)
        spec = ApplySpec(target=target, keys=tuple(KEYS[table]), sequence_by="_sequence",
                         apply_as_deletes="_op = 'd'", except_column_list=("_op", "_sequence"))
        ChangeApplier(spec).apply(changes(snap))
        assert rows_of(read_table(spark, target), table) != table_rows(pipe.db, table)

        seen: list[tuple[int, int]] = []
        applier = ChangeApplier(spec)

        def batch(df: DataFrame, batch_id: int, applier: ChangeApplier = applier,
                  seen: list[tuple[int, int]] = seen) -> None:
            r = df.agg(F.min("_sequence.scn"), F.count(F.lit(1))).first()
            assert r is not None
            if r[1]:
                seen.append((int(r[0]), int(r[1])))
            applier(df, batch_id)

        stream = (spark.readStream.format("databus").option("relay", pipe.relay.url)
                  .option("sources", table).option("partitions", 4)
                  .option("startingPosition", str(x)).load())
        q = (changes(stream).writeStream.foreachBatch(batch)
             .option("checkpointLocation", str(tmp_path / f"{table}.ckpt"))
             .trigger(availableNow=True).start())
        q.awaitTermination(120)
        assert q.exception() is None
        assert rows_of(read_table(spark, target), table) == table_rows(pipe.db, table), table
        assert seen and min(s for s, _ in seen) > x  # nothing at or before X again
        assert sum(n for _, n in seen) == changes_after(pipe.db, table, x)  # nothing missed



@pytest.mark.parametrize(("options", "message"), [
    ({"sources": "nosuchtable"}, "source 'nosuchtable' is not in the bootstrap store"),
    ({"partitions": "0"}, "partitions: Input should be greater than or equal to 1"),
    ({"partitions": "four"}, "partitions: Input should be a valid integer"),
    ({"partitions": "5000"}, "partitions: Input should be less than or equal to 1024"),
    ({"scn": "999999999"}, "the snapshot is complete only to SCN"),
    ({"colour": "red"}, "unknown option 'colour'"),
    ({"store": "sqlite:///MISSING"}, "no bootstrap store at"),
    ({"store": "PG"}, "StoreUnavailable"),
    ({"sources": "customers,items"}, "typed after structs need exactly one source"),
])
def test_bad_options_fail_at_load(spark: SparkSession, pipe: Pipeline, tmp_path: Path,
                                  options: dict[str, str], message: str) -> None:
    opts = {"store": pipe.store, "sources": "customers", **options}
    if opts["store"] == "sqlite:///MISSING":
        opts["store"] = f"sqlite:///{tmp_path / 'missing.db'}"
    elif opts["store"] == "PG":  # nothing listens there
        opts["store"] = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/x"
    started = time.monotonic()
    with pytest.raises(PySparkException) as info:
        spark.read.format("databus-snapshot").options(**opts).load().collect()
    assert message in str(info.value)
    assert time.monotonic() - started < 30
    assert not (tmp_path / "missing.db").exists()  # a reader never creates a store


def test_json_values_read_several_sources(spark: SparkSession, pipe: Pipeline) -> None:
    df = snapshot(spark, pipe.store, "customers,items", valueFormat="json", partitions=3)
    got = df.groupBy("source.table").count().collect()
    assert {r[0]: r[1] for r in got} == {t: len(table_rows(pipe.db, t))
                                         for t in ("customers", "items")}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("scd", [1, 2])
def test_initial_load_into_a_lakehouse_table_then_the_stream(
        spark: SparkSession, pipe: Pipeline, tmp_path: Path, fmt: Format, scd: int) -> None:
    table = "customers"
    target = str(tmp_path / "init") if fmt == "delta" else f"local.init{abs(hash(tmp_path))}.c"
    x = initial_load(spark, target=target, format=fmt, store=pipe.store, source=table,
                     keys=KEYS[table], stored_as_scd_type=scd)
    commits = len(table_versions(spark, target, fmt))
    # SCD1: the table, the snapshot's rows and X in one CREATE TABLE AS SELECT; SCD2: the
    # table made with X (a Delta version, no Iceberg snapshot), then the load's one MERGE
    assert commits == (1 if scd == 1 or fmt == "iceberg" else 2)
    props = {r[0]: r[1] for r in spark.sql(
        f"SHOW TBLPROPERTIES {table_ident(target, fmt)}").collect()}
    assert props["databus.initial_scn"] == str(x)
    pipe.write(100)  # changes after X: the stream brings them
    # a second call (as after a crash) returns the same X and writes nothing
    assert initial_load(spark, target=target, format=fmt, store=pipe.store, source=table,
                        keys=KEYS[table], stored_as_scd_type=scd) == x
    assert len(table_versions(spark, target, fmt)) == commits
    stream = (spark.readStream.format("databus").option("relay", pipe.relay.url)
              .option("sources", table).option("partitions", 4)
              .option("startingPosition", str(x)).load())
    q = apply_changes(target=target, source=changes(stream), format=fmt, keys=KEYS[table],
                      sequence_by="_sequence", apply_as_deletes="_op = 'd'",
                      except_column_list=["_op", "_sequence"], stored_as_scd_type=scd,
                      checkpoint_location=str(tmp_path / "init.ckpt"),
                      trigger={"availableNow": True})
    assert q.awaitTermination(180)
    assert q.exception() is None
    assert rows_of(read_lakehouse(spark, target, fmt, current_only=True), table) == \
        table_rows(pipe.db, table)
