"""One identity per relay (issue 30, items 1 and 2; docs/relay.md, "Identity").

Relays started as a user starts them (``databus relay`` processes) with their buffers
in ONE directory and default names: two SQLite relays on one database and a third on
another, two MariaDB relays on one server, two PostgreSQL relays on one database. Each
has its own name, state, trim registration, server_id or slot; all capture, and what
each serves folds into exactly its source's rows. Pairs that must collide (the same
given name in one directory, one buffer file, the same given server_id, the same given
slot) are refused at start with one line naming both; a replica that takes a relay's
server_id stops its capture with a terminal error instead of a fight. State, slots and
registrations named ``relay`` from before names were derived are refused with a line
naming ``--name relay``, and kept with it.

The cluster half (docs/cluster.md): §6's script exactly as written, a two-member
cluster with its buffers in one directory through a kill -9 of its leader, and a
leader whose capture stopped giving up its role to the other member.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import yaml

from databus.coord import ClusterView, Session, ZkAddress, connect
from databus.core.errors import ConfigError
from databus.relay.config import parse_config
from databus.relay.relay import Relay
from databus.sources.mysql.checks import parse_mysql_url
from databus.sources.mysql.connection import BinlogStream, master_status
from tests.support.mariadb import MariaDB
from tests.support.postgres import PostgreSQL
from tests.support.procs import (
    DATABUS,
    ROOT,
    free_port,
    kill9,
    served_lines,
    spawn,
    stop,
    wait_http,
)
from tests.support.wait import wait_until
from tests.support.zookeeper import ZooKeeper

Rows = dict[int, dict[str, Any]]
ENV = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}


# -- relay processes ------------------------------------------------------------------


@dataclass
class Procs:
    """``databus relay`` processes of one test, stopped at its end."""

    tmp: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    urls: dict[str, str] = field(default_factory=dict)

    def start(self, name: str, args: list[str]) -> str:
        """Start ``databus relay ARGS`` (``--port P`` added unless ARGS is a config file
        of :func:`config_file`, which holds the port); its URL once it serves."""
        args, port = with_port(args)
        proc = spawn([*DATABUS, "relay", *args], self.tmp / f"{name}.log")
        self.procs[name] = proc
        url = self.urls[name] = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/admin", proc)
        return url

    def admin(self, name: str) -> dict[str, Any]:
        return dict(httpx.get(f"{self.urls[name]}/admin", timeout=10).json())

    def kill(self, name: str) -> None:
        kill9(self.procs.pop(name))

    def stop_all(self) -> None:
        for proc in self.procs.values():
            stop(proc)
        self.procs.clear()


@contextmanager
def relays(tmp: Path) -> Iterator[Procs]:
    p = Procs(tmp)
    try:
        yield p
    finally:
        p.stop_all()


def with_port(args: list[str]) -> tuple[list[str], int]:
    if "--config" in args:
        raw = yaml.safe_load(Path(args[args.index("--config") + 1]).read_text())
        return args, int(raw["http"]["port"])
    port = free_port()
    return [*args, "--port", str(port)], port


def refused(args: list[str]) -> str:
    """A ``databus relay`` that must not start: its one line on stderr."""
    out = subprocess.run([*DATABUS, "relay", *with_port(args)[0]],
                         capture_output=True, text=True, timeout=60, cwd=ROOT, env=ENV)
    assert out.returncode != 0, f"it started:\n{out.stderr}"
    lines = [x for x in out.stderr.splitlines() if x.startswith("databus:")]  # not the log
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    return lines[0]


def config_file(path: Path, raw: dict[str, Any]) -> list[str]:
    """``--config PATH`` of a relay config ``raw`` listening on a free port."""
    path.write_text(yaml.safe_dump({**raw, "http": {"port": free_port()}}))
    return ["--config", str(path)]


def served_rows(url: str, table: str) -> Rows:
    """Everything ``url`` serves of ``table``, folded by key: a consumer's copy."""
    rows: Rows = {}
    for line in served_lines(url):
        e = json.loads(line)
        if "op" not in e or e["source"]["table"] != table:
            continue
        image = e["after"] or e["before"]
        if e["op"] == "d":
            rows.pop(int(image["id"]), None)
        else:
            rows[int(image["id"])] = {k: e["after"][k] for k in ("id", "qty", "note")}
    return rows


# -- source databases -------------------------------------------------------------------


