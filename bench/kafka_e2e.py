"""End to end through Kafka: Debezium -> Kafka beside ``databus relay -> databus publish ->
Kafka``, same MariaDB, same binlog, same broker, same run.

* Debezium: Kafka Connect in standalone mode running Debezium 3.3.1's MySQL connector
  (``bench.peers.connect``: Kafka's own Connect worker, JsonConverter with schemas, the
  connector's default value modes, tombstones on, transaction metadata off - Debezium's
  defaults), at least once;
* databus: a ``databus relay`` process (persistent buffer) and a ``databus publish``
  process (``--value-mode debezium``, JSON with schemas, tombstones on,
  ``--no-transaction-metadata`` to write the same messages, Kafka transactions: exactly
  once).

Both write into one private single-node Kafka broker (``tests.support.kafka``, the pinned
4.1.1 bundle). What is measured is what a ``read_committed`` consumer (confluent-kafka, in
this process) sees: for databus a message is visible when its Kafka transaction commits,
for Debezium when the broker has it.

1. **Backlog -> Kafka** (messages/s). Each side is primed on an empty table and stopped
   (Connect commits its offsets; the relay keeps its buffer file), then
   ``bench.binlog_decode``'s workload writes ``--rows`` row changes (8 columns; inserts in
   1,000-row transactions, updates, deletes). Each side then starts again from where it
   stopped and reads the same binlog range, ``--repeat`` times from copies of the primed
   state, the sides alternating. Timed: first to last change visible to the consumer (the
   rate), and from the start of the processes (JVM or Python start-up, connecting, reading
   the binlog) to the last. Best of ``--repeat`` per side.
2. **Lag** (commit -> message visible to a ``read_committed`` consumer, p50/p99) at
   ``--rate`` one-row transactions/s for ``--seconds`` (``bench.mysql_latency``'s writer and
   row: each row carries the wall time its INSERT was sent), one side after the other,
   the first ``--warmup`` seconds left out. Debezium's ``poll.interval.ms`` is
   ``--dbz-poll-ms`` (its default is 500; ``bench.peers.compare`` uses 1), the publisher's
   ``--batch-linger`` is ``--batch-linger`` (its default 0.1 s).

Ratios are databus / Debezium of the same run; the last line is machine-readable:
``ratio databus/debezium: X`` (messages/s, first to last, best of each).

    flock /tmp/databus-bench.lock .venv/bin/python -m bench.kafka_e2e [--rows 100000]
        [--repeat 2] [--rate 1000] [--seconds 15]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from tests.support.kafka import KafkaBroker
from tests.support.mariadb import BINLOG_SETTINGS, MariaDB
from tests.support.procs import DATABUS, free_port, spawn, stop, wait_http

from bench.binlog_decode import workload
from bench.mysql_latency import TABLE, _stats, _wait_dump
from bench.peers.compare import DECODE_TABLE, _paced
from bench.peers.connect import Connect
from bench.peers.harness import JARS, mark, prepare

ROOT = Path(__file__).resolve().parents[1]


def _bundle() -> str:
    subprocess.run(["bash", str(ROOT / "scripts" / "java" / "fetch.sh"), "debezium"],
                   check=True, timeout=900)
    return f"{JARS}/*"


class Tail:
    """A ``read_committed`` consumer of one topic from its end as of now, in a thread.

    Counts data messages (``changes``, values not null) and ``tombstones``; with
    ``latency_column`` it records ``(sent_us, now_us - sent_us)`` per change from the
    ``after`` image of the (schema/payload) value. ``first``/``last`` are the
    ``time.monotonic()`` of the first and the last change seen; ``done`` is set at
    ``want`` changes.
    """

    def __init__(self, broker: KafkaBroker, topic: str, want: int,
                 latency_column: str | None = None) -> None:
        from confluent_kafka import Consumer, TopicPartition

        self.topic, self.want, self.column = topic, want, latency_column
        self.changes = self.tombstones = 0
        self.first = self.last = 0.0
        self.samples: list[tuple[int, int]] = []
        self.done = threading.Event()
        self._stop = threading.Event()
        self.consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers,
                                  "group.id": f"bench-{uuid.uuid4().hex}",
                                  "enable.auto.commit": False,
                                  "isolation.level": "read_committed",
                                  "fetch.wait.max.ms": 10})
        _, high = self.consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10,
                                                      cached=False)
        self.consumer.assign([TopicPartition(topic, 0, high)])
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set() and not self.done.is_set():
                # consume(n, timeout) waits for n messages or the timeout: it would add up
                # to the timeout to each lag. poll() returns at the first message, then the
                # queue is drained without waiting.
                one = self.consumer.poll(0.1)
                if one is None:
                    continue
                msgs = [one, *self.consumer.consume(10_000, timeout=0)]
                now = time.monotonic()
                now_us = time.time_ns() // 1000
                for msg in msgs:
                    if msg.error() is not None:
                        continue
                    value = msg.value()
                    if value is None:
                        self.tombstones += 1
                        continue
                    if not self.changes:
                        self.first = now
                    self.last = now
                    self.changes += 1
                    if self.column is not None:
                        after = json.loads(value)["payload"]["after"]
                        sent = int(after[self.column])
                        self.samples.append((sent, now_us - sent))
                if self.changes >= self.want:
                    self.done.set()
        finally:
            self.consumer.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30)


def _create_topics(broker: KafkaBroker, names: list[str]) -> None:
    """Topics of one partition (a :class:`Tail` reads partition 0); existing ones are kept."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    futures = admin.create_topics([NewTopic(n, num_partitions=1, replication_factor=1)
                                   for n in names])
    for f in futures.values():
        try:
            f.result(30)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise


