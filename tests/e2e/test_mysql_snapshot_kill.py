"""Incremental snapshots with ``databus relay`` processes.

kill -9 in the middle of a snapshot:

A table of existing rows is snapshotted (``initial`` mode) while a writer keeps
changing it; the relay (persistent buffer) is killed with SIGKILL several
times and restarted. It must resume after the last chunk its buffer holds
(one STARTED, only in-flight chunks read again), and ``databus replicate``
into SQLite must end equal to the table.

Tables added to the config file while the relay runs (SIGHUP) are captured
and can be snapshotted without a restart.
"""

from __future__ import annotations

import json
import random
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.mariadb import MariaDB
from tests.support.procs import DATABUS, free_port, kill9, snapshot_reads, spawn, stop, wait_http
from tests.support.wait import wait_until
from tests.support.writers import KeyChurn

pytestmark = pytest.mark.slow

ROWS, CHUNK = 40_000, 100


def _notices(url: str) -> list[dict[str, Any]]:
    sources = httpx.get(f"{url}/sources", timeout=10).json()
    src = next(s["id"] for s in sources if s["name"] == "databus.notifications")
    r = httpx.get(f"{url}/stream", params={"sources": str(src), "output": "json",
                                           "size": "50000000", "timeout": "0"}, timeout=30)
    return [json.loads(x)["after"] for x in r.text.splitlines() if '"op"' in x]


