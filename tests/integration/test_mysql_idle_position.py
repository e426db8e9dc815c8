"""An idle captured table on a busy (or idle) server never loses its position to a purge
(issue 13, item 5): transactions of other schemas, heartbeats and rotations move the
position with empty progress windows, so a restart after ``PURGE BINARY LOGS`` resumes
without error and loses nothing."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from databus.core.event import iter_events
from databus.core.window import Window
from databus.sources.mysql.connection import binary_logs
from databus.sources.mysql.source import MysqlSource
from tests.support.mariadb import MariaDB
from tests.support.sources import mysql_source


@pytest.fixture
def server(tmp_path: Path) -> Iterator[MariaDB]:
    with MariaDB(tmp_path / "db") as m:
        m.execute("CREATE DATABASE quiet", "CREATE TABLE quiet.t (id INT PRIMARY KEY, v INT)",
                  "CREATE DATABASE busy", "CREATE TABLE busy.log (id INT AUTO_INCREMENT"
                  " PRIMARY KEY, v VARCHAR(100))")
        yield m


def _read_for(src: MysqlSource, after: int, seconds: float) -> tuple[list[Window], int]:
    stop, out = threading.Event(), []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for w in src.read(after, stop, 0.3):
            out.append(w)
            after = w.scn
    return out, after


def test_quiet_tables_busy_server_purge_and_restart_lose_nothing(server: MariaDB) -> None:
    src = mysql_source(server.url, [r"quiet\..*"], snapshot_mode="no_data",
                       progress_interval=0.5, heartbeat=0.2)
    try:
        _, after = _read_for(src, -1, 0.5)  # positioned at the end
        server.execute("INSERT INTO quiet.t VALUES (1, 1)")
        first, after = _read_for(src, after, 1.0)
        assert sum(w.count for w in first) == 1
        captured_at = after
        # the captured table is quiet; other schemas are busy, the logs rotate
        for round_ in range(3):
            for i in range(10):
                server.execute(f"INSERT INTO busy.log (v) VALUES ('r{round_}-{i}')")
            server.execute("FLUSH BINARY LOGS")
            windows, after = _read_for(src, after, 1.2)
            assert all(w.count == 0 for w in windows), "only progress windows"
        assert after > captured_at, "the position followed the binlog"
        newest = binary_logs(src.url)[-1][0]
        assert after >> 32 == int(newest.rsplit(".", 1)[1]), "into the newest file"
        # an idle server: heartbeats alone keep the position where the binlog ends
        idle, after = _read_for(src, after, 1.0)
        assert all(w.count == 0 for w in idle)
    finally:
        src.close()
    server.execute(f"PURGE BINARY LOGS TO '{newest}'")
    assert binary_logs(src.url)[0][0] == newest, "the files the relay started in are gone"
    server.execute("INSERT INTO quiet.t VALUES (2, 2)", "UPDATE quiet.t SET v = 5 WHERE id = 1")
    again = mysql_source(server.url, [r"quiet\..*"], snapshot_mode="no_data")
    try:  # a restart at the recorded position: no SourcePositionLost, nothing lost
        windows, _ = _read_for(again, after, 1.5)
        ops = [e.op.letter for w in windows for e in iter_events(w.events) if not e.is_control]
        assert ops == ["c", "u"]
    finally:
        again.close()


def test_a_consumer_checkpoint_follows_the_idle_position(server: MariaDB) -> None:
    """Through a real relay: a consumer of the quiet table sees its checkpoint move while
    only other schemas change (empty windows), so it never falls behind a purge."""
    import json

    import httpx

    from databus.relay.config import parse_config
    from databus.relay.relay import Relay
    from tests.support.procs import free_port
    from tests.support.wait import wait_until

    port = free_port()
    relay = Relay(parse_config({
        "source": {"url": server.url, "tables": [r"quiet\..*"], "snapshot_mode": "no_data",
                   "progress_interval": 0.3},
        "http": {"port": port}, "buffer": {"flush_interval": 0.2}}))
    relay.start()
    base = f"http://127.0.0.1:{port}"
    scn = -1

    def poll() -> int:
        nonlocal scn
        cp = json.dumps({"windowScn": scn, "windowOffset": -1})
        r = httpx.get(f"{base}/stream", params={"checkPoint": cp, "timeout": "0.5",
                                                "output": "json"}, timeout=10)
        assert r.status_code == 200, r.text
        assert not [x for x in r.text.splitlines() if '"op"' in x], "no data of quiet tables"
        scn = int(r.headers.get("X-Databus-Last-Window-Scn", scn))
        return scn

    try:
        start = wait_until(lambda: poll() > 0 and scn, 30, "a first progress window")
        for i in range(10):
            server.execute(f"INSERT INTO busy.log (v) VALUES ('b{i}')")
        server.execute("FLUSH BINARY LOGS")
        server.execute("INSERT INTO busy.log (v) VALUES ('after rotation')")
        moved = wait_until(lambda: poll() >> 32 > start >> 32 and scn, 30,
                           "the consumer's checkpoint to follow the binlog into the new file")
        assert moved > start
    finally:
        relay.stop()
