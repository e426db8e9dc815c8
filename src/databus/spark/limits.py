"""Read limits of a streaming source on the Spark line databus pins (4.1), and on later ones.

Spark 4.2 added admission control to Python streaming sources
(``pyspark.sql.streaming.datasource``: ``latestOffset(start, limit)``, read
limits, ``SupportsTriggerAvailableNow``). The project pins pyspark 4.1 because
no Apache Iceberg runtime works on a later line yet (docs/spark.md); there the
module does not exist and Spark calls ``latestOffset()`` with no arguments.
This module gives the source one set of names on both:

* on 4.2 and later, Spark's own classes;
* on 4.1, plain stand-ins with the same attributes. The source then keeps the
  batch's start itself (the end offset it last returned) and applies
  ``maxRowsPerBatch``/``maxBytesPerBatch`` from it. Two
  limits of 4.1, documented in docs/spark.md: the first batch a fresh reader
  plans (a new or restarted query) is not capped, and an ``availableNow`` run
  reads everything up to the relay's newest window in one batch (Spark asks a
  source without the 4.2 interface for one end offset only).
"""

from __future__ import annotations

try:
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxBytes,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )

    ADMISSION_CONTROL = True
except ImportError:  # Spark 4.1
    ADMISSION_CONTROL = False

    class ReadLimit:  # type: ignore[no-redef]
        """How much one micro-batch may read."""

    class ReadAllAvailable(ReadLimit):  # type: ignore[no-redef,misc]
        """Everything available."""

    class ReadMaxRows(ReadLimit):  # type: ignore[no-redef,misc]
        """At most ``max_rows`` rows (whole windows: at least one)."""

        def __init__(self, max_rows: int) -> None:
            self.max_rows = max_rows

    class ReadMaxBytes(ReadLimit):  # type: ignore[no-redef,misc]
        """At most ``max_bytes`` bytes (whole windows: at least one)."""

        def __init__(self, max_bytes: int) -> None:
            self.max_bytes = max_bytes

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Spark 4.1 never calls ``prepareForTriggerAvailableNow`` on a Python source."""

__all__ = ["ADMISSION_CONTROL", "ReadAllAvailable", "ReadLimit", "ReadMaxBytes", "ReadMaxRows",
           "SupportsTriggerAvailableNow"]
