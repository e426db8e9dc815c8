"""The JVM reader of ``format("databus-snapshot")`` (io.databus.spark.SnapshotProvider):
a bootstrap server's snapshot over HTTP, against the Python reader of the same store.

A real bootstrap server (:class:`BootstrapServer` over a SQLite store, served over
HTTP) holds two sources: ``db.flat`` (long, non-ASCII string, double, bytes, nulls;
every 10th row rewritten at a later SCN) and ``db.logical`` (decimal, date). The JVM
reader must give the Python reader's schema and rows, and the store's values, with
any number of partitions, each row once; ``scn`` leaves out rows written after it;
bad options fail ``load()`` with a clear message; a store's SQLAlchemy URL is still
read (by the Python reader).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from starlette.applications import Starlette

from databus.auth import add_token
from databus.bootstrap.server import BootstrapServer, build_app
from databus.bootstrap.store import BootstrapStore
from databus.core.errors import BootstrapTooOldError, ConfigError, UnknownSourceError
from databus.serving import HttpServerConfig, HttpService, TlsServerConfig
from databus.spark import jvm, register_snapshot, snapshot_scn
from tests.support.procs import free_port
from tests.support.snapshot_store import fill, flat_row, logical_row
from tests.support.tls import make_certs

pytestmark = pytest.mark.skipif(jvm.jar() is None, reason="no JDK here to build the JVM reader")


class StoreServer(HttpService):
    """A bootstrap server's HTTP API over an existing store (no producer, no applier)."""

    def __init__(self, url: str, http: HttpServerConfig | None = None) -> None:
        super().__init__(http or HttpServerConfig(), "bootstrap")
        self.store = BootstrapStore(url, create=False)

    def build_app(self) -> Starlette:
        return build_app(BootstrapServer(self.store))

    async def on_shutdown(self) -> None:
        self.store.close()


@pytest.fixture(scope="module")
def served(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(store URL, bootstrap server URL)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('snapjvm') / 'bs.db'}"
    fill(url)
    register_snapshot(spark)
    with StoreServer(url) as server:
        yield url, server.url


def snapshot(spark: SparkSession, fmt: str, where: str, sources: str, **opts: object) -> DataFrame:
    reader = spark.read.format(fmt).option("store", where).option("sources", sources)
    for k, v in opts.items():
        reader = reader.option(k, str(v))
    return reader.load()


def rows(df: DataFrame) -> list[Any]:
    return sorted(df.collect(), key=lambda r: (r["source"]["table"], r["key"]))


def test_the_jvm_reader_serves_databus_snapshot_for_a_server(
        spark: SparkSession, served: tuple[str, str]) -> None:
    _, server = served
    plan = snapshot(spark, "databus-snapshot", server, "db.flat")._jdf.queryExecution()
    assert "databus-snapshot(db.flat)" in plan.optimizedPlan().toString()  # the JVM table


@pytest.mark.parametrize("partitions", [1, 3, 8])
@pytest.mark.parametrize("source", ["db.flat", "logical"])
def test_jvm_and_python_readers_give_the_same_schema_and_rows(
        spark: SparkSession, served: tuple[str, str], source: str, partitions: int) -> None:
    store, server = served
    jdf = snapshot(spark, "databus-snapshot-jvm", server, source, partitions=partitions,
                   pageRows=333)
    pdf = snapshot(spark, "databus-snapshot-python", store, source, partitions=2)
    assert jdf.schema == pdf.schema
    assert jdf.rdd.getNumPartitions() == partitions
    got = rows(jdf)
    assert got == rows(pdf)
    # the store's values, one row per key, as snapshot rows
    if source == "db.flat":
        want = [flat_row(i) | ({"name": "later"} if i % 10 == 0 else {}) for i in range(1, 2501)]
    else:
        want = [logical_row(i) for i in range(1, 701)]
    assert sorted((r["after"].asDict() for r in got), key=lambda r: r["id"]) == [
        {k: bytearray(v) if isinstance(v, bytes) else v for k, v in w.items()} for w in want]
    assert {(r["op"], r["before"], r["source"]["snapshot"], r["sequence"]["index"]) for r in got} \
        == {("r", None, True, 0)}


@pytest.mark.parametrize("partitions", [1, 4, 7])
def test_partitions_cover_every_row_once(
        spark: SparkSession, served: tuple[str, str], partitions: int) -> None:
    _, server = served
    df = snapshot(spark, "databus-snapshot", server, "db.flat", partitions=partitions,
                  pageRows=100)
    keys = df.select("key").rdd.glom().map(lambda part: [r[0] for r in part]).collect()
    assert len(keys) == partitions
    assert all(keys)  # each range of the id span holds rows
    flat = [k for part in keys for k in part]
    assert sorted(flat, key=int) == [str(i) for i in range(1, 2501)]  # every row, once


def test_scn_leaves_out_rows_written_after_it(
        spark: SparkSession, served: tuple[str, str]) -> None:
    store, server = served
    assert snapshot_scn(server) == snapshot_scn(store) == 60
    df = snapshot(spark, "databus-snapshot", server, "db.flat", scn=49, partitions=3)
    got = rows(df)
    assert len(got) == 2500 - 250 and max(r["scn"] for r in got) == 1
    assert got == rows(snapshot(spark, "databus-snapshot-python", store, "db.flat", scn=49))


