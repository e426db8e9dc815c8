"""Dynamic client group: total rows/s of 1, 2 and 4 ``replicate --group`` processes.

A relay holds a SQLite shop's history (``--transactions`` random transactions over
three tables). For each group size a fresh PostgreSQL database and a fresh group
(8 partitions) replicate all of it; the figure is rows applied per second from the
members' start until every partition's checkpoint row holds the relay's newest
window. The callback is the real one: ``replicate`` applying each window and its
checkpoint in one PostgreSQL transaction. Baseline, same run: one plain
``replicate`` process (no group, no partitions) over the same relay.

    .venv/bin/python -m bench.client_group [--transactions 20000] [--members 1,2,4]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import sqlalchemy as sa
from tests.support.postgres import PostgreSQL
from tests.support.procs import free_port
from tests.support.shop import TABLES, Writer, create_shop
from tests.support.zookeeper import ZooKeeper

SOURCES = ",".join(f"main.{t}" for t in TABLES)
PARTITIONS = 8


def _positions(engine: sa.Engine) -> list[int]:
    try:
        with engine.connect() as con:
            return [int(json.loads(r[0])["windowScn"]) for r in con.execute(
                sa.text("SELECT checkpoint FROM databus_checkpoint"))]
    except sa.exc.ProgrammingError:
        return []


def _data_events(url: str, top: int) -> int:
    from databus.client.relay import RelayConnection
    from databus.core import event as ev
    from databus.core.checkpoint import Checkpoint

    n, cp = 0, Checkpoint.flexible()
    with RelayConnection(url) as conn:
        while cp.window_scn < top:
            data = conn.stream(cp, None, size=8 << 20, timeout=0).data
            for e in ev.iter_events(data):
                if e.is_eop:
                    cp = cp.window_done(e.scn)
                elif not e.is_control:
                    n += 1
    return n


def _run(args: list[str], target: str, rows: int, top: int, expect: int,
         tmp: Path, label: str) -> float:
    engine = sa.create_engine(target)
    t0 = time.perf_counter()
    procs = [subprocess.Popen(a, stdout=(tmp / f"{label}-{i}.log").open("ab"),
                              stderr=subprocess.STDOUT) for i, a in enumerate(args)]
    try:
        while True:
            pos = _positions(engine)
            if len(pos) == expect and min(pos) >= top:
                break
            if any(p.poll() is not None for p in procs):
                raise RuntimeError(f"a member exited: see {tmp}/{label}-*.log")
            time.sleep(0.2)
        took = time.perf_counter() - t0
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
        engine.dispose()
    return rows / took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--transactions", type=int, default=20_000)
    ap.add_argument("--members", default="1,2,4")
    opts = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="databus-bench-group-") as d, ZooKeeper() as zk, \
            PostgreSQL() as pg:
        tmp = Path(d)
        db = tmp / "shop.db"
        create_shop(db)
        with Writer(db, seed=5, rollback_ratio=0.0) as w:
            for _ in range(opts.transactions):
                w.transaction()
            changes = sum(len(t) for t in w.committed)
        port = free_port()
        relay = subprocess.Popen(
            [sys.executable, "-m", "databus", "relay", "--source", f"sqlite:///{db}",
             "--tables", ",".join(TABLES), "--snapshot-mode", "initial", "--port", str(port),
             "--buffer-size", str(256 << 20)],
            stdout=(tmp / "relay.log").open("ab"), stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            top, last = -1, -2
            while top != last or top < 0:  # until the relay stops growing
                time.sleep(1.0)
                last = top
                try:
                    top = int(httpx.get(f"{url}/containerStats/buffer/max_scn").json())
                except httpx.HTTPError:
                    top = -1
            rows = _data_events(url, top)  # what a replica applies: the relay's events
            base = [sys.executable, "-m", "databus", "replicate", "--relay", url,
                    "--sources", SOURCES]
            print(f"{rows} events in the relay ({changes} row changes in {opts.transactions}"
                  f" transactions, snapshot of the rows first); {os.cpu_count()}"
                  f" cores; PostgreSQL, ZooKeeper, the relay and the members share them")
            with pg.fresh_database("bench_plain") as target:
                plain = _run([[*base, "--target", target]], target, rows, top, 1, tmp, "plain")
            print(f"  plain replicate (no group)   {plain:>9,.0f} rows/s")
            for n in [int(x) for x in opts.members.split(",")]:
                with pg.fresh_database(f"bench_g{n}") as target:
                    members = [[*base, "--target", target, "--group",
                                f"zk://{zk.hosts}/bench{n}", "--group-partitions",
                                str(PARTITIONS), "--member-id", f"m{i}"] for i in range(n)]
                    rate = _run(members, target, rows, top, PARTITIONS, tmp, f"g{n}")
                print(f"  group of {n} member(s)        {rate:>9,.0f} rows/s"
                      f"  ({rate / plain:.2f} of plain)")
        finally:
            relay.terminate()
            relay.wait(30)


if __name__ == "__main__":
    main()
