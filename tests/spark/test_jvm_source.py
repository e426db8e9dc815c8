"""The JVM reader of ``format("databus")`` against the Python source: same rows, same
schema, same offsets, same errors (databus.spark.jvm)."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from databus.core.errors import ConfigError, RelayProtocolError, UnknownSourceError
from databus.relay.config import parse_config
from databus.relay.relay import Relay
from databus.spark import jvm
from tests.support.mariadb import MariaDB
from tests.support.procs import free_port
from tests.support.relays import make_relay
from tests.support.shop import TABLES, Writer, create_shop
from tests.support.sparkrelay import drain, read, start_relay, wait_relay
from tests.support.tls import make_certs
from tests.support.typematrix import ROWS, matrix_relay
from tests.support.wait import wait_until
from tests.support.zookeeper import ZooKeeper

pytestmark = pytest.mark.skipif(jvm.jar() is None, reason="no JDK here to build the JVM reader")


def _shop(tmp: Path) -> Any:
    db = tmp / "shop.db"
    create_shop(db)
    relay = start_relay(db, tmp, TABLES)
    w = Writer(db, seed=17, rollback_ratio=0.1)
    for _ in range(80):
        w.transaction()
    wait_relay(relay, db)
    yield relay
    w.close()
    relay.stop()


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A relay over a shop with 80 transactions, built once for the module: tests only
    read it (a test that writes takes ``own_shop``)."""
    yield from _shop(tmp_path_factory.mktemp("shop"))


@pytest.fixture
def own_shop(tmp_path: Path) -> Any:
    """Like ``shop``, for a test that writes to the shop."""
    yield from _shop(tmp_path)


def test_the_jvm_reader_serves_the_databus_format(spark: SparkSession) -> None:
    assert jvm.active(spark)


@pytest.mark.parametrize("opts", [
    {"partitions": 1}, {"partitions": 3}, {"partitions": 2, "envelope": "flat"},
    {"partitions": 2, "fetchBytes": 4096},
])
@pytest.mark.parametrize("table", ["customers", "orders"])
def test_jvm_and_python_sources_read_the_same_rows_schema_and_offsets(
        spark: SparkSession, tmp_path: Path, shop: Relay, table: str,
        opts: dict[str, object]) -> None:
    got = {fmt: read(spark, fmt, shop.url, table, **opts) for fmt in ("databus-jvm", "databus-python")}
    assert got["databus-jvm"].schema == got["databus-python"].schema
    jrows, joffsets = drain(got["databus-jvm"], tmp_path / "jvm")
    prows, poffsets = drain(got["databus-python"], tmp_path / "py")
    assert jrows and jrows == prows
    assert joffsets == poffsets  # byte for byte: checkpoints move between the two


def test_json_values_are_the_python_sources_text(
        spark: SparkSession, tmp_path: Path, shop: Relay) -> None:
    dfs = {fmt: read(spark, fmt, shop.url, "customers,orders,items", partitions=2,
                     valueFormat="json") for fmt in ("databus-jvm", "databus-python")}
    assert dfs["databus-jvm"].schema == dfs["databus-python"].schema
    jrows, _ = drain(dfs["databus-jvm"], tmp_path / "jvm")
    prows, _ = drain(dfs["databus-python"], tmp_path / "py")
    assert len(jrows) > 100 and jrows == prows


def test_a_checkpoint_of_one_source_resumes_with_the_other(
        spark: SparkSession, tmp_path: Path, own_shop: Relay) -> None:
    shop = own_shop
    out = tmp_path / "both"
    first, _ = drain(read(spark, "databus-python", shop.url, "customers", partitions=2), out)
    db = Path(str(shop.config.source.url).removeprefix("sqlite:///"))
    with Writer(db, seed=99) as w:
        for _ in range(40):
            w.transaction()
    wait_relay(shop, db)
    both, _ = drain(read(spark, "databus-jvm", shop.url, "customers", partitions=2), out)
    once, _ = drain(read(spark, "databus-python", shop.url, "customers", partitions=2),
                    tmp_path / "once")
    assert len(both) > len(first)
    assert both == once  # nothing lost, nothing read twice


