"""An incremental snapshot asked through ``POST /signal`` of a ``databus relay`` process
(PostgreSQL source, persistent buffer), under concurrent writers, with the relay killed
with SIGKILL in the middle of the snapshot (paused there by a signal, so that the kill
falls inside it whatever the machine's speed; the restarted relay has it paused and
resumes it): the recording consumer, applying events in
order, ends with exactly the keys PostgreSQL holds, and the snapshot completes."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.support.pg_pipeline import Pipeline
from tests.support.pipeline import relay_args
from tests.support.postgres import SETTINGS, PostgreSQL
from tests.support.verify import read_windows

# 24 snapshot chunks of 1,024 rows: with 6, a loaded clean-clone CI run's pause, sent right
# behind the snapshot, landed on its last chunk and the snapshot completed instead
ROWS = 24000


@dataclass
class SignalPipeline(Pipeline):
    def args(self, name: str) -> list[str]:
        if name == "relay":
            return relay_args(self.port, source=self.server.source_url(self.db),
                              tables=r"public\..*", buffer_path=self.tmp / "relay.buf",
                              buffer_size=64 << 20,
                              more=("--create-publication",
                                    "--slot", "databus_relay"))  # wait_streaming's
        return super().args(name)


@pytest.fixture
def pipeline(tmp_path: Path) -> Iterator[SignalPipeline]:
    with PostgreSQL(settings={**SETTINGS, "synchronous_commit": "on"}) as server:
        server.execute("CREATE DATABASE shop")
        server.execute("CREATE TABLE items (id int PRIMARY KEY, v text, n int)",
                       f"INSERT INTO items SELECT g, 'v' || g, g FROM generate_series(1, {ROWS})"
                       " g", "CREATE TABLE marker (id int PRIMARY KEY)", db="shop")
        with SignalPipeline(tmp_path, server, "shop") as p:
            p.start("relay")
            p.wait_streaming()
            p.start("recorder")
            yield p


def connect(p: Pipeline) -> psycopg.Connection[Any]:
    return psycopg.connect(f"host=127.0.0.1 port={p.server.port} user=postgres dbname={p.db}",
                           autocommit=True)


def source_stat(p: Pipeline, name: str) -> float:
    """A counter of the running relay's source (``/admin``); 0 while it starts."""
    try:
        admin = httpx.get(f"{p.url}/admin", timeout=10).json()
    except httpx.HTTPError:
        return 0.0
    return float(admin.get("source", {}).get(name, 0.0))


def consumer_keys(p: Pipeline, table: str) -> set[int]:
    """Keys of ``table`` after applying every window once, in SCN order."""
    windows: dict[int, list[tuple[str, str, str]]] = {}
    for scn, events in read_windows(p.record):
        windows.setdefault(scn, events)
    keys: set[int] = set()
    for scn in sorted(windows):
        for t, op, key in windows[scn]:
            if t != table:
                continue
            if op == "d":
                keys.discard(json.loads(key))
            else:
                keys.add(json.loads(key))
    return keys


def count_kind(p: Pipeline, table: str, op: str) -> int:
    windows: dict[int, list[tuple[str, str, str]]] = {}
    for scn, events in read_windows(p.record):
        windows.setdefault(scn, events)
    return sum(1 for ev in windows.values() for t, o, _ in ev if t == table and o == op)


@pytest.mark.slow
def test_signal_snapshot_through_the_relay_with_a_kill_rebuilds_the_keys(
        pipeline: SignalPipeline) -> None:
    p = pipeline
    stop = threading.Event()
    errors: list[BaseException] = []

    def write() -> None:
        rng = random.Random(11)
        try:
            with connect(p) as con:
                while not stop.is_set():
                    k = rng.randrange(1, ROWS + 1500)
                    if rng.random() < 0.4:
                        con.execute("DELETE FROM items WHERE id = %s", [k])
                    else:
                        con.execute("INSERT INTO items VALUES (%s, 'w', 0) ON CONFLICT (id) DO"
                                    " UPDATE SET n = items.n + 1", [k])
                    time.sleep(0.003)
        except BaseException as exc:
            errors.append(exc)

    def signal(kind: str, data: dict[str, Any] | None = None) -> None:
        r = httpx.post(f"{p.url}/signal", json={"type": kind, "data": data or {}}, timeout=30)
        assert r.status_code == 202, r.text

    thread = threading.Thread(target=write)
    thread.start()
    try:
        signal("execute-snapshot", {"data-collections": ["public\\.items"]})
        signal("pause-snapshot")  # right behind: a chunk or two, then paused
        p.wait("the snapshot paused", lambda: source_stat(p, "snapshot_paused") == 1, 120,
               interval=0.3)
        top = p.max_scn()  # the consumer catches up; the writers go on
        p.wait("the recorder to catch up", lambda: (w := read_windows(p.record)) != []
               and w[-1][0] >= top, 120, interval=0.3)
        p.kill("relay")  # in the middle of the snapshot
        p.start("relay")
        # the restarted relay has the snapshot where its buffer left it: paused
        p.wait("the snapshot restored", lambda: source_stat(p, "snapshot_paused") == 1, 120,
               interval=0.3)
        assert source_stat(p, "snapshot_completed_total") == 0
        signal("resume-snapshot")
        p.wait("the snapshot to complete",
               lambda: source_stat(p, "snapshot_completed_total") >= 1, 240, interval=0.5)
    finally:
        stop.set()
        thread.join(60)
    assert not errors, errors
    with connect(p) as con:
        con.execute("INSERT INTO marker VALUES (1)")
        want = {int(r[0]) for r in con.execute("SELECT id FROM items").fetchall()}
    p.wait("the marker", lambda: 1 in consumer_keys(p, "marker"), 120, interval=0.3)
    assert consumer_keys(p, "items") == want
    assert source_stat(p, "snapshot_running") == 0.0
    assert count_kind(p, "notifications", "c") >= 3  # STARTED, CHUNK_DONE..., COMPLETED
