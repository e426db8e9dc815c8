"""Where the capture side's time goes: ``MysqlSource`` -> ``EventBuffer`` over a
pre-written binlog of ``--tx`` transactions of ``--statements`` one-row INSERTs each
(default 1: autocommit; ``bench.mysql_latency``'s row: 8 columns), timed in ``--runs``
pairs alternating with runs of a baseline (``--against``: ``uncached-table-maps``, a
table-map cache that keeps nothing, every TABLE_MAP parsed as before the source cached
them; ``whole-rows-meta``, each rows event's metadata part built whole, as before
``RowsMeta``; ``python-framing``, every event cut and its header parsed in Python, as
before ``_rowcodec.frames``), then profiled (cProfile, top functions by own time). The
rate is transactions (= windows) per second and per CPU second of this process, the
ceiling of the relay's capture, with no HTTP or client in it.

    flock /tmp/databus-bench.lock .venv/bin/python -m bench.peers.capture_profile [--tx 50000] \
        [--statements 1] [--against uncached-table-maps|whole-rows-meta|python-framing] \
        [--runs 3]
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
from databus.sources.mysql import fastpath
from databus.sources.mysql.tables import meta_middle


def _write(m: MariaDB, n: int, statements: int = 1) -> None:
    con = m.connect("bench")
    try:
        con.autocommit(statements == 1)
        with con.cursor() as cur:
            for k in range(1, n * statements + 1):
                cur.execute("INSERT INTO lat VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                            (k, time.time_ns() // 1000, f"name-{k}", f"{k % 10**6}.25",
                             "2024-05-06 07:08:09.123456", "some text " * 3,
                             f'{{"i": {k}, "tags": ["a", "b"]}}', k % 97))
                if statements > 1 and k % statements == 0:
                    con.commit()
    finally:
        con.close()


class _NoCache(dict[bytes, object]):
    """For the same-run comparison: a table-map cache that keeps nothing (every TABLE_MAP
    parsed, as before the source cached them)."""

    def __setitem__(self, key: bytes, value: object) -> None:
        pass


def _whole_rows_meta(gtid: str | None, file: str, pos: int, server_id: int) -> bytes:
    """For the same-run comparison: the metadata part built whole for each rows event."""
    return meta_middle(gtid, file, pos, gtid, server_id)


def _capture(m: MariaDB, start: int, end: int, *, baseline: str | None = None
             ) -> tuple[int, int, float, float]:
    """Windows, events, wall seconds and this process's CPU seconds of one capture, with
    the code as it is or as it was (``baseline``: an ``--against`` choice)."""
    src = mysql_source(m.url, [r"bench\.lat"])
    frames = fastpath.frames
    if baseline == "python-framing":
        fastpath.frames = lambda: None  # the stream made by the first read cuts in Python
    elif baseline == "whole-rows-meta":
        src._rows_meta = _whole_rows_meta  # type: ignore[assignment]
    elif baseline == "uncached-table-maps":
        src._table_defs = _NoCache()  # type: ignore[assignment]
    buf = EventBuffer(512 << 20)
    windows = events = 0
    stop = threading.Event()
    t0, c0 = time.perf_counter(), time.process_time()
    after = start
    try:
        while after < end:
            for w in src.read(after, stop, 5.0):
                buf.append_window(w)
                windows += 1
                events += w.count
                after = w.scn
        return windows, events, time.perf_counter() - t0, time.process_time() - c0
    finally:
        fastpath.frames = frames
        src.close()
        buf.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tx", type=int, default=50_000)
    ap.add_argument("--statements", type=int, default=1,
                    help="one-row INSERTs per transaction (a rows event each)")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--against", choices=["uncached-table-maps", "whole-rows-meta",
                                          "python-framing"],
                    default="uncached-table-maps", help="the baseline of the timed runs")
    ap.add_argument("--runs", type=int, default=3, help="pairs of timed runs")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="capture-profile-"))
    m = MariaDB(tmp / "db", settings={**BINLOG_SETTINGS, "max-binlog-size": "1073741824",
                                      "innodb-flush-log-at-trx-commit": "2"})
    try:
        m.start()
        m.execute("CREATE DATABASE bench", TABLE)
        start = _scn(m)
        t0 = time.perf_counter()
        _write(m, args.tx, args.statements)
        print(f"{args.tx} transactions of {args.statements} one-row INSERTs written in"
              f" {time.perf_counter() - t0:.1f}s",
              flush=True)
        end = _scn(m)
        base = {"uncached-table-maps": "table maps parsed each time",
                "whole-rows-meta": "rows metadata built whole",
                "python-framing": "events cut in Python"}[args.against]
        rates: dict[bool, list[float]] = {True: [], False: []}  # True: the code as it is
        per_cpu: dict[bool, list[float]] = {True: [], False: []}
        for k in range(args.runs):  # alternating, same run
            for now in (True, False) if k % 2 == 0 else (False, True):
                w, e, s, cpu = _capture(m, start, end,
                                        baseline=None if now else args.against)
                rates[now].append(w / s)
                per_cpu[now].append(w / cpu)
                print(f"MysqlSource -> EventBuffer{'' if now else ', ' + base}:"
                      f" {w} windows, {e} events in {s:.2f}s = {w / s:,.0f} windows/s,"
                      f" {cpu:.2f} CPU s = {w / cpu:,.0f} windows per CPU second", flush=True)
        # the server's dump may bound the wall-clock rate: the CPU figure is the capture's cost
        print(f"best of {args.runs}: {max(rates[True]):,.0f} against {max(rates[False]):,.0f}"
              f" windows/s ({base}): {max(rates[True]) / max(rates[False]):.2f}x; per CPU"
              f" second {max(per_cpu[True]):,.0f} against {max(per_cpu[False]):,.0f}:"
              f" {max(per_cpu[True]) / max(per_cpu[False]):.2f}x", flush=True)
        prof = cProfile.Profile()
        prof.enable()
        w, e, s, _cpu = _capture(m, start, end)
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
