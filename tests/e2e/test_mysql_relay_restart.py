"""A ``databus relay`` process on MariaDB restarted on its persistent buffer.

* The binlog it needs is purged while it is down: tests/integration/
  test_mysql_source.py checks this with an in-process relay through
  ``/admin``; here the relay is killed with SIGKILL, and the error must also
  be in its log, while it keeps serving what it holds.
* What it held before the restart stays readable (schemas included), also
  for a consumer that is behind across a DDL.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx

from tests.support.mariadb import MariaDB
from tests.support.mysql_workload import SCHEMA, Workload, connect_writer
from tests.support.procs import DATABUS, free_port, kill9, spawn, stop, wait_http
from tests.support.relays import wait_persisted
from tests.support.verify import check_delivery, read_windows
from tests.support.wait import wait_until


def _binlogs(m: MariaDB) -> list[str]:
    with m.connect() as con, con.cursor() as cur:
        cur.execute("SHOW BINARY LOGS")
        return [r[0] for r in cur.fetchall()]


def _master_scn(m: MariaDB) -> int:
    """The SCN of the server's newest commit (its binlog end: no DDL comes last)."""
    with m.connect() as con, con.cursor() as cur:
        cur.execute("SHOW MASTER STATUS")
        file, pos = cur.fetchone()[:2]  # type: ignore[index]
        return (int(file.rsplit(".", 1)[1]) << 32) | int(pos)


def _until(predicate: object, timeout: float, what: str) -> None:
    wait_until(predicate, timeout, what, interval=0.2)  # type: ignore[arg-type]


def _relay(server: MariaDB, tmp: Path) -> tuple[str, list[str]]:
    """The URL and command line of a stream-only relay on a persistent buffer."""
    port = free_port()
    return f"http://127.0.0.1:{port}", [
        *DATABUS, "relay", "--source", server.url, "--tables", r"shop\..*",
        "--snapshot-mode", "no_data", "--buffer-path", str(tmp / "relay.buf"),
        "--port", str(port)]


def _held(url: str) -> int:
    return int(httpx.get(f"{url}/containerStats/buffer/max_scn", timeout=10).json())


def test_purged_while_relay_down_is_a_clear_terminal_error(tmp_path: Path) -> None:
    server = MariaDB(tmp_path / "db")
    server.start()
    url, args = _relay(server, tmp_path)
    log = tmp_path / "relay.log"
    relay = None
    try:
        server.execute(*SCHEMA)
        relay = spawn(args, log)
        wait_http(f"{url}/admin", relay)
        con = connect_writer(server.port)
        w = Workload(con, seed=5, rollback_ratio=0.0)

        _until(lambda: server.binlog_dumps() > 0, 30, "the relay's binlog dump")
        for _ in range(21):
            w.transaction()
        _until(lambda: _held(url) >> 32 == int(_binlogs(server)[-1].rsplit(".", 1)[1])
               and _held(url) & 0xFFFFFFFF > 0, 30, "the relay to hold the last transaction")
        top = _held(url)
        wait_persisted(tmp_path, top)  # the buffer file holds it
        kill9(relay)

        # while the relay is down: more commits, then every binlog it needs is purged
        for _ in range(20):
            w.transaction()
        con.close()
        server.execute("FLUSH BINARY LOGS", "FLUSH BINARY LOGS")
        needed = f"{_binlogs(server)[0].rsplit('.', 1)[0]}.{top >> 32:06d}"

        def purged() -> bool:  # a file goes once the server's binlog checkpoint passed it
            server.execute(f"PURGE BINARY LOGS TO '{_binlogs(server)[-1]}'")
            return needed not in _binlogs(server)

        _until(purged, 30, f"{needed} to be purged")

        relay = spawn(args, log)
        wait_http(f"{url}/admin", relay)
        _until(lambda: httpx.get(f"{url}/admin", timeout=10).status_code == 503, 30,
               "the relay to report the lost position")
        health = httpx.get(f"{url}/admin", timeout=10).json()
        assert health["status"] == "degraded"
        assert health["fetcher"]["state"] == "failed"
        assert health["fetcher"]["last_error"].startswith("SourcePositionLost: ")
        assert "binlog position is gone" in health["fetcher"]["last_error"]
        text = " ".join(log.read_text().split())  # the console log wraps long lines
        assert "capture stopped: binlog position is gone" in text, text[-2000:]
        # the relay keeps what it held before the gap, and stays up
        assert _held(url) == top
        got = httpx.get(f"{url}/stream", params={"timeout": 0}, timeout=10)
        assert got.status_code == 200 and got.content
        assert relay.poll() is None
    finally:
        if relay is not None:
            stop(relay)
        server.stop()


