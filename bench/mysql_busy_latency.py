"""Commit -> ``on_data_event`` latency of one captured table while another table is busy.

A private MariaDB (binlog ROW/FULL/FULL, ``innodb_flush_log_at_trx_commit=2``) and a
``databus relay`` process capturing ``bench.lat`` (memory buffer, from the binlog's
end). A writer process sends one-row autocommit INSERTs into ``bench.lat`` on an absolute
schedule (``--rate``/s), each row carrying its send wall time in µs; a
:class:`DatabusClient` in this process (sources ``bench.lat``) subtracts it from its own
wall clock in ``on_data_event``. Three cases, one after the other in the same run:

* ``alone`` (the baseline): nothing else writes;
* ``busy, uncaptured``: a second writer process sends ``--busy-rate`` one-row
  transactions/s into ``bench.busy``, which the relay does not capture;
* ``busy, captured``: the same, with a relay capturing both tables.

Each case starts its own relay; the first ``--warmup`` seconds of each are left out.
Goal (issue 30): p99 of each busy case within 2x of ``alone``. With ``--rounds N`` the
cases run N times; the summary takes each case's best (lowest) p99 and p50.

    .venv/bin/python -m bench.mysql_busy_latency [--rate 20] [--busy-rate 800]
        [--seconds 30] [--rounds 1] [--prime]

``--prime`` writes one row into ``bench.lat`` before each client starts: a relay from
before issue 30 knows a table only after its first change, and its client (started
first) died with ``UnknownSource``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from tests.support.mariadb import BINLOG_SETTINGS, MariaDB
from tests.support.procs import DATABUS, free_port, spawn, stop, wait_http

from bench.mysql_latency import TABLE, _Latency, _paced, _stats, _wait_dump
from databus.client import ClientConfig, DatabusClient

BUSY = "CREATE TABLE bench.busy (id BIGINT AUTO_INCREMENT PRIMARY KEY, v VARCHAR(64))"


def _busy_writer(port: int, rate: float, until: float) -> None:
    """Child process: one-row autocommit INSERTs into bench.busy at ``rate``/s until the
    wall time ``until``."""
    import pymysql

    con = pymysql.connect(host="127.0.0.1", port=port, user="root", password="",
                          database="bench", autocommit=True)
    cur = con.cursor()
    start, i = time.time(), 0
    try:
        while time.time() < until:
            delay = start + i / rate - time.time()
            if delay > 0:
                time.sleep(delay)
            cur.execute("INSERT INTO busy (v) VALUES (%s)", (f"noise-{i}",))
            i += 1
    finally:
        con.close()


def run_case(m: MariaDB, tmp: Path, name: str, tables: str, busy_rate: float,
             first_id: int, count: int, rate: float, prime: bool = False
             ) -> tuple[list[Any], float]:
    """One case: its relay, client, paced writer and (``busy_rate`` > 0) busy writer.
    Returns the samples (start time first, as ``bench.mysql_latency`` has them) and the
    busy writer's measured rate."""
    port = free_port()
    relay = spawn([*DATABUS, "relay", "--source", m.url, "--tables", tables,
                   "--snapshot-mode", "no_data", "--port", str(port)],
                  tmp / f"relay-{name.replace(' ', '').replace(',', '-')}.log")
    busy_before = _busy_count(m)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/admin", relay)
        _wait_dump(m)
        if prime:  # sent long before the case starts: left out with the warm-up
            m.execute(f"INSERT INTO bench.lat (id, sent_us) VALUES (-{first_id}, 0)")
            time.sleep(1.0)
        consumer = _Latency(count + prime)
        stop_ev = threading.Event()
        client = DatabusClient(ClientConfig(relay=url, sources=["bench.lat"],
                                            poll_timeout=5.0), consumer)
        t = threading.Thread(target=client.run, kwargs={"stop": stop_ev})
        t.start()
        busy = None
        try:
            if busy_rate > 0:
                busy = mp.get_context("spawn").Process(
                    target=_busy_writer,
                    args=(m.port, busy_rate, time.time() + count / rate + 2.0))
                busy.start()
                time.sleep(1.0)  # flowing before the measured writes start
            busy_t0 = time.monotonic()
            writer, start_at = _paced(m.port, first_id, count, rate)
            try:
                consumer.done.wait(count / rate + 60)
            finally:
                writer.join()
                busy_s = time.monotonic() - busy_t0
                if busy is not None:
                    busy.join()
        finally:
            stop_ev.set()
            t.join(30)
        assert len(consumer.samples) >= count + prime, f"{name}: {len(consumer.samples)}"
        if prime:
            consumer.samples = [x for x in consumer.samples if x[0] > 0]
        assert httpx.get(f"{url}/admin", timeout=5).status_code == 200
    finally:
        stop(relay)
    busy_rows = _busy_count(m) - busy_before
    return [start_at, *consumer.samples], (busy_rows / busy_s if busy_rate > 0 else 0.0)


