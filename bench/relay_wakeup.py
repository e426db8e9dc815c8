"""Long-poll wake-up: how fast waiting ``/stream`` requests are answered after a window
is appended, and what each wake costs the relay, with 1, 100 and 1000 waiters.

A relay (in this process) gets one 1-event window every ``1/rate`` s from a
source fed by a queue (``rate`` = ``--rate``, lowered for many waiters so that
they ask for at most ``--answers`` answers a second: the relay's wake is measured,
not a saturated machine); each window's capture time is recorded when it is handed to
the fetcher. ``N`` clients (raw HTTP/1.1 keep-alive connections driven by one
asyncio loop in a separate process) each long-poll from their last window; a
client notes when each answer arrived. Latency = arrival - capture, per window
and client (same machine, same wall clock), so it covers the fetcher's hand-off,
the buffer append, the wake of the waiting requests and the answers' way to the
clients. Beside it: the relay's event-loop thread CPU per appended window (what
a wake of N waiters costs). No baseline server: compare runs of two versions of
the code (``PYTHONPATH``) in the same hour.

    .venv/bin/python -m bench.relay_wakeup [--waiters 1,100,1000] [--rate 200] [--answers 4000]
                                           [--seconds 5]

The last line is machine-readable: ``RESULT {"1": {"p50_ms": ..}, ..}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import queue
import statistics
import threading
import time

from databus.core import event as ev
from databus.core.checkpoint import Checkpoint
from databus.core.schema import ColumnSpec, SchemaRegistry, TableSchema, table_schema
from databus.core.window import Window
from databus.relay.config import parse_config
from databus.relay.relay import Relay
from databus.sources.base import Source, SourceInfo

SCHEMA = TableSchema(1, "bench.rows", 1, table_schema("bench", "rows", [
    ColumnSpec("id", "long", nullable=False), ColumnSpec("note", "string")]), ("id",))


class QueueSource(Source):
    """Hands the relay the windows put in ``windows``."""

    def __init__(self) -> None:
        self.windows: queue.Queue[Window] = queue.Queue()

    def sources(self) -> list[SourceInfo]:
        return [SourceInfo(1, "bench.rows")]

    def registry(self) -> SchemaRegistry:
        return SchemaRegistry([SCHEMA])

    def read(self, after_scn: int, stop: threading.Event, timeout: float) -> list[Window]:
        try:
            first = self.windows.get(timeout=min(timeout, 0.05))
        except queue.Empty:
            return []
        out = [first]
        while True:
            try:
                out.append(self.windows.get_nowait())
            except queue.Empty:
                return [w for w in out if w.scn > after_scn]


def window(scn: int) -> Window:
    payload = SCHEMA.encode({"id": scn, "note": "x" * 80})
    blob = ev.encode(scn=scn, src_id=1, key=scn, payload=payload, schema_id=SCHEMA.id,
                     op=ev.Op.INSERT, timestamp_ns=time.time_ns())
    return Window(scn, blob, 1, time.time_ns())


def _clients(port: int, n: int, after: int, until: int, ready: mp.Queue,  # type: ignore[type-arg]
             out: mp.Queue) -> None:  # type: ignore[type-arg]
    arrivals: list[tuple[int, float]] = []
    answers = 0

    async def one() -> None:
        nonlocal answers
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        last = after
        while last < until:
            cp = Checkpoint.flexible().window_done(last).to_json()
            writer.write(f"GET /stream?timeout=10&checkPoint={cp} HTTP/1.1\r\n"
                         f"Host: 127.0.0.1\r\n\r\n".encode())
            head = await reader.readuntil(b"\r\n\r\n")
            at = time.time()
            fields = dict(line.split(b": ", 1) for line in head[:-4].split(b"\r\n")[1:])
            await reader.readexactly(int(fields[b"content-length"]))
            scn = int(fields[b"x-databus-last-window-scn"])
            answers += 1
            if scn > last:
                arrivals.extend((s, at) for s in range(last + 1, scn + 1))
                last = scn
        writer.close()

    async def main() -> None:
        tasks = [asyncio.ensure_future(one()) for _ in range(n)]
        await asyncio.sleep(1.0)  # every client connected and waiting
        ready.put(True)
        await asyncio.gather(*tasks)

    asyncio.run(main())
    out.put((arrivals, answers))


def run(relay: Relay, source: QueueSource, n: int, rate: float, seconds: float,
        server: threading.Thread) -> dict[str, float]:
    count = max(1, int(rate * seconds))
    start = relay.buffer.max_scn
    ctx = mp.get_context("spawn")
    ready: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    out: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    proc = ctx.Process(target=_clients, args=(relay.port, n, start, start + count, ready, out))
    proc.start()
    ready.get()
    captured: dict[int, float] = {}
    clock = time.pthread_getcpuclockid(server.ident)  # type: ignore[arg-type]
    c0 = time.clock_gettime(clock)
    t0 = time.perf_counter()
    for i in range(1, count + 1):
        # an absolute schedule: a late window does not delay the next ones
        delay = t0 + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        captured[start + i] = time.time()
        source.windows.put(window(start + i))
    arrivals, answers = out.get()
    cpu = time.clock_gettime(clock) - c0
    proc.join()
    lat = sorted((at - captured[scn]) * 1e3 for scn, at in arrivals)
    assert len(lat) == n * count, (len(lat), n * count)
    return {"rate": rate, "p50_ms": round(statistics.median(lat), 2),
            "p99_ms": round(lat[int(len(lat) * 0.99) - 1], 2), "max_ms": round(lat[-1], 2),
            "answers": answers, "loop_cpu_ms_per_window": round(cpu * 1e3 / count, 3),
            "loop_cpu_us_per_answer": round(cpu * 1e6 / answers, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--waiters", default="1,100,1000")
    ap.add_argument("--rate", type=float, default=200.0, help="windows per second")
    ap.add_argument("--answers", type=float, default=4000.0,
                    help="at most this many answers a second: the rate for N waiters is"
                    " at most answers/N")
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    source = QueueSource()
    cfg = parse_config({"source": {"url": "sqlite:///unused", "tables": ["rows"]},
                        "buffer": {"capacity_bytes": 64 * 1024 * 1024},
                        "http": {"port": 0, "max_connections": 4096}})
    relay = Relay(cfg, source=source)
    relay.start()
    server = next(t for t in threading.enumerate() if t.name == f"databus-{relay.name}")
    source.windows.put(window(1))
    while relay.buffer.max_scn < 1:
        time.sleep(0.05)
    print(f"1-event windows for {args.seconds:g} s; latency = capture -> answer received")
    print(f"{'waiters':>7} | {'win/s':>5} | {'p50 ms':>7} | {'p99 ms':>7} | {'max ms':>7} |"
          f" {'answers':>7} | loop CPU ms per window | loop CPU us per answer")
    results: dict[str, dict[str, float]] = {}
    try:
        for n in [int(x) for x in args.waiters.split(",")]:
            rate = min(args.rate, args.answers / n)
            r = run(relay, source, n, rate, args.seconds, server)
            results[str(n)] = r
            print(f"{n:>7} | {rate:>5.0f} | {r['p50_ms']:>7.2f} | {r['p99_ms']:>7.2f} |"
                  f" {r['max_ms']:>7.2f} | {r['answers']:>7} |"
                  f" {r['loop_cpu_ms_per_window']:>22.3f} | {r['loop_cpu_us_per_answer']:>8.1f}")
    finally:
        relay.stop()
    print("RESULT " + json.dumps(results))


if __name__ == "__main__":
    main()
