"""One local Spark session for all Spark tests, and relays over SQLite to read from.

The session runs ``local[2]`` with the project's interpreter as the Python
worker (``PYSPARK_PYTHON``), so executors import this checkout's databus, and
has the pinned Delta and Iceberg jars (:func:`databus.spark.session`); Iceberg
tables go to the catalog ``local`` in a private warehouse.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from databus.spark import register, session
from tests.support.sparkrelay import LEAN_JVM


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    spark = session(
        "databus-tests", master="local[2]", warehouse=warehouse / "iceberg",
        conf={"spark.sql.shuffle.partitions": "4", "spark.default.parallelism": "2",
              "spark.ui.enabled": "false", "spark.sql.session.timeZone": "UTC",
              "spark.sql.warehouse.dir": str(warehouse), "spark.driver.memory": "1g",
              "spark.sql.streaming.pollingDelay": "10ms", **LEAN_JVM})
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    try:
        yield spark
    finally:
        for q in spark.streams.active:
            q.stop()
        spark.stop()




def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # pyspark 4.1's DataFrame.collect (util._create_local_socket) leaves the socket to its
    # JVM for the garbage collector: an unraisable ResourceWarning that the project's
    # warnings-as-errors turns into a failure of whichever test runs then. Only for the
    # Spark tests, and only that warning about a socket.
    here = Path(__file__).parent
    mark = pytest.mark.filterwarnings(
        "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning")
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(mark)
