"""``databus binlog-server`` judged by binlog readers nobody here wrote (issue 19).

A SQLite source -> relay -> binlog service (processes); python-mysql-replication and
``mariadb-binlog --read-from-remote-server`` read the served binlog and must rebuild the
source exactly: inserts, updates, deletes, unicode, NULLs, floats, blobs.
"""

from __future__ import annotations

import re
import shutil
import sqlite3
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pymysql
import pytest
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.row_event import WriteRowsEvent

from tests.support.binlog import parse_verbose
from tests.support.binlog_server import (
    ALL,
    KEYS,
    PASSWORD,
    USER,
    BinlogService,
    Rebuilt,
    apply_events,
    equal_to_source,
    make_source,
    rebuild,
    rebuilt_rows,
    wait_equal,
    write_changes,
)
from tests.support.pipeline import relay_max_scn
from tests.support.shop import txlog_max
from tests.support.wait import wait_until

# python-mysql-replication 1.0 opens its control connection with pymysql's old ``db=``
pytestmark = pytest.mark.filterwarnings("ignore:'db' is deprecated:DeprecationWarning")

def test_python_mysql_replication_rebuilds_every_table_from_start_position_and_gtids(
        tmp_path: Path) -> None:
    db = make_source(tmp_path)
    with BinlogService(db, tmp_path, ALL, extra=["--server-id", "42"]) as svc:
        write_changes(db, 60, seed=7)
        full = wait_equal(svc, db)
        assert len(set(full.gtids)) == len(full.gtids)
        assert svc.query("SELECT @@server_id")[0][0] == 42
        assert svc.query("select  version();") == (("8.0.36-databus",),)
        assert svc.query("SELECT VERSION() AS v, 1") == (("8.0.36-databus", 1),)
        # resume from a saved file/position: the first half, then the rest from there
        half = full.xid_positions[len(full.xid_positions) // 2]
        first = rebuild(svc, KEYS)
        part = Rebuilt()
        reader = BinLogStreamReader(connection_settings=svc.settings(), server_id=7002,
                                    blocking=False, resume_stream=True,
                                    log_file=svc.query("SHOW BINARY LOGS")[0][0], log_pos=4)
        try:
            for e in reader:
                apply_events(iter([e]), part, KEYS, reader)
                if part.xid_positions and part.xid_positions[-1] == half:
                    break
        finally:
            reader.close()
        rebuild(svc, KEYS, into=part, log_file=half[0], log_pos=half[1])
        assert all(rebuilt_rows(part, t) == rebuilt_rows(first, t) for t in ALL) and equal_to_source(db, part)
        # from a GTID set: everything after the first half of the transactions (how many
        # there are depends on how many commits each SQLite source poll found)
        uuid = svc.query("SELECT @@server_uuid")[0][0]
        k = len(full.gtids) // 2
        gt = rebuild(svc, KEYS, gtid_set=f"{uuid}:1-{k}")
        assert gt.gtids[0] == f"{uuid}:{k + 1}" and gt.gtids == full.gtids[k:]
        # a set with a hole: the transaction after the first half is sent, the one after
        # it skipped (the dumper leaves its skipping path once past the set's last GNO)
        holed = rebuild(svc, KEYS, gtid_set=f"{uuid}:1-{k}:{k + 2}")
        assert holed.gtids == [full.gtids[k], *full.gtids[k + 2:]]
        # more changes while it runs: a blocking reader sees them arrive
        write_changes(db, 20, seed=8)
        wait_equal(svc, db)


def test_changes_committed_before_the_service_starts_are_in_the_binlog(
        tmp_path: Path) -> None:
    db = make_source(tmp_path)
    with BinlogService(db, tmp_path, ALL, serve=False) as svc:
        write_changes(db, 30, seed=7)
        newest = txlog_max(db)  # the source's last commit
        wait_until(lambda: relay_max_scn(svc.relay_url) >= newest, 30,
                   "the relay to capture every change")
        svc.start_server()
        got = wait_equal(svc, db)
        # the first transaction of the source is the binlog's first row transaction
        assert got.gtids[0].endswith(":1")


def test_a_commit_reaches_a_blocking_reader_within_a_fraction_of_a_second(
        tmp_path: Path) -> None:
    """Commit -> visible to a blocking python-mysql-replication reader, with the
    service's default settings (relay: the SQLite source polls every 50 ms)."""
    db = make_source(tmp_path)
    with BinlogService(db, tmp_path, ALL) as svc:
        write_changes(db, 2, seed=7)
        wait_equal(svc, db)
        end_file, end_pos = svc.query("SHOW MASTER STATUS")[0][:2]
        seen: dict[int, float] = {}
        reader = BinLogStreamReader(connection_settings=svc.settings(), server_id=7005,
                                    blocking=True, resume_stream=True, log_file=end_file,
                                    log_pos=end_pos, only_events=[WriteRowsEvent],
                                    slave_heartbeat=1)

        def follow() -> None:
            for e in reader:
                for row in e.rows:
                    seen.setdefault(row["values"]["id"], time.monotonic())
                if len(seen) >= 10:
                    return

        t = threading.Thread(target=follow, daemon=True)
        t.start()
        time.sleep(0.5)  # the reader is connected and waiting
        con = sqlite3.connect(db, isolation_level=None)
        lags = []
        try:
            for i in range(10):
                key = 10_000 + i
                con.execute("INSERT INTO kinds (id, name) VALUES (?, 'lag')", (key,))
                committed = time.monotonic()
                wait_until(lambda key=key: key in seen, 30, "the reader to see the commit")
                lags.append(seen[key] - committed)
                time.sleep(0.2)  # one commit at a time: each waits for nothing else
        finally:
            con.close()
            t.join(10)
            reader.close()
        lags.sort()
        print(f"commit -> blocking reader: median {lags[5] * 1000:.0f} ms,"
              f" max {lags[-1] * 1000:.0f} ms")
        # the relay's 50 ms source poll and the converter's 2 ms flush delay; a loaded
        # machine adds scheduling delays, but never the long-poll's seconds
        assert lags[5] < 1.0, lags


def _decoded_value(raw: Any, want: Any) -> Any:
    """A value mariadb-binlog printed, as the Python type of SQLite's ``want``."""
    if raw is None or want is None:
        return raw
    if isinstance(raw, bytes):  # a quoted string: text as UTF-8, BLOBs as they are
        return raw.decode() if isinstance(want, str) else raw
    text = raw.split(" (")[0]  # a negative integer is printed '-5 (18446744073709551611)'
    return float(text) if isinstance(want, float) else int(text)


def test_mariadb_binlog_dumps_the_files_and_its_decoded_rows_match(tmp_path: Path) -> None:
    tool = shutil.which("mariadb-binlog")
    if tool is None:
        pytest.skip("mariadb-binlog (Debian's mariadb-client) is not installed")
    db = make_source(tmp_path)
    with BinlogService(db, tmp_path, ALL) as svc:
        write_changes(db, 40, seed=7)
        got = wait_equal(svc, db)
        files = [r[0] for r in svc.query("SHOW BINARY LOGS")]
        out = subprocess.run(
            [tool, "--read-from-remote-server", "--host=127.0.0.1", f"--port={svc.port}",
             f"--user={USER}", f"--password={PASSWORD}", "--verbose", "--to-last-log",
             files[0]], capture_output=True, timeout=120, check=False)
        assert out.returncode == 0, out.stderr[-2000:]
        assert b"ERROR" not in out.stderr, out.stderr[-2000:]
        decoded = parse_verbose(out.stdout, out.stderr)
        assert len(decoded.changes) == got.rows
        assert decoded.gtids == len(got.gtids)
        # every table replayed from mariadb-binlog's decoded rows equals SQLite's
        con = sqlite3.connect(db)
        for table in ALL:
            names = [r[1] for r in con.execute(f"PRAGMA table_info({table})")]
            key = [names.index(k) for k in KEYS[table]]
            want = {tuple(r[k] for k in key): tuple(r)
                    for r in con.execute(f"SELECT * FROM {table}")}
            rows: dict[tuple[object, ...], tuple[object, ...]] = {}
            sample = next(iter(want.values()), ())
            for name, op, before, after in decoded.changes:
                if name != f"main.{table}":
                    continue
                for image, put in ((before, False), (after, True)):
                    if image is None:
                        continue
                    like = [next((r[i] for r in want.values() if r[i] is not None), None)
                            for i in range(len(names))] if sample else [None] * len(names)
                    row = tuple(_decoded_value(v, w) for v, w in zip(image, like, strict=True))
                    k = tuple(row[i] for i in key)
                    if put:
                        assert op == "UPDATE" or k not in rows, (table, op, row)
                        rows[k] = row
                    else:
                        assert rows.pop(k) == row, (table, op, row)
            assert rows == want, table
        con.close()
        # one decoded value: the unicode text arrives as the source wrote it
        assert "zoë ☃ 𝄞 1'".encode() in out.stdout


def test_rows_larger_than_a_read_chunk_arrive_whole_to_one_client_and_four_at_once(
        tmp_path: Path) -> None:
    """The dumper reads a file in chunks (16 KiB growing to ``dump.CHUNK``) and frames the
    whole events of each; an event longer than a chunk is read again whole. Rows of up
    to 3 MiB between small ones: python-mysql-replication rebuilds them equal and
    ``mariadb-binlog`` decodes every event without an error. Four ``mariadb-binlog``
    runs at once (dumps from one start share their chunks' packets: chunks.FramedChunks)
    each print exactly what one run alone printed."""
    from databus.binlog.dump import CHUNK

    db = make_source(tmp_path)
    with BinlogService(db, tmp_path, ALL) as svc:
        con = sqlite3.connect(db, isolation_level=None)
        sizes = [10, CHUNK - 100, 20, CHUNK + 1, 3 << 20, 5, 2 * CHUNK + 7, 16]
        for i, size in enumerate(sizes):
            con.execute("INSERT INTO kinds VALUES (?, ?, ?, ?, ?)",
                        (i + 1, f"row {i}", float(i), bytes([i]) * size, size))
        con.execute("UPDATE kinds SET data = ? WHERE id = 2", (b"\x07" * (2 << 20),))
        con.close()
        got = wait_equal(svc, db)
        assert max(len(r["data"]) for r in rebuilt_rows(got, "kinds").values()) == 3 << 20
        # its stderr is a file: plain log lines (Rich's rendering cost ~0.7 ms a record,
        # paid in every connection's set-up), none per connection from mysql-mimic
        log = (tmp_path / "binlog-server.log").read_text()
        assert re.search(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO databus\.binlog\.server:"
                         r" binlog dump for 127\.0\.0\.1:\d+ from ", log, re.MULTILINE), log[-2000:]
        assert "Started new connection" not in log
        out = svc.mariadb_binlog()
        if out is not None:
            assert len(parse_verbose(out.stdout, out.stderr).changes) == got.rows
            tool = shutil.which("mariadb-binlog")
            assert tool is not None
            args = [tool, "--read-from-remote-server", "--host=127.0.0.1",
                    f"--port={svc.port}", f"--user={USER}", f"--password={PASSWORD}",
                    "--verbose", "--to-last-log", svc.query("SHOW BINARY LOGS")[0][0]]
            runs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                    for _ in range(4)]
            done = [(run.communicate(timeout=120), run.returncode) for run in runs]
            for (stdout, stderr), code in done:
                assert code == 0 and b"ERROR" not in stderr, stderr[-2000:]
                assert stdout == out.stdout


