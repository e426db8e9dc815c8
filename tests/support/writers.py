"""Writers that change a table while something else (a snapshot, a relay being killed)
runs: ``Repeating`` runs any step (a workload's transaction) on a thread until stopped;
``KeyChurn`` is one thread class for MariaDB and SQLite.

``Repeating(step, pause)`` calls ``step()`` every ``pause`` seconds (or until ``until()``
holds) from ``start()`` (or the ``with`` block's start) to ``stop()`` (or the block's
end); ``stop()`` joins the thread and raises again what a step raised, so a writer's
failure fails the test that ran it.

``KeyChurn`` upserts and deletes random keys of a table ``t (id, v, s)`` until
``stop`` is set, counting statements (``count``) and keeping the longest time one
statement waited (``longest``: a snapshot that took locks would show here). The
transaction-recording workloads that tests compare against the source live in
``shop`` (SQLite), ``bulk`` and ``mysql_workload`` (MariaDB).
"""

from __future__ import annotations

import random
import sqlite3
import threading
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Self

from tests.support.mariadb import MariaDB


class Repeating:
    """See the module docstring."""

    def __init__(self, step: Callable[[], object], pause: float,
                 until: Callable[[], bool] | None = None) -> None:
        self.step, self.pause, self.until = step, pause, until
        self.done = threading.Event()  # set by stop(); a test may also wait on it
        self.errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            while not self.done.is_set() and not (self.until is not None and self.until()):
                self.step()
                self.done.wait(self.pause)
        except BaseException as exc:  # the thread's top: kept for stop() to raise
            self.errors.append(exc)

    def start(self) -> Self:
        self._thread.start()
        return self

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        """Until the thread ends by itself (``until`` held, or a step raised)."""
        self._thread.join(timeout)

    def stop(self, timeout: float = 60.0) -> None:
        self.done.set()
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"a writer step took over {timeout:g} s to end"
        if self.errors:
            raise self.errors[0]

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.stop()
        else:  # the block's own error is the one to see
            self.done.set()
            self._thread.join(60)


class KeyChurn(threading.Thread):
    """See the module docstring. Build with :meth:`mysql` or :meth:`sqlite`."""

    def __init__(self, *, keys: int, insert_ratio: float, pause: float, seed: int,
                 marker: str, mariadb: MariaDB | None = None, db: Path | None = None,
                 database: str = "shop") -> None:
        super().__init__(daemon=True)
        self.keys, self.insert_ratio, self.pause = keys, insert_ratio, pause
        self.seed, self.marker = seed, marker
        self.mariadb, self.db, self.database = mariadb, db, database
        self.stop = threading.Event()
        self.count = 0
        self.longest = 0.0

    @classmethod
    def mysql(cls, m: MariaDB, *, keys: int, insert_ratio: float = 0.7, pause: float = 0.002,
              seed: int = 11, marker: str = "upd", database: str = "shop") -> KeyChurn:
        return cls(keys=keys, insert_ratio=insert_ratio, pause=pause, seed=seed,
                   marker=marker, mariadb=m, database=database)

    @classmethod
    def sqlite(cls, db: Path, *, keys: int, insert_ratio: float = 0.7, pause: float = 0.002,
               seed: int = 11, marker: str = "upd") -> KeyChurn:
        return cls(keys=keys, insert_ratio=insert_ratio, pause=pause, seed=seed,
                   marker=marker, db=db)

    def run(self) -> None:
        rng = random.Random(self.seed)
        if self.mariadb is not None:
            with self.mariadb.connect(self.database) as con, con.cursor() as cur:
                while not self.stop.is_set():
                    k = rng.randrange(self.keys)
                    upsert = rng.random() < self.insert_ratio
                    t0 = time.perf_counter()
                    if upsert:
                        cur.execute("INSERT INTO t VALUES (%s, %s, 'w') ON DUPLICATE KEY"
                                    " UPDATE v = v + 1, s = %s", (k, k, self.marker))
                    else:
                        cur.execute("DELETE FROM t WHERE id = %s", (k,))
                    self._done(t0)
            return
        assert self.db is not None
        with closing(sqlite3.connect(self.db, isolation_level=None, timeout=30)) as sq:
            while not self.stop.is_set():
                k = rng.randrange(self.keys)
                upsert = rng.random() < self.insert_ratio
                t0 = time.perf_counter()
                sq.execute("BEGIN IMMEDIATE")
                if upsert:
                    sq.execute("INSERT INTO t VALUES (?, ?, 'w') ON CONFLICT(id) DO UPDATE"
                               " SET v = v + 1, s = ?", (k, k, self.marker))
                else:
                    sq.execute("DELETE FROM t WHERE id = ?", (k,))
                sq.execute("COMMIT")
                self._done(t0)

    def _done(self, t0: float) -> None:
        self.longest = max(self.longest, time.perf_counter() - t0)
        self.count += 1
        if self.pause:
            time.sleep(self.pause)
