"""Persistent buffer recovery: how long a relay's buffer file takes to open (every event's
CRCs and the window structure checked, the SCN index rebuilt) with the compiled scan
(``_select.c``), against its Python twin on the same file in the same run.

A buffer file of ``--mib`` MiB is filled until it wraps with windows of ``--events``
data events of ``--payload`` bytes (a sysbench ``oltp_write_only`` row change is about
that size), closed, then opened ``--rounds`` times each way, alternating; the figure is
the best open of each and the ratio python / compiled (how many times faster recovery
is). A relay serves nothing, not even ``/health``, until its buffer is open.

    .venv/bin/python -m bench.buffer_recovery [--mib 256] [--events 4] [--payload 120]
                                              [--rounds 3]

The last line is machine-readable: ``RESULT {"compiled_s": .., "python_s": .., ..}``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from unittest import mock

from databus.buffer import select
from databus.buffer.ring import EventBuffer
from databus.core import event as ev
from databus.core.window import Window


def fill(path: Path, capacity: int, events: int, payload: int) -> int:
    """Fill a buffer file at ``path`` until it wraps; the number of windows written."""
    body = bytes(range(256)) * (payload // 256 + 1)
    scn = 0
    with EventBuffer(capacity, path=path) as buf:
        while buf.stats()["evicted_windows"] < 1:
            scn += 1
            data = b"".join(ev.encode(scn=scn, src_id=1, key=scn * 16 + k, payload=body[:payload])
                            for k in range(events))
            buf.append_window(Window(scn, data, events, scn))
    return scn


def open_seconds(path: Path, capacity: int, compiled: bool) -> tuple[float, int]:
    """Seconds to open (recover) the buffer at ``path``, and the windows it holds."""
    with mock.patch("databus.buffer.persist.compiled_scan",
                    select.scan_windows if compiled else None):
        started = time.perf_counter()
        buf = EventBuffer(capacity, path=path)
        took = time.perf_counter() - started
    windows = buf.stats()["windows"]
    buf.close()
    return took, windows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--events", type=int, default=4)
    ap.add_argument("--payload", type=int, default=120)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if select.scan_windows is None:
        raise SystemExit("the _select extension is not built: bash scripts/setup.sh")
    capacity = args.mib << 20
    with tempfile.TemporaryDirectory(prefix="databus-bench-recovery-") as tmp:
        path = Path(tmp) / "buffer.bin"
        written = fill(path, capacity, args.events, args.payload)
        best = {"compiled": float("inf"), "python": float("inf")}
        held = 0
        for _ in range(args.rounds):
            for way in ("compiled", "python"):
                took, held = open_seconds(path, capacity, way == "compiled")
                best[way] = min(best[way], took)
                print(f"{way:9s} open {took:7.3f} s  ({held:,} windows held)", flush=True)
    result = {"mib": args.mib, "windows_written": written, "windows_held": held,
              "compiled_s": round(best["compiled"], 3), "python_s": round(best["python"], 3),
              "python_over_compiled": round(best["python"] / best["compiled"], 1)}
    print(f"best of {args.rounds}: compiled {result['compiled_s']} s, Python "
          f"{result['python_s']} s: {result['python_over_compiled']}x faster")
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
