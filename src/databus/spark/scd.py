"""The per-key reductions behind apply_changes (pure DataFrame transformations).

Input: the batch's changes (``<columns>, __seq, __kind, __bucket`` with
``__kind`` one of ``u`` upsert, ``d`` delete, ``t`` truncate) and the current
rows of the buckets they touch. Both are turned into one list of events per
key, ordered by sequence; an event present in both (a replayed batch) counts
once. The result is the new content of those buckets.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

BUCKET = "__bucket"


def _q(name: str) -> Column:
    return F.col(f"`{name}`")


def _events(changes: DataFrame, existing: DataFrame | None, columns: list[str]) -> DataFrame:
    """Batch changes and stored rows as one event list, deduplicated on (key, seq)."""
    cols = [_q(c) for c in columns]
    ev = changes.select(*cols, "__seq", "__kind", F.col(BUCKET).cast("int").alias(BUCKET),
                        F.lit(1).alias("__src"))
    if existing is not None:
        old = existing.select(
            *cols, F.col("__seq"),
            F.when(F.col("__deleted"), F.lit("d")).otherwise(F.lit("u")).alias("__kind"),
            F.col(BUCKET).cast("int").alias(BUCKET), F.lit(0).alias("__src"))
        ev = old.unionByName(ev)
    return ev


def _dedupe(ev: DataFrame, keys: tuple[str, ...]) -> DataFrame:
    # one event per (key, sequence): a stored row beats the same change replayed
    w = Window.partitionBy(*[_q(k) for k in keys], F.col("__seq")).orderBy(F.col("__src"))
    return ev.withColumn("__n", F.row_number().over(w)).where("__n = 1").drop("__n")


def _fill_nulls(ev: DataFrame, columns: list[str], keys: tuple[str, ...]) -> DataFrame:
    """ignore_null_updates: a null takes the previous value since the key's last delete."""
    kcols = [_q(k) for k in keys]
    order = Window.partitionBy(*kcols).orderBy("__seq").rowsBetween(
        Window.unboundedPreceding, Window.currentRow)
    ev = ev.withColumn("__seg", F.sum(F.when(F.col("__kind") == "d", 1).otherwise(0)).over(order))
    seg = Window.partitionBy(*kcols, F.col("__seg")).orderBy("__seq").rowsBetween(
        Window.unboundedPreceding, Window.currentRow)
    for c in columns:
        if c not in keys:
            ev = ev.withColumn(c, F.when(F.col("__kind") == "d", _q(c))
                               .otherwise(F.last(_q(c), ignorenulls=True).over(seg)))
    return ev.drop("__seg")


def reduce_scd1(changes: DataFrame, existing: DataFrame | None, columns: list[str],
                keys: tuple[str, ...], truncate_at: Any, ignore_null_updates: bool) -> DataFrame:
    """The current row (or tombstone) per key: the event with the highest sequence."""
    ev = _dedupe(_events(changes, existing, columns), keys)
    if truncate_at is not None:
        ev = ev.where((F.col("__kind") != "t") & (F.col("__seq") > F.lit(truncate_at)))
    if ignore_null_updates:
        ev = _fill_nulls(ev, columns, keys)
    w = Window.partitionBy(*[_q(k) for k in keys]).orderBy(F.col("__seq").desc())
    top = ev.withColumn("__n", F.row_number().over(w)).where("__n = 1")
    return top.select(*[_q(c) for c in columns], "__seq",
                      (F.col("__kind") == "d").alias("__deleted"), BUCKET)


def _stored_events(existing: DataFrame, columns: list[str]) -> DataFrame:
    """SCD2 rows back into the events they were built from (``__events``)."""
    one = existing.select(F.col(BUCKET), F.explode("__events").alias("__e"))
    return one.select(*[F.col(f"__e.`{c}`").alias(c) for c in columns],
                      F.col("__e.__seq").alias("__seq"), F.col("__e.__kind").alias("__kind"),
                      F.col(BUCKET).cast("int").alias(BUCKET), F.lit(0).alias("__src"))


def reduce_scd2(changes: DataFrame, existing: DataFrame | None, columns: list[str],
                keys: tuple[str, ...], tracked: list[str], ignore_null_updates: bool) -> DataFrame:
    """History: one version per run of upserts with equal tracked columns.

    A version starts at its first upsert (``__START_AT``) and carries the
    values of its last one (untracked columns are updated in place); it ends
    (``__END_AT``) where the next version or a delete starts. A delete is kept
    as a tombstone row starting and ending at its sequence. Each row keeps the
    events it was built from (``__events``), so a late change that falls
    inside a merged run is placed correctly by a later batch.
    """
    kcols = [_q(k) for k in keys]
    ev = changes.select(*[_q(c) for c in columns], "__seq", "__kind",
                        F.col(BUCKET).cast("int").alias(BUCKET), F.lit(1).alias("__src"))
    if existing is not None:
        ev = _stored_events(existing, columns).unionByName(ev)
    ev = _dedupe(ev, keys)
    if ignore_null_updates:
        ev = _fill_nulls(ev, columns, keys)
    by_seq = Window.partitionBy(*kcols).orderBy("__seq")
    if tracked:
        t_now = F.struct(*[_q(c) for c in tracked])
        same = t_now.eqNullSafe(F.lag(t_now).over(by_seq))
    else:
        same = F.lit(True)
    prev_kind = F.lag("__kind").over(by_seq)
    starts = (F.col("__kind") == "d") | prev_kind.isNull() | (prev_kind == "d") | ~same
    ev = ev.withColumn("__new", F.when(starts, 1).otherwise(0))
    ev = ev.withColumn("__vid", F.sum("__new").over(
        by_seq.rowsBetween(Window.unboundedPreceding, Window.currentRow)))
    data = [c for c in columns if c not in keys]
    event = F.struct(*[_q(c) for c in columns], F.col("__seq"), F.col("__kind"))
    versions = ev.groupBy(*kcols, "__vid").agg(
        F.min("__seq").alias("__START_AT"), F.first(BUCKET).alias(BUCKET),
        F.max_by(event, "__seq").alias("__last"),
        F.array_sort(F.collect_list(event)).alias("__events"))
    kind = F.col("__last.__kind")
    nxt = F.lead("__START_AT").over(Window.partitionBy(*kcols).orderBy("__START_AT"))
    return versions.select(
        *kcols, *[F.col(f"__last.`{c}`").alias(c) for c in data],
        "__START_AT",
        F.when(kind == "d", F.col("__START_AT")).otherwise(nxt).alias("__END_AT"),
        (kind == "d").alias("__deleted"), "__events", BUCKET,
    )