@dataclass
class Db:
    """A database with ``orders(id, qty, note)``, as a relay and a writer see it."""

    url: str  # the relay's --source
    tables: str  # its --tables
    run: Callable[[list[tuple[str, tuple[Any, ...]]]], None]  # one transaction
    select: Callable[[], list[tuple[Any, ...]]]

    def rows(self) -> Rows:
        return {int(i): {"id": int(i), "qty": int(q), "note": str(n)}
                for i, q, n in self.select()}

    def write(self, first: int, count: int) -> None:
        """Transactions inserting ``first..first+count-1``, updating and deleting some."""
        for i in range(first, first + count):
            tx: list[tuple[str, tuple[Any, ...]]] = [
                ("INSERT INTO orders VALUES (%s, %s, %s)", (i, i % 7, f"n{i}"))]
            if i % 3 == 0:
                tx.append(("UPDATE orders SET qty = qty + 10 WHERE id = %s", (i - 2,)))
            if i % 5 == 0:
                tx.append(("DELETE FROM orders WHERE id = %s", (i - 4,)))
            self.run(tx)


def sqlite_db(path: Path) -> Db:
    con = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
    con.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, qty INTEGER, note TEXT)")

    def run(tx: list[tuple[str, tuple[Any, ...]]]) -> None:
        con.execute("BEGIN IMMEDIATE")
        for sql, params in tx:
            con.execute(sql.replace("%s", "?"), params)
        con.execute("COMMIT")

    return Db(f"sqlite:///{path}", "orders", run,
              lambda: con.execute("SELECT id, qty, note FROM orders").fetchall())


def wait_equal(procs: Procs, name: str, db: Db, table: str = "orders") -> None:
    url = procs.urls[name]
    wait_until(lambda: served_rows(url, table) == db.rows(), 60,
               f"relay {name}'s stream to fold into its source's rows")


# -- SQLite ----------------------------------------------------------------------------


def test_sqlite_relays_with_buffers_in_one_directory_each_keep_their_own(tmp_path: Path
                                                                          ) -> None:
    a, b = sqlite_db(tmp_path / "a.db"), sqlite_db(tmp_path / "b.db")
    a.write(1, 20)
    b.write(1, 20)
    bufs = tmp_path / "bufs"

    def args(db: Db, buf: str) -> list[str]:
        return ["--source", db.url, "--tables", db.tables, "--buffer-path", str(bufs / buf)]

    with relays(tmp_path) as procs:
        procs.start("a", args(a, "a.buf"))
        wait_until(lambda: list(bufs.glob("a-*.state.json")), 10, "relay a's state")
        procs.start("b", args(b, "b.buf"))  # the order: after a wrote its state
        procs.start("c", args(a, "c.buf"))  # a second relay on a.db
        names = {n: procs.admin(n)["name"] for n in ("a", "b", "c")}
        assert len(set(names.values())) == 3 and names["a"].startswith("a-"), names
        a.write(21, 40)
        b.write(21, 40)
        for name, db in (("a", a), ("b", b), ("c", a)):
            wait_equal(procs, name, db)
            assert procs.admin(name)["capture"]["state"] == "running"
        # one trim registration per relay: neither trims what the other has not read
        registered = dict(sqlite3.connect(tmp_path / "a.db").execute(
            "SELECT name, acked_scn FROM _databus_relays").fetchall())
        assert set(registered) == {names["a"], names["c"]}, registered
        # the derived name is stable: a restarted relay finds its own state again
        procs.kill("a")
        a.write(61, 10)
        procs.start("a", args(a, "a.buf"))
        again = procs.admin("a")
        assert again["name"] == names["a"]
        assert again["continuity"]["note"].startswith("continuous from scn")
        a.write(71, 10)
        for name, db in (("a", a), ("b", b), ("c", a)):
            wait_equal(procs, name, db)
        # each relay writes its state on its own period: wait for the third, not only two
        expected = {f"{n}.state.json" for n in names.values()}
        wait_until(lambda: {p.name for p in bufs.glob("*.state.json")} == expected, 30,
                   f"the state files {sorted(expected)}, one per relay")


