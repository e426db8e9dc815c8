"""A Spark checkpoint belongs to its relay and its sources (databus.spark.offsets, Offsets.java).

Both readers stamp every offset with the relay (its address, and its ``Databus-Origin``
when it sends one) and the sources' names; a query started on a checkpoint written for
other sources or another relay fails before it reads a row, with one error naming both; a
checkpoint written before the stamp existed resumes exactly and is upgraded.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from databus.core.errors import ConfigError
from databus.relay.relay import Relay
from databus.spark import errors, jvm
from databus.spark.offsets import Identity, offset_of, offset_scn, relay_address
from tests.support.shop import TABLES, Writer, create_shop
from tests.support.sparkrelay import relay_events, start_relay, wait_relay

pytestmark = pytest.mark.skipif(jvm.jar() is None, reason="no JDK here to build the JVM reader")

READERS = ["databus-jvm", "databus-python"]


def read(spark: SparkSession, fmt: str, url: str, source: str, **opts: object) -> DataFrame:
    reader = spark.readStream.format(fmt).option("relay", url).option("sources", source)
    for k, v in opts.items():
        reader = reader.option(k, str(v))
    return reader.load().select("scn", "key", "op")


def run(df: DataFrame, out: Path, ckpt: Path) -> None:
    """One availableNow run into Parquet; a failure raised as Spark raises it."""
    q = (df.writeStream.format("parquet").option("path", str(out))
         .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())
    try:
        q.awaitTermination(180)
    finally:
        q.stop()


def rows(spark: SparkSession, out: Path) -> list[tuple[int, str, str]]:
    return sorted((r.scn, r.key, r.op) for r in spark.read.parquet(str(out)).collect())


def logged_offsets(ckpt: Path) -> list[dict[str, Any]]:
    files = sorted((f for f in (ckpt / "offsets").iterdir() if f.name.isdigit()),
                   key=lambda f: int(f.name))
    return [json.loads(f.read_text().splitlines()[-1]) for f in files]


@pytest.fixture
def shop(tmp_path: Path) -> Iterator[tuple[Path, Relay]]:
    db = tmp_path / "shop.db"
    create_shop(db)
    relay = start_relay(db, tmp_path, TABLES)
    with Writer(db, seed=23) as w:
        for _ in range(60):
            w.transaction()
    wait_relay(relay, db)
    try:
        yield db, relay
    finally:
        relay.stop()


@pytest.mark.parametrize(("first", "second"), [
    ("databus-jvm", "databus-jvm"), ("databus-python", "databus-python"),
    ("databus-jvm", "databus-python")])
def test_a_checkpoint_of_other_sources_is_refused_naming_both(
        spark: SparkSession, tmp_path: Path, shop: tuple[Path, Relay], first: str,
        second: str) -> None:
    _db, relay = shop
    ckpt = tmp_path / "ckpt"
    run(read(spark, first, relay.url, "customers", partitions=2), tmp_path / "a", ckpt)
    assert rows(spark, tmp_path / "a")
    stamped = logged_offsets(ckpt)[-1]
    assert stamped["relay"] == relay.url.rstrip("/") and stamped["sources"] == ["main.customers"]

    with pytest.raises(ConfigError) as info, errors():
        run(read(spark, second, relay.url, "orders", partitions=2), tmp_path / "b", ckpt)
    message = str(info.value)
    assert "this checkpoint was written for relay" in message
    assert "sources main.customers" in message and "sources main.orders" in message
    # nothing of orders was read into the other query's output
    assert not (tmp_path / "b").exists() or not list((tmp_path / "b").glob("*.parquet"))


@pytest.mark.parametrize("fmt", READERS)
def test_a_checkpoint_of_another_relay_is_refused_naming_both(
        spark: SparkSession, tmp_path: Path, shop: tuple[Path, Relay], fmt: str) -> None:
    _db, relay = shop
    other_db = tmp_path / "other" / "shop.db"
    other_db.parent.mkdir()
    create_shop(other_db)
    other = start_relay(other_db, tmp_path / "other", TABLES)
    try:
        with Writer(other_db, seed=5) as w:
            for _ in range(10):
                w.transaction()
        wait_relay(other, other_db)
        ckpt = tmp_path / "ckpt"
        run(read(spark, fmt, relay.url, "customers"), tmp_path / "a", ckpt)
        with pytest.raises(ConfigError) as info, errors():
            run(read(spark, fmt, other.url, "customers"), tmp_path / "b", ckpt)
    finally:
        other.stop()
    message = str(info.value)
    assert f"written for relay {relay.url.rstrip('/')}" in message
    assert f"this query reads relay {other.url.rstrip('/')}" in message


@pytest.mark.parametrize("fmt", READERS)
def test_a_checkpoint_written_before_the_stamp_resumes_exactly_and_is_upgraded(
        spark: SparkSession, tmp_path: Path, shop: tuple[Path, Relay], fmt: str) -> None:
    """A MOD-bucket checkpoint (4 partitions) of the previous offset format: accepted,
    nothing lost or read twice, and the next offset written carries relay and sources."""
    db, relay = shop
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    run(read(spark, fmt, relay.url, "orders", partitions=4), out, ckpt)
    first = rows(spark, out)
    assert first
    for f in (ckpt / "offsets").iterdir():  # as databus wrote them before: no stamp
        if f.name.isdigit():
            lines = f.read_text().splitlines()
            old = json.loads(lines[-1])
            for key in ("relay", "origin", "sources"):
                old.pop(key, None)
            f.write_text("\n".join([*lines[:-1], json.dumps(old)]))
    assert "relay" not in logged_offsets(ckpt)[-1]

    with Writer(db, seed=77) as w:
        for _ in range(30):
            w.transaction()
    wait_relay(relay, db)
    run(read(spark, fmt, relay.url, "orders", partitions=4), out, ckpt)
    got = rows(spark, out)
    assert len(got) > len(first)
    assert got == sorted(relay_events(relay.url, "orders"))  # each change exactly once
    last = logged_offsets(ckpt)[-1]
    assert last["relay"] == relay.url.rstrip("/") and last["sources"] == ["main.orders"]
    assert sorted(last["buckets"]) == ["0", "1", "2", "3"]


# -- the identity rules, without Spark ---------------------------------------------------


def test_the_relay_address_is_the_option_normalised() -> None:
    assert relay_address(" http://b:1/ , http://a:2") == "http://a:2,http://b:1"
    assert relay_address("zk://zk:2181/shop/") == "zk://zk:2181/shop"


def test_origins_decide_when_both_sides_have_one_else_the_addresses() -> None:
    here = Identity("http://a:1", "db-1", ("main.t",))
    moved = offset_of(5, 4, 2, Identity("http://b:9", "db-1", ("main.t",)))
    assert offset_scn(moved, 2, here) == 5  # same origin, another member's address
    with pytest.raises(ConfigError, match=r"origin db-2.*this query reads relay http://a:1"):
        offset_scn(offset_of(5, 4, 2, Identity("http://a:1", "db-2", ("main.t",))), 2, here)
    # written before the relay sent an origin: the same address resumes, another is refused
    assert offset_scn(offset_of(5, 4, 2, Identity("http://a:1", None, ("main.t",))), 2, here) == 5
    with pytest.raises(ConfigError, match=r"written for relay http://b:9, sources main\.t"):
        offset_scn(offset_of(5, 4, 2, Identity("http://b:9", None, ("main.t",))), 2, here)
    # sources compare as a set
    two = Identity("http://a:1", "db-1", ("main.t", "main.u"))
    assert offset_scn(offset_of(5, 4, 1, Identity("x", "db-1", ("main.u", "main.t"))), 1, two) == 5


def test_an_unstamped_offset_is_accepted_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    here = Identity("http://a:1", None, ("main.t",))
    with caplog.at_level(logging.WARNING, logger="databus.spark"):
        assert offset_scn(offset_of(7, 6, 4), 4, here) == 7
    assert "records no relay and no sources" in caplog.text
    assert "the next offset written records them" in caplog.text


def test_stamped_offsets_are_ascii_json_as_the_jvm_writes_them() -> None:
    off = offset_of(3, 2, 1, Identity("http://a:1", "caf\u00e9 \"db\"", ("main.t",)))
    assert json.dumps(off) == (
        '{"v": 1, "partitions": 1, "relay": "http://a:1", "origin": "caf\\u00e9 \\"db\\"", '
        '"sources": ["main.t"], "buckets": {"0": {"windowScn": 3, "windowOffset": -1, '
        '"prevScn": 2}}}')

