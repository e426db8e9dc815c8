"""Sinks under sysbench's ``oltp_write_only`` (issue 32): does ``databus replicate`` (and
``publish``, the bootstrap producer) keep up with a busy MariaDB on this machine?

A private MariaDB (binlog ROW/FULL/FULL; ``innodb_flush_log_at_trx_commit`` MariaDB's
default 1, ``--flush-log``) holding
sysbench's tables (``--tables`` x ``--table-size`` rows); ``sysbench oltp_write_only``
with ``--threads`` threads, as fast as it goes, for ``--seconds`` (each transaction:
two UPDATEs, a DELETE and the re-INSERT of one id: four row changes). In order:

1. **alone**: sysbench without anything capturing, ``--alone`` times; the best rate is
   the baseline of the rounds below.
2. A ``databus relay`` process captures ``sbtest.*`` (initial snapshot, persistent
   buffer of ``--buffer-mb``).
3. A **round** per consumer (``--rounds``): the consumer process starts and catches up
   with the relay (the time it takes is reported: the first replicate round starts from
   the snapshot and everything before it); then sysbench runs again, while the
   relay's newest window and the consumer's committed position are sampled every 50 ms.
   Reported: the writers' transactions/s and row changes/s against ``alone`` (goal: >=
   0.8), the consumer's lag when the load ended (from sysbench's end to the first
   sample at which the consumer held the relay's final window; goal: <= 5 s), its rate
   as the row changes of the load over the time from the load's start to that moment,
   over the writers' rate (1.0: kept up), the CPU seconds of each process during the
   load, the machine's (``machine``: CPU seconds by kind over both cores, this bench's
   own, the root disk's writes), the relay's ``/stream`` requests per second, and for
   replicate rounds whether every table equals MariaDB's. The sampler asks over one
   kept-alive connection and, with ``--sched-idle``, runs under ``SCHED_IDLE`` like what
   it watches: until 2026-11-29 13:12 it opened a connection per sample at normal
   priority and took about 9 CPU seconds per 60 s round from the writers.

   * ``postgresql``, ``mariadb``, ``sqlite``: ``databus replicate`` into a private
     PostgreSQL (``fsync`` on, ``synchronous_commit`` off), a second private MariaDB
     (``innodb_flush_log_at_trx_commit=2``, no binlog) or a SQLite file;
   * ``publish``: ``databus publish`` into a private Kafka broker (pinned bundle);
   * ``bootstrap``: a ``databus bootstrap`` service (producer and applier, SQLite store);
   * ``binlog``: a plain ``mysqlbinlog --read-from-remote-server --stop-never`` into
     /dev/null, the only binlog reader: the writers' ratio with the cheapest binlog
     reader there is (the floor for the relay's). It runs after ``alone`` and before the
     relay starts, whatever its place in ``--rounds`` (the relay's capture would be a
     second reader);
   * ``capture``: the relay capturing, no consumer: what capture alone costs the writers.

   With ``--round-repeat N`` each round runs N times (a new consumer and a new target
   each time) and its best writers' rate is reported against the best ``alone``: both
   sides best-of, as the single round against the best of ``--alone`` runs was not.
   With ``--interleave``, the ``--round-repeat`` repetitions run as cycles: every round
   once (the order reversed every other cycle), then sysbench alone (relay stopped); each
   round is reported against the mean of the ``alone`` runs around its cycle, as the
   server's own rate drifts during a run (+4% to +19% from the first ``alone`` to the
   last in the runs of 2026-11-29), which favoured whichever round ran last.
   With ``--alone-after N``, sysbench runs N more times alone after the rounds, the relay
   stopped (SIGSTOP, then SIGCONT: it catches up after), against the server as the rounds
   left it (its binlog and tables as long-lived as theirs): each round is also reported
   against that baseline and against the best of both (``tps_vs_best_alone``).
   ``--nice N`` / ``--sched-idle`` run the capture side (relay, consumers, target
   databases; ``--targets-normal``: not the targets) below the source and sysbench.

4. **Apply from a full buffer** (``--full``): ``replicate()`` in this process into a new
   PostgreSQL database, from the relay's oldest window to its newest (the snapshot and
   every round's changes); its rate in row changes/s against ``COPY`` of the same final
   rows into tables of the same definition in the same PostgreSQL (best of 3). Goal:
   >= 0.3.

    flock /tmp/databus-bench.lock .venv/bin/python -m bench.replicate_sysbench
        [--seconds 60] [--alone 2] [--rounds postgresql,mariadb,sqlite,publish,bootstrap]
        [--full [--full-batch-rows N,M] [--full-repeat R]] [--batch-rows N]
        [--batch-linger S]

The last line is machine-readable (``RESULT {...}``).
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa
import yaml
from tests.support import sysbench
from tests.support.mariadb import BINLOG_SETTINGS, MariaDB
from tests.support.postgres import PostgreSQL
from tests.support.procs import DATABUS, free_port, spawn, stop, wait_http

from databus.client.config import BatchConfig, ReplicateConfig
from databus.client.runners import REPLICATE_DEFAULTS, replicate

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: list[int]) -> float:
    """user + system CPU seconds of ``pids`` so far (0 for one that is gone)."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / TICK
    return total


