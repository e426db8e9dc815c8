"""Incremental (watermark) snapshots of the MySQL source, driven by signals.

A consumer applies stream and ``r`` events in order to a dict; with writers
changing the same keys during the snapshot, it must end equal to the table.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from databus.core import event as ev
from databus.core.envelope import decode_images
from databus.core.errors import SourcePositionLostError
from databus.core.window import Window
from databus.sources.mysql.checks import parse_mysql_url
from databus.sources.mysql.connection import master_status
from databus.sources.mysql.source import NOTIFICATIONS, MysqlSource
from tests.support.mariadb import MariaDB
from tests.support.sources import mysql_source
from tests.support.wait import wait_until
from tests.support.writers import KeyChurn

SIGNALS = "databus.signals"


def _scn(m: MariaDB) -> int:
    file, pos = master_status(parse_mysql_url(m.url))
    return (int(file.rsplit(".", 1)[1]) << 32) | pos


class Replica:
    """Applies events in order; remembers notifications and snapshot reads."""

    def __init__(self, src: MysqlSource) -> None:
        self.src = src
        self.tables: dict[str, dict[Any, dict[str, Any]]] = {}
        self.notices: list[dict[str, Any]] = []
        self.reads = 0
        self.after = -1

    def apply(self, windows: list[Window]) -> None:
        reg = self.src.registry()
        for w in windows:
            for e in ev.iter_events(w.events):
                schema, _before, after, _ = decode_images(e, reg)
                if schema.name == NOTIFICATIONS:
                    assert after is not None
                    self.notices.append({**after, **json.loads(after["data"])})
                    continue
                if schema.name.startswith("databus."):
                    continue
                rows = self.tables.setdefault(schema.name, {})
                if e.op == ev.Op.DELETE:
                    rows.pop(e.key, None)
                elif e.op == ev.Op.TRUNCATE:
                    rows.clear()
                else:
                    rows[e.key] = after  # type: ignore[assignment]
                    if e.is_snapshot:
                        assert e.op == ev.Op.READ
                        self.reads += 1
            self.after = w.scn

    def kinds(self) -> list[str]:
        return [n["kind"] for n in self.notices]


def _drive(src: MysqlSource, replica: Replica, until: Callable[[], bool],
           timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    stop = threading.Event()
    while not until():
        assert time.monotonic() < deadline, f"timed out; notices {replica.kinds()}"
        replica.apply(src.read(replica.after, stop, 0.5))


def _rows(m: MariaDB, table: str, key: str = "id") -> dict[Any, dict[str, Any]]:
    with m.connect() as con, con.cursor() as cur:
        cur.execute(f"SELECT * FROM {table}")
        names = [d[0] for d in cur.description]
        out = {}
        for r in cur.fetchall():
            row = dict(zip(names, r, strict=True))
            out[row[key]] = row
        return out


def _signal(m: MariaDB, sid: str, kind: str, data: Any) -> None:
    with m.connect() as con, con.cursor() as cur:
        cur.execute(f"INSERT INTO {SIGNALS} VALUES (%s, %s, %s)",
                    (sid, kind, data if isinstance(data, str) or data is None
                     else json.dumps(data)))


def _fill(m: MariaDB, n: int) -> None:
    m.execute("CREATE DATABASE IF NOT EXISTS shop",
              "CREATE TABLE shop.t (id INT PRIMARY KEY, v INT, s VARCHAR(40))")
    with m.connect("shop") as con, con.cursor() as cur:
        for start in range(0, n, 5000):
            cur.executemany("INSERT INTO t VALUES (%s, %s, %s)",
                            [(i, i, f"row {i}") for i in range(start, min(n, start + 5000))])


def _project(rows: dict[Any, dict[str, Any]]) -> dict[Any, dict[str, Any]]:
    return {k: dict(v) for k, v in rows.items()}


def test_snapshot_while_writers_change_the_same_keys(server: MariaDB, tmp_path: Path) -> None:
    n = 20_000
    _fill(server, n)
    writer = KeyChurn.mysql(server, keys=n + n // 10, insert_ratio=0.6, pause=0, seed=5,
                            marker="updated")
    # initial mode on a new relay: the snapshot starts by itself, streaming goes on
    src = mysql_source(server.url, [r"shop\..*"], snapshot_mode="initial", snapshot_chunk_size=250,
                      state_dir=tmp_path)
    replica = Replica(src)
    try:
        writer.start()
        _drive(src, replica, lambda: "COMPLETED" in replica.kinds(), timeout=300)
        writer.stop.set()
        writer.join()
        end = _scn(server)
        _drive(src, replica, lambda: replica.after >= end)
    finally:
        writer.stop.set()
        src.close()
    assert replica.kinds()[0] == "STARTED" and replica.kinds()[-1] == "COMPLETED"
    # the table read chunk by chunk, no chunk over its size, as many chunks as the rows
    # read need (not n // 250: the writers delete rows meanwhile, so fewer than n are left
    # by then, the fewer the slower the machine)
    chunk_rows = [x["rows"] for x in replica.notices if x["kind"] == "CHUNK_DONE"]
    assert "TABLE_DONE" in replica.kinds() and max(chunk_rows) <= 250
    assert len(chunk_rows) >= -(-replica.reads // 250)
    assert writer.count > 300, "the writers were not running during the snapshot"
    assert replica.reads >= n // 2
    assert replica.tables["shop.t"] == _project(_rows(server, "shop.t"))
    print(f"\nsnapshot of {n} rows with {writer.count} concurrent writes; longest wait"
          f" of a writer statement {writer.longest * 1000:.1f} ms")
    assert writer.longest < 2.0  # no lock is held: a statement never waits on the snapshot


def test_restart_resumes_after_the_last_finished_chunk(server: MariaDB, tmp_path: Path) -> None:
    n = 6000
    _fill(server, n)
    server.execute("UPDATE shop.t SET v = -v WHERE id % 7 = 0")
    kw: dict[str, Any] = {"snapshot_mode": "initial", "snapshot_chunk_size": 500, "state_dir": tmp_path}
    src = mysql_source(server.url, [r"shop\..*"], **kw)
    replica = Replica(src)
    try:
        _drive(src, replica, lambda: replica.kinds().count("CHUNK_DONE") >= 4)
    finally:
        src.close()  # the relay dies here: it holds everything up to replica.after
    reads_before = replica.reads
    server.execute("DELETE FROM shop.t WHERE id < 100", "UPDATE shop.t SET s = 'late'"
                   " WHERE id >= 5900")
    with mysql_source(server.url, [r"shop\..*"], **kw) as again:
        replica.src = again
        _drive(again, replica, lambda: "COMPLETED" in replica.kinds())
        end = _scn(server)
        _drive(again, replica, lambda: replica.after >= end)
    assert replica.kinds().count("STARTED") == 1  # resumed, not started over
    assert replica.reads - reads_before <= n - 4 * 500 + 500
    assert replica.tables["shop.t"] == _project(_rows(server, "shop.t"))


def test_restart_far_behind_the_newest_chunk_window(server: MariaDB, tmp_path: Path) -> None:
    """A relay may have received many more chunk windows than it flushed: a restart
    at an old SCN still finds that SCN's progress (no fixed cap on the records)."""
    n = 3000
    _fill(server, n)
    kw: dict[str, Any] = {"snapshot_mode": "initial", "snapshot_chunk_size": 20, "state_dir": tmp_path}
    src = mysql_source(server.url, [r"shop\..*"], **kw)
    replica = Replica(src)
    try:
        _drive(src, replica, lambda: replica.kinds().count("CHUNK_DONE") >= 3)
        durable = Replica(src)  # what the relay had flushed when it died
        durable.tables = {t: dict(rows) for t, rows in replica.tables.items()}
        durable.notices, durable.reads = list(replica.notices), replica.reads
        durable.after = replica.after
        src.acknowledge(durable.after)  # the relay's last flush
        _drive(src, replica, lambda: replica.kinds().count("CHUNK_DONE") >= 100)
    finally:
        src.close()  # windows after durable.after were never flushed
    with mysql_source(server.url, [r"shop\..*"], **kw) as again:
        durable.src = again
        _drive(again, durable, lambda: "COMPLETED" in durable.kinds())
    assert durable.kinds().count("STARTED") == 1
    assert durable.reads <= n + 20  # resumed after the third chunk, not from the start
    assert durable.tables["shop.t"] == _project(_rows(server, "shop.t"))