def test_restarted_relay_serves_the_schemas_of_what_it_holds(tmp_path: Path) -> None:
    """Restarted with nothing new committed, the relay still decodes (JSON
    output) the windows its buffer holds: their schemas survived the restart."""
    server = MariaDB(tmp_path / "db")
    server.start()
    url, args = _relay(server, tmp_path)
    log = tmp_path / "relay.log"
    relay = None
    try:
        server.execute(*SCHEMA)
        relay = spawn(args, log)
        wait_http(f"{url}/admin", relay)
        con = connect_writer(server.port)
        w = Workload(con, seed=6, rollback_ratio=0.0)

        _until(lambda: server.binlog_dumps() > 0, 30, "the relay's binlog dump")
        w.transaction()
        _until(lambda: _held(url) > 0, 30, "the relay to capture a transaction")
        wait_persisted(tmp_path, _held(url))  # the buffer file holds it
        con.close()
        stop(relay)  # a clean stop; kill -9 gives the same

        relay = spawn(args, log)  # nothing new is committed from here on
        wait_http(f"{url}/admin", relay)
        got = httpx.get(f"{url}/stream", params={"timeout": 0, "output": "json"}, timeout=10)
        assert got.status_code == 200, got.text
        lines = [json.loads(x) for x in got.text.splitlines()]
        assert any(x.get("op") == "c" for x in lines)
    finally:
        if relay is not None:
            stop(relay)
        server.stop()


def test_consumer_behind_across_ddl_and_relay_restart(tmp_path: Path) -> None:
    """Rows before and after ALTER TABLE accounts ADD COLUMN, the relay killed,
    restarted: a new consumer from the oldest window held gets every committed
    transaction (old table version included) and the DDL notice, in order."""
    server = MariaDB(tmp_path / "db")
    server.start()
    url, args = _relay(server, tmp_path)
    procs = []
    try:
        server.execute(*SCHEMA)
        relay = spawn(args, tmp_path / "relay.log")
        procs.append(relay)
        wait_http(f"{url}/admin", relay)
        con = connect_writer(server.port)
        w = Workload(con, seed=8, rollback_ratio=0.0)

        _until(lambda: server.binlog_dumps() > 0, 30, "the relay's binlog dump")
        w.transaction()
        _until(lambda: _held(url) > 0, 30, "the relay to capture a transaction")
        for _ in range(30):
            w.transaction()
        w.maybe_ddl(0.3)  # ALTER TABLE shop.accounts ADD COLUMN tier
        for _ in range(30):
            w.transaction()
        _until(lambda: _held(url) == _master_scn(server), 30, "the relay to hold every commit")
        wait_persisted(tmp_path, _held(url))  # the buffer file holds everything
        kill9(relay)
        relay = spawn(args, tmp_path / "relay.log")
        procs.append(relay)
        wait_http(f"{url}/admin", relay)
        w.touch_all()  # every table's current shape is seen by the new process
        con.close()
        record = tmp_path / "recorded.jsonl"
        recorder = spawn([sys.executable, "-m", "tests.support.recorder", "--relay", url,
                          "--out", str(record), "--checkpoint", str(tmp_path / "rec.ckpt")],
                         tmp_path / "recorder.log")
        procs.append(recorder)
        _until(lambda: recorder.poll() is not None or (
            bool(read_windows(record)) and read_windows(record)[-1][0] == _held(url)), 60,
            "the recorder to catch up or stop")
        assert recorder.poll() is None, (tmp_path / "recorder.log").read_text()[-600:]
        check_delivery(read_windows(record), w.committed, w.rolled_back)
    finally:
        for p in procs:
            stop(p)
        server.stop()