def machine() -> dict[str, float]:
    """The machine's counters so far: CPU seconds by kind (all cores; ``/proc/stat``) and
    the root disk's writes and flushes (``/proc/diskstats``), to see what a load cost
    beyond the processes measured one by one."""
    cpu = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    names = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    out = {f"cpu_{n}": int(v) / TICK for n, v in zip(names, cpu[:8], strict=True)}
    me = resource.getrusage(resource.RUSAGE_SELF)
    out["cpu_bench"] = me.ru_utime + me.ru_stime  # this process: its sampler
    dev = os.stat("/").st_dev
    for line in Path("/proc/diskstats").read_text().splitlines():
        f = line.split()
        if os.makedev(int(f[0]), int(f[1])) == dev:
            out["disk_writes"] = int(f[7])
            out["disk_write_mib"] = int(f[9]) * 512 / 2**20
            out["disk_write_ms"] = int(f[10])
            if len(f) >= 17:
                out["disk_flushes"] = int(f[15])
                out["disk_flush_ms"] = int(f[16])
    return out


def renice(pids: list[int], niceness: int, idle: bool = False) -> None:
    """Every thread of ``pids`` at ``niceness``, or under ``SCHED_IDLE`` (both are per
    thread in Linux; threads and processes started later by them inherit them)."""
    for pid in pids:
        with suppress(OSError):
            for task in Path(f"/proc/{pid}/task").iterdir():
                with suppress(OSError):
                    if idle:
                        os.sched_setscheduler(int(task.name), os.SCHED_IDLE, os.sched_param(0))
                    else:
                        os.setpriority(os.PRIO_PROCESS, int(task.name), niceness)


def family(pid: int) -> list[int]:
    """``pid`` and its children (a PostgreSQL server's backends)."""
    out = [pid]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid:
                out.append(int(entry.name))
    return out


@dataclass
class Relay:
    url: str
    proc: subprocess.Popen[bytes]
    # one kept-alive connection: the sampler asks 20 times a second, during the load
    http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=10))

    def buffer(self) -> dict[str, Any]:
        return dict(self.http.get(f"{self.url}/containerStats/buffer").json())

    def max_scn(self) -> int:
        return int(self.http.get(f"{self.url}/containerStats/buffer/max_scn").json())

    def stream_requests(self) -> int:
        """``/stream`` requests the relay answered so far (its metrics)."""
        text = self.http.get(f"{self.url}/metrics").text
        return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                       if line.startswith("databus_relay_requests_total{")
                       and 'endpoint="stream"' in line))

    def settled(self, quiet: float = 1.0, timeout: float = 600) -> int:
        """The newest window once it stayed the newest for ``quiet`` seconds."""
        deadline = time.monotonic() + timeout
        top, since = self.max_scn(), time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(0.1)
            now = self.max_scn()
            if now != top:
                top, since = now, time.monotonic()
            elif time.monotonic() - since >= quiet:
                return top
        raise RuntimeError("the relay never settled")