def test_composite_surrogate_and_conditions(server: MariaDB, tmp_path: Path) -> None:
    server.execute(
        "CREATE DATABASE shop",
        "CREATE TABLE shop.c (a INT, b VARCHAR(10), v DECIMAL(10,2), PRIMARY KEY (a, b))",
        "CREATE TABLE shop.s (id CHAR(36) PRIMARY KEY, seq INT NOT NULL UNIQUE, v INT)")
    with server.connect("shop") as con, con.cursor() as cur:
        cur.executemany("INSERT INTO c VALUES (%s, %s, %s)",
                        [(a, b, f"{a}.{len(b)}") for a in range(30) for b in ("", "x", "Ü",
                                                                            "zz", "a b")])
        cur.executemany("INSERT INTO s VALUES (UUID(), %s, %s)",
                        [(i, i % 13) for i in range(400)])
    src = mysql_source(server.url, [r"shop\..*"], snapshot_mode="no_data", snapshot_chunk_size=16,
                      state_dir=tmp_path)
    server.execute(f"CREATE DATABASE IF NOT EXISTS {SIGNALS.split('.')[0]}",
                   f"CREATE TABLE IF NOT EXISTS {SIGNALS} (id VARCHAR(64) PRIMARY KEY,"
                   " type VARCHAR(32) NOT NULL, data TEXT)")
    replica = Replica(src)
    try:
        replica.apply(src.read(-1, threading.Event(), 0.3))  # streaming from here
        _signal(server, "one", "execute-snapshot", {"data-collections": [r"shop\.c"]})
        _drive(src, replica, lambda: replica.kinds().count("COMPLETED") == 1)
        _signal(server, "two", "execute-snapshot", {"data-collections": [r"shop\.s"],
                                                     "surrogate-key": "seq"})
        _drive(src, replica, lambda: replica.kinds().count("COMPLETED") == 2)
        got_c = dict(replica.tables["shop.c"])
        got_s = dict(replica.tables["shop.s"])
        replica.tables.clear()
        _signal(server, "three", "execute-snapshot", {
            "data-collections": [r"shop\.s"],
            "additional-conditions": [{"data-collection": "shop.s", "filter": "v = 3"}]})
        _drive(src, replica, lambda: replica.kinds().count("COMPLETED") == 3)
    finally:
        src.close()
    c_rows = _rows_all(server, "SELECT * FROM shop.c")
    assert len(c_rows) == 150
    # composite keys: the JSON array of the key values, as streamed rows have
    assert got_c == {json.dumps([r["a"], r["b"]], ensure_ascii=False,
                                separators=(",", ":")).encode(): r for r in c_rows}
    all_s = _rows_all(server, "SELECT * FROM shop.s")
    assert sorted(got_s.values(), key=lambda r: r["seq"]) == sorted(all_s, key=lambda r: r["seq"])
    assert sorted(replica.tables["shop.s"].values(), key=lambda r: r["seq"]) == sorted(
        (r for r in all_s if r["v"] == 3), key=lambda r: r["seq"])


