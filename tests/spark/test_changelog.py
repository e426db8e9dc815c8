"""Spark's changelog API over a relay (Spark 4.2's ``TableCatalog.loadChangelog``): the
catalog ``io.databus.spark.DatabusCatalog`` of the JVM reader built for 4.2, read with
``spark.readStream.changes`` and SQL ``CHANGES``. Runs on the 4.2 line
(``scripts/test-spark-line.sh``); skipped on the pinned 4.1 line, whose Spark has no
changelog API (its jar is built without the catalog)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from databus.relay.relay import Relay
from databus.spark import jvm, lines
from tests.support.shop import TABLES, Writer, create_shop, table_rows
from tests.support.sparkrelay import source_name, start_relay, wait_relay

pytestmark = [
    pytest.mark.skipif(jvm.jar() is None, reason="no JDK here to build the JVM reader"),
    pytest.mark.skipif(not lines.current().changelog,
                       reason="this Spark line has no changelog API (4.2 has: "
                              "scripts/test-spark-line.sh)"),
]

_names = itertools.count()


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("changelog")
    db = tmp / "shop.db"
    create_shop(db)
    relay = start_relay(db, tmp, TABLES)
    with Writer(db, seed=34, rollback_ratio=0.1) as w:
        for _ in range(120):
            w.transaction()
    wait_relay(relay, db)
    yield relay, db
    relay.stop()


def catalog(spark: SparkSession, relay: Relay, **opts: str) -> str:
    """A new catalog over ``relay`` (a name per call: Spark keeps a catalog once loaded)."""
    name = f"databus{next(_names)}"
    spark.conf.set(f"spark.sql.catalog.{name}", "io.databus.spark.DatabusCatalog")
    spark.conf.set(f"spark.sql.catalog.{name}.relay", relay.url)
    for k, v in {"partitions": "2", **opts}.items():
        spark.conf.set(f"spark.sql.catalog.{name}.{k}", v)
    return name


def drain(df: DataFrame, out: Path) -> list[Any]:
    q = (df.writeStream.format("parquet").option("path", str(out / "data"))
         .option("checkpointLocation", str(out / "ckpt")).trigger(availableNow=True).start())
    q.awaitTermination(180)
    assert q.exception() is None, q.exception()
    return df.sparkSession.read.parquet(str(out / "data")).collect()


COLUMNS = ["id", "name", "balance", "tx"]
CHANGE = ["_change_type", "_commit_version", "_commit_timestamp"]


def expected(spark: SparkSession, relay: Relay, after: int = -1) -> list[tuple[Any, ...]]:
    """The change rows of ``customers`` after SCN ``after``, made from the databus format's
    full envelope (before/after images, op, scn) as Spark's contract names them: per window
    (commit version) one change per key, the key's net change in the window."""
    env = (spark.read.format("databus").option("relay", relay.url).option("sources", "customers")
           .option("startingPosition", str(after)).load().collect())
    nets: dict[tuple[int, Any], dict[str, Any]] = {}
    for e in sorted(env, key=lambda e: (e.sequence["scn"], e.sequence["index"])):
        assert e.op in ("c", "r", "u", "d")
        assert e.op != "u" or e.before is not None  # SQLite triggers send the before image
        img = e.before if e.op == "d" else e.after
        n = nets.setdefault((e.scn, e.key), {"existed": e.op in ("u", "d"), "before": e.before})
        n["after"] = None if e.op == "d" else img
    out: list[tuple[Any, ...]] = []
    for (scn, _), n in nets.items():
        def row(img: Any, kind: str, scn: int = scn, n: Any = n) -> tuple[Any, ...]:
            return (*[img[c] for c in COLUMNS], kind, scn)
        if not n["existed"]:
            if n["after"] is not None:
                out.append(row(n["after"], "insert"))
        elif n["after"] is None:
            out.append(row(n["before"], "delete"))
        else:
            out += [row(n["before"], "update_preimage"), row(n["after"], "update_postimage")]
    return sorted(out, key=repr)


def got(rows: list[Any]) -> list[tuple[Any, ...]]:
    """Change rows as ``expected`` gives them (without the commit time)."""
    return sorted(((*[r[c] for c in COLUMNS], r._change_type, r._commit_version)
                   for r in rows), key=repr)


def commit_times(rows: list[Any]) -> dict[int, datetime]:
    """Each commit version's time; fails when a version's rows disagree on it."""
    times: dict[int, set[datetime]] = {}
    for r in rows:
        times.setdefault(r._commit_version, set()).add(r._commit_timestamp)
    assert all(len(t) == 1 for t in times.values()), times
    return {v: t.pop() for v, t in times.items()}


