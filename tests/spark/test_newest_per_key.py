"""The JVM reader's ``newestPerKey``: one row per key per micro-batch, the key's newest
change, and every truncate (docs/spark.md): the same rows as the newest per key of a read
of every change, and apply_changes from it ends with the source's table."""

from __future__ import annotations

import logging
import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from databus.core.errors import ConfigError
from databus.spark import apply_changes, changes, jvm, read_lakehouse
from databus.spark.lakehouse import Format
from databus.spark.perkey import one_row_per_key
from tests.spark.lines import FORMATS
from tests.support.accounts import KeyWriter, current, target_of
from tests.support.mariadb import MariaDB
from tests.support.sparkrelay import batch_read, read, rows, start_relay, stream, wait_relay
from tests.support.typematrix import matrix_relay
from tests.support.wait import wait_until

pytestmark = pytest.mark.skipif(jvm.jar() is None, reason="no JDK here to build the JVM reader")


def batch(spark: SparkSession, url: str, source: str, **opts: object) -> list[Any]:
    return batch_read(spark, url, source, **opts).collect()


def newest(every: list[Any]) -> list[Any]:
    """What newestPerKey should give of ``every`` change (full envelope rows): per key its
    newest change, and every truncate, in sequence order."""
    by_key: dict[Any, Any] = {}
    truncates = []
    for r in every:
        if r["op"] == "t":
            truncates.append(r)
        else:
            old = by_key.get(r["key"])
            if old is None or tuple(r["sequence"]) > tuple(old["sequence"]):
                by_key[r["key"]] = r
    return sorted([*by_key.values(), *truncates], key=lambda r: tuple(r["sequence"]))


def test_each_keys_newest_change_once_across_pages_and_buckets(
        spark: SparkSession, tmp_path: Path) -> None:
    db = tmp_path / "acc.db"
    w = KeyWriter(db, seed=11)
    relay = start_relay(db, tmp_path, ["accounts"])
    try:
        for _ in range(150):
            w.transaction()
        wait_relay(relay, db)
        assert w.key_changes > 5
        # small pages: rows kept from a page must outlive it
        opts = {"partitions": 2, "fetchBytes": 4096}
        every = batch(spark, relay.url, "accounts", **opts)
        got = batch(spark, relay.url, "accounts", newestPerKey="true", **opts)
        want = newest(every)
        assert len(got) < len(every) / 2  # keys changed many times: far fewer rows
        assert len({r["key"] for r in got}) == len(got)
        assert sorted(got, key=lambda r: tuple(r["sequence"])) == want
        # a partition gives its rows in the order of their changes (one partition: all; a
        # sequence's index counts the bucket's events in its window, so this read's own)
        flat = batch(spark, relay.url, "accounts", envelope="flat", newestPerKey="yes")
        one = newest(batch(spark, relay.url, "accounts"))
        assert [tuple(r["_sequence"]) for r in flat] == [tuple(r["sequence"]) for r in one]
        assert [r["id"] for r in flat] == [(r["after"] or r["before"])["id"] for r in one]
        # pages of 4 x fetchBytes (128 MiB) past the relay's largest answer (64 MiB): the
        # relay refuses the size, the reader goes on in pages of fetchBytes
        big = batch(spark, relay.url, "accounts", newestPerKey="true", partitions=2,
                    fetchBytes=32 << 20)
        assert sorted(big, key=lambda r: tuple(r["sequence"])) == want
    finally:
        relay.stop()


def test_many_integer_and_text_keys_of_three_sources(spark: SparkSession, tmp_path: Path) -> None:
    """Thousands of integer keys (the reader's key table grows several times) beside the
    same integer keys of a second source and text keys of a third, with the same values:
    each (source, key) once, its newest change, in the order of those changes."""
    db = tmp_path / "two.db"
    con = sqlite3.connect(db, isolation_level=None)
    con.execute("CREATE TABLE nums (id INTEGER PRIMARY KEY, v INTEGER)")
    con.execute("CREATE TABLE more (id INTEGER PRIMARY KEY, v INTEGER)")
    con.execute("CREATE TABLE words (w TEXT PRIMARY KEY, v INTEGER)")
    relay = start_relay(db, tmp_path, ["nums", "more", "words"])
    try:
        rng = random.Random(5)
        for t in range(40):
            con.execute("BEGIN")
            for _ in range(500):
                k = rng.randrange(6000)
                con.execute("INSERT INTO nums VALUES (?, ?) ON CONFLICT (id) DO UPDATE SET v = "
                            "excluded.v", (k, t))
                if rng.random() < 0.1:
                    con.execute("DELETE FROM nums WHERE id = ?", (rng.randrange(6000),))
                w = rng.randrange(300)  # also a key of nums
                con.execute("INSERT INTO more VALUES (?, ?) ON CONFLICT (id) DO UPDATE SET v = "
                            "excluded.v", (w, t))
                w = str(w)
                con.execute("INSERT INTO words VALUES (?, ?) ON CONFLICT (w) DO UPDATE SET v = "
                            "excluded.v", (w, t))
            con.execute("COMMIT")
        con.close()
        wait_relay(relay, db)
        for parts in (1, 2):
            every = batch(spark, relay.url, "nums,more,words", partitions=parts, valueFormat="json")
            got = batch(spark, relay.url, "nums,more,words", partitions=parts, valueFormat="json",
                        newestPerKey="true")
            want: dict[Any, Any] = {}
            for r in sorted(every, key=lambda r: tuple(r["sequence"])):
                want[(r["source"]["table"], r["key"])] = r
            assert len(every) > 3 * len(want) > 3 * 5000
            assert sorted(got, key=lambda r: (r["source"]["table"], r["key"])) == \
                sorted(want.values(), key=lambda r: (r["source"]["table"], r["key"]))
            if parts == 1:  # one partition: in the order of the changes kept
                assert [tuple(r["sequence"]) for r in got] == \
                    sorted(tuple(r["sequence"]) for r in got)
    finally:
        relay.stop()


