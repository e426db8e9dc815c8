"""``include_columns`` / ``exclude_columns`` on every source (issue 30): a column left
out (``ssn``) is absent from the stream (JSON, before and after images, key changes),
the initial snapshot's rows, an incremental snapshot's chunks, the relay's buffer file,
its schemas and a bootstrap store fed by the relay, for SQLite, PostgreSQL and MariaDB;
a key column an exclude regex matches is still there; a table altered while filtered
stays filtered."""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from databus.bootstrap.config import parse_config as parse_bootstrap
from databus.bootstrap.service import BootstrapService
from databus.client import ClientConfig, DatabusClient, FileCheckpointStore
from databus.client.consumer import Consumer, DataEvent
from databus.core import event as ev
from databus.core.envelope import decode_images
from databus.core.schema import SchemaRegistry
from databus.core.window import Window
from databus.relay.config import parse_config
from databus.relay.relay import Relay
from databus.sources.columns import ColumnFilter
from databus.sources.postgres.source import PostgresSource
from tests.support.mariadb import MariaDB
from tests.support.postgres import PostgreSQL
from tests.support.sources import source_config, sqlite_source
from tests.support.wait import wait_until

SECRET = b"777-77-"  # every ssn value starts so: searched for in files


def _ssn(i: int) -> str:
    return f"777-77-{i:04d}"


def _stream(url: str) -> list[dict[str, Any]]:
    """Every data event the relay holds, as JSON envelopes."""
    r = httpx.get(f"{url}/stream", params={"output": "json", "timeout": "0",
                                           "size": str(16 << 20)}, timeout=30)
    assert r.status_code == 200, r.text
    return [json.loads(x) for x in r.text.splitlines() if '"op"' in x]


def _people(url: str) -> list[dict[str, Any]]:
    return [x for x in _stream(url) if x["source"]["table"] == "people"]


def _assert_left_out(envelopes: list[dict[str, Any]]) -> None:
    """No image has ``ssn``; every image has its key ``id`` (which a regex matched)."""
    assert envelopes
    for env in envelopes:
        images = [i for i in (env["before"], env["after"]) if i is not None]
        assert images, env
        for image in images:
            assert "ssn" not in image, env
            assert "id" in image and image["id"] is not None, env


def _schemas(url: str) -> list[dict[str, Any]]:
    ids = ",".join(str(s["id"]) for s in httpx.get(f"{url}/sources", timeout=10).json())
    r = httpx.get(f"{url}/register", params={"sources": ids}, timeout=10)
    assert r.status_code == 200, r.text
    body: list[dict[str, Any]] = r.json()
    return body


def _fields(url: str, table: str) -> list[dict[str, Any]]:
    reg = SchemaRegistry.from_json(json.dumps(_schemas(url)))
    return [f for src in reg.source_ids() for s in reg.versions(src)
            if s.name.endswith(f".{table}") for f in s.avro["fields"]]


def _bootstrap_store(relay: Relay, tmp: Path) -> bytes:
    """Every byte of a SQLite bootstrap store fed by ``relay`` (no initial load), once it
    applied every window the relay holds."""
    store = tmp / "bs.db"
    with BootstrapService(parse_bootstrap({
            "relay": relay.url, "store": {"url": f"sqlite:///{store}"},
            "http": {"port": 0}, "poll_timeout": 0.5, "apply_interval": 0.05})) as bs:
        wait_until(lambda: bs.applier.applied_scn >= relay.buffer.max_scn >= 0, 60,
                   "the bootstrap store to apply the relay's windows")
        assert bs.producer.error is None and bs.applier.error is None
    return b"".join(p.read_bytes() for p in tmp.glob("bs.db*"))


# -- the rule ----------------------------------------------------------------------


