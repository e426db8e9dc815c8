"""Relay cluster failover: leader kill -9 -> first new window at a consumer.

Three ``databus relay --cluster zk://...`` processes (default settings) capture a
SQLite table; a writer commits one row every 20 ms and notes when; a consumer (the
client library, default settings) reads the cluster address ``zk://HOST:PORT/NAME``.
Each run kills the leader with SIGKILL and measures the time from the kill to the
consumer's receipt of the first row committed after it; the killed member is then
started again (it rejoins as a follower). ZooKeeper is the tests' private server
(``tests/support/zookeeper.py``, tick 500 ms).

What bounds it: the members' ``cluster.session_timeout`` (default 4 s). A killed
leader's node lives until its session expires; then the next caught-up follower
takes the lead (an epoch, its newest window) and the others re-point.

The same runs are made with ``cluster.leaders: 2`` (the baseline, ``leaders: 1``,
in the same run): a co-leader captures beside the leader, so the consumer moves to it
at once when the leader dies (``zk://`` lists the co-leaders right after the
leader), without waiting for the session to expire.

    .venv/bin/python -m bench.cluster_failover [--runs 10] [--leaders 1,2]
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from tests.support.procs import free_port
from tests.support.zookeeper import ZooKeeper

from databus.client import ClientConfig, Consumer, DatabusClient, MemoryCheckpointStore


class Arrivals(Consumer):
    def __init__(self) -> None:
        self.at: dict[int, float] = {}

    def on_data_event(self, event: Any) -> None:
        key = event.key
        if isinstance(key, int):
            self.at.setdefault(key, time.monotonic())


def _member(tmp: Path, db: Path, address: str, name: str, port: int,
            leaders: int) -> subprocess.Popen[bytes]:
    conf = tmp / f"{name}.yaml"
    (tmp / name).mkdir(exist_ok=True)
    conf.write_text(yaml.safe_dump({
        "source": {"url": f"sqlite:///{db}", "tables": ["t"], "snapshot_mode": "no_data"},
        "buffer": {"path": str(tmp / name / "relay.buf")},
        "http": {"port": port},
        "cluster": {"address": address, "member_id": name, "leaders": leaders}}))
    return subprocess.Popen([sys.executable, "-m", "databus", "relay", "--config", str(conf)],
                            stdout=(tmp / f"{name}.log").open("ab"), stderr=subprocess.STDOUT)


def _role(port: int) -> str | None:
    try:
        return str(httpx.get(f"http://127.0.0.1:{port}/admin", timeout=2).json()
                   ["cluster"]["role"])
    except (httpx.HTTPError, KeyError, ValueError):
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--leaders", default="1,2", help="cluster.leaders values, in turn")
    args = ap.parse_args()
    p50: dict[int, float] = {}
    with ZooKeeper() as zk:
        for leaders in (int(x) for x in args.leaders.split(",")):
            p50[leaders] = _failovers(zk, args.runs, leaders)
    if 1 in p50:
        for k, t in p50.items():
            if k != 1:
                print(f"ratio failover p50 leaders {k}/leaders 1: {t / p50[1]:.3f}")


def _failovers(zk: ZooKeeper, runs: int, leaders: int) -> float:
    """``runs`` leader kills in a three-member cluster with ``leaders``; the p50, s."""
    with tempfile.TemporaryDirectory(prefix="databus-bench-failover-") as d:
        tmp = Path(d)
        db = tmp / "src.db"
        with sqlite3.connect(db) as con:
            con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
        address = f"zk://{zk.hosts}/bench{leaders}"
        ports = {f"m{i}": free_port() for i in range(3)}
        procs = {n: _member(tmp, db, address, n, p, leaders) for n, p in ports.items()}
        committed: dict[int, float] = {}
        stop = threading.Event()

        def write() -> None:
            con = sqlite3.connect(db, isolation_level=None)
            i = 0
            while not stop.is_set():
                i += 1
                con.execute("INSERT INTO t VALUES (?, 'x')", (i,))
                committed[i] = time.monotonic()
                stop.wait(0.02)

        def ready() -> bool:
            roles = [_role(p) for p in ports.values()]
            return "leader" in roles and (leaders == 1 or "coleader" in roles)

        def wait_ready() -> None:
            deadline = time.monotonic() + 60
            while not ready():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no leader (or co-leader): see the logs in {tmp}")
                time.sleep(0.1)

        # rows first: a co-leader starts once the leader holds a window
        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        rec = Arrivals()
        client: DatabusClient | None = None
        times: list[float] = []
        try:
            wait_ready()
            client = DatabusClient(ClientConfig(relay=address), rec,
                                   MemoryCheckpointStore())
            threading.Thread(target=client.run, daemon=True).start()
            for run in range(runs):
                time.sleep(3.0)
                wait_ready()
                leader = next(n for n, p in ports.items() if _role(p) == "leader")
                killed_at = time.monotonic()
                procs[leader].kill()
                procs[leader].wait()
                after = max(committed)
                deadline = killed_at + 60
                while not any(k > after for k in rec.at):
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"run {run}: nothing delivered 60 s after the kill")
                    time.sleep(0.01)
                first = min(t for k, t in rec.at.items() if k > after)
                times.append(first - killed_at)
                print(f"leaders {leaders}, run {run + 1:>2}: killed {leader}, first new row"
                      f" after {times[-1]:.2f} s", flush=True)
                procs[leader] = _member(tmp, db, address, leader, ports[leader], leaders)
        finally:
            stop.set()
            if client is not None:
                client.stop()
            for p in procs.values():
                p.kill()
        # the writer starts before the members install capture: rows from the client's
        # first on count
        lost = [k for k in committed if k not in rec.at and min(rec.at) < k < max(rec.at)]
        times.sort()
        p50 = statistics.median(times)
        print(f"leaders {leaders}: failover over {len(times)} runs (session_timeout 4 s,"
              f" default): p50 {p50:.2f} s, max {times[-1]:.2f} s; rows committed before"
              f" the last one delivered but not delivered: {len(lost)}")
        return p50


if __name__ == "__main__":
    main()
