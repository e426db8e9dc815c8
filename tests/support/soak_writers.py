"""The soak's writers (``tests/support/soak.py``): sysbench's ``oltp_write_only`` on
MariaDB, restarted whenever it exits (:class:`Sysbench`), and a paced writer on
PostgreSQL that records which of its transactions committed (:class:`PgWriter`: each
transaction also inserts its sequence number and ``txid_current()`` into ``marks``).
Both over the servers' unix sockets, so that a cut of a server's TCP port cuts the
relays and not the load.
"""

from __future__ import annotations

import json
import random
import subprocess
import threading
from pathlib import Path
from typing import Any

import psycopg

from tests.support import sysbench
from tests.support.mariadb import MariaDB
from tests.support.postgres import PostgreSQL
from tests.support.soak_check import Change, Tx, rows_text
from tests.support.wait import wait_until


class Sysbench:
    """``oltp_write_only`` over the unix socket, started again whenever it exits (a
    source restart ends it) until :meth:`stop`."""

    def __init__(self, server: MariaDB, w: sysbench.Workload, log: Path) -> None:
        self.server, self.w, self.log = server, w, log
        self.starts = 0
        self._stop = threading.Event()
        self._proc: subprocess.Popen[bytes] | None = None
        self._thread = threading.Thread(target=self._run, name="sysbench", daemon=True)

    def args(self, *cmd: str) -> list[str]:
        return [sysbench.binary(), "oltp_write_only", "--db-driver=mysql",
                f"--mysql-socket={self.server.socket}", "--mysql-user=root",
                f"--mysql-db={sysbench.DATABASE}", f"--tables={self.w.tables}",
                f"--table-size={self.w.table_size}", f"--threads={self.w.threads}",
                f"--rate={self.w.rate}", "--time=0", "--report-interval=0", *cmd]

    def prepare(self) -> None:
        """sysbench's tables, empty (a relay needs its tables to exist when it starts)."""
        args = [a if not a.startswith("--table-size=") else "--table-size=0"
                for a in self.args("prepare")]
        with self.log.open("ab") as fh:
            subprocess.run(args, check=True, stdout=fh, stderr=subprocess.STDOUT,
                           timeout=900)

    def fill(self) -> None:
        """Their rows, as sysbench's prepare would write them, one transaction a table
        (after the relays started: captured, replicated and checked like the rest)."""
        n = self.w.table_size
        for i in range(1, self.w.tables + 1):
            self.server.execute(
                f"USE {sysbench.DATABASE}", f"INSERT INTO {sysbench.DATABASE}.sbtest{i} (id, k, c, pad) SELECT seq,"
                f" FLOOR(1 + RAND({i}) * {n}), REPEAT(CHAR(48 + seq % 10), 119),"
                f" REPEAT(CHAR(97 + seq % 26), 59) FROM seq_1_to_{n}")

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._proc is None or self._proc.poll() is not None:
                with self.log.open("ab") as fh:
                    self._proc = subprocess.Popen(self.args("run"), stdout=fh,
                                                  stderr=subprocess.STDOUT)
                self.starts += 1
            self._stop.wait(0.5)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()  # a transaction it was in is rolled back: not in the binlog
            self._proc.wait(30)
        # ...unless its COMMIT had reached the server: that one still commits after the
        # kill. The binlog is read for "what was committed" only once no session of
        # sysbench is left (a paced run in CI once read it one transaction too early)
        wait_until(self._sessions_gone, 60, "sysbench's sessions to end", interval=0.1)

    def _sessions_gone(self) -> bool:
        con = self.server.connect()
        try:
            with con.cursor() as cur:
                cur.execute("SELECT COUNT(*) FROM information_schema.PROCESSLIST"
                            " WHERE DB = %s AND COMMAND <> 'Binlog Dump'"
                            " AND ID <> CONNECTION_ID()", (sysbench.DATABASE,))
                row = cur.fetchone()
        finally:
            con.close()
        return row is not None and int(row[0]) == 0


PG_SCHEMA = ("CREATE TABLE items (id int PRIMARY KEY, v int NOT NULL)",
             "CREATE TABLE marks (tx bigint PRIMARY KEY, xid bigint NOT NULL)",
             "CREATE PUBLICATION databus_soak FOR TABLE items, marks")


class PgWriter:
    """One connection over the unix socket committing ``rate`` transactions a second:
    1-3 changes to ``items`` and the row of ``marks`` naming the transaction (see the
    module docstring). After an error it reconnects and reads ``marks`` to know whether
    the transaction in doubt committed."""

    def __init__(self, server: PostgreSQL, db: str, rate: float, seed: int) -> None:
        self.server, self.db, self.rate = server, db, rate
        self.rng = random.Random(seed)
        self.attempts: dict[int, list[Change]] = {}
        self.keys: dict[int, int] = {}
        self.next_id, self.tx, self.errors = 0, 0, 0
        self.doubt: dict[int, int] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pg-writer", daemon=True)

    def connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(host=str(self.server.root), port=self.server.port,
                               user="postgres", dbname=self.db, connect_timeout=5)

    def _one(self, con: psycopg.Connection[Any]) -> None:
        self.tx += 1
        keys = dict(self.keys)
        changes: list[Change] = []
        self.attempts[self.tx] = changes
        with con.transaction():
            for _ in range(self.rng.randint(1, 3)):
                op = self.rng.choice("cud") if keys else "c"
                if op == "c":
                    self.next_id += 1
                    key = self.next_id
                    con.execute("INSERT INTO items VALUES (%s, 0)", [key])
                    keys[key] = 0
                elif op == "u":
                    key = self.rng.choice(sorted(keys))
                    con.execute("UPDATE items SET v = v + 1 WHERE id = %s", [key])
                    keys[key] += 1
                else:
                    key = self.rng.choice(sorted(keys))
                    con.execute("DELETE FROM items WHERE id = %s", [key])
                    del keys[key]
                changes.append(("items", op, json.dumps(key)))
            con.execute("INSERT INTO marks VALUES (%s, txid_current())", [self.tx])
            changes.append(("marks", "c", json.dumps(self.tx)))
            self.doubt = keys  # the COMMIT may fail and still have committed
        self.keys, self.doubt = keys, None

    def _run(self) -> None:
        con: psycopg.Connection[Any] | None = None
        while not self._stop.is_set():
            try:
                if con is None:
                    con = self.connect()
                    con.autocommit = True
                    if self.doubt is not None and con.execute(
                            "SELECT 1 FROM marks WHERE tx = %s", [self.tx]).fetchone():
                        self.keys = self.doubt  # the transaction in doubt committed
                    self.doubt = None
                self._one(con)
            except psycopg.Error:
                self.errors += 1
                if con is not None:
                    con.close()
                con = None
                self._stop.wait(0.5)
                continue
            self._stop.wait(1.0 / self.rate)
        if con is not None:
            con.close()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def committed(self) -> list[Tx]:
        with self.connect() as con:
            rows = con.execute("SELECT tx, xid FROM marks ORDER BY tx").fetchall()
        return [Tx(str(xid), rows_text(self.attempts[tx])) for tx, xid in rows]
