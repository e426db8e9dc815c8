"""SQLite capture under a writer: shared window cuts vs local cuts, same run.

A writer process commits transactions of ``--rows-per-tx`` inserts into a
captured table at full speed for ``--seconds`` (default SQLite settings: WAL,
``synchronous=FULL``), while a ``SqliteSource`` in this process reads eagerly
(``poll_interval`` 1 ms) and encodes every row. The figure is rows captured per
second, from the writer's start until the source has emitted its last row (the
writer's own pace included: a shared cut is a commit that takes the
application's write lock). Local and shared runs alternate; best of ``--runs``
each.

    .venv/bin/python -m bench.sqlite_cuts [--seconds 4] [--rows-per-tx 4] [--runs 3]

The last line is ``ratio shared/local: X`` (capture rows/s, best against best).
"""

from __future__ import annotations

import argparse
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import closing
from pathlib import Path

from tests.support.sources import sqlite_source

WRITER = """
import sqlite3, sys, time
con = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
per_tx, until = int(sys.argv[2]), time.monotonic() + float(sys.argv[3])
tx = 0
while time.monotonic() < until:
    tx += 1
    con.execute("BEGIN IMMEDIATE")
    for line in range(per_tx):
        con.execute("INSERT INTO orders (customer, amount, note) VALUES (?, ?, ?)",
                    (tx % 1000, tx * 0.25 + line, "note " * 4))
    con.execute("COMMIT")
print(tx)
"""


def run(mode: str, seconds: float, per_tx: int) -> tuple[float, float, int, int]:
    """One run: (capture rows/s, writer tx/s, windows, cuts written)."""
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.db"
        with closing(sqlite3.connect(db)) as con:
            con.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, customer INTEGER,"
                        " amount REAL, note TEXT)")
            con.commit()
        src = sqlite_source(db, ["orders"], name=f"bench-{mode}", snapshot_mode="no_data",
                            poll_interval=0.001, window_cuts=mode)
        try:
            t0 = time.monotonic()
            writer = subprocess.Popen([sys.executable, "-c", WRITER, str(db), str(per_tx),
                                       str(seconds)], stdout=subprocess.PIPE, text=True)
            stop = threading.Event()
            pos, rows, windows, last = -1, 0, 0, t0
            while writer.poll() is None:
                for w in src.read(pos, stop, 0.05):
                    pos, rows, windows, last = w.scn, rows + w.count, windows + 1, time.monotonic()
            out, _ = writer.communicate()
            txs = int(out)
            while rows < txs * per_tx:
                got = src.read(pos, stop, 1.0)
                if not got:
                    raise RuntimeError(f"{mode}: {rows} of {txs * per_tx} rows captured")
                for w in got:
                    pos, rows, windows, last = w.scn, rows + w.count, windows + 1, time.monotonic()
            cuts = int(src.stats()["window_cuts_total"])
        finally:
            src.close()
    return rows / (last - t0), txs / seconds, windows, cuts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--rows-per-tx", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    best: dict[str, tuple[float, float, int, int]] = {}
    print(f"writer: {args.rows_per_tx} inserts per transaction for {args.seconds:g} s;"
          f" {args.runs} runs per mode, alternating")
    print(f"{'mode':6} | {'capture rows/s':>14} | {'writer tx/s':>11} | {'windows':>7} |"
          f" {'cuts':>6}")
    for _ in range(args.runs):
        for mode in ("local", "shared"):
            got = run(mode, args.seconds, args.rows_per_tx)
            print(f"{mode:6} | {got[0]:14,.0f} | {got[1]:11,.0f} | {got[2]:7} | {got[3]:6}",
                  flush=True)
            if mode not in best or got[0] > best[mode][0]:
                best[mode] = got
    for mode, (rate, txs, windows, cuts) in best.items():
        print(f"best {mode}: {rate:,.0f} rows/s captured, writer {txs:,.0f} tx/s,"
              f" {windows} windows, {cuts} cuts")
    print(f"ratio shared/local: {best['shared'][0] / best['local'][0]:.2f}")


if __name__ == "__main__":
    main()