def test_a_truncate_is_kept_between_the_changes_it_orders(
        spark: SparkSession, tmp_path: Path, mariadb: MariaDB) -> None:
    with matrix_relay(mariadb, tmp_path, "npk") as (relay, table, cur):
        cur.execute("UPDATE tm SET vc = 'before' WHERE id = 2")
        cur.execute("TRUNCATE TABLE tm")
        cur.execute("INSERT INTO tm (id, vc) VALUES (2, 'after'), (5, 'new')")
        cur.execute("UPDATE tm SET vc = 'after2' WHERE id = 2")

        def held() -> list[Any]:
            return batch(spark, relay.url, table, partitions=2)

        wait_until(lambda: any(r["op"] == "t" for r in held())
                   and len(held()) >= 4, 60, "the relay to hold the truncate and after")
        every = held()
        got = batch(spark, relay.url, table, partitions=2, newestPerKey="true")
        assert sorted(got, key=lambda r: tuple(r["sequence"])) == newest(every)
        assert [r["op"] for r in got].count("t") == 1


@pytest.mark.parametrize("fmt", FORMATS)
def test_apply_changes_from_the_newest_per_key_equals_the_source(
        spark: SparkSession, tmp_path: Path, fmt: Format,
        caplog: pytest.LogCaptureFixture) -> None:
    """Flat, one source, keyed by its primary key: apply_changes runs no window of its
    own (the log says so), and the table still ends equal to the source."""
    caplog.set_level(logging.INFO, logger="databus.spark")
    db = tmp_path / "acc.db"
    w = KeyWriter(db, seed=23)
    relay = start_relay(db, tmp_path, ["accounts"])
    target = target_of(fmt, tmp_path, "npk")
    try:
        read_rows = []
        for _round in range(2):
            for _ in range(80):
                w.transaction()
            wait_relay(relay, db)
            src = stream(spark, relay, "accounts", partitions=2, newestPerKey="true",
                         envelope="flat")
            q = apply_changes(target=target, source=src, keys=["id"], format=fmt,
                              checkpoint_location=str(tmp_path / "ckpt"),
                              trigger={"availableNow": True}, sequence_by="_sequence",
                              apply_as_deletes="_op = 'd'",
                              except_column_list=["_op", "_sequence"])
            assert q.awaitTermination(180)
            assert q.exception() is None
            read_rows.append(sum(p["numInputRows"] for p in q.recentProgress))
            want = rows(db, "SELECT id, v, note FROM accounts ORDER BY id")
            assert current(read_lakehouse(spark, target, fmt)) == want
        # at most one row per key per batch (119 keys at most), far fewer than the changes
        assert all(0 < n <= 119 for n in read_rows), read_rows
        skipped = [r.getMessage() for r in caplog.records if "no newest-per-key window"
                   in r.getMessage()]
        assert len(skipped) == 2, skipped  # once per query started
    finally:
        relay.stop()


def test_the_window_is_skipped_only_where_one_row_per_key_is_shown(
        spark: SparkSession, tmp_path: Path) -> None:
    """one_row_per_key reads the plan: every way a batch could repeat a key keeps the
    window (docs/spark.md lists them)."""
    db = tmp_path / "acc.db"
    KeyWriter(db, seed=5).transaction()
    relay = start_relay(db, tmp_path, ["accounts"])
    try:
        wait_relay(relay, db)

        def flat(**opts: object) -> DataFrame:
            return stream(spark, relay, "accounts", partitions=2, envelope="flat",
                          **{"newestPerKey": "true", **opts})

        ok = flat()
        assert one_row_per_key(ok, ["id"])
        # projections and filters that pass the key through keep it shown
        assert one_row_per_key(ok.where("v > 0").select("id", "v", "_op", "_sequence")
                               .withColumn("x", F.lit(1)), ["id"])
        assert not one_row_per_key(ok, ["v"])  # not the primary key
        assert not one_row_per_key(ok, ["id", "v"])
        assert not one_row_per_key(ok.withColumn("id", F.col("id") % 3), ["id"])  # computed
        assert not one_row_per_key(  # another column named as the key
            ok.drop("id").withColumnRenamed("v", "id"), ["id"])
        assert not one_row_per_key(ok.union(flat()), ["id"])  # two streams
        assert not one_row_per_key(flat(newestPerKey="false"), ["id"])
        assert not one_row_per_key(  # every change, flattened by changes()
            changes(stream(spark, relay, "accounts", newestPerKey="true")), ["id"])
        assert not one_row_per_key(
            stream(spark, relay, "accounts", envelope="flat"), ["id"])
    finally:
        relay.stop()


def test_the_python_source_and_bad_values_refuse_it(
        spark: SparkSession, tmp_path: Path) -> None:
    db = tmp_path / "acc.db"
    KeyWriter(db, seed=1).transaction()
    relay = start_relay(db, tmp_path, ["accounts"])
    try:
        wait_relay(relay, db)
        with pytest.raises(ConfigError, match="newestPerKey is read by the JVM reader only"), \
                jvm.errors():
            read(spark, "databus-python", relay.url, "accounts", newestPerKey="true")
        with pytest.raises(ConfigError, match="newestPerKey"), jvm.errors():
            read(spark, "databus-jvm", relay.url, "accounts", newestPerKey="maybe")
        # false is every change, as without the option
        assert len(batch(spark, relay.url, "accounts", newestPerKey="false")) == len(
            batch(spark, relay.url, "accounts"))
    finally:
        relay.stop()
