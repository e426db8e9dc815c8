"""kill -9 of a ``databus relay`` in the middle of a SQLite snapshot.

A table of existing rows is snapshotted (``initial`` mode, small chunks) while
a writer keeps inserting, updating and deleting the same keys; the relay
(persistent buffer) is killed with SIGKILL several times and restarted. It
must resume after the last chunk its buffer holds (one snapshot started, every
restart resumed it), and ``databus replicate`` into another SQLite file must
end equal to the table.
"""

from __future__ import annotations

import json
import random
import sqlite3
import sys
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.procs import DATABUS, free_port, kill9, snapshot_reads, spawn, stop, wait_http
from tests.support.wait import wait_until
from tests.support.writers import KeyChurn

pytestmark = pytest.mark.slow

ROWS, CHUNK = 150_000, 100


def _progress(state: Path) -> list[tuple[int, dict[str, Any] | None]]:
    try:
        return [(int(s), st) for s, st in json.loads(state.read_text())["records"]]
    except (OSError, ValueError, KeyError):
        return []


def _completed(state: Path) -> bool:
    records = _progress(state)
    return bool(records) and records[-1][1] is None


def _rows(db: Path) -> list[tuple[Any, ...]]:
    with closing(sqlite3.connect(db, timeout=30)) as con:
        return [tuple(r) for r in con.execute("SELECT id, v, s FROM t ORDER BY id")]


def test_kill9_relay_mid_snapshot_resumes_and_replica_equals(tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    with closing(sqlite3.connect(db, isolation_level=None)) as con:
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v INTEGER, s TEXT)")
        con.execute("BEGIN")
        con.executemany("INSERT INTO t VALUES (?, ?, 'old')", [(i, i) for i in range(ROWS)])
        con.execute("COMMIT")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = tmp_path / "relay.yaml"
    config.write_text(yaml.safe_dump({
        "name": "snap",
        "source": {"url": f"sqlite:///{db}", "tables": ["t"], "snapshot_chunk_size": CHUNK,
                   "poll_interval": 0.01},  # snapshot_mode: the default, initial
        "buffer": {"path": str(tmp_path / "relay.buf"), "capacity_bytes": 256 << 20,
                   "flush_interval": 0.1},
        "http": {"port": port}}))
    state = tmp_path / "snap.sqlite-snapshot.json"
    relay_args = [*DATABUS, "relay", "--config", str(config)]
    log = tmp_path / "relay.log"
    writer = KeyChurn.sqlite(db, keys=ROWS + 500)
    procs: list[Any] = []
    try:
        relay = spawn(relay_args, log)
        procs.append(relay)
        wait_http(f"{url}/admin", relay)
        replica = tmp_path / "replica.db"
        procs.append(spawn([*DATABUS, "replicate", "--relay", url, "--target",
                            f"sqlite:///{replica}"], tmp_path / "sink.log"))
        writer.start()
        rng = random.Random(3)
        kills = 0
        while kills < 4:
            time.sleep(rng.uniform(0.2, 0.6))
            if _completed(state):
                break
            kill9(relay)
            kills += 1
            relay = procs[0] = spawn(relay_args, log)
            wait_http(f"{url}/admin", relay)
        assert kills >= 2, "the snapshot ended before the relay could be killed twice"
        wait_until(lambda: _completed(state), 240, "the snapshot to complete",
                   interval=0.3)
        writer.stop.set()
        writer.join()
        text = " ".join(log.read_text(errors="replace").split())  # the log wraps lines
        assert text.count(": started (") == 1, "a restart started the snapshot over"
        assert text.count(": resuming after scn") >= kills - 1
        reads = snapshot_reads(url)
        assert ROWS * 0.9 <= reads < 2 * ROWS, (reads, kills)

        want = _rows(db)

        def replica_rows() -> list[tuple[Any, ...]]:
            try:
                return _rows(replica)
            except sqlite3.Error:  # not created yet, or locked by the sink
                return []

        wait_until(lambda: replica_rows() == want, 120, "the replica to equal the source",
                   interval=0.5)
        assert writer.count > 100
    finally:
        writer.stop.set()
        for p in procs:
            stop(p)
    print(f"\n{kills} kills mid-snapshot, {reads} r events for {ROWS} rows,"
          f" {writer.count} concurrent writes", file=sys.stderr)
