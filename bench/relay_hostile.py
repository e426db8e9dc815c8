"""500 concurrent clients against one relay: well-behaved consumers beside slow,
stalled and vanishing ones.

One relay (SQLite source, a writer committing transactions during each phase) and:

* ``good``: consumers that follow /stream with checkpoints, like the client library,
  and count every row they receive (they must receive every committed row);
* ``hostile`` (the rest of the 500): a mix of clients that ask for large answers and
  never read them, read them a few bytes a second, close mid-answer, or send half a
  request and stall.

Baseline (same run, same relay, same good consumers): the phase with the good
consumers alone. The figure is the good consumers' rows/s with the hostile crowd
over the same without it, plus the relay process's peak RSS in each phase and the
number of rows lost (must be 0): every consumer checks it received each id the
writer committed in the phase (by id, so a repeat cannot hide a gap).

    .venv/bin/python -m bench.relay_hostile [--clients 500] [--good 20] [--seconds 15]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import random
import sqlite3
import tempfile
import time
from pathlib import Path

import httpx

from databus.core import event as ev
from databus.core.checkpoint import Checkpoint
from databus.relay.config import parse_config
from databus.relay.relay import Relay

ROW_BYTES = 200


def _rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _writer(db: Path, rows: int, start_id: int) -> None:
    """Commits ``rows`` rows in 100-row transactions."""
    con = sqlite3.connect(db)
    for n in range(start_id, start_id + rows, 100):
        with con:
            con.executemany("INSERT INTO t VALUES (?, ?)",
                            [(i, "x" * ROW_BYTES) for i in range(n, n + 100)])
    con.close()


# -- good consumers ---------------------------------------------------------------------


async def _follow(url: str, until: mp.Value, start_scn: int, counts: list[int],  # type: ignore[type-arg]
                  seen: set[int], i: int) -> None:
    cp = Checkpoint.after(start_scn)
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        while True:
            target = until.value
            if target >= 0 and cp.window_scn >= target:
                return
            r = await client.get("/stream", params={"checkPoint": cp.to_json(),
                                                    "size": str(1 << 20), "timeout": "1"})
            r.raise_for_status()
            for e in ev.iter_events(r.content, verify=False):
                if e.is_eop:
                    cp = cp.window_done(e.scn)
                elif not e.is_control:
                    counts[i] += 1
                    seen.add(int(e.key))  # type: ignore[arg-type]  # table t: INTEGER keys


def _good_process(url: str, n: int, until: mp.Value, start_scn: int,  # type: ignore[type-arg]
                  wanted: range, out: mp.Queue) -> None:  # type: ignore[type-arg]
    """Runs ``n`` consumers; puts (rows each received, rows of ``wanted`` each missed)."""
    counts = [0] * n
    seen: list[set[int]] = [set() for _ in range(n)]

    async def main() -> None:
        await asyncio.gather(*(_follow(url, until, start_scn, counts, seen[i], i)
                               for i in range(n)))

    asyncio.run(main())
    want = set(wanted)
    out.put((counts, [len(want - s) for s in seen]))


# -- hostile clients -------------------------------------------------------------------------


async def _hostile(port: int, kind: int, stop_at: float) -> None:
    while time.monotonic() < stop_at:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.2)
            continue
        try:
            if kind == 3:  # half a request, then silence
                writer.write(b"GET /stream?size=1048576 HTTP/1.1\r\nHost: x\r\n")
                await writer.drain()
                await asyncio.sleep(max(0.0, stop_at - time.monotonic()))
                return
            writer.write(f"GET /stream?size={32 << 20}&timeout=0 HTTP/1.1\r\n"
                         "Host: x\r\n\r\n".encode())
            await writer.drain()
            if kind == 0:  # never reads
                await asyncio.sleep(max(0.0, stop_at - time.monotonic()))
                return
            if kind == 1:  # reads a little, slowly
                while time.monotonic() < stop_at:
                    if not await reader.read(100):
                        break
                    await asyncio.sleep(1.0)
            else:  # reads a bit and goes away mid-answer
                await reader.read(random.randint(1, 1 << 16))
        except OSError:
            pass
        finally:
            writer.close()


def _hostile_process(port: int, n: int, seconds: float, kinds: tuple[int, ...]) -> None:
    async def main() -> None:
        stop_at = time.monotonic() + seconds
        await asyncio.gather(*(_hostile(port, kinds[i % len(kinds)], stop_at)
                               for i in range(n)))

    asyncio.run(main())


# -- phases ----------------------------------------------------------------------------------


def _settled(relay: Relay) -> int:
    """The relay's newest SCN once capture has stopped moving for a second."""
    last, since = relay.buffer.max_scn, time.monotonic()
    while time.monotonic() - since < 1.0:
        time.sleep(0.05)
        if relay.buffer.max_scn != last:
            last, since = relay.buffer.max_scn, time.monotonic()
    return last


