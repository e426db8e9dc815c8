"""MariaDB -> ``databus relay`` (snapshot_mode initial) -> ``databus bootstrap``
-> ``databus replicate --bootstrap``, each its own process, for the bootstrap
tests with the MariaDB source (tests/e2e/test_bootstrap_mysql.py).

The writer thread runs the random workload of tests/support/mysql_workload.py
(int primary-key changes on ``orders`` included) and, every few transactions,
an UPDATE that changes the composite primary key of an ``items`` row.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pymysql
import sqlalchemy as sa

from databus.core import event as ev
from databus.core.schema import SchemaRegistry
from tests.support.mariadb import MariaDB
from tests.support.mysql_workload import (
    KEYS,
    Workload,
    checksum,
    connect_writer,
    mariadb_checksums,
    table_diff,
)
from tests.support.pipeline import ProcessPipeline, http_url, replicate_args, write_config
from tests.support.procs import DATABUS, free_port
from tests.support.sql import sql_engine


class Writer(threading.Thread):
    """Commits workload transactions until stopped; ``ddl`` set -> ALTER TABLE
    accounts ADD COLUMN tier (once); ``ddl2`` set -> ALTER TABLE items ADD COLUMN
    note (once), which item moves then fill; every 10th transaction moves an
    item to another composite key. Errors are kept in ``error`` (checked by the
    test)."""

    def __init__(self, port: int, seed: int, pause: float = 0.003) -> None:
        super().__init__(daemon=True)
        self.w = Workload(connect_writer(port), seed=seed, rollback_ratio=0.02)
        self.rng = random.Random(seed + 1)
        self.pause = pause
        self.stop = threading.Event()
        self.ddl = threading.Event()
        self.ddl2 = threading.Event()
        self.items_note = False
        self.moved: list[tuple[tuple[int, int], tuple[int, int]]] = []
        self.count = 0
        self.error: BaseException | None = None

    def move_item(self) -> None:
        live = self.w.live["items"]
        old = live.sample(self.rng, 1)
        orders = self.w.live["orders"].sample(self.rng, 1)
        if not old or not orders:
            return
        free = [(orders[0], ln) for ln in range(1, 5) if (orders[0], ln) not in live]
        if not free:
            return
        new = free[0]
        with self.w.con.cursor() as cur:
            note = ", note = 'moved'" if self.items_note else ""
            cur.execute(f"UPDATE items SET order_id = %s, line = %s, qty = qty + 1{note}"
                        " WHERE order_id = %s AND line = %s", (*new, *old[0]))
        live.remove(old[0])
        live.add(new)
        self.moved.append((old[0], new))

    def step(self) -> None:
        if self.ddl.is_set():
            self.w.maybe_ddl(0.3)  # only the ADD COLUMN of the workload's DDL
        if self.ddl2.is_set() and not self.items_note:
            with self.w.con.cursor() as cur:
                cur.execute("ALTER TABLE items ADD COLUMN note VARCHAR(20)")
            self.items_note = True
        self.w.transaction()
        self.count += 1
        if self.count % 10 == 0:
            self.move_item()

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.step()
                self.stop.wait(self.pause)
        except BaseException as exc:  # reported by the test (finish)
            self.error = exc

    def finish(self) -> None:
        self.stop.set()
        if self.is_alive():
            self.join(60)
        if self.w.con.open:
            self.w.con.close()
        assert self.error is None, f"writer failed: {self.error!r}"


@dataclass
class Pipeline(ProcessPipeline):
    tmp: Path
    server: MariaDB
    store_url: str
    target: str
    relay_buffer: int = 1 << 20
    batch: int = 500
    relay_port: int = field(default_factory=free_port)
    bs_port: int = field(default_factory=free_port)

    @property
    def relay(self) -> str:
        return http_url(self.relay_port)

    @property
    def bs(self) -> str:
        return http_url(self.bs_port)

    def write_configs(self) -> None:
        write_config(self.tmp / "relay.yaml", {
            "name": "bsm", "source": {"url": self.server.url, "tables": [r"shop\..*"],
                                      "snapshot_mode": "initial", "snapshot_chunk_size": 200},
            "buffer": {"capacity_bytes": self.relay_buffer, "path": str(self.tmp / "relay.buf"),
                       "flush_interval": 0.2},
            "http": {"port": self.relay_port}})
        write_config(self.tmp / "bootstrap.yaml", {
            "relay": self.relay, "store": {"url": self.store_url},
            "http": {"port": self.bs_port}, "poll_timeout": 0.5, "apply_interval": 0.05})

    def args(self, name: str) -> list[str]:
        if name in ("relay", "bootstrap"):
            return [*DATABUS, name, "--config", str(self.tmp / f"{name}.yaml")]
        return replicate_args(self.relay, self.target, "--bootstrap", self.bs,
                              "--bootstrap-batch", str(self.batch))

    def ready_url(self, name: str) -> str | None:
        return {"relay": f"{self.relay}/admin", "bootstrap": f"{self.bs}/admin"}.get(name)

    def relay_scn(self, which: str) -> int:
        return int(httpx.get(f"{self.relay}/containerStats/buffer/{which}", timeout=10).json())

    def relay_stat(self, name: str) -> float:
        text = httpx.get(f"{self.relay}/metrics", timeout=10).text
        for line in text.splitlines():  # docs/operations.md: databus_relay_source_<stat>
            if line.startswith(f"databus_relay_source_{name} "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def wait_relay_dump(self, timeout: float = 120.0) -> None:
        """Until the relay streams the binlog (it starts at the binlog's end)."""
        self.wait_dump(self.server, timeout)

    def consumer_checkpoint(self) -> dict[str, Any] | None:
        """The replicate sink's committed checkpoint (what survives a kill -9)."""
        engine = sa.create_engine(self.target)
        try:
            with engine.connect() as conn:
                row = conn.execute(sa.text(
                    "SELECT checkpoint FROM databus_checkpoint")).first()
        except sa.exc.DBAPIError:  # no checkpoint table yet
            return None
        finally:
            engine.dispose()
        return None if row is None else dict(json.loads(row[0]))

    def mode(self) -> str | None:
        cp = self.consumer_checkpoint()
        return None if cp is None else str(cp.get("consumption_mode"))

    def equal(self) -> bool:
        src = table_sums(self.server.url.replace("mysql://", "mysql+pymysql://")
                         + "/shop?charset=utf8mb4")
        return bool(src) and table_sums(self.target, list(src)) == src

    def wait_equal(self, timeout: float = 300.0) -> float:
        """Seconds until the replica equals MariaDB (every table, columns included)."""
        t0 = time.monotonic()
        deadline = t0 + timeout
        while time.monotonic() < deadline:
            self.alive()
            if self.equal():
                return time.monotonic() - t0
            time.sleep(0.5)
        diffs = {t: table_diff(self.server.port, self.target, t)
                 for t in mariadb_checksums(self.server.port) if t in KEYS}
        raise AssertionError(f"replica not equal to MariaDB: {diffs}; logs in {self.tmp}")


_DATETIME = re.compile(r"^\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(\.\d{1,6})?$")


def _value(v: Any) -> Any:
    """Datetimes that a target keeps as text (SQLite) compare as datetimes."""
    if isinstance(v, str) and _DATETIME.match(v):
        return dt.datetime.fromisoformat(v)
    return v


def table_sums(url: str, tables: list[str] | None = None
               ) -> dict[str, tuple[list[str], int, str]]:
    """{table: (sorted columns, rows, order-independent digest)} of the workload's
    tables at ``url`` (all of them, or those of ``tables``; missing ones left out),
    values normalised (tests/support/mysql_workload.checksum, plus :func:`_value`)."""
    engine = sa.create_engine(url)
    out = {}
    try:
        with engine.connect() as conn:
            have = set(sa.inspect(conn).get_table_names())
            for table in tables if tables is not None else sorted(have & set(KEYS)):
                if table not in have:
                    continue
                q = conn.dialect.identifier_preparer.quote(table)
                res = conn.execute(sa.text(f"SELECT * FROM {q}"))
                cols = list(res.keys())
                rows = (tuple(_value(v) for v in r) for r in res)
                out[table] = (sorted(cols), *checksum(cols, rows))
    finally:
        engine.dispose()
    return out


def snapshot_keys(store_url: str) -> dict[str, set[tuple[Any, ...]]]:
    """{table: primary-key tuples} of the rows in a bootstrap store's snapshot,
    decoded from the stored events with the store's schema registry."""
    with sql_engine(store_url) as engine, engine.connect() as conn:
        reg = conn.execute(sa.text("SELECT v FROM dbus_bs_meta WHERE k = 'registry'")
                           ).scalar_one()
        evs = [bytes(r[0]) for r in conn.execute(sa.text("SELECT ev FROM dbus_bs_snapshot"))]
    registry = SchemaRegistry.from_json(reg)
    out: dict[str, set[tuple[Any, ...]]] = {}
    for data in evs:
        for e in ev.iter_events(data):
            schema = registry.get(e.schema_id)
            table = schema.name.rsplit(".", 1)[-1]
            if table not in KEYS:
                continue
            fields = {f.get("column", f["name"]): f["name"] for f in schema.avro["fields"]}
            row = schema.decode(e.payload)
            out.setdefault(table, set()).add(tuple(row[fields.get(k, k)] for k in KEYS[table]))
    return out


def mariadb_keys(server: MariaDB) -> dict[str, set[tuple[Any, ...]]]:
    with server.connect("shop") as con:
        out: dict[str, set[tuple[Any, ...]]] = {}
        with con.cursor() as cur:
            for table, key in KEYS.items():
                try:
                    cur.execute(f"SELECT {', '.join(key)} FROM {table}")
                except pymysql.err.ProgrammingError:  # audit does not exist in every run
                    continue
                out[table] = {tuple(r) for r in cur.fetchall()}
    return out
