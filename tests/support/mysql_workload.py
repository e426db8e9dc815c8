"""A random MariaDB workload with DDL, and a record of exactly what it committed.

One writer connection sends each transaction in ONE round trip (``BEGIN; ...;
COMMIT`` as a multi-statement query), with multi-row INSERTs and ``IN (...)``
UPDATEs/DELETEs, so tens of thousands of transactions take seconds. For every
committed transaction it records the row changes the binlog must carry, in
binlog order: ``(table, op letter, key as JSON text)``; rolled-back
transactions are recorded apart and must never be delivered.

Binlog order within one statement: a multi-row INSERT logs its rows in the
order written; an UPDATE/DELETE over ``id IN (...)`` logs them in primary-key
order (InnoDB scans the key range ascending). Every UPDATE bumps a counter
column, so no UPDATE is a no-op (MariaDB logs no row for an unchanged row).

DDL runs between transactions when :meth:`Workload.maybe_ddl` is told the
run's progress (each statement is recorded as a committed window holding its
schema-change event): ``ALTER TABLE accounts ADD COLUMN tier`` (nullable, no
default: rows written before keep NULL on both sides), ``ALTER TABLE orders
DROP COLUMN doc``, and ``CREATE TABLE audit`` which is then written.
"""

from __future__ import annotations

import datetime as dt
import decimal
import hashlib
import json
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pymysql
from pymysql.constants import CLIENT

from tests.support.sql import sql_engine

Change = tuple[str, str, str]  # (table, op letter, key as JSON text)

SCHEMA = [
    "CREATE DATABASE shop CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci",
    "CREATE TABLE shop.accounts (id INT PRIMARY KEY, owner VARCHAR(64) NOT NULL,"
    " balance DECIMAL(14,2), updated DATETIME(6), note TEXT, meta JSON, n INT NOT NULL)",
    "CREATE TABLE shop.orders (id BIGINT PRIMARY KEY, account INT, amount DECIMAL(12,2),"
    " placed DATETIME(6), status VARCHAR(16), doc JSON, rev INT NOT NULL)",
    "CREATE TABLE shop.items (order_id BIGINT NOT NULL, line INT NOT NULL, sku VARCHAR(32),"
    " qty INT NOT NULL, price DECIMAL(10,2), PRIMARY KEY (order_id, line))",
]
# (fraction of the run, table, statement): each runs once, between transactions
DDL = [
    (0.3, "accounts", "ALTER TABLE shop.accounts ADD COLUMN tier VARCHAR(8)"),
    (0.5, "orders", "ALTER TABLE shop.orders DROP COLUMN doc"),
    (0.7, "audit", "CREATE TABLE shop.audit (id INT PRIMARY KEY, kind VARCHAR(16),"
                   " payload TEXT, at DATETIME(6), hits INT NOT NULL)"),
]
TABLES = ["accounts", "orders", "items", "audit"]
KEYS = {"accounts": ("id",), "orders": ("id",), "items": ("order_id", "line"),
        "audit": ("id",)}

_NAMES = ["Zoë", "Łukasz", "山田太郎", "Ana", "O'Brien", "Ἀθηνᾶ", "party 🎉", "x\\y", ""]
_WORDS = ["alpha", "βeta", "гамма", "delta", "😀", "naïve", "tab\tsep", "quote'\"", "línea\n2"]


def schema_change(table: str) -> Change:
    """How a recorder writes down the DDL notice of a statement on ``shop.table``."""
    return ("schema_changes", "c", json.dumps(["shop", table]))


def connect_writer(port: int) -> pymysql.connections.Connection:  # type: ignore[type-arg]
    """The writer's connection: multi-statement queries, utf8mb4, autocommit."""
    return pymysql.connect(host="127.0.0.1", port=port, user="root", password="",
                           database="shop", charset="utf8mb4", autocommit=True,
                           client_flag=CLIENT.MULTI_STATEMENTS, connect_timeout=10)


