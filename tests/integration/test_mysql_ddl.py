"""DDL in the binlog: schema change events, table versions, truncate, history."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from databus.core import event as ev
from databus.core.envelope import decode_images
from databus.core.window import Window
from databus.sources.mysql.checks import parse_mysql_url
from databus.sources.mysql.connection import master_status
from databus.sources.mysql.ddl import parse_ddl
from databus.sources.mysql.source import SCHEMA_CHANGES, MysqlSource
from tests.support.mariadb import MariaDB
from tests.support.sources import mysql_source


def _scn(m: MariaDB) -> int:
    file, pos = master_status(parse_mysql_url(m.url))
    return (int(file.rsplit(".", 1)[1]) << 32) | pos


def _read(src: MysqlSource, start: int, end: int) -> list[Window]:
    out: list[Window] = []
    after = start
    while after < end:
        got = src.read(after, threading.Event(), 5.0)
        assert got, "no progress"
        out.extend(got)
        after = got[-1].scn
    return out


def _decoded(src: MysqlSource, windows: list[Window]) -> list[tuple[str, str, int, Any]]:
    """(source name, op letter, schema version, image) of every data event."""
    reg = src.registry()
    out = []
    for w in windows:
        for e in ev.iter_events(w.events):
            schema, before, after, _ = decode_images(e, reg)
            out.append((schema.name, e.op.letter, schema.version, after or before))
    return out


def test_ddl_gives_schema_changes_versions_and_truncate(server: MariaDB, tmp_path: Path) -> None:
    server.execute("CREATE DATABASE ddl", "CREATE DATABASE other",
                   "CREATE TABLE ddl.t (id INT PRIMARY KEY, a VARCHAR(10))",
                   "CREATE TABLE ddl.kept (id INT PRIMARY KEY)")  # a table to match at open
    start = _scn(server)
    server.execute(
        "INSERT INTO ddl.t VALUES (1, 'one')",
        "ALTER TABLE ddl.t ADD COLUMN b INT DEFAULT 7",
        "INSERT INTO ddl.t VALUES (2, 'two', 2)",
        "UPDATE ddl.t SET a = 'uno' WHERE id = 1",
        "ALTER TABLE ddl.t DROP COLUMN a",
        "INSERT INTO ddl.t VALUES (3, 3)",
        "CREATE TABLE other.ignored (id INT PRIMARY KEY)",  # not captured: no event
        "TRUNCATE TABLE ddl.t",
        "INSERT INTO ddl.t VALUES (4, 4)",
        "RENAME TABLE ddl.t TO ddl.t2",
        "INSERT INTO ddl.t2 VALUES (5, 5)",
        "DROP TABLE ddl.t2")
    end = _scn(server)
    with mysql_source(server.url, [r"ddl\..*"], state_dir=tmp_path, name="r1") as src:
        windows = _read(src, start, end)
    got = _decoded(src, windows)
    changes = [(img["kind"], img["table"], img["new_table"]) for name, _op, _v, img in got
               if name == SCHEMA_CHANGES]
    assert changes == [("ALTER", "t", None), ("ALTER", "t", None), ("TRUNCATE", "t", None),
                       ("RENAME", "t", "t2"), ("DROP", "t2", None)]
    rows = [(name, op, v, img) for name, op, v, img in got if name != SCHEMA_CHANGES]
    assert rows == [
        ("ddl.t", "c", 1, {"id": 1, "a": "one"}),
        ("ddl.t", "c", 2, {"id": 2, "a": "two", "b": 2}),
        ("ddl.t", "u", 2, {"id": 1, "a": "uno", "b": 7}),
        ("ddl.t", "c", 3, {"id": 3, "b": 3}),
        ("ddl.t", "t", 3, None),
        ("ddl.t", "c", 3, {"id": 4, "b": 4}),
        ("ddl.t2", "c", 1, {"id": 5, "b": 5}),
    ]
    # every DDL is a window of its own (TRUNCATE: its schema change + the truncate)
    ddl_src = _src(src, SCHEMA_CHANGES)
    shapes = [[(e.src_id == ddl_src, e.op.letter) for e in ev.iter_events(w.events)]
              for w in windows]
    assert [s for s in shapes if s[0][0]] == [[(True, "c")], [(True, "c")],
                                              [(True, "c"), (False, "t")], [(True, "c")],
                                              [(True, "c")]]

    # a restarted source knows the same versions (same ids and numbers) before
    # reading anything, and reading again gives the very same events
    with mysql_source(server.url, [r"ddl\..*"], state_dir=tmp_path, name="r1") as again:
        versions = again.registry().versions(_src(src, "ddl.t"))
        assert [(s.version, s.id) for s in versions] == [
            (s.version, s.id) for s in src.registry().versions(_src(src, "ddl.t"))]
        assert [v.version for v in versions] == [1, 2, 3]
        middle = windows[2].scn  # restart in the middle of the history
        assert [w.events for w in _read(again, middle, end)] == [w.events for w in windows[3:]]


def _src(src: MysqlSource, name: str) -> int:
    return next(s.id for s in src.sources() if s.name == name)


@pytest.mark.parametrize(("sql", "want"), [
    ("ALTER TABLE `s`.`t` ADD c INT", [("ALTER", "s", "t", None)]),
    ("alter online ignore table t add c int", [("ALTER", "db", "t", None)]),
    ("CREATE TABLE IF NOT EXISTS `we``ird` (a int)", [("CREATE", "db", "we`ird", None)]),
    ("CREATE OR REPLACE TABLE x.y AS SELECT 1", [("CREATE", "x", "y", None)]),
    ("DROP TABLE IF EXISTS a, `b`.c /* generated by server */",
     [("DROP", "db", "a", None), ("DROP", "b", "c", None)]),
    ("RENAME TABLE a TO b, x.c TO x.d", [("RENAME", "db", "a", "b"), ("RENAME", "x", "c", "d")]),
    ("ALTER TABLE a RENAME TO b", [("RENAME", "db", "a", "b")]),
    ("TRUNCATE t", [("TRUNCATE", "db", "t", None)]),
    ("/* c */ CREATE UNIQUE INDEX i ON s.t (a)", [("ALTER", "s", "t", None)]),
    ("GRANT ALL ON *.* TO x", []),
    ("CREATE USER u", []),
    ("FLUSH PRIVILEGES", []),
])
def test_parse_ddl(sql: str, want: list[tuple[str, str, str, str | None]]) -> None:
    got = [(c.kind, c.db, c.table, c.new_table) for c in parse_ddl("db", sql)]
    assert got == want


def test_a_type_change_that_only_avro_logical_attributes_see_is_a_new_version(
        server: MariaDB, tmp_path: Path) -> None:
    """DECIMAL(10,2) -> DECIMAL(12,4) has the same Avro Parsing Canonical Form
    (bytes); the version (and its id) must still change, or rows after the ALTER
    would be decoded with the old scale."""
    import decimal

    server.execute("CREATE DATABASE ddl", "CREATE TABLE ddl.d (id INT PRIMARY KEY,"
                   " v DECIMAL(10,2))")
    start = _scn(server)
    server.execute("INSERT INTO ddl.d VALUES (1, 1.25)",
                   "ALTER TABLE ddl.d MODIFY v DECIMAL(12,4)",
                   "INSERT INTO ddl.d VALUES (2, 100.1234)")
    end = _scn(server)
    with mysql_source(server.url, [r"ddl\..*"], state_dir=tmp_path, name="r1") as src:
        rows = [(v, img) for name, _op, v, img in _decoded(src, _read(src, start, end))
                if name == "ddl.d"]
        versions = src.registry().versions(_src(src, "ddl.d"))
    assert rows == [(1, {"id": 1, "v": decimal.Decimal("1.25")}),
                    (2, {"id": 2, "v": decimal.Decimal("100.1234")})]
    assert len({s.id for s in versions}) == 2