def _rows_all(m: MariaDB, sql: str) -> list[dict[str, Any]]:
    with m.connect() as con, con.cursor() as cur:
        cur.execute(sql)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def test_bad_signals_pause_resume_stop(server: MariaDB, tmp_path: Path) -> None:
    _fill(server, 3000)
    src = mysql_source(server.url, [r"shop\..*"], snapshot_mode="no_data", snapshot_chunk_size=100,
                      state_dir=tmp_path)
    server.execute("CREATE DATABASE IF NOT EXISTS databus",
                   f"CREATE TABLE IF NOT EXISTS {SIGNALS} (id VARCHAR(64) PRIMARY KEY,"
                   " type VARCHAR(32) NOT NULL, data TEXT)")
    replica = Replica(src)
    try:
        replica.apply(src.read(-1, threading.Event(), 0.3))  # streaming from here
        _signal(server, "s1", "execute-snapshot", {"data-collections": [r"shop\.nope"]})
        _signal(server, "s2", "execute-snapshot", "{not json")
        _signal(server, "s3", "stop-snapshot", None)
        _signal(server, "s4", "frobnicate", "{}")
        _signal(server, "s5", "execute-snapshot", {
            "data-collections": [r"shop\.t"],
            "additional-conditions": [{"data-collection": "shop.t", "filter": "no_such_col = 1"}]})
        server.execute("INSERT INTO shop.t VALUES (-1, -1, 'after bad signals')")
        _drive(src, replica, lambda: -1 in replica.tables.get("shop.t", {}))
        errors = [n for n in replica.notices if n["kind"] == "ERROR"]
        assert [e["snapshot"] for e in errors] == ["s1", "s2", "s3", "s4", "s5"]
        # the database's words (they may quote names or values) stay in the relay's log
        assert "StatementError" in errors[-1]["message"]
        assert "no_such_col" not in errors[-1]["message"]
        assert replica.kinds()[-1] == "ABORTED"
        # pause, resume and stop a running snapshot
        _signal(server, "p0", "execute-snapshot", {"data-collections": [r"shop\.t"]})
        _drive(src, replica, lambda: replica.kinds().count("CHUNK_DONE") >= 2)
        _signal(server, "p1", "pause-snapshot", None)
        _drive(src, replica, lambda: "PAUSED" in replica.kinds())
        chunks = replica.kinds().count("CHUNK_DONE")
        server.execute("INSERT INTO shop.t VALUES (-2, -2, 'while paused')")
        _drive(src, replica, lambda: -2 in replica.tables["shop.t"])
        assert replica.kinds().count("CHUNK_DONE") <= chunks + 1  # at most the one in flight
        _signal(server, "p2", "resume-snapshot", None)
        _drive(src, replica, lambda: replica.kinds().count("CHUNK_DONE") >= chunks + 3)
        _signal(server, "p3", "stop-snapshot", None)
        _drive(src, replica, lambda: replica.kinds()[-1] == "ABORTED")
    finally:
        src.close()
    assert "RESUMED" in replica.kinds() and "COMPLETED" not in replica.kinds()


