"""Where the commit -> callback path spends its CPU at a paced one-row rate.

``bench.peers.compare``'s databus latency run (one private MariaDB, ``bench.mysql_latency``'s
table and writers, ``databus relay`` process -> ``DatabusClient.on_data_event`` in this
process), once, with the CPU time each process used while the rows went through, divided by
the windows delivered: the relay process, the client (this process; the writers are
processes of their own), the MariaDB server and the writers. On 2 cores shared by all of
them, the sum per window is what decides the rate the whole path keeps up with.

With ``--pyspy DIR``, ``py-spy record`` samples the relay and this process (raw collapsed
stacks, ``--nonblocking``) and the top functions by own time are printed for each.

    flock /tmp/databus-bench.lock .venv/bin/python -m bench.peers.latency_profile \
        [--rate 5000] [--seconds 15] [--pyspy /tmp/prof]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from tests.support.mariadb import BINLOG_SETTINGS, MariaDB
from tests.support.procs import stop

from bench.mysql_latency import TABLE, _stats, relay_and_client
from bench.peers.compare import _paced, _peak_kb, _Rows

_TICK = os.sysconf("SC_CLK_TCK")


def _cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _pyspy(pid: int, out: Path, seconds: float) -> subprocess.Popen[bytes]:
    exe = Path(sys.executable).with_name("py-spy")
    return subprocess.Popen([str(exe), "record", "--pid", str(pid), "--format", "raw",
                             "--nonblocking", "--gil", "--nolineno", "--rate", "250", "--duration", str(int(seconds)),
                             "--output", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def top_functions(raw: Path, n: int) -> list[str]:
    """Own-time and inclusive shares of the functions in a py-spy raw (collapsed) file."""
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        k = int(count)
        total += k
        frames = stack.split(";")
        own[frames[-1]] += k
        for f in set(frames):
            incl[f] += k
    out = [f"{total} samples; own%  incl%  function"]
    for f, k in own.most_common(n):
        out.append(f"{100 * k / total:5.1f} {100 * incl[f] / total:6.1f}  {f}")
    return out


def _stream_requests(url: str) -> int:
    """``/stream`` answers the relay gave (200 and otherwise), from its ``/metrics``."""
    total = 0
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("databus_relay_requests_total{") and 'endpoint="stream"' in line:
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rate", type=float, default=5000.0)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--writers", type=int, default=2)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--pyspy", type=Path, default=None, help="directory for py-spy's output")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    count = int(args.rate * args.seconds)
    tmp = Path(tempfile.mkdtemp(prefix="latency-profile-"))
    m = MariaDB(tmp / "db", settings={**BINLOG_SETTINGS, "max-binlog-size": "1073741824",
                                      "innodb-flush-log-at-trx-commit": "2"})
    try:
        m.start()
        m.execute("CREATE DATABASE bench", TABLE)
        consumer = _Rows(count)
        relay, url, stop_client = relay_and_client(m, tmp / "relay.log", consumer)
        try:
            assert m.proc is not None
            spies = []
            if args.pyspy is not None:
                args.pyspy.mkdir(parents=True, exist_ok=True)
                span = args.seconds + 3
                spies = [_pyspy(relay.pid, args.pyspy / "relay.txt", span),
                         _pyspy(os.getpid(), args.pyspy / "client.txt", span)]
            cpu0 = (_cpu(relay.pid), sum(os.times()[:2]), _cpu(m.proc.pid))
            kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.monotonic()
            procs, start_at = _paced(m.port, 1, count, args.rate, args.writers)
            try:
                consumer.done.wait(count / args.rate + 120)
            finally:
                for p in procs:
                    p.join()
            wall = time.monotonic() - t0
            cpu1 = (_cpu(relay.pid), sum(os.times()[:2]), _cpu(m.proc.pid))
            kids1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            stop_client()
            for s in spies:
                s.wait(60)
            peak = _peak_kb(relay.pid)
            requests = _stream_requests(url)
        finally:
            stop(relay)
    finally:
        m.stop()
    got = len(consumer.samples)
    stats = _stats([start_at, *consumer.samples], args.warmup)
    writers_cpu = (kids1.ru_utime + kids1.ru_stime) - (kids0.ru_utime + kids0.ru_stime)
    per = {"relay": cpu1[0] - cpu0[0], "client": cpu1[1] - cpu0[1],
           "mariadb": cpu1[2] - cpu0[2], "writers": writers_cpu}
    print("RESULT " + json.dumps({"rate": args.rate, "rows": got, "wall_s": wall,
                                  "latency": stats, "cpu_s": per, "relay_peak_kb": peak,
                                  "stream_requests": requests}))
    print(f"\n{got} one-row transactions at {args.rate:.0f}/s target: writers reached"
          f" {stats['rate']:,.0f} tx/s; p50 {stats['p50']:.2f} ms, p99 {stats['p99']:.2f} ms,"
          f" max {stats['max']:.2f} ms; {wall:.1f} s from the writers' start to the last row")
    print(f"/stream answers: {requests} ({got / max(requests, 1):.1f} windows per answer)")
    print(f"{'process':<10} | {'CPU s':>6} | {'us/window':>9} | {'cores':>5}")
    for name, cpu in per.items():
        print(f"{name:<10} | {cpu:>6.2f} | {1e6 * cpu / max(got, 1):>9.1f} | {cpu / wall:>5.2f}")
    total = sum(per.values())
    print(f"{'sum':<10} | {total:>6.2f} | {1e6 * total / max(got, 1):>9.1f} | {total / wall:>5.2f}")
    if args.pyspy is not None:
        for name in ("relay", "client"):
            f = args.pyspy / f"{name}.txt"
            if f.exists():
                print(f"\npy-spy, {name} process:")
                print("\n".join(top_functions(f, args.top)))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