def fold(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The table the change rows make, applied in SCN order (what AUTO CDC SCD1 builds)."""
    state: dict[Any, tuple[Any, ...]] = {}
    order = {"update_preimage": 0, "delete": 1, "insert": 1, "update_postimage": 2}
    for r in sorted(rows, key=lambda r: (r[5], order[r[4]])):
        if r[4] == "delete":
            state.pop(r[0], None)
        elif r[4] != "update_preimage":
            state[r[0]] = r[:4]
    return [state[k] for k in sorted(state)]


def test_changes_reads_the_relays_stream_as_change_rows(
        spark: SparkSession, tmp_path: Path, shop: tuple[Relay, Path]) -> None:
    relay, db = shop
    cat = catalog(spark, relay)
    df = spark.readStream.changes(f"{cat}.{source_name(relay, 'customers')}")
    assert df.schema.fieldNames() == COLUMNS + CHANGE
    assert [f.dataType.simpleString() for f in df.schema.fields[-3:]] == [
        "string", "bigint", "timestamp"]
    raw = drain(df, tmp_path)
    rows = got(raw)
    assert rows == expected(spark, relay)
    # the window's time: the writes of this module, minutes ago at most
    now = datetime.now(UTC).replace(tzinfo=None)
    assert all(abs(t - now) < timedelta(minutes=5) for t in commit_times(raw).values())
    kinds = {r[4] for r in rows}
    assert kinds == {"insert", "delete", "update_preimage", "update_postimage"}
    # applied in commit order they are the source's table, column for column
    assert fold(rows) == table_rows(db, "customers")


def test_a_starting_version_reads_from_that_scn_on(
        spark: SparkSession, tmp_path: Path, shop: tuple[Relay, Path]) -> None:
    relay, _ = shop
    cat = catalog(spark, relay, partitions="3")
    name = f"{cat}.{source_name(relay, 'customers')}"
    scns = sorted({r[5] for r in expected(spark, relay)})
    mid = scns[len(scns) // 2]
    df = spark.readStream.option("startingVersion", str(mid)).changes(name)
    rows = got(drain(df, tmp_path))
    assert rows == expected(spark, relay, after=mid - 1)
    assert min(r[5] for r in rows) == mid  # the start version is inclusive


def test_sql_changes_reads_the_same_rows_in_a_batch(
        spark: SparkSession, shop: tuple[Relay, Path]) -> None:
    relay, _ = shop
    cat = catalog(spark, relay)
    name = f"{cat}.{source_name(relay, 'customers')}"
    scns = sorted({r[5] for r in expected(spark, relay)})
    rows = got(spark.sql(f"SELECT * FROM {name} CHANGES FROM VERSION {scns[0]}").collect())
    assert rows == expected(spark, relay)
    after = got(spark.sql(f"SELECT * FROM {name} CHANGES FROM VERSION {scns[3]} EXCLUSIVE")
                .collect())
    assert after == expected(spark, relay, after=scns[3])


@pytest.mark.parametrize(("read", "message"), [
    (lambda s, n: s.read.option("startingVersion", "1").option("endingVersion", "9").changes(n),
     "an ending version is not supported"),
    (lambda s, n: s.read.option("startingTimestamp", "2026-01-01").changes(n),
     "a timestamp range is not supported"),
    (lambda s, n: s.read.option("startingVersion", "x").changes(n), "a version is an SCN"),
])
def test_a_range_the_relay_cannot_serve_is_refused_saying_why(
        spark: SparkSession, shop: tuple[Relay, Path], read: Any, message: str) -> None:
    relay, _ = shop
    cat = catalog(spark, relay)
    with pytest.raises(Exception, match=message):
        read(spark, f"{cat}.{source_name(relay, 'customers')}").collect()


def test_newest_per_key_is_refused_by_a_changelog_read(
        spark: SparkSession, shop: tuple[Relay, Path]) -> None:
    relay, _ = shop
    cat = catalog(spark, relay, newestPerKey="true")
    with pytest.raises(Exception, match="newestPerKey does not apply to a changelog read"):
        spark.readStream.changes(f"{cat}.{source_name(relay, 'customers')}")


def test_an_unknown_table_is_not_found(spark: SparkSession, shop: tuple[Relay, Path]) -> None:
    relay, _ = shop
    cat = catalog(spark, relay)
    with pytest.raises(Exception, match="TABLE_OR_VIEW_NOT_FOUND"):
        spark.readStream.changes(f"{cat}.main.nosuchtable")


def test_net_changes_from_the_first_window_are_the_source_table(
        spark: SparkSession, shop: tuple[Relay, Path]) -> None:
    """Spark's own post-processing over the reader's row identity (the key columns) and
    versions: every key's net change since the relay's oldest window is an insert of its
    current row, and deleted keys give nothing."""
    relay, db = shop
    cat = catalog(spark, relay)
    rows = (spark.read.option("startingVersion", "0").option("deduplicationMode", "netChanges")
            .changes(f"{cat}.{source_name(relay, 'customers')}").collect())
    assert {r._change_type for r in rows} == {"insert"}
    assert sorted(tuple(r[c] for c in COLUMNS) for r in rows) == table_rows(db, "customers")


def test_a_changes_query_restarted_from_its_checkpoint_loses_and_repeats_nothing(
        spark: SparkSession, tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    create_shop(db)
    relay = start_relay(db, tmp_path, TABLES)
    try:
        with Writer(db, seed=36) as w:
            for _ in range(40):
                w.transaction()
            wait_relay(relay, db)
            cat = catalog(spark, relay)
            name = f"{cat}.{source_name(relay, 'customers')}"
            first = got(drain(spark.readStream.changes(name), tmp_path / "q"))
            for _ in range(40):
                w.transaction()
        wait_relay(relay, db)
        both = got(drain(spark.readStream.changes(name), tmp_path / "q"))  # same checkpoint
        assert len(both) > len(first)
        assert both == expected(spark, relay)  # each change once
        assert fold(both) == table_rows(db, "customers")
    finally:
        relay.stop()
