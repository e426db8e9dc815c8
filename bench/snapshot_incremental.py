"""Incremental snapshot of a large table while writers run, beside mariadb-dump.

A private MariaDB gets a table of ``--rows`` rows (int key, varchar, decimal,
datetime(6), text, int). A new relay source in ``initial`` mode snapshots it by
watermark chunks while a writer inserts, updates and deletes random keys at
full speed. A consumer applies every event (stream and ``r``) to a dict. We
report:

* snapshot rows/s (``r`` events delivered / time from STARTED to COMPLETED,
  the consumer's decoding included, and the source's own share of it), beside
  ``mariadb-dump --single-transaction`` of the same table in the same run (the
  native baseline: one consistent read to a file, no streaming);
* the longest time one writer statement waited during the snapshot;
* whether the consumer's copy equals the table at the end (it must);
* the source's chunk path alone (no writers, no consumer): the whole table read
  by chunk SELECTs and turned into ``r`` events, with the compiled text-row
  codec and with the Python path (pymysql values + fastavro), which give the
  same bytes;
* end to end (issue #18's figure): the same snapshot, under the same writer,
  through the real pipeline: a ``databus relay`` process capturing the table
  (``snapshot_mode: initial``) and a :class:`~databus.client.DatabusClient` in
  this process whose consumer takes batches (``on_data_events``, the compiled
  batch decoder) and applies them to a dict; rows/s from the STARTED to the
  COMPLETED notification as the consumer receives them, and the copy checked
  against the table. Relay and consumer run side by side, as deployed, instead
  of one after the other in one thread.

    .venv/bin/python -m bench.snapshot_incremental [--rows 1000000] [--chunk 4096]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from tests.support.mariadb import MariaDB
from tests.support.procs import free_port
from tests.support.sources import mysql_source

from databus.client import (
    ClientConfig,
    Consumer,
    DataBatch,
    DatabusClient,
    MemoryCheckpointStore,
)
from databus.core import event as ev
from databus.core.envelope import decode_images
from databus.sources.common import incremental as inc
from databus.sources.mysql.checks import parse_mysql_url
from databus.sources.mysql.connection import SqlSession, master_status
from databus.sources.mysql.snapshots import SnapshotIO, encode_chunk
from databus.sources.mysql.source import NOTIFICATIONS


def fill(m: MariaDB, rows: int) -> None:
    m.execute("CREATE DATABASE shop",
              "CREATE TABLE shop.big (id INT PRIMARY KEY, name VARCHAR(64),"
              " amount DECIMAL(12,2), at DATETIME(6), note TEXT, qty INT)")
    con = m.connect("shop")
    try:
        with con.cursor() as cur:
            for start in range(0, rows, 10_000):
                cur.executemany(
                    "INSERT INTO big VALUES (%s, %s, %s, %s, %s, %s)",
                    [(i, f"name-{i}", f"{i % 100000}.25", "2024-05-06 07:08:09.123456",
                      "some text", i % 97) for i in range(start, min(rows, start + 10_000))])
    finally:
        con.close()


class Writer(threading.Thread):
    def __init__(self, m: MariaDB, rows: int) -> None:
        super().__init__(daemon=True)
        self.m, self.rows = m, rows
        self.stop = threading.Event()
        self.longest = 0.0
        self.statements = 0

    def run(self) -> None:
        import random

        rng = random.Random(1)
        con = self.m.connect("shop")
        try:
            with con.cursor() as cur:
                while not self.stop.is_set():
                    k = rng.randrange(self.rows + self.rows // 20)
                    t0 = time.perf_counter()
                    if rng.random() < 0.7:
                        cur.execute("INSERT INTO big VALUES (%s, 'w', 1.5, NOW(6), 'w', 1)"
                                    " ON DUPLICATE KEY UPDATE qty = qty + 1, name = 'updated'",
                                    (k,))
                    else:
                        cur.execute("DELETE FROM big WHERE id = %s", (k,))
                    self.longest = max(self.longest, time.perf_counter() - t0)
                    self.statements += 1
        finally:
            con.close()


def table(m: MariaDB) -> dict[int, tuple[Any, ...]]:
    con = m.connect("shop")
    try:
        with con.cursor() as cur:
            cur.execute("SELECT id, name, amount, at, note, qty FROM big")
            return {r[0]: tuple(r) for r in cur.fetchall()}
    finally:
        con.close()


def chunk_path(m: MariaDB, chunk: int, compiled: bool) -> tuple[int, float]:
    """(rows, seconds) of reading ``shop.big`` by chunks into ``r`` events."""
    src = mysql_source(m.url, [r"shop\.big"], snapshot_mode="no_data", compiled=compiled)
    io = SnapshotIO(SqlSession(src.url), "databus.signals", lambda _n: True, src._shape_of)
    rows = 0
    last = None
    try:
        t0 = time.perf_counter()
        while True:
            got, shape = io.read_chunk("shop.big", [], last, None, chunk, None)
            c = inc.Chunk("lo", "hi", "shop.big", {k: p for k, p, _ in got}, None, True, shape)
            encode_chunk(c, 1, 0)
            rows += len(got)
            if len(got) < chunk:
                return rows, time.perf_counter() - t0
            last = got[-1][2]
    finally:
        io.session.close()
        src.close()


class Apply(Consumer):
    """Applies batches to ``replica`` (key -> row); notes the notifications' times."""

    def __init__(self) -> None:
        self.replica: dict[Any, Any] = {}
        self.reads = 0
        self.kinds: list[str] = []
        self.started = self.done = 0.0
        self.last_scn = -1

    def on_data_events(self, batch: DataBatch) -> None:
        if batch.source == NOTIFICATIONS:
            for row in batch.rows:
                assert row is not None
                self.kinds.append(row["kind"])
                if row["kind"] == "STARTED":
                    self.started = time.perf_counter()
                elif row["kind"] == "COMPLETED":
                    self.done = time.perf_counter()
            return
        ops, keys, rows = batch.ops, batch.keys, batch.rows
        if ev.Op.DELETE in ops:
            for op, key, row in zip(ops, keys, rows, strict=True):
                if op == ev.Op.DELETE:
                    self.replica.pop(key, None)
                else:
                    self.replica[key] = row
        else:
            self.replica.update(zip(keys, rows, strict=True))
        self.reads += ops.count(ev.Op.READ)

    def on_end_data_event_sequence(self, scn: int) -> None:
        self.last_scn = scn


