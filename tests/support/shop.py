"""A small shop schema on SQLite and a writer committing random transactions.

The writer records, for every committed transaction, the exact sequence of row
changes it made (table, op, key), in statement order, so tests can compare what
consumers received with what the database committed. Rolled-back transactions
are recorded separately and must never be seen.
"""

from __future__ import annotations

import base64
import json
import random
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa

SCHEMA = [
    "CREATE TABLE IF NOT EXISTS customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL,"
    " balance REAL, tx INTEGER)",
    "CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, customer_id INTEGER,"
    " note TEXT, payload BLOB, tx INTEGER)",
    "CREATE TABLE IF NOT EXISTS items (order_id INTEGER NOT NULL, line INTEGER NOT NULL,"
    " sku TEXT, qty INTEGER, tx INTEGER, PRIMARY KEY (order_id, line))",
]
TABLES = ["customers", "orders", "items"]

Change = tuple[str, str, str]  # (table, op letter, key as JSON text)


def create_shop(path: Path) -> None:
    con = sqlite3.connect(path)
    try:
        for stmt in SCHEMA:
            con.execute(stmt)
        con.commit()
    finally:
        con.close()


def key_text(table: str, key: object) -> str:
    return json.dumps(key)


@dataclass
class Writer:
    """Commits random transactions (1-20 row changes over 3 tables)."""

    path: Path
    seed: int = 1
    rollback_ratio: float = 0.1
    committed: list[list[Change]] = field(default_factory=list)
    rolled_back: list[list[Change]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.con = sqlite3.connect(self.path, timeout=30, isolation_level=None,
                                   check_same_thread=False)
        self.con.execute("PRAGMA busy_timeout=30000")
        self.live: dict[str, set[object]] = {t: set() for t in TABLES}
        for t in TABLES:
            cols = "order_id, line" if t == "items" else "id"
            for row in self.con.execute(f"SELECT {cols} FROM {t}"):
                self.live[t].add(tuple(row) if t == "items" else row[0])
        self.next_id = 1 + max(
            [0, *[k for t in ("customers", "orders") for k in self.live[t]]]  # type: ignore[list-item]
        )
        self.txn = len(self.committed)

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.con.close()

    def _one(self, tx: int, live: dict[str, set[object]]) -> Change:
        rng = self.rng
        table = rng.choice(TABLES)
        keys = live[table]
        op = rng.choices(["c", "u", "d"], weights=[5, 3, 2])[0]
        if op != "c" and not keys:
            op = "c"
        con = self.con
        if table == "items":
            if op == "c":
                key: object = (rng.randrange(1, 500), rng.randrange(1, 50))
                while key in keys:
                    key = (rng.randrange(1, 500), rng.randrange(1, 50))
                con.execute("INSERT INTO items VALUES (?,?,?,?,?)",
                            (*key, f"sku-{rng.randrange(10**6)}", rng.randrange(100), tx))  # type: ignore[misc]
            else:
                key = rng.choice(sorted(keys))  # type: ignore[type-var]
                if op == "u":
                    con.execute("UPDATE items SET qty=?, tx=? WHERE order_id=? AND line=?",
                                (rng.randrange(100), tx, *key))  # type: ignore[misc]
                else:
                    con.execute("DELETE FROM items WHERE order_id=? AND line=?", key)  # type: ignore[arg-type]
            ktext = json.dumps(list(key))  # type: ignore[call-overload]
        else:
            if op == "c":
                key = self.next_id
                self.next_id += 1
                if table == "customers":
                    con.execute("INSERT INTO customers VALUES (?,?,?,?)",
                                (key, f"name-{rng.randrange(10**6)} ✓", rng.random() * 1000, tx))
                else:
                    con.execute("INSERT INTO orders VALUES (?,?,?,?,?)",
                                (key, rng.randrange(1, 1000), rng.choice([None, "rush", "ok"]),
                                 rng.randbytes(rng.randrange(0, 40)), tx))
            else:
                key = rng.choice(sorted(keys))  # type: ignore[type-var]
                if op == "u":
                    col = "name" if table == "customers" else "note"
                    con.execute(f"UPDATE {table} SET {col}=?, tx=? WHERE id=?",
                                (f"v{rng.randrange(10**6)}", tx, key))
                else:
                    con.execute(f"DELETE FROM {table} WHERE id=?", (key,))
            ktext = json.dumps(key)
        if op == "d":
            keys.discard(key)
        elif op == "c":
            keys.add(key)
        return (table, op, ktext)

    def transaction(self) -> bool:
        """Commit (or roll back) one random transaction; True if committed."""
        self.txn += 1
        live = {t: set(k) for t, k in self.live.items()}
        changes: list[Change] = []
        self.con.execute("BEGIN IMMEDIATE")
        try:
            for _ in range(self.rng.randint(1, 20)):
                changes.append(self._one(self.txn, live))
        except BaseException:
            self.con.execute("ROLLBACK")
            raise
        if self.rng.random() < self.rollback_ratio:
            self.con.execute("ROLLBACK")
            self.rolled_back.append(changes)
            return False
        self.con.execute("COMMIT")
        self.live = live
        self.committed.append(changes)
        return True


def table_rows(path: Path, table: str) -> list[tuple[object, ...]]:
    """Every row of ``table`` ordered by primary key (for equality checks)."""
    con = sqlite3.connect(path)
    try:
        order = "order_id, line" if table == "items" else "id"
        return [tuple(r) for r in con.execute(f"SELECT * FROM {table} ORDER BY {order}")]
    finally:
        con.close()


def txlog_max(path: Path) -> int:
    """The newest SCN in the database's txlog (-1 when empty)."""
    con = sqlite3.connect(path)
    try:
        return int(con.execute("SELECT max(scn) FROM _databus_txlog").fetchone()[0] or -1)
    finally:
        con.close()


def target_rows(engine: sa.Engine, table: str) -> list[tuple[object, ...]]:
    """Every row of ``table`` in a SQLAlchemy target (a replicate sink's)."""
    order = "order_id, line" if table == "items" else "id"
    with engine.connect() as con:
        return [tuple(r) for r in con.execute(sa.text(f"SELECT * FROM {table} ORDER BY {order}"))]


def as_text(row: tuple[object, ...]) -> tuple[object, ...]:
    """A shop row as the target holds it: the shop's SQLite columns are declared
    without strict types, so their values travel as text (blobs as base64)."""
    return tuple(None if v is None else base64.b64encode(v).decode()
                 if isinstance(v, bytes) else str(v) for v in row)