def test_a_client_reconnecting_after_a_server_restart_loses_and_repeats_nothing(
        tmp_path: Path) -> None:
    db = make_source(tmp_path)
    with BinlogService(db, tmp_path, ALL) as svc:
        write_changes(db, 30, seed=7)
        wait_equal(svc, db)
        got = Rebuilt()
        pos: list[tuple[str, int]] = []
        guard = threading.Lock()  # the follower applies while the test compares

        def caught_up() -> bool:
            with guard:
                return equal_to_source(db, got)
        first = svc.query("SHOW BINARY LOGS")[0][0]

        def follow(log_file: str, log_pos: int) -> None:
            reader = BinLogStreamReader(connection_settings=svc.settings(), server_id=7004,
                                        blocking=True, resume_stream=True, log_file=log_file,
                                        log_pos=log_pos, slave_heartbeat=1)
            try:
                for e in reader:
                    with guard:
                        apply_events(iter([e]), got, KEYS, reader)
                        if got.xid_positions:
                            pos[:] = [got.xid_positions[-1]]
            except pymysql.err.OperationalError:
                pass  # the server went away
            finally:
                reader.close()

        t = threading.Thread(target=follow, args=(first, 4), daemon=True)
        t.start()
        wait_until(caught_up, 60, "the follower to catch up")
        svc.server.terminate()
        svc.server.wait(30)
        t.join(30)
        assert not t.is_alive()
        write_changes(db, 20, seed=9)  # changes while the binlog server is down
        svc.start_server()
        # the client resumes at the last whole transaction it applied
        t = threading.Thread(target=follow, args=pos[0], daemon=True)
        t.start()
        wait_until(caught_up, 90, "the follower to catch up after the restart")
        assert len(got.gtids) == len(set(got.gtids))
        svc.server.terminate()
        t.join(30)


