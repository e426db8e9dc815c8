"""Fast random changes to the shop tables (many changes per transaction).

Used where a test needs a large history (100,000 changes) quickly; every
transaction mixes inserts, updates (including of keys) and deletes.
"""

from __future__ import annotations

import random
import sqlite3
import threading
from pathlib import Path


class BulkWriter:
    """Commits transactions of ``per_tx`` random row changes to the shop tables."""

    def __init__(self, path: Path, seed: int = 1, per_tx: int = 200) -> None:
        self.rng = random.Random(seed)
        self.per_tx = per_tx
        self.con = sqlite3.connect(path, timeout=60, isolation_level=None,
                                   check_same_thread=False)
        self.con.execute("PRAGMA busy_timeout=60000")
        self.changes = 0
        self.transactions = 0
        row = self.con.execute("SELECT max(id) FROM customers").fetchone()
        self.next_id = (row[0] or 0) + 1

    def close(self) -> None:
        self.con.close()

    def transaction(self) -> None:
        rng, con = self.rng, self.con
        con.execute("BEGIN IMMEDIATE")
        try:
            for _ in range(self.per_tx):
                r = rng.random()
                if r < 0.5 or self.next_id < 10:
                    i = self.next_id
                    self.next_id += 1
                    con.execute("INSERT INTO customers VALUES (?,?,?,?)",
                                (i, f"c{i}-{rng.randrange(10**6)}", rng.random() * 100,
                                 self.transactions))
                    con.execute("INSERT OR REPLACE INTO items VALUES (?,?,?,?,?)",
                                (i % 300, rng.randrange(5), f"sku{i}", rng.randrange(9),
                                 self.transactions))
                elif r < 0.8:
                    k = rng.randrange(1, self.next_id)
                    con.execute("UPDATE customers SET name=?, tx=? WHERE id=?",
                                (f"u{rng.randrange(10**6)}", self.transactions, k))
                elif r < 0.85:
                    # a key change: delete + insert in the capture
                    k = rng.randrange(1, self.next_id)
                    new = self.next_id
                    self.next_id += 1
                    con.execute("UPDATE customers SET id=? WHERE id=?", (new, k))
                else:
                    k = rng.randrange(1, self.next_id)
                    con.execute("DELETE FROM customers WHERE id=?", (k,))
                    con.execute("DELETE FROM items WHERE order_id=?", (k % 300,))
            con.execute("COMMIT")
            # row changes captured so far = SCNs the txlog assigned (never reused)
            seq = con.execute("SELECT seq FROM sqlite_sequence WHERE name = '_databus_txlog'"
                              ).fetchone()
            self.changes = int(seq[0]) if seq else 0
        except BaseException:
            con.execute("ROLLBACK")
            raise
        self.transactions += 1

    def run_until(self, changes: int, stop: threading.Event | None = None,
                  pause: float = 0.0) -> None:
        while self.changes < changes and not (stop is not None and stop.is_set()):
            self.transaction()
            if pause and stop is not None:
                stop.wait(pause)
