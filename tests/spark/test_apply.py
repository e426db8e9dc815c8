"""apply_changes semantics on static batches: order, replays, deletes, options.

Batches are applied through the same ``foreachBatch`` function the streaming
query uses (``ChangeApplier``), in shuffled order and with replays; the table
must equal a plain-Python reference fold of all changes in sequence order.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from databus.core.errors import ConfigError
from databus.spark.apply import ChangeApplier, read_table
from databus.spark.lakehouse import TableApplier
from databus.spark.spec import ApplySpec

Change = tuple[int, int, str, str | None, int | None]  # id, seq, op, a, b
COLS = ["id", "seq", "op", "a", "b"]


def random_changes(seed: int, n: int = 300) -> list[Change]:
    rng = random.Random(seed)
    out: list[Change] = []
    for seq in range(1, n + 1):
        key = rng.randrange(1, 25)
        op = rng.choices(["u", "d"], weights=[4, 1])[0]
        # "a" repeats sometimes so unchanged versions get merged in SCD2
        out.append((key, seq, op, None if op == "d" else f"a{rng.randrange(4)}",
                    None if op == "d" else rng.randrange(1000)))
    return out


def applier(tmp: Path, **kw: Any) -> ChangeApplier:
    args: dict[str, Any] = {"except_column_list": ("seq", "op"), **kw}
    spec = ApplySpec(target=str(tmp / "t"), keys=("id",), sequence_by="seq",
                     apply_as_deletes="op = 'd'", buckets=4, **args)
    return ChangeApplier(spec)


def apply_shuffled(spark: SparkSession, app: ChangeApplier, changes: list[Change],
                   seed: int) -> None:
    rng = random.Random(seed)
    shuffled = changes[:]
    rng.shuffle(shuffled)
    chunks = [shuffled[i::4] for i in range(4)]
    for chunk in [*chunks, chunks[1]]:  # the last one is a replay
        app.apply(spark.createDataFrame(chunk, "id long, seq long, op string, a string, b long"))


def test_scd1_out_of_order_and_replayed_batches(spark: SparkSession, tmp_path: Path) -> None:
    changes = random_changes(1)
    app = applier(tmp_path)
    apply_shuffled(spark, app, changes, seed=2)
    latest: dict[int, Change] = {}
    for c in sorted(changes, key=lambda c: c[1]):
        latest[c[0]] = c
    want = sorted((c[0], c[3], c[4]) for c in latest.values() if c[2] != "d")
    got = sorted(tuple(r) for r in read_table(spark, app.spec.target).select("id", "a", "b")
                 .collect())
    assert got == want


def test_scd2_out_of_order_history(spark: SparkSession, tmp_path: Path) -> None:
    changes = random_changes(3, n=200)
    app = applier(tmp_path, stored_as_scd_type=2, track_history_column_list=("a",))
    apply_shuffled(spark, app, changes, seed=4)
    want: list[tuple[Any, ...]] = []
    by_key: dict[int, list[Change]] = {}
    for c in sorted(changes, key=lambda c: c[1]):
        by_key.setdefault(c[0], []).append(c)
    for key, evs in by_key.items():
        versions: list[list[Any]] = []  # [id, a, b, start, end]
        prev: Change | None = None
        for c in evs:
            if versions and versions[-1][4] is None:
                if c[2] == "d" or c[3] != versions[-1][1]:
                    versions[-1][4] = c[1]  # closes the open version
                elif prev is not None and prev[2] != "d":
                    versions[-1][2] = c[4]  # untracked column: updated in place
            if c[2] != "d" and (prev is None or prev[2] == "d" or c[3] != prev[3]):
                versions.append([key, c[3], c[4], c[1], None])
            prev = c
        want.extend(tuple(v) for v in versions)
    got = sorted(tuple(r) for r in read_table(spark, app.spec.target)
                 .select("id", "a", "b", "__START_AT", "__END_AT").collect())
    assert got == sorted(want)


def test_ignore_null_updates_keeps_stored_values(spark: SparkSession, tmp_path: Path) -> None:
    app = applier(tmp_path, ignore_null_updates=True)
    schema = "id long, seq long, op string, a string, b long"
    app.apply(spark.createDataFrame([(1, 1, "u", "x", 10), (2, 2, "u", "y", 20)], schema))
    app.apply(spark.createDataFrame([(1, 3, "u", None, 11), (2, 4, "d", None, None),
                                     (2, 5, "u", None, 21)], schema))
    got = sorted(tuple(r) for r in read_table(spark, app.spec.target).collect())
    # key 2 was deleted before its null update: nothing to keep from before the delete
    assert got == [(1, "x", 11), (2, None, 21)]


def test_truncate_drops_older_rows(spark: SparkSession, tmp_path: Path) -> None:
    spec = ApplySpec(target=str(tmp_path / "t"), keys=("id",), sequence_by="seq",
                     apply_as_deletes="op = 'd'", apply_as_truncates="op = 't'",
                     column_list=("id", "a"), buckets=4)
    app = ChangeApplier(spec)
    schema = "id long, seq long, op string, a string"
    app.apply(spark.createDataFrame([(k, k, "u", f"v{k}") for k in range(1, 9)], schema))
    app.apply(spark.createDataFrame([(0, 20, "t", None), (3, 21, "u", "new"),
                                     (4, 19, "u", "lost")], schema))
    assert [tuple(r) for r in read_table(spark, spec.target).collect()] == [(3, "new")]


def test_deletes_win_over_older_late_changes(spark: SparkSession, tmp_path: Path) -> None:
    app = applier(tmp_path)
    schema = "id long, seq long, op string, a string, b long"
    app.apply(spark.createDataFrame([(7, 10, "d", None, None)], schema))
    app.apply(spark.createDataFrame([(7, 5, "u", "late", 1)], schema))  # older than the delete
    assert read_table(spark, app.spec.target).count() == 0
    raw = spark.read.parquet(app.spec.target)
    assert raw.where("__deleted").count() == 1  # the tombstone keeps the order


@pytest.mark.parametrize(("kw", "message"), [
    ({"keys": ()}, "keys"),
    ({"stored_as_scd_type": 3}, "stored_as_scd_type"),
    ({"column_list": ("id",), "except_column_list": ("a",)}, "not both"),
    ({"track_history_column_list": ("a",)}, "stored_as_scd_type=2"),
    ({"stored_as_scd_type": 2, "apply_as_truncates": "op = 't'"}, "SCD type 1"),
])
def test_bad_arguments_are_config_errors(tmp_path: Path, kw: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {"target": str(tmp_path), "keys": ("id",), "sequence_by": "seq", **kw}
    with pytest.raises(ConfigError, match=message):
        ApplySpec(**args)


def test_unknown_columns_fail_before_writing(spark: SparkSession, tmp_path: Path) -> None:
    app = applier(tmp_path, column_list=("id", "nope"), except_column_list=None)
    with pytest.raises(ConfigError, match="nope"):
        app.apply(spark.createDataFrame([(1, 1, "u", "x", 1)], COLS))


def test_a_table_not_made_by_apply_changes_is_refused(
        spark: SparkSession, tmp_path: Path) -> None:
    spark.sql(f"CREATE TABLE plain_merge_target (id long, a string, b long, __seq long)"
              f" USING parquet LOCATION '{tmp_path / 'plain'}'")
    try:
        spec = ApplySpec(target="plain_merge_target", keys=("id",), sequence_by="seq",
                         apply_as_deletes="op = 'd'", except_column_list=("op", "seq"))
        batch = spark.createDataFrame([(1, 1, "u", "x", 1)], COLS)
        with pytest.raises(ConfigError, match="not made by apply_changes"):
            TableApplier(spec, "delta", lambda: "app")(batch, 0)
    finally:
        spark.sql("DROP TABLE plain_merge_target")
