"""MariaDB with ``log_bin_compress=ON`` through a real relay (issue 13, item 4): every
change arrives, DDL included (compressed QUERY events), and an event type the source
does not know stops capture loudly instead of being skipped."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from databus.core.errors import ConfigError, UnsupportedEventError
from databus.core.event import iter_events
from databus.sources.mysql import events as be
from databus.sources.mysql.checks import ServerFacts, check_server
from databus.sources.mysql.events import HEADER
from databus.sources.mysql.source import MysqlSource
from tests.support.mariadb import BINLOG_SETTINGS, MariaDB
from tests.support.sources import mysql_source, source_config


@pytest.fixture
def compressing(tmp_path: Path) -> Iterator[MariaDB]:
    settings = {**BINLOG_SETTINGS, "log-bin-compress": "ON", "log-bin-compress-min-len": "10"}
    with MariaDB(tmp_path / "db", settings=settings) as m:
        yield m


def test_160_changes_with_compressed_events_all_arrive(compressing: MariaDB) -> None:
    m = compressing
    m.execute("CREATE DATABASE z", "CREATE TABLE z.first (id INT PRIMARY KEY)")  # a match
    with mysql_source(m.url, [r"z\..*"], snapshot_mode="no_data") as src:
        stop = threading.Event()
        after = -1
        src.read(after, stop, 1.0)  # positioned at the binlog's end
        m.execute("CREATE TABLE z.t (id INT PRIMARY KEY, v VARCHAR(200), n INT)")
        for i in range(40):
            m.execute(f"INSERT INTO z.t VALUES ({i}, REPEAT('v{i}', 20), {i})")
        m.execute("UPDATE z.t SET v = REPEAT('u', 50) WHERE id < 40",  # 40 rows, one event
                  "ALTER TABLE z.t ADD COLUMN extra VARCHAR(100) DEFAULT 'xxxxxxxxxxxxxxx'")
        for i in range(40, 80):
            m.execute(f"INSERT INTO z.t (id, v, n) VALUES ({i}, REPEAT('w', 30), {i})")
        m.execute("DELETE FROM z.t WHERE id >= 40")  # 40 deletes
        data, ddl = 0, 0
        for _ in range(200):
            windows = src.read(after, stop, 1.0)
            for w in windows:
                after = w.scn
                for e in iter_events(w.events):
                    if e.is_control:
                        continue
                    if src.registry().get(e.schema_id).name == "databus.schema_changes":
                        ddl += 1
                    else:
                        data += 1
            if data >= 160 and ddl >= 2:
                break
        assert data == 160  # 40 inserts, 40 updates, 40 inserts, 40 deletes
        assert ddl == 2  # CREATE TABLE and ALTER TABLE, both compressed QUERY events


def test_an_unknown_event_type_stops_capture_at_its_position() -> None:
    src = MysqlSource(source_config("mysql://root@db.example", [r"z\..*"]))  # not opened
    src._file = "binlog.000007"
    body = b"\x00" * 12
    raw = HEADER.pack(0, 40, 1, HEADER.size + len(body), 4242, 0) + body
    with pytest.raises(UnsupportedEventError,
                       match=r"type 40 \(TRANSACTION_PAYLOAD.*binlog\.000007:4242"):
        src._event(*be.parse_header(raw, False))
    ignorable = HEADER.pack(0, 99, 1, HEADER.size + len(body), 4300, 0x80) + body
    assert src._event(*be.parse_header(ignorable, False)) is None  # flagged ignorable by the server: passed over
    heartbeat = HEADER.pack(0, 27, 1, HEADER.size + len(body), 4300, 0) + body
    assert src._event(*be.parse_header(heartbeat, False)) is None


def test_the_start_up_check_refuses_mysql_settings_it_cannot_decode() -> None:
    grants = ["GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO `u`@`%`"]
    ok = {"log_bin": "ON", "binlog_format": "ROW", "binlog_row_image": "FULL",
          "binlog_row_metadata": "FULL", "server_id": "1"}
    check_server(ServerFacts("8.0.36", ok, grants))
    bad = {**ok, "binlog_transaction_compression": "ON",
           "binlog_row_value_options": "PARTIAL_JSON"}
    with pytest.raises(ConfigError) as info:
        check_server(ServerFacts("8.0.36", bad, grants))
    assert "binlog_transaction_compression is ON" in str(info.value)
    assert "binlog_row_value_options is PARTIAL_JSON" in str(info.value)


