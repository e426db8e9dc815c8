"""A source's schema change through ``databus binlog-server``, judged by binlog readers
nobody here wrote (issue 19: "DDL as Query events when the relay carries schema changes").

A real SQLite source (``ALTER TABLE ... ADD COLUMN`` by the application, the relay's
source noticing it and capturing a new table version) -> relay -> binlog service
(processes). python-mysql-replication and ``mariadb-binlog --read-from-remote-server``
must see the ``ALTER TABLE`` as a Query event at its place in the stream, every rows
event before it with the old columns and every one after it with the new ones, and
rebuild the table equal to SQLite's.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import QueryEvent
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from tests.support.binlog import parse_verbose
from tests.support.binlog_server import BinlogService, sqlite_rows
from tests.support.wait import wait_until

# python-mysql-replication 1.0 opens its control connection with pymysql's old ``db=``
pytestmark = pytest.mark.filterwarnings("ignore:'db' is deprecated:DeprecationWarning")

V1 = ["id", "name"]
V2 = ["id", "name", "price"]
V3 = ["id", "name", "price", "data"]


def _exec(db: Path, *statements: tuple[str, tuple[Any, ...]]) -> None:
    """The statements in one SQLite transaction, as an application commits them."""
    con = sqlite3.connect(db, isolation_level=None)
    try:
        con.execute("BEGIN")
        for sql, params in statements:
            con.execute(sql, params)
        con.execute("COMMIT")
    finally:
        con.close()


def _versions(svc: BinlogService) -> int:
    """How many versions of ``main.t`` the relay serves (``/register``)."""
    sources = httpx.get(f"{svc.relay_url}/sources").json()
    sid = next(s["id"] for s in sources if s["name"] == "main.t")
    return len(httpx.get(f"{svc.relay_url}/register", params={"sources": sid}).json())


Stream = list[tuple[str, Any]]  # ("query", sql) | (op, (columns, rows)) in binlog order


def _read(svc: BinlogService) -> Stream:
    """The whole binlog from its first file, non-blocking: DDL and rows of ``main.t``."""
    reader = BinLogStreamReader(connection_settings=svc.settings(), server_id=7301,
                                blocking=False, resume_stream=True, log_pos=4,
                                log_file=svc.query("SHOW BINARY LOGS")[0][0],
                                only_events=[QueryEvent, WriteRowsEvent, UpdateRowsEvent,
                                             DeleteRowsEvent])
    out: Stream = []
    try:
        for e in reader:
            if isinstance(e, QueryEvent):
                sql = e.query if isinstance(e.query, str) else e.query.decode()
                if sql != "BEGIN":
                    out.append(("query", sql))
            elif e.table == "t":
                op = {WriteRowsEvent: "insert", UpdateRowsEvent: "update",
                      DeleteRowsEvent: "delete"}[type(e)]
                out.append((op, (list(e.columns and [c.name for c in e.columns]), e.rows)))
    finally:
        reader.close()
    return out


def _apply(stream: Stream) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The rows a replica ends with: a row written before a column existed has NULL there,
    as a MySQL table after ``ADD COLUMN`` without a default."""
    table: dict[tuple[Any, ...], dict[str, Any]] = {}
    for op, what in stream:
        if op == "query":
            continue
        _, rows = what
        for row in rows:
            if op == "insert":
                table[(row["values"]["id"],)] = dict(row["values"])
            elif op == "update":
                table.pop((row["before_values"]["id"],))
                table[(row["after_values"]["id"],)] = dict(row["after_values"])
            else:
                del table[(row["values"]["id"],)]
    return {k: {c: row.get(c) for c in V3} for k, row in table.items()}


def _source_rows(db: Path) -> dict[tuple[Any, ...], dict[str, Any]]:
    return {k: {c: row.get(c) for c in V3} for k, row in sqlite_rows(db, "t", ["id"]).items()}


