"""A relay process over a private PostgreSQL and a recorder reading it: the harness
of the PostgreSQL e2e tests.

``shop_pipeline(tmp)`` is the common start: a private server with database ``shop``
holding ``SCHEMA``, a pipeline (``Pipeline`` or a subclass) whose relay streams from its
slot and whose recorder runs. ``Writer.recording(...)`` is a writer with lists of its
own; writers sharing lists are built with the constructor."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import httpx
import psycopg

from tests.support.pipeline import RelayPipeline, recorder_args, relay_args, relay_max_scn
from tests.support.postgres import SETTINGS, PostgreSQL
from tests.support.procs import free_port
from tests.support.shop import Change
from tests.support.verify import read_windows


@dataclass
class Pipeline(RelayPipeline):
    tmp: Path
    server: PostgreSQL
    db: str
    port: int = field(default_factory=free_port)
    buffer: int = 2 * 1024 * 1024  # bytes of the relay's buffer

    def args(self, name: str) -> list[str]:
        if name == "relay":
            return relay_args(self.port, source=self.server.source_url(self.db),
                              tables=r"public\..*", buffer_path=self.tmp / "relay.buf",
                              buffer_size=self.buffer,
                              # named, as SCHEMA's publication and the checks below expect
                              more=("--slot", "databus_relay",
                                    "--publication", "databus_relay"))
        return recorder_args(self.url, self.record, self.tmp / "recorder.ckpt")

    def slot_confirmed(self) -> int:
        with psycopg.connect(f"host=127.0.0.1 port={self.server.port} user=postgres"
                             f" dbname={self.db}") as con:
            row = con.execute("SELECT (confirmed_flush_lsn - '0/0')::bigint FROM"
                              " pg_replication_slots WHERE slot_name = 'databus_relay'"
                              ).fetchone()
        assert row is not None, "the relay's slot is gone"
        return int(row[0])

    def durable_scn(self) -> int:
        (path,) = self.tmp.glob("*.state.json")  # the relay's derived name
        state = json.loads(path.read_text())
        return int(state["max_scn"])

    def wait_streaming(self) -> None:
        """Until the relay's slot is active (it was created at the relay's first read)."""
        def active() -> bool:
            with psycopg.connect(f"host=127.0.0.1 port={self.server.port} user=postgres"
                                 f" dbname={self.db}") as con:
                row = con.execute("SELECT active FROM pg_replication_slots"
                                  " WHERE slot_name = 'databus_relay'").fetchone()
            return bool(row and row[0])

        self.wait("the relay to stream from its slot", active, 60, interval=0.2)

    def wait_delivered(self, changes: int, timeout: float = 300.0) -> None:
        def done() -> bool:
            seen: dict[int, int] = {}
            for scn, events in read_windows(self.record):
                seen[scn] = len(events)
            return sum(seen.values()) >= changes

        try:
            self.wait(f"{changes} changes recorded", done, timeout, interval=0.5)
        except AssertionError as exc:
            windows = dict(read_windows(self.record))
            try:
                held: object = relay_max_scn(self.url)
            except httpx.HTTPError as why:
                held = why
            raise AssertionError(
                f"recorded {sum(map(len, windows.values()))} changes in {len(windows)} windows"
                f" up to scn {max(windows, default=-1)}; the relay holds up to scn {held};"
                f" the slot is confirmed to {self.slot_confirmed()}\n{exc}") from None


@contextmanager
def shop_pipeline(tmp: Path, kind: type[Pipeline] = Pipeline, *,
                  shutdown: str = "smart") -> Iterator[Pipeline]:
    """See the module docstring. After the block the pipeline stops, then the server
    (by a ``shutdown`` of that mode first: ``fast`` ends sessions a smart one waits for)."""
    with PostgreSQL(settings=SETTINGS) as server:
        server.execute("CREATE DATABASE shop")
        server.execute(*SCHEMA, db="shop")
        with kind(tmp, server, "shop") as p:
            p.start("relay")
            p.wait_streaming()
            p.start("recorder")
            yield p
        server.shutdown(shutdown)


SCHEMA = [
    "CREATE TABLE accounts (id int PRIMARY KEY, owner text NOT NULL, balance numeric(14,2),"
    " note text, n int NOT NULL)",
    "CREATE TABLE orders (id bigint PRIMARY KEY, account int, amount numeric(12,2),"
    " placed timestamptz, doc jsonb, rev int NOT NULL)",
    "CREATE TABLE items (order_id bigint NOT NULL, line int NOT NULL, sku text,"
    " qty int NOT NULL, PRIMARY KEY (order_id, line))",
    "CREATE PUBLICATION databus_relay FOR TABLE accounts, orders, items",
]
TABLES = ["accounts", "orders", "items"]


class Writer:
    """One connection committing random transactions on its own keys (ids = k * 2 +
    ``number``), recording the row changes of each (table, op, key as JSON text)."""

    def __init__(self, server: PostgreSQL, db: str, number: int, seed: int,
                 commits: threading.Lock, committed: list[list[Change]],
                 rolled_back: list[list[Change]]) -> None:
        self.server, self.db, self.number = server, db, number
        self.rng = random.Random(seed)
        self.commits, self.committed, self.rolled_back = commits, committed, rolled_back
        self.keys: dict[str, list[Any]] = {t: [] for t in TABLES}
        self.next_id = 1
        self.con = self.connect()

    @classmethod
    def recording(cls, server: PostgreSQL, db: str, seed: int) -> Self:
        """A writer (number 0) whose lock and ``committed``/``rolled_back`` are its own."""
        return cls(server, db, 0, seed, threading.Lock(), [], [])

    def connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(f"host=127.0.0.1 port={self.server.port} user=postgres"
                               f" dbname={self.db}")

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id * 2 + self.number

    def _statement(self, keys: dict[str, list[Any]], changes: list[Change]) -> None:
        rng, cur = self.rng, self.con
        table = rng.choice(TABLES)
        existing = keys[table]
        op = rng.choice("cuud") if existing else "c"
        if op == "c":
            if table == "items":
                key: Any = [self._new_id(), rng.randint(1, 5)]
                cur.execute("INSERT INTO items VALUES (%s, %s, %s, %s)",
                            [*key, f"sku-{rng.randint(0, 999)}", rng.randint(1, 9)])
            else:
                key = self._new_id()
                if table == "accounts":
                    cur.execute("INSERT INTO accounts VALUES (%s, %s, %s, %s, 0)",
                                [key, rng.choice(["Zoë", "O'Brien", "山田", ""]),
                                 f"{rng.randint(-9999, 99999)}.{rng.randint(0, 99):02d}",
                                 None if rng.random() < 0.3 else "x" * rng.randint(0, 300)])
                else:
                    cur.execute("INSERT INTO orders VALUES (%s, %s, %s, now(), %s, 0)",
                                [key, rng.randint(1, 100), f"{rng.randint(0, 9999)}.50",
                                 json.dumps({"lines": rng.randint(0, 5)})])
            existing.append(key)
        else:
            key = existing.pop(rng.randrange(len(existing)))
            where = "order_id = %s AND line = %s" if table == "items" else "id = %s"
            params = key if table == "items" else [key]
            if op == "u":
                sets = {"accounts": "n = n + 1, balance = balance + 1",
                        "orders": "rev = rev + 1, amount = amount * 2",
                        "items": "qty = qty + 1"}[table]
                cur.execute(f"UPDATE {table} SET {sets} WHERE {where}", params)
                existing.append(key)
            else:
                cur.execute(f"DELETE FROM {table} WHERE {where}", params)
        changes.append((table, op, json.dumps(key)))

    def transaction(self) -> None:
        keys = {t: list(v) for t, v in self.keys.items()}
        changes: list[Change] = []
        for _ in range(self.rng.randint(1, 4)):
            self._statement(keys, changes)
        if self.rng.random() < 0.05:
            self.con.rollback()
            self.rolled_back.append(changes)
            return
        with self.commits:  # one COMMIT at a time: the commit order is this list's
            self.con.commit()
            self.committed.append(changes)
        self.keys = keys
