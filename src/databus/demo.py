"""``databus demo``: the whole path on the embedded default, in one process.

A SQLite shop database, a relay capturing it, a writer committing random
transactions to three tables, a consumer printing the changes live, and a
replicate sink into a second SQLite file. At the end the replica is compared
with the source, row for row, and the result is printed (exit status 1 if they
differ).
"""

from __future__ import annotations

import random
import shutil
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from databus.client import ClientConfig, Consumer, DatabusClient, FileCheckpointStore
from databus.client.sinks import ReplicateSink
from databus.relay.config import parse_config
from databus.relay.relay import Relay

TABLES = {
    "customers": "CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL,"
                 " city TEXT, balance REAL)",
    "orders": "CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL,"
              " status TEXT, total REAL)",
    "order_lines": "CREATE TABLE order_lines (order_id INTEGER, line INTEGER, sku TEXT,"
                   " qty INTEGER, PRIMARY KEY (order_id, line))",
}
CITIES = ["Lisbon", "Kraków", "Osaka", "Lagos", "Quito", "Tromsø"]
STYLE = {"c": "green", "u": "yellow", "d": "red", "r": "cyan", "t": "magenta"}


class LivePrinter(Consumer):
    """Prints one line per change."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.windows = 0
        self.events = 0

    def on_data_event(self, event: Any) -> None:
        self.events += 1
        op = event.op.letter
        row = event.after if event.after is not None else event.before
        self.console.print(f"[{STYLE.get(op, 'white')}]{op}[/] scn={event.scn:<6} "
                           f"{event.source:<17} {row}", highlight=False)

    def on_end_data_event_sequence(self, scn: int) -> None:
        self.windows += 1


def _write(db: Path, transactions: int, stop: threading.Event, rng: random.Random) -> int:
    con = sqlite3.connect(db, isolation_level=None, timeout=30)
    committed = 0
    try:
        for _ in range(transactions):
            if stop.is_set():
                break
            con.execute("BEGIN IMMEDIATE")
            cid = rng.randrange(1, 60)
            con.execute("INSERT INTO customers VALUES (?,?,?,?) ON CONFLICT(id) DO UPDATE"
                        " SET balance = balance + excluded.balance",
                        (cid, f"customer {cid}", rng.choice(CITIES), round(rng.random() * 100, 2)))
            oid = con.execute("INSERT INTO orders (customer_id, status, total) VALUES (?,?,?)",
                              (cid, "new", 0.0)).lastrowid
            for line in range(1, rng.randrange(2, 5)):
                con.execute("INSERT INTO order_lines VALUES (?,?,?,?)",
                            (oid, line, f"SKU-{rng.randrange(1000):03d}", rng.randrange(1, 9)))
            con.execute("UPDATE orders SET status='placed', total=? WHERE id=?",
                        (round(rng.random() * 500, 2), oid))
            if rng.random() < 0.15:
                victim = con.execute("SELECT id FROM orders ORDER BY random() LIMIT 1").fetchone()
                con.execute("DELETE FROM order_lines WHERE order_id=?", victim)
                con.execute("DELETE FROM orders WHERE id=?", victim)
            if rng.random() < 0.1:
                con.execute("ROLLBACK")  # never reaches a consumer
            else:
                con.execute("COMMIT")
                committed += 1
            stop.wait(rng.uniform(0.005, 0.03))
    finally:
        con.close()
    return committed


def _rows(db: Path, table: str) -> list[tuple[Any, ...]]:
    con = sqlite3.connect(db)
    try:
        order = "order_id, line" if table == "order_lines" else "id"
        return list(con.execute(f"SELECT * FROM {table} ORDER BY {order}"))
    finally:
        con.close()


def run_demo(workdir: Path, transactions: int, quiet: bool, console: Console) -> bool:
    """Run the demo in ``workdir`` (recreated); True when the replica equals the source."""
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    db, replica = workdir / "shop.db", workdir / "replica.db"
    con = sqlite3.connect(db)
    for ddl in TABLES.values():
        con.execute(ddl)
    con.commit()
    con.close()

    relay = Relay(parse_config({
        "source": {"url": f"sqlite:///{db}", "tables": list(TABLES), "poll_interval": 0.02},
        "buffer": {"path": str(workdir / "relay.buf"), "capacity_bytes": 16 * 1024 * 1024},
        "http": {"port": 0},
    }))
    relay.start()
    console.print(f"[bold]relay[/] capturing {db} ({', '.join(TABLES)}) at {relay.url}")
    stop = threading.Event()
    printer = LivePrinter(console) if not quiet else Consumer()
    clients = [
        DatabusClient(ClientConfig(relay=relay.url, poll_timeout=0.5), printer,
                      FileCheckpointStore(workdir / "printer.ckpt")),
        DatabusClient(ClientConfig(relay=relay.url, poll_timeout=0.5),
                      ReplicateSink(f"sqlite:///{replica}"),
                      FileCheckpointStore(workdir / "replicate.ckpt")),
    ]
    threads = [threading.Thread(target=c.run, kwargs={"stop": stop}, daemon=True)
               for c in clients]
    for t in threads:
        t.start()
    try:
        committed = _write(db, transactions, threading.Event(), random.Random(7))
        console.print(f"[bold]writer[/] committed {committed} transactions; waiting for the"
                      " replica to catch up")
        ok = False
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if replica.exists():
                try:
                    ok = all(_rows(db, t) == _rows(replica, t) for t in TABLES)
                except sqlite3.OperationalError:  # tables not created yet
                    ok = False
            if ok:
                break
            stop.wait(0.25)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        relay.stop()
    rows = sum(len(_rows(db, t)) for t in TABLES)
    if ok:
        console.print(f"[bold green]replica equals source[/]: {rows} rows in {len(TABLES)}"
                      f" tables, {committed} transactions")
    else:
        console.print("[bold red]replica differs from source[/]")
        for name in TABLES:
            a, b = _rows(db, name), _rows(replica, name) if replica.exists() else []
            if a != b:
                console.print(f"  {name}: source {len(a)} rows, replica {len(b)} rows")
    return ok