def test_json_values_of_several_sources_are_the_python_readers(
        spark: SparkSession, served: tuple[str, str]) -> None:
    store, server = served
    jdf = snapshot(spark, "databus-snapshot", server, "db.flat,db.logical", valueFormat="json",
                   partitions=3)
    pdf = snapshot(spark, "databus-snapshot-python", store, "db.flat,db.logical",
                   valueFormat="json")
    assert jdf.schema == pdf.schema
    got = rows(jdf)
    assert len(got) == 3200 and got == rows(pdf)


def test_a_store_url_is_still_read_by_the_python_reader(
        spark: SparkSession, served: tuple[str, str]) -> None:
    store, server = served
    got = rows(snapshot(spark, "databus-snapshot", store, "db.logical", partitions=2))
    assert got == rows(snapshot(spark, "databus-snapshot-jvm", server, "db.logical"))


@pytest.mark.parametrize(("options", "error", "message"), [
    ({"sources": "nosuchtable"}, UnknownSourceError,
     "source 'nosuchtable' is not in the bootstrap store"),
    ({"partitions": "0"}, ConfigError, "partitions: Input should be greater than or equal to 1"),
    ({"partitions": "four"}, ConfigError, "partitions: Input should be a valid integer"),
    ({"partitions": "5000"}, ConfigError, "partitions: Input should be less than or equal to 1024"),
    ({"pageRows": "0"}, ConfigError, "pageRows: Input should be greater than or equal to 1"),
    ({"scn": "999999999"}, BootstrapTooOldError, "the snapshot is complete only to SCN 60"),
    ({"colour": "red"}, ConfigError, "unknown option 'colour'"),
    ({"sources": "db.flat,db.logical"}, ConfigError, "typed after structs need exactly one source"),
    ({"valueFormat": "xml"}, ConfigError, "valueFormat: Input should be 'struct' or 'json'"),
    ({"store": "UNREACHABLE"}, Exception, "unreachable"),
])
def test_bad_options_fail_at_load_with_a_clear_message(
        spark: SparkSession, served: tuple[str, str], options: dict[str, str],
        error: type[Exception], message: str) -> None:
    _, server = served
    opts = {"store": server, "sources": "db.flat", **options}
    if opts["store"] == "UNREACHABLE":  # nothing listens there
        opts["store"] = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(error, match=message), jvm.errors():
        spark.read.format("databus-snapshot").options(**opts).load().collect()
    with pytest.raises(PySparkException, match=message):  # as PySpark raises it
        spark.read.format("databus-snapshot-jvm").options(**opts).load().collect()


def test_each_named_reader_refuses_the_others_url(
        spark: SparkSession, served: tuple[str, str]) -> None:
    store, server = served
    with pytest.raises(ConfigError, match="store: a bootstrap server is an http"), jvm.errors():
        snapshot(spark, "databus-snapshot-jvm", store, "db.flat").collect()
    with pytest.raises(PySparkException, match="is a bootstrap server's URL: the Python reader"):
        snapshot(spark, "databus-snapshot-python", server, "db.flat").collect()


_UNREGISTERED = """
import sys
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[1]").config("spark.jars", sys.argv[1])
         .config("spark.ui.enabled", "false").getOrCreate())
try:
    spark.read.format("databus-snapshot").options(store=sys.argv[2], sources="db.flat").load()
except Exception as exc:
    print(exc)
finally:
    spark.stop()
"""


def test_a_store_url_without_the_python_reader_registered_says_what_to_do(
        served: tuple[str, str]) -> None:
    """A fresh session (another process) that loaded the jar but never called
    register_snapshot: the store URL cannot be handed on, and the message says why."""
    store, _ = served
    done = subprocess.run([sys.executable, "-c", _UNREGISTERED, str(jvm.jar()), store],
                          capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    assert "call databus.spark.register_snapshot(spark) first" in done.stdout, done.stderr[-2000:]


def test_a_server_with_tokens_and_tls_is_read_with_tokenfile_and_cafile(
        spark: SparkSession, served: tuple[str, str], tmp_path: Path) -> None:
    """The executors authenticate as any client: the token's sources only, TLS verified."""
    store, _ = served
    certs = make_certs(tmp_path / "certs")
    tokens = tmp_path / "tokens.jsonl"
    token_file = tmp_path / "flat.token"
    token_file.write_text(add_token(tokens, "flat", [r"db\.flat"]) + "\n")
    http = HttpServerConfig(token_file=tokens, tls=TlsServerConfig(
        cert_file=certs.server_cert, key_file=certs.server_key))
    with StoreServer(store, http) as server:
        assert server.url.startswith("https://")
        auth = {"tokenFile": token_file, "caFile": certs.ca}
        got = rows(snapshot(spark, "databus-snapshot", server.url, "db.flat", partitions=2, **auth))
        assert got == rows(snapshot(spark, "databus-snapshot-python", store, "db.flat"))
        with pytest.raises(UnknownSourceError, match=r"it holds: db\.flat \(1\)$"), jvm.errors():
            snapshot(spark, "databus-snapshot", server.url, "db.logical", **auth)
        with pytest.raises(Exception, match="needs a token"), jvm.errors():
            snapshot(spark, "databus-snapshot", server.url, "db.flat", caFile=certs.ca)