def test_alter_table_add_column_is_a_query_event_between_rows_of_the_old_and_new_columns(
        tmp_path: Path) -> None:
    db = tmp_path / "src.db"
    _exec(db, ("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT)", ()))
    with BinlogService(db, tmp_path, ["t"]) as svc:
        _exec(db, ("INSERT INTO t VALUES (1, 'one')", ()), ("INSERT INTO t VALUES (2, 'two')", ()))
        _exec(db, ("UPDATE t SET name = 'uno' WHERE id = 1", ()))
        wait_until(lambda: _apply(_read(svc)) == _source_rows(db), 60,
                   "the rows before the change in the binlog")
        # the application's ALTER TABLE, then at once a write (logged by the old triggers
        # until the source notices the change) and, once the relay has the new version,
        # writes with the new column
        _exec(db, ("ALTER TABLE t ADD COLUMN price REAL", ()))
        _exec(db, ("INSERT INTO t VALUES (3, 'three', 3.5)", ()))
        wait_until(lambda: _versions(svc) == 2, 30, "the relay to capture version 2 of t")
        _exec(db, ("UPDATE t SET price = 2.25, name = 'dos' WHERE id = 2", ()),
              ("INSERT INTO t VALUES (4, 'four', NULL)", ()))
        _exec(db, ("DELETE FROM t WHERE id = 1", ()))

        def equal() -> bool:
            return _apply(_read(svc)) == _source_rows(db)

        wait_until(equal, 60, "the binlog rebuilt by python-mysql-replication to equal SQLite")
        # a second change while the binlog service is down: after its restart the
        # converter turns the version it announced last into the relay's newest
        svc.server.terminate()
        svc.server.wait(30)
        _exec(db, ("ALTER TABLE t ADD COLUMN data BLOB", ()))
        wait_until(lambda: _versions(svc) == 3, 30, "the relay to capture version 3 of t")
        _exec(db, ("INSERT INTO t VALUES (5, 'fünf', -0.5, x'00ff10')", ()),
              ("UPDATE t SET data = x'0102' WHERE id = 3", ()))
        svc.start_server()
        wait_until(equal, 60, "the binlog rebuilt by python-mysql-replication to equal SQLite")
        stream = _read(svc)
        queries = [(i, sql) for i, (op, sql) in enumerate(stream) if op == "query"]
        assert [sql for _, sql in queries] == [
            "CREATE TABLE IF NOT EXISTS `main`.`t` (`id` BIGINT, `name` LONGTEXT CHARACTER SET"
            " utf8mb4, PRIMARY KEY (`id`))",
            "ALTER TABLE `main`.`t` ADD COLUMN `price` DOUBLE AFTER `name`",
            "ALTER TABLE `main`.`t` ADD COLUMN `data` LONGBLOB AFTER `price`",
        ], queries
        (create, _), (alter1, _), (alter2, _) = queries
        # every rows event has the columns of the table as the DDL before it left it
        for i, (op, what) in enumerate(stream):
            if op != "query":
                cols_then = V1 if i < alter1 else V2 if i < alter2 else V3
                assert what[0] == cols_then, (i, op, what)
                assert all(list(r.get("values", r.get("after_values", {}))) == cols_then
                           for r in what[1]), (i, op, what)
        assert create == 0 and alter1 > 1 and alter2 < len(stream) - 1
        # the catalog answers the table as it is now
        cols = svc.query("SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE"
                         " TABLE_SCHEMA = 'main' AND TABLE_NAME = 't' ORDER BY"
                         " ORDINAL_POSITION")
        assert [c[0] for c in cols] == V3

        out = svc.mariadb_binlog()
        if out is None:
            pytest.skip("mariadb-binlog (Debian's mariadb-client) is not installed")
        decoded = parse_verbose(out.stdout, out.stderr)
        assert [d.rstrip(";").split("/*")[0].strip() for d in decoded.ddl] == \
            [sql for _, sql in queries], decoded.ddl
        # mariadb-binlog's rows, applied in order: the same table, the old rows' new
        # columns NULL
        rows: dict[int, list[Any]] = {}
        for name, op, before, after in decoded.changes:
            assert name == "main.t"
            if before is not None:
                assert rows.pop(int(before[0]))[:len(before)] == before, (op, before)
            if after is not None:
                rows[int(after[0])] = after + [None] * (len(V3) - len(after))
        want = {k[0]: r for k, r in _source_rows(db).items()}
        assert set(rows) == set(want)
        for k, row in rows.items():
            w = want[k]
            assert row[1] == w["name"].encode()
            assert (None if row[2] is None else float(row[2])) == w["price"]
            assert row[3] == w["data"]
