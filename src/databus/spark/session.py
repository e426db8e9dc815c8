"""A Spark session with the pinned Delta Lake and Apache Iceberg jars: :func:`session`.

The jars come from the Java bundles ``delta`` and ``iceberg``
(``scripts/java/*.pom.xml``, fetched once by ``scripts/setup.sh`` into the
cache that :mod:`databus.javadeps` reads); nothing is downloaded here, and a
missing bundle is a :class:`~databus.core.errors.ConfigError` naming the
command that fetches it. The JVM reader of the ``databus`` format
(:mod:`databus.spark.jvm`, built here from ``java/spark-source``) is put on the
classpath too unless ``source="python"``; when it cannot be had, a warning says why.

What the session is started with is kept, and databus only adds to it: under
``spark-submit`` (or with ``PYSPARK_SUBMIT_ARGS``, ``spark-defaults.conf``) the
JVM already knows a master, jars and settings. The driver's JVM is started (or
joined) first, its settings read back, and then:

* the master is the JVM's (``spark.master``; Spark's own default is ``local[*]``)
  unless ``master=`` is given;
* ``spark.jars`` is the JVM's list, then ``conf["spark.jars"]``, then databus's jars,
  each once; the jars the driver's class loader lacks are added to it (what
  ``spark-submit --jars`` does), so Delta's and Iceberg's session extensions and the
  JVM reader load on the driver, and executors fetch every jar from ``spark.jars``;
* ``spark.sql.extensions`` is likewise the JVM's list plus databus's;
* every other setting databus makes is a default: a value from the JVM, or from
  ``conf``, wins.

A session already running in the process is returned as it is (its master, jars
and settings cannot change any more); only the JVM reader's jar is added to it when
missing (``SparkContext.addJar`` and the driver's class loader), and a lakehouse
format whose extension it lacks is a warning.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from urllib.parse import unquote, urlparse

from pyspark import SparkConf, SparkContext
from pyspark.sql import SparkSession

from databus import javadeps
from databus.core.errors import ConfigError
from databus.spark import jvm, lines

log = logging.getLogger("databus.spark")

LAKEHOUSE = ("delta", "iceberg")
_EXTENSIONS = {
    "delta": "io.delta.sql.DeltaSparkSessionExtension",
    "iceberg": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
}
# set by session() itself, merged rather than replaced (see the module docstring)
_MERGED = ("spark.jars", "spark.sql.extensions")


def session(
    app: str | None = None,
    *,
    master: str | None = None,
    lakehouse: Sequence[str] | None = None,
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

    ``lakehouse`` defaults to every format the running Spark line has jars for
    (:mod:`databus.spark.lines`: Delta and Iceberg on 4.1, Delta on 4.2); naming a format
    the line lacks is a ConfigError saying why.

    ``app``: the application's name (default: the one the JVM was started with,
    e.g. by ``spark-submit --name``, else ``databus``). ``master``: default the
    JVM's (``spark-submit --master``), else ``local[*]``. ``conf``: settings applied
    over databus's defaults; its ``spark.jars`` and ``spark.sql.extensions`` are
    merged with databus's (see the module docstring).

    The Python workers run this interpreter unless ``PYSPARK_PYTHON`` says
    otherwise, started by :mod:`databus.spark.workerd` (pyspark's daemon,
    importing pyspark without its zip copy).

    ``source``: which reader serves ``format("databus")``: ``jvm`` (the default, or
    ``$DATABUS_SPARK_SOURCE``) puts the JVM reader's jar on the classpath (a warning
    names why when it cannot be had; the Python source then serves); ``python``
    leaves it off. ``format("databus-python")`` is the Python source either way. The
    same jar serves ``format("databus-snapshot")`` for a bootstrap server's URL.
    """
    unknown = [f for f in (lakehouse or ()) if f not in _EXTENSIONS]
    if unknown:
        raise ConfigError(f"databus.spark.session: unknown lakehouse formats {unknown} "
                          f"(known: {', '.join(LAKEHOUSE)})")
    line = lines.current()
    if lakehouse is None:
        lakehouse = lines.formats(line)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    user = dict(conf or {})
    ours = [str(j) for fmt in lakehouse for j in javadeps.jars(lines.bundle(line, fmt))]
    reader = jvm.jar() if jvm.implementation(source) == "jvm" else None
    if reader is not None:
        ours.append(str(reader))
    if SparkContext._active_spark_context is not None:
        return _running(user, reader, lakehouse)

    # the JVM first (spark-submit's, or a new one with every setting but the jars), so that
    # what it was started with can be read back and kept
    launch = {k: v for k, v in user.items() if k not in _MERGED}
    if master is not None:
        launch["spark.master"] = master
    SparkContext._ensure_initialized(conf=SparkConf(loadDefaults=False).setAll(list(launch.items())))
    started = dict(SparkConf().getAll())  # loads the JVM's spark.* system properties

    jars = merge_list(started.get("spark.jars", ""), user.get("spark.jars", ""), ours, jar=True)
    _load_on_driver(user.get("spark.jars", "").split(",") + ours)
    extensions = merge_list(started.get("spark.sql.extensions", ""),
                            user.get("spark.sql.extensions", ""),
                            [_EXTENSIONS[f] for f in lakehouse])

    settings: dict[str, str] = {}
    if lakehouse and extensions:
        settings["spark.sql.extensions"] = ",".join(extensions)
    settings.update(_catalogs(lakehouse, warehouse, iceberg_catalog))
    # executors' Python workers import pyspark from its package, not from the zip copy
    # Spark puts first on their path (databus.spark.workerd says why: per-task cost)
    settings["spark.python.daemon.module"] = "databus.spark.workerd"

    b = SparkSession.builder
    name = app or started.get("spark.app.name") or "databus"
    b = b.appName(name)
    if master is not None:
        b = b.master(master)
    elif "spark.master" not in started:
        b = b.master("local[*]")
    if jars:
        b = b.config("spark.jars", ",".join(jars))
    for k, v in settings.items():
        if k in _MERGED or k not in started:  # what the JVM was started with wins
            b = b.config(k, v)
    for k, v in user.items():
        if k not in _MERGED:
            b = b.config(k, v)
    spark = b.getOrCreate()
    if reader is not None and not jvm.active(spark):
        log.warning("databus.spark.session: the JVM reader's jar %s is on spark.jars but its "
                    "classes do not load on the driver; format('databus') is the Python source",
                    reader)
    return spark


