"""One local Spark session for all Spark tests, and relays over SQLite to read from.

The session runs ``local[2]`` with the project's interpreter as the Python
worker (``PYSPARK_PYTHON``), so executors import this checkout's databus.
"""

from __future__ import annotations

import os
import sqlite3
import sys
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from databus.relay.config import parse_config
from databus.relay.relay import Relay
from databus.spark import register


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    session = (
        SparkSession.builder.master("local[2]")
        .appName("databus-tests")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.warehouse.dir", str(warehouse))
        .config("spark.driver.memory", "1g")
        .config("spark.sql.streaming.pollingDelay", "10ms")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    try:
        yield session
    finally:
        for q in session.streams.active:
            q.stop()
        session.stop()


def start_relay(db: Path, tmp: Path, tables: list[str], snapshot_mode: str = "no_data",
                **buffer: Any) -> Relay:
    """An in-process relay over ``db`` on a free port (memory buffer unless ``path``).

    Stream-only by default: with ``initial``, changes a writer commits before the
    relay's first read arrive as snapshot ``r`` rows, and these tests count ops."""
    cfg = parse_config({
        "source": {"url": f"sqlite:///{db}", "tables": tables, "poll_interval": 0.01,
                   "snapshot_mode": snapshot_mode},
        "buffer": {"capacity_bytes": 32 * 1024 * 1024, "flush_interval": 0.2, **buffer},
        "http": {"port": 0},
        "state_dir": str(tmp / "relay-state"),
        "stream": {"default_timeout": 0.5},
    })
    relay = Relay(cfg)
    relay.start()
    return relay


def rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    with closing(sqlite3.connect(db)) as con:
        return [tuple(r) for r in con.execute(sql)]
