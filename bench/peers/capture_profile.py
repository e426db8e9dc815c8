"""Where the capture side's time goes for one-row transactions: ``MysqlSource`` ->
``EventBuffer`` over a pre-written binlog of ``--tx`` one-row autocommit INSERTs
(``bench.mysql_latency``'s row: 8 columns), timed (3 runs, alternating with runs whose
table-map cache keeps nothing: every TABLE_MAP parsed, as before the source cached
them) and then profiled (cProfile, top functions by own time). The rate is one-row transactions (= windows) per second, the
ceiling of the relay's capture at high one-row rates, with no HTTP or client in it.

    flock /tmp/databus-bench.lock .venv/bin/python -m bench.peers.capture_profile [--tx 50000]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import shutil
import tempfile
import threading
import time
from pathlib import Path

from tests.support.mariadb import BINLOG_SETTINGS, MariaDB
from tests.support.sources import mysql_source

from bench.mysql_latency import TABLE
from bench.peers.compare import _scn
from databus.buffer import EventBuffer


def _write(m: MariaDB, n: int) -> None:
    con = m.connect("bench")
    try:
        con.autocommit(True)
        with con.cursor() as cur:
            for k in range(1, n + 1):
                cur.execute("INSERT INTO lat VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                            (k, time.time_ns() // 1000, f"name-{k}", f"{k % 10**6}.25",
                             "2024-05-06 07:08:09.123456", "some text " * 3,
                             f'{{"i": {k}, "tags": ["a", "b"]}}', k % 97))
    finally:
        con.close()


class _NoCache(dict[bytes, object]):
    """For the same-run comparison: a table-map cache that keeps nothing (every TABLE_MAP
    parsed, as before the source cached them)."""

    def __setitem__(self, key: bytes, value: object) -> None:
        pass


def _capture(m: MariaDB, start: int, end: int, *, cached: bool = True
             ) -> tuple[int, int, float]:
    src = mysql_source(m.url, [r"bench\.lat"])
    if not cached:
        src._table_defs = _NoCache()  # type: ignore[assignment]
    buf = EventBuffer(512 << 20)
    windows = events = 0
    stop = threading.Event()
    t0 = time.perf_counter()
    after = start
    try:
        while after < end:
            for w in src.read(after, stop, 5.0):
                buf.append_window(w)
                windows += 1
                events += w.count
                after = w.scn
        return windows, events, time.perf_counter() - t0
    finally:
        src.close()
        buf.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tx", type=int, default=50_000)
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="capture-profile-"))
    m = MariaDB(tmp / "db", settings={**BINLOG_SETTINGS, "max-binlog-size": "1073741824",
                                      "innodb-flush-log-at-trx-commit": "2"})
    try:
        m.start()
        m.execute("CREATE DATABASE bench", TABLE)
        start = _scn(m)
        t0 = time.perf_counter()
        _write(m, args.tx)
        print(f"{args.tx} one-row transactions written in {time.perf_counter() - t0:.1f}s",
              flush=True)
        end = _scn(m)
        for k in range(3):  # alternating, same run
            for cached in (True, False) if k % 2 == 0 else (False, True):
                w, e, s = _capture(m, start, end, cached=cached)
                print(f"MysqlSource -> EventBuffer{'' if cached else ', table maps parsed each time'}:"
                      f" {w} windows, {e} events in {s:.2f}s = {w / s:,.0f} windows/s",
                      flush=True)
        prof = cProfile.Profile()
        prof.enable()
        w, e, s = _capture(m, start, end)
        prof.disable()
        print(f"profiled: {w / s:,.0f} windows/s (under cProfile)")
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(args.top)
        print(out.getvalue())
    finally:
        m.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
