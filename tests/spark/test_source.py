"""The ``databus`` streaming source: availableNow continuation, buckets, limits, errors."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from databus.auth import add_token
from databus.client.credentials import Credentials
from databus.relay.relay import Relay
from databus.spark import changes
from tests.support.procs import free_port
from tests.support.relays import make_relay
from tests.support.shop import TABLES, Writer, create_shop
from tests.support.sparkrelay import relay_events, start_relay, stream, wait_relay
from tests.support.tls import make_certs


def run_available_now(df: DataFrame, out: Path, ckpt: Path) -> list[int]:
    """One availableNow run into a Parquet file sink; the input rows of each batch."""
    q = (df.writeStream.format("parquet").option("path", str(out))
         .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())
    q.awaitTermination(120)
    assert q.exception() is None
    return [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]


@pytest.fixture
def shop(tmp_path: Path) -> tuple[Path, Relay, Writer]:
    db = tmp_path / "shop.db"
    create_shop(db)
    relay = start_relay(db, tmp_path, TABLES)
    w = Writer(db, seed=31, rollback_ratio=0.2)
    yield db, relay, w
    w.close()
    relay.stop()


def test_available_now_runs_continue_exactly_where_the_last_stopped(
        spark: SparkSession, tmp_path: Path, shop: tuple[Path, Relay, Writer]) -> None:
    db, relay, w = shop
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    df = stream(spark, relay, "customers", partitions=4).select(
        "scn", "key", "op", "sequence", F.spark_partition_id().alias("pid"))
    runs = []
    for round_ in range(3):
        for _ in range(60):
            w.transaction()
            time.sleep(0.001)
        wait_relay(relay, db)
        runs.append(sum(run_available_now(df, out, ckpt)))
        got = spark.read.parquet(str(out))
        seen = sorted((r.scn, r.key, r.op) for r in got.collect())
        want = sorted(relay_events(relay.url, "customers"))
        assert seen == want, f"round {round_}: the sink differs from the relay's events"
        # each input partition pulled its own MOD bucket of the key
        assert got.where(F.pmod(F.col("key").cast("long"), F.lit(4)) != F.col("pid")).count() == 0
        assert got.select("pid").distinct().count() == 4
    assert all(n > 0 for n in runs)
    # nothing new: a further run reads nothing
    assert run_available_now(df, out, ckpt) == []


def batches_while_writing(df: DataFrame, ckpt: Path, write: Callable[[], int]
                          ) -> list[list[int]]:
    """The window SCNs of each batch's rows: a first batch, then ``write()`` while running.

    ``write`` returns how many rows the query must have seen in all: the query runs
    until then, since ``processAllAvailable`` can return while a trigger that planned
    before the writes ended still reports no new data (seen on Spark 4.2). On Spark
    4.1 the first batch a reader plans is not capped (databus.spark.limits); the
    windows written afterwards come in batches the limit shapes."""
    seen: list[list[int]] = []

    def batch(b: DataFrame, _batch_id: int) -> None:
        scns = [r[0] for r in b.select("scn").collect()]
        if scns:
            seen.append(scns)

    q = (df.writeStream.foreachBatch(batch).option("checkpointLocation", str(ckpt))
         .trigger(processingTime="20 milliseconds").start())
    try:
        q.processAllAvailable()
        want = write()
        deadline = time.monotonic() + 120
        while sum(map(len, seen)) < want and time.monotonic() < deadline:
            q.processAllAvailable()
    finally:
        q.stop()
    assert q.exception() is None
    return seen


def test_max_rows_per_batch_splits_on_window_boundaries(
        spark: SparkSession, tmp_path: Path, shop: tuple[Path, Relay, Writer]) -> None:
    db, relay, w = shop
    w.transaction()
    wait_relay(relay, db)

    def write() -> int:
        con = sqlite3.connect(db, isolation_level=None)
        for t in range(40):  # windows of 1..25 rows, committed faster than batches run
            con.execute("BEGIN")
            for i in range(1 + (t * 7) % 25):
                con.execute("INSERT INTO orders VALUES (?,?,?,?,?)",
                            (50_000 + t * 100 + i, 1, "x", b"", t))
            con.execute("COMMIT")
            # one window each: SQLite's relay puts the transactions committed between two
            # of its polls in one window (docs/sqlite.md), and a CI run once got two
            # windows of hundreds of rows, too few batches for the limit to shape
            wait_relay(relay, db)
        con.close()
        return len(relay_events(relay.url, "orders"))

    df = stream(spark, relay, "orders", partitions=2, maxRowsPerBatch=40)
    batches = batches_while_writing(df, tmp_path / "ckpt", write)
    window_rows: dict[int, int] = {}
    for scn, _key, _op in relay_events(relay.url, "orders"):
        window_rows[scn] = window_rows.get(scn, 0) + 1
    later = batches[1:]
    assert len(later) > 2
    for scns in later:
        # at most 40 rows, or one window alone; a window is never split across batches
        assert len(scns) <= 40 or len(set(scns)) == 1, scns
        assert all(scns.count(s) == window_rows[s] for s in set(scns))
    assert sorted(s for b in batches for s in b) == sorted(
        s for s, n in window_rows.items() for _ in range(n))


def test_json_value_format_carries_every_source(
        spark: SparkSession, tmp_path: Path, shop: tuple[Path, Relay, Writer]) -> None:
    db, relay, w = shop
    for _ in range(30):
        w.transaction()
    wait_relay(relay, db)
    df = stream(spark, relay, "customers,orders,items", partitions=3, valueFormat="json")
    run_available_now(df, tmp_path / "out", tmp_path / "ckpt")
    got = spark.read.parquet(str(tmp_path / "out"))
    total = sum(len(relay_events(relay.url, t)) for t in TABLES)
    assert got.count() == total
    row = got.where("op = 'c' and source.table = 'orders'").select(
        F.get_json_object("after", "$.id").alias("id")).first()
    assert row is not None and int(row["id"]) > 0


def test_flat_envelope_gives_exactly_what_changes_makes_of_the_full_one(
        spark: SparkSession, tmp_path: Path, shop: tuple[Path, Relay, Writer]) -> None:
    db, relay, w = shop
    for _ in range(60):
        w.transaction()
    wait_relay(relay, db)
    full = changes(stream(spark, relay, "customers", partitions=3))
    flat = stream(spark, relay, "customers", partitions=3, envelope="flat")
    assert flat.schema == full.schema
    assert changes(flat) is flat  # already in the shape apply_changes reads
    run_available_now(full, tmp_path / "full", tmp_path / "full.ckpt")
    run_available_now(flat, tmp_path / "flat", tmp_path / "flat.ckpt")
    want = spark.read.parquet(str(tmp_path / "full")).collect()
    got = spark.read.parquet(str(tmp_path / "flat")).collect()
    key = lambda r: (r["_sequence"]["scn"], r["_sequence"]["index"])  # noqa: E731
    assert sorted(got, key=key) == sorted(want, key=key)
    assert {r["_op"] for r in got} >= {"c", "u", "d"}



@pytest.mark.parametrize(("options", "message"), [
    ({"sources": "nosuchtable"}, "'nosuchtable' is not served"),
    ({"sources": "customers", "partitions": "0"}, "partitions"),
    ({"sources": "customers", "partitions": "four"}, "partitions"),
    ({"sources": "customers", "partitions": "5000"}, "partitions"),
    ({"sources": "customers", "startingPosition": "yesterday"}, "startingPosition"),
    ({"sources": "customers,orders"}, "exactly one source"),
    ({"sources": "customers", "colour": "red"}, "unknown option 'colour'"),
    ({"sources": "customers", "envelope": "thin"}, "envelope"),
    ({"sources": "customers,orders", "envelope": "flat", "valueFormat": "json"},
     "envelope=flat needs valueFormat=struct"),
    ({"sources": "customers", "relay": "UNREACHABLE", "relayRetrySeconds": "0"}, "unreachable"),
])
def test_bad_options_fail_fast_with_a_clear_message(
        spark: SparkSession, tmp_path: Path, shop: tuple[Path, Relay, Writer],
        options: dict[str, str], message: str) -> None:
    _db, relay, _w = shop
    opts = {"relay": relay.url, **options}
    if opts["relay"] == "UNREACHABLE":
        opts["relay"] = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(PySparkException) as info:
        df = spark.readStream.format("databus").options(**opts).load()
        q = df.writeStream.format("noop").option(
            "checkpointLocation", str(tmp_path / "ckpt")).start()
        try:
            q.awaitTermination(60)
        finally:
            q.stop()
    assert message in str(info.value)
    assert time.monotonic() - started < 30


def test_a_window_larger_than_every_budget_stays_whole(
        spark: SparkSession, tmp_path: Path, shop: tuple[Path, Relay, Writer]) -> None:

    db, relay, w = shop
    for _ in range(5):
        w.transaction()
    wait_relay(relay, db)
    con = sqlite3.connect(db, isolation_level=None)
    con.execute("BEGIN")
    for i in range(300):  # one window of ~300 events, far above fetchBytes
        con.execute("INSERT INTO orders VALUES (?,?,?,?,?)", (10_000 + i, 1, "x" * 100, b"", 0))
    con.execute("COMMIT")
    con.close()
    wait_relay(relay, db)
    df = stream(spark, relay, "orders", partitions=2, maxRowsPerBatch=10, fetchBytes=4096)
    batches = run_available_now(df, tmp_path / "out", tmp_path / "ckpt")
    got = sorted((r.scn, r.key, r.op) for r in spark.read.parquet(str(tmp_path / "out"))
                 .collect())
    assert got == sorted(relay_events(relay.url, "orders"))
    assert max(batches) >= 300  # the big window was not split across batches


def test_the_source_reads_a_closed_relay_with_its_token_and_ca_files(
        spark: SparkSession, tmp_path: Path) -> None:
    """Tokens and TLS from files (never inline): the orders token reads orders over
    https; customers, which that token may not read, is an error naming what it may."""
    db = tmp_path / "shop.db"
    create_shop(db)
    certs = make_certs(tmp_path / "certs")
    tokens = tmp_path / "tokens.jsonl"
    token_file = tmp_path / "orders.token"
    token_file.write_text(add_token(tokens, "orders", [r"main\.orders"]) + "\n")
    relay = make_relay(db, tmp_path, http={
        "token_file": str(tokens),
        "tls": {"cert_file": str(certs.server_cert), "key_file": str(certs.server_key)}})
    with relay, Writer(db, seed=5) as w:
        for _ in range(30):
            w.transaction()
        wait_relay(relay, db)
        assert relay.url.startswith("https://")

        def read(source: str) -> DataFrame:
            return (spark.readStream.format("databus").option("relay", relay.url)
                    .option("sources", source).option("tokenFile", str(token_file))
                    .option("caFile", str(certs.ca)).load())

        out, ckpt = tmp_path / "out", tmp_path / "ckpt"
        assert sum(run_available_now(read("orders").select("scn", "key", "op"), out, ckpt)) > 0
        got = sorted((r.scn, r.key, r.op) for r in spark.read.parquet(str(out)).collect())
        creds = Credentials(token=token_file.read_text().strip(), ca_file=certs.ca)
        assert got == sorted(relay_events(relay.url, "orders", creds))
        # not in the token's grant: Forbidden, not "not served" (the relay's answer)
        with pytest.raises(Exception, match=r"refuses source .customers. to this token: token .orders. may not read customers"):
            q = (read("customers").writeStream.format("parquet")
                 .option("path", str(tmp_path / "out2"))
                 .option("checkpointLocation", str(tmp_path / "ckpt2"))
                 .trigger(availableNow=True).start())
            q.awaitTermination(120)
            if q.exception() is not None:
                raise RuntimeError(str(q.exception()))
