"""A backlog through Kafka: ``databus relay -> databus publish -> Kafka`` beside the rate
at which Debezium's connector hands the same changes to its callback.

Debezium -> Kafka needs Kafka Connect, which the harness does not run; so this compares
what can be compared in one run, on one private MariaDB and one binlog range:

* databus: a ``databus relay`` process captures ``--rows`` row changes of
  ``bench.binlog_decode``'s workload (the relay is given time to hold them all); then
  ``run_publish`` (the code of ``databus publish``: JSON with the Connect schema,
  ``debezium`` values, tombstones, transaction metadata, up to 100 windows per Kafka
  transaction) publishes every window the relay holds into a private single-node
  Kafka broker (the pinned bundle of the tests), from its start until it returns
  after the last window (``max_windows``):
  changes/s and messages/s *into Kafka, committed* (a ``read_committed`` consumer
  could read them), and the catch-up time;
* Debezium: the harness resumed over the same range (as ``bench.peers.compare``):
  changes/s to its callback, no Kafka.

    .venv/bin/python -m bench.peers.kafka_e2e [--rows 100000]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import httpx
from tests.support.kafka import KafkaBroker
from tests.support.mariadb import BINLOG_SETTINGS, MariaDB
from tests.support.procs import DATABUS, free_port, spawn, stop, wait_http

from bench.binlog_decode import workload
from bench.mysql_latency import _wait_dump
from bench.peers.compare import DECODE_TABLE, _scn
from bench.peers.harness import Debezium, classpath, mark, prepare
from databus.kafka.config import PublishConfig
from databus.kafka.publisher import run_publish


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--value-mode", default="debezium")
    args = ap.parse_args()
    cp = classpath()
    tmp = Path(tempfile.mkdtemp(prefix="peers-kafka-"))
    m = MariaDB(tmp / "db", settings={**BINLOG_SETTINGS, "max-binlog-size": "1073741824"})
    relay = None
    try:
        m.start()
        prepare(m)
        m.execute("CREATE DATABASE bench", DECODE_TABLE)
        primed = tmp / "dbz-primed"
        h = Debezium(m, primed, mode="count", tables="bench.t", cp=cp)
        h.wait_streaming()
        h.stop()
        h.result()
        mark(m, "pad")  # see bench.peers.compare: Debezium skips the first change it resumes at
        port = free_port()
        relay = spawn([*DATABUS, "relay", "--source", m.url, "--tables", r"bench\.t",
                       "--port", str(port), "--buffer-size", str(512 << 20)],
                      tmp / "relay.log")
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/admin", relay)
        _wait_dump(m)
        workload(m, args.rows)
        end = _scn(m)
        deadline = time.monotonic() + 300
        while httpx.get(f"{url}/admin", timeout=5).json()["buffer"]["max_scn"] < end:
            if time.monotonic() > deadline:
                raise RuntimeError("the relay did not capture the workload")
            time.sleep(0.2)
        held = httpx.get(f"{url}/admin", timeout=5).json()["buffer"]
        with KafkaBroker() as broker:
            cfg = PublishConfig(relay_url=url, bootstrap_servers=broker.bootstrap_servers,
                                topic_prefix="peer", value_mode=args.value_mode,
                                heartbeat_interval=0)
            t0 = time.perf_counter()
            # every window the relay holds, from its oldest; run_publish returns after the
            # last one is committed in Kafka
            publisher = run_publish(cfg, max_windows=int(held["windows"]))
            elapsed = time.perf_counter() - t0
            stats = publisher.stats
        w = tmp / "dbz-run"
        shutil.copytree(primed, w)
        res = Debezium(m, w, mode="count", tables="bench.t", cp=cp, expect=args.rows).result()
    finally:
        if relay is not None:
            stop(relay)
        m.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"relay held {held['windows']} windows, {held['events']} events for {args.rows}"
          " row changes")
    print(f"databus relay -> publish -> Kafka (committed): {args.rows} changes in {elapsed:.2f} s"
          f" = {args.rows / elapsed:,.0f} changes/s; {stats}")
    rate = res["events"] / res["first_to_last_s"]
    print(f"Debezium connector -> callback (no Kafka): {res['events']} changes in"
          f" {res['first_to_last_s']:.2f} s = {rate:,.0f} changes/s"
          f" ({res['events'] / res['start_to_last_s']:,.0f} from the engine start)")


if __name__ == "__main__":
    main()