def test_kill9_relay_mid_snapshot_resumes_and_replica_equals(tmp_path: Path) -> None:
    m = MariaDB(tmp_path / "db")
    m.start()
    procs = []
    writer = KeyChurn.mysql(m, keys=ROWS + 500)
    try:
        m.execute("CREATE DATABASE shop",
                  "CREATE TABLE shop.t (id INT PRIMARY KEY, v INT, s VARCHAR(20))")
        with m.connect("shop") as con, con.cursor() as cur:
            cur.executemany("INSERT INTO t VALUES (%s, %s, 'old')",
                            [(i, i) for i in range(ROWS)])
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        config = tmp_path / "relay.yaml"
        config.write_text(yaml.safe_dump({
            "source": {"url": m.url, "tables": [r"shop\.t"], "snapshot_mode": "initial",
                       "snapshot_chunk_size": CHUNK},
            "buffer": {"path": str(tmp_path / "relay.buf"), "capacity_bytes": 256 << 20,
                       "flush_interval": 0.1},
            "http": {"port": port}}))
        relay_args = [*DATABUS, "relay", "--config", str(config)]
        relay = spawn(relay_args, tmp_path / "relay.log")
        wait_http(f"{url}/admin", relay)
        replica = tmp_path / "replica.db"
        sink = spawn([*DATABUS, "replicate", "--relay", url, "--target", f"sqlite:///{replica}"],
                     tmp_path / "sink.log")
        procs = [relay, sink]
        writer.start()
        rng = random.Random(3)
        kills = 0
        while kills < 4:
            time.sleep(rng.uniform(0.3, 0.8))
            done = [n["kind"] for n in _notices(url)]
            if "COMPLETED" in done:
                break
            kill9(relay)
            kills += 1
            relay = procs[0] = spawn(relay_args, tmp_path / "relay.log")
            wait_http(f"{url}/admin", relay)
        assert kills >= 2, "the snapshot ended before the relay could be killed twice"
        wait_until(lambda: "COMPLETED" in [n["kind"] for n in _notices(url)], 240, "the snapshot to complete",
                   interval=0.5)
        writer.stop.set()
        writer.join()
        kinds = [n["kind"] for n in _notices(url)]
        assert kinds.count("STARTED") == 1, kinds  # resumed, never started over
        reads = snapshot_reads(url)
        # every chunk is sent once, except chunks in flight at a kill
        assert ROWS * 0.9 <= reads <= ROWS + 500 + kills * CHUNK, (reads, kills)

        def source_rows() -> list[tuple[Any, ...]]:
            with m.connect("shop") as c, c.cursor() as cur:
                cur.execute("SELECT id, v, s FROM t ORDER BY id")
                return [tuple(r) for r in cur.fetchall()]

        want = source_rows()

        def replica_rows() -> list[tuple[Any, ...]]:
            try:
                lite = sqlite3.connect(replica)
                try:
                    return [tuple(r) for r in lite.execute("SELECT id, v, s FROM t ORDER BY id")]
                finally:
                    lite.close()  # sqlite3's own context manager commits, it does not close
            except sqlite3.Error:  # not created yet, or locked by the sink
                return []

        wait_until(lambda: replica_rows() == want, 120, "the replica to equal the source",
                   interval=0.5)
        assert writer.count > 100
        lite = sqlite3.connect(replica)
        tables = {r[0] for r in lite.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        lite.close()
        assert "notifications" not in tables  # notices are not replicated as rows
    finally:
        writer.stop.set()
        for p in procs:
            stop(p)
        m.stop()
    print(f"\n{kills} kills mid-snapshot, {reads} r events for {ROWS} rows,"
          f" {writer.count} concurrent writes", file=sys.stderr)


def test_tables_added_to_the_config_while_running_are_captured_and_snapshotted(
        tmp_path: Path) -> None:
    import signal as sig
    import subprocess

    m = MariaDB(tmp_path / "db")
    m.start()
    relay = None
    try:
        m.execute("CREATE DATABASE shop", "CREATE TABLE shop.a (id INT PRIMARY KEY)",
                  "CREATE TABLE shop.b (id INT PRIMARY KEY, v VARCHAR(10))",
                  "INSERT INTO shop.b VALUES (1, 'old'), (2, 'old')")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        config = tmp_path / "relay.yaml"

        def write_config(tables: list[str]) -> None:
            config.write_text(yaml.safe_dump({
                "source": {"url": m.url, "tables": tables, "snapshot_mode": "initial"},
                "http": {"port": port}}))

        write_config([r"shop\.a"])
        relay = spawn([*DATABUS, "relay", "--config", str(config)], tmp_path / "relay.log")
        wait_http(f"{url}/admin", relay)

        def lines() -> list[dict[str, Any]]:
            r = httpx.get(f"{url}/stream", params={"output": "json", "size": "1000000",
                                                   "timeout": "1"}, timeout=30)
            return [json.loads(x) for x in r.text.splitlines() if '"op"' in x]

        def rows_of(table: str) -> list[tuple[str, Any]]:
            return [(x["op"], x["after"]["id"]) for x in lines()
                    if x["source"]["table"] == table]

        m.execute("INSERT INTO shop.a VALUES (1)", "INSERT INTO shop.b VALUES (3, 'before')")
        # the start's own (initial) snapshot of shop.a may also catch the row as "r"
        wait_until(lambda: ("c", 1) in rows_of("a"), 30, "the insert into shop.a")
        assert rows_of("b") == []  # not captured yet
        write_config([r"shop\.a", r"shop\.b"])
        relay.send_signal(sig.SIGHUP)
        def reloaded() -> bool:  # the reload takes effect between transactions
            m.execute("INSERT INTO shop.a VALUES (2) ON DUPLICATE KEY UPDATE id = id")
            m.execute("INSERT INTO shop.b VALUES (4, 'after') ON DUPLICATE KEY UPDATE v = v")
            return ("c", 4) in rows_of("b")

        wait_until(reloaded, 30, "the reloaded config to capture shop.b", interval=0.5)
        cli = subprocess.run([*DATABUS, "signal", "execute-snapshot", "--relay", url,
                              "--tables", r"shop\.b"], capture_output=True, text=True,
                             timeout=60)
        assert cli.returncode == 0, cli.stderr
        wait_until(lambda: sorted(i for op, i in rows_of("b") if op == "r") == [1, 2, 3, 4],
                   30, "the signalled snapshot of shop.b")
        assert relay.poll() is None
    finally:
        if relay is not None:
            stop(relay)
        m.stop()