@pytest.mark.parametrize(("options", "error", "message"), [
    ({"sources": "nosuchtable"}, UnknownSourceError, "'nosuchtable' is not served"),
    ({"sources": "customers", "partitions": "0"}, ConfigError, "partitions"),
    ({"sources": "customers", "colour": "red"}, ConfigError, "unknown option 'colour'"),
    ({"sources": "customers,orders"}, ConfigError, "exactly one source"),
])
def test_bad_options_fail_load_with_the_python_sources_error(
        spark: SparkSession, shop: Relay, options: dict[str, str], error: type[Exception],
        message: str) -> None:
    with pytest.raises(error, match=message), jvm.errors():
        spark.readStream.format("databus-jvm").options(relay=shop.url, **options).load()


@pytest.mark.parametrize("fmt", ["databus-jvm", "databus-python"])
def test_load_waits_for_a_relay_that_comes_up_within_relay_retry_seconds(
        spark: SparkSession, tmp_path: Path, fmt: str) -> None:
    """A query (re)started while its relay restarts plans once the relay is back, and an
    address where nothing comes up fails after ``relayRetrySeconds``, not before."""
    db = tmp_path / "shop.db"
    create_shop(db)
    port = free_port()
    relay = make_relay(db, tmp_path, http={"port": port})
    late = threading.Timer(2.0, relay.start)
    late.start()
    try:
        started = time.monotonic()
        df = read(spark, fmt, f"http://127.0.0.1:{port}", "customers", relayRetrySeconds=60)
        assert time.monotonic() - started >= 1.5
        assert "after" in df.columns
    finally:
        late.join()
        relay.stop()
    started = time.monotonic()
    with pytest.raises(Exception, match="unreachable"), jvm.errors():
        read(spark, fmt, f"http://127.0.0.1:{free_port()}", "customers", relayRetrySeconds=3)
    assert 2.5 <= time.monotonic() - started < 30


@pytest.mark.parametrize("fmt", ["databus-jvm", "databus-python"])
def test_a_member_that_no_longer_holds_the_position_hands_over_to_one_that_does(
        spark: SparkSession, tmp_path: Path, fmt: str) -> None:
    """Two relays over one shop hold the same windows; the first, with a small buffer,
    evicted the start: the read takes it from the second, row for row."""
    db = tmp_path / "shop.db"
    create_shop(db)
    small = make_relay(db, tmp_path, state="small", capacity_bytes=64 * 1024)
    large = make_relay(db, tmp_path, state="large")
    with small, large:
        w = Writer(db, seed=23, rollback_ratio=0.0)
        while small.buffer.stats()["evicted_windows"] < 40:
            w.transaction()
            wait_relay(small, db)
        w.close()
        wait_relay(large, db)
        start = large.buffer.min_scn
        assert small.buffer.prev_scn > start  # the small relay no longer holds it
        both, _ = drain(read(spark, fmt, f"{small.url},{large.url}", "customers",
                             startingPosition=start), tmp_path / "both")
        alone, _ = drain(read(spark, fmt, large.url, "customers", startingPosition=start),
                         tmp_path / "alone")
    assert both and both == alone


def test_the_type_matrix_reads_the_same_on_both_sources(
        spark: SparkSession, tmp_path: Path, mariadb: MariaDB) -> None:
    with matrix_relay(mariadb, tmp_path, "jvmtm") as (relay, table, cur):
        cur.execute("UPDATE tm SET i = i - 1, vc = 'changed' WHERE id = 2")
        cur.execute("DELETE FROM tm WHERE id = 1")

        def count() -> int:
            with_rows = 0
            from databus.client.relay import RelayConnection
            from databus.core import event as ev
            with RelayConnection(relay.url) as c:
                data = c.stream(None, None, size=1 << 24, timeout=0).data
                with_rows = sum(1 for e in ev.iter_events(data) if not e.is_control)
            return with_rows

        wait_until(lambda: count() >= len(ROWS) + 2, 60, "the relay to hold the changes")
        for opts in ({"partitions": 1}, {"partitions": 2, "envelope": "flat"},
                     {"valueFormat": "json"}):
            dfs = {fmt: read(spark, fmt, relay.url, table, **opts)
                   for fmt in ("databus-jvm", "databus-python")}
            assert dfs["databus-jvm"].schema == dfs["databus-python"].schema, opts
            tag = "-".join(f"{k}{v}" for k, v in opts.items())
            jrows, _ = drain(dfs["databus-jvm"], tmp_path / f"jvm-{tag}")
            prows, _ = drain(dfs["databus-python"], tmp_path / f"py-{tag}")
            assert len(jrows) == len(ROWS) + 2
            if opts.get("valueFormat") == "json":  # the same JSON values, not text
                def parsed(rows: list[Any]) -> list[Any]:
                    return sorted(json.dumps([json.loads(r["before"] or "null"),
                                              json.loads(r["after"] or "null"), r["scn"]],
                                             sort_keys=True) for r in rows)
                assert parsed(jrows) == parsed(prows)
            else:
                assert jrows == prows, opts