def _phase(relay: Relay, db: Path, good: int, hostile: int, rows: int,
           start_id: int, kinds: tuple[int, ...] = (0, 1, 2, 3)) -> tuple[float, int, float]:
    """The good consumers drain ``rows`` new rows, with ``hostile`` others connected:
    their rows/s, the rows lost (missing from any consumer), the relay's peak RSS."""
    start_scn = _settled(relay)
    _writer(db, rows, start_id)
    target = _settled(relay)
    ctx = mp.get_context("spawn")
    until = ctx.Value("q", target)
    out: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    bad = [ctx.Process(target=_hostile_process, args=(relay.port, hostile // 2, 60, kinds))
           for _ in range(2 if hostile else 0)]
    for p in bad:
        p.start()
    peak = _rss_mb()
    if bad:
        time.sleep(5.0)  # the crowd connected, its stalled answers pending
    t0 = time.monotonic()
    consumers = ctx.Process(target=_good_process, args=(
        relay.url, good, until, start_scn, range(start_id, start_id + rows), out))
    consumers.start()
    while consumers.is_alive() and out.empty():
        peak = max(peak, _rss_mb())
        time.sleep(0.1)
    counts, missed = out.get(timeout=600)
    elapsed = time.monotonic() - t0
    consumers.join()
    peak = max(peak, _rss_mb())
    for p in bad:
        p.kill()
        p.join()
    return sum(counts) / elapsed, sum(missed), peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=500)
    ap.add_argument("--good", type=int, default=20)
    ap.add_argument("--rows", type=int, default=50_000, help="rows each phase drains")
    ap.add_argument("--kinds", default="0,1,2,3", help="hostile kinds: 0 never reads,"
                    " 1 reads 100 B/s, 2 leaves mid-answer and comes back, 3 half a request")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.db"
        with sqlite3.connect(db) as con:
            con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
        relay = Relay(parse_config({
            "source": {"url": f"sqlite:///{db}", "tables": ["t"], "poll_interval": 0.01,
                       "snapshot_mode": "no_data"},
            "buffer": {"capacity_bytes": 256 << 20},
            "http": {"port": 0, "max_connections": 4096, "send_timeout": 5}}))
        with relay:
            rss0 = _rss_mb()
            base = _phase(relay, db, args.good, 0, args.rows, 0)
            crowd = _phase(relay, db, args.good, args.clients - args.good, args.rows,
                           10_000_000, tuple(int(k) for k in args.kinds.split(",")))
    hostile = args.clients - args.good
    print(f"relay RSS before: {rss0:.0f} MiB; {args.good} consumers x {args.rows} rows each")
    print(f"baseline, consumers alone: {base[0]:10.0f} rows/s, {base[1]} rows lost,"
          f" relay peak RSS {base[2]:.0f} MiB")
    print(f"beside {hostile} hostile clients: {crowd[0]:10.0f} rows/s, {crowd[1]} rows lost,"
          f" relay peak RSS {crowd[2]:.0f} MiB")
    print(f"ratio (with / without the hostile clients): {crowd[0] / base[0]:.2f}")


if __name__ == "__main__":
    main()