def test_relay_signal_endpoint_and_cli(server: MariaDB, tmp_path: Path) -> None:
    import subprocess
    import sys

    import httpx

    from databus.relay.config import parse_config
    from databus.relay.relay import Relay
    from tests.support.procs import free_port

    _fill(server, 500)
    port = free_port()
    relay = Relay(parse_config({
        "source": {"url": server.url, "tables": [r"shop\..*"], "snapshot_mode": "initial",
                   "snapshot_chunk_size": 100},
        "http": {"port": port}}))
    relay.start()
    base = f"http://127.0.0.1:{port}"

    def lines() -> list[dict[str, Any]]:
        r = httpx.get(f"{base}/stream", params={"output": "json", "size": "10000000",
                                                "timeout": "1"})
        return [json.loads(x) for x in r.text.splitlines()]

    def completed(got: list[dict[str, Any]]) -> int:
        return sum(1 for x in got if x.get("op") and x["after"].get("kind") == "COMPLETED")

    try:
        got = wait_until(lambda: completed(x := lines()) >= 1 and x, 60,
                         "the initial snapshot to complete")
        reads = [x for x in got if x.get("op") == "r"]
        assert len(reads) == 500 and all(x["source"]["snapshot"] for x in reads)
        cli = subprocess.run(
            [sys.executable, "-m", "databus", "signal", "execute-snapshot", "--relay", base,
             "--tables", r"shop\.t"], capture_output=True, text=True, timeout=60)
        assert cli.returncode == 0, cli.stderr
        sid = cli.stdout.strip()
        got = wait_until(lambda: completed(x := lines()) >= 2 and x, 60,
                         "the signalled snapshot to complete")
        assert any(x.get("op") and x["after"].get("kind") == "STARTED"
                   and x["after"]["snapshot"] == sid for x in got)
        prom = httpx.get(f"{base}/metrics").text
        assert "\ndatabus_relay_source_snapshot_completed_total 2.0" in prom
        assert "\ndatabus_relay_source_snapshot_rows_total " in prom
        assert "\ndatabus_relay_source_snapshot_running 0.0" in prom
        bad = httpx.post(f"{base}/signal", json={"type": "nope"})
        assert bad.status_code == 400 and bad.json()["error"] == "InvalidRequest"
        bad = httpx.post(f"{base}/signal", content=b"{not json",
                         headers={"Content-Type": "application/json"})
        assert bad.status_code == 400
        bad = httpx.post(f"{base}/signal", content=b'{"type": "nope"}')  # no content type
        assert bad.status_code == 415
        assert httpx.get(f"{base}/admin").status_code == 200
    finally:
        relay.stop()