class KeySet:
    """Live keys of one table: O(1) add, remove and random choice, deterministic."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.index: dict[Any, int] = {}

    def __len__(self) -> int:
        return len(self.items)

    def __contains__(self, key: object) -> bool:
        return key in self.index

    def add(self, key: Any) -> None:
        self.index[key] = len(self.items)
        self.items.append(key)

    def remove(self, key: Any) -> None:
        i = self.index.pop(key)
        last = self.items.pop()
        if i < len(self.items):
            self.items[i] = last
            self.index[last] = i

    def sample(self, rng: random.Random, n: int) -> list[Any]:
        if not self.items:
            return []
        return list({self.items[rng.randrange(len(self.items))] for _ in range(n)})


@dataclass
class Workload:
    """Commits random transactions on ``con`` (see the module docstring)."""

    con: Any
    seed: int = 1
    rollback_ratio: float = 0.05
    committed: list[list[Change]] = field(default_factory=list)
    rolled_back: list[list[Change]] = field(default_factory=list)
    ddl_done: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.live = {t: KeySet() for t in TABLES}
        self.next_id = {"accounts": 1, "orders": 1, "audit": 1}
        self._undo: list[Callable[[], None]] = []
        self._stmts: list[str] = []
        self._changes: list[Change] = []

    @property
    def has_tier(self) -> bool:
        return DDL[0][2] in self.ddl_done

    @property
    def has_doc(self) -> bool:
        return DDL[1][2] not in self.ddl_done

    @property
    def has_audit(self) -> bool:
        return DDL[2][2] in self.ddl_done

    def maybe_ddl(self, progress: float) -> None:
        """Run the DDL statements whose point of the run (0..1) has come. Each is
        a window of its own in the stream: one event of the logical source
        ``databus.schema_changes`` keyed by ``["shop", table]``."""
        for at, table, stmt in DDL:
            if progress >= at and stmt not in self.ddl_done:
                with self.con.cursor() as cur:
                    cur.execute(stmt)
                self.ddl_done.append(stmt)
                self.committed.append([schema_change(table)])

    def truncate(self, table: str) -> None:
        """TRUNCATE ``table``: a window with its schema-change event, then a
        truncate event (op ``t``, key 0) on the table."""
        with self.con.cursor() as cur:
            cur.execute(f"TRUNCATE TABLE {table}")
        for k in list(self.live[table].items):
            self.live[table].remove(k)
        self.committed.append([schema_change(table), (table, "t", "0")])

    # -- values --------------------------------------------------------------

    def _money(self, digits: int) -> decimal.Decimal:
        return decimal.Decimal(self.rng.randrange(-10**digits, 10**digits)).scaleb(-2)

    def _time(self) -> dt.datetime:
        r = self.rng
        return dt.datetime(r.randrange(1971, 2037), r.randrange(1, 13), r.randrange(1, 29),
                           r.randrange(24), r.randrange(60), r.randrange(60),
                           r.choice([0, r.randrange(10**6)]))

    def _text(self, n: int) -> str | None:
        r = self.rng
        if r.random() < 0.1:
            return None
        return " ".join(r.choice(_WORDS) for _ in range(r.randrange(n)))

    def _json(self) -> str | None:
        r = self.rng
        if r.random() < 0.1:
            return None
        return json.dumps({"k": r.randrange(10**9), "tags": r.sample(_WORDS, 2),
                           "ok": r.random() < 0.5, "x": r.random()}, ensure_ascii=False)

    # -- building a transaction ---------------------------------------------------

    def _sql(self, sql: str, args: Iterable[Any] | None = None) -> None:
        self._stmts.append(self.con.cursor().mogrify(sql, args) if args is not None else sql)

    def _changed(self, table: str, op: str, keys: Iterable[Any]) -> None:
        live = self.live[table]
        for k in keys:
            self._changes.append((table, op, json.dumps(list(k) if isinstance(k, tuple) else k)))
            if op == "c":
                live.add(k)
                self._undo.append(lambda live=live, k=k: live.remove(k))
            elif op == "d":
                live.remove(k)
                self._undo.append(lambda live=live, k=k: live.add(k))

    def _new_id(self, table: str) -> int:
        self.next_id[table] += 1
        return self.next_id[table] - 1

    def _insert_accounts(self) -> None:
        ids = [self._new_id("accounts") for _ in range(self.rng.randint(1, 5))]
        cols = "id, owner, balance, updated, note, meta, n" + (", tier" if self.has_tier else "")
        rows = []
        for i in ids:
            row = [i, f"{self.rng.choice(_NAMES)} {i}", self._money(10), self._time(),
                   self._text(30), self._json(), 0]
            if self.has_tier:
                row.append(self.rng.choice(["gold", "silver", None]))
            rows.append(self.con.cursor().mogrify("(" + ",".join(["%s"] * len(row)) + ")", row))
        self._sql(f"INSERT INTO accounts ({cols}) VALUES " + ",".join(rows))
        self._changed("accounts", "c", ids)

    def _update_accounts(self) -> None:
        ids = sorted(self.live["accounts"].sample(self.rng, self.rng.randint(1, 4)))
        if not ids:
            return self._insert_accounts()
        tier = ", tier = %s" if self.has_tier else ""
        args: list[Any] = [self._money(6), self._time(), self._text(10)]
        if self.has_tier:
            args.append(self.rng.choice(["gold", "bronze", None]))
        self._sql(f"UPDATE accounts SET balance = balance + %s, updated = %s, note = %s, n = n + 1"
                  f"{tier} WHERE id IN ({','.join(map(str, ids))})", args)
        self._changed("accounts", "u", ids)

    def _delete_accounts(self) -> None:
        ids = sorted(self.live["accounts"].sample(self.rng, self.rng.randint(1, 2)))
        if ids:
            self._sql(f"DELETE FROM accounts WHERE id IN ({','.join(map(str, ids))})")
            self._changed("accounts", "d", ids)

    def _place_order(self) -> None:
        """Multi-table: the order, its lines, and the account's balance."""
        r = self.rng
        oid = self._new_id("orders")
        account = (self.live["accounts"].sample(r, 1) or [None])[0]
        amount = self._money(8)
        if self.has_doc:
            self._sql("INSERT INTO orders (id, account, amount, placed, status, doc, rev)"
                      " VALUES (%s,%s,%s,%s,%s,%s,0)",
                      (oid, account, amount, self._time(), "new", self._json()))
        else:
            self._sql("INSERT INTO orders (id, account, amount, placed, status, rev)"
                      " VALUES (%s,%s,%s,%s,%s,0)", (oid, account, amount, self._time(), "new"))
        self._changed("orders", "c", [oid])
        lines = list(range(1, r.randint(1, 4) + 1))
        vals = ",".join(self.con.cursor().mogrify(
            "(%s,%s,%s,%s,%s)", (oid, ln, f"sku-{r.randrange(10**5)}-é", r.randrange(1, 50),
                                 self._money(6))) for ln in lines)
        self._sql(f"INSERT INTO items (order_id, line, sku, qty, price) VALUES {vals}")
        self._changed("items", "c", [(oid, ln) for ln in lines])
        if account is not None:
            self._sql("UPDATE accounts SET balance = balance - %s, n = n + 1 WHERE id = %s",
                      (amount, account))
            self._changed("accounts", "u", [account])

    def _update_orders(self) -> None:
        ids = sorted(self.live["orders"].sample(self.rng, self.rng.randint(1, 3)))
        if not ids:
            return self._place_order()
        self._sql(f"UPDATE orders SET status = %s, amount = amount + 1, rev = rev + 1"
                  f" WHERE id IN ({','.join(map(str, ids))})",
                  (self.rng.choice(["paid", "sent", "back", "ünïcode"]),))
        self._changed("orders", "u", ids)

    def _move_order(self) -> None:
        """An UPDATE of the primary key: the source sends a delete of the old key
        and an insert of the new one."""
        old = self.live["orders"].sample(self.rng, 1)
        if not old:
            return
        new = self._new_id("orders")
        self._sql("UPDATE orders SET id = %s, rev = rev + 1 WHERE id = %s", (new, old[0]))
        self._changed("orders", "d", old)
        self._changed("orders", "c", [new])

    def _update_items(self) -> None:
        keys = self.live["items"].sample(self.rng, 1)
        if keys:
            self._sql("UPDATE items SET qty = qty + 1, price = %s WHERE order_id = %s AND line = %s",
                      (self._money(6), *keys[0]))
            self._changed("items", "u", keys)

    def _delete_order(self) -> None:
        old = self.live["orders"].sample(self.rng, 1)
        if not old:
            return
        oid = old[0]
        lines = sorted(k for k in self._items_of(oid))
        if lines:
            self._sql("DELETE FROM items WHERE order_id = %s", (oid,))
            self._changed("items", "d", lines)
        self._sql("DELETE FROM orders WHERE id = %s", (oid,))
        self._changed("orders", "d", [oid])

    def _items_of(self, oid: int) -> list[tuple[int, int]]:
        live = self.live["items"]
        return [(oid, ln) for ln in range(1, 5) if (oid, ln) in live]

    def _audit(self) -> None:
        r = self.rng
        live = self.live["audit"]
        roll = r.random()
        if roll < 0.6 or not live:
            ids = [self._new_id("audit") for _ in range(r.randint(1, 3))]
            vals = ",".join(self.con.cursor().mogrify(
                "(%s,%s,%s,%s,0)", (i, r.choice(["login", "logout", "é"]), self._text(20),
                                    self._time())) for i in ids)
            self._sql(f"INSERT INTO audit (id, kind, payload, at, hits) VALUES {vals}")
            self._changed("audit", "c", ids)
        elif roll < 0.85:
            ids = sorted(live.sample(r, 2))
            self._sql(f"UPDATE audit SET hits = hits + 1, payload = %s"
                      f" WHERE id IN ({','.join(map(str, ids))})", (self._text(5),))
            self._changed("audit", "u", ids)
        else:
            ids = sorted(live.sample(r, 1))
            self._sql(f"DELETE FROM audit WHERE id IN ({','.join(map(str, ids))})")
            self._changed("audit", "d", ids)

    def touch_all(self) -> None:
        """Commit one transaction writing accounts, orders and items (and audit
        once created), so a reader sees every table's current shape."""
        self._stmts, self._changes, self._undo = [], [], []
        self._insert_accounts()
        self._place_order()
        if self.has_audit:
            self._audit()
        self._run("COMMIT")
        self.committed.append(self._changes)

    def _run(self, end: str) -> None:
        sql = "BEGIN;" + ";".join(self._stmts) + ";" + end
        with self.con.cursor() as cur:
            cur.execute(sql)
            while cur.nextset():
                pass

    def transaction(self) -> bool:
        """Commit (or roll back) one random transaction of 1-3 operations; True if committed."""
        r = self.rng
        self._stmts, self._changes, self._undo = [], [], []
        ops: list[Callable[[], None]] = [
            self._insert_accounts, self._update_accounts, self._delete_accounts,
            self._place_order, self._update_orders, self._move_order, self._update_items,
            self._delete_order]
        weights = [4, 5, 1, 4, 3, 1, 2, 1]
        if len(self.live["accounts"]) > 2000:
            weights[2] = 6  # keep the tables at a steady size
        if len(self.live["orders"]) > 2000:
            weights[7] = 5
        if self.has_audit:
            ops.append(self._audit)
            weights.append(4)
        for op in r.choices(ops, weights, k=r.randint(1, 3)):
            op()
        if not self._changes:
            self._insert_accounts()
        rollback = r.random() < self.rollback_ratio
        self._run("ROLLBACK" if rollback else "COMMIT")
        if rollback:
            for undo in reversed(self._undo):
                undo()
            self.rolled_back.append(self._changes)
            return False
        self.committed.append(self._changes)
        return True


