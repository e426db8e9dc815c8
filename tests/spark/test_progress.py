"""Progress a user can read: the JVM reader's ``StreamingQueryProgress`` names the relay and
sources (not an object hash) and carries the relay's identity and the query's lag behind
the relay's newest window (``DatabusStream.metrics``)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from pyspark.sql import SparkSession

from databus.spark import jvm
from tests.support.shop import TABLES, Writer, create_shop
from tests.support.sparkrelay import start_relay, stream, wait_relay

pytestmark = pytest.mark.skipif(jvm.jar() is None, reason="no JDK here to build the JVM reader")


def test_progress_names_the_relay_and_shows_the_lag(spark: SparkSession, tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    create_shop(db)
    relay = start_relay(db, tmp_path, TABLES)
    try:
        w = Writer(db, seed=3)
        for i in range(120):
            w.transaction()
            if i % 20 == 0:
                time.sleep(0.05)  # several windows
        w.close()
        wait_relay(relay, db)
        time.sleep(1.0)  # the oldest window is now at least a second old
        q = (stream(spark, relay, "customers", maxRowsPerBatch=20, partitions=2)
             .writeStream.format("noop").trigger(availableNow=True).start())
        q.awaitTermination(180)
        assert q.exception() is None
        assert jvm.served_by(q) == "jvm"  # read from the description
        progress = [p for p in q.recentProgress if p["numInputRows"] > 0]
        assert len(progress) >= 2  # the row cap split the run into batches
        src = progress[0]["sources"][0]
        first, last = src["metrics"], progress[-1]["sources"][0]["metrics"]
        origin = first["relayOrigin"]  # the relay's identity, as offsets are stamped with
        assert origin.startswith("sqlite:")
        assert src["description"] == (f"databus[relay={relay.url}, origin={origin}, "
                                      "sources=main.customers, partitions=2]")
        assert first["relay"] == relay.url and first["sources"] == "main.customers"
        newest = relay.buffer.max_scn
        assert int(first["relayNewestScn"]) == newest
        assert int(first["consumedScn"]) < newest
        # after the first capped batch: behind by windows, bytes and at least the second
        assert int(first["windowsBehindRelay"]) >= 1
        assert int(first["bytesBehindRelay"]) > 0
        assert float(first["secondsBehindRelay"]) >= 1.0
        # the run ends caught up
        assert int(last["consumedScn"]) == newest
        assert last["windowsBehindRelay"] == "0" and last["secondsBehindRelay"] == "0.000"
    finally:
        relay.stop()


@pytest.mark.parametrize("fmt", ["databus-jvm", "databus-python"])
def test_a_query_is_listed_by_the_relay_under_its_consumer_name(
        spark: SparkSession, tmp_path: Path, fmt: str) -> None:
    """``consumerName`` is the name the query's reads give the relay (both readers): the
    relay's ``GET /consumers`` lists it, caught up once the run ended; a bad one is
    refused naming the option."""
    db = tmp_path / "shop.db"
    create_shop(db)
    relay = start_relay(db, tmp_path, TABLES)
    try:
        with Writer(db, seed=5) as w:
            for _ in range(20):
                w.transaction()
        wait_relay(relay, db)
        name = f"orders-etl {fmt}"
        q = (spark.readStream.format(fmt).option("relay", relay.url)
             .option("sources", "customers").option("consumerName", name).load()
             .writeStream.format("noop").trigger(availableNow=True).start())
        q.awaitTermination(180)
        assert q.exception() is None
        rows = [c for c in httpx.get(f"{relay.url}/consumers", timeout=10).json()["consumers"]
                if c["name"] == name]
        assert rows, f"{name} not in the relay's /consumers"
        with pytest.raises(Exception, match="consumerName"):
            (spark.readStream.format(fmt).option("relay", relay.url)
             .option("sources", "customers").option("consumerName", "x" * 201).load()
             .writeStream.format("noop").trigger(availableNow=True).start()
             .awaitTermination(60))
    finally:
        relay.stop()