def test_a_second_relay_of_one_name_in_one_directory_is_refused_naming_both(tmp_path: Path
                                                                            ) -> None:
    db = sqlite_db(tmp_path / "shop.db")
    bufs = tmp_path / "bufs"

    def cfg(n: str, buf: str) -> list[str]:
        return config_file(tmp_path / f"{n}.yaml", {
            "name": "twin" if n != "other" else "other",
            "source": {"url": db.url, "tables": ["orders"]},
            "buffer": {"path": str(bufs / buf)}})

    with relays(tmp_path) as procs:
        url = procs.start("first", cfg("first", "a.buf"))
        line = refused(cfg("second", "b.buf"))
        assert line.startswith("databus: ConfigError: refusing to start relay twin: its state")
        assert f"held by relay twin, pid {procs.procs['first'].pid}" in line
        assert url in line and str(bufs / "a.buf") in line
        # another name on the same buffer file: refused too
        line = refused(cfg("other", "a.buf"))
        assert "refusing to start relay other: its buffer file" in line
        assert "held by relay twin" in line
        db.write(1, 5)
        wait_equal(procs, "first", db)  # the first went on undisturbed


def test_state_and_registrations_from_before_derived_names(tmp_path: Path) -> None:
    """A ``relay`` state file written before names were derived: a relay with a
    derived name refuses it naming --name relay; with --name relay it continues; once
    rewritten (it records its name) a relay with a derived name in the same directory
    starts beside it with its own state, never adopting it. A trim registration
    ``relay`` in the database is refused the same way."""
    db = sqlite_db(tmp_path / "shop.db")
    db.write(1, 10)
    state = tmp_path / "state"

    def config(name: str | None, buf: str, state_dir: Path = state) -> Any:
        return parse_config({"source": {"url": db.url, "tables": ["orders"],
                                        "poll_interval": 0.01},
                             **({"name": name} if name else {}),
                             "buffer": {"path": str(tmp_path / buf), "flush_interval": 0.1},
                             "state_dir": str(state_dir), "http": {"port": 0}})

    with Relay(config("relay", "old.buf")) as old:  # what every relay was
        wait_until(lambda: old.buffer.max_scn > 0 and (state / "relay.state.json").exists(), 10,
                   "the old relay's state")
    legacy = json.loads((state / "relay.state.json").read_text())
    del legacy["name"]  # as written before
    (state / "relay.state.json").write_text(json.dumps(legacy))
    (tmp_path / "old.buf").unlink()  # memory-like: only the state says where it was
    with pytest.raises(ConfigError, match="start it with --name relay") as err:
        Relay(config(None, "new.buf"))
    assert "relay.state.json" in str(err.value)
    db.write(11, 5)
    with Relay(config("relay", "old.buf")) as kept:
        assert kept.continuity.startswith("continuous from scn"), kept.continuity

        def continued() -> bool:  # from where the old relay was: every change since
            served, rows = served_rows(kept.url, "orders"), db.rows()
            return all(served.get(k) == v for k, v in rows.items() if k > 10) and all(
                rows.get(k) == v for k, v in served.items())

        wait_until(continued, 30, "the kept relay to serve every change since")
        wait_until(lambda: "name" in json.loads((state / "relay.state.json").read_text()), 10,
                   "the state rewritten with its name")
    # the database still has the registration `relay` (the relay named so uses it): a
    # relay with a derived name elsewhere is refused on it; one with a name is not
    with pytest.raises(ConfigError, match=r"trim registration .relay.*--name relay"):
        Relay(config(None, "elsewhere.buf", tmp_path / "elsewhere"))
    before = (state / "relay.state.json").read_bytes()
    with Relay(config("beside", "beside.buf")) as beside:
        assert beside.continuity.startswith("started without a recorded position")
        wait_until(lambda: served_rows(beside.url, "orders") == db.rows(), 30, "beside")
    assert (state / "relay.state.json").read_bytes() == before, "never adopted"
    assert (state / "beside.state.json").exists()


# -- MariaDB ---------------------------------------------------------------------------


@pytest.fixture
def maria_db(mariadb: MariaDB) -> Iterator[Db]:
    with mariadb.fresh_database("identity") as sa_url:
        name = sa_url.rsplit("/", 1)[1].split("?")[0]
        con = mariadb.connect(name)
        con.cursor().execute("CREATE TABLE orders (id INT PRIMARY KEY, qty INT, note TEXT)")

        def run(tx: list[tuple[str, tuple[Any, ...]]]) -> None:
            with con.cursor() as cur:
                cur.execute("BEGIN")
                for sql, params in tx:
                    cur.execute(sql, params)
                cur.execute("COMMIT")

        def select() -> list[tuple[Any, ...]]:
            with con.cursor() as cur:
                cur.execute("SELECT id, qty, note FROM orders")
                return list(cur.fetchall())

        yield Db(mariadb.url, f"{name}\\.orders", run, select)
        con.close()


