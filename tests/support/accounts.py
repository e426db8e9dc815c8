"""``accounts``: a SQLite table written by random transactions whose every key's history is
recorded (key changes, deletes and re-inserts, several changes of one key in one
transaction), how the Spark tests name and read the tables they apply it into, and the
check that an SCD2 table holds exactly that history (``apply_changes`` and Spark's AUTO
CDC flow alike)."""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.support.sparkrelay import rows

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


class AccountWriter:
    """Random inserts/updates/deletes on ``accounts``; records each key's history.

    Every upsert sets ``v`` to a new counter value, so each is a new version.
    ``history[id]`` lists ``v`` per upsert and ``None`` per delete, in commit order.
    ``one_change_per_key``: a transaction changes a key at most once (for readers that
    give a key's net change per transaction, as Spark's changelog API does).
    """

    def __init__(self, db: Path, seed: int, *, one_change_per_key: bool = False) -> None:
        self.rng = random.Random(seed)
        self.con = sqlite3.connect(db, isolation_level=None)
        self.con.execute("CREATE TABLE IF NOT EXISTS accounts"
                         " (id INTEGER PRIMARY KEY, v INTEGER NOT NULL, note TEXT)")
        self.live: set[int] = set()
        self.history: dict[int, list[int | None]] = {}
        self.counter = 0
        self.one_change_per_key = one_change_per_key

    def transaction(self) -> None:
        self.con.execute("BEGIN IMMEDIATE")
        touched: set[int] = set()
        for _ in range(self.rng.randint(1, 6)):
            key = self.rng.randrange(1, 40)
            if self.one_change_per_key and key in touched:
                continue
            touched.add(key)
            self.counter += 1
            if key not in self.live:
                self.con.execute("INSERT INTO accounts VALUES (?,?,?)",
                                 (key, self.counter, f"n{self.counter}"))
                self.live.add(key)
            elif self.rng.random() < 0.25:
                self.con.execute("DELETE FROM accounts WHERE id=?", (key,))
                self.live.discard(key)
                self.history.setdefault(key, []).append(None)
                continue
            else:
                self.con.execute("UPDATE accounts SET v=? WHERE id=?", (self.counter, key))
            self.history.setdefault(key, []).append(self.counter)
        self.con.execute("COMMIT")


def rows_of(db: Path) -> list[tuple[object, ...]]:
    """The source's ``accounts`` rows, ordered by ``id``."""
    return rows(db, "SELECT id, v, note FROM accounts ORDER BY id")


def check_history(versions: Iterable[Mapping[str, Any]], w: AccountWriter,
                  order: Callable[[Any], Any] = lambda x: x) -> None:
    """Assert that SCD2 ``versions`` (rows with ``id``, ``v``, ``__START_AT`` and
    ``__END_AT``, in any order) are exactly ``w``'s history: one version per upsert, each
    ending where the key's next starts, closed (before the next) by a delete, open at the
    end only for a live key. ``order`` makes a ``__START_AT``/``__END_AT`` value comparable
    (the identity for Spark rows)."""
    by_key: dict[int, list[Mapping[str, Any]]] = {}
    for r in sorted(versions, key=lambda r: (r["id"], order(r["__START_AT"]))):
        by_key.setdefault(r["id"], []).append(r)
    assert set(by_key) == {k for k, h in w.history.items() if any(v is not None for v in h)}
    for key, got in by_key.items():
        expected = w.history[key]
        assert [r["v"] for r in got] == [v for v in expected if v is not None], key
        # what came after each upsert: the next version, a delete, or nothing yet
        upserts_then = [expected[i + 1] if i + 1 < len(expected) else "end"
                        for i, v in enumerate(expected) if v is not None]
        for r, nxt, after in zip(got, [*got[1:], None], upserts_then, strict=True):
            if after == "end":
                assert r["__END_AT"] is None and nxt is None, key
            elif after is None:  # deleted: closed before the next version starts
                assert r["__END_AT"] is not None, key
                assert nxt is None or order(r["__END_AT"]) < order(nxt["__START_AT"]), key
            else:
                assert nxt is not None and r["__END_AT"] == nxt["__START_AT"], key
        assert (got[-1]["__END_AT"] is None) == (key in w.live), key
