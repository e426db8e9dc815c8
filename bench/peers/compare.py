"""databus beside Debezium's MySQL connector, same MariaDB, same binlog, same run.

One private MariaDB (binlog ROW/FULL/FULL). Debezium is ``DebeziumHarness.java``:
the connector embedded (DebeziumEngine, JSON values, file offsets, no Kafka), its
default value modes.

1. **Binlog -> decoded events.** Debezium first runs in ``snapshot.mode=no_data`` until
   it streams, and stops: its offsets now mark the binlog's end. Then
   ``bench.binlog_decode``'s workload writes ``--rows`` row changes (8-column table;
   inserts in 1,000-row transactions, updates, deletes). Over that same binlog range:
   databus ``MysqlSource`` -> ``EventBuffer`` (``bench.peers.ours``, a process of its
   own, best of ``--repeat``) and Debezium resuming from its offsets until it has
   handed every change to the callback as JSON (best of ``--repeat``; each run from a
   copy of the offsets and history). Debezium's time runs from its first change to
   its last (the JVM's and the connector's start are left out: they are given apart);
   databus's from the call to ``read`` to the last window appended.
2. **Commit -> callback latency** at ``--rates`` transactions/s (``bench.mysql_latency``'s
   writer and table: one-row autocommit INSERTs carrying their send wall time, on an
   absolute schedule, ``--writers`` processes): databus = ``databus relay`` process +
   ``DatabusClient.on_data_event``; Debezium = the harness's batch callback. One after
   the other at each rate; the first ``--warmup`` seconds left out.
3. **RSS**: peak resident memory (VmHWM / ru_maxrss) of the databus capture process
   (1) and relay process (2), and of Debezium's JVM (its default heap settings unless
   ``--heap``).
4. **CPU per transaction** in (2): the CPU seconds the consumer side used from the
   writers' start until the last row was received (databus: the relay process and the
   client's process; Debezium: its JVM), and the MariaDB server's, divided by the
   transactions. On 2 shared cores, what a consumer uses per transaction is what the
   writers and the server cannot: it decides the rate the writers reach in its run.

    .venv/bin/python -m bench.peers.compare [--rows 300000] [--rates 1000,10000]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tests.support.mariadb import BINLOG_SETTINGS, MariaDB
from tests.support.procs import stop

from bench.binlog_decode import workload
from bench.mysql_latency import TABLE, _Latency, _stats, _writer, relay_and_client
from bench.peers.harness import Debezium, classpath, mark, prepare
from databus.client import DataEvent
from databus.sources.mysql.checks import parse_mysql_url
from databus.sources.mysql.connection import master_status

DECODE_TABLE = ("CREATE TABLE bench.t (id INT PRIMARY KEY, name VARCHAR(64),"
                " amount DECIMAL(12,2), at DATETIME(6), note TEXT, doc JSON, qty INT,"
                " flag TINYINT)")


def _scn(m: MariaDB) -> int:
    file, pos = master_status(parse_mysql_url(m.url))
    return (int(file.rsplit(".", 1)[1]) << 32) | pos


def _peak_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return -1


# -- 1. throughput ---------------------------------------------------------------------

def throughput(m: MariaDB, tmp: Path, cp: str, rows: int, repeat: int,
               heap: str | None) -> dict[str, Any]:
    m.execute("CREATE DATABASE bench", DECODE_TABLE)
    primed = tmp / "dbz-primed"
    h = Debezium(m, primed, mode="count", tables="bench.t", cp=cp, heap=heap)
    h.wait_streaming()
    h.stop()
    h.result()
    # a resumed Debezium skipped the first row change after its stored offset (seen with
    # MariaDB 10.11: the first insert's first row was never delivered): a control row
    # stands there instead, outside the measured range
    mark(m, "pad")
    start = _scn(m)
    t0 = time.perf_counter()
    workload(m, rows)
    print(f"workload: {rows} row changes written in {time.perf_counter() - t0:.1f}s",
          flush=True)
    end = _scn(m)

    out = subprocess.run([sys.executable, "-m", "bench.peers.ours", "--port", str(m.port),
                          "--start", str(start), "--end", str(end), "--repeat", str(repeat)],
                         check=True, capture_output=True, text=True, timeout=1800)
    ours = json.loads(next(line for line in out.stdout.splitlines()
                           if line.startswith("RESULT "))[len("RESULT "):])
    print(f"databus: {ours}", flush=True)
    theirs: list[dict[str, Any]] = []
    for k in range(repeat):
        work = tmp / f"dbz-run{k}"
        shutil.copytree(primed, work)
        h = Debezium(m, work, mode="count", tables="bench.t", cp=cp, expect=rows, heap=heap)
        theirs.append(h.result(timeout=1800))
        print(f"debezium run {k + 1}: {theirs[-1]}", flush=True)
    best = min(theirs, key=lambda r: float(r["first_to_last_s"]))
    return {"rows": rows, "ours": ours, "debezium": best,
            "debezium_runs": [(r["first_to_last_s"], r["start_to_last_s"]) for r in theirs]}


# -- 2. latency ------------------------------------------------------------------------

class _Rows(_Latency):
    """``bench.mysql_latency``'s consumer, for the rows of ``bench.lat`` only (the relay
    also delivers its own notices, ``databus.*``), changes only: the relay streams from the
    binlog's end (``--snapshot-mode no_data``, as Debezium's ``snapshot.mode=no_data``);
    had it sent the rows of earlier runs as a snapshot, they would count towards the
    run's rows (ending it before its last rows arrived) and towards its span."""

    def on_data_event(self, event: DataEvent) -> None:
        if event.source == "bench.lat" and not event.is_snapshot:
            super().on_data_event(event)


