"""apply_changes into a MERGE-capable catalog table (Delta Lake, Iceberg), SCD type 1.

NOT TESTED against Delta or Iceberg: their jars cannot be downloaded on this
project's machines. The tests only check that a table without MERGE support
fails with a clear :class:`~databus.core.errors.ConfigError`.

Contract: the target table exists and has the stored columns plus ``__seq``
(the ``sequence_by`` type) and ``__deleted`` (boolean). Each batch is reduced
to its highest-sequence change per key, then merged with
``DataFrame.mergeInto``: a matched row is replaced only by a higher sequence,
an unmatched key is inserted; deletes are stored as tombstones
(``__deleted = true``) so a late, older change cannot bring a key back. Read
live rows with ``spark.table(name).where("NOT __deleted")``.
"""

from __future__ import annotations

from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from databus.core.errors import ConfigError
from databus.spark.spec import ApplySpec


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def merge_batch(batch: DataFrame, spec: ApplySpec) -> None:
    """Merge one batch of changes into the catalog table ``spec.target``."""
    if spec.stored_as_scd_type != 1 or spec.apply_as_truncates is not None:
        raise ConfigError("apply_changes into a MERGE table supports SCD type 1 without "
                          "truncates only")
    columns = spec.columns(batch)
    seq = F.expr(spec.sequence_by) if isinstance(spec.sequence_by, str) else spec.sequence_by
    deletes = (F.expr(spec.apply_as_deletes) if isinstance(spec.apply_as_deletes, str)
               else spec.apply_as_deletes if spec.apply_as_deletes is not None else F.lit(False))
    changes = batch.select(*[F.col(_q(c)) for c in columns], seq.alias("__seq"),
                           F.coalesce(deletes, F.lit(False)).alias("__deleted"))
    w = Window.partitionBy(*[F.col(_q(k)) for k in spec.keys]).orderBy(F.col("__seq").desc())
    top = changes.withColumn("__n", F.row_number().over(w)).where("__n = 1").drop("__n")
    target = spec.target.split(".")[-1].strip("`")
    on = " AND ".join(f"{_q(target)}.{_q(k)} <=> __src.{_q(k)}" for k in spec.keys)
    try:
        (top.alias("__src").mergeInto(spec.target, F.expr(on))
         .whenMatched(F.expr(f"__src.__seq > {_q(target)}.__seq")).updateAll()
         .whenNotMatched().insertAll()
         .merge())
    except PySparkException as exc:
        raise ConfigError(
            f"apply_changes: MERGE into {spec.target} failed (the table must support MERGE, "
            f"e.g. Delta or Iceberg on the classpath, and have the columns {columns} plus "
            f"__seq and __deleted): {exc}") from exc
