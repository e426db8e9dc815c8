"""Databus on Spark: the ``databus`` streaming source and apply_changes.

Needs the ``spark`` extra (pyspark, pyarrow, pandas) and Java 17. See
docs/spark.md.
"""

from databus.spark.apply import apply_changes, read_table
from databus.spark.snapshot import SnapshotDataSource, register_snapshot, snapshot_scn
from databus.spark.source import DatabusDataSource, changes, register

__all__ = ["DatabusDataSource", "SnapshotDataSource", "apply_changes", "changes", "read_table",
           "register", "register_snapshot", "snapshot_scn"]
