"""Positions of the MySQL source: rotation, restart at an SCN, GTID start, no checksums."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from databus.core import event as ev
from databus.core.envelope import decode_images
from databus.core.window import Window
from databus.sources.mysql.checks import parse_mysql_url
from databus.sources.mysql.connection import master_status
from databus.sources.mysql.source import MysqlSource
from tests.support.mariadb import BINLOG_SETTINGS, MariaDB
from tests.support.sources import mysql_source


def _scn(m: MariaDB) -> int:
    file, pos = master_status(parse_mysql_url(m.url))
    return (int(file.rsplit(".", 1)[1]) << 32) | pos


def _read(src: MysqlSource, start: int, count: int) -> list[Window]:
    out: list[Window] = []
    after = start
    stop = threading.Event()
    for _ in range(50):
        if len(out) >= count:
            break
        for w in src.read(after, stop, 2.0):
            out.append(w)
            after = w.scn
    assert len(out) == count
    return out


def _ids(src: MysqlSource, windows: list[Window]) -> list[Any]:
    return [decode_images(e, src.registry())[2]["id"]
            for w in windows for e in ev.iter_events(w.events)]


def _setup(m: MariaDB) -> None:
    m.execute("CREATE DATABASE p", "CREATE TABLE p.t (id INT PRIMARY KEY, v TEXT)")


def test_rotation_and_restart_at_an_scn_in_a_later_file(server: MariaDB) -> None:
    _setup(server)
    start = _scn(server)
    server.execute("INSERT INTO p.t VALUES (1, 'a')", "FLUSH BINARY LOGS",
                   "INSERT INTO p.t VALUES (2, 'b')", "FLUSH BINARY LOGS",
                   "INSERT INTO p.t VALUES (3, 'c')", "INSERT INTO p.t VALUES (4, 'd')")
    with mysql_source(server.url, [r"p\.t"]) as src:
        windows = _read(src, start, 4)
    scns = [w.scn for w in windows]
    assert scns == sorted(set(scns))
    assert [s >> 32 for s in scns] == [start >> 32, (start >> 32) + 1, (start >> 32) + 2,
                                       (start >> 32) + 2]
    assert _ids(src, windows) == [1, 2, 3, 4]
    again = mysql_source(server.url, [r"p\.t"])
    try:  # restart after the window in the second file: exactly the rest, same bytes
        rest = _read(again, windows[1].scn, 2)
    finally:
        again.close()
    assert [w.events for w in rest] == [w.events for w in windows[2:]]


def test_a_new_relay_can_start_at_a_gtid(server: MariaDB) -> None:
    _setup(server)
    server.execute("INSERT INTO p.t VALUES (1, 'a')")
    gtid = server.gtid_pos()
    server.execute("INSERT INTO p.t VALUES (2, 'b')", "INSERT INTO p.t VALUES (3, 'c')")
    with mysql_source(server.url, [r"p\.t"], start_gtid=gtid) as src:
        windows = _read(src, -1, 2)
        assert _ids(src, windows) == [2, 3]
        meta = decode_images(next(ev.iter_events(windows[0].events)), src.registry())[3]
        domain, server_id, seq = gtid.split("-")
        assert meta["gtid"] == f"{domain}-{server_id}-{int(seq) + 1}"
        # the SCN is an ordinary file/position SCN: a restart at it resumes there
        assert windows[1].scn >> 32 == _scn(server) >> 32


def test_a_server_without_binlog_checksums(tmp_path: Path) -> None:
    m = MariaDB(tmp_path / "db", settings={**BINLOG_SETTINGS, "binlog-checksum": "NONE"})
    with m:
        _setup(m)
        start = _scn(m)
        m.execute("INSERT INTO p.t VALUES (1, 'a'), (2, 'b')", "UPDATE p.t SET v = 'c'")
        with mysql_source(m.url, [r"p\.t"]) as src:
            windows = _read(src, start, 2)
            assert src._stream is not None and not src._stream.checksum
        assert _ids(src, windows) == [1, 2, 1, 2]