def test_the_rule_include_then_exclude_and_keys_always_kept() -> None:
    f = ColumnFilter([r"db\.t\.(a|b|k)"], [r".*\.b", r"db\.t\.k"])
    assert f.keep("db.t", ["k", "a", "b", "c"], {0}) == [True, True, False, False]
    assert f.keep("db.u", ["k", "a"], {0}) == [True, False]  # include names db.t only
    assert ColumnFilter().keep("db.t", ["a", "b"], set()) == [True, True]
    assert not ColumnFilter() and f
    assert ColumnFilter([], [r"t\.ssn", r".*\.ssn"]).unmatched(["main.t.ssn"]) == [r"t\.ssn"]
    # a SQLite column answers to main.t.c and t.c
    assert ColumnFilter([], [r"t\.ssn"]).keep("main.t", ["ssn"], set(), alias="t") == [False]
    assert ColumnFilter([r"t\.a"], []).keep("main.t", ["a", "b"], set(), alias="t") == [
        True, False]


# -- SQLite ------------------------------------------------------------------------


def _sqlite_people(db: Path) -> None:
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE people (id INTEGER PRIMARY KEY, ssn TEXT, name TEXT)")
        con.executemany("INSERT INTO people VALUES (?, ?, ?)",
                        [(i, _ssn(i), f"name-{i}") for i in (1, 2, 3)])


def _sqlite_relay(db: Path, tmp: Path, **source: Any) -> Relay:
    return Relay(parse_config({
        "source": {"url": f"sqlite:///{db}", "tables": ["people"], "poll_interval": 0.01,
                   "snapshot_mode": "initial", "snapshot_chunk_size": 2, **source},
        "buffer": {"path": str(tmp / "relay.buf"), "capacity_bytes": 1 << 22,
                   "flush_interval": 0.1},
        "http": {"port": 0}, "state_dir": str(tmp / "state")}))