def _busy_count(m: MariaDB) -> int:
    with m.connect("bench") as con, con.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM busy")
        row = cur.fetchone()
        return int(row[0]) if row else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rate", type=float, default=20.0,
                    help="captured one-row transactions per second")
    ap.add_argument("--busy-rate", type=float, default=800.0,
                    help="one-row transactions per second into the busy table")
    ap.add_argument("--seconds", type=float, default=30.0, help="length of each case")
    ap.add_argument("--warmup", type=float, default=2.0, help="seconds left out of each case")
    ap.add_argument("--rounds", type=int, default=1, help="times each case runs")
    ap.add_argument("--prime", action="store_true",
                    help="one row into bench.lat before each client starts (older relays)")
    args = ap.parse_args()
    count = int(args.rate * args.seconds)
    tmp = Path(tempfile.mkdtemp(prefix="busy-latency-bench-"))
    m = MariaDB(tmp / "db", settings={**BINLOG_SETTINGS, "innodb-flush-log-at-trx-commit": "2"})
    cases = [("alone", r"bench\.lat", 0.0),
             ("busy, uncaptured", r"bench\.lat", args.busy_rate),
             ("busy, captured", r"bench\.(lat|busy)", args.busy_rate)]
    results: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in cases}
    print(f"{count} captured one-row transactions per case at {args.rate:.0f}/s, first"
          f" {args.warmup:.0f}s left out; busy table at {args.busy_rate:.0f} tx/s;"
          " latency = receive wall time - send wall time")
    head = (f"{'round':>5} | {'case':<17} | {'busy tx/s':>9} | {'p50 ms':>7} | {'p90 ms':>7} |"
            f" {'p99 ms':>7} | {'max ms':>7}")
    print(head)
    try:
        m.start()
        m.execute("CREATE DATABASE bench", TABLE, BUSY)
        first_id = 1
        for r in range(1, args.rounds + 1):
            for name, tables, busy_rate in cases:
                run, busy = run_case(m, tmp, name, tables, busy_rate, first_id, count,
                                     args.rate, args.prime)
                first_id += count
                s = _stats(run, args.warmup)
                results[name].append(s)
                print(f"{r:>5} | {name:<17} | {busy:>9.0f} | {s['p50']:>7.2f} |"
                      f" {s['p90']:>7.2f} | {s['p99']:>7.2f} | {s['max']:>7.2f}", flush=True)
    finally:
        m.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    base = min(s["p99"] for s in results["alone"])
    print(f"best of {args.rounds}: alone p50 {min(s['p50'] for s in results['alone']):.2f} ms,"
          f" p99 {base:.2f} ms (baseline)")
    for name in ("busy, uncaptured", "busy, captured"):
        p99 = min(s["p99"] for s in results[name])
        p50 = min(s["p50"] for s in results[name])
        print(f"best of {args.rounds}: {name}: p50 {p50:.2f} ms, p99 {p99:.2f} ms,"
              f" p99 ratio to alone {p99 / base:.2f}x (goal <= 2x)")


if __name__ == "__main__":
    main()
