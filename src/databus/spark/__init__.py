"""Databus on Spark: the ``databus`` streaming source and apply_changes.

Needs the ``spark`` extra (pyspark, pyarrow, pandas) and Java 17. See
docs/spark.md.

The names below are imported on first use (PEP 562): Spark starts fresh
Python processes for a streaming query (the driver-side source runner, the
executors' readers), and each one only needs :mod:`databus.spark.source`; the
package import therefore must not pull in the snapshot reader's SQLAlchemy
stores or apply_changes (about half a second per process).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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

_WHERE = {
    "apply_changes": "apply", "read_table": "apply", "errors": "jvm",
    "EvolvingQuery": "lakehouse", "initial_load": "lakehouse", "read_lakehouse": "lakehouse", "table_versions": "lakehouse",
    "session": "session",
    "SnapshotDataSource": "snapshot", "register_snapshot": "snapshot", "snapshot_scn": "snapshot",
    "DatabusDataSource": "source", "changes": "source", "register": "source",
}

__all__ = ["DatabusDataSource", "EvolvingQuery", "SnapshotDataSource", "apply_changes", "changes",
           "errors", "initial_load", "read_lakehouse", "read_table", "register", "register_snapshot", "session",
           "snapshot_scn", "table_versions"]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'databus.spark' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"databus.spark.{module}"), name)
    globals()[name] = value
    return value
