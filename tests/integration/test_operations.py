"""The operator's view (issue 33, docs/operations.md) on real relays: time lag right
when idle (MariaDB, PostgreSQL), the consumers a relay knows (``X-Databus-Consumer``
from the client library, ``GET /consumers``) and a stalled consumer's lag growing with
the clock there and in the consumer's own numbers, ``/health/live`` and
``/health/ready`` (failing when capture stops), ``databus status``."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from databus.client.metrics import readiness, render
from databus.relay.config import parse_config
from databus.relay.relay import Relay
from databus.serving.health import Check
from databus.serving.metrics_port import MetricsServer
from tests.support.mariadb import MariaDB
from tests.support.postgres import PostgreSQL
from tests.support.procs import DATABUS
from tests.support.pulling import Pulling
from tests.support.relays import make_relay
from tests.support.shop import Writer
from tests.support.wait import wait_until

PROGRESS = 0.3  # the sources' progress_interval: "idle" below is many of them


def metric(url: str, name: str, labels: str = "") -> float:
    """One sample of ``name{labels}`` from ``url``'s ``/metrics``."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    want = f"{name}{{{labels}}}" if labels else name
    for line in text.splitlines():
        if line.startswith(want + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{want} not in {url}/metrics")


def consumers(url: str) -> dict[str, Any]:
    r = httpx.get(f"{url}/consumers", timeout=10)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def row(url: str, name: str) -> dict[str, Any]:
    rows = [c for c in consumers(url)["consumers"] if c["name"] == name]
    assert rows, f"{name} not listed at {url}/consumers"
    return rows[0]


class Running(Pulling):
    """A :class:`Pulling` consumer whose numbers are served on a metrics port of its own
    (:attr:`metrics_url`) as the consumer commands serve them."""

    def __init__(self, url: str, name: str) -> None:
        super().__init__(url, name)
        self.port = MetricsServer(
            "test", lambda: render([self.client.metrics()]),
            lambda: [Check(*c) for c in readiness([self.client.metrics()])])

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.port.port}"

    def lag(self) -> float:
        """``databus_consumer_lag_seconds`` from its own ``/metrics``."""
        return metric(self.metrics_url, "databus_consumer_lag_seconds",
                      f'consumer="{self.client.name}"')

    def __enter__(self) -> Running:
        self.port.start()
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self.port.stop()


def idle_lag_stays_near_zero(url: str, seconds: float = 3.0) -> None:
    """``databus_relay_lag_seconds`` over ``seconds`` of an idle source (many progress
    intervals): never more than the binlog's one-second resolution plus a heartbeat."""
    end = time.monotonic() + seconds
    worst = 0.0
    while time.monotonic() < end:
        worst = max(worst, metric(url, "databus_relay_lag_seconds"))
        time.sleep(0.2)
    assert worst < 2.5, f"an idle relay reported {worst:.2f} s of lag"


def stalled_consumer_lag_follows_the_clock(url: str, write: Callable[[int], None]) -> None:
    """A consumer keeping up (lag ~0), then stalled in its callback while the source
    writes: its lag in ``/consumers`` and in its own numbers grows with wall time
    (within 1 s); released, back to ~0."""
    name = "ops-test consumer"
    with Running(url, name) as run:
        write(1)
        wait_until(lambda: run.gate.events >= 1, 60, "the first change consumed")
        wait_until(lambda: row(url, name)["seconds_behind"] < 2.5, 30,
                   "the consumer's lag to settle near 0")
        lag = run.client.metrics().lag_seconds
        assert lag is not None and lag < 2.5, lag
        run.gate.open.clear()
        committed = time.time()
        write(2)
        wait_until(run.gate.waiting.is_set, 60, "the consumer to stall in its callback")
        time.sleep(1.0)
        t1, r1, m1, p1 = time.time(), row(url, name), run.client.metrics(), run.lag()
        time.sleep(2.0)
        t2, r2, m2, p2 = time.time(), row(url, name), run.client.metrics(), run.lag()
        assert m1.lag_seconds is not None and m2.lag_seconds is not None
        for what, a, b in (("/consumers", r1["seconds_behind"], r2["seconds_behind"]),
                           ("metrics()", m1.lag_seconds, m2.lag_seconds),
                           ("its /metrics", p1, p2)):
            assert abs((b - a) - (t2 - t1)) < 1.0, f"{what}: {a} -> {b} in {t2 - t1:.2f} s"
            # the age of the oldest change not consumed (the binlog counts whole seconds)
            assert abs(b - (t2 - committed)) < 1.5, f"{what}: {b} at {t2 - committed:.2f} s"
        assert r2["windows_behind"] >= 1 and m2.lag_windows is not None
        assert m2.state == "online"
        ready = httpx.get(f"{run.metrics_url}/health/ready", timeout=10).json()
        assert ready["status"] == "ready" and ready["checks"][0]["name"] == f"consumer {name}"
        run.gate.open.set()
        wait_until(lambda: run.gate.events >= 3, 60, "the stalled changes consumed")
        wait_until(lambda: row(url, name)["seconds_behind"] < 2.5, 30,
                   "the relay's view of the lag back near 0")
        wait_until(lambda: run.lag() < 2.5, 30, "the consumer's own lag back near 0")