def _paced(port: int, first_id: int, count: int, rate: float, writers: int
           ) -> tuple[list[mp.process.BaseProcess], float]:
    """``writers`` processes, each ``rate / writers`` tx/s on its own id range."""
    start_at = time.time() + 3.0  # the writers' spawn under load: no catch-up burst
    ctx = mp.get_context("spawn")
    per = count // writers
    procs: list[mp.process.BaseProcess] = []
    for w in range(writers):
        n = per if w < writers - 1 else count - per * (writers - 1)
        p = ctx.Process(target=_writer,
                        args=(port, first_id + w * per, n, rate / writers,
                              start_at + w / rate))
        p.start()
        procs.append(p)
    return procs, start_at


_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` so far (None once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK


class CpuWatch:
    """CPU seconds used by some processes from :meth:`start` to :meth:`stop` (or to their
    end: read every 0.2 s, so a process that exits keeps its last reading)."""

    def __init__(self, pids: dict[str, int]) -> None:
        self._pids = pids
        self._first: dict[str, float] = {}
        self._last: dict[str, float] = {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _read(self) -> None:
        for name, pid in self._pids.items():
            v = _cpu_s(pid)
            if v is not None:
                self._first.setdefault(name, v)
                self._last[name] = v

    def _run(self) -> None:
        while not self._done.wait(0.2):
            self._read()

    def start(self) -> CpuWatch:
        self._read()
        self._thread.start()
        return self

    def stop(self) -> dict[str, float]:
        self._done.set()
        self._thread.join()
        self._read()
        return {k: self._last[k] - self._first[k] for k in self._first}


def latency_databus(m: MariaDB, tmp: Path, first_id: int, count: int, rate: float,
                    writers: int) -> tuple[list[Any], int, dict[str, float]]:
    consumer = _Rows(count)
    relay, _, stop_client = relay_and_client(m, tmp / f"relay-{first_id}.log", consumer)
    try:
        assert m.proc is not None
        watch = CpuWatch({"relay": relay.pid, "mariadb": m.proc.pid}).start()
        own0 = sum(os.times()[:2])  # the client's thread (the writers are processes)
        procs, start_at = _paced(m.port, first_id, count, rate, writers)
        try:
            consumer.done.wait(count / rate + 120)
        finally:
            cpu = watch.stop()
            cpu["client"] = sum(os.times()[:2]) - own0
            for p in procs:
                p.join()
            stop_client()
        peak = _peak_kb(relay.pid)
    finally:
        stop(relay)
    return [start_at, *consumer.samples], peak, cpu


def latency_debezium(m: MariaDB, tmp: Path, cp: str, first_id: int, count: int, rate: float,
                     writers: int, heap: str | None) -> tuple[list[Any], int, dict[str, float]]:
    out = tmp / f"dbz-lat-{first_id}.txt"
    h = Debezium(m, tmp / f"dbz-lat-{first_id}", mode="latency", tables="bench.lat", cp=cp,
                 expect=count, out=out, heap=heap)
    h.wait_streaming()
    assert m.proc is not None
    watch = CpuWatch({"jvm": h.proc.pid, "mariadb": m.proc.pid}).start()
    procs, start_at = _paced(m.port, first_id, count, rate, writers)
    try:
        res = h.result(timeout=count / rate + 300)
    finally:
        cpu = watch.stop()  # the JVM's last reading before it exited
        for p in procs:
            p.join()
    samples = [tuple(int(x) for x in line.split()) for line in out.read_text().splitlines()]
    return [start_at, *samples], int(res["peak_rss_kb"]), cpu


def _latency_pair(m: MariaDB, tmp: Path, cp: str, first: int, count: int, rate: float,
                  pair: int, args: argparse.Namespace) -> dict[str, Any]:
    """One databus run and one Debezium run at ``rate`` (ids from ``first``); every other
    pair Debezium runs first, as the machine's load drifts."""
    load = os.getloadavg()[0]
    ids = {"ours": first, "debezium": first + count}
    if pair % 2:
        ids = {"debezium": first, "ours": first + count}
    order = sorted(ids, key=ids.__getitem__)
    out: dict[str, Any] = {"rate": rate, "count": count, "pair": pair + 1, "first": order[0]}
    for who in order:
        if who == "ours":
            run, kb, cpu = latency_databus(m, tmp, ids[who], count, rate, args.writers)
        else:
            run, kb, cpu = latency_debezium(m, tmp, cp, ids[who], count, rate, args.writers,
                                            args.heap)
        out.update({who: _stats(run, args.warmup), f"{who}_rss_kb": kb, f"{who}_cpu_s": cpu})
    out["loadavg_1m"] = [load, os.getloadavg()[0]]
    return out


# -- report ----------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=300_000)
    ap.add_argument("--repeat", type=int, default=3, help="runs of each reader (best kept)")
    ap.add_argument("--rates", default="1000,10000", help="latency runs, transactions/s")
    ap.add_argument("--seconds", type=float, default=15.0, help="length of a latency run")
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--writers", type=int, default=2, help="writer processes (latency)")
    ap.add_argument("--heap", default=None, help="the JVM's -Xmx (default: the JVM's)")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--pairs", type=int, default=1,
                    help="latency runs of both at each rate (every other pair Debezium first)")
    args = ap.parse_args()
    cp = classpath()
    tmp = Path(tempfile.mkdtemp(prefix="peers-bench-"))
    m = MariaDB(tmp / "db", settings={**BINLOG_SETTINGS, "max-binlog-size": "1073741824",
                                      "innodb-flush-log-at-trx-commit": "2"})
    report: dict[str, Any] = {}
    try:
        m.start()
        prepare(m)
        if not args.skip_throughput:
            report["throughput"] = throughput(m, tmp, cp, args.rows, args.repeat, args.heap)
        else:
            m.execute("CREATE DATABASE bench")
        m.execute(TABLE)
        first = 1
        report["latency"] = []
        for rate in (float(r) for r in args.rates.split(",")):
            for pair in range(args.pairs):
                count = int(rate * args.seconds)
                report["latency"].append(_latency_pair(m, tmp, cp, first, count, rate, pair,
                                                       args))
                first += 2 * count
                print(json.dumps(report["latency"][-1]), flush=True)
    finally:
        m.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    _print(report)


def _print(r: dict[str, Any]) -> None:
    print("RESULT " + json.dumps(r))
    if "throughput" in r:
        t = r["throughput"]
        ours, dbz = t["ours"], t["debezium"]
        o_rate = ours["events"] / ours["best_s"]
        d_rate = dbz["events"] / dbz["first_to_last_s"]
        d_all = dbz["events"] / dbz["start_to_last_s"]
        print(f"\n{'binlog -> decoded events':<52} | {'rows':>7} | {'seconds':>7} |"
              f" {'rows/s':>9} | {'peak RSS':>8}")
        print(f"{'databus MysqlSource -> EventBuffer (best)':<52} | {ours['events']:>7} |"
              f" {ours['best_s']:>7.2f} | {o_rate:>9,.0f} | {ours['peak_rss_kb'] / 1024:>5.0f} MB")
        print(f"{'Debezium MySqlConnector -> JSON callback (best)':<52} | {dbz['events']:>7} |"
              f" {dbz['first_to_last_s']:>7.2f} | {d_rate:>9,.0f} |"
              f" {dbz['peak_rss_kb'] / 1024:>5.0f} MB")
        print(f"{'  same, from the engine start':<52} | {dbz['events']:>7} |"
              f" {dbz['start_to_last_s']:>7.2f} | {d_all:>9,.0f} |")
        print(f"databus / Debezium: {o_rate / d_rate:.2f}x (goal >= 3x);"
              f" runs: databus {ours['seconds']}, Debezium {t['debezium_runs']}")
    for lat in r.get("latency", []):
        n = lat["count"]
        print(f"\n{n} one-row transactions per run at {lat['rate']:.0f}/s, pair"
              f" {lat.get('pair', 1)} ({lat.get('first', 'ours')} first; load average at the"
              f" start and end: {lat['loadavg_1m'][0]:.1f}, {lat['loadavg_1m'][1]:.1f})")
        print(f"{'path':<48} | {'tx/s':>6} | {'p50 ms':>7} | {'p90 ms':>7} | {'p99 ms':>7} |"
              f" {'max ms':>7} | {'peak RSS':>8} | {'CPU us/tx':>9} | {'MariaDB':>7}")
        ours_cpu, theirs_cpu = lat["ours_cpu_s"], lat["debezium_cpu_s"]
        for name, s, kb, mine, db in (
                ("databus relay -> client on_data_event", lat["ours"], lat["ours_rss_kb"],
                 ours_cpu.get("relay", 0) + ours_cpu.get("client", 0), ours_cpu.get("mariadb", 0)),
                ("Debezium engine -> batch callback", lat["debezium"], lat["debezium_rss_kb"],
                 theirs_cpu.get("jvm", 0), theirs_cpu.get("mariadb", 0))):
            print(f"{name:<48} | {s['rate']:>6.0f} | {s['p50']:>7.2f} | {s['p90']:>7.2f} |"
                  f" {s['p99']:>7.2f} | {s['max']:>7.2f} | {kb / 1024:>5.0f} MB |"
                  f" {1e6 * mine / n:>9.1f} | {1e6 * db / n:>7.1f}")
        print(f"p99 databus/Debezium: {lat['ours']['p99'] / lat['debezium']['p99']:.2f}x"
              f" (goal <= 1x); p50 {lat['ours']['p50'] / lat['debezium']['p50']:.2f}x")


if __name__ == "__main__":
    main()