def end_to_end(m: MariaDB, tmp: Path, rows: int, chunk: int
               ) -> tuple[Apply, float, Writer]:
    """The snapshot through a relay process and a client here, under the writer."""
    port = free_port()
    conf = tmp / "relay.yaml"
    conf.write_text(yaml.safe_dump({
        "name": "e2e",
        "source": {"url": m.url, "tables": [r"shop\.big"], "snapshot_mode": "initial",
                   "snapshot_chunk_size": chunk},
        "buffer": {"capacity_bytes": 1 << 30},
        "state_dir": str(tmp / "e2e-state"),
        "http": {"port": port}}))
    (tmp / "e2e-state").mkdir(exist_ok=True)
    log = tmp / "relay.log"
    relay = subprocess.Popen([sys.executable, "-m", "databus", "relay", "--config", str(conf)],
                             stdout=log.open("ab"), stderr=subprocess.STDOUT)
    consumer = Apply()
    client: DatabusClient | None = None
    writer = Writer(m, rows)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or relay.poll() is not None:
                raise RuntimeError(f"the relay did not start: see {log}")
            time.sleep(0.1)
        writer.start()
        client = DatabusClient(ClientConfig(relay=f"http://127.0.0.1:{port}",
                                            poll_timeout=1.0, fetch_size=8 << 20),
                               consumer, MemoryCheckpointStore())
        reader = threading.Thread(target=client.run, daemon=True)
        reader.start()
        deadline = time.monotonic() + 600
        while not consumer.done:
            if time.monotonic() > deadline or relay.poll() is not None:
                raise RuntimeError(f"the snapshot did not complete: see {log}")
            time.sleep(0.05)
        writer.stop.set()
        writer.join()
        file, pos = master_status(parse_mysql_url(m.url))
        end_scn = (int(file.rsplit(".", 1)[1]) << 32) | pos
        deadline = time.monotonic() + 120
        while consumer.last_scn < end_scn:  # every change the writer made, applied
            if time.monotonic() > deadline:
                raise RuntimeError(f"the consumer did not reach scn {end_scn}: see {log}")
            time.sleep(0.05)
    finally:
        writer.stop.set()
        if client is not None:
            client.stop()
        relay.terminate()
        relay.wait(30)
    return consumer, consumer.done - consumer.started, writer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--chunk", type=int, default=4096)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="snapshot-bench-"))
    m = MariaDB(tmp / "db")
    m.start()
    try:
        t0 = time.perf_counter()
        fill(m, args.rows)
        print(f"table: {args.rows} rows written in {time.perf_counter() - t0:.1f}s")

        dump = shutil.which("mariadb-dump") or "mariadb-dump"
        t0 = time.perf_counter()
        with (tmp / "dump.sql").open("wb") as out:
            subprocess.run([dump, "--no-defaults", "-h", "127.0.0.1", "-P", str(m.port), "-u",
                            "root", "--single-transaction", "shop", "big"], stdout=out,
                           check=True)
        dump_s = time.perf_counter() - t0

        src = mysql_source(m.url, [r"shop\.big"], snapshot_mode="initial",
                          snapshot_chunk_size=args.chunk, state_dir=tmp)
        replica: dict[Any, dict[str, Any]] = {}
        reads = 0
        kinds: list[str] = []
        writer = Writer(m, args.rows)
        stop = threading.Event()
        after = -1
        started = done = 0.0
        in_source = 0.0  # time spent in the source's read() during the snapshot
        try:
            writer.start()
            end_scn = None
            while end_scn is None or after < end_scn:
                t_read = time.perf_counter()
                windows = src.read(after, stop, 1.0)
                if started and not done:
                    in_source += time.perf_counter() - t_read
                for w in windows:
                    for e in ev.iter_events(w.events):
                        schema, _b, a, _m = decode_images(e, src.registry())
                        if schema.name == NOTIFICATIONS:
                            assert a is not None
                            kinds.append(a["kind"])
                            if a["kind"] == "STARTED":
                                started = time.perf_counter()
                            if a["kind"] == "COMPLETED":
                                done = time.perf_counter()
                            continue
                        if e.op == ev.Op.DELETE:
                            replica.pop(e.key, None)
                        else:
                            replica[e.key] = a  # type: ignore[assignment]
                            reads += e.is_snapshot
                    after = w.scn
                if done and end_scn is None:
                    writer.stop.set()
                    writer.join()
                    file, pos = master_status(parse_mysql_url(m.url))
                    end_scn = (int(file.rsplit(".", 1)[1]) << 32) | pos
        finally:
            writer.stop.set()
            src.close()
        want = table(m)
        got = {k: (v["id"], v["name"], v["amount"], v["at"], v["note"], v["qty"])
               for k, v in replica.items()}
        equal = got == want
        fast_n, fast_s = chunk_path(m, args.chunk, compiled=True)
        slow_n, slow_s = chunk_path(m, args.chunk, compiled=False)
        e2e, e2e_s, e2e_writer = end_to_end(m, tmp, args.rows, args.chunk)
        want = table(m)
        e2e_equal = {k: (v["id"], v["name"], v["amount"], v["at"], v["note"], v["qty"])
                     for k, v in e2e.replica.items()} == want
    finally:
        m.stop()
    snap_s = done - started
    print(f"{'reader':<52} | {'rows':>9} | {'seconds':>7} | {'rows/s':>9}")
    print(f"{'databus incremental snapshot (writers running)':<52} | {reads:>9} |"
          f" {snap_s:>7.2f} | {reads / snap_s:>9,.0f}")
    print(f"{'mariadb-dump --single-transaction (no writers)':<52} | {args.rows:>9} |"
          f" {dump_s:>7.2f} | {args.rows / dump_s:>9,.0f}")
    print(f"{'  of which in the source (capture thread busy)':<52} | {reads:>9} |"
          f" {in_source:>7.2f} | {reads / in_source:>9,.0f}")
    print(f"{'chunk path alone, compiled text-row codec':<52} | {fast_n:>9} |"
          f" {fast_s:>7.2f} | {fast_n / fast_s:>9,.0f}")
    print(f"{'chunk path alone, Python path (the reference)':<52} | {slow_n:>9} |"
          f" {slow_s:>7.2f} | {slow_n / slow_s:>9,.0f}")
    print(f"snapshot / mariadb-dump: {(reads / snap_s) / (args.rows / dump_s):.3f}x"
          f" (source time only: {(reads / in_source) / (args.rows / dump_s):.3f}x)")
    print(f"concurrent writer statements: {writer.statements}; longest wait"
          f" {writer.longest * 1000:.1f} ms; chunks: {kinds.count('CHUNK_DONE')}")
    print(f"consumer copy equals the table: {equal} ({len(want)} rows)")
    print(f"{'end to end: relay process -> client batches (writers)':<52} | {e2e.reads:>9} |"
          f" {e2e_s:>7.2f} | {e2e.reads / e2e_s:>9,.0f}")
    print(f"end to end: concurrent writer statements: {e2e_writer.statements}; longest wait"
          f" {e2e_writer.longest * 1000:.1f} ms; chunks: {e2e.kinds.count('CHUNK_DONE')};"
          f" consumer copy equals the table: {e2e_equal}")
    print(f"end-to-end rows/s: {e2e.reads / e2e_s:,.0f}"
          f" (ratio end-to-end/mariadb-dump: {(e2e.reads / e2e_s) / (args.rows / dump_s):.3f})")
    if not (equal and e2e_equal):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
