"""The binlog service beside a real MariaDB: events/s served to ``mariadb-binlog
--read-from-remote-server`` clients (issue 19).

The same changes, in the same transactions and the same rows events, on both sides:

* databus: single-row inserts, updates and deletes committed to a SQLite table (BIGINT,
  text, DOUBLE, BLOB, BIGINT) at ``--rate`` transactions/s -> ``databus relay`` ->
  ``databus binlog-server`` (processes, default settings). The SQLite source groups
  what one poll finds (every 50 ms) into one window, so one binlog transaction holds
  about rate/20 changes.
* mariadb: a private MariaDB (tests/support/mariadb.py: binlog ROW, FULL image, FULL
  metadata, no Annotate_rows; fsync relaxed for the load only; the clients log in as a
  replication user with a password, as on the databus side; its binlog starts with
  the table's CREATE TABLE, as the service's does) gets the databus
  binlog's transactions replayed, read back with python-mysql-replication: per
  transaction BEGIN, per statement (a Table_map and its rows events up to STMT_END, ~8
  KiB each on both sides) one statement with the same rows (a multi-row INSERT; INSERT
  ... ON DUPLICATE KEY UPDATE for updates; DELETE ... WHERE id IN for deletes), COMMIT.
  Its binlog starts at a fresh file.

Once both binlogs hold everything, 1 and then 4 concurrent ``mariadb-binlog
--read-from-remote-server --to-last-log FIRST_FILE`` clients read each server's binlog
to its end (a non-blocking dump), output to /dev/null; rate = clients x events of the
binlog / wall time until the last client exits, best of ``--rounds`` (the side that reads
first alternates by round); beside it the median (and range) of the rounds' own
databus/MariaDB ratios, each from two runs next to each other. Events per binlog
are counted once per side from one client's output (its ``# at`` lines) and printed
beside the rows; the same client binary does the same work per event on both sides, so
the ratio compares the servers. The last line is ``ratio databus/mariadb: X``, X the
smaller of the 1-client and the 4-client ratio.

Run it under the bench lock::

    flock /tmp/databus-bench.lock .venv/bin/python -m bench.binlog_service \
        [--changes 60000] [--rate 2000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import sqlite3
import statistics
import subprocess
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import XidEvent
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent
from tests.support.binlog_server import PASSWORD, USER, BinlogService
from tests.support.mariadb import BINLOG_SETTINGS, MariaDB
from tests.support.wait import wait_until

TOOL = shutil.which("mariadb-binlog") or "/usr/bin/mariadb-binlog"
DDL_SQLITE = ("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT, price REAL, data BLOB,"
              " n INTEGER)")
DDL_MARIADB = ("CREATE TABLE bench.t (id BIGINT PRIMARY KEY, name LONGTEXT, price DOUBLE,"
               " data LONGBLOB, n BIGINT) CHARACTER SET utf8mb4")

Change = tuple[str, tuple[Any, ...]]  # (sql with ? placeholders, parameters)


def workload(transactions: int, seed: int = 19) -> list[Change]:
    """Single-row transactions: 60 % inserts, 25 % updates, 15 % deletes."""
    rng = random.Random(seed)
    live: list[int] = []
    out: list[Change] = []
    key = 0
    for _ in range(transactions):
        roll = rng.random()
        if roll < 0.6 or len(live) < 10:
            key += 1
            live.append(key)
            out.append(("INSERT INTO t VALUES (?, ?, ?, ?, ?)",
                        (key, f"name {key} ü", key * 0.25, rng.randbytes(100), key * 7)))
        elif roll < 0.85:
            k = rng.choice(live)
            out.append(("UPDATE t SET name = ?, price = ?, n = n + 1 WHERE id = ?",
                        (f"renamed {k}", rng.random(), k)))
        else:
            k = live.pop(rng.randrange(len(live)))
            out.append(("DELETE FROM t WHERE id = ?", (k,)))
    return out


def load_sqlite(db: Path, changes: list[Change], rate: float) -> None:
    """Commit ``changes`` one transaction each, at ``rate`` transactions/s (the relay's
    windows then hold what one 50 ms source poll finds, not the whole load)."""
    con = sqlite3.connect(db, isolation_level=None)
    con.execute("PRAGMA synchronous=OFF")  # the writer's fsyncs are not what is measured
    t0 = time.perf_counter()
    try:
        for i, (sql, params) in enumerate(changes):
            con.execute(sql, params)
            if i % 50 == 49:
                time.sleep(max(0.0, t0 + (i + 1) / rate - time.perf_counter()))
    finally:
        con.close()


Statement = tuple[str, list[Any]]


def databus_transactions(svc: BinlogService) -> list[list[Statement]]:
    """The databus binlog's row transactions, each as the MariaDB statements that log
    the same rows events (see the module docstring)."""
    cols = ["id", "name", "price", "data", "n"]
    reader = BinLogStreamReader(connection_settings=svc.settings(), server_id=7101,
                                blocking=False, resume_stream=True, log_pos=4,
                                log_file=svc.query("SHOW BINARY LOGS")[0][0],
                                only_events=[WriteRowsEvent, UpdateRowsEvent,
                                             DeleteRowsEvent, XidEvent])
    out: list[list[Statement]] = []
    cur: list[Statement] = []
    rows: list[dict[str, Any]] = []  # the statement's rows so far (its events up to STMT_END)
    try:
        for e in reader:
            if isinstance(e, XidEvent):
                out.append(cur)
                cur = []
                continue
            rows += e.rows
            if not e.flags & 1:  # STMT_END_F: the statement goes on in the next event
                continue
            statement, rows = rows, []
            if isinstance(e, DeleteRowsEvent):
                ids = [r["values"]["id"] for r in statement]
                cur.append((f"DELETE FROM t WHERE id IN ({','.join(['%s'] * len(ids))})", ids))
                continue
            images = [r["after_values"] if isinstance(e, UpdateRowsEvent) else r["values"]
                      for r in statement]
            params = [v if c != "data" or not isinstance(v, str) else v.encode()
                      for img in images for c, v in ((c, img[c]) for c in cols)]
            sql = ("INSERT INTO t VALUES "
                   + ",".join(["(%s,%s,%s,%s,%s)"] * len(images)))
            if isinstance(e, UpdateRowsEvent):
                sql += (" ON DUPLICATE KEY UPDATE name = VALUES(name), price = VALUES(price),"
                        " data = VALUES(data), n = VALUES(n)")
            cur.append((sql, params))
    finally:
        reader.close()
    return out


def replay_mariadb(m: MariaDB, transactions: list[list[Statement]]) -> None:
    con = m.connect("bench")
    try:
        with con.cursor() as cur:
            for txn in transactions:
                cur.execute("BEGIN")
                for sql, params in txn:
                    cur.execute(sql, params)
                cur.execute("COMMIT")
    finally:
        con.close()


def client_args(port: int, user: str, password: str | None, first: str) -> list[str]:
    return [TOOL, "--read-from-remote-server", "--host=127.0.0.1", f"--port={port}",
            f"--user={user}", *([f"--password={password}"] if password else []),
            "--to-last-log", first]


def count_events(args: list[str]) -> int:
    out = subprocess.run(args, capture_output=True, timeout=600, check=True)
    return sum(1 for line in out.stdout.split(b"\n") if line.startswith(b"# at "))


def timed(args: list[str], clients: int) -> float:
    """Wall seconds until ``clients`` concurrent runs of ``args`` all exited."""
    t0 = time.perf_counter()
    procs = [subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for _ in range(clients)]
    for p in procs:
        _, err = p.communicate(timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"mariadb-binlog failed: {err.decode(errors='replace')[-500:]}")
    return time.perf_counter() - t0


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--changes", type=int, default=60_000)
    ap.add_argument("--rate", type=float, default=2000.0, help="SQLite transactions/s")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    # SIGTERM (timeout, a killed job) ends like Ctrl-C: every server is stopped
    signal.signal(signal.SIGTERM, _interrupt)
    changes = workload(args.changes)
    with tempfile.TemporaryDirectory(prefix="bench-binlog-") as tmp_s, ExitStack() as stack:
        tmp = Path(tmp_s)
        db = tmp / "src.db"
        con = sqlite3.connect(db)
        con.execute(DDL_SQLITE)
        con.close()
        svc = stack.enter_context(BinlogService(db, tmp, ["t"]))
        m = stack.enter_context(MariaDB(
            tmp / "mariadb", settings={**BINLOG_SETTINGS, "sync-binlog": "0",
                                       "innodb-flush-log-at-trx-commit": "2",
                                       # no Annotate_rows: the databus binlog has none
                                       "binlog-annotate-row-events": "OFF",
                                       "max-allowed-packet": "64M"}))
        # the clients log in the same way on both sides: a replication user with a
        # password (mysql_native_password, as the service's). A password makes
        # mariadb-binlog initialise OpenSSL and hash it, ~5 ms of each run that root
        # without a password did not pay (measured with perf trace on the client)
        # the table's CREATE in the measured file, as the service writes its tables' DDL
        # at the start of its binlog: both files hold one DDL Query event (its charset
        # has mariadb-binlog read its character-set index, ~1.5 ms of a run)
        m.execute("CREATE DATABASE bench",
                  f"CREATE USER '{USER}'@'%' IDENTIFIED BY '{PASSWORD}'",
                  f"GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO '{USER}'@'%'",
                  "FLUSH BINARY LOGS", DDL_MARIADB)
        with m.connect() as c, c.cursor() as cur:
            cur.execute("SHOW MASTER STATUS")
            row = cur.fetchone()
            assert row is not None
            m_first = str(row[0])
        t0 = time.perf_counter()
        load_sqlite(db, changes, args.rate)
        print(f"committed {len(changes)} single-row transactions to SQLite in"
              f" {time.perf_counter() - t0:.1f} s", flush=True)
        stats = f"http://127.0.0.1:{svc.relay_port}/containerStats/buffer/max_scn"
        state = svc.data_dir / "databus-bin.state"

        def converted() -> bool:
            top = int(httpx.get(stats).json())
            return top > 0 and json.loads(state.read_bytes())["end"]["scn"] >= top

        t0 = time.perf_counter()
        wait_until(converted, 900, "the binlog service to convert every change")
        print(f"binlog service caught up {time.perf_counter() - t0:.1f} s after the load",
              flush=True)
        txns = databus_transactions(svc)
        t0 = time.perf_counter()
        replay_mariadb(m, txns)
        print(f"replayed {len(txns)} transactions"
              f" ({sum(len(t) for t in txns)} statements) on MariaDB in"
              f" {time.perf_counter() - t0:.1f} s", flush=True)
        ours = client_args(svc.port, USER, PASSWORD, svc.query("SHOW BINARY LOGS")[0][0])
        theirs = client_args(m.port, USER, PASSWORD, m_first)
        events = {"databus": count_events(ours), "mariadb": count_events(theirs)}
        print(f"events per binlog: databus {events['databus']}, mariadb {events['mariadb']}",
              flush=True)
        best: dict[tuple[str, int], float] = {}
        paired: dict[int, list[float]] = {1: [], 4: []}  # databus/mariadb, each round
        for rnd in range(args.rounds):
            for clients in (1, 4):
                # the side that goes first alternates by round: neither always reads
                # right after the other's run (caches, the CPU's clock, other load)
                sides = [("databus", ours), ("mariadb", theirs)]
                rates = {}
                for side, cmd in sides if rnd % 2 == 0 else sides[::-1]:
                    secs = timed(cmd, clients)
                    rate = rates[side] = clients * events[side] / secs
                    best[(side, clients)] = max(best.get((side, clients), 0.0), rate)
                    print(f"round {rnd + 1}: {side:8s} {clients} client(s): {secs:6.2f} s,"
                          f" {rate:10,.0f} events/s", flush=True)
                paired[clients].append(rates["databus"] / rates["mariadb"])
        print()
        print("| clients | databus events/s | mariadb events/s | ratio | per round:"
              " median (min-max) |")
        print("|---|---|---|---|---|")
        ratios = []
        for clients in (1, 4):
            d, r = best[("databus", clients)], best[("mariadb", clients)]
            ratios.append(d / r)
            each = paired[clients]
            print(f"| {clients} | {d:,.0f} | {r:,.0f} | {d / r:.2f} |"
                  f" {statistics.median(each):.2f} ({min(each):.2f}-{max(each):.2f}) |")
        print(f"ratio databus/mariadb: {min(ratios):.2f}")


if __name__ == "__main__":
    main()
