"""PostgreSQL -> ``databus relay`` (a process, persistent buffer) -> a recording consumer.

Two writer threads commit random transactions over three tables at once (their
statements interleave; their COMMITs are taken one at a time, so the order of
commits is known), some rolled back. The relay is killed with SIGKILL at random
points and PostgreSQL restarted during capture. At the end the recorded windows
are exactly the committed transactions, in commit order, each whole in one window
(``tests/support/verify.py``), and after every kill the slot's confirmed LSN was
not ahead of what the relay had made durable.

Sizes: ``DATABUS_PG_WORKLOAD_TXNS`` transactions (default 6,000; the issue's full
run is 50,000) and ``DATABUS_PG_KILLS`` relay kills (default 3; full run 10).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.support.pipeline import ProcessPipeline
from tests.support.postgres import SETTINGS, PostgreSQL
from tests.support.procs import DATABUS, free_port
from tests.support.shop import Change
from tests.support.verify import check_delivery, read_windows

TXNS = int(os.environ.get("DATABUS_PG_WORKLOAD_TXNS", "6000"))
KILLS = int(os.environ.get("DATABUS_PG_KILLS", "3"))
# the suite's size: small enough that windows are evicted (6,000 transactions are about
# 2.2 MB), so the relay acknowledges and the slot moves, large enough for the recorder's
# lag after a kill on loaded cores (about 14 s of paced writing); a full run keeps
# everything (the recorder, one Python process, falls behind two writers by more than a
# small buffer holds)
BUFFER = 2 * 1024 * 1024 if TXNS <= 10_000 else TXNS * 1200

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


@dataclass
class Pipeline(ProcessPipeline):
    tmp: Path
    server: PostgreSQL
    db: str
    port: int = field(default_factory=free_port)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def record(self) -> Path:
        return self.tmp / "recorded.jsonl"

    def args(self, name: str) -> list[str]:
        if name == "relay":
            return [*DATABUS, "relay", "--source", self.server.source_url(self.db),
                    "--tables", r"public\..*", "--snapshot-mode", "no_data",
                    "--buffer-path", str(self.tmp / "relay.buf"), "--port", str(self.port),
                    "--buffer-size", str(BUFFER)]
        return [sys.executable, "-m", "tests.support.recorder", "--relay", self.url,
                "--out", str(self.record), "--checkpoint", str(self.tmp / "recorder.ckpt")]

    def ready_url(self, name: str) -> str | None:
        return f"{self.url}/admin" if name == "relay" else None

    def slot_confirmed(self) -> int:
        with psycopg.connect(f"host=127.0.0.1 port={self.server.port} user=postgres"
                             f" dbname={self.db}") as con:
            row = con.execute("SELECT (confirmed_flush_lsn - '0/0')::bigint FROM"
                              " pg_replication_slots WHERE slot_name = 'databus_relay'"
                              ).fetchone()
        assert row is not None, "the relay's slot is gone"
        return int(row[0])

    def durable_scn(self) -> int:
        state = json.loads((self.tmp / "relay.state.json").read_text())
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

        self.wait(f"{changes} changes recorded", done, timeout, interval=0.5)


@pytest.fixture
def pipeline(tmp_path: Path) -> Iterator[Pipeline]:
    # commits reach the OS before they return: the restart test crashes the server
    settings = {**SETTINGS, "synchronous_commit": "on"}
    with PostgreSQL(settings=settings) as server:
        server.execute("CREATE DATABASE shop")
        server.execute(*SCHEMA, db="shop")
        with Pipeline(tmp_path, server, "shop") as p:
            p.start("relay")
            p.wait_streaming()
            p.start("recorder")
            yield p


def _run_writers(p: Pipeline, n: int, pause: threading.Lock, done: threading.Event
                 ) -> tuple[list[Writer], list[list[Change]], list[list[Change]],
                            list[threading.Thread], list[BaseException]]:
    commits = threading.Lock()
    committed: list[list[Change]] = []
    rolled_back: list[list[Change]] = []
    errors: list[BaseException] = []
    writers = [Writer(p.server, p.db, i, 100 + i, commits, committed, rolled_back)
               for i in range(2)]

    def write(w: Writer) -> None:
        try:
            while not done.is_set() and len(committed) + len(rolled_back) < n:
                with pause:
                    w.transaction()
                time.sleep(0.003)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(w,)) for w in writers]
    for t in threads:
        t.start()
    return writers, committed, rolled_back, threads, errors


def _data_windows(p: Pipeline) -> int:
    """Windows with events (one per transaction; empty progress windows aside)."""
    return len({scn for scn, events in read_windows(p.record) if events})


@pytest.mark.slow
def test_two_writers_with_relay_kills_deliver_every_transaction_whole_in_order(
        pipeline: Pipeline) -> None:
    p = pipeline
    created = p.slot_confirmed()
    pause = threading.Lock()
    done = threading.Event()
    writers, committed, rolled_back, threads, errors = _run_writers(p, TXNS, pause, done)
    rng = random.Random(5)
    checked = 0
    try:
        for _ in range(KILLS):
            time.sleep(rng.uniform(0.5, 2.0))
            p.kill("relay")
            # the slot never went past what the relay had made durable
            if (p.tmp / "relay.state.json").exists():
                confirmed, durable = p.slot_confirmed(), p.durable_scn()
                assert confirmed <= durable or durable < 0, (confirmed, durable)
                checked += 1
            time.sleep(rng.uniform(0.0, 0.5))
            p.start("relay")
        for t in threads:
            t.join(600)
    finally:
        done.set()
        for w in writers:
            w.con.close()
    assert not errors, errors
    p.wait_delivered(sum(len(t) for t in committed))
    stats = check_delivery(read_windows(p.record), committed, rolled_back)
    assert _data_windows(p) == len(committed) and checked == KILLS
    final = p.slot_confirmed()
    assert created < final <= p.durable_scn()  # it moved, never past the durable state
    print(f"postgres workload: {stats}, {KILLS} relay kills, slot {created} -> {final}")


@pytest.mark.slow
def test_postgres_restart_during_capture_the_relay_reconnects_and_resumes(
        pipeline: Pipeline) -> None:
    p = pipeline
    pause = threading.Lock()
    done = threading.Event()
    n = min(TXNS, 1500)
    writers, committed, rolled_back, threads, errors = _run_writers(p, n, pause, done)
    try:
        for _ in range(2):
            time.sleep(1.0)
            with pause:  # no transaction in flight: a COMMIT cut by the restart is unknown
                # a crash and recovery: a fast shutdown would wait for the relay to confirm
                # everything sent, which it does only for what its buffer no longer needs
                p.server.restart("immediate")
                for w in writers:
                    w.con.close()
                    w.con = w.connect()
        for t in threads:
            t.join(600)
    finally:
        done.set()
        for w in writers:
            w.con.close()
    assert not errors, errors
    p.wait_delivered(sum(len(t) for t in committed))
    check_delivery(read_windows(p.record), committed, rolled_back)
    assert _data_windows(p) == len(committed)
    admin = httpx.get(f"{p.url}/admin", timeout=10).json()
    assert "slot_lag_bytes" in json.dumps(admin)


def test_bad_setup_is_one_line_and_a_nonzero_exit(postgres: PostgreSQL, tmp_path: Path) -> None:
    with postgres.fresh_database("pgbad") as url:
        db = url.rsplit("/", 1)[1]
        postgres.execute("CREATE TABLE nokey (a int)", db=db)
        out = subprocess.run(
            [*DATABUS, "relay", "--source", postgres.source_url(db), "--tables",
             r"public\.nokey", "--snapshot-mode", "no_data", "--port", str(free_port())],
            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.startswith("databus:")]
    assert len(lines) == 1 and "no primary key and REPLICA IDENTITY DEFAULT" in lines[0], \
        out.stderr
