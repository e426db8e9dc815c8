"""MariaDB -> relay -> replicate sink, with a relay restart from its SCN."""

from __future__ import annotations

import random
import sqlite3
import threading
from pathlib import Path
from typing import Any

from databus.client import ClientConfig, Consumer, DatabusClient, DataEvent
from databus.client.sinks import ReplicateSink
from databus.relay.config import parse_config
from databus.relay.relay import Relay
from databus.sources.mysql import parse_mysql_url
from databus.sources.mysql.connection import binary_logs
from tests.support.mariadb import MariaDB
from tests.support.procs import free_port
from tests.support.wait import wait_until


class Windows(Consumer):
    def __init__(self) -> None:
        self.windows: list[list[tuple[str, str]]] = []
        self.current: list[tuple[str, str]] = []

    def on_start_data_event_sequence(self, scn: int) -> None:
        self.current = []

    def on_data_event(self, event: DataEvent) -> None:
        self.current.append((event.source, event.op.letter))

    def on_end_data_event_sequence(self, scn: int) -> None:
        self.windows.append(self.current)


def _relay(m: MariaDB, tmp: Path, port: int) -> Relay:
    r = Relay(parse_config({
        "source": {"url": m.url, "tables": [r"shop\..*"]},
        "buffer": {"capacity_bytes": 8 * 1024 * 1024, "path": str(tmp / "relay.buf"),
                   "flush_interval": 0.2},
        "http": {"port": port},
    }))
    r.start()
    return r


def _workload(m: MariaDB, rng: random.Random, n: int) -> None:
    with m.connect("shop") as con, con.cursor() as cur:
        for _ in range(n):
            cur.execute("BEGIN")
            k = rng.randrange(1, 200)
            cur.execute("INSERT INTO a VALUES (%s, %s, %s, %s) ON DUPLICATE KEY UPDATE"
                        " amount = VALUES(amount), at = VALUES(at)",
                        (k, f"name {k} é", f"{rng.randrange(10**6)}.{rng.randrange(100):02d}",
                         f"2024-01-0{rng.randrange(1, 9)} 10:00:00.{rng.randrange(10**6):06d}"))
            cur.execute("INSERT IGNORE INTO b VALUES (%s, %s, %s)",
                        (f"k{rng.randrange(50)}", rng.randrange(5), rng.random()))
            if rng.random() < 0.2:
                cur.execute("DELETE FROM a WHERE id = %s", (rng.randrange(1, 200),))
            cur.execute("ROLLBACK" if rng.random() < 0.1 else "COMMIT")


def _rows(m: MariaDB, replica: Path, table: str) -> tuple[list[Any], list[Any]]:
    with m.connect("shop") as con, con.cursor() as cur:
        cur.execute(f"SELECT * FROM {table} ORDER BY 1, 2")
        src = [tuple(str(v) for v in r) for r in cur.fetchall()]
    lite = sqlite3.connect(replica)
    try:
        dst = [tuple(str(v) for v in r)
               for r in lite.execute(f"SELECT * FROM {table} ORDER BY 1, 2")]
    finally:
        lite.close()
    return src, dst


def test_binlog_to_replica_with_relay_restart(server: MariaDB, tmp_path: Path) -> None:
    server.execute("CREATE DATABASE shop",
                   "CREATE TABLE shop.a (id INT PRIMARY KEY, name VARCHAR(40),"
                   " amount DECIMAL(12,2), at DATETIME(6))",
                   "CREATE TABLE shop.b (k VARCHAR(10), n INT, x DOUBLE, PRIMARY KEY (k, n))")
    port = free_port()  # the same port after the restart: clients keep their URL
    relay = _relay(server, tmp_path, port)
    replica = tmp_path / "replica.db"
    stop = threading.Event()
    sink = ReplicateSink(f"sqlite:///{replica}")
    client = DatabusClient(ClientConfig(relay=relay.url, poll_timeout=0.5,
                                        relay_max_retries=None), sink, sink.checkpoint_store)
    watcher = Windows()
    watch = DatabusClient(ClientConfig(relay=relay.url, poll_timeout=0.5), watcher)
    threads = [threading.Thread(target=c.run, kwargs={"stop": stop}) for c in (client, watch)]
    for t in threads:
        t.start()
    rng = random.Random(3)
    try:
        # the relay starts at the binlog's end: let it get there
        wait_until(lambda: server.binlog_dumps() > 0, 60, "the relay's binlog dump")
        _workload(server, rng, 150)
        relay.stop()  # restart from the SCN held in the persistent buffer
        _workload(server, rng, 100)
        relay = _relay(server, tmp_path, port)
        _workload(server, rng, 50)
        def equal() -> bool:
            try:
                return all(a == b for a, b in (_rows(server, replica, t) for t in ("a", "b")))
            except sqlite3.OperationalError:  # the replica's tables are not there yet
                return False

        wait_until(equal, 60, "the replica to equal MariaDB", interval=0.3)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        relay.stop()
    for table in ("a", "b"):
        src, dst = _rows(server, replica, table)
        assert src == dst and src, table
    multi = [w for w in watcher.windows if {s for s, _ in w} == {"shop.a", "shop.b"}]
    assert multi, "multi-table transactions arrive as one window"