def _until_streaming(m: MariaDB, broker: KafkaBroker, control_topic: str, what: str,
                     alive: Any, timeout: float = 300.0) -> None:
    """Ping ``peerctl.mark`` until a ping reaches ``control_topic``."""
    tail = Tail(broker, control_topic, 1)
    try:
        deadline = time.monotonic() + timeout
        while not tail.done.wait(0.5):
            if not alive() or time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not stream into Kafka")
            mark(m, "ping")
    finally:
        tail.close()


class Databus:
    """A ``databus relay`` and a ``databus publish`` process (see the module docstring)."""

    def __init__(self, m: MariaDB, broker: KafkaBroker, tmp: Path, tag: str, tables: str, *,
                 buffer: Path | None, linger: float) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.started = time.monotonic()
        args = [*DATABUS, "relay", "--source", m.url, "--tables", tables, "--port", str(port),
                "--snapshot-mode", "no_data", "--buffer-size", str(256 << 20)]
        if buffer is not None:
            args += ["--buffer-path", str(buffer)]
        self.relay = spawn(args, tmp / f"relay-{tag}.log")
        self.publisher = spawn([*DATABUS, "publish", "--relay", self.url,
                                "--bootstrap-servers", broker.bootstrap_servers,
                                "--topic-prefix", "dbs", "--name", f"bench-{tag}",
                                "--value-mode", "debezium", "--no-transaction-metadata",
                                "--heartbeat-interval", "0", "--batch-linger", str(linger)],
                               tmp / f"publish-{tag}.log")

    def alive(self) -> bool:
        return self.relay.poll() is None and self.publisher.poll() is None

    def wait_relay(self) -> None:
        wait_http(f"{self.url}/admin", self.relay, timeout=60)

    def stop(self) -> None:
        stop(self.publisher)
        stop(self.relay)


# -- 1. backlog ------------------------------------------------------------------------

