"""Databus on Spark: the ``databus`` streaming source and apply_changes.

Needs the ``spark`` extra (pyspark, pyarrow, pandas) and Java 17. See
docs/spark.md.

Its names are handed on lazily (:mod:`databus.core.lazy`): Spark starts fresh
Python processes for a streaming query (the driver-side source runner, the
executors' readers), and each one only needs :mod:`databus.spark.source`; the
package import therefore must not pull in the snapshot reader's SQLAlchemy
stores or apply_changes (about half a second per process).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from databus.core.lazy import lazy_names

if TYPE_CHECKING:
    from databus.spark.apply import apply_changes, read_table
    from databus.spark.jvm import errors
    from databus.spark.lakehouse import (
        EvolvingQuery,
        initial_load,
        read_lakehouse,
        table_versions,
    )
    from databus.spark.session import session
    from databus.spark.snapshot import SnapshotDataSource, register_snapshot, snapshot_scn
    from databus.spark.source import DatabusDataSource, changes, register

__all__ = ["DatabusDataSource", "EvolvingQuery", "SnapshotDataSource", "apply_changes", "changes",
           "errors", "initial_load", "read_lakehouse", "read_table", "register", "register_snapshot", "session",
           "snapshot_scn", "table_versions"]

__getattr__ = lazy_names(__name__, {
    "databus.spark.apply": ["apply_changes", "read_table"],
    "databus.spark.jvm": ["errors"],
    "databus.spark.lakehouse": ["EvolvingQuery", "initial_load", "read_lakehouse",
                                "table_versions"],
    "databus.spark.session": ["session"],
    "databus.spark.snapshot": ["SnapshotDataSource", "register_snapshot", "snapshot_scn"],
    "databus.spark.source": ["DatabusDataSource", "changes", "register"],
})