def replica_hosts(server: MariaDB) -> dict[int, str]:
    with server.connect() as con, con.cursor() as cur:
        cur.execute("SHOW SLAVE HOSTS")
        return {int(r[0]): str(r[1]) for r in cur.fetchall()}


def test_mariadb_relays_on_one_server_each_have_their_server_id(
        tmp_path: Path, mariadb: MariaDB, maria_db: Db) -> None:
    db = maria_db
    db.write(1, 10)
    bufs = tmp_path / "bufs"
    with relays(tmp_path) as procs:
        for n in ("a", "b"):
            procs.start(n, ["--source", db.url, "--tables", db.tables,
                            "--buffer-path", str(bufs / f"{n}.buf")])
        db.write(11, 30)
        for n in ("a", "b"):
            wait_equal(procs, n, db)
        ids = {n: procs.admin(n)["identity"]["server_id"] for n in ("a", "b")}
        assert ids["a"] != ids["b"] and all(3_000_000_000 <= i < 4_000_000_000
                                            for i in ids.values()), ids
        hosts = replica_hosts(mariadb)
        for n in ("a", "b"):
            assert hosts[ids[n]].startswith(f"databus {procs.admin(n)['name']}@")
            fetcher = procs.admin(n)["fetcher"]
            assert fetcher["state"] == "running" and fetcher["retries"] == 0, fetcher


def test_mariadb_relays_with_one_server_id_collide_loudly(
        tmp_path: Path, mariadb: MariaDB, maria_db: Db) -> None:
    db = maria_db

    def cfg(n: str) -> list[str]:
        return config_file(tmp_path / f"{n}.yaml", {
            "name": n, "source": {"url": db.url, "tables": [db.tables], "server_id": 4242,
                                  "snapshot_mode": "no_data"},
            "buffer": {"path": str(tmp_path / f"{n}.buf")}})

    with relays(tmp_path) as procs:
        procs.start("first", cfg("first"))
        wait_until(lambda: 4242 in replica_hosts(mariadb), 20, "the first relay's dump")
        line = refused(cfg("second"))
        assert line.startswith("databus: ConfigError: server_id 4242 is already used by replica"
                               f" 'databus first@{socket.gethostname()}'"), line
        assert "'databus second@" in line and "--server-id" in line
        db.write(1, 5)
        wait_equal(procs, "first", db)
        assert procs.admin("first")["fetcher"]["retries"] == 0

        # a replica that does not say who it is takes the id: the relay's capture stops
        # with a terminal error naming the id and the remedy, not a retried warning
        file, pos = master_status(parse_mysql_url(mariadb.url))
        with BinlogStream(parse_mysql_url(mariadb.url), server_id=4242, file=file, pos=pos):
            def stopped() -> dict[str, Any]:
                a = procs.admin("first")
                return a if a["fetcher"]["state"] == "failed" else {}

            a = wait_until(stopped, 20, "the first relay's capture to stop")
        assert a["status"] == "degraded" and a["fetcher"]["retries"] == 0
        assert a["capture"]["error"].startswith("ConfigError: another replica connected")
        assert "server_id 4242" in a["capture"]["error"]
        assert "--server-id" in a["capture"]["error"]


# -- PostgreSQL -----------------------------------------------------------------------


@pytest.fixture
def pg_db(postgres: PostgreSQL) -> Iterator[tuple[Db, str]]:
    with postgres.fresh_database("identity") as sa_url:
        name = sa_url.rsplit("/", 1)[1]
        con = psycopg.connect(f"host=127.0.0.1 port={postgres.port} user=postgres dbname={name}",
                              autocommit=True)
        con.execute("CREATE TABLE orders (id int PRIMARY KEY, qty int, note text)")

        def run(tx: list[tuple[str, tuple[Any, ...]]]) -> None:
            with con.transaction():
                for sql, params in tx:
                    con.execute(sql.encode(), params)

        def select() -> list[tuple[Any, ...]]:
            return list(con.execute("SELECT id, qty, note FROM orders").fetchall())

        try:
            yield Db(postgres.source_url(name), r"public\.orders", run, select), name
        finally:  # a database with replication slots cannot be dropped
            def idle() -> bool:
                return not con.execute("SELECT 1 FROM pg_replication_slots WHERE database ="
                                       " current_database() AND active").fetchall()

            wait_until(idle, 30, "the relays' slots to be released")
            con.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                        " WHERE database = current_database()")
            con.close()


