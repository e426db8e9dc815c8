"""``accounts``: a SQLite table written by random transactions whose every key's history is
recorded (key changes, deletes and re-inserts, several changes of one key in one
transaction), and how the Spark tests name and read the tables they apply it into."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from databus.spark.lakehouse import Format


class KeyWriter:
    """Random transactions on ``accounts(id PK, v, note)``, key changes included.

    Every upsert sets ``v`` to a new counter value. ``history[id]`` lists, in
    commit order, ``v`` per upsert and ``None`` per delete (a key change is a
    delete of the old key and an insert of the new one).
    """

    def __init__(self, db: Path, seed: int) -> None:
        self.rng = random.Random(seed)
        self.con = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
        self.con.execute("CREATE TABLE IF NOT EXISTS accounts"
                         " (id INTEGER PRIMARY KEY, v INTEGER NOT NULL, note TEXT)")
        self.live: set[int] = set()
        self.history: dict[int, list[int | None]] = {}
        self.counter = 0
        self.key_changes = 0

    def _note(self, key: int, value: int | None) -> None:
        self.history.setdefault(key, []).append(value)

    def transaction(self) -> None:
        self.con.execute("BEGIN IMMEDIATE")
        for _ in range(self.rng.randint(1, 8)):
            key = self.rng.randrange(1, 60)
            self.counter += 1
            roll = self.rng.random()
            if key not in self.live:
                self.con.execute("INSERT INTO accounts (id, v, note) VALUES (?,?,?)",
                                 (key, self.counter, f"n{self.counter}"))
                self.live.add(key)
                self._note(key, self.counter)
            elif roll < 0.2:
                self.con.execute("DELETE FROM accounts WHERE id=?", (key,))
                self.live.discard(key)
                self._note(key, None)
            elif roll < 0.3:
                new = self.rng.randrange(60, 120)
                if new in self.live:
                    continue
                self.con.execute("UPDATE accounts SET id=?, v=? WHERE id=?",
                                 (new, self.counter, key))
                self.live.discard(key)
                self.live.add(new)
                self._note(key, None)
                self._note(new, self.counter)
                self.key_changes += 1
            else:
                self.con.execute("UPDATE accounts SET v=? WHERE id=?", (self.counter, key))
                self._note(key, self.counter)
        self.con.execute("COMMIT")


def target_of(fmt: Format, tmp_path: Path, name: str) -> str:
    return str(tmp_path / name) if fmt == "delta" else f"local.t{abs(hash(tmp_path))}.{name}"


def current(df: DataFrame) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in df.select("id", "v", "note").orderBy("id").collect()]