def _wait(predicate: Any, timeout: float = 60) -> None:
    wait_until(predicate, timeout, "the condition", interval=0.2)


def test_server_restart_mid_stream_and_purged_position(server: MariaDB, tmp_path: Path) -> None:
    import httpx

    server.execute("CREATE DATABASE shop", "CREATE TABLE shop.a (id INT PRIMARY KEY,"
                   " name VARCHAR(40), amount DECIMAL(12,2), at DATETIME(6))",
                   "CREATE TABLE shop.b (k VARCHAR(10), n INT, x DOUBLE, PRIMARY KEY (k, n))")
    port = free_port()
    relay = _relay(server, tmp_path, port)
    rng = random.Random(9)
    try:
        _wait(lambda: server.binlog_dumps() > 0)
        _workload(server, rng, 20)
        first = relay.buffer.max_scn
        _wait(lambda: relay.buffer.max_scn > 0)
        server.stop()  # the database goes away: the relay retries, then resumes
        _wait(lambda: relay.fetcher_status()["state"] == "retrying")
        server.start()
        _workload(server, rng, 20)
        _wait(lambda: relay.fetcher_status()["state"] == "running"
              and relay.buffer.max_scn >> 32 > first >> 32)
    finally:
        relay.stop()
    # purge what the relay still needs while it is down: a clear terminal error
    _workload(server, rng, 5)
    server.execute("FLUSH BINARY LOGS", "FLUSH BINARY LOGS")
    url = parse_mysql_url(server.url)
    needed = f"{binary_logs(url)[0][0].rsplit('.', 1)[0]}.{relay.buffer.max_scn >> 32:06d}"

    def purged() -> bool:  # a file goes once the server's binlog checkpoint passed it
        server.execute(f"PURGE BINARY LOGS TO '{binary_logs(url)[-1][0]}'")
        return needed not in [f for f, _ in binary_logs(url)]

    _wait(purged, 30)
    relay = _relay(server, tmp_path, port)
    try:
        _wait(lambda: relay.fetcher_status()["state"] == "failed")
        health = httpx.get(f"{relay.url}/admin", timeout=10)
        assert health.status_code == 503
        assert "SourcePositionLost" in health.json()["fetcher"]["last_error"]
    finally:
        relay.stop()


def test_json_transaction_metadata_and_ddl_through_the_relay(server: MariaDB,
                                                             tmp_path: Path) -> None:
    import json

    import httpx

    server.execute("CREATE DATABASE shop", "CREATE TABLE shop.a (id INT PRIMARY KEY, v INT)",
                   "CREATE TABLE shop.b (id INT PRIMARY KEY)")
    port = free_port()
    gtid = server.gtid_pos()
    # a new relay starting at a GTID: no race with the writes below
    relay = Relay(parse_config({"source": {"url": server.url, "tables": [r"shop\..*"],
                                           "start_gtid": gtid},
                                "http": {"port": port}}))
    with relay:
        server.execute("BEGIN", "INSERT INTO shop.a VALUES (1, 1), (2, 2)",
                       "INSERT INTO shop.b VALUES (7)", "COMMIT",
                       "ALTER TABLE shop.a ADD COLUMN w TEXT",
                       "INSERT INTO shop.a VALUES (3, 3, 'x')")
        def three_windows() -> list[dict[str, Any]] | None:
            r = httpx.get(f"http://127.0.0.1:{port}/stream",
                          params={"output": "json", "transactions": "true", "size": "1000000",
                                  "timeout": "1"})
            assert r.status_code == 200
            got = [json.loads(x) for x in r.text.splitlines()]
            return got if sum(1 for x in got if x.get("type") == "eop") >= 3 else None

        lines = wait_until(three_windows, 20, "three windows on the stream")
        bad = httpx.get(f"http://127.0.0.1:{port}/stream",
                        params={"output": "json", "transactions": "maybe"})
        assert bad.status_code == 400 and bad.json()["error"] == "InvalidRequest"
    kinds = [x.get("status") or x.get("type") or x["op"] for x in lines]
    assert kinds == ["BEGIN", "c", "c", "c", "END", "eop",  # one window, two tables
                     "BEGIN", "c", "END", "eop",  # the ALTER: a schema change event
                     "BEGIN", "c", "END", "eop"]
    begin, end = lines[0], lines[4]
    assert begin["id"] == end["id"] == lines[1]["transaction"]["id"] and begin["id"]
    assert end["event_count"] == 3
    assert sorted((d["data_collection"], d["event_count"]) for d in end["data_collections"]) \
        == [("shop.a", 2), ("shop.b", 1)]
    assert [x["transaction"]["total_order"] for x in lines[1:4]] == [1, 2, 3]
    assert [x["transaction"]["data_collection_order"] for x in lines[1:4]] == [1, 2, 1]
    ddl = lines[7]
    assert ddl["source"]["db"] == "databus" and ddl["after"]["kind"] == "ALTER"
    assert ddl["after"]["ddl"].startswith("ALTER TABLE shop.a")
    assert lines[11]["after"] == {"id": 3, "v": 3, "w": "x"}