@dataclass
class Consumer:
    """A consumer process and how to read its committed position."""

    name: str
    proc: subprocess.Popen[bytes]
    position: Callable[[], int]
    pids: Callable[[], dict[str, list[int]]]  # the consumer's and its target's processes
    check: Callable[[], bool] | None = None  # the replica equals MariaDB
    extra: dict[str, Any] = field(default_factory=dict)

    def wait(self, scn: int, timeout: float = 900) -> float:
        """Seconds until the committed position reaches ``scn``."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}")
            if self.position() >= scn:
                return time.monotonic() - t0
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} did not reach {scn} in {timeout} s")


def sql_position(url: str) -> Callable[[], int]:
    engine = sa.create_engine(url, pool_size=1)

    def position() -> int:
        try:
            with engine.connect() as conn:
                text = conn.execute(sa.text("SELECT checkpoint FROM databus_checkpoint"
                                            " WHERE name = 'replicate'")).scalar()
        except sa.exc.DBAPIError:
            return -1
        return -1 if text is None else int(json.loads(text)["windowScn"])
    return position


def table_digest(url: str, tables: list[str]) -> dict[str, str]:
    """Rows and an order-independent digest of each sysbench table at ``url``."""
    out = {}
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            for t in tables:
                h = hashlib.sha256()
                n = 0
                for r in conn.execute(sa.text(f"SELECT id, k, c, pad FROM {t} ORDER BY id")):
                    h.update(f"{r[0]}|{r[1]}|{str(r[2]).rstrip()}|{str(r[3]).rstrip()}\n"
                             .encode())
                    n += 1
                out[t] = f"{n}:{h.hexdigest()[:16]}"
    finally:
        engine.dispose()
    return out


class Bench:
    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args = args
        self.tmp = tmp
        self.workload = sysbench.Workload(tables=args.tables, table_size=args.table_size,
                                          threads=args.threads)
        self.tables = [f"sbtest{i}" for i in range(1, args.tables + 1)]
        self.results: dict[str, Any] = {}
        self.rep = 0  # the repetition of the round running (--round-repeat)
        self.batch: dict[str, Any] = {}
        if args.batch_rows:
            self.batch["rows"] = args.batch_rows
        if args.batch_linger is not None:
            self.batch["linger"] = args.batch_linger

    def niced(self, cmd: list[str]) -> list[str]:
        """``cmd`` at ``--nice`` or under ``--sched-idle`` (the capture side of the machine:
        relay, consumer, target)."""
        if self.args.sched_idle:
            return ["chrt", "--idle", "0", *cmd]
        return ["nice", "-n", str(self.args.nice), *cmd] if self.args.nice else cmd

    def batch_flags(self) -> list[str]:
        out = []
        if "rows" in self.batch:
            out += ["--batch-rows", str(self.batch["rows"])]
        if "linger" in self.batch:
            out += ["--batch-linger", str(self.batch["linger"])]
        return out

    # -- the source and its load -------------------------------------------------------

    def load(self, name: str, source: MariaDB) -> tuple[sysbench.Result, float, float]:
        """One sysbench run; (its result, wall time it started, wall time it ended).
        ``self.sysbench_cpu``: its CPU seconds (it is the one child waited for);
        ``self.machine``: the machine's counters over it (:func:`machine`)."""
        log = self.tmp / f"sysbench-{name}.log"
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        m0 = machine()
        t0 = time.monotonic()
        proc = sysbench.start(source, self.workload, self.args.seconds, log)
        result = sysbench.finish(proc, log)
        t_end = time.monotonic()
        m1 = machine()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.machine = {k: round(m1[k] - m0[k], 1) for k in m0}
        self.sysbench_cpu = round(after.ru_utime + after.ru_stime
                                  - before.ru_utime - before.ru_stime, 1)
        return result, t0, t_end

    def source_url(self, source: MariaDB) -> str:
        return source.url_of(sysbench.DATABASE)

    def alone_relay_stopped(self, relay: Relay, source: MariaDB, name: str) -> sysbench.Result:
        """One sysbench run alone, the relay stopped (SIGSTOP) meanwhile; it catches up
        after (SIGCONT)."""
        assert relay.proc.pid is not None
        os.kill(relay.proc.pid, signal.SIGSTOP)
        try:
            result, _, _ = self.load(name, source)
        finally:
            os.kill(relay.proc.pid, signal.SIGCONT)
        return result

    def alone_after(self, relay: Relay, source: MariaDB, kinds: list[str]) -> None:
        """``--alone-after``: sysbench alone again, the relay stopped meanwhile."""
        runs = []
        for i in range(self.args.alone_after):
            result = self.alone_relay_stopped(relay, source, f"alone-after{i}")
            runs.append({"tps": round(result.tps, 1),
                         "rows_per_s": round(result.rows_per_s, 1),
                         "machine": self.machine})
            print(f"alone after the rounds {i + 1}: {result.tps:,.1f} tx/s, load"
                  f" {os.getloadavg()[0]:.1f}", flush=True)
        late = max(r["tps"] for r in runs)
        best = max(late, self.results["alone"]["tps"])
        self.results["alone_after_runs"] = runs
        for kind in kinds:
            out = self.results.get(kind)
            if out and "tps" in out:
                out["tps_vs_alone_after"] = round(out["tps"] / late, 3)
                out["tps_vs_best_alone"] = round(out["tps"] / best, 3)
                print(f"  {kind}: {out['tps_vs_alone']} of the first alone, "
                      f"{out['tps_vs_alone_after']} of the alone after, "
                      f"{out['tps_vs_best_alone']} of the best of both", flush=True)

    def interleaved(self, relay: Relay, source: MariaDB, kinds: list[str]) -> None:
        """``--interleave``: ``--round-repeat`` cycles, each running every round once
        (in the given order, reversed every other cycle) and then sysbench alone with the
        relay stopped; each round against the mean of the ``alone`` runs on either side
        of its cycle (the last one before the cycles for the first), so a baseline that
        drifts during the run (the server warming up) is shared fairly by all rounds."""
        alones = [self.results["alone_runs"][-1]["tps"]]
        cycles: list[dict[str, Any]] = []
        for rep in range(self.args.round_repeat):
            self.rep = rep  # names each round's target
            order = kinds if rep % 2 == 0 else kinds[::-1]
            cycle: dict[str, Any] = {}
            for kind in order:
                print(f"round {kind} (cycle {self.rep + 1}/{self.args.round_repeat}) ...",
                      flush=True)
                out = self.round(kind, relay, source)
                out["load_average"] = round(os.getloadavg()[0], 1)
                cycle[kind] = out
                print(f"  {kind}: {json.dumps(out)}", flush=True)
            result = self.alone_relay_stopped(relay, source, f"alone-cycle{rep}")
            alones.append(round(result.tps, 1))
            base = (alones[-2] + alones[-1]) / 2
            print(f"alone after cycle {self.rep + 1}: {result.tps:,.1f} tx/s", flush=True)
            for kind, out in cycle.items():
                out["tps_vs_neighbour_alone"] = round(out["tps"] / base, 3)
                print(f"  {kind}: {out['tps_vs_neighbour_alone']} of the alone runs around"
                      f" it ({alones[-2]:,.1f}, {alones[-1]:,.1f})", flush=True)
            cycles.append(cycle)
        self.results["interleaved_alone_tps"] = alones
        for kind in kinds:
            ratios = sorted(c[kind]["tps_vs_neighbour_alone"] for c in cycles)
            best = max((c[kind] for c in cycles), key=lambda o: o["tps_vs_neighbour_alone"])
            self.results[kind] = {**best, "tps_vs_neighbour_alone_runs": ratios,
                                  "median_vs_neighbour_alone": ratios[len(ratios) // 2]}
            print(f"{kind}: against the alone runs around each: best {ratios[-1]}, median"
                  f" {ratios[len(ratios) // 2]} ({ratios})", flush=True)

    # -- rounds ------------------------------------------------------------------------

    @contextmanager
    def consumer(self, kind: str, relay: Relay, source: MariaDB) -> Iterator[Consumer]:
        if kind in ("postgresql", "mariadb", "sqlite"):
            with self.target(kind) as (url, target_pids):
                run = DATABUS
                if self.args.profile:  # the client's thread, written when it stops
                    run = [DATABUS[0], "-m", "cProfile", "-o",
                           str(Path(self.args.profile) / f"replicate-{kind}.prof"), "-m",
                           "databus"]
                proc = spawn(self.niced([*run, "replicate", "--relay", relay.url, "--target",
                                         url, *self.batch_flags()]),
                             self.tmp / f"replicate-{kind}.log")
                src = self.source_url(source)
                try:
                    yield Consumer(
                        f"replicate into {kind}", proc, sql_position(url),
                        lambda: {"replicate": [proc.pid], kind: target_pids()},
                        lambda: table_digest(url, self.tables) == table_digest(
                            src, self.tables), {"target_pids": target_pids})
                finally:
                    stop(proc)
        elif kind == "publish":
            with self.publisher(relay) as c:
                yield c
        elif kind == "bootstrap":
            with self.bootstrap(relay) as c:
                yield c
        else:
            raise SystemExit(f"unknown round {kind}")

    @contextmanager
    def target(self, kind: str) -> Iterator[tuple[str, Callable[[], list[int]]]]:
        if kind == "postgresql":
            with self.postgres.fresh_database("sysbench_replica") as url:
                assert self.postgres.proc is not None
                pid = self.postgres.proc.pid
                yield url, lambda: family(pid)
        elif kind == "mariadb":
            m = MariaDB(self.tmp / f"target-mariadb-{self.rep}", settings={
                "innodb-flush-log-at-trx-commit": "2" if self.args.target_sync else "0",
                "skip-log-bin": None})
            with m:
                assert m.proc is not None
                if not self.args.targets_normal:
                    renice([m.proc.pid], self.args.nice, self.args.sched_idle)
                m.execute("CREATE DATABASE replica")
                assert m.proc is not None
                pid = m.proc.pid
                yield m.url_of("replica"), lambda: [pid]
        else:
            yield f"sqlite:///{self.tmp / f'replica-{self.rep}.db'}", lambda: []

    @contextmanager
    def publisher(self, relay: Relay) -> Iterator[Consumer]:
        from confluent_kafka.admin import AdminClient
        from tests.support.kafka import KafkaBroker

        from databus.kafka.offsets import read_position

        with KafkaBroker() as broker:
            kafka = {"bootstrap.servers": broker.bootstrap_servers,
                     "log_level": "0"}  # the broker stops at the end: no log lines
            admins = [AdminClient(dict(kafka))]  # dropped before the broker stops
            assert broker.proc is not None
            renice([broker.proc.pid], self.args.nice, self.args.sched_idle)
            proc = spawn(self.niced([*DATABUS, "publish", "--relay", relay.url,
                                     "--bootstrap-servers", broker.bootstrap_servers,
                                     "--topic-prefix", "sb", "--name", "sb"]),
                         self.tmp / "publish.log")
            last = [-1, 0.0]

            def position() -> int:
                if time.monotonic() - last[1] > 0.5:  # a consumer per read: twice a second
                    cp = read_position(kafka, admins[0], "databus-publish-offsets", "sb")
                    last[:] = [cp.window_scn if cp is not None else -1, time.monotonic()]
                return int(last[0])
            broker_pid = broker.proc.pid if broker.proc is not None else None
            try:
                yield Consumer("publish into Kafka", proc, position,
                               lambda: {"publish": [proc.pid],
                                        "kafka": [broker_pid] if broker_pid else []})
            finally:
                stop(proc)
                admins.clear()  # no "connection refused" lines once the broker stops

    @contextmanager
    def bootstrap(self, relay: Relay) -> Iterator[Consumer]:
        port = free_port()
        conf = self.tmp / "bootstrap.yaml"
        conf.write_text(yaml.safe_dump({
            "relay": relay.url, "store": {"url": f"sqlite:///{self.tmp / 'bs.db'}"},
            "http": {"port": port}, "poll_timeout": 0.5}))
        proc = spawn(self.niced([*DATABUS, "bootstrap", "--config", str(conf)]),
                     self.tmp / "bootstrap.log")
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/admin", proc)
        seen: dict[str, Any] = {}

        def position() -> int:
            admin = httpx.get(f"{url}/admin", timeout=10).json()
            seen.update(admin)
            return min(int(admin["producer"]["last_scn"]), int(admin["applier"]["applied_scn"]))
        try:
            yield Consumer("bootstrap producer and applier", proc, position,
                           lambda: {"bootstrap": [proc.pid]}, extra={"admin": seen})
        finally:
            stop(proc)

    def binlog_round(self, source: MariaDB) -> dict[str, Any]:
        """The floor of what capture costs the writers: a plain ``mysqlbinlog
        --read-from-remote-server --stop-never`` (decoding to text, into /dev/null)
        reading the binlog from its current end while sysbench runs."""
        engine = sa.create_engine(self.source_url(source))
        try:
            with engine.connect() as conn:
                first = conn.exec_driver_sql("SHOW MASTER STATUS").fetchone()
        finally:
            engine.dispose()
        assert first is not None
        with open(os.devnull, "wb") as null:
            proc = subprocess.Popen(self.niced(
                [shutil.which("mysqlbinlog") or "mysqlbinlog", "--read-from-remote-server",
                 "--stop-never", "--stop-never-slave-server-id=3999999990", "-h", "127.0.0.1",
                 "-P", str(source.port), "-u", "root", f"--start-position={first[1]}", str(first[0])]),
                stdout=null, stderr=subprocess.STDOUT)
        try:
            time.sleep(1.0)
            if proc.poll() is not None:
                raise RuntimeError(f"mysqlbinlog exited with {proc.returncode}")
            pids = {"mariadbd": [self.source_pid], "mysqlbinlog": [proc.pid]}
            cpu0 = {k: cpu_seconds(v) for k, v in pids.items()}
            result, _, _ = self.load("binlog", source)
            cpu1 = {k: cpu_seconds(v) for k, v in pids.items()}
        finally:
            proc.terminate()
            proc.wait(30)
        alone = self.results["alone"]
        return {"tps": round(result.tps, 1), "writer_rows_per_s": round(result.rows_per_s, 1),
                "tps_vs_alone": round(result.tps / alone["tps"], 3),
                "cpu_s": {**{k: round(cpu1[k] - cpu0[k], 1) for k in pids},
                          "sysbench": self.sysbench_cpu}, "machine": self.machine}

    def capture_round(self, relay: Relay, source: MariaDB) -> dict[str, Any]:
        """What the relay's capture alone costs the writers: the load with the relay
        capturing and no consumer."""
        relay.settled()
        pids = {"mariadbd": [self.source_pid], "relay": [relay.proc.pid]}
        cpu0 = {k: cpu_seconds(v) for k, v in pids.items()}
        result, _, _ = self.load("capture", source)
        cpu1 = {k: cpu_seconds(v) for k, v in pids.items()}
        alone = self.results["alone"]
        return {"tps": round(result.tps, 1), "writer_rows_per_s": round(result.rows_per_s, 1),
                "tps_vs_alone": round(result.tps / alone["tps"], 3),
                "cpu_s": {**{k: round(cpu1[k] - cpu0[k], 1) for k in pids},
                          "sysbench": self.sysbench_cpu}, "machine": self.machine}

    def round(self, kind: str, relay: Relay, source: MariaDB) -> dict[str, Any]:
        if kind == "capture":
            return self.capture_round(relay, source)
        out: dict[str, Any] = {}
        with self.consumer(kind, relay, source) as c:
            top = relay.settled()
            out["catch_up_s"] = round(c.wait(top), 2)
            events_before = int(relay.buffer()["events"])
            samples: list[tuple[float, int, int]] = []
            done = threading.Event()

            def sample() -> None:
                if self.args.sched_idle:  # below the writers, like what it watches
                    os.sched_setscheduler(threading.get_native_id(), os.SCHED_IDLE,
                                          os.sched_param(0))
                while not done.is_set():
                    with suppress(Exception):
                        samples.append((time.monotonic(), relay.max_scn(), c.position()))
                    time.sleep(0.05)
            sampler = threading.Thread(target=sample, daemon=True)
            assert relay.proc.pid is not None
            pids = {"mariadbd": [self.source_pid], "relay": [relay.proc.pid], **c.pids()}
            cpu0 = {k: cpu_seconds(v) for k, v in pids.items()}
            requests0 = relay.stream_requests()
            sampler.start()
            result, t0, t_end = self.load(kind, source)
            cpu1 = {k: cpu_seconds(v) for k, v in pids.items()}
            stream_requests = relay.stream_requests() - requests0
            final = relay.settled(quiet=1.0)
            c.wait(final, timeout=1800)
            done.set()
            sampler.join()
            caught = next(t for t, _, pos in samples if pos >= final) if any(
                pos >= final for _, _, pos in samples) else time.monotonic()
            events = int(relay.buffer()["events"]) - events_before
            lag = max(caught - t_end, 0.0)
            alone = self.results["alone"]
            out.update({
                "tps": round(result.tps, 1), "writer_rows_per_s": round(result.rows_per_s, 1),
                "tps_vs_alone": round(result.tps / alone["tps"], 3),
                "captured_row_changes": events, "lag_s": round(lag, 2),
                "consumer_rate_over_writers": round((t_end - t0) / (caught - t0), 3),
                "cpu_s": {**{k: round(cpu1[k] - cpu0[k], 1) for k in pids},
                          "sysbench": self.sysbench_cpu},
                "machine": self.machine,
                "stream_requests_per_s": round(stream_requests / (t_end - t0), 1),
            })
            if c.check is not None:
                ok = False
                for _ in range(20):  # the relay may still deliver the last windows
                    if c.check():
                        ok = True
                        break
                    time.sleep(0.5)
                out["equal"] = ok
        return out

    # -- apply from a full buffer -----------------------------------------------------

    def full(self, relay: Relay, source: MariaDB) -> dict[str, Any]:
        """Apply the whole buffer into a new database per run: each of ``--full-batch-rows``
        (the batch settings otherwise) ``--full-repeat`` times, alternating, then ``COPY``
        of the final rows; the ratio of each setting's best run against ``COPY``'s best."""
        buf = relay.buffer()
        windows, events = int(buf["windows"]), int(buf["events"])
        out: dict[str, Any] = {"windows": windows, "row_changes": events}
        sizes: list[int | None] = ([None if x == "default" else int(x)
                                    for x in self.args.full_batch_rows.split(",")]
                                   if self.args.full_batch_rows else [None])
        runs: dict[str, list[dict[str, Any]]] = {}
        for rep in range(self.args.full_repeat):
            for n, rows in enumerate(sizes):
                batch = dict(self.batch)
                if rows is not None:
                    batch["rows"] = rows
                    batch.setdefault("bytes", 1 << 30)  # rows alone bound the batch
                label = "default" if rows is None else str(rows)
                last = rep == self.args.full_repeat - 1 and n == len(sizes) - 1
                run = self._full_run(relay, source, BatchConfig(**batch), rep, windows, events,
                                     out if last else None)
                print(f"  full buffer, batch rows {label}, run {rep + 1}: {json.dumps(run)}",
                      flush=True)
                runs.setdefault(label, []).append(run)
        out["settings"] = {}
        for label, rs in runs.items():
            best = max(rs, key=lambda r: r["rate"])
            out["settings"][label] = {**best, "ratio": round(best["rate"] / out["copy"]["rate"], 3),
                                      "rates": [r["rate"] for r in rs]}
        first = out["settings"][next(iter(runs))]
        out.update({k: first[k] for k in ("seconds", "rate", "cpu_s", "equal", "ratio")})
        return out

    def _full_run(self, relay: Relay, source: MariaDB, batch: BatchConfig, rep: int,
                  windows: int, events: int, copy_into: dict[str, Any] | None
                  ) -> dict[str, Any]:
        """One apply of the whole buffer (``windows`` holding ``events``) into a new
        database; with ``copy_into``, then ``COPY`` into tables defined as that replica's
        (its ``"copy"``)."""
        with self.postgres.fresh_database(f"sysbench_full_{rep}") as url:
            cfg = ReplicateConfig(relay=relay.url, **REPLICATE_DEFAULTS, batch=batch)
            assert self.postgres.proc is not None
            pg = family(self.postgres.proc.pid)
            pg0, relay0, me0 = cpu_seconds(pg), cpu_seconds([relay.proc.pid]), time.process_time()
            profiler = cProfile.Profile() if self.args.profile else None
            t0 = time.monotonic()
            if profiler is not None:
                profiler.enable()
            replicate(cfg, url, max_windows=windows)
            elapsed = time.monotonic() - t0
            if profiler is not None:
                profiler.disable()
                profiler.dump_stats(str(Path(self.args.profile)
                                        / f"replicate-full-{batch.rows}-{rep}.prof"))
            run = {"seconds": round(elapsed, 2), "rate": round(events / elapsed),
                   "cpu_s": {"replicate": round(time.process_time() - me0, 1),
                             "postgres": round(cpu_seconds(family(
                                 self.postgres.proc.pid)) - pg0, 1),
                             "relay": round(cpu_seconds([relay.proc.pid]) - relay0, 1)},
                   "equal": table_digest(url, self.tables) == table_digest(
                       self.source_url(source), self.tables)}
            if copy_into is not None:
                copy_into["copy"] = self.copy_baseline(url, source)
            return run

    def copy_baseline(self, url: str, source: MariaDB) -> dict[str, Any]:
        """COPY of the final rows into tables defined as the replica's, best of 3."""
        rows: dict[str, list[tuple[Any, ...]]] = {}
        src = sa.create_engine(self.source_url(source))
        with src.connect() as conn:
            for t in self.tables:
                rows[t] = [tuple(r) for r in conn.execute(sa.text(f"SELECT * FROM {t}"))]
        src.dispose()
        total = sum(len(r) for r in rows.values())
        best = None
        engine = sa.create_engine(url)
        try:
            for i in range(3):
                with engine.begin() as conn:
                    for t in self.tables:
                        conn.exec_driver_sql(f"DROP TABLE IF EXISTS copy_{t}")
                        conn.exec_driver_sql(f"CREATE TABLE copy_{t} (LIKE {t} INCLUDING ALL)")
                t0 = time.monotonic()
                with engine.begin() as conn:
                    raw = conn.connection.driver_connection
                    for t in self.tables:
                        with raw.cursor() as cur, cur.copy(  # type: ignore[union-attr]
                                f"COPY copy_{t} (id, k, c, pad) FROM STDIN") as copy:
                            for r in rows[t]:
                                copy.write_row(r)
                took = time.monotonic() - t0
                best = took if best is None else min(best, took)
                del i
        finally:
            engine.dispose()
        assert best is not None
        return {"rows": total, "seconds": round(best, 3), "rate": round(total / best)}

    # -- the whole run -----------------------------------------------------------------

    def run(self) -> None:
        args = self.args
        source = MariaDB(self.tmp / "source", settings={
            **BINLOG_SETTINGS, "innodb-flush-log-at-trx-commit": str(args.flush_log)})
        with source:
            assert source.proc is not None
            self.source_pid = source.proc.pid
            sysbench.prepare(source, self.workload, self.tmp / "prepare.log")
            alone = []
            for i in range(args.alone):
                cpu0 = cpu_seconds([self.source_pid])
                result, _, _ = self.load(f"alone{i}", source)
                alone.append({"tps": round(result.tps, 1),
                              "rows_per_s": round(result.rows_per_s, 1),
                              "cpu_s": {"mariadbd": round(cpu_seconds([self.source_pid])
                                                          - cpu0, 1),
                                        "sysbench": self.sysbench_cpu}, "machine": self.machine})
                print(f"alone {i + 1}: {result.tps:,.1f} tx/s, {result.rows_per_s:,.0f}"
                      f" row changes/s, load {os.getloadavg()[0]:.1f}", flush=True)
            self.results["alone"] = max(alone, key=lambda a: a["tps"])
            self.results["alone_runs"] = alone
            rounds = [k for k in args.rounds.split(",") if k]
            if "binlog" in rounds:  # before the relay: mysqlbinlog the only reader
                print("round binlog ...", flush=True)
                out = self.binlog_round(source)
                out["load_average"] = round(os.getloadavg()[0], 1)
                self.results["binlog"] = out
                print(f"  binlog: {json.dumps(out)}", flush=True)
            port = free_port()
            proc = spawn(self.niced([
                *DATABUS, "relay", "--source", source.url, "--tables", r"sbtest\..*",
                "--snapshot-mode", "initial", "--port", str(port), "--buffer-path",
                str(self.tmp / "relay.buf"), "--buffer-size", str(args.buffer_mb << 20)]),
                self.tmp / "relay.log")
            relay = Relay(f"http://127.0.0.1:{port}", proc)
            self.postgres = PostgreSQL(settings={
                "fsync": "on" if args.target_sync else "off", "synchronous_commit": "off", "shared_buffers": "128MB",
                "max_connections": "50"})
            try:
                wait_http(f"{relay.url}/admin", proc, timeout=60)
                with self.postgres:
                    assert self.postgres.proc is not None
                    if not args.targets_normal:
                        renice(family(self.postgres.proc.pid), args.nice, args.sched_idle)
                    kinds = [k for k in rounds if k != "binlog"]
                    if args.interleave:
                        self.interleaved(relay, source, kinds)
                    for kind in [] if args.interleave else kinds:
                        outs: list[dict[str, Any]] = []
                        for self.rep in range(args.round_repeat):
                            print(f"round {kind} ({self.rep + 1}/{args.round_repeat}) ...",
                                  flush=True)
                            out = self.round(kind, relay, source)
                            out["load_average"] = round(os.getloadavg()[0], 1)
                            outs.append(out)
                            print(f"  {kind}: {json.dumps(out)}", flush=True)
                        top = max(outs, key=lambda o: float(o.get("tps", 0.0)))
                        best = {**top}
                        if len(outs) > 1:
                            best["tps_vs_alone_runs"] = [o.get("tps_vs_alone") for o in outs]
                        self.results[kind] = best
                    if args.alone_after:
                        self.alone_after(relay, source, kinds)
                    if args.full:
                        out = self.full(relay, source)
                        out["load_average"] = round(os.getloadavg()[0], 1)
                        self.results["full"] = out
                        print(f"  full buffer: {json.dumps(out)}", flush=True)
            finally:
                stop(proc)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=int, default=60)
    p.add_argument("--alone", type=int, default=2, help="runs of sysbench alone (best)")
    p.add_argument("--tables", type=int, default=4)
    p.add_argument("--table-size", type=int, default=20_000)
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--rounds", default="postgresql,mariadb,sqlite,publish,bootstrap")
    p.add_argument("--alone-after", type=int, default=0,
                   help="runs of sysbench alone after the rounds, the relay stopped (best)")
    p.add_argument("--interleave", action="store_true",
                   help="--round-repeat cycles of every round then sysbench alone; each"
                        " round against the alone runs around it")
    p.add_argument("--round-repeat", type=int, default=1,
                   help="runs of each round, each with a new consumer and target (best)")
    p.add_argument("--full", action="store_true", help="apply from a full buffer vs COPY")
    p.add_argument("--buffer-mb", type=int, default=2048)
    p.add_argument("--flush-log", type=int, default=1, choices=(0, 1, 2),
                   help="the source's innodb_flush_log_at_trx_commit (1: MariaDB's default,"
                   " a log flush per commit)")
    p.add_argument("--batch-rows", type=int, default=0)
    p.add_argument("--batch-linger", type=float, default=None)
    p.add_argument("--full-batch-rows", default="",
                   help="comma-separated batch.rows values the full-buffer apply compares,"
                   " alternating on the same buffer (batch.bytes then unbounded); 'default':"
                   " the batch settings as given")
    p.add_argument("--full-repeat", type=int, default=1,
                   help="runs of the full-buffer apply per setting (best reported)")
    p.add_argument("--nice", type=int, default=0, choices=range(0, 20), metavar="0-19",
                   help="the niceness of everything but the source and sysbench: the relay,"
                   " mysqlbinlog, the consumer and its target server (docs/operations.md,"
                   " capture on the database's own host)")
    p.add_argument("--sched-idle", action="store_true",
                   help="like --nice, under Linux's SCHED_IDLE policy instead (chrt --idle 0):"
                   " any other runnable thread goes first")
    p.add_argument("--targets-normal", action="store_true",
                   help="the target databases at normal priority (--nice and --sched-idle"
                        " then apply to the relay and the consumers only)")
    p.add_argument("--no-target-sync", dest="target_sync", action="store_false",
                   help="the targets flush nothing to disk (PostgreSQL fsync=off, MariaDB"
                   " innodb_flush_log_at_trx_commit=0): what the target's disk writes cost"
                   " the writers when it shares the source's disk")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    p.add_argument("--profile", help="directory: replicate processes (and the full-buffer apply) run under"
                   " cProfile")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="databus-sysbench-"))
    started = time.strftime("%Y-%m-%d %H:%M")
    bench = Bench(args, tmp)
    try:
        bench.run()
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"kept {tmp}")
    print("RESULT " + json.dumps({"started": started, "seconds": args.seconds, "nice": args.nice,
                                  "sched_idle": args.sched_idle,
                                  "target_sync": args.target_sync,
                                  "batch": bench.batch, **bench.results}))


if __name__ == "__main__":
    main()