def test_sqlite_an_excluded_column_is_in_no_event_snapshot_buffer_or_bootstrap_store(
        tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    _sqlite_people(db)
    # the key matched too: it stays
    with _sqlite_relay(db, tmp_path, exclude_columns=[r"main\.people\.(ssn|id)"]) as relay:
        wait_until(lambda: len(_people(relay.url)) >= 3, 30, "the snapshot's three rows")
        with sqlite3.connect(db) as con:
            con.execute("INSERT INTO people VALUES (4, ?, 'name-4')", (_ssn(4),))
            con.execute("UPDATE people SET name = 'renamed' WHERE id = 2")  # before image
            con.execute("UPDATE people SET id = 10 WHERE id = 1")  # a key change: d + c
            con.execute("DELETE FROM people WHERE id = 3")
        # read before the ALTER, so the re-install reads only row 5 again (refresh_rows)
        wait_until(lambda: len(_people(relay.url)) >= 8, 30, "the changes")
        con = sqlite3.connect(db, isolation_level=None)
        try:  # a schema change: the rule goes on applying
            con.execute("BEGIN")  # the insert is logged by the old triggers...
            con.execute("ALTER TABLE people ADD COLUMN note TEXT")
            con.execute("INSERT INTO people VALUES (5, ?, 'name-5', 'noted')", (_ssn(5),))
            con.execute("COMMIT")
        finally:
            con.close()
        rows = wait_until(lambda: (r := _people(relay.url)) and len(r) >= 10 and r, 30,
                          "the snapshot and the changes")
        assert [r["op"] for r in rows] == ["r", "r", "r", "c", "u", "d", "c", "d", "c", "r"]
        _assert_left_out(rows)
        assert rows[4]["before"]["name"] == "name-2" and rows[4]["after"]["name"] == "renamed"
        assert rows[8]["after"] == {"id": 5, "name": "name-5"}  # the version before
        # ...and read again whole by the re-install, with the new version
        assert rows[9]["after"] == {"id": 5, "name": "name-5", "note": "noted"}
        assert {f["name"] for f in _fields(relay.url, "people")} == {"id", "name", "note"}
        store = _bootstrap_store(relay, tmp_path)
        relay.buffer.flush()
    raw = (tmp_path / "relay.buf").read_bytes()
    for data, what in ((raw, "the buffer file"), (store, "the bootstrap store")):
        assert b"name-5" in data and b"renamed" in data, what  # searched for real
        assert SECRET not in data, f"an ssn is in {what}"
        assert b'"ssn"' not in data, f"the ssn field is in {what}"


def test_sqlite_include_columns_keeps_those_and_the_key(tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    _sqlite_people(db)
    src = sqlite_source(db, ["people"], snapshot_mode="no_data",
                        include_columns=[r"people\.name"])  # the name without main. too
    stop = threading.Event()
    try:
        assert src.read(-1, stop, 0.2) == []  # rows written before capture are not logged
        with sqlite3.connect(db) as con:
            con.execute("UPDATE people SET name = 'x' WHERE id = 1")
        windows = wait_until(lambda: src.read(-1, stop, 0.2), 10, "the update")
        images = _decode(windows, src.registry())
        assert images == [("u", {"id": 1, "name": "x"}, {"id": 1, "name": "name-1"})]
    finally:
        src.close()


def test_sqlite_a_filter_changed_between_runs_keeps_earlier_events_readable(
        tmp_path: Path) -> None:
    """Events a relay buffered before its filter changed keep the schema they were
    written with: the restarted relay still serves it (its schema history), and the
    current schema stays the table's latest."""
    db = tmp_path / "app.db"
    _sqlite_people(db)
    with _sqlite_relay(db, tmp_path, snapshot_mode="no_data") as relay:
        with sqlite3.connect(db) as con:
            con.execute("INSERT INTO people VALUES (7, 'before-the-filter', 'name-7')")
        wait_until(lambda: any(r["after"]["id"] == 7 for r in _people(relay.url)), 30,
                   "the insert")
    with _sqlite_relay(db, tmp_path, snapshot_mode="no_data",
                       exclude_columns=[r"main\.people\.ssn"]) as relay:
        with sqlite3.connect(db) as con:
            con.execute("INSERT INTO people VALUES (8, ?, 'name-8')", (_ssn(8),))
        rows = wait_until(lambda: (r := _people(relay.url)) and len(r) >= 2 and r, 30,
                          "both runs' events")
        mine = {r["after"]["id"]: r["after"] for r in rows if r["after"]["id"] in (7, 8)}
        assert mine[7]["ssn"] == "before-the-filter"  # as it was captured then
        assert mine[8] == {"id": 8, "name": "name-8"}
        reg = SchemaRegistry.from_json(json.dumps(_schemas(relay.url)))
        (src,) = reg.source_ids()
        assert [f["name"] for f in reg.latest(src).avro["fields"]] == ["id", "name"]
    with _sqlite_relay(db, tmp_path, snapshot_mode="no_data",
                       exclude_columns=[r"main\.people\.ssn"]) as relay:  # and once more
        assert [r["after"] for r in _people(relay.url)] == [mine[7], mine[8]]


def test_sqlite_a_column_regex_matching_no_column_is_logged(tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    db = tmp_path / "app.db"
    _sqlite_people(db)
    with caplog.at_level(logging.WARNING, "databus.sources.sqlite"):
        sqlite_source(db, ["people"], snapshot_mode="no_data",
                      exclude_columns=[r"people\.snn", r"main\.people\.ssn"]).close()
    assert "'people\\\\.snn' matches no column" in caplog.text
    assert "ssn' matches" not in caplog.text


def test_a_bootstrap_initial_load_with_the_relays_filter_reads_no_excluded_column(
        tmp_path: Path) -> None:
    """The initial load reads the database itself: given the relay's exclude_columns
    its store holds no ssn, and its rows carry the relay's schema (a consumer
    bootstrapping from it decodes them with what the relay serves)."""
    db = tmp_path / "app.db"
    _sqlite_people(db)
    exclude = [r"people\.ssn"]
    relay = _sqlite_relay(db, tmp_path, snapshot_mode="no_data", exclude_columns=exclude)
    with relay, BootstrapService(parse_bootstrap({
            "relay": relay.url, "store": {"url": f"sqlite:///{tmp_path / 'bs.db'}"},
            "http": {"port": 0}, "poll_timeout": 0.5, "apply_interval": 0.05,
            "initial_load": {"url": f"sqlite:///{db}", "tables": ["people"],
                             "exclude_columns": exclude}})) as bs:
        rec = _BootstrapRows()
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
    assert sorted(rec.rows, key=lambda r: r["id"]) == [
        {"id": i, "name": f"name-{i}"} for i in (1, 2, 3)]
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("bs.db*"))
    assert b"name-2" in raw
    assert SECRET not in raw and b'"ssn"' not in raw


class _BootstrapRows(Consumer):
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def on_bootstrap_event(self, event: DataEvent) -> None:
        assert event.after is not None
        self.rows.append(dict(event.after))


def _decode(windows: list[Window], registry: SchemaRegistry
            ) -> list[tuple[str, dict[str, Any] | None, dict[str, Any] | None]]:
    """(op letter, after image, before image) of each data event."""
    out = []
    for w in windows:
        for e in ev.iter_events(w.events):
            if not e.is_control:
                _schema, before, after, _meta = decode_images(e, registry)
                out.append((e.op.letter, after, before))
    return out


# -- PostgreSQL --------------------------------------------------------------------


@pytest.fixture()
def pgdb(postgres: PostgreSQL) -> Iterator[str]:
    with postgres.fresh_database("pgcols") as url:
        yield url.rsplit("/", 1)[1]  # its slots are dropped with it


def _pg(postgres: PostgreSQL, db: str) -> psycopg.Connection[Any]:
    return psycopg.connect(f"host=127.0.0.1 port={postgres.port} user=postgres dbname={db}",
                           autocommit=True)


def test_postgres_an_excluded_column_is_in_no_event_snapshot_buffer_or_bootstrap_store(
        postgres: PostgreSQL, pgdb: str, tmp_path: Path) -> None:
    with _pg(postgres, pgdb) as conn:
        conn.execute("CREATE TABLE people (id int PRIMARY KEY, ssn text, name text, bio text)")
        # TOASTed out of line: an update that leaves them alone does not send them
        conn.execute("ALTER TABLE people ALTER ssn SET STORAGE EXTERNAL,"
                     " ALTER bio SET STORAGE EXTERNAL")
        conn.execute("INSERT INTO people SELECT g, '777-77-' || lpad(g::text, 4, '0'),"
                     " 'name-' || g, 'short' FROM generate_series(1, 3) g")
    relay = Relay(parse_config({
        "source": {"url": postgres.source_url(pgdb), "tables": [r"public\.people"],
                   "snapshot_mode": "initial", "snapshot_chunk_size": 2,
                   "create_publication": True, "slot": f"s_{pgdb}", "publication": "cols",
                   "exclude_columns": [r"public\.people\.(ssn|id)"]},
        "buffer": {"path": str(tmp_path / "relay.buf"), "capacity_bytes": 1 << 22,
                   "flush_interval": 0.1},
        "http": {"port": 0}, "state_dir": str(tmp_path / "state")}))
    big = "x" * 300_000
    with relay, _pg(postgres, pgdb) as conn:
        wait_until(lambda: len(_people(relay.url)) >= 3, 60, "the initial snapshot")
        conn.execute(f"INSERT INTO people VALUES (4, '777-77-{'4' * 300_000}', 'name-4',"
                     f" '{big}')")
        conn.execute("UPDATE people SET name = 'renamed' WHERE id = 4")  # both TOASTed
        conn.execute(f"INSERT INTO people VALUES (5, '777-77-{'5' * 300_000}', 'name-5',"
                     " 'small')")
        conn.execute("UPDATE people SET name = 'renamed-5' WHERE id = 5")  # only ssn TOASTed
        conn.execute("UPDATE people SET id = 10 WHERE id = 1")  # a key change: d + c
        conn.execute("DELETE FROM people WHERE id = 3")
        conn.execute("ALTER TABLE people ADD COLUMN note text")  # the rule goes on
        conn.execute("INSERT INTO people VALUES (6, '777-77-0006', 'name-6', 'b', 'noted')")
        rows = wait_until(lambda: (r := _people(relay.url)) and len(r) >= 11 and r, 60,
                          "the changes")
        assert [r["op"] for r in rows] == ["r", "r", "r", "c", "u", "c", "u", "d", "c", "d",
                                           "c"]
        _assert_left_out(rows)
        assert rows[4]["after"] == {"id": 4, "name": "renamed", "bio": big}
        assert rows[-1]["after"] == {"id": 6, "name": "name-6", "bio": "b", "note": "noted"}
        stats = relay.source.stats()
        # bio was read back for id 4; the left-out ssn never (nor anything for id 5)
        assert stats["toast_fetched_total"] == 1, stats
        # an incremental snapshot: its chunks select the kept columns only
        r = httpx.post(f"{relay.url}/signal", json={
            "type": "execute-snapshot", "data": {"data-collections": [r"public\.people"]}},
            timeout=30)
        assert r.status_code == 202, r.text
        rows = wait_until(lambda: (r := _people(relay.url)) and len(r) >= 16 and r, 60,
                          "the incremental snapshot's five rows")
        assert [x["op"] for x in rows[11:]] == ["r"] * 5
        _assert_left_out(rows)
        assert {f["name"] for f in _fields(relay.url, "people")} == {"id", "name", "bio",
                                                                     "note"}
        store = _bootstrap_store(relay, tmp_path)
        relay.buffer.flush()
    raw = (tmp_path / "relay.buf").read_bytes()
    for data, what in ((raw, "the buffer file"), (store, "the bootstrap store")):
        assert b"name-6" in data and b"renamed" in data, what  # searched for real
        assert SECRET not in data, f"an ssn is in {what}"
        assert b'"ssn"' not in data, f"the ssn field is in {what}"


def _pg_source(postgres: PostgreSQL, db: str, name: str, compiled: bool,
               **fields: Any) -> PostgresSource:
    cfg = source_config(postgres.source_url(db), [r"public\..*"], snapshot_mode="no_data",
                        create_publication=True, publication="cols", slot=f"{name}_{db}",
                        **fields)
    src = PostgresSource(cfg, name=name, compiled=compiled)
    src.open()
    return src


def _read(src: PostgresSource, after: int, want: int) -> list[Window]:
    """Windows after ``after`` until they hold ``want`` events (empty ones dropped)."""
    stop = threading.Event()
    out: list[Window] = []
    deadline = time.monotonic() + 30
    while sum(w.count for w in out) < want:
        assert time.monotonic() < deadline, f"{sum(w.count for w in out)} events of {want}"
        for w in src.read(after, stop, 0.3):
            after = w.scn
            out.append(w)
    return [w for w in out if w.count]


@pytest.mark.parametrize("identity", ["DEFAULT", "FULL"])
def test_postgres_compiled_and_python_decoders_leave_the_same_columns_out(
        postgres: PostgreSQL, pgdb: str, identity: str) -> None:
    """Both decoders (C with its skip kind, Python with the version's projection) give
    the same bytes for a filtered table: before images (FULL), key changes, deletes,
    NULLs, TOASTed values; include_columns keeps those columns and the key."""
    with _pg(postgres, pgdb) as conn:
        conn.execute("CREATE TABLE people (id int PRIMARY KEY, ssn text, name text, n int,"
                     " b bytea)")
        conn.execute(f"ALTER TABLE people REPLICA IDENTITY {identity}")
        conn.execute("ALTER TABLE people ALTER ssn SET STORAGE EXTERNAL")
        srcs = [_pg_source(postgres, pgdb, name, compiled,
                           include_columns=[r"public\.people\.(name|b)"])
                for name, compiled in (("c", True), ("py", False))]
        try:
            for src in srcs:  # creates the slots: changes from here on
                assert src.read(-1, threading.Event(), 0.2) == []
            conn.execute("INSERT INTO people VALUES (1, '777-77-0001', 'a', 1, '\\x00ff'),"
                         " (2, NULL, NULL, NULL, NULL)")
            conn.execute(f"INSERT INTO people VALUES (3, '777-77-{'3' * 100_000}', 'c', 3,"
                         " NULL)")
            conn.execute("UPDATE people SET name = 'c2' WHERE id = 3")  # ssn TOASTed, unsent
            conn.execute("UPDATE people SET n = 5, name = 'a2' WHERE id = 1")
            conn.execute("UPDATE people SET id = 20 WHERE id = 2")
            conn.execute("DELETE FROM people WHERE id = 1")
            windows = [_read(src, -1, 8) for src in srcs]
        finally:
            for src in srcs:
                src.close()
    assert [w.events for w in windows[0]] == [w.events for w in windows[1]]
    images = _decode(windows[0], srcs[0].registry())
    assert all(set(i) <= {"id", "name", "b"} for _, a, b in images for i in (a, b) if i)
    assert images[0] == ("c", {"id": 1, "name": "a", "b": b"\x00\xff"}, None)
    assert images[3] == ("u", {"id": 3, "name": "c2", "b": None},
                         {"id": 3, "name": "c", "b": None} if identity == "FULL" else None)
    assert [op for op, _, _ in images] == ["c", "c", "c", "u", "u", "d", "c", "d"]
    assert all(SECRET not in w.events for w in windows[0])


# -- MariaDB -----------------------------------------------------------------------


def test_mysql_an_excluded_column_is_in_no_event_snapshot_buffer_or_bootstrap_store(
        mariadb: MariaDB, tmp_path: Path) -> None:
    db = f"cols_{tmp_path.name[-8:].replace('-', '_')}"
    mariadb.execute(f"CREATE DATABASE {db}",
                    f"CREATE TABLE {db}.people (id INT PRIMARY KEY, ssn VARCHAR(20),"
                    " name VARCHAR(40))",
                    *(f"INSERT INTO {db}.people VALUES ({i}, '{_ssn(i)}', 'name-{i}')"
                      for i in (1, 2, 3)))
    relay = Relay(parse_config({
        "source": {"url": mariadb.url, "tables": [rf"{db}\.people"],
                   "snapshot_mode": "initial", "snapshot_chunk_size": 2,
                   "signal_table": f"{db}.signals",
                   "exclude_columns": [rf"{db}\.people\.(ssn|id)"]},
        "buffer": {"path": str(tmp_path / "relay.buf"), "capacity_bytes": 1 << 22,
                   "flush_interval": 0.1},
        "http": {"port": 0}, "state_dir": str(tmp_path / "state")}))
    try:
        with relay:
            wait_until(lambda: [x["op"] for x in _people(relay.url)] == ["r"] * 3, 60,
                       "the initial snapshot")
            mariadb.execute(f"INSERT INTO {db}.people VALUES (4, '{_ssn(4)}', 'name-4')",
                            f"UPDATE {db}.people SET name = 'renamed' WHERE id = 2",
                            f"UPDATE {db}.people SET id = 10 WHERE id = 1",
                            f"DELETE FROM {db}.people WHERE id = 3",
                            f"ALTER TABLE {db}.people ADD COLUMN note VARCHAR(10)",
                            f"INSERT INTO {db}.people VALUES (5, '{_ssn(5)}', 'name-5',"
                            " 'noted')")
            rows = wait_until(lambda: (r := _people(relay.url)) and len(r) >= 9 and r, 60,
                              "the changes")
            assert [r["op"] for r in rows] == ["r", "r", "r", "c", "u", "d", "c", "d", "c"]
            _assert_left_out(rows)
            assert rows[-1]["after"] == {"id": 5, "name": "name-5", "note": "noted"}
            r = httpx.post(f"{relay.url}/signal", json={
                "type": "execute-snapshot", "data": {"data-collections": [rf"{db}\.people"]}},
                timeout=30)
            assert r.status_code == 202, r.text
            rows = wait_until(lambda: (r := _people(relay.url)) and len(r) >= 13 and r, 60,
                              "the incremental snapshot's four rows")
            assert [x["op"] for x in rows[9:]] == ["r"] * 4
            _assert_left_out(rows)
            store = _bootstrap_store(relay, tmp_path)
            relay.buffer.flush()
    finally:
        mariadb.execute(f"DROP DATABASE IF EXISTS {db}")
    raw = (tmp_path / "relay.buf").read_bytes()
    for data, what in ((raw, "the buffer file"), (store, "the bootstrap store")):
        assert b"name-5" in data and b"renamed" in data, what  # searched for real
        assert SECRET not in data, f"an ssn is in {what}"
        assert b'"ssn"' not in data, f"the ssn field is in {what}"
