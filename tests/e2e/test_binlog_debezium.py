"""Debezium's MySQL connector (3.3, embedded: ``bench/peers/DebeziumHarness.java``) streams
from ``databus binlog-server`` in front of a SQLite source, and its change events equal
the source (issue 19).

Two ways the connector starts, each judged by replaying its change events (``op``
c/u/d with before/after images) into tables keyed by the primary key, which must equal
SQLite's value for value (BLOBs arrive base64-encoded, Debezium's JSON form of bytes):

* ``snapshot.mode=never``: it reads the binlog from its first file and builds its
  schema from the binlog's DDL (the service's ``CREATE TABLE`` events), as on a MySQL
  server whose history is all in the binlog;
* ``snapshot.mode=no_data`` (a schema snapshot): it takes the global read lock
  (``FLUSH TABLES WITH READ LOCK``: the binlog stands still), reads the position, the
  tables and ``SHOW CREATE TABLE`` from the service's catalog, unlocks, and streams
  from that position. Its events are replayed onto SQLite's rows at its start.

Runs only where the Debezium bundle is cached (``bash scripts/java/fetch.sh debezium``)
and a JDK is installed; nothing is downloaded at test time.
"""

from __future__ import annotations

import base64
import json
import shutil
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.binlog_server import (
    ALL,
    KEYS,
    PASSWORD,
    USER,
    BinlogService,
    make_source,
    sqlite_rows,
    wait_equal,
    write_changes,
)
from tests.support.wait import wait_until

pytestmark = [
    pytest.mark.filterwarnings("ignore:'db' is deprecated:DeprecationWarning"),
    pytest.mark.skipif(shutil.which("java") is None or shutil.which("javac") is None,
                       reason="no JDK"),
]


def _harness_classpath() -> str:
    from bench.peers import harness

    if not harness.cached():
        pytest.skip("the Debezium bundle is not cached (bash scripts/java/fetch.sh debezium)")
    return harness.classpath()


def _value(v: Any, field: dict[str, Any]) -> Any:
    if v is not None and field.get("type") == "bytes":
        return base64.b64decode(v)
    return v


def _replay(lines: list[str], start: dict[str, dict[tuple[Any, ...], dict[str, Any]]]
            ) -> dict[str, dict[tuple[Any, ...], dict[str, Any]]]:
    tables = {t: dict(rows) for t, rows in start.items()}
    for line in lines:
        msg = json.loads(line)
        payload, schema = msg["payload"], msg["schema"]
        image_schema = next(f for f in schema["fields"] if f["field"] == "after")
        fields = {f["field"]: f for f in image_schema["fields"]}
        table = payload["source"]["table"]
        rows = tables.setdefault(table, {})

        def image(raw: dict[str, Any] | None) -> dict[str, Any] | None:
            if raw is None:
                return None
            return {k: _value(v, fields[k]) for k, v in raw.items()}  # noqa: B023

        before, after = image(payload["before"]), image(payload["after"])
        keys = KEYS[table]
        if before is not None:
            assert rows.pop(tuple(before[k] for k in keys)) == before, (table, payload)
        if after is not None:
            k = tuple(after[k] for k in keys)
            assert k not in rows, (table, payload)
            rows[k] = after
        assert payload["op"] == {(False, True): "c", (True, True): "u",
                                 (True, False): "d"}[(before is not None, after is not None)]
    return tables


class _Harness:
    """One embedded Debezium run against the service, stopping after ``expect`` events."""

    def __init__(self, cp: str, svc: BinlogService, work: Path, mode: str,
                 expect: int) -> None:
        work.mkdir()
        self.work = work
        self.out = work / "events.jsonl"
        args = ["java", "-Xmx512m", "-cp", cp, "DebeziumHarness", "--port", str(svc.port),
                "--user", USER, "--password", PASSWORD, "--mode", "values",
                "--snapshot-mode", mode, "--tables", ",".join(f"main.{t}" for t in ALL),
                "--expect", str(expect), "--out", str(self.out), "--timeout", "300",
                "--offsets", str(work / "offsets.dat"), "--history", str(work / "history.dat")]
        self.log_path = work / "harness.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self._log, text=True)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_connected(self) -> None:
        def connected() -> bool:
            assert self.proc.poll() is None, self.log()[-4000:]
            return "Connected to binlog" in self.log()

        wait_until(connected, 240, "Debezium to stream from the binlog service")

    def events(self) -> list[str]:
        try:
            stdout, _ = self.proc.communicate(timeout=600)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._log.close()
        result = next((json.loads(line[len("RESULT "):]) for line in stdout.splitlines()
                       if line.startswith("RESULT ")), None)
        assert result is not None and result.get("finished") and not result.get("failure"), (
            stdout[-2000:], self.log()[-4000:])
        return self.out.read_text().splitlines()


def test_debezium_streams_every_change_equal_to_the_sqlite_source(tmp_path: Path) -> None:
    cp = _harness_classpath()
    db = make_source(tmp_path)
    with BinlogService(db, tmp_path, ALL) as svc:
        write_changes(db, 40, seed=7)
        got = wait_equal(svc, db)
        lines = _Harness(cp, svc, tmp_path / "never", "never", got.rows).events()
        assert len(lines) == got.rows
        tables = _replay(lines, {})
        for t in ALL:
            assert tables.get(t, {}) == sqlite_rows(db, t, KEYS[t]), t


def _changes_of_write(db: Path, scratch: Path, transactions: int, seed: int) -> int:
    """The row changes ``write_changes(db, transactions, seed)`` will make: the same writes on a
    copy of the database, counted in the copy's capture log (one row per change)."""
    src, dst = sqlite3.connect(db), sqlite3.connect(scratch)
    try:
        src.backup(dst)
    finally:
        src.close()

    def seq() -> int:
        row = dst.execute("SELECT seq FROM sqlite_sequence WHERE name = '_databus_txlog'"
                          ).fetchone()
        return int(row[0]) if row else 0

    try:
        first = seq()
        write_changes(scratch, transactions, seed)
        return seq() - first
    finally:
        dst.close()


def test_debezium_with_a_schema_snapshot_streams_from_where_it_locked(
        tmp_path: Path) -> None:
    cp = _harness_classpath()
    db = make_source(tmp_path)
    with BinlogService(db, tmp_path, ALL) as svc:
        write_changes(db, 20, seed=7)
        wait_equal(svc, db)
        at_start = {t: sqlite_rows(db, t, KEYS[t]) for t in ALL}
        expect = _changes_of_write(db, tmp_path / "scratch.db", 20, seed=8)
        harness = _Harness(cp, svc, tmp_path / "no_data", "no_data", expect)
        harness.wait_connected()
        write_changes(db, 20, seed=8)
        lines = harness.events()
        assert "Unable to flush and acquire global read lock" not in harness.log()
        assert len(lines) == expect
        tables = _replay(lines, at_start)
        for t in ALL:
            assert tables.get(t, {}) == sqlite_rows(db, t, KEYS[t]), t