# -- checksums --------------------------------------------------------------------


def _norm(value: Any) -> Any:
    """One representation per value, whichever driver returned it."""
    if isinstance(value, decimal.Decimal):
        return format(value, "f")
    if isinstance(value, dt.datetime):
        return value.isoformat(timespec="microseconds")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    return value


def checksum(columns: list[str], rows: Iterable[tuple[Any, ...]]) -> tuple[int, str]:
    """(row count, order-independent digest) of rows: the sum mod 2**256 of each
    row's SHA-256 over its ``column=value`` pairs sorted by column name."""
    total, count = 0, 0
    for row in rows:
        pairs = sorted(zip(columns, (_norm(v) for v in row), strict=True))
        h = hashlib.sha256(json.dumps(pairs, ensure_ascii=False).encode()).digest()
        total = (total + int.from_bytes(h, "big")) % (1 << 256)
        count += 1
    return count, f"{total:064x}"


def mariadb_checksums(port: int) -> dict[str, tuple[list[str], int, str]]:
    """{table: (sorted columns, row count, digest)} of every table of ``shop``."""
    con = pymysql.connect(host="127.0.0.1", port=port, user="root", password="",
                          database="shop", charset="utf8mb4")
    out = {}
    try:
        with con.cursor() as cur:
            cur.execute("SHOW TABLES")
            for (table,) in cur.fetchall():
                cur.execute(f"SELECT * FROM `{table}`")
                cols = [d[0] for d in cur.description]
                out[table] = (sorted(cols), *checksum(cols, cur.fetchall()))
    finally:
        con.close()
    return out