def _catalogs(lakehouse: Sequence[str], warehouse: str | Path | None,
              iceberg_catalog: str) -> dict[str, str]:
    """The catalog settings of the ``lakehouse`` formats (see :func:`session`)."""
    settings: dict[str, str] = {}
    if "delta" in lakehouse:
        settings["spark.sql.catalog.spark_catalog"] = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
        # small local tables: the default of 50 partitions for Delta's log state makes every
        # commit of a small table schedule 50 tasks (measured: 5 min 47 s -> 58 s for a test run)
        settings["spark.databricks.delta.snapshotPartitions"] = "2"
    if "iceberg" in lakehouse:
        where = Path(warehouse) if warehouse is not None else Path("spark-warehouse") / "iceberg"
        cat = f"spark.sql.catalog.{iceberg_catalog}"
        settings[cat] = "org.apache.iceberg.spark.SparkCatalog"
        settings[f"{cat}.type"] = "hadoop"
        settings[f"{cat}.warehouse"] = str(where.absolute())
        # a streaming query writes through its own (cloned) session, whose catalog is not
        # this one: with Iceberg's table cache, reads here would miss its commits for 30 s
        settings[f"{cat}.cache-enabled"] = "false"
    return settings


def properties(lakehouse: Sequence[str] | None = None, *, warehouse: str | Path | None = None,
               iceberg_catalog: str = "local", source: str | None = None) -> dict[str, str]:
    """The Spark properties that give an application started *outside* Python what
    :func:`session` gives one it starts: ``spark.jars`` (the line's lakehouse jars and the
    JVM reader, built first when needed), ``spark.sql.extensions`` and the catalogs.

    For ``spark-pipelines run`` (whose Spark Connect server starts before any pipeline code
    runs, and whose spec's ``configuration`` cannot set static settings such as the
    extensions), ``spark-submit --properties-file`` and ``spark-defaults.conf``; written as
    such a file by ``python -m databus.spark.properties``. Formats and their errors as in
    :func:`session`."""
    unknown = [f for f in (lakehouse or ()) if f not in _EXTENSIONS]
    if unknown:
        raise ConfigError(f"databus.spark.properties: unknown lakehouse formats {unknown} "
                          f"(known: {', '.join(LAKEHOUSE)})")
    line = lines.current()
    formats = lines.formats(line) if lakehouse is None else tuple(lakehouse)
    jars = [str(j) for fmt in formats for j in javadeps.jars(lines.bundle(line, fmt))]
    reader = jvm.jar() if jvm.implementation(source) == "jvm" else None
    if reader is not None:
        jars.append(str(reader))
    out = {"spark.jars": ",".join(jars)} if jars else {}
    if formats:
        out["spark.sql.extensions"] = ",".join(_EXTENSIONS[f] for f in formats)
    out.update(_catalogs(formats, warehouse, iceberg_catalog))
    return out


