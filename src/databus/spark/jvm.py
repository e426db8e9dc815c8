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
* :func:`errors` (also ``databus.spark.errors``) turns a failure of either reader, as
  PySpark raises it, into the :class:`~databus.core.errors.DatabusError` subclass the
  source raised, with its message: the JVM reader's by its Java exception
  (``io.databus.spark.DatabusSourceException`` and its ``code``), the Python source's by
  the Python traceback Spark's message carries.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from databus import javadeps
from databus.core.errors import ConfigError, DatabusError, error_from_code

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("databus.spark")

SOURCE_ENV = "DATABUS_SPARK_SOURCE"
PROVIDER = "io.databus.spark.DatabusProvider"
_EXCEPTION = "io.databus.spark.DatabusSourceException"
# how Spark's progress describes the JVM reader's stream (DatabusStream.toString; a jar
# built before it named relay and sources showed the class name and a hash)
_STREAM = ("databus[relay=", "io.databus.spark.DatabusStream")
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
    had here, with a warning naming why (no JDK, pyspark's jars not found, an installed
    package without ``java/`` and no jar built): the Python source then serves
    ``format("databus")``."""
    from databus.spark import lines

    # one jar per Spark line (compiled against that line's jars; the build script puts
    # it in the line's directory)
    built = javadeps.cache_dir() / lines.current().reader_dir / "databus-spark-source.jar"
    if not (_BUILD.exists() and (_ROOT / "java" / "spark-source").is_dir()):
        if built.exists():
            return built
        log.warning("the JVM databus reader is not available: %s does not exist and this "
                    "databus (%s) has no java/spark-source to build it from; using the Python "
                    "source", built, _ROOT)
        return None
    jars = spark_jars_dir()
    if jars is None:
        import pyspark

        log.warning("the JVM databus reader cannot be built: pyspark's jars/ directory was not "
                    "found (SPARK_HOME=%s, pyspark imported from %s); using the Python source",
                    os.environ.get("SPARK_HOME"), pyspark.__file__)
        return None
    env = {**os.environ, "PYSPARK_JARS": str(jars)}
    done = subprocess.run(["bash", str(_BUILD)], env=env, capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        log.warning("the JVM databus reader could not be built; using the Python source: %s",
                    done.stderr.strip()[-2000:])
        return None
    if not built.exists():
        log.warning("the JVM databus reader's build left no %s; using the Python source", built)
        return None
    return built


def spark_jars_dir() -> Path | None:
    """The ``jars`` directory of the Spark this process runs: ``$SPARK_HOME/jars`` (set by
    ``spark-submit``), else the one beside the imported pyspark, found from its package or
    from the ``python/lib/pyspark.zip`` copy that ``spark-submit`` and executors import
    (``<pyspark>/python/lib/pyspark.zip/pyspark``: three levels up)."""
    import pyspark

    def has_spark(d: Path) -> bool:
        return d.is_dir() and any(d.glob("spark-sql_*.jar"))

    home = os.environ.get("SPARK_HOME")
    if home and has_spark(Path(home) / "jars"):
        return Path(home) / "jars"
    where = Path(pyspark.__file__).resolve().parent
    for d in (where, *list(where.parents)[:4]):
        if has_spark(d / "jars"):
            return d / "jars"
    return None


def active(spark: SparkSession) -> bool:
    """Whether ``format("databus")`` is the JVM reader in ``spark`` (its jar is loaded)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    from py4j.protocol import Py4JError  # type: ignore[import-untyped]

    try:
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName(PROVIDER, False, loader)
    except Py4JError:  # a ClassNotFoundException comes as py4j's Py4JJavaError
        return False
    return True


class _WithProgress(Protocol):
    @property
    def recentProgress(self) -> Any: ...


def served_by(query: _WithProgress) -> Implementation | None:
    """Which reader served ``query``'s databus source (a ``StreamingQuery`` or an
    :class:`~databus.spark.lakehouse.EvolvingQuery`), from its progress (Spark describes
    a source by its stream's ``toString``: ``databus[relay=...]`` for the JVM reader, the
    class name for the Python source): ``jvm``, ``python``, or None before a batch ran."""
    for progress in query.recentProgress:
        for src in progress.get("sources", ()):
            text = str(src.get("description", ""))
            if text.startswith(_STREAM):
                return "jvm"
            if "PythonMicroBatchStream" in text:
                return "python"
    return None


def translate(exc: BaseException) -> DatabusError | None:
    """The DatabusError a failure of either reader stands for, or None when ``exc`` is
    another one.

    * JVM reader: a ``io.databus.spark.DatabusSourceException`` in the Java cause chain
      (pyspark's exceptions keep the Java throwable): its ``code`` names the class.
    * Python source: Spark reports its failure as text (``AnalysisException`` at
      ``load()``, ``StreamingQueryException`` or a task failure later), holding the Python
      traceback; its last line naming a ``databus`` exception class gives the class and
      the message.
    """
    if isinstance(exc, DatabusError):
        return exc
    origin = getattr(exc, "_origin", None)  # pyspark's CapturedException: the Java throwable
    texts = [str(exc)]
    seen = 0
    while origin is not None and seen < 20:
        try:
            if origin.getClass().getName() == _EXCEPTION:
                return error_from_code(str(origin.code()), str(origin.getMessage()))
            texts.append(str(origin.getMessage()))
            origin = origin.getCause()
        # broad: translating an error must never raise one over it; a cause that cannot
        # be read (not a py4j object after all, the JVM gone) ends the walk
        except Exception:
            break
        seen += 1
    for text in texts:
        err = _from_traceback(text)
        if err is not None:
            return err
    return None


# the last line of a Python traceback: "databus.core.errors.UnknownSourceError: message"
_RAISED = re.compile(r"^(databus(?:\.\w+)+)\.(\w+): (.*)$", re.MULTILINE)


def _from_traceback(text: str) -> DatabusError | None:
    """The DatabusError whose traceback line is the last one of ``text``'s, else None."""
    found = None
    for m in _RAISED.finditer(text):
        cls = _error_class(m.group(1), m.group(2))
        if cls is not None:
            found = (cls, m.group(3).strip())
    if found is None:
        return None
    cls, message = found
    try:
        return cls(message)
    except TypeError:  # a class with more required arguments: by its code
        return error_from_code(cls.code, message)


def _error_class(module: str, name: str) -> type[DatabusError] | None:
    """The DatabusError subclass ``module.name``, when it is one (imported only if its
    module already is: a name in a message never imports code)."""
    mod = sys.modules.get(module)
    if mod is None and module == "databus.core.errors":
        mod = importlib.import_module(module)
    cls = getattr(mod, name, None) if mod is not None else None
    if isinstance(cls, type) and issubclass(cls, DatabusError):
        return cls
    return None


@contextmanager
def errors() -> Iterator[None]:
    """Raise a failure of either reader inside the block as the DatabusError it stands
    for (:func:`translate`; the Spark exception is its ``__cause__``); other exceptions
    pass unchanged::

        with databus.spark.errors():
            df = spark.readStream.format("databus").options(...).load()
    """
    try:
        yield
    except DatabusError:
        raise
    except Exception as exc:  # broad: Spark's boundary; what is not ours is raised unchanged
        err = translate(exc)
        if err is None:
            raise
        raise err from exc
