"""WAL -> encoded events: rows/s of databus's PostgreSQL source beside pg_recvlogical
with test_decoding, and beside databus's MariaDB source, on the same changes in the
same run.

A private PostgreSQL (wal_level=logical) gets its logical slots made before the
workload (pgoutput ones for databus, one test_decoding one per run for the
baseline), then >= 300,000 row changes (inserts, updates, deletes in transactions
of 1,000 rows) on an 8-column table (int, text, numeric, timestamptz, text, jsonb,
int, boolean). Then, ``--runs`` times, one after the other, over the same WAL range:

* databus: ``PostgresSource.read`` (replication protocol, pgoutput decoding, typed
  values, Avro encoding, event encoding) appending every window to an
  ``EventBuffer``: the relay's whole capture path; with the C codec, and with the
  Python path (``compiled=False``). Outside the clock every event in the buffer is
  checked (both CRCs) and counted;
* with ``--exclude-columns REGEX``, databus with the C codec again, that
  ``exclude_columns`` set: the cost of leaving columns out (the decoder reads
  past them);
* baseline: ``pg_recvlogical --start --endpos`` on a test_decoding slot, writing
  the text to /dev/null (it decodes nothing on the client: it only prints text);
* the MariaDB source (``bench.binlog_decode``'s workload and reader: the same
  logical workload on the same table shape in a private MariaDB, binlog ROW/FULL,
  read with the C codec).

The PostgreSQL figures include the server's decoding of the WAL (once per slot and
reader); the MariaDB one does not have such a step (the server sends the binlog
as it is). Best of the runs for each.

    .venv/bin/python -m bench.postgres_capture [--rows 300000] [--runs 3] [--no-mariadb]
        [--exclude-columns '.*[.](note|doc|amount)']
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from tests.support.postgres import SETTINGS, PostgreSQL, bindir
from tests.support.sources import source_config

from databus.buffer import EventBuffer
from databus.core.checkpoint import Checkpoint
from databus.core.event import iter_events
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


def source(pg: PostgreSQL, compiled: bool, exclude: str | None = None) -> PostgresSource:
    """The source of one reader; its slot is the same every time (never acknowledged, so
    every run reads the same changes). ``exclude``: its exclude_columns regex."""
    name = "bench_cx" if exclude else "bench_c" if compiled else "bench_py"
    return PostgresSource(source_config(pg.source_url("bench"), [r"public\.t"],
                                        snapshot_mode="no_data",
                                        exclude_columns=[exclude] if exclude else []),
                          name=name, compiled=compiled)


def run_databus(src: PostgresSource, rows: int) -> tuple[int, float]:
    buf = EventBuffer(1 << 30)  # allocated before the clock starts
    events = 0
    stop = threading.Event()
    after = -1
    src.open()
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        while events < rows:
            for w in src.read(after, stop, 5.0):
                buf.append_window(w)
                events += w.count
                after = w.scn
        elapsed = time.perf_counter() - t0
        CPU[id(src)] = time.process_time() - c0
        # outside the clock: every event in the buffer is whole (both CRCs) and counted
        checked = 0
        cp = Checkpoint.flexible()
        while True:
            got = buf.read(cp, 64 << 20)
            if not got.windows:
                break
            checked += sum(e.src_id >= 0 for e in iter_events(got.data))
            cp = Checkpoint.after(got.last_scn)
        assert checked == events, f"buffer holds {checked} data events, source said {events}"
        return events, elapsed
    finally:
        src.close()
        buf.close()


CPU: dict[int, float] = {}  # the reader's own CPU seconds (the rest is waiting for the server)


def run_recvlogical(pg: PostgreSQL, slot: str, endpos: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([str(bindir() / "pg_recvlogical"), "-h", "127.0.0.1", "-p", str(pg.port),
                    "-U", "postgres", "-d", "bench", "-S", slot, "--start",
                    "--endpos", endpos, "--no-loop", "-f", "/dev/null"], check=True)
    return time.perf_counter() - t0


def mariadb_runs(rows: int, runs: int) -> list[tuple[int, float]]:
    """The MariaDB source on the same logical workload (bench.binlog_decode's)."""
    from tests.support.mariadb import MariaDB

    from bench import binlog_decode as bd
    from databus.sources.mysql.checks import parse_mysql_url
    from databus.sources.mysql.connection import master_status

    m = MariaDB(Path(tempfile.mkdtemp(prefix="pg-bench-mariadb-")) / "db",
                settings={"log-bin": "binlog", "server-id": "1", "binlog-format": "ROW",
                          "binlog-row-image": "FULL", "binlog-row-metadata": "FULL",
                          "max-binlog-size": "1073741824"})
    m.start()
    try:
        m.execute("CREATE DATABASE bench",
                  "CREATE TABLE bench.t (id INT PRIMARY KEY, name VARCHAR(64),"
                  " amount DECIMAL(12,2), at DATETIME(6), note TEXT, doc JSON, qty INT,"
                  " flag TINYINT)")
        url = parse_mysql_url(m.url)
        file, pos = master_status(url)
        bd.workload(m, rows)
        end_file, end_pos = master_status(url)
        start_scn = (int(file.rsplit(".", 1)[1]) << 32) | pos
        end_scn = (int(end_file.rsplit(".", 1)[1]) << 32) | end_pos
        return [bd.run_databus(m, start_scn, end_scn) for _ in range(runs)]
    finally:
        m.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=300_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-mariadb", action="store_true")
    ap.add_argument("--exclude-columns", metavar="REGEX",
                    help="also read with the C codec and this exclude_columns regex")
    args = ap.parse_args()
    readers = {"c": (True, None), "py": (False, None)}
    if args.exclude_columns:
        readers["cx"] = (True, args.exclude_columns)
    slots = str(args.runs + 6)
    settings = {**SETTINGS, "max_replication_slots": slots, "max_wal_senders": slots}
    results: dict[str, list[tuple[int, float]]] = {k: [] for k in (*readers, "td")}
    with PostgreSQL(settings=settings) as pg:
        pg.execute("CREATE DATABASE bench")
        pg.execute(DDL, *(f"CREATE PUBLICATION databus_bench_{k} FOR TABLE t" for k in readers),
                   *(f"SELECT pg_create_logical_replication_slot('bench_td{i}',"
                     " 'test_decoding')" for i in range(args.runs)), db="bench")
        for compiled, exclude in readers.values():  # their slots, before the workload
            src = source(pg, compiled, exclude)
            src.open()
            src.read(-1, threading.Event(), 0.1)
            src.close()
        t0 = time.perf_counter()
        workload(pg, args.rows)
        end = wal_lsn(pg)
        print(f"workload: {args.rows} row changes written in {time.perf_counter() - t0:.1f}s")
        cpu: dict[str, list[float]] = {k: [] for k in readers}
        for i in range(args.runs):
            for key, (compiled, exclude) in readers.items():
                src = source(pg, compiled, exclude)
                results[key].append(run_databus(src, args.rows))
                cpu[key].append(CPU[id(src)])
            results["td"].append((args.rows, run_recvlogical(pg, f"bench_td{i}", end)))
    if not args.no_mariadb:
        results["my"] = mariadb_runs(args.rows, args.runs)
    names = {"c": "databus PostgresSource -> EventBuffer (C codec)",
             "py": "databus PostgresSource, Python path",
             "cx": "databus PostgresSource (C), exclude_columns",
             "td": "pg_recvlogical, test_decoding (baseline)",
             "my": "databus MysqlSource (MariaDB) -> EventBuffer"}
    best: dict[str, float] = {}
    print(f"{'reader':<50} | {'rows':>7} | {'best s':>6} | {'rows/s (best)':>13} | all runs rows/s")
    for key, runs in results.items():
        rates = [n / s for n, s in runs]
        best[key] = max(rates)
        n, s = max(runs, key=lambda r: r[0] / r[1])
        print(f"{names[key]:<50} | {n:>7} | {s:>6.2f} | {best[key]:>13,.0f} |"
              f" {', '.join(f'{r:,.0f}' for r in rates)}")
    for key in readers:
        i = max(range(len(results[key])), key=lambda k: results[key][k][0] / results[key][k][1])
        print(f"{names[key]}: best run used {cpu[key][i]:.2f} s of CPU in"
              f" {results[key][i][1]:.2f} s (the rest: waiting for the server's decoding)")
    print(f"databus / pg_recvlogical: {best['c'] / best['td']:.2f} (goal >= 0.5)")
    print(f"databus C codec / Python path: {best['c'] / best['py']:.2f}")
    if "cx" in best:
        print(f"databus C codec, exclude_columns / without: {best['cx'] / best['c']:.2f}")
    if "my" in best:
        print(f"databus PostgreSQL / databus MariaDB: {best['c'] / best['my']:.2f}")


if __name__ == "__main__":
    main()
