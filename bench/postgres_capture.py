"""WAL -> encoded events: rows/s of databus's PostgreSQL source beside pg_recvlogical
with test_decoding reading the same changes in the same run.

A private PostgreSQL (wal_level=logical) gets two logical slots made before the
workload (a pgoutput one for databus, a test_decoding one for the baseline), then
>= 300,000 row changes (inserts, updates, deletes in transactions of 1,000 rows) on
an 8-column table (int, text, numeric, timestamptz, text, jsonb, int, boolean).
Then, one after the other, over the same WAL range:

* databus: ``PostgresSource.read`` (replication protocol, pgoutput decoding, typed
  values, Avro encoding, event encoding) appending every window to an
  ``EventBuffer``: the relay's whole capture path;
* baseline: ``pg_recvlogical --start --endpos`` on the test_decoding slot, writing
  the text to /dev/null (it decodes nothing on the client: it only prints text).

Both include the server's decoding of the WAL (the server decodes once per slot).

    .venv/bin/python -m bench.postgres_capture [--rows 300000]
"""

from __future__ import annotations

import argparse
import subprocess
import threading
import time

from tests.support.postgres import PostgreSQL, bindir
from tests.support.sources import source_config

from databus.buffer import EventBuffer
from databus.sources.postgres.source import PostgresSource

DDL = ("CREATE TABLE t (id int PRIMARY KEY, name text, amount numeric(12,2), at timestamptz,"
       " note text, doc jsonb, qty int, flag boolean)")


def workload(pg: PostgreSQL, rows: int) -> None:
    inserts, updates = rows * 2 // 3, rows // 5
    deletes = rows - inserts - updates
    batch = 1000
    stmts = []
    for a in range(0, inserts, batch):
        b = min(a + batch, inserts)
        stmts.append("INSERT INTO t SELECT g, 'name-' || g, g + 0.25, '2024-05-06 07:08:09.123456"
                     f"+00', repeat('some text ', 3), jsonb_build_object('i', g, 'tags',"
                     f" '[\"a\", \"b\"]'::jsonb), g % 97, g % 2 = 0"
                     f" FROM generate_series({a}, {b - 1}) g")
    for a in range(0, updates, batch):
        stmts.append(f"UPDATE t SET qty = qty + 1, amount = amount + 1 WHERE id >= {a}"
                     f" AND id < {min(a + batch, updates)}")
    for a in range(inserts - deletes, inserts, batch):
        stmts.append(f"DELETE FROM t WHERE id >= {a} AND id < {min(a + batch, inserts)}")
    pg.execute(*stmts, db="bench")


def wal_lsn(pg: PostgreSQL) -> str:
    import sqlalchemy as sa
    from tests.support.sql import sql_engine

    with sql_engine(pg.url("bench")) as engine, engine.connect() as conn:
        return str(conn.execute(sa.text("SELECT pg_current_wal_lsn()::text")).scalar())


def run_databus(src: PostgresSource, rows: int) -> tuple[int, float]:
    buf = EventBuffer(1 << 30)  # allocated before the clock starts
    events = 0
    stop = threading.Event()
    after = -1
    t0 = time.perf_counter()
    try:
        while events < rows:
            for w in src.read(after, stop, 5.0):
                buf.append_window(w)
                events += w.count
                after = w.scn
        return events, time.perf_counter() - t0
    finally:
        src.close()
        buf.close()


def run_recvlogical(pg: PostgreSQL, endpos: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([str(bindir() / "pg_recvlogical"), "-h", "127.0.0.1", "-p", str(pg.port),
                    "-U", "postgres", "-d", "bench", "-S", "bench_td", "--start",
                    "--endpos", endpos, "--no-loop", "-f", "/dev/null"], check=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=300_000)
    args = ap.parse_args()
    with PostgreSQL() as pg:
        pg.execute("CREATE DATABASE bench")
        pg.execute(DDL, "CREATE PUBLICATION databus_bench FOR TABLE t",
                   "SELECT pg_create_logical_replication_slot('bench_td', 'test_decoding')",
                   db="bench")
        src = PostgresSource(source_config(pg.source_url("bench"), [r"public\.t"],
                                           snapshot_mode="no_data"), name="bench")
        src.open()
        src.read(-1, threading.Event(), 0.1)  # creates its slot before the workload
        t0 = time.perf_counter()
        workload(pg, args.rows)
        end = wal_lsn(pg)
        print(f"workload: {args.rows} row changes written in {time.perf_counter() - t0:.1f}s")
        ours, ours_s = run_databus(src, args.rows)
        theirs_s = run_recvlogical(pg, end)
    print(f"{'reader':<46} | {'rows':>8} | {'seconds':>7} | {'rows/s':>10}")
    print(f"{'databus PostgresSource -> EventBuffer':<46} | {ours:>8} | {ours_s:>7.2f} |"
          f" {ours / ours_s:>10,.0f}")
    print(f"{'pg_recvlogical, test_decoding (baseline)':<46} | {args.rows:>8} |"
          f" {theirs_s:>7.2f} | {args.rows / theirs_s:>10,.0f}")
    print(f"databus / pg_recvlogical: {(ours / ours_s) / (args.rows / theirs_s):.2f}"
          " (goal >= 0.5)")


if __name__ == "__main__":
    main()
