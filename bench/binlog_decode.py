"""Binlog -> encoded events: rows/s of databus's MariaDB source beside
python-mysql-replication and mariadb-binlog on the same binlog.

A private MariaDB (binlog ROW/FULL/FULL) gets >= 300,000 row changes (inserts,
updates, deletes) on an 8-column table (int, varchar, decimal, datetime(6),
text, json, int, tinyint). Then, in the same run, over the same binlog range:

* databus: ``MysqlSource.read`` (replication protocol, CRC checks, row
  decoding, Avro encoding, event encoding) appending every window to an
  ``EventBuffer`` - the relay's whole capture path;
* baseline: python-mysql-replication's ``BinLogStreamReader`` iterating every
  row of every rows event (``pip install mysql-replication``);
* reference: ``mariadb-binlog --base64-output=decode-rows -v`` on the files.

Then ``--one-row`` one-row transactions of a captured table, each followed by one of
a table nobody captures (the binlog of a relay capturing some tables of a busy server),
read the same two ways: windows read from a backlog still leave in batches (up to 64 a
read), whatever events lie between them.

Every read is the relay fetcher's (0.5 s deadline); no read waits for it, since the
whole range is in the binlog before the clock starts (the last read's time is shown).

    .venv/bin/python -m bench.binlog_decode [--rows 300000] [--one-row 20000]
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from tests.support.mariadb import MariaDB
from tests.support.sources import mysql_source

from databus.buffer import EventBuffer
from databus.core.checkpoint import Checkpoint
from databus.core.event import iter_events
from databus.sources.mysql.connection import master_status


def workload(m: MariaDB, rows: int) -> None:
    con = m.connect("bench")
    inserts, updates = rows * 2 // 3, rows // 5
    deletes = rows - inserts - updates
    try:
        with con.cursor() as cur:
            batch = 1000
            for start in range(0, inserts, batch):
                values = [(i, f"name-{i}", f"{i}.25", "2024-05-06 07:08:09.123456",
                           "some text " * 3, f'{{"i": {i}, "tags": ["a", "b"]}}', i % 97, i % 2)
                          for i in range(start, min(start + batch, inserts))]
                cur.executemany("INSERT INTO t VALUES (%s,%s,%s,%s,%s,%s,%s,%s)", values)
                con.commit()
            for start in range(0, updates, batch):
                cur.execute("UPDATE t SET qty = qty + 1, amount = amount + 1 WHERE id >= %s"
                            " AND id < %s", (start, start + batch))
                con.commit()
            for start in range(inserts - deletes, inserts, batch):
                cur.execute("DELETE FROM t WHERE id >= %s AND id < %s", (start, start + batch))
                con.commit()
    finally:
        con.close()


def one_row_workload(m: MariaDB, n: int) -> None:
    """``n`` one-row transactions into bench.t2, each after one into bench.other (so the
    binlog ends with a captured commit: the range's end is a window's SCN)."""
    con = m.connect("bench")
    try:
        with con.cursor() as cur:
            for i in range(n):
                cur.execute("INSERT INTO other VALUES (%s, 'noise')", (i,))
                cur.execute("INSERT INTO t2 VALUES (%s,%s,%s,%s,%s,%s,%s,%s)",
                            (i, f"name-{i}", f"{i}.25", "2024-05-06 07:08:09.123456",
                             "some text", f'{{"i": {i}}}', i % 97, i % 2))
    finally:
        con.close()


def run_databus(m: MariaDB, start_scn: int, end_scn: int, *, compiled: bool = True,
                table: str = r"bench\.t") -> tuple[int, float]:
    src = mysql_source(m.url, [table], compiled=compiled)
    buf = EventBuffer(1 << 30)  # allocated before the clock starts
    events = 0
    stop = threading.Event()
    t0 = time.perf_counter()
    after = start_scn
    last = (0.0, 0)
    reads = windows_read = 0
    try:
        # the relay fetcher's read (0.5 s deadline). Every window of the range is in the
        # binlog before the clock starts, so no read waits for its deadline: a read
        # holding windows returns once the stream has nothing more at once, also when
        # events follow the range's last window (here the source's signal-table DDL).
        # The last read's time is printed: capture, not a wait.
        while after < end_scn:
            r0 = time.perf_counter()
            windows = src.read(after, stop, 0.5)
            for w in windows:
                buf.append_window(w)
                events += w.count
                after = w.scn
            last = (time.perf_counter() - r0, len(windows))
            reads += 1
            windows_read += len(windows)
        elapsed = time.perf_counter() - t0
        print(f"{table}, {'compiled' if compiled else 'Python'} decoder: {windows_read}"
              f" windows in {reads} reads; the last read took {last[0] * 1000:.1f} ms for"
              f" {last[1]} windows")
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
    finally:
        src.close()
        buf.close()
    return events, elapsed


def run_pymysqlreplication(m: MariaDB, file: str, pos: int, total: int,
                           table: str = "t", gtid: str | None = None) -> tuple[int, float]:
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

    settings = {"host": "127.0.0.1", "port": m.port, "user": "root", "passwd": ""}
    # by GTID (MariaDB), a non-blocking dump does not end at the binlog's end: blocking,
    # and the loop below stops at the last row
    stream = BinLogStreamReader(connection_settings=settings, server_id=4242, log_file=file,
                                log_pos=pos, resume_stream=True, blocking=gtid is not None,
                                is_mariadb=True, only_tables=[table], auto_position=gtid,
                                only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent])
    n = 0
    t0 = time.perf_counter()
    try:
        for event in stream:
            for _row in event.rows:
                n += 1
            if n >= total:
                break
    finally:
        stream.close()
    return n, time.perf_counter() - t0


def run_mariadb_binlog(m: MariaDB, files: list[str], pos: int) -> float:
    paths = [str(m.datadir / f) for f in files]
    t0 = time.perf_counter()
    subprocess.run(["mariadb-binlog", "--no-defaults", "--base64-output=decode-rows", "-v",
                    f"--start-position={pos}", *paths], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=300_000)
    ap.add_argument("--one-row", type=int, default=20_000,
                    help="one-row transactions of the interleaved run (0: none)")
    args = ap.parse_args()
    m = MariaDB(Path(tempfile.mkdtemp(prefix="binlog-bench-")) / "db",
                settings={"log-bin": "binlog", "server-id": "1", "binlog-format": "ROW",
                          "binlog-row-image": "FULL", "binlog-row-metadata": "FULL",
                          "max-binlog-size": "1073741824",
                          "innodb-flush-log-at-trx-commit": "2"})
    m.start()
    try:
        m.execute("CREATE DATABASE bench",
                  "CREATE TABLE bench.t (id INT PRIMARY KEY, name VARCHAR(64),"
                  " amount DECIMAL(12,2), at DATETIME(6), note TEXT, doc JSON, qty INT,"
                  " flag TINYINT)", "CREATE TABLE bench.t2 LIKE bench.t",
                  "CREATE TABLE bench.other (id INT PRIMARY KEY, v VARCHAR(16))")
        from databus.sources.mysql.checks import parse_mysql_url

        url = parse_mysql_url(m.url)
        file, pos = master_status(url)
        t0 = time.perf_counter()
        workload(m, args.rows)
        print(f"workload: {args.rows} row changes written in {time.perf_counter() - t0:.1f}s")
        end_file, end_pos = master_status(url)
        number = int(file.rsplit(".", 1)[1])
        start_scn = (number << 32) | pos
        end_scn = (int(end_file.rsplit(".", 1)[1]) << 32) | end_pos
        files = [f"{file.rsplit('.', 1)[0]}.{k:06d}" for k in
                 range(number, int(end_file.rsplit(".", 1)[1]) + 1)]

        ours, ours_s = run_databus(m, start_scn, end_scn)
        py, py_s = run_databus(m, start_scn, end_scn, compiled=False)
        theirs, theirs_s = run_pymysqlreplication(m, file, pos, ours)
        native_s = run_mariadb_binlog(m, files, pos)
        small = None
        if args.one_row:
            file2, pos2 = master_status(url)
            gtid = m.gtid_pos()  # python-mysql-replication on MariaDB starts by GTID
            t0 = time.perf_counter()
            one_row_workload(m, args.one_row)
            print(f"workload: {args.one_row} one-row transactions, each followed by one of an"
                  f" uncaptured table, written in {time.perf_counter() - t0:.1f}s")
            end2 = master_status(url)
            start2 = (int(file2.rsplit(".", 1)[1]) << 32) | pos2
            stop2 = (int(end2[0].rsplit(".", 1)[1]) << 32) | end2[1]
            small = (run_databus(m, start2, stop2, table=r"bench\.t2"),
                     run_pymysqlreplication(m, file2, pos2, args.one_row, table="t2",
                                            gtid=gtid))
    finally:
        m.stop()
    print(f"{'reader':<44} | {'rows':>8} | {'seconds':>7} | {'rows/s':>10}")
    print(f"{'databus MysqlSource -> EventBuffer':<44} | {ours:>8} | {ours_s:>7.2f} |"
          f" {ours / ours_s:>10,.0f}")
    print(f"{'databus, Python decoder (no C codec)':<44} | {py:>8} | {py_s:>7.2f} |"
          f" {py / py_s:>10,.0f}")
    print(f"{'python-mysql-replication (baseline)':<44} | {theirs:>8} | {theirs_s:>7.2f} |"
          f" {theirs / theirs_s:>10,.0f}")
    print(f"{'mariadb-binlog -v decode-rows (native ref.)':<44} | {ours:>8} | {native_s:>7.2f} |"
          f" {ours / native_s:>10,.0f}")
    if small is not None:
        (n1, s1), (n2, s2) = small
        print(f"one-row transactions among an uncaptured table's: databus {n1} rows in"
              f" {s1:.2f}s = {n1 / s1:,.0f} rows/s; python-mysql-replication {n2} rows in"
              f" {s2:.2f}s = {n2 / s2:,.0f} rows/s; ratio {(n1 / s1) / (n2 / s2):.2f}x")
    print(f"databus / python-mysql-replication: {(ours / ours_s) / (theirs / theirs_s):.2f}x"
          f" (target >= 10x)")


if __name__ == "__main__":
    main()
