"""Where an ``apply_changes`` target and its query's checkpoint are: local paths and URIs.

A Delta target is one of

* a URI (a scheme of two or more letters, then ``:/``: ``s3a://``, ``abfss://``,
  ``gs://``, ``hdfs://``, ``file:``): Hadoop's to resolve, used exactly as given
  (``delta.`s3a://bucket/t```), looked at through the session's Hadoop FileSystem;
* a local path (it holds a ``/`` or starts with ``.``): made absolute on the driver;
* otherwise a table name in the session's catalogs (as every Iceberg target is).

A URI is never taken for a local path: made "absolute" it would be a directory named
``s3a:`` under the driver's working directory, and the table would go to local disks.

The checkpoint's ``metadata`` file (the query id, :func:`read_text`) is read the same way:
a URI through Hadoop, a path from the local file system.

Hadoop is reached through the session's JVM (py4j): a classic session; a Spark Connect
session cannot, and gets a :class:`~databus.core.errors.ConfigError` for a URI target.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from databus.core.errors import ConfigError

log = logging.getLogger(__name__)

URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:/")


def q(name: str) -> str:
    """``name`` as a quoted SQL identifier."""
    return "`" + name.replace("`", "``") + "`"


def is_uri(target: str) -> bool:
    """Whether ``target`` is a URI (``s3a://b/t``, ``file:///t``), not a path or a name."""
    return URI.match(target) is not None


def table_ident(target: str, fmt: str) -> str:
    """The SQL name of ``target``: a Delta URI or path becomes ``delta.`<it>```."""
    if fmt == "delta" and is_uri(target):
        return f"delta.{q(target)}"
    if fmt == "delta" and ("/" in target or target.startswith(".")):
        return f"delta.{q(str(Path(target).absolute()))}"
    return target


def delta_log_holds_files(spark: SparkSession, target: str) -> bool:
    """Whether the Delta table at ``target`` (a path or URI) has a ``_delta_log`` holding a
    file; removes it when it holds only empty directories, as a CTAS that failed before
    its commit leaves them (Delta then refuses both a CTAS there, "exists", and an INSERT,
    "not a Delta table")."""
    if not is_uri(target):
        return _local_log_holds_files(Path(target) / "_delta_log")
    _, fs, root = _hadoop(spark, target.rstrip("/") + "/_delta_log")
    if not fs.exists(root):
        return False
    if fs.listFiles(root, True).hasNext():
        return True
    dirs, todo = [root], [root]
    while todo:
        for status in fs.listStatus(todo.pop()):
            if status.isDirectory():
                dirs.append(status.getPath())
                todo.append(status.getPath())
    log.info("apply_changes: removing %s: empty directories left by a first write that "
             "committed nothing", root.toString())
    for d in reversed(dirs):  # children first; non-recursive: a file come since stays
        fs.delete(d, False)
    return False


def read_text(spark: SparkSession | None, location: str) -> str:
    """The text of the file at ``location`` (a local path, or a URI through Hadoop)."""
    if not is_uri(location):
        return Path(location).read_text()
    jvm, fs, path = _hadoop(spark or SparkSession.active(), location)
    stream = fs.open(path)
    try:
        return str(jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
    finally:
        stream.close()


def _local_log_holds_files(path: Path) -> bool:
    if not path.is_dir():
        return False
    dirs = [path]
    for parent, subdirs, files in os.walk(path):
        if files:
            return True
        dirs += [Path(parent) / d for d in subdirs]
    log.info("apply_changes: removing %s: empty directories left by a first write that "
             "committed nothing", path)
    for d in reversed(dirs):  # children first
        d.rmdir()
    return False


def _hadoop(spark: SparkSession, uri: str) -> tuple[Any, Any, Any]:
    """The JVM, the Hadoop FileSystem of ``uri`` with the session's Hadoop settings, and
    ``uri`` as a Hadoop Path."""
    jvm = getattr(spark, "_jvm", None)
    if jvm is None:
        raise ConfigError(f"apply_changes: {uri} is a URI, read through Hadoop in the "
                          "driver's JVM, which a Spark Connect session does not reach: use a "
                          "classic session, a local path or a catalog table name")
    conf = spark._jsparkSession.sessionState().newHadoopConf()
    path = jvm.org.apache.hadoop.fs.Path(uri)
    return jvm, path.getFileSystem(conf), path
