"""Which tables a MySQL relay captures is known from the start (issue 30, item 6).

* Table filters that match no existing table are refused with one line: by the source,
  by ``databus relay`` (exit 2), and by a config reload (the running filters stay).
* A table that exists but has had no change yet is in ``/sources`` and ``/register``
  from the start, so a consumer started first gets its first change instead of dying
  with ``UnknownSource``; the version listed is the one its binlog rows then carry
  (the whole type matrix, composite keys, tables without a key, column filters).
* A listed version never takes a number from the stream's own shapes: a dump that
  replays older binlog gives the older shape the number the listing had.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from databus.client import ClientConfig, Consumer, DatabusClient, DataEvent
from databus.core import event as ev
from databus.core.errors import ConfigError
from databus.core.schema import SchemaRegistry
from databus.sources.common.names import source_id
from databus.sources.mysql.checks import parse_mysql_url
from databus.sources.mysql.connection import master_status
from databus.sources.mysql.source import MysqlSource
from tests.support.mariadb import MariaDB
from tests.support.procs import DATABUS, free_port, running, spawn, wait_http
from tests.support.sources import mysql_source, source_config
from tests.support.typematrix import COLUMNS, EXTRA, ROWS
from tests.support.wait import wait_until


@pytest.fixture
def server(tmp_path: Path) -> Iterator[MariaDB]:
    with MariaDB(tmp_path / "db") as m:
        m.execute("CREATE DATABASE shop", "CREATE TABLE shop.orders (id INT PRIMARY KEY,"
                  " item VARCHAR(40), qty INT)", "INSERT INTO shop.orders VALUES (1, 'pen', 2)")
        yield m


def _scn(m: MariaDB) -> int:
    file, pos = master_status(parse_mysql_url(m.url))
    return (int(file.rsplit(".", 1)[1]) << 32) | pos


def _read_until(src: MysqlSource, after: int, end: int) -> list[ev.Event]:
    out: list[ev.Event] = []
    while after < end:
        windows = src.read(after, threading.Event(), 2.0)
        assert windows, "no progress"
        for w in windows:
            out += [e for e in ev.iter_events(w.events) if not e.is_control]
            after = w.scn
    return out


# -- refused filters -----------------------------------------------------------------


def test_table_filters_that_match_nothing_are_refused(server: MariaDB) -> None:
    with pytest.raises(ConfigError, match=r"no table matches tables \['shop\\\\.nosuch'\]"):
        mysql_source(server.url, [r"shop\.nosuch"], snapshot_mode="no_data")
    with pytest.raises(ConfigError, match="less exclude_tables"):
        mysql_source(server.url, [r"shop\..*"], exclude_tables=[r"shop\.orders"],
                     snapshot_mode="no_data")
    src = mysql_source(server.url, [r"shop\..*"], snapshot_mode="no_data")
    try:
        with pytest.raises(ConfigError, match=r"no table matches.*running table filters stay"):
            src.reconfigure(source_config(server.url, [r"other\..*"]))
        assert src._new_filters is None  # nothing to apply: the old filters stay
    finally:
        src.close()


def test_a_relay_whose_tables_match_nothing_exits_with_one_line(server: MariaDB,
                                                                tmp_path: Path) -> None:
    log = tmp_path / "relay.log"
    proc = spawn([*DATABUS, "relay", "--source", server.url, "--tables", r"shop\.nosuch",
                  "--snapshot-mode", "no_data", "--port", str(free_port())], log)
    assert proc.wait(60) == 2
    errors = [x for x in log.read_text().splitlines() if "no table matches" in x]
    assert len(errors) == 1 and errors[0].startswith("databus: ConfigError: "), log.read_text()
    assert "Traceback" not in log.read_text()


# -- tables listed from the start ---------------------------------------------------------


class _Rows(Consumer):
    def __init__(self) -> None:
        self.rows: list[dict[str, object]] = []
        self.errors: list[BaseException] = []

    def on_data_event(self, event: DataEvent) -> None:
        assert event.after is not None
        self.rows.append(dict(event.after))

    def on_error(self, exc: BaseException) -> None:
        self.errors.append(exc)


def test_a_consumer_started_before_the_first_change_gets_it(server: MariaDB,
                                                          tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = [*DATABUS, "relay", "--source", server.url, "--tables", r"shop\..*",
            "--snapshot-mode", "no_data", "--port", str(port)]
    with running(args, tmp_path / "relay.log") as relay:
        wait_http(f"{url}/admin", relay)
        # asked at once: the fetcher may not have read anything yet
        sources = httpx.get(f"{url}/sources", timeout=5).json()
        src = source_id("shop.orders")
        assert {"id": src, "name": "shop.orders"} in sources
        registered = httpx.get(f"{url}/register", params={"sources": str(src)}, timeout=5)
        assert registered.status_code == 200, registered.text
        listed = SchemaRegistry.from_json(registered.text).versions(src)
        assert [s.version for s in listed] == [1]

        consumer, stop = _Rows(), threading.Event()
        client = DatabusClient(ClientConfig(relay=url, sources=["shop.orders"],
                                            poll_timeout=1.0), consumer)
        worker = threading.Thread(target=client.run, kwargs={"stop": stop})
        worker.start()
        try:
            wait_until(lambda: server.binlog_dumps() == 1, 30, "the relay's binlog dump")
            time.sleep(0.5)
            server.execute("INSERT INTO shop.orders VALUES (2, 'ink', 5)")
            wait_until(lambda: bool(consumer.rows) or bool(consumer.errors), 30,
                       "the first change")
        finally:
            stop.set()
            worker.join(30)
        assert consumer.errors == []
        assert consumer.rows == [{"id": 2, "item": "ink", "qty": 5}]
        after = SchemaRegistry.from_json(httpx.get(
            f"{url}/register", params={"sources": str(src)}, timeout=5).text).versions(src)
        assert [s.id for s in after] == [listed[0].id]  # the row came with the listed version


def _type_tables(m: MariaDB) -> None:
    cols = ", ".join(f"`{n}` {t}" for n, t in COLUMNS)
    extra = ", ".join(f"`{n}` {t}" for n, t in EXTRA)
    m.execute("CREATE DATABASE types", f"CREATE TABLE types.t ({cols})",
              f"CREATE TABLE types.x ({extra}, PRIMARY KEY (k1, k2))",
              "CREATE TABLE types.nokey (a INT, b VARCHAR(5) CHARACTER SET latin1)",
              "CREATE TABLE types.lk (k VARCHAR(10) CHARACTER SET latin1 PRIMARY KEY,"
              " v DECIMAL(30,10), secret TEXT)")


def _type_rows(m: MariaDB) -> None:
    with m.connect("types") as con, con.cursor() as cur:
        cur.execute("SET sql_mode = ''")  # allows zero dates
        cur.executemany(f"INSERT INTO t VALUES ({', '.join(['%s'] * len(COLUMNS))})", ROWS)
        cur.execute("INSERT INTO x (k1, k2, dz, dtz, g, n) VALUES (1, 'a', '0000-00-00',"
                    " '2024-01-02 03:04:05.678', ST_GeomFromText('POINT(1 2)'), 5)")
        cur.execute("INSERT INTO nokey VALUES (1, 'é€'), (NULL, NULL)")
        cur.execute("INSERT INTO lk VALUES ('Ä€z', -1.5, 's')")


@pytest.mark.parametrize("compiled", [True, False])
def test_listed_versions_are_the_ones_the_rows_carry(server: MariaDB, tmp_path: Path,
                                                     compiled: bool) -> None:
    _type_tables(server)
    src = mysql_source(server.url, [r"types\..*"], snapshot_mode="no_data", state_dir=tmp_path,
                       compiled=compiled, exclude_columns=[r"types\.lk\.secret"])
    try:
        names = {"types.t", "types.x", "types.nokey", "types.lk"}
        assert names <= {s.name for s in src.sources()}  # before any read
        listed = {n: [s.id for s in src.registry().versions(source_id(n))] for n in names}
        assert all(len(ids) == 1 for ids in listed.values())
        assert not (tmp_path / "relay.mysql-schemas.json").exists()  # provisional
        after = _scn(server)
        assert src.read(-1, threading.Event(), 0.2) == []  # dumps from the end: confirmed
        history = SchemaRegistry.from_json((tmp_path / "relay.mysql-schemas.json").read_text())
        assert {source_id(n) for n in names} <= set(history.source_ids())
        _type_rows(server)
        events = _read_until(src, after, _scn(server))
        assert {src.registry().get(e.schema_id).name for e in events} == names
        for e in events:  # every row with the version listed before it existed
            assert e.schema_id == listed[src.registry().get(e.schema_id).name][0]
        assert {n: [s.id for s in src.registry().versions(source_id(n))]
                for n in names} == listed
        lk = src.registry().versions(source_id("types.lk"))[0]
        assert "secret" not in [f["name"] for f in lk.avro["fields"]]
    finally:
        src.close()


def test_a_replayed_older_shape_takes_the_listed_number(server: MariaDB,
                                                        tmp_path: Path) -> None:
    start = _scn(server)
    server.execute("INSERT INTO shop.orders VALUES (2, 'ink', 5)",
                   "ALTER TABLE shop.orders ADD COLUMN note VARCHAR(20)",
                   "INSERT INTO shop.orders VALUES (3, 'cap', 1, 'new')")
    end = _scn(server)
    src = mysql_source(server.url, [r"shop\..*"], snapshot_mode="no_data", state_dir=tmp_path)
    try:
        orders = source_id("shop.orders")
        listed = src.registry().versions(orders)
        assert [s.version for s in listed] == [1]
        assert "note" in [f["name"] for f in listed[0].avro["fields"]]  # the current shape
        events = _read_until(src, start, end)  # a restart before the ALTER replays it
        versions = src.registry().versions(orders)
        by_id = {s.id: s for s in versions}
        got = [(e.key, by_id[e.schema_id].version) for e in events if e.src_id == orders]
        assert got == [(2, 1), (3, 2)]  # in the order the binlog met them
        assert "note" in [f["name"] for f in versions[-1].avro["fields"]]
        saved = json.loads((tmp_path / "relay.mysql-schemas.json").read_text())
        assert sorted(s["version"] for s in saved if s["name"] == "shop.orders") == [1, 2]
    finally:
        src.close()


def test_adopted_versions_replace_listed_ones(server: MariaDB, tmp_path: Path) -> None:
    """A cluster member promoted to leader opens its source (which lists the tables),
    then adopts what the former leader published: no number is taken twice."""
    start = _scn(server)
    server.execute("INSERT INTO shop.orders VALUES (2, 'ink', 5)",
                   "ALTER TABLE shop.orders ADD COLUMN note VARCHAR(20)",
                   "INSERT INTO shop.orders VALUES (3, 'cap', 1, 'new')")
    end = _scn(server)
    leader = mysql_source(server.url, [r"shop\..*"], snapshot_mode="no_data")
    try:
        _read_until(leader, start, end)
        published = SchemaRegistry.from_json(leader.registry().to_json())
    finally:
        leader.close()
    orders = source_id("shop.orders")
    old, new = published.versions(orders)
    member = mysql_source(server.url, [r"shop\..*"], snapshot_mode="no_data",
                          state_dir=tmp_path, name="member")
    try:
        assert [s.id for s in member.registry().versions(orders)] == [new.id]  # listed as 1
        member.adopt_schemas(published)
        assert [(s.version, s.id) for s in member.registry().versions(orders)] == [
            (1, old.id), (2, new.id)]
        server.execute("INSERT INTO shop.orders VALUES (4, 'nib', 3, 'x')")
        events = _read_until(member, end, _scn(server))
        assert [e.schema_id for e in events if e.src_id == orders] == [new.id]
    finally:
        member.close()