def sql_checksums(url: str, tables: Iterable[str]) -> dict[str, tuple[list[str], int, str]]:
    """The same digests over a SQLAlchemy target (tables missing there are left out)."""
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    out = {}
    try:
        with engine.connect() as conn:
            have = set(sa.inspect(conn).get_table_names())
            for table in tables:
                if table not in have:
                    continue
                res = conn.execute(sa.text(f'SELECT * FROM "{table}"'))
                cols = list(res.keys())
                out[table] = (sorted(cols), *checksum(cols, res.fetchall()))
    finally:
        engine.dispose()
    return out


def table_diff(port: int, url: str, table: str, limit: int = 5) -> str:
    """A short description of how ``table`` differs between MariaDB and the
    target (columns, missing/extra keys, first differing rows), for messages."""
    import sqlalchemy as sa

    key = KEYS[table]
    con = pymysql.connect(host="127.0.0.1", port=port, user="root", password="",
                          database="shop", charset="utf8mb4")
    try:
        with con.cursor() as cur:
            cur.execute(f"SELECT * FROM `{table}`")
            cols = [d[0] for d in cur.description]
            src = {tuple(r[cols.index(k)] for k in key): dict(zip(cols, map(_norm, r), strict=True))
                   for r in cur.fetchall()}
    finally:
        con.close()
    with sql_engine(url) as engine, engine.connect() as conn:
        res = conn.execute(sa.text(f'SELECT * FROM "{table}"'))
        tcols = list(res.keys())
        dst = {tuple(r[tcols.index(k)] for k in key): dict(zip(tcols, map(_norm, r),
                                                               strict=True))
               for r in res.fetchall()}
    out = []
    if sorted(cols) != sorted(tcols):
        out.append(f"columns: source {sorted(cols)}, target {sorted(tcols)}")
    missing = sorted(set(src) - set(dst))
    extra = sorted(set(dst) - set(src))
    if missing:
        out.append(f"{len(missing)} rows missing, e.g. {missing[:limit]}")
    if extra:
        out.append(f"{len(extra)} extra rows, e.g. {extra[:limit]}")
    differing = [k for k in sorted(set(src) & set(dst)) if src[k] != dst[k]]
    for k in differing[:limit]:
        cells = {c: (src[k].get(c), dst[k].get(c)) for c in sorted(set(src[k]) | set(dst[k]))
                 if src[k].get(c) != dst[k].get(c)}
        out.append(f"row {k}: (source, target) {cells}")
    if differing:
        out.append(f"{len(differing)} rows differ")
    return "; ".join(out) or "no difference by key"
