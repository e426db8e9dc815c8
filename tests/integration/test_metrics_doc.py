"""docs/operations.md's metric tables are the truth: every metric a running server
exports is in its table with its type, and every metric of a table is exported (the
relay on each source kind, the bootstrap server, a consumer command's
``--metrics-port``)."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import httpx

from databus.relay.config import parse_config
from databus.relay.relay import Relay
from tests.support.bootstrap import make_bootstrap
from tests.support.mariadb import MariaDB
from tests.support.postgres import PostgreSQL
from tests.support.procs import DATABUS, free_port, stop
from tests.support.wait import wait_until

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
KIND = {"sqlite": "SQLite", "mysql": "MySQL", "postgres": "PostgreSQL", "chain": "chain"}


def documented() -> dict[str, dict[str, tuple[str, str]]]:
    """Section ("relay", "source", "consumer", "bootstrap") -> metric -> (type, the
    source kinds column or "")."""
    out: dict[str, dict[str, tuple[str, str]]] = {}
    section = ""
    for line in DOC.read_text().splitlines():
        if line.startswith("### Relay"):
            section = "relay"
        elif line.startswith("What the source reports"):
            section = "source"
        elif line.startswith("### Consumers"):
            section = "consumer"
        elif line.startswith("### Bootstrap"):
            section = "bootstrap"
        elif line.startswith("## ") and section:
            section = ""
        m = re.match(r"\| `(databus_\w+)` \| (\w+) \|([^|]*)\|", line)
        if m and section:
            out.setdefault(section, {})[m.group(1)] = (m.group(2), m.group(3).strip())
    return out


def exported(url: str) -> dict[str, str]:
    """Metric name (counters with ``_total``) -> type, from ``url``'s ``/metrics``."""
    out: dict[str, str] = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        m = re.match(r"# TYPE (\w+) (\w+)", line)
        if m:
            name, kind = m.groups()
            if kind == "counter" and not name.endswith("_total"):
                name += "_total"  # (older prometheus_client name the family without it)
            out[name] = kind
    return out


def check(url: str, want: dict[str, tuple[str, str]]) -> None:
    got = exported(url)
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    assert not missing, f"{url}: documented but not exported: {missing}"
    assert not extra, f"{url}: exported but not in docs/operations.md: {extra}"
    wrong = {n: (got[n], want[n][0]) for n in want if got[n] != want[n][0]}
    assert not wrong, f"{url}: type exported vs documented: {wrong}"


def relay_want(kind: str) -> dict[str, tuple[str, str]]:
    doc = documented()
    source = {n: v for n, v in doc["source"].items()
              if KIND[kind] in [k.strip() for k in v[1].split(",")]}
    return {**doc["relay"], **source}


def wait_capturing(url: str) -> None:
    wait_until(lambda: "databus_relay_fetcher_up 1.0" in httpx.get(f"{url}/metrics",
                                                                  timeout=10).text,
               60, f"{url} capturing")


def test_a_sqlite_relay_a_chain_relay_a_bootstrap_server_and_a_consumer(
        relay: Relay, shop_db: Path, tmp_path: Path) -> None:
    wait_capturing(relay.url)
    # a consumer listed, so the per-consumer series exist
    cp = '{"windowScn": -1, "windowOffset": -1}'
    httpx.get(f"{relay.url}/stream", params={"checkPoint": cp, "timeout": "0"},
              headers={"X-Databus-Consumer": "doc-test"}, timeout=10)
    check(relay.url, relay_want("sqlite"))
    chain = Relay(parse_config({"source": {"url": f"databus+{relay.url}"},
                                "http": {"port": 0}, "state_dir": str(tmp_path / "chain")}))
    with chain:
        wait_capturing(chain.url)
        check(chain.url, relay_want("chain"))
    with make_bootstrap(shop_db, tmp_path, relay) as bs:
        check(bs.url, documented()["bootstrap"])

        def lag() -> float:
            for line in httpx.get(f"{bs.url}/metrics", timeout=10).text.splitlines():
                if line.startswith("databus_bootstrap_producer_lag_seconds "):
                    return float(line.split()[1])
            raise AssertionError("no producer lag")

        wait_until(lambda: lag() < 2, 30, "the producer caught up (lag near 0)")
        ready = httpx.get(f"{bs.url}/health/ready", timeout=10)
        assert ready.status_code == 200, ready.text
        assert [c["name"] for c in ready.json()["checks"]] == ["producer", "applier", "store"]
    port = free_port()
    with (tmp_path / "tail.log").open("wb") as log:
        proc = subprocess.Popen([*DATABUS, "tail", "--relay", relay.url, "--from-start",
                                 "--metrics-port", str(port)],
                                stdout=subprocess.DEVNULL, stderr=log)
    try:
        url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            try:
                return httpx.get(f"{url}/health/ready", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, 60, f"tail's metrics port ready ({tmp_path / 'tail.log'})")
        check(url, documented()["consumer"])
        assert httpx.get(f"{url}/health/live", timeout=5).json()["status"] == "live"
    finally:
        stop(proc)


def test_a_mariadb_relay(mariadb: MariaDB, tmp_path: Path) -> None:
    db = f"docm_{int(time.time() * 1000) % 10**9}"
    mariadb.execute(f"CREATE DATABASE {db}", f"CREATE TABLE {db}.t (id INT PRIMARY KEY)")
    try:
        with Relay(parse_config({
                "source": {"url": mariadb.url, "tables": [rf"{db}\..*"],
                           "snapshot_mode": "no_data"},
                "http": {"port": 0}, "state_dir": str(tmp_path / "state")})) as relay:
            wait_capturing(relay.url)
            check(relay.url, relay_want("mysql"))
    finally:
        mariadb.execute(f"DROP DATABASE {db}")


def test_a_postgres_relay(postgres: PostgreSQL, tmp_path: Path) -> None:
    with postgres.fresh_database("docm") as url:
        db = url.rsplit("/", 1)[1]
        postgres.execute("CREATE TABLE t (id int PRIMARY KEY)", db=db)
        try:
            with Relay(parse_config({
                    "source": {"url": postgres.source_url(db), "tables": [r"public\.t"],
                               "snapshot_mode": "no_data", "create_publication": True,
                               "slot": f"s_{db}", "publication": "docm"},
                    "http": {"port": 0}, "state_dir": str(tmp_path / "state")})) as relay:
                wait_capturing(relay.url)
                check(relay.url, relay_want("postgres"))
        finally:
            postgres.drop_slots(db)
