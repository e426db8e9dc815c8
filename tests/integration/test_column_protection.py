"""Column protection (mask, truncate, hash) applied by the relay before events are
stored: what ``databus tail`` prints, what the buffer file holds and what a snapshot
sends carry the protected values only, for SQLite and MariaDB sources."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from databus.bootstrap.config import parse_config as parse_bootstrap
from databus.bootstrap.service import BootstrapService
from databus.client import ClientConfig, DatabusClient, FileCheckpointStore
from databus.client.consumer import Consumer, DataEvent
from databus.core.errors import ConfigError
from databus.core.schema import ColumnSpec, TableSchema, table_schema
from databus.relay.config import parse_config
from databus.relay.relay import Relay
from databus.sources.config import ColumnRule
from databus.sources.protect import Protector
from tests.support.mariadb import MariaDB
from tests.support.procs import DATABUS, running
from tests.support.wait import wait_until

CARD, NAME, EMAIL = "SECRET-4111-1111", "Alexandrina Clearname", "alex@example.test"
SALT = "pepper-1"


def _rules(table: str) -> list[dict[str, Any]]:
    return [{"table": table, "column": "card", "mask": "####"},
            {"table": table, "column": "name", "truncate": 4},
            {"table": table, "column": "email", "hash": {"salt": SALT}}]


def _expected(name: str, email: str) -> dict[str, str]:
    return {"card": "####", "name": name[:4],
            "email": hashlib.sha256((SALT + email).encode()).hexdigest()}


def _stream_rows(url: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{url}/stream", params={"output": "json", "timeout": "0",
                                           "size": str(16 << 20)}, timeout=30)
    assert r.status_code == 200, r.text
    return [json.loads(x) for x in r.text.splitlines() if '"op"' in x]


def _assert_protected(rows: list[dict[str, Any]]) -> None:
    for env in rows:
        for image in (env["before"], env["after"]):
            if image is None or "card" not in image:
                continue
            want = _expected(NAME if image["id"] != 3 else "Bo", EMAIL)
            assert {k: image[k] for k in want} == want, env


def test_sqlite_stream_snapshot_tail_and_buffer_hold_only_protected_values(
        tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE people (id INTEGER PRIMARY KEY, card TEXT, name TEXT,"
                    " email TEXT, note TEXT)")
        con.execute("INSERT INTO people VALUES (1, ?, ?, ?, 'kept')", (CARD, NAME, EMAIL))
    buf = tmp_path / "relay.buf"
    cfg = parse_config({
        "source": {"url": f"sqlite:///{db}", "tables": ["people"], "poll_interval": 0.01,
                   "snapshot_mode": "initial", "columns": _rules(r"main\.people")},
        "buffer": {"path": str(buf), "capacity_bytes": 1 << 22, "flush_interval": 0.1},
        "http": {"port": 0}})
    with Relay(cfg) as relay:
        wait_until(lambda: _stream_rows(relay.url), 30, "the snapshot")
        with sqlite3.connect(db) as con:  # after the snapshot: streamed changes
            con.execute("INSERT INTO people VALUES (2, ?, ?, ?, NULL)", (CARD, NAME, EMAIL))
            con.execute("INSERT INTO people VALUES (3, ?, 'Bo', ?, NULL)", (CARD, EMAIL))
            con.execute("UPDATE people SET note = 'changed' WHERE id = 2")
            con.execute("DELETE FROM people WHERE id = 1")
        rows = wait_until(lambda: (r := _stream_rows(relay.url)) and len(r) >= 5 and r, 30,
                          "the snapshot row and four changes")
        assert [r["op"] for r in rows] == ["r", "c", "c", "u", "d"]
        assert rows[0]["after"]["note"] == "kept"  # unprotected columns untouched
        _assert_protected(rows)
        # databus tail, a real consumer process, prints the same
        log = tmp_path / "tail.log"
        with running([*DATABUS, "tail", "--relay", relay.url, "--from-start"], log):
            wait_until(lambda: log.read_text().count('"op"') >= 5, 60, "tail's five lines")
        printed = [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]
        _assert_protected(printed)
        relay.buffer.flush()
    raw = buf.read_bytes()
    assert b"kept" in raw  # the buffer file is searched for real
    for clear in (CARD, NAME, EMAIL):
        assert clear.encode() not in raw, f"{clear!r} is in the buffer file"
        assert clear not in log.read_text()


def test_a_bootstrap_initial_load_applies_the_rules_before_its_store(tmp_path: Path) -> None:
    """The initial load reads the database itself, not the relay: with the relay's
    rules repeated in ``initial_load.columns`` its store and its snapshot answers hold
    only protected values."""
    db = tmp_path / "app.db"
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE people (id INTEGER PRIMARY KEY, card TEXT, name TEXT,"
                    " email TEXT, note TEXT)")
        con.executemany("INSERT INTO people VALUES (?, ?, ?, ?, 'kept')",
                        [(i, CARD, NAME, EMAIL) for i in (1, 2, 4)])
    rules = _rules(r"main\.people")
    relay = Relay(parse_config({
        "source": {"url": f"sqlite:///{db}", "tables": ["people"], "poll_interval": 0.01,
                   "snapshot_mode": "no_data", "columns": rules},
        "http": {"port": 0}}))
    store = tmp_path / "bs.db"
    with relay, BootstrapService(parse_bootstrap({
            "relay": relay.url, "store": {"url": f"sqlite:///{store}"},
            "http": {"port": 0}, "poll_timeout": 0.5, "apply_interval": 0.05,
            "initial_load": {"url": f"sqlite:///{db}", "tables": ["people"],
                             "columns": rules}})) as bs:
        rec = _Rows()
        client = DatabusClient(ClientConfig(relay=relay.url, bootstrap_url=bs.url,
                                            bootstrap_new_consumers=True), rec,
                               FileCheckpointStore(tmp_path / "c.ckpt"))
        runner = threading.Thread(target=client.run, daemon=True)
        runner.start()
        try:
            wait_until(lambda: len(rec.rows) >= 3, 60, "the three snapshot rows")
        finally:
            client.stop()
            runner.join(30)
    assert sorted(r["id"] for r in rec.rows) == [1, 2, 4]
    for row in rec.rows:
        assert {k: row[k] for k in ("card", "name", "email")} == _expected(NAME, EMAIL)
        assert row["note"] == "kept"
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("bs.db*"))
    assert b"kept" in raw
    for clear in (CARD, NAME, EMAIL):
        assert clear.encode() not in raw, f"{clear!r} is in the bootstrap store"


class _Rows(Consumer):
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def on_bootstrap_event(self, event: DataEvent) -> None:
        assert event.after is not None
        self.rows.append(dict(event.after))


@pytest.mark.slow
def test_mysql_snapshot_and_stream_hold_only_protected_values(mariadb: MariaDB,
                                                              tmp_path: Path) -> None:
    mariadb.execute("CREATE DATABASE IF NOT EXISTS prot",
                    "CREATE TABLE prot.people (id INT PRIMARY KEY, card VARCHAR(40),"
                    " name VARCHAR(60), email TEXT, note VARCHAR(20))",
                    f"INSERT INTO prot.people VALUES (1, '{CARD}', '{NAME}', '{EMAIL}', 'kept')")
    buf = tmp_path / "relay.buf"
    cfg = parse_config({
        "source": {"url": mariadb.url, "tables": [r"prot\.people"], "snapshot_mode": "initial",
                   "columns": _rules(r"prot\.people")},
        "buffer": {"path": str(buf), "capacity_bytes": 1 << 22, "flush_interval": 0.1},
        "http": {"port": 0}, "state_dir": str(tmp_path / "state")})
    with Relay(cfg) as relay:
        def people() -> list[dict[str, Any]]:
            return [x for x in _stream_rows(relay.url) if x["source"]["table"] == "people"]

        # the snapshot first: a change to a key inside an open snapshot chunk is
        # represented by the chunk's read, so the changes come after it
        wait_until(lambda: [x["op"] for x in people()] == ["r"], 60, "the snapshot read")
        mariadb.execute(f"INSERT INTO prot.people VALUES (2, '{CARD}', '{NAME}', '{EMAIL}', NULL)",
                        f"INSERT INTO prot.people VALUES (3, '{CARD}', 'Bo', '{EMAIL}', NULL)",
                        "UPDATE prot.people SET note = 'changed' WHERE id = 2",
                        "DELETE FROM prot.people WHERE id = 1")
        rows = wait_until(lambda: (r := people()) and len(r) >= 5 and r, 60,
                          "the snapshot read and four changes")
        assert [x["op"] for x in rows] == ["r", "c", "c", "u", "d"]
        _assert_protected(rows)
        relay.buffer.flush()
    raw = buf.read_bytes()
    assert b"kept" in raw
    for clear in (CARD, NAME, EMAIL):
        assert clear.encode() not in raw, f"{clear!r} is in the buffer file"


def _schema(**types: Any) -> TableSchema:
    cols = [ColumnSpec("id", "long", nullable=False)] + [
        ColumnSpec(n, t) for n, t in types.items()]
    return TableSchema(1, "db.t", 1, table_schema("db", "t", cols), ("id",))


@pytest.mark.parametrize(("rule", "why"), [
    ({"column": "missing", "mask": "x"}, "no column"),
    ({"column": "id", "mask": "x"}, "part of the key"),
    ({"column": "n", "mask": "x"}, "only string columns"),
])
def test_a_rule_that_cannot_apply_stops_capture_with_a_clear_error(rule: dict[str, Any],
                                                                   why: str) -> None:
    protector = Protector([ColumnRule.model_validate({"table": r"db\.t", **rule})])
    with pytest.raises(ConfigError, match=why):
        protector._plan(_schema(n="long", s="string"))


def test_a_rule_needs_exactly_one_action() -> None:
    with pytest.raises(ConfigError, match="exactly one"):
        parse_config({"source": {"url": "sqlite:///x.db", "columns": [
            {"table": "t", "column": "c", "mask": "x", "truncate": 2}]}})
