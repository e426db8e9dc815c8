"""Relays and readers for the Spark tests: an in-process relay on a SQLite shop, waiting
for it, streaming it into Spark, reading its events.
"""

from __future__ import annotations

import json
import sqlite3
import urllib.request
from contextlib import closing
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from databus.client.credentials import Credentials
from databus.client.relay import RelayConnection
from databus.core import event as ev
from databus.core.checkpoint import Checkpoint
from databus.relay.relay import Relay
from tests.support.relays import make_relay
from tests.support.shop import txlog_max
from tests.support.wait import wait_until

Seen = tuple[int, str, str]  # (scn, key, op)

LEAN_JVM = {
    # The suite's Spark JVMs live minutes and run small queries: the C2 compiler and the
    # parallel collector's threads, and compiling every query's whole stage to Java, cost
    # more CPU than they save here (measured on the lakehouse and apply tests: -30% CPU,
    # no slower). Execution details of Spark only: what the tests check does not depend
    # on them.
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    "spark.sql.codegen.wholeStage": "false",
}
"""Spark settings of every Spark session the suite starts (tests/spark/conftest.py, the
crash tests' consumer processes)."""


def start_relay(db: Path, tmp: Path, tables: list[str], snapshot_mode: str = "no_data",
                **buffer: Any) -> Relay:
    """An in-process relay over ``db`` on a free port (memory buffer unless ``path``).

    Stream-only by default: with ``initial``, changes a writer commits before the
    relay's first read arrive as snapshot ``r`` rows, and these tests count ops."""
    relay = make_relay(db, tmp, tables=tables, snapshot_mode=snapshot_mode,
                       state="relay-state", **{"capacity_bytes": 32 * 1024 * 1024, **buffer})
    relay.start()
    return relay


def rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    with closing(sqlite3.connect(db)) as con:
        return [tuple(r) for r in con.execute(sql)]


def source_name(relay: Relay, table: str) -> str:
    """The relay's full name of ``table`` (``<db>.<table>``), as its ``/sources`` lists it."""
    with urllib.request.urlopen(f"{relay.url}/sources") as r:
        names = [s["name"] for s in json.load(r)]
    return next(n for n in names if n.endswith("." + table))


def wait_relay(relay: Relay, db: Path, timeout: float = 30.0) -> None:
    want = txlog_max(db)
    wait_until(lambda: relay.buffer.max_scn >= want, timeout, f"the relay to reach scn {want}",
               interval=0.05)


def stream(spark: SparkSession, relay: Relay, source: str, **opts: object) -> DataFrame:
    reader = (spark.readStream.format("databus").option("relay", relay.url)
              .option("sources", source))
    for k, v in opts.items():
        reader = reader.option(k, str(v))
    return reader.load()


def batch_read(spark: SparkSession, url: str, source: str, **opts: object) -> DataFrame:
    """A batch read of ``source`` at the relay ``url`` through the JVM reader, with ``opts``."""
    reader = spark.read.format("databus-jvm").option("relay", url).option("sources", source)
    for k, v in opts.items():
        reader = reader.option(k, str(v))
    return reader.load()


def read(spark: SparkSession, fmt: str, url: str, source: str, **opts: object) -> DataFrame:
    """A streaming read of ``source`` at the relay ``url`` in format ``fmt`` (``databus``
    or ``databus-jvm``), with ``opts``."""
    reader = spark.readStream.format(fmt).option("relay", url).option("sources", source)
    for k, v in opts.items():
        reader = reader.option(k, str(v))
    return reader.load()


def drain(df: DataFrame, out: Path) -> tuple[list[Any], list[str]]:
    """One availableNow run into Parquet: the rows (sorted) and the offsets Spark logged."""
    q = (df.writeStream.format("parquet").option("path", str(out / "data"))
         .option("checkpointLocation", str(out / "ckpt")).trigger(availableNow=True).start())
    q.awaitTermination(180)
    assert q.exception() is None, q.exception()
    spark = df.sparkSession
    rows = sorted(spark.read.parquet(str(out / "data")).collect(), key=repr)
    logged = [f for f in (out / "ckpt" / "offsets").iterdir() if f.name.isdigit()]
    offsets = [f.read_text().splitlines()[-1] for f in sorted(logged, key=lambda f: int(f.name))]
    return rows, offsets


def relay_events(url: str, source_name: str,
                 credentials: Credentials | None = None) -> list[Seen]:
    """Every data event of one source the relay at ``url`` holds, read directly over HTTP."""
    out: list[Seen] = []
    with RelayConnection(url, credentials=credentials) as conn:
        src = [i for i, n in conn.sources() if n.endswith("." + source_name)]
        cp = Checkpoint.flexible()
        while True:
            data = conn.stream(cp, src, size=1 << 20, timeout=0).data
            if not data:
                return out
            for e in ev.iter_events(data):
                if e.is_eop:
                    cp = Checkpoint.after(e.scn)
                elif not e.is_control:
                    out.append((e.scn, str(e.key), e.op.letter))