def _size(df: DataFrame) -> int:
    """Spark's size estimate of ``df``'s optimised plan, in bytes."""
    return int(df._jdf.queryExecution().optimizedPlan().stats().sizeInBytes())


def test_the_jvm_scan_reports_the_relays_bytes_as_its_size(
        spark: SparkSession, tmp_path: Path, shop: Relay) -> None:
    held = shop.stats()["buffer"]["used_bytes"]
    default = int(spark._jsparkSession.sessionState().conf().defaultSizeInBytes())
    assert 0 < held < default
    # a batch read from earliest covers the whole buffer: its bytes exactly
    df = spark.read.format("databus-jvm").options(relay=shop.url, sources="customers").load()
    assert _size(df) == held
    # micro-batches: each sized by its SCN range's share of the buffer; together the buffer
    sizes: list[int] = []

    def batch(df: DataFrame, _: int) -> None:
        sizes.append(_size(df))

    stream = read(spark, "databus-jvm", shop.url, "customers", maxRowsPerBatch=15)
    q = (stream.writeStream.foreachBatch(batch).option("checkpointLocation", str(tmp_path / "c"))
         .trigger(availableNow=True).start())
    q.awaitTermination(180)
    assert q.exception() is None
    assert len(sizes) > 2 and all(0 < s < held for s in sizes)
    assert held <= sum(sizes) <= held + len(sizes)  # ceil per batch


def _write(db: Path, n: int) -> None:
    with Writer(db, seed=23) as w:
        for _ in range(n):
            w.transaction()


def test_a_relay_cluster_address_reads_the_members_zookeeper_lists(
        spark: SparkSession, tmp_path: Path, zookeeper: ZooKeeper) -> None:
    db = tmp_path / "shop.db"
    create_shop(db)
    name = f"sparkjvm{abs(hash(tmp_path)) % 10**8}"
    address = f"zk://{zookeeper.hosts}/{name}"
    cfg = parse_config({
        "source": {"url": f"sqlite:///{db}", "tables": TABLES, "poll_interval": 0.01,
                   "snapshot_mode": "no_data"},
        "http": {"port": 0}, "state_dir": str(tmp_path / "state"),
        "stream": {"default_timeout": 0.5}, "cluster": {"address": address}})
    with Relay(cfg) as relay:
        # the member captures once it leads: its triggers (and txlog) exist from then on
        def capturing() -> bool:
            with closing(sqlite3.connect(db)) as con:
                return bool(con.execute(
                    "SELECT 1 FROM sqlite_master WHERE name = '_databus_txlog'").fetchall())

        wait_until(capturing, 60, "the member to lead and capture")
        _write(db, 60)
        wait_relay(relay, db)
        jrows, _ = drain(read(spark, "databus-jvm", address, "customers", partitions=2),
                         tmp_path / "jvm")
        prows, _ = drain(read(spark, "databus-python", relay.url, "customers", partitions=2),
                         tmp_path / "py")
        assert jrows and jrows == prows
    with pytest.raises(ConfigError, match="not a cluster address"), jvm.errors():
        read(spark, "databus-jvm", f"zk://{zookeeper.hosts}/", "customers")


def test_mutual_tls_with_a_client_certificate(spark: SparkSession, tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "certs")
    db = tmp_path / "shop.db"
    create_shop(db)
    tls = {"cert_file": str(certs.server_cert), "key_file": str(certs.server_key),
           "client_ca_file": str(certs.ca)}
    with make_relay(db, tmp_path, http={"tls": tls}) as relay:
        _write(db, 40)
        wait_relay(relay, db)
        url = relay.url
        mtls = {"caFile": certs.ca, "certFile": certs.client_cert, "keyFile": certs.client_key}
        jrows, _ = drain(read(spark, "databus-jvm", url, "customers", **mtls), tmp_path / "jvm")
        prows, _ = drain(read(spark, "databus-python", url, "customers", **mtls), tmp_path / "py")
        assert jrows and jrows == prows
        # without a client certificate the relay refuses the handshake
        with pytest.raises(Exception, match="unreachable"), jvm.errors():
            read(spark, "databus-jvm", url, "customers", caFile=certs.ca, relayRetrySeconds=0)
        with pytest.raises(ConfigError, match="needs both files"), jvm.errors():
            read(spark, "databus-jvm", url, "customers", caFile=certs.ca,
                 certFile=certs.client_cert)


