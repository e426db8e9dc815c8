"""PostgreSQL -> ``databus relay`` (a process, persistent buffer) -> a recording consumer,
with transactions larger than ``logical_decoding_work_mem`` (64kB here) that the server
streams while they run (protocol 2), and the relay killed with SIGKILL while they are
open.

Two writers commit small random transactions; a third connection runs large ones
(thousands of rows in steps, with savepoints rolled back, one of them rolled back
whole) at the same time. The relay is killed in the middle of each large transaction
and started again. At the end the consumer's windows are exactly the committed
transactions in commit order, each whole in one window (the large ones too, without
their rolled-back parts; the aborted one nowhere), and the server's counters show
that it streamed.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.pg_pipeline import SCHEMA, Pipeline, Writer
from tests.support.postgres import SETTINGS, PostgreSQL
from tests.support.shop import Change
from tests.support.verify import check_delivery, read_windows

LARGE = 3  # large transactions, the last rolled back


class StreamingPipeline(Pipeline):
    def args(self, name: str) -> list[str]:
        out = super().args(name)
        if name == "relay":  # room for every window: nothing evicted
            out[out.index("--buffer-size") + 1] = str(64 << 20)
        return out


@pytest.fixture
def pipeline(tmp_path: Path) -> Iterator[StreamingPipeline]:
    settings = {**SETTINGS, "synchronous_commit": "on", "logical_decoding_work_mem": "64kB"}
    with PostgreSQL(settings=settings) as server:
        server.execute("CREATE DATABASE shop")
        server.execute(*SCHEMA[:-1], "CREATE TABLE bulk (id int PRIMARY KEY, pad text)",
                       "CREATE PUBLICATION databus_relay FOR TABLE accounts, orders, items,"
                       " bulk", db="shop")
        with StreamingPipeline(tmp_path, server, "shop") as p:
            p.start("relay")
            p.wait_streaming()
            p.start("recorder")
            yield p


def streamed_txns(p: Pipeline) -> int:
    with psycopg.connect(f"host=127.0.0.1 port={p.server.port} user=postgres"
                         f" dbname={p.db}") as con:
        row = con.execute("SELECT coalesce(sum(stream_txns), 0) FROM pg_stat_replication_slots"
                          " WHERE slot_name = 'databus_relay'").fetchone()
    return int(row[0]) if row else 0


@pytest.mark.slow
def test_streamed_large_transactions_with_relay_kills_are_whole_and_in_order(
        pipeline: StreamingPipeline) -> None:
    p = pipeline
    commits = threading.Lock()
    committed: list[list[Change]] = []
    rolled_back: list[list[Change]] = []
    errors: list[BaseException] = []
    done = threading.Event()
    writers = [Writer(p.server, p.db, i, 300 + i, commits, committed, rolled_back)
               for i in range(2)]
    large_open = threading.Event()
    large_step = threading.Event()  # the relay was killed and restarted meanwhile

    def small(w: Writer) -> None:
        try:
            while not done.is_set():
                w.transaction()
                time.sleep(0.01)
        except BaseException as exc:
            errors.append(exc)

    def large() -> None:
        con: psycopg.Connection[Any] = psycopg.connect(
            f"host=127.0.0.1 port={p.server.port} user=postgres dbname={p.db}")
        try:
            next_id = 0
            for n in range(LARGE):
                changes: list[Change] = []
                for step in range(8):
                    ids = list(range(next_id, next_id + 250))
                    next_id += 250
                    if step in (2, 5):  # a subtransaction rolled back
                        con.execute("SAVEPOINT s")
                    con.execute("INSERT INTO bulk SELECT g, repeat('p', 200) FROM"
                                " unnest(%s::int[]) g", [ids])
                    if step in (2, 5):
                        con.execute("ROLLBACK TO SAVEPOINT s")
                    else:
                        changes.extend(("bulk", "c", json.dumps(i)) for i in ids)
                    if step == 3:
                        large_open.set()
                        assert large_step.wait(120), "the relay was not restarted"
                        large_step.clear()
                    time.sleep(0.2)
                if n == LARGE - 1:
                    con.rollback()
                    rolled_back.append(changes)
                else:
                    with commits:
                        con.commit()
                        committed.append(changes)
        except BaseException as exc:
            errors.append(exc)
        finally:
            large_open.set()
            con.close()

    threads = [threading.Thread(target=small, args=(w,)) for w in writers]
    threads.append(threading.Thread(target=large))
    for t in threads:
        t.start()
    try:
        for _ in range(LARGE):
            assert large_open.wait(120), "the large transaction did not start"
            large_open.clear()
            time.sleep(0.5)  # its first blocks reach the relay
            p.kill("relay")
            time.sleep(0.3)
            p.start("relay")
            large_step.set()
        threads[-1].join(300)
    finally:
        done.set()
        for t in threads:
            t.join(120)
        for w in writers:
            w.con.close()
    assert not errors, errors
    p.wait_delivered(sum(len(t) for t in committed))
    stats = check_delivery(read_windows(p.record), committed, rolled_back)
    assert streamed_txns(p) >= LARGE
    print(f"streamed workload: {stats}, {LARGE} relay kills inside large transactions")