def slots(db: Db) -> dict[str, bool]:
    with psycopg.connect(db.url) as con:
        return {str(n): bool(a) for n, a in con.execute(
            "SELECT slot_name, active FROM pg_replication_slots"
            " WHERE database = current_database()").fetchall()}


def test_postgres_relays_on_one_database_each_have_their_slot(
        tmp_path: Path, pg_db: tuple[Db, str]) -> None:
    db, _ = pg_db
    db.write(1, 10)
    bufs = tmp_path / "bufs"
    with relays(tmp_path) as procs:
        for n in ("a", "b"):
            procs.start(n, ["--source", db.url, "--tables", db.tables, "--create-publication",
                            "--buffer-path", str(bufs / f"{n}.buf")])
        db.write(11, 30)
        for n in ("a", "b"):
            wait_equal(procs, n, db)
        names = {procs.admin(n)["name"] for n in ("a", "b")}
        want = {"databus_" + n.replace("-", "_") for n in names}
        assert len(want) == 2 and {s for s, active in slots(db).items() if active} == want
        origins = {procs.admin(n)["origin"] for n in ("a", "b")}
        assert len(origins) == 1 and origins.pop().startswith("postgresql:")


def test_postgres_relays_with_one_slot_collide_loudly(tmp_path: Path,
                                                      pg_db: tuple[Db, str]) -> None:
    db, _ = pg_db

    def cfg(n: str) -> list[str]:
        return config_file(tmp_path / f"{n}.yaml", {
            "name": n, "source": {"url": db.url, "tables": [db.tables], "slot": "databus_twin",
                                  "create_publication": True},
            "buffer": {"path": str(tmp_path / f"{n}.buf")}})

    with relays(tmp_path) as procs:
        procs.start("first", cfg("first"))
        wait_until(lambda: slots(db).get("databus_twin"), 30, "the first relay's slot")
        started = time.monotonic()
        line = refused(cfg("second"))
        assert time.monotonic() - started < 8, "refused at once, not waited on"
        assert line.startswith("databus: ConfigError: replication slot databus_twin is in use"
                               " by another process"), line
        assert f"databus first@{socket.gethostname()} from 127.0.0.1" in line
        assert f"this relay is databus second@{socket.gethostname()}" in line
        db.write(1, 5)
        wait_equal(procs, "first", db)


def test_a_postgres_slot_from_before_derived_names_is_refused_then_kept(
        tmp_path: Path, pg_db: tuple[Db, str]) -> None:
    db, _ = pg_db
    with psycopg.connect(db.url, autocommit=True) as con:
        con.execute("SELECT pg_create_logical_replication_slot('databus_relay', 'pgoutput')")
    args = ["--source", db.url, "--tables", db.tables, "--create-publication",
            "--buffer-path", str(tmp_path / "a.buf")]
    line = refused(args)
    assert "replication slot databus_relay" in line and "--name relay" in line, line
    raw = {"name": "relay", "source": {"url": db.url, "tables": [db.tables],
                                       "create_publication": True},
           "buffer": {"path": str(tmp_path / "a.buf")}}
    with relays(tmp_path) as procs:
        procs.start("kept", config_file(tmp_path / "kept.yaml", raw))
        db.write(1, 5)
        wait_equal(procs, "kept", db)
        assert slots(db) == {"databus_relay": True}


# -- clusters ----------------------------------------------------------------------------


def shop(path: Path) -> sqlite3.Connection:
    con = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
    con.executescript("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT);"
                      "CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER,"
                      " note TEXT);")
    return con


class OrderWriter(threading.Thread):
    """Commits one customer and one order per transaction until stopped."""

    def __init__(self, con: sqlite3.Connection, pad: int = 0) -> None:
        super().__init__(daemon=True)
        self.con, self.next, self.pad = con, 1, pad
        self.done = threading.Event()
        self.lock = threading.Lock()

    def commit(self, n: int = 1, note: str = "") -> None:
        with self.lock:
            self.con.execute("BEGIN IMMEDIATE")
            for _ in range(n):
                i = self.next
                self.con.execute("INSERT INTO customers VALUES (?, ?)", (i, f"c{i}"))
                self.con.execute("INSERT INTO orders VALUES (?, ?, ?)", (i, i, note))
                self.next += 1
            self.con.execute("COMMIT")

    def run(self) -> None:
        while not self.done.is_set():
            self.commit()
            time.sleep(0.01)

    def committed(self) -> set[int]:
        return set(range(1, self.next))