def merge_list(*parts: str | Iterable[str], jar: bool = False) -> list[str]:
    """Comma-separated lists (or lists) joined in order, each entry once: for ``jar``,
    entries naming the same local file (a path or a ``file:`` URI) count as one."""
    out: list[str] = []
    seen: set[str] = set()
    for part in parts:
        items = part.split(",") if isinstance(part, str) else list(part)
        for item in (i.strip() for i in items):
            if not item:
                continue
            key = _jar_key(item) if jar else item
            if key not in seen:
                seen.add(key)
                out.append(item)
    return out


def _jar_key(entry: str) -> str:
    """A local jar's absolute path (for a path or a ``file:`` URI), else the entry."""
    url = urlparse(entry)
    if url.scheme == "file":
        return str(Path(unquote(url.path)).resolve())
    if url.scheme == "local":
        return str(Path(unquote(url.path)).resolve())
    if url.scheme == "":
        return str(Path(entry).resolve())
    return entry


def _load_on_driver(jars: Iterable[str]) -> None:
    """Put the local ``jars`` on the driver's class loader when missing, as ``spark-submit
    --jars`` does: the JVM already runs, so ``spark.jars`` alone would only reach the
    executors (and a session extension or a data source is loaded on the driver)."""
    gw = SparkContext._jvm
    assert gw is not None
    loader = gw.java.lang.Thread.currentThread().getContextClassLoader()
    if loader is None or not loader.getClass().getName().endswith("MutableURLClassLoader"):
        log.warning("databus.spark.session: the driver's class loader (%s) takes no jars; "
                    "databus's jars reach the driver only through spark-submit --jars",
                    None if loader is None else loader.getClass().getName())
        return
    present = {_jar_key(str(u)) for u in loader.getURLs()}
    for entry in jars:
        entry = entry.strip()
        if not entry or urlparse(entry).scheme not in ("", "file", "local"):
            continue  # a remote jar (hdfs://, https://): Spark fetches it for executors only
        path = _jar_key(entry)
        if path not in present and Path(path).is_file():
            loader.addURL(gw.java.io.File(path).toURI().toURL())
            present.add(path)


def _running(user: Mapping[str, str], reader: Path | None,
             lakehouse: Sequence[str]) -> SparkSession:
    """The session already running in this process, with the JVM reader added when missing."""
    b = SparkSession.builder
    for k, v in user.items():
        if k not in _MERGED:
            b = b.config(k, v)
    spark = b.getOrCreate()
    if reader is not None and not jvm.active(spark):
        jsc = spark.sparkContext._jsc
        assert jsc is not None
        jsc.addJar(str(reader))  # executors fetch it
        _load_on_driver([str(reader)])
        if not jvm.active(spark):
            log.warning("databus.spark.session: the running session cannot load the JVM "
                        "reader (%s); format('databus') is the Python source", reader)
    have = spark.conf.get("spark.sql.extensions", "") or ""
    for fmt in lakehouse:
        if _EXTENSIONS[fmt] not in have:
            log.warning("databus.spark.session: the running session was started without %s's "
                        "extension (%s): call session() before any other session is created",
                        fmt, _EXTENSIONS[fmt])
    return spark
