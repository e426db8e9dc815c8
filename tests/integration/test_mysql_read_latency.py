"""Windows leave the MySQL source when they are whole (issue 30, item 5).

A read hands over the windows it holds as soon as the binlog stream has nothing more
to give at once, whatever events (another table's transactions, heartbeats) come after
the last one; windows already received still leave together, up to the batch cap.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from databus.sources.mysql.source import MysqlSource
from tests.support.mariadb import MariaDB
from tests.support.sources import mysql_source

READ_TIMEOUT = 3.0  # long, so a read that waits for its deadline cannot pass for prompt
PROMPT = 0.5  # a read hands its window over well within this after the commit


@pytest.fixture
def server(tmp_path: Path) -> Iterator[MariaDB]:
    with MariaDB(tmp_path / "db") as m:
        m.execute("CREATE DATABASE cap", "CREATE TABLE cap.t (id INT PRIMARY KEY, v INT)",
                  "CREATE DATABASE busy", "CREATE TABLE busy.log (id INT AUTO_INCREMENT"
                  " PRIMARY KEY, v VARCHAR(100))")
        yield m


@pytest.fixture
def source(server: MariaDB) -> Iterator[MysqlSource]:
    src = mysql_source(server.url, [r"cap\..*"], snapshot_mode="no_data", progress_interval=0)
    try:
        yield src
    finally:
        src.close()


def _busy_writer(m: MariaDB, stop: threading.Event, count: list[int]) -> None:
    """One-row autocommit transactions on the uncaptured table, ~500-1,000 a second."""
    con = m.connect()
    try:
        with con.cursor() as cur:
            while not stop.is_set():
                cur.execute("INSERT INTO busy.log (v) VALUES ('noise')")
                count[0] += 1
                time.sleep(0.0005)
    finally:
        con.close()


def _position(src: MysqlSource) -> int:
    """The source dumping from the binlog's end; the SCN to read after."""
    assert src.read(-1, threading.Event(), 0.2) == []
    return src._stream_scn


def test_a_window_leaves_at_once_while_an_uncaptured_table_is_busy(
        server: MariaDB, source: MysqlSource) -> None:
    after = _position(source)
    stop, written = threading.Event(), [0]
    writer = threading.Thread(target=_busy_writer, args=(server, stop, written))
    writer.start()
    waits = []
    try:
        time.sleep(0.3)  # the busy table is flowing
        for i in range(8):
            server.execute(f"INSERT INTO cap.t VALUES ({i}, {i})")  # returns once committed
            t0 = time.monotonic()
            got = source.read(after, threading.Event(), READ_TIMEOUT)
            waits.append(time.monotonic() - t0)
            assert [w.count for w in got] == [1]
            after = got[-1].scn
            time.sleep(0.05)
    finally:
        stop.set()
        writer.join()
    assert written[0] > 100, "the other table was busy during the reads"
    # the old loop read on through the other table's events until its deadline (3 s)
    assert max(waits) < PROMPT, f"reads waited {[round(w, 3) for w in waits]} s"


def test_a_window_leaves_at_once_when_only_a_heartbeat_follows(
        server: MariaDB, source: MysqlSource) -> None:
    after = _position(source)
    server.execute("INSERT INTO cap.t VALUES (1, 1)",
                   "CREATE TABLE busy.other (id INT PRIMARY KEY)")  # DDL of another schema
    time.sleep(0.2)  # both are received before the read starts
    t0 = time.monotonic()
    got = source.read(after, threading.Event(), READ_TIMEOUT)
    assert [w.count for w in got] == [1]
    assert time.monotonic() - t0 < PROMPT


def test_windows_already_received_leave_together(server: MariaDB, source: MysqlSource) -> None:
    after = _position(source)
    con = server.connect()
    try:
        with con.cursor() as cur:
            for i in range(100):  # autocommit: captured and uncaptured transactions
                cur.execute(f"INSERT INTO cap.t VALUES ({i}, {i})")
                cur.execute("INSERT INTO busy.log (v) VALUES ('noise')")
    finally:
        con.close()
    time.sleep(0.5)  # all of it is in the socket's buffer
    reads: list[int] = []
    t0 = time.monotonic()
    while sum(reads) < 100:
        got = source.read(after, threading.Event(), READ_TIMEOUT)
        reads.append(len(got))
        after = got[-1].scn
    assert time.monotonic() - t0 < PROMPT
    assert reads == [64, 36]  # batched up to the cap, not one window per read