def recorded_orders(path: Path) -> set[int]:
    got: set[int] = set()
    if path.exists():
        for line in path.read_text().split("\n")[:-1]:
            got |= {int(json.loads(k)) for t, op, k in json.loads(line)["events"]
                    if t == "orders" and op == "c"}
    return got


def status(address: str) -> dict[str, Any]:
    out = subprocess.run([*DATABUS, "cluster", "status", address, "--json"], capture_output=True,
                         text=True, timeout=60, cwd=ROOT, env=ENV, check=True)
    return dict(json.loads(out.stdout))


@dataclass
class Members:
    """``databus relay --cluster`` members (default names, buffers in one directory)
    and a recorder reading the cluster address."""

    tmp: Path
    zk: ZooKeeper
    cluster: str
    db: Path
    procs: Procs = field(init=False)
    _zk: Session | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.procs = Procs(self.tmp)

    @property
    def address(self) -> str:
        return f"zk://{self.zk.hosts}/{self.cluster}"

    def start(self, member: str, *extra: str) -> None:
        self.procs.start(member, ["--cluster", self.address, "--member-id", member,
                                  "--source", f"sqlite:///{self.db}", "--tables",
                                  "customers,orders", "--snapshot-mode", "no_data",
                                  "--buffer-path", str(self.tmp / "bufs" / f"{member}.buf"),
                                  *extra])

    def view(self) -> dict[str, Any]:
        """The cluster as ``databus cluster status --json`` prints it (read in-process
        while polling: a CLI start per poll costs a second)."""
        if self._zk is None:
            self._zk = connect(ZkAddress.parse(self.address))
        return ClusterView(self._zk, ZkAddress.parse(self.address)).status()

    def leader(self) -> dict[str, Any] | None:
        leader = self.view()["leader"]
        return dict(leader) if leader else None

    def close(self) -> None:
        if self._zk is not None:
            self._zk.close()

    @property
    def recorded(self) -> set[int]:
        return recorded_orders(self.tmp / "recorded.jsonl")

    def record(self, w: OrderWriter) -> tuple[subprocess.Popen[bytes], int]:
        """A recorder on the cluster address, and the first order it received: a new
        consumer starts at the newest window, so orders are committed one by one
        until it has one; it must then receive every order from that one on."""
        proc = spawn([*DATABUS[:1], "-m", "tests.support.recorder", "--relay", self.address,
                      "--out", str(self.tmp / "recorded.jsonl"),
                      "--checkpoint", str(self.tmp / "rec.ckpt")], self.tmp / "recorder.log")

        def first() -> int:
            if not self.recorded:
                w.commit()
                time.sleep(0.2)
            return min(self.recorded, default=0)

        return proc, wait_until(first, 30, "the recorder's first order")


@contextmanager
def members(tmp: Path, zk: ZooKeeper, cluster: str) -> Iterator[tuple[Members, OrderWriter]]:
    con = shop(tmp / "shop.db")
    m = Members(tmp, zk, cluster, tmp / "shop.db")
    w = OrderWriter(con)
    try:
        yield m, w
    finally:
        w.done.set()
        if w.is_alive():
            w.join(10)
        m.procs.stop_all()
        m.close()
        con.close()


def test_a_cluster_with_buffers_in_one_directory_loses_nothing_at_a_leader_kill(
        tmp_path: Path, zookeeper: ZooKeeper) -> None:
    with members(tmp_path, zookeeper, "onedir") as (m, w):
        w.commit(5)
        m.start("m1")
        wait_until(lambda: (m.leader() or {}).get("id") == "m1", 30, "m1 to lead")
        m.start("m2")
        recorder, first = m.record(w)
        try:
            w.start()
            wait_until(lambda: len(m.recorded) > 30, 60, "the recorder to receive orders")
            m.procs.kill("m1")
            wait_until(lambda: (m.leader() or {}).get("id") == "m2", 60, "m2 to lead")
            time.sleep(1.0)  # writes go on under the new leader
            w.done.set()
            w.join(10)
            want = {i for i in w.committed() if i >= first}
            wait_until(lambda: m.recorded >= want, 60, "every committed order at the recorder")
            assert m.recorded == want
        finally:
            stop(recorder)
        names = [p.name for p in (tmp_path / "bufs").glob("*.state.json")]
        assert len(names) == 2 and all(n.startswith(("m1-", "m2-")) for n in names), names


