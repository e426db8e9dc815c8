"""Commit -> ``on_data_event`` latency at a paced rate, beside python-mysql-replication.

A private MariaDB (binlog ROW/FULL/FULL) gets one-row transactions from a
writer process paced at ``--rate`` transactions/s (an absolute schedule, so a
late commit does not slow the next ones). Each row carries the wall time (µs)
at which the writer sent its autocommit INSERT; the receiver subtracts it from
its own wall clock (same machine, same clock) when it sees the row:

* databus: ``databus relay --source mysql://...`` as a separate process
  (memory buffer), and a :class:`DatabusClient` in this process whose
  ``on_data_event`` reads the row (Avro decoded) - the whole path a consumer
  pays: binlog dump, decoding, buffer, HTTP long-poll, client, callback;
* baseline: python-mysql-replication's ``BinLogStreamReader`` in blocking
  mode on the same server, in this process, timing each row of each
  ``WriteRowsEvent`` as it is yielded.

Both runs write the same number of transactions at the same rate, one after
the other; the first ``--warmup`` seconds of each are left out.

    .venv/bin/python -m bench.mysql_latency [--rate 1000] [--seconds 20]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from tests.support.mariadb import BINLOG_SETTINGS, MariaDB
from tests.support.procs import DATABUS, free_port, spawn, stop, wait_http

from databus.client import ClientConfig, Consumer, DatabusClient, DataEvent

TABLE = ("CREATE TABLE bench.lat (id BIGINT PRIMARY KEY, sent_us BIGINT NOT NULL,"
         " name VARCHAR(64), amount DECIMAL(12,2), at DATETIME(6), note TEXT, doc JSON, qty INT)")


def _writer(port: int, first_id: int, count: int, rate: float, start_at: float) -> None:
    """Child process: ``count`` autocommit INSERTs on an absolute schedule."""
    import pymysql

    con = pymysql.connect(host="127.0.0.1", port=port, user="root", password="",
                          database="bench", autocommit=True)
    cur = con.cursor()
    sql = "INSERT INTO lat VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
    try:
        for i in range(count):
            due = start_at + i / rate
            delay = due - time.time()
            if delay > 0:
                time.sleep(delay)  # the pacing itself: a child process with nothing to interrupt
            k = first_id + i
            cur.execute(sql, (k, time.time_ns() // 1000, f"name-{k}", f"{k % 10**6}.25",
                              "2024-05-06 07:08:09.123456", "some text " * 3,
                              f'{{"i": {k}, "tags": ["a", "b"]}}', k % 97))
    finally:
        con.close()


def _paced(port: int, first_id: int, count: int, rate: float) -> tuple[mp.Process, float]:
    start_at = time.time() + 0.5
    p = mp.get_context("spawn").Process(target=_writer,
                                        args=(port, first_id, count, rate, start_at))
    p.start()
    return p, start_at


class _Latency(Consumer):
    def __init__(self, want: int) -> None:
        self.samples: list[tuple[int, int]] = []  # (sent_us, latency_us)
        self.want = want
        self.done = threading.Event()

    def on_data_event(self, event: DataEvent) -> None:
        now = time.time_ns() // 1000
        sent = int(event.after["sent_us"])  # type: ignore[index]
        self.samples.append((sent, now - sent))
        if len(self.samples) >= self.want:
            self.done.set()


def _wait_dump(m: MariaDB, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        con = m.connect()
        try:
            with con.cursor() as cur:
                cur.execute("SELECT count(*) FROM information_schema.processlist"
                            " WHERE command LIKE 'Binlog Dump%'")
                if cur.fetchone()[0]:  # type: ignore[index]
                    return
        finally:
            con.close()
        time.sleep(0.1)
    raise RuntimeError("no binlog dump connection")


def relay_and_client(m: MariaDB, log: Path, consumer: Consumer,
                     ) -> tuple[subprocess.Popen[bytes], str, Callable[[], None]]:
    """A ``databus relay`` process on ``m``'s ``bench.lat`` (from the binlog's end) and a
    :class:`DatabusClient` feeding ``consumer`` in a thread, once the relay dumps the binlog.

    Returns the relay's process, its URL and the function that stops the client; the caller
    stops the relay (it is stopped here when the start fails).
    """
    port = free_port()
    relay = spawn([*DATABUS, "relay", "--source", m.url, "--tables", r"bench\.lat",
                   "--snapshot-mode", "no_data", "--port", str(port)], log)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/admin", relay)
        _wait_dump(m)
        stop_ev = threading.Event()
        client = DatabusClient(ClientConfig(relay=url, poll_timeout=5.0), consumer)
        t = threading.Thread(target=client.run, kwargs={"stop": stop_ev})
        t.start()
    except BaseException:
        stop(relay)
        raise

    def stop_client() -> None:
        stop_ev.set()
        t.join(30)

    return relay, url, stop_client


def run_databus(m: MariaDB, tmp: Path, first_id: int, count: int, rate: float) -> list[Any]:
    consumer = _Latency(count)
    relay, url, stop_client = relay_and_client(m, tmp / "relay.log", consumer)
    try:
        writer, start_at = _paced(m.port, first_id, count, rate)
        try:
            consumer.done.wait(count / rate + 60)
        finally:
            writer.join()
            stop_client()
        assert httpx.get(f"{url}/admin", timeout=5).status_code == 200
    finally:
        stop(relay)
    return [start_at, *consumer.samples]


def run_baseline(m: MariaDB, first_id: int, count: int, rate: float) -> list[Any]:
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.row_event import WriteRowsEvent

    con = m.connect()
    with con.cursor() as cur:  # start at the current end (MariaDB: by GTID position)
        cur.execute("SELECT @@gtid_binlog_pos")
        gtid = cur.fetchone()[0]  # type: ignore[index]
    con.close()
    settings = {"host": "127.0.0.1", "port": m.port, "user": "root", "passwd": ""}
    stream = BinLogStreamReader(connection_settings=settings, server_id=4243, blocking=True,
                                is_mariadb=True, auto_position=gtid,
                                only_events=[WriteRowsEvent], only_tables=["lat"])
    samples: list[tuple[int, int]] = []
    writer, start_at = _paced(m.port, first_id, count, rate)
    try:
        for event in stream:
            for row in event.rows:
                now = time.time_ns() // 1000
                values = row["values"]
                if values["id"] < first_id:  # a row of the earlier run: a wrong start
                    raise RuntimeError("the baseline reader did not start at the binlog's end")
                sent = int(values["sent_us"])
                samples.append((sent, now - sent))
            if len(samples) >= count:
                break
    finally:
        stream.close()
        writer.join()
    return [start_at, *samples]


def _stats(run: list[Any], warmup: float) -> dict[str, float]:
    start_at, samples = run[0], run[1:]
    assert samples, "no rows received"
    kept = sorted(lat for sent, lat in samples if sent / 1e6 >= start_at + warmup)
    span = (samples[-1][0] - samples[0][0]) / 1e6 if len(samples) > 1 else 0.0

    def pct(q: float) -> float:
        return kept[min(len(kept) - 1, int(q * len(kept)))] / 1000

    return {"n": len(kept), "rate": (len(samples) - 1) / span if span else 0.0,
            "p50": pct(0.50), "p90": pct(0.90), "p99": pct(0.99), "max": kept[-1] / 1000,
            "mean": statistics.fmean(kept) / 1000}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rate", type=float, default=1000.0, help="transactions per second")
    ap.add_argument("--seconds", type=float, default=20.0, help="length of each run")
    ap.add_argument("--warmup", type=float, default=2.0, help="seconds left out of each run")
    args = ap.parse_args()
    count = int(args.rate * args.seconds)
    tmp = Path(tempfile.mkdtemp(prefix="latency-bench-"))
    m = MariaDB(tmp / "db", settings={**BINLOG_SETTINGS, "innodb-flush-log-at-trx-commit": "2"})
    try:
        m.start()
        m.execute("CREATE DATABASE bench", TABLE)
        ours = _stats(run_databus(m, tmp, 1, count, args.rate), args.warmup)
        theirs = _stats(run_baseline(m, count + 1, count, args.rate), args.warmup)
    finally:
        m.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{count} one-row transactions per run, paced at {args.rate:.0f}/s,"
          f" first {args.warmup:.0f}s left out; latency = receive wall time - send wall time")
    head = f"{'path':<58} | {'tx/s':>6} | {'p50 ms':>7} | {'p90 ms':>7} | {'p99 ms':>7} | {'max ms':>7}"
    print(head)
    for name, s in (("databus relay process -> client on_data_event", ours),
                    ("python-mysql-replication BinLogStreamReader (blocking)", theirs)):
        print(f"{name:<58} | {s['rate']:>6.0f} | {s['p50']:>7.2f} | {s['p90']:>7.2f} |"
              f" {s['p99']:>7.2f} | {s['max']:>7.2f}")
    print(f"ratio databus/baseline: p50 {ours['p50'] / theirs['p50']:.2f}x,"
          f" p99 {ours['p99'] / theirs['p99']:.2f}x (lower is better)")


if __name__ == "__main__":
    main()
