"""The JVM reader of the ``databus`` format: its jar, and its errors at the Python boundary.

``java/spark-source`` holds a Spark DataSource V2 (streaming and batch) that reads the
relay's wire format inside Spark's JVM, with the rows, schema, offsets and options of
the Python source (:mod:`databus.spark.source`). It exists for speed: Spark 4.1 starts a
Python process on the driver for every query over a Python streaming source (about a
second of start-up per query, measured in bench/RESULTS.md), and every row crosses from
Python to the JVM as Arrow; the JVM reader does neither.

* :func:`jar` builds the jar when its Java sources changed
  (``scripts/java/build-spark-source.sh``: ``javac`` against pyspark's own jars, nothing
  downloaded) and returns it; :func:`databus.spark.session` puts it on the classpath.
  Spark prefers a JVM source over a Python one of the same name, so ``format("databus")``
  is then the JVM reader; ``format("databus-jvm")`` names it explicitly and
  ``format("databus-python")`` always names the Python source.
* The jar also holds the JVM reader of ``format("databus-snapshot")`` for a bootstrap
  server's URL (``io.databus.spark.SnapshotProvider``; ``databus-snapshot-jvm``), which
  hands a store's SQLAlchemy URL to the Python reader (``databus-snapshot-python``,
  :mod:`databus.spark.snapshot`).
* ``DATABUS_SPARK_SOURCE=python`` (or ``session(source="python")``) keeps the jar off
  the classpath: ``format("databus")`` is the Python source, ``databus-snapshot`` the
  Python reader.
* :func:`errors` turns a failure of the JVM reader (a PySpark exception whose Java cause
  is ``io.databus.spark.DatabusSourceException``) into the
  :class:`~databus.core.errors.DatabusError` subclass the Python source raises for the
  same cause, with the same message.
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from databus import javadeps
from databus.core.errors import ConfigError, DatabusError, error_from_code

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("databus.spark")

SOURCE_ENV = "DATABUS_SPARK_SOURCE"
PROVIDER = "io.databus.spark.DatabusProvider"
_EXCEPTION = "io.databus.spark.DatabusSourceException"
_ROOT = Path(__file__).resolve().parents[3]
_BUILD = _ROOT / "scripts" / "java" / "build-spark-source.sh"

Implementation = Literal["jvm", "python"]


def implementation(choice: str | None = None) -> Implementation:
    """``choice``, else ``$DATABUS_SPARK_SOURCE``, else ``jvm``; ConfigError when neither name."""
    value = (choice or os.environ.get(SOURCE_ENV) or "jvm").strip().lower()
    if value not in ("jvm", "python"):
        raise ConfigError(f"databus Spark source must be 'jvm' or 'python', got {value!r} "
                          f"(session(source=...) or {SOURCE_ENV})")
    return "jvm" if value == "jvm" else "python"


def jar() -> Path | None:
    """The JVM reader's jar, rebuilt first when its sources changed; None when it cannot be
    built here (no JDK, or an installed package without ``java/``): the Python source then
    serves ``format("databus")``, and a log line says why."""
    import pyspark

    built = javadeps.cache_dir() / "spark-source" / "databus-spark-source.jar"
    if _BUILD.exists() and (_ROOT / "java" / "spark-source").is_dir():
        env = {**os.environ, "PYSPARK_JARS": str(Path(pyspark.__file__).parent / "jars")}
        done = subprocess.run(["bash", str(_BUILD)], env=env, capture_output=True, text=True,
                              check=False)
        if done.returncode != 0:
            log.warning("the JVM databus source could not be built; using the Python one: %s",
                        done.stderr.strip()[-2000:])
            return None
    return built if built.exists() else None


def active(spark: SparkSession) -> bool:
    """Whether ``format("databus")`` is the JVM reader in ``spark`` (its jar is loaded)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    try:
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName(PROVIDER, False, loader)
    except Exception:  # py4j raises its own error type for a ClassNotFoundException
        return False
    return True


def translate(exc: BaseException) -> DatabusError | None:
    """The DatabusError a JVM reader failure stands for, or None when ``exc`` is another one."""
    origin = getattr(exc, "_origin", None)  # pyspark's CapturedException: the Java throwable
    seen = 0
    while origin is not None and seen < 20:
        try:
            if origin.getClass().getName() == _EXCEPTION:
                return error_from_code(str(origin.code()), str(origin.getMessage()))
            origin = origin.getCause()
        except Exception:  # not a py4j object after all
            return None
        seen += 1
    return None


@contextmanager
def errors() -> Iterator[None]:
    """Raise a JVM reader failure inside the block as its DatabusError (see the module
    docstring); other exceptions pass unchanged."""
    try:
        yield
    except DatabusError:
        raise
    except Exception as exc:
        err = translate(exc)
        if err is None:
            raise
        raise err from exc
