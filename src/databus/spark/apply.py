"""apply_changes: materialise a change stream into a Parquet table (SCD type 1 or 2).

Shaped like ``pyspark.pipelines.create_auto_cdc_flow``. Each micro-batch (in
``foreachBatch``) is merged into the target per *key bucket*:
``__bucket = pmod(xxhash64(keys), buckets)`` is the table's partition column.
For every bucket the batch touches, the bucket's current files and the batch's
changes are reduced per key in sequence order; the merged rows are written as
new files and only then are the bucket's previous files removed, so a crash at
any point leaves either the old files, or old and new together (readers and
the next merge take the highest sequence per key), never a lost bucket. This
is the dynamic-partition-overwrite idea with the commit order made crash-safe.

Ordering: the highest ``sequence_by`` value wins, whatever order batches come
in; a replayed batch changes nothing. Deletes are kept as tombstone rows
(``__deleted``) so a late, older change cannot resurrect a deleted key. Read
the table with :func:`read_table`, which returns live rows only.

Table layout (hidden columns start with ``__``)::

    SCD1: <columns>, __seq, __deleted, __written, __bucket (partition)
    SCD2: <columns>, __START_AT, __END_AT, __deleted, __events, __written, __bucket

and ``_databus_table.json`` (keys, SCD type, buckets), written atomically
before the first data. Targets are local paths in this release.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from databus.core.atomic import write_atomic
from databus.core.errors import ConfigError
from databus.spark import jvm
from databus.spark.lakehouse import EvolvingQuery, TableApplier, query_app_id
from databus.spark.perkey import one_row_per_key
from databus.spark.scd import reduce_scd1, reduce_scd2
from databus.spark.spec import BUCKET, ApplySpec
from databus.spark.targets import is_uri

META_FILE = "_databus_table.json"


@dataclass(frozen=True)
class TableMeta:
    """What a reader needs to know about a target table."""

    keys: tuple[str, ...]
    scd_type: int
    buckets: int

    @classmethod
    def load(cls, target: str | Path) -> TableMeta:
        path = Path(target) / META_FILE
        try:
            raw = json.loads(path.read_text())
            return cls(tuple(raw["keys"]), int(raw["scd_type"]), int(raw["buckets"]))
        except FileNotFoundError:
            raise ConfigError(f"{target} is not an apply_changes table (no {META_FILE})") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{path} is unreadable: {exc}") from exc



class ChangeApplier:
    """The ``foreachBatch`` function: merges one batch of changes into the target."""

    def __init__(self, spec: ApplySpec) -> None:
        self.spec = spec
        self.root = Path(spec.target)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        self.apply(batch)

    def _write_meta(self) -> None:
        meta = TableMeta(self.spec.keys, self.spec.stored_as_scd_type, self.spec.buckets)
        path = self.root / META_FILE
        if path.exists():
            known = TableMeta.load(self.root)
            if known != meta:
                raise ConfigError(
                    f"apply_changes: {self.root} was created with {asdict(known)}, not {asdict(meta)}")
            return
        self.root.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(asdict(meta)).encode())

    def apply(self, batch: DataFrame) -> None:
        """Merge ``batch`` (a static DataFrame of changes) into the target."""
        spec = self.spec
        self._write_meta()
        columns = spec.columns(batch)
        changes = spec.changes(batch)
        changes = changes.withColumn(BUCKET, _bucket(spec)).persist()  # read the source once
        try:
            self._merge(changes, columns)
        finally:
            changes.unpersist()

    def _merge(self, changes: DataFrame, columns: list[str]) -> None:
        spec = self.spec
        touched = sorted(r[0] for r in changes.select(BUCKET).distinct().collect())
        if not touched:
            return
        truncate_at = None
        if spec.apply_as_truncates is not None:
            truncate_at = changes.where("__kind = 't'").agg(F.max("__seq")).collect()[0][0]
        if truncate_at is not None:
            touched = list(range(spec.buckets))
        old_files = self._files(touched)
        existing = self._existing(changes.sparkSession, old_files)
        if spec.stored_as_scd_type == 1:
            result = reduce_scd1(changes, existing, columns, spec.keys, truncate_at,
                                 spec.ignore_null_updates)
        else:
            result = reduce_scd2(changes, existing, columns, spec.keys, spec.tracked(columns),
                                 spec.ignore_null_updates)
        (result.withColumn("__written", F.lit(time.time_ns()))
         .repartition(BUCKET).write.mode("append").partitionBy(BUCKET).parquet(str(self.root)))
        for f in old_files:  # the new files are committed: the old ones are superseded
            f.unlink(missing_ok=True)
            f.with_name(f".{f.name}.crc").unlink(missing_ok=True)

    def _files(self, buckets: Sequence[int]) -> list[Path]:
        out: list[Path] = []
        for b in buckets:
            out.extend(sorted((self.root / f"{BUCKET}={b}").glob("*.parquet")))
        return out

    def _existing(self, spark: SparkSession, files: list[Path]) -> DataFrame | None:
        if not files:
            return None
        return (spark.read.option("basePath", str(self.root))
                .parquet(*[str(f) for f in files]).drop("__written"))


def _bucket(spec: ApplySpec) -> Column:
    return F.pmod(F.xxhash64(*[F.col(f"`{k}`") for k in spec.keys]), F.lit(spec.buckets))


def apply_changes(
    *,
    target: str,
    source: DataFrame | Callable[[], DataFrame],
    keys: Sequence[str],
    sequence_by: str | Column,
    checkpoint_location: str,
    apply_as_deletes: str | Column | None = None,
    apply_as_truncates: str | Column | None = None,
    column_list: Sequence[str] | None = None,
    except_column_list: Sequence[str] | None = None,
    stored_as_scd_type: int | str = 1,
    track_history_column_list: Sequence[str] | None = None,
    track_history_except_column_list: Sequence[str] | None = None,
    ignore_null_updates: bool = False,
    buckets: int = 16,
    format: Literal["parquet", "delta", "iceberg"] = "parquet",
    app_id: str | None = None,
    trigger: dict[str, Any] | None = None,
    query_name: str | None = None,
) -> StreamingQuery | EvolvingQuery:
    """Start a streaming query that applies ``source``'s changes to the table at ``target``.

    ``source`` is a streaming DataFrame with the row's columns at top level
    (see :func:`databus.spark.changes` for the databus envelope), or a
    function that builds it: then the query is restarted from its checkpoint
    with a newly built source when the source's table gains columns, and an
    :class:`~databus.spark.lakehouse.EvolvingQuery` is returned. The
    arguments mean what they mean for ``create_auto_cdc_flow``. ``format``:

    * ``parquet``: ``target`` is a local directory (this module; a URI is refused);
    * ``delta``: ``target`` is a directory, a URI (``s3a://...``, ``abfss://...``,
      ``hdfs://...``: :mod:`databus.spark.targets`) or a table name of the session
      catalog; ``iceberg``: a table name of an Iceberg catalog
      (``local.db.customers``). One MERGE per batch, exactly once under the
      query's id (``app_id`` overrides it); see :mod:`databus.spark.lakehouse`.

    ``trigger`` is passed to ``DataStreamWriter.trigger`` (e.g.
    ``{"availableNow": True}``). Returns the started query.
    """
    spec = ApplySpec(
        target=target, keys=tuple(keys), sequence_by=sequence_by,
        apply_as_deletes=apply_as_deletes, apply_as_truncates=apply_as_truncates,
        column_list=tuple(column_list) if column_list is not None else None,
        except_column_list=tuple(except_column_list) if except_column_list is not None else None,
        stored_as_scd_type=int(stored_as_scd_type),
        track_history_column_list=(tuple(track_history_column_list)
                                   if track_history_column_list is not None else None),
        track_history_except_column_list=(tuple(track_history_except_column_list)
                                          if track_history_except_column_list is not None
                                          else None),
        ignore_null_updates=ignore_null_updates, buckets=buckets,
    )
    fn: Callable[[DataFrame, int], None]
    if format == "parquet" and is_uri(target):
        raise ConfigError(f"apply_changes: a parquet target is a local directory, not a URI "
                          f"({target}): for object stores and HDFS use format='delta' or "
                          "'iceberg'")
    if format == "parquet":
        fn = ChangeApplier(spec)
    elif format in ("delta", "iceberg"):
        fn = TableApplier(spec, format,
                          (lambda: app_id) if app_id else query_app_id(checkpoint_location))
    else:
        raise ConfigError(f"apply_changes: format must be parquet, delta or iceberg, not {format!r}")

    def start() -> StreamingQuery:
        with jvm.errors():  # the JVM reader's load() failures as the DatabusError they stand for
            df = source() if callable(source) else source
        spec.columns(df)  # fail before starting on unknown columns
        if isinstance(fn, TableApplier) and spec.stored_as_scd_type == 1:
            fn.one_row_per_key = one_row_per_key(df, spec.keys)
        writer = df.writeStream.foreachBatch(fn).option("checkpointLocation", checkpoint_location)
        if trigger:
            writer = writer.trigger(**trigger)
        if query_name:
            writer = writer.queryName(query_name)
        return writer.start()

    if callable(source):
        return EvolvingQuery(start)
    return start()


def read_table(spark: SparkSession, target: str, *, current_only: bool = False) -> DataFrame:
    """The live rows of an apply_changes table (tombstones and duplicates removed).

    SCD1: one row per live key. SCD2: every version with ``__START_AT`` and
    ``__END_AT`` (``current_only`` keeps the open versions).
    """
    meta = TableMeta.load(target)
    raw = spark.read.parquet(target)
    keys = [F.col(f"`{k}`") for k in meta.keys]
    if meta.scd_type == 1:
        w = Window.partitionBy(*keys).orderBy(F.col("__seq").desc(), F.col("__written").desc())
        hidden = ["__seq"]
    else:
        w = Window.partitionBy(*keys, F.col("__START_AT")).orderBy(F.col("__written").desc())
        hidden = []
    live = (raw.withColumn("__rank", F.row_number().over(w)).where("__rank = 1")
            .where(~F.col("__deleted")))
    if meta.scd_type == 2 and current_only:
        live = live.where(F.col("__END_AT").isNull())
    return live.drop("__rank", "__deleted", "__written", "__events", BUCKET, *hidden)
