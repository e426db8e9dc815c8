"""PySpark's worker daemon without the zip copy of pyspark: ``spark.python.daemon.module``.

Contract: ``python -m databus.spark.workerd [WORKER_MODULE]`` behaves exactly as
``python -m pyspark.daemon [WORKER_MODULE]`` (same arguments, same protocol:
it *is* pyspark's daemon), except that pyspark and py4j are imported from the
installed packages instead of the zip archives Spark puts first on the
workers' ``PYTHONPATH`` (with the ``spark-core`` jar, which holds no Python),
when the installed pyspark is the one those archives were shipped in (pip's
layout: ``<site-packages>/pyspark/python/lib/pyspark.zip``).
In any other layout (a Spark distribution, a pyspark without its package on
the path) nothing changes. :func:`databus.spark.session` sets it.

Spark uses this module for the executors' Python workers (each read task of
the ``databus`` source runs in one); the driver-side data source workers and
the streaming source runner are started with pyspark's own modules, whatever
the setting.

**Why (measured, bench/RESULTS.md, spark_lakehouse).** Every Python worker
invocation starts with ``importlib.invalidate_caches()`` (pyspark's ``setup_spark_files``). On
Python 3.10-3.12 that re-reads the central directory of every zip archive in
``sys.path_importer_cache``: with pyspark imported from the 3.5 MB
``pyspark.zip`` that is one zipimporter per imported subpackage (16 in a plain
UDF worker, more in a data source's), each re-reading its archive, the
5,362-entry ``spark-core`` jar among them; py-spy showed 0.08-0.15 s of CPU
per invocation there,
more than the whole decode of a 50,000-change read task. Modules imported from
a zip also have no cached bytecode, so each new worker compiled pyspark's
sources again.
"""

from __future__ import annotations

import os
import runpy
import sys
from importlib.machinery import PathFinder


def _drop_shipped_archives() -> None:
    """Remove the archives inside the installed pyspark package from ``sys.path``
    (``python/lib/pyspark.zip``, ``py4j-*.zip``, ``jars/spark-core*.jar``) when
    pyspark and py4j are importable without them."""
    archives = [p for p in sys.path if p.endswith((".zip", ".jar"))]
    if not archives:
        return
    rest = [p for p in sys.path if p not in archives]
    spec = PathFinder.find_spec("pyspark", rest)
    if spec is None or not spec.submodule_search_locations:
        return
    home = os.path.realpath(next(iter(spec.submodule_search_locations)))
    shipped = [p for p in archives if os.path.realpath(p).startswith(home + os.sep)]
    if not shipped or PathFinder.find_spec("py4j", rest) is None:
        return
    sys.path[:] = [p for p in sys.path if p not in shipped]
    for p in shipped:
        sys.path_importer_cache.pop(p, None)


if __name__ == "__main__":
    _drop_shipped_archives()
    runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=True)