def test_a_position_the_server_does_not_have_is_error_1236_never_a_jump(
        tmp_path: Path) -> None:
    db = make_source(tmp_path)
    with BinlogService(db, tmp_path, ALL,
                       config="rotate_bytes: 4096\nretention: 1\npurge_interval: 0.2\n") as svc:
        write_changes(db, 5, seed=7)
        wait_equal(svc, db)
        write_changes(db, 40, seed=10)  # several files; the first ones age past the retention

        def purged() -> bool:
            return svc.query("SHOW BINARY LOGS")[0][0] != "databus-bin.000001"

        wait_until(purged, 60, "the first binlog file to be purged")
        for kwargs in ({"log_file": "databus-bin.000001", "log_pos": 4},
                       {"log_file": "databus-bin.000999", "log_pos": 4}):
            with pytest.raises(pymysql.err.OperationalError) as err:
                rebuild(svc, KEYS, **kwargs)  # type: ignore[arg-type]
            assert err.value.args[0] == 1236
        # a position inside an event of a live file: refused, never events from there
        live = svc.query("SHOW BINARY LOGS")[-1][0]
        second = svc.query(f"SHOW BINLOG EVENTS IN '{live}'")[1][1]  # after the FDE
        with pytest.raises(pymysql.err.OperationalError) as err:
            rebuild(svc, KEYS, log_file=live, log_pos=second + 1)
        assert err.value.args[0] == 1236 and "impossible position" in err.value.args[1]
        uuid = svc.query("SELECT @@server_uuid")[0][0]
        with pytest.raises(pymysql.err.OperationalError) as err:
            rebuild(svc, KEYS, gtid_set=f"{uuid}:1")
        assert err.value.args[0] == 1236 and "purged required binary logs" in err.value.args[1]
        # the connection's other answers stay MySQL errors, never a dropped connection
        con = svc.connect()
        with con.cursor() as cur:
            for bad in ("SELECT * FROM nowhere", "DROP DATABASE shop", "no sql at all"):
                with pytest.raises(pymysql.err.MySQLError):
                    cur.execute(bad)
            cur.execute("SELECT 1")
            assert cur.fetchone() == (1,)
        con.close()
        with pytest.raises(pymysql.err.OperationalError) as err:
            pymysql.connect(host="127.0.0.1", port=svc.port, user=USER, password="wrong")
        assert err.value.args[0] == 1045