# -- MariaDB and PostgreSQL ---------------------------------------------------------------


def test_mariadb_relay_idle_lag_and_a_stalled_consumer(mariadb: MariaDB,
                                                       tmp_path: Path) -> None:
    db = f"ops_{int(time.time() * 1000) % 10**9}"
    mariadb.execute(f"CREATE DATABASE {db}", f"CREATE TABLE {db}.t (id INT PRIMARY KEY)")
    relay = Relay(parse_config({
        "source": {"url": mariadb.url, "tables": [rf"{db}\..*"], "snapshot_mode": "no_data",
                   "progress_interval": PROGRESS},
        "http": {"port": 0}, "state_dir": str(tmp_path / "state"),
        "buffer": {"flush_interval": 0.2}}))
    counter = iter(range(1, 10**6))

    def write(n: int) -> None:
        mariadb.execute(*[f"INSERT INTO {db}.t VALUES ({next(counter)})" for _ in range(n)])

    try:
        with relay:
            wait_until(lambda: metric(relay.url, "databus_relay_fetcher_up") == 1, 60,
                       "capture running")
            idle_lag_stays_near_zero(relay.url)
            stalled_consumer_lag_follows_the_clock(relay.url, write)
            idle_lag_stays_near_zero(relay.url, 1.5)
    finally:
        mariadb.execute(f"DROP DATABASE {db}")


@pytest.fixture
def pgdb(postgres: PostgreSQL) -> Iterator[str]:
    with postgres.fresh_database("ops") as url:
        yield url.rsplit("/", 1)[1]  # its slots are dropped with it


