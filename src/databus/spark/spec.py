"""What ``apply_changes`` was asked to do, validated: :class:`ApplySpec`.

Shared by the two ways a batch is applied: into a Parquet table
(:mod:`databus.spark.apply`) and into a MERGE-capable catalog table
(:mod:`databus.spark.lakehouse`). Also names the table's hidden columns.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from databus.core.errors import ConfigError

BUCKET = "__bucket"  # the partition column of a Parquet target
HIDDEN = ("__seq", "__deleted", "__written", BUCKET, "__START_AT", "__END_AT", "__events")


@dataclass
class ApplySpec:
    """The arguments of :func:`apply_changes` once validated (see its docstring)."""

    target: str
    keys: tuple[str, ...]
    sequence_by: str | Column
    apply_as_deletes: str | Column | None = None
    apply_as_truncates: str | Column | None = None
    column_list: tuple[str, ...] | None = None
    except_column_list: tuple[str, ...] | None = None
    stored_as_scd_type: int = 1
    track_history_column_list: tuple[str, ...] | None = None
    track_history_except_column_list: tuple[str, ...] | None = None
    ignore_null_updates: bool = False
    buckets: int = 16

    def __post_init__(self) -> None:
        if not self.keys:
            raise ConfigError("apply_changes: keys must name at least one column")
        if self.stored_as_scd_type not in (1, 2):
            raise ConfigError("apply_changes: stored_as_scd_type must be 1 or 2")
        if self.column_list is not None and self.except_column_list is not None:
            raise ConfigError("apply_changes: give column_list or except_column_list, not both")
        if (self.track_history_column_list is not None
                and self.track_history_except_column_list is not None):
            raise ConfigError("apply_changes: give track_history_column_list or "
                              "track_history_except_column_list, not both")
        if self.stored_as_scd_type == 1 and (self.track_history_column_list is not None or
                                             self.track_history_except_column_list is not None):
            raise ConfigError("apply_changes: track_history_* needs stored_as_scd_type=2")
        if self.stored_as_scd_type == 2 and self.apply_as_truncates is not None:
            raise ConfigError("apply_changes: apply_as_truncates is for SCD type 1 only")
        if not 1 <= self.buckets <= 4096:
            raise ConfigError("apply_changes: buckets must be within 1..4096")

    def columns(self, df: DataFrame) -> list[str]:
        """The stored columns, keys first, in the source's order."""
        names = list(df.columns)
        if self.column_list is not None:
            chosen = list(self.column_list)
        elif self.except_column_list is not None:
            chosen = [c for c in names if c not in set(self.except_column_list)]
        else:
            chosen = names
        missing = [c for c in (*self.keys, *chosen) if c not in names]
        if missing:
            raise ConfigError(f"apply_changes: columns {missing} are not in the source {names}")
        clash = [c for c in chosen if c in HIDDEN]
        if clash:
            raise ConfigError(f"apply_changes: source columns {clash} clash with table internals")
        return [*self.keys, *[c for c in chosen if c not in self.keys]]

    def changes(self, batch: DataFrame) -> DataFrame:
        """The batch as ``<stored columns>, __seq, __kind`` (``u`` upsert, ``d`` delete,
        ``t`` truncate): what both ways of applying a batch start from."""

        def expr(c: str | Column | None) -> Column:
            if c is None:
                return F.lit(False)
            return F.coalesce(F.expr(c) if isinstance(c, str) else c, F.lit(False))

        kind = (F.when(expr(self.apply_as_truncates), F.lit("t"))
                .when(expr(self.apply_as_deletes), F.lit("d")).otherwise(F.lit("u")))
        seq = F.expr(self.sequence_by) if isinstance(self.sequence_by, str) else self.sequence_by
        return batch.select(*[F.col("`" + c.replace("`", "``") + "`")
                              for c in self.columns(batch)],
                            seq.alias("__seq"), kind.alias("__kind"))

    def tracked(self, columns: list[str]) -> list[str]:
        data = [c for c in columns if c not in self.keys]
        if self.track_history_column_list is not None:
            return [c for c in data if c in self.track_history_column_list]
        if self.track_history_except_column_list is not None:
            return [c for c in data if c not in self.track_history_except_column_list]
        return data