def backlog(m: MariaDB, broker: KafkaBroker, tmp: Path, cp: str, rows: int, repeat: int,
            linger: float) -> dict[str, Any]:
    m.execute("CREATE DATABASE IF NOT EXISTS bench", DECODE_TABLE)
    _create_topics(broker, ["dbz.bench.t", "dbs.bench.t", "dbz.peerctl.mark",
                            "dbs.peerctl.mark"])
    tables = r"bench\.t,peerctl\.mark"
    dbz_primed = tmp / "dbz-primed"
    c = Connect(m, broker.bootstrap_servers, dbz_primed, cp, tables="bench.t")
    try:
        c.wait_running()
        _until_streaming(m, broker, "dbz.peerctl.mark", "Kafka Connect",
                         lambda: c.proc.poll() is None)
    finally:
        c.stop()
    primed_buf = tmp / "dbs-primed.buf"
    d = Databus(m, broker, tmp, "prime", tables, buffer=primed_buf, linger=linger)
    try:
        d.wait_relay()
        _wait_dump(m)
        _until_streaming(m, broker, "dbs.peerctl.mark", "databus", d.alive)
    finally:
        d.stop()
    # a resumed Debezium skipped the first row change after its stored offset
    # (bench.peers.compare): a control row stands there, outside the counted topic
    mark(m, "pad")
    t0 = time.perf_counter()
    workload(m, rows)
    print(f"workload: {rows} row changes written in {time.perf_counter() - t0:.1f}s",
          flush=True)
    runs: dict[str, list[dict[str, float]]] = {"databus": [], "debezium": []}
    for k in range(repeat):
        for side in ("debezium", "databus") if k % 2 else ("databus", "debezium"):
            topic = "dbs.bench.t" if side == "databus" else "dbz.bench.t"
            tail = Tail(broker, topic, rows)
            if side == "databus":
                buf = tmp / f"dbs-run{k}.buf"
                subprocess.run(["cp", "--sparse=always", str(primed_buf), buf], check=True)
                proc: Databus | Connect = Databus(m, broker, tmp, f"run{k}", tables,
                                                  buffer=buf, linger=linger)
            else:
                work = tmp / f"dbz-run{k}"
                shutil.copytree(dbz_primed, work)
                proc = Connect(m, broker.bootstrap_servers, work, cp, tables="bench.t")
            try:
                if not tail.done.wait(900):
                    raise RuntimeError(f"{side}: {tail.changes} of {rows} changes in Kafka")
            finally:
                tail.close()
                proc.stop()
            res = {"changes": tail.changes, "tombstones": tail.tombstones,
                   "first_to_last_s": tail.last - tail.first,
                   "start_to_last_s": tail.last - proc.started}
            runs[side].append(res)
            print(f"run {k + 1} {side}: {res}", flush=True)
    best = {s: min(r, key=lambda x: x["first_to_last_s"]) for s, r in runs.items()}
    return {"rows": rows, "runs": runs, "best": best}


# -- 2. lag ----------------------------------------------------------------------------