def test_postgres_relay_idle_lag_a_stalled_consumer_and_walsender(
        postgres: PostgreSQL, pgdb: str, tmp_path: Path) -> None:
    """As MariaDB's, then the server's walsender stopped (SIGSTOP) while a transaction
    commits: the relay's reads find nothing, yet its lag grows with the clock from that
    commit (an empty read proves nothing here: docs/operations.md, "Time in the
    stream"), and falls back near 0 when the walsender goes on."""
    dsn = f"host=127.0.0.1 port={postgres.port} user=postgres dbname={pgdb}"
    with psycopg.connect(dsn, autocommit=True) as con:
        con.execute("CREATE TABLE t (id int PRIMARY KEY)")
    relay = Relay(parse_config({
        "source": {"url": postgres.source_url(pgdb), "tables": [r"public\.t"],
                   "snapshot_mode": "no_data", "create_publication": True,
                   "slot": f"s_{pgdb}", "publication": "ops", "progress_interval": PROGRESS},
        "http": {"port": 0}, "state_dir": str(tmp_path / "state"),
        "buffer": {"flush_interval": 0.2}}))
    counter = iter(range(1, 10**6))

    def write(n: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as con:
            for _ in range(n):
                con.execute(f"INSERT INTO t VALUES ({next(counter)})")

    with relay:
        wait_until(lambda: metric(relay.url, "databus_relay_fetcher_up") == 1, 60,
                   "capture running")
        idle_lag_stays_near_zero(relay.url)
        stalled_consumer_lag_follows_the_clock(relay.url, write)
        assert metric(relay.url, "databus_relay_source_slot_retained_bytes") >= 0
        walsender = int(postgres.scalar(f"SELECT active_pid FROM pg_replication_slots"
                                        f" WHERE slot_name = 's_{pgdb}'"))
        os.kill(walsender, signal.SIGSTOP)
        try:
            committed = time.time()
            write(1)
            time.sleep(1.0)
            t1, l1 = time.time(), metric(relay.url, "databus_relay_lag_seconds")
            time.sleep(2.0)
            t2, l2 = time.time(), metric(relay.url, "databus_relay_lag_seconds")
            assert abs((l2 - l1) - (t2 - t1)) < 1.0, f"lag {l1} -> {l2} in {t2 - t1:.2f} s"
            assert l2 >= t2 - committed - 1.0, f"lag {l2} at {t2 - committed:.2f} s"
        finally:
            os.kill(walsender, signal.SIGCONT)
        wait_until(lambda: metric(relay.url, "databus_relay_lag_seconds") < 2.5, 30,
                   "the lag back near 0 once the walsender goes on")


# -- SQLite: the consumers table, health, databus status ----------------------------------


@pytest.fixture
def shop_relay(shop_db: Path, tmp_path: Path) -> Iterator[Relay]:
    r = make_relay(shop_db, tmp_path)
    with r:
        yield r


def test_consumers_are_listed_by_the_name_they_send(shop_relay: Relay, shop_db: Path) -> None:
    url = shop_relay.url
    with Writer(shop_db) as w:
        for _ in range(5):
            w.transaction()
    with Running(url, "named one") as run:
        wait_until(lambda: run.gate.events > 0 and row(url, "named one")["windows_behind"]
                   == 0, 30, "the consumer caught up")
        r = row(url, "named one")
        assert r["state"] == "online" and r["requests"] >= 1 and not r["falling_off"]
        assert r["position"]["scn"] == shop_relay.buffer.max_scn
        assert r["address"] == "127.0.0.1" and r["token"] is None
        m = run.client.metrics()
        assert m.consumer == "named one" and m.state == "online" and m.lag_windows == 0
        assert m.events == run.gate.events and m.windows > 0
    # a reader naming none is listed by its address; a name too long is refused
    cp = json.dumps({"windowScn": -1, "windowOffset": -1})
    httpx.get(f"{url}/stream", params={"checkPoint": cp, "timeout": "0"}, timeout=10)
    assert row(url, "(unnamed) 127.0.0.1")["position"]["scn"] == -1
    r = httpx.get(f"{url}/stream", params={"checkPoint": cp, "timeout": "0"},
                  headers={"X-Databus-Consumer": "x" * 201}, timeout=10)
    assert r.status_code == 400 and "X-Databus-Consumer" in r.text
    # the relay's own numbers for each consumer
    text = httpx.get(f"{url}/metrics", timeout=10).text
    assert 'databus_relay_consumer_lag_windows{consumer="named one"} 0.0' in text
    assert 'databus_relay_consumers{state="online"}' in text
    # databus status prints the same table
    out = subprocess.run([*DATABUS, "status", "--relay", url], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "capture running" in out.stdout and "named one" in out.stdout
    assert re.search(r"named one\s+\S+\s+\d+\.\d\s+0\s", out.stdout), out.stdout
    js = subprocess.run([*DATABUS, "status", "--relay", url, "--json"], capture_output=True,
                        text=True, timeout=60)
    assert js.returncode == 0, js.stderr
    assert {c["name"] for c in json.loads(js.stdout)[0]["consumers"]} >= {"named one"}


def test_status_of_a_relay_that_does_not_answer_exits_3() -> None:
    out = subprocess.run([*DATABUS, "status", "--relay", "http://127.0.0.1:9"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 3, (out.returncode, out.stdout, out.stderr)
    assert "http://127.0.0.1:9" in out.stderr


def test_health_ready_fails_when_capture_stops(shop_relay: Relay, shop_db: Path,
                                                tmp_path: Path) -> None:
    """A chain relay whose upstream stops: capture retries, ``/health/ready`` answers
    503 naming the capture check, ``/health/live`` and ``/health`` still 200, and its lag
    (right while the upstream was idle) grows with the clock."""
    upstream = shop_relay
    with Writer(shop_db) as w:
        w.transaction()
    chain = Relay(parse_config({
        "source": {"url": f"databus+{upstream.url}"},
        "http": {"port": 0}, "state_dir": str(tmp_path / "chain"),
        "buffer": {"flush_interval": 0.2}}))
    with chain:
        url = chain.url
        wait_until(lambda: httpx.get(f"{url}/health/ready", timeout=10).status_code == 200,
                   30, "the chain relay ready")
        ready = httpx.get(f"{url}/health/ready", timeout=10).json()
        assert ready["status"] == "ready" and ready["service"] == "relay"
        assert ready["checks"][0]["name"] == "capture" and ready["checks"][0]["ok"]
        idle_lag_stays_near_zero(url, 2.0)
        assert row(upstream.url, f"relay {chain.stats()['name']}")["windows_behind"] == 0
        upstream.stop()
        r = wait_until(lambda: (r := httpx.get(f"{url}/health/ready", timeout=10))
                       .status_code == 503 and r, 30, "/health/ready to fail")
        body = r.json()
        assert body["status"] == "not_ready" and not body["checks"][0]["ok"]
        assert "retrying" in body["checks"][0]["detail"], body
        assert httpx.get(f"{url}/health/live", timeout=10).json()["status"] == "live"
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
        a = metric(url, "databus_relay_lag_seconds")
        time.sleep(1.5)
        b = metric(url, "databus_relay_lag_seconds")
        assert 1.0 < b - a < 2.5, (a, b)
        assert metric(url, "databus_relay_capture_state", 'state="retrying"') == 1
        assert metric(url, "databus_relay_fetcher_up") == 0


def test_a_consumer_near_the_buffers_oldest_window_is_about_to_fall_off(
        shop_db: Path, tmp_path: Path) -> None:
    """The buffer evicts: a consumer whose position is less than ``fall_off_warning`` of
    source time ahead of the oldest window held is marked falling off; one at the newest
    window is not; in ``/consumers``, the relay's metrics and ``databus status``."""
    relay = make_relay(shop_db, tmp_path, capacity_bytes=64 * 1024)
    with relay, Writer(shop_db) as w:
        url = relay.url
        wait_until(lambda: (w.transaction() or True)
                   and relay.buffer.stats()["evicted_windows"] > 20, 60, "evictions")
        wait_until(lambda: relay.buffer.max_scn >= 0 and consumers(url)["buffer"]["evicting"],
                   30, "the relay to say it evicts")
        oldest, newest = relay.buffer.min_scn, relay.buffer.max_scn
        for name, scn in (("old", oldest), ("new", newest)):
            cp = json.dumps({"windowScn": scn, "windowOffset": -1})
            r = httpx.get(f"{url}/stream", params={"checkPoint": cp, "timeout": "0",
                                                    "size": "1024"},
                          headers={"X-Databus-Consumer": name}, timeout=10)
            assert r.status_code == 200, r.text
        old, new = row(url, "old"), row(url, "new")
        assert old["falling_off"] and old["fall_off_margin_seconds"] is not None, old
        assert old["windows_behind"] > 0 and old["position"]["scn"] == oldest
        assert not new["falling_off"] and new["windows_behind"] == 0, new
        assert metric(url, "databus_relay_consumer_falling_off", 'consumer="old"') == 1
        assert metric(url, "databus_relay_consumer_falling_off", 'consumer="new"') == 0
        out = subprocess.run([*DATABUS, "status", "--relay", url], capture_output=True,
                             text=True, timeout=60)
        assert re.search(r"\n  old .*FALLING OFF", out.stdout), out.stdout
        assert "FALLING OFF" not in next(x for x in out.stdout.splitlines()
                                         if x.startswith("  new "))
