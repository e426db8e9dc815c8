"""A Spark session with the pinned Delta Lake and Apache Iceberg jars: :func:`session`.

The jars come from the Java bundles ``delta`` and ``iceberg``
(``scripts/java/*.pom.xml``, fetched once by ``scripts/setup.sh`` into the
cache that :mod:`databus.javadeps` reads); nothing is downloaded here, and a
missing bundle is a :class:`~databus.core.errors.ConfigError` naming the
command that fetches it. The JVM reader of the ``databus`` format
(:mod:`databus.spark.jvm`, built here from ``java/spark-source``) is put on the
classpath too unless ``source="python"``. Jars reach the JVM only when it starts:
call this before anything else in the process creates a session.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from pyspark.sql import SparkSession

from databus import javadeps
from databus.core.errors import ConfigError
from databus.spark import jvm

LAKEHOUSE = ("delta", "iceberg")
_EXTENSIONS = {
    "delta": "io.delta.sql.DeltaSparkSessionExtension",
    "iceberg": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
}


def session(
    app: str = "databus",
    *,
    master: str = "local[*]",
    lakehouse: Sequence[str] = LAKEHOUSE,
    warehouse: str | Path | None = None,
    iceberg_catalog: str = "local",
    conf: Mapping[str, str] | None = None,
    source: str | None = None,
) -> SparkSession:
    """A new (or the running) session able to read and write ``lakehouse`` formats.

    * ``delta``: Delta's SQL extension, and the session catalog is Delta's
      (``spark_catalog``), so ``CREATE TABLE ... USING delta`` and
      ``delta.`/path``` names work.
    * ``iceberg``: Iceberg's SQL extension and a Hadoop catalog named
      ``iceberg_catalog`` whose tables live under ``warehouse`` (default
      ``./spark-warehouse/iceberg``): tables are ``local.db.name``.

    The Python workers run this interpreter unless ``PYSPARK_PYTHON`` says
    otherwise, started by :mod:`databus.spark.workerd` (pyspark's daemon,
    importing pyspark without its zip copy). ``conf`` entries are set last and
    win.

    ``source``: which reader serves ``format("databus")``: ``jvm`` (the default, or
    ``$DATABUS_SPARK_SOURCE``) puts the JVM reader's jar on the classpath when it
    can be built here, else the Python source serves; ``python`` leaves it off.
    ``format("databus-python")`` is the Python source either way. The same jar
    serves ``format("databus-snapshot")`` for a bootstrap server's URL.
    """
    unknown = [f for f in lakehouse if f not in _EXTENSIONS]
    if unknown:
        raise ConfigError(f"databus.spark.session: unknown lakehouse formats {unknown} "
                          f"(known: {', '.join(LAKEHOUSE)})")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    jars = [str(j) for fmt in lakehouse for j in javadeps.jars(fmt)]
    if jvm.implementation(source) == "jvm":
        reader = jvm.jar()
        if reader is not None:
            jars.append(str(reader))
    b = SparkSession.builder.master(master).appName(app)
    if jars:
        b = b.config("spark.jars", ",".join(jars))
    if lakehouse:
        b = b.config("spark.sql.extensions", ",".join(_EXTENSIONS[f] for f in lakehouse))
    if "delta" in lakehouse:
        b = b.config("spark.sql.catalog.spark_catalog",
                     "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        # small local tables: the default of 50 partitions for Delta's log state makes every
        # commit of a small table schedule 50 tasks (measured: 5 min 47 s -> 58 s for a test run)
        b = b.config("spark.databricks.delta.snapshotPartitions", "2")
    if "iceberg" in lakehouse:
        where = Path(warehouse) if warehouse is not None else Path("spark-warehouse") / "iceberg"
        cat = f"spark.sql.catalog.{iceberg_catalog}"
        b = (b.config(cat, "org.apache.iceberg.spark.SparkCatalog")
             .config(f"{cat}.type", "hadoop")
             .config(f"{cat}.warehouse", str(where.absolute()))
             # a streaming query writes through its own (cloned) session, whose catalog is not
             # this one: with Iceberg's table cache, reads here would miss its commits for 30 s
             .config(f"{cat}.cache-enabled", "false"))
    # executors' Python workers import pyspark from its package, not from the zip copy
    # Spark puts first on their path (databus.spark.workerd says why: per-task cost)
    b = b.config("spark.python.daemon.module", "databus.spark.workerd")
    for k, v in (conf or {}).items():
        b = b.config(k, v)
    return b.getOrCreate()