def test_a_leader_whose_capture_stopped_gives_up_and_the_other_member_leads(
        tmp_path: Path, zookeeper: ZooKeeper) -> None:
    """m1's buffer (64 KiB) cannot hold a transaction of ~120 KiB: its capture stops
    (BufferFull, terminal). It must not stay leader: m2 takes over and captures it."""
    with members(tmp_path, zookeeper, "failing") as (m, w):
        w.commit(5)
        m.start("m1", "--buffer-size", str(64 * 1024))
        wait_until(lambda: (m.leader() or {}).get("id") == "m1"
                   and (m.leader() or {}).get("healthy"), 30, "m1 to lead, healthy")
        m.start("m2")
        recorder, first = m.record(w)
        try:
            w.commit(120, note="x" * 1000)  # one window larger than m1's buffer
            w.commit(5)

            def m2_leads() -> dict[str, Any] | None:
                leader = m.leader()
                return leader if leader and leader["id"] == "m2" and leader["healthy"] else None

            wait_until(m2_leads, 60, "m2 to lead, healthy")

            def m1_failed() -> dict[str, Any] | None:
                # m1 follows m2 once m2 leads: its capture reads m2 ("running") until
                # the same window, too large for its buffer, fails it again
                shown = status(m.address)  # `databus cluster status --json`
                record = {r["id"]: r for r in shown["members"]}
                return shown if record["m1"]["capture"]["state"] == "failed" else None

            shown = wait_until(m1_failed, 60, "m1's capture to fail following m2")
            assert shown["leader"]["id"] == "m2" and shown["leader"]["healthy"]
            record = {r["id"]: r for r in shown["members"]}
            assert record["m1"]["role"] == "follower"
            assert record["m1"]["capture"]["state"] == "failed"
            assert "BufferFull" in record["m1"]["capture"]["error"]
            assert record["m2"]["capture"] == {**record["m2"]["capture"], "state": "running",
                                               "reads": "database", "capturing": True}
            # the operator's view (docs/operations.md): m1 unhealthy, not ready
            assert not record["m1"]["healthy"] and record["m2"]["healthy"]
            text = subprocess.run([*DATABUS, "cluster", "status", m.address],
                                  capture_output=True, text=True, timeout=60, cwd=ROOT,
                                  env=ENV, check=True).stdout
            assert re.search(r"m1 +follower +capture failed +UNHEALTHY", text), text
            assert re.search(r"m2 +leader +capture running +healthy", text), text
            ready = httpx.get(f"{record['m1']['url']}/health/ready", timeout=10)
            assert ready.status_code == 503 and "failed" in ready.text, ready.text
            assert httpx.get(f"{record['m2']['url']}/health/ready", timeout=10).status_code == 200
            # databus status on the cluster address: each member's capture and consumers
            out = subprocess.run([*DATABUS, "status", "--relay", m.address],
                                 capture_output=True, text=True, timeout=60, cwd=ROOT, env=ENV)
            assert out.returncode == 0, out.stderr
            heads = [x for x in out.stdout.splitlines() if x.startswith("relay ")]
            assert len(heads) == 2, out.stdout
            assert any(record["m1"]["url"] in x and "capture failed" in x for x in heads)
            assert any(record["m2"]["url"] in x and "capture running" in x for x in heads)
            want = {i for i in w.committed() if i >= first}
            wait_until(lambda: m.recorded == want, 60, "every committed order at the recorder")
            assert "gives up leading" in (tmp_path / "m1.log").read_text()
        finally:
            stop(recorder)


def test_the_cluster_example_script_runs_as_documented(tmp_path: Path) -> None:
    """docs/cluster.md §6: scripts/cluster-example.sh exactly as written."""
    out = subprocess.run(["bash", "scripts/cluster-example.sh", str(tmp_path / "work")],
                         capture_output=True, text=True, timeout=600, cwd=ROOT, env=ENV)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "replica equals the source" in out.stdout, out.stdout
    assert "new leader: r" in out.stdout, out.stdout