def fetch_threads(spark: SparkSession) -> list[str]:
    """The names of the JVM reader's fetch threads alive in Spark's JVM (local mode: the
    executors' too)."""
    jvm_ = spark.sparkContext._jvm
    assert jvm_ is not None
    threads = jvm_.java.lang.Thread.getAllStackTraces().keySet().toArray()
    return [str(t.getName()) for t in threads
            if str(t.getName()).startswith("databus-relay-fetch-") and t.isAlive()]


def client_connections(port: int) -> int:
    """Established TCP connections of this machine to ``port`` (the relay's): the clients'
    ends, from /proc/net/tcp and tcp6."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if int(fields[2].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
                    count += 1
    return count


@pytest.mark.parametrize("prefetch", [0, 8])
def test_fetching_ahead_or_not_reads_the_same_rows_and_offsets(
        spark: SparkSession, tmp_path: Path, shop: Relay, prefetch: int) -> None:
    # 4 KiB pages: many pages per bucket, most ending inside a window
    opts = {"partitions": 3, "fetchBytes": 4096, "prefetchBatches": prefetch}
    jrows, joffsets = drain(read(spark, "databus-jvm", shop.url, "orders", **opts), tmp_path / "j")
    prows, poffsets = drain(read(spark, "databus-python", shop.url, "orders", **opts),
                            tmp_path / "p")
    assert jrows and jrows == prows
    assert joffsets == poffsets
    assert fetch_threads(spark) == []


def test_a_read_stopped_early_ends_its_fetch_threads_and_connections(
        spark: SparkSession, shop: Relay) -> None:
    port = int(shop.url.rsplit(":", 1)[1].split("/")[0])
    before = client_connections(port)
    for _ in range(8):
        # limit(1): the task stops after a row while the fetch thread holds the next page
        df = (spark.read.format("databus-jvm").option("relay", shop.url)
              .option("sources", "orders").option("partitions", 2).option("fetchBytes", 4096)
              .load().limit(1))
        assert len(df.collect()) == 1
        assert fetch_threads(spark) == []  # close() joined them before the task ended
    # each aborted or finished request's connection is closed or back in the client's pool:
    # at most one per reader that can run at once (2 cores) and the driver's
    wait_until(lambda: client_connections(port) <= before + 3, 10, "relay connections closed")


def test_a_failure_in_the_fetch_thread_fails_the_task_with_its_type_and_message(
        spark: SparkSession, tmp_path: Path, shop: Relay) -> None:
    out = tmp_path / "q"
    df = read(spark, "databus-jvm", shop.url, "orders", partitions=2, relayRetrySeconds=1)
    drain(df, out)
    # a planned, uncommitted batch ending past the relay's newest window: Spark re-runs it
    # at the restart, and the tasks' fetches find the relay behind it
    logged = sorted((f for f in (out / "ckpt" / "offsets").iterdir() if f.name.isdigit()),
                    key=lambda f: int(f.name))
    lines = logged[-1].read_text().splitlines()
    offset = json.loads(lines[-1])
    for b in offset["buckets"].values():
        b["prevScn"], b["windowScn"], b["windowOffset"] = b["windowScn"], b["windowScn"] + 10**6, -1
    lines[-1] = json.dumps(offset)
    (out / "ckpt" / "offsets" / str(int(logged[-1].name) + 1)).write_text("\n".join(lines))
    q = (df.writeStream.format("parquet").option("path", str(out / "data"))
         .option("checkpointLocation", str(out / "ckpt")).trigger(availableNow=True).start())
    with pytest.raises(RelayProtocolError, match=r"holds windows only up to .* but the batch ends"), \
            jvm.errors():
        q.awaitTermination(120)
    assert fetch_threads(spark) == []