def lag(m: MariaDB, broker: KafkaBroker, tmp: Path, cp: str, rate: float, seconds: float,
        writers: int, linger: float, poll_ms: int) -> dict[str, Any]:
    m.execute("CREATE DATABASE IF NOT EXISTS bench", TABLE)
    _create_topics(broker, ["dbz.bench.lat", "dbs.bench.lat", "dbz.peerctl.mark",
                            "dbs.peerctl.mark"])
    count = int(rate * seconds)
    out: dict[str, Any] = {"rate": rate, "count": count}
    first = 1
    for side in ("databus", "debezium"):
        proc: Databus | Connect
        if side == "databus":
            proc = Databus(m, broker, tmp, "lat", r"bench\.lat,peerctl\.mark", buffer=None,
                           linger=linger)
            proc.wait_relay()
            _wait_dump(m)
            alive = proc.alive
        else:
            proc = Connect(m, broker.bootstrap_servers, tmp / "dbz-lat", cp,
                           tables="bench.lat", extra={"poll.interval.ms": str(poll_ms)})
            proc.wait_running()
            alive = (lambda c: lambda: c.proc.poll() is None)(proc)
        try:
            prefix = "dbs" if side == "databus" else "dbz"
            _until_streaming(m, broker, f"{prefix}.peerctl.mark", side, alive)
            tail = Tail(broker, f"{prefix}.bench.lat", count, latency_column="sent_us")
            procs, start_at = _paced(m.port, first, count, rate, writers)
            try:
                tail.done.wait(count / rate + 120)
            finally:
                for p in procs:
                    p.join()
                tail.close()
        finally:
            proc.stop()
        first += count
        out[side] = _stats([start_at, *tail.samples], 2.0)
        print(f"lag {side}: {out[side]}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=2, help="backlog runs per side (best kept)")
    ap.add_argument("--rate", type=float, default=1000.0, help="lag run, transactions/s")
    ap.add_argument("--seconds", type=float, default=15.0, help="length of the lag run")
    ap.add_argument("--writers", type=int, default=2)
    ap.add_argument("--batch-linger", type=float, default=0.1)
    ap.add_argument("--dbz-poll-ms", type=int, default=1)
    ap.add_argument("--skip-backlog", action="store_true")
    ap.add_argument("--skip-lag", action="store_true")
    args = ap.parse_args()
    cp = _bundle()
    tmp = Path(tempfile.mkdtemp(prefix="kafka-e2e-"))
    m = MariaDB(tmp / "db", settings={**BINLOG_SETTINGS, "max-binlog-size": "1073741824",
                                      "innodb-flush-log-at-trx-commit": "2"})
    report: dict[str, Any] = {}
    try:
        m.start()
        prepare(m)
        with KafkaBroker() as broker:
            if not args.skip_backlog:
                report["backlog"] = backlog(m, broker, tmp, cp, args.rows, args.repeat,
                                            args.batch_linger)
            if not args.skip_lag:
                report["lag"] = lag(m, broker, tmp, cp, args.rate, args.seconds, args.writers,
                                    args.batch_linger, args.dbz_poll_ms)
    finally:
        m.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    _print(report, args)


def _print(r: dict[str, Any], args: argparse.Namespace) -> None:
    print("RESULT " + json.dumps(r))
    ratio = None
    if "backlog" in r:
        b = r["backlog"]
        print(f"\nbacklog of {b['rows']} row changes -> Kafka, visible to a read_committed"
              " consumer (best of each)")
        print(f"{'path':<52} | {'changes':>7} | {'tombst.':>7} | {'first-last s':>12} |"
              f" {'msg/s':>8} | {'start-last s':>12} | {'msg/s':>8}")
        rates = {}
        for side, name in (("databus", "databus relay -> publish -> Kafka (transactions)"),
                           ("debezium", "Debezium MySQL connector in Kafka Connect")):
            x = b["best"][side]
            msgs = x["changes"] + x["tombstones"]
            rates[side] = (msgs / x["first_to_last_s"], msgs / x["start_to_last_s"])
            print(f"{name:<52} | {x['changes']:>7} | {x['tombstones']:>7} |"
                  f" {x['first_to_last_s']:>12.2f} | {rates[side][0]:>8,.0f} |"
                  f" {x['start_to_last_s']:>12.2f} | {rates[side][1]:>8,.0f}")
        ratio = rates["databus"][0] / rates["debezium"][0]
        print(f"databus / Debezium messages/s: {ratio:.2f}x first to last,"
              f" {rates['databus'][1] / rates['debezium'][1]:.2f}x from each one's start")
    if "lag" in r:
        lg = r["lag"]
        print(f"\nlag at {lg['rate']:.0f} one-row tx/s, {lg['count']} transactions per side"
              f" (publish --batch-linger {args.batch_linger}; Debezium poll.interval.ms"
              f" {args.dbz_poll_ms})")
        print(f"{'path':<44} | {'tx/s':>6} | {'p50 ms':>8} | {'p90 ms':>8} | {'p99 ms':>8} |"
              f" {'max ms':>8}")
        for side in ("databus", "debezium"):
            s = lg[side]
            print(f"{side:<44} | {s['rate']:>6.0f} | {s['p50']:>8.1f} | {s['p90']:>8.1f} |"
                  f" {s['p99']:>8.1f} | {s['max']:>8.1f}")
        print(f"lag databus/Debezium: p50 {lg['databus']['p50'] / lg['debezium']['p50']:.2f}x,"
              f" p99 {lg['databus']['p99'] / lg['debezium']['p99']:.2f}x")
    if ratio is not None:
        print(f"ratio databus/debezium: {ratio:.2f}")


if __name__ == "__main__":
    main()