def test_when_needed_always_and_initial_only(server: MariaDB, tmp_path: Path) -> None:
    _fill(server, 300)
    start = _scn(server)
    server.execute("UPDATE shop.t SET v = 0 WHERE id = 1")
    # a relay that read up to here, then its position was purged while it was down
    with mysql_source(server.url, [r"shop\..*"], snapshot_mode="no_data") as src:
        replica = Replica(src)
        replica.apply(src.read(start, threading.Event(), 2.0))
    held = replica.after
    assert held > start
    server.execute("FLUSH BINARY LOGS", "UPDATE shop.t SET v = 1 WHERE id = 2")
    with server.connect() as con, con.cursor() as cur:
        cur.execute("SHOW MASTER STATUS")
        cur.execute(f"PURGE BINARY LOGS TO '{cur.fetchone()[0]}'")
    kw: dict[str, Any] = {"snapshot_chunk_size": 100, "state_dir": tmp_path}
    with mysql_source(server.url, [r"shop\..*"], snapshot_mode="no_data", **kw) as lost, \
            pytest.raises(SourcePositionLostError):
        lost.read(held, threading.Event(), 2.0)
    needed = mysql_source(server.url, [r"shop\..*"], snapshot_mode="when_needed", **kw)
    replica.src = needed
    try:  # instead of failing: stream from the end and snapshot every table
        _drive(needed, replica, lambda: "COMPLETED" in replica.kinds())
    finally:
        needed.close()
    assert replica.tables["shop.t"] == _project(_rows(server, "shop.t"))

    # always: every start snapshots again, even a restart at a held position
    with mysql_source(server.url, [r"shop\..*"], snapshot_mode="always", **kw) as again:
        replica.src = again
        _drive(again, replica, lambda: replica.kinds().count("COMPLETED") == 2)
    assert replica.kinds().count("STARTED") == 2

    # initial_only: a new relay sends the existing rows, then nothing more
    with mysql_source(server.url, [r"shop\..*"], snapshot_mode="initial_only", **kw) as only:
        fresh = Replica(only)
        _drive(only, fresh, lambda: "COMPLETED" in fresh.kinds())
        server.execute("UPDATE shop.t SET v = 99 WHERE id = 3")
        after = fresh.after
        assert only.read(after, threading.Event(), 1.0) == []
    assert len(fresh.tables["shop.t"]) == 300 and fresh.tables["shop.t"][3]["v"] != 99
