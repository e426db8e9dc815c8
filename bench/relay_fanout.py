"""Relay fan-out: events/s served from a full buffer to 1, 4 and 16 concurrent
binary consumers, beside a raw loopback HTTP transfer of the same bytes.

Baseline (same run, same machine, same client code): a minimal asyncio HTTP/1.1
server that serves the very response bodies the relay produced, pre-cut, with no
buffer lookup, no checkpoint parsing and no framework. The ratio relay/raw shows
what the relay's own work costs on top of moving the bytes.

Each consumer is a separate process pulling the whole buffer with 1 MiB requests,
the relay's through the client library's own request (``RelayConnection.stream``),
the raw server's through a bare ``httpx.Client.get``; the clock starts once every process has imported and built its client. Beside
the rates it reports CPU per request (best of the rounds): the serving thread's
and the consumers', which the load of a shared machine disturbs less. Each
consumer count runs ``--rounds`` times, relay and raw alternating, and each side
keeps its best time (the machine is shared: the best run is the least disturbed).
The last line is machine-readable: ``RESULT {"relay_raw": {"1": r1, ...}, ...}``.

    .venv/bin/python -m bench.relay_fanout [--buffer-mb 64] [--consumers 1,4,16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import socket
import threading
import time

import httpx

from databus.client.relay import RelayConnection
from databus.core import event as ev
from databus.core.checkpoint import Checkpoint
from databus.core.schema import ColumnSpec, SchemaRegistry, TableSchema, table_schema
from databus.core.window import Window
from databus.relay.config import parse_config
from databus.relay.relay import Relay
from databus.sources.base import Source, SourceInfo

FETCH = 1024 * 1024


class ReplaySource(Source):
    """Hands the relay a fixed list of windows once (benchmark input)."""

    def __init__(self, windows: list[Window], schema: TableSchema) -> None:
        self._windows = windows
        self._registry = SchemaRegistry([schema])
        self._done = False

    def sources(self) -> list[SourceInfo]:
        return [SourceInfo(1, "bench.rows")]

    def registry(self) -> SchemaRegistry:
        return self._registry

    def read(self, after_scn: int, stop: threading.Event, timeout: float) -> list[Window]:
        if self._done:
            stop.wait(timeout)
            return []
        self._done = True
        return [w for w in self._windows if w.scn > after_scn]


def make_windows(total_bytes: int, per_window: int = 10) -> tuple[list[Window], TableSchema, int]:
    schema = TableSchema(1, "bench.rows", 1, table_schema("bench", "rows", [
        ColumnSpec("id", "long", nullable=False), ColumnSpec("name", "string"),
        ColumnSpec("amount", "double"), ColumnSpec("note", "string")]), ("id",))
    windows: list[Window] = []
    size = 0
    key = 0
    scn = 0
    events = 0
    while size < total_bytes:
        scn += 1
        parts = []
        for _ in range(per_window):
            key += 1
            payload = schema.encode({"id": key, "name": f"name-{key}", "amount": key * 1.5,
                                     "note": "x" * 80})
            parts.append(ev.encode(scn=scn, src_id=1, key=key, payload=payload,
                                   schema_id=schema.id, op=ev.Op.INSERT,
                                   timestamp_ns=time.time_ns()))
        blob = b"".join(parts)
        windows.append(Window(scn, blob, per_window, time.time_ns()))
        size += len(blob) + 64
        events += per_window + 1  # + EOP
    return windows, schema, events


def drain_relay(url: str, last_scn: int) -> int:
    """Pull everything up to ``last_scn`` with the client library's own requests
    (``RelayConnection.stream``: its URL, headers and error handling); the position
    comes from the answer's headers, not from decoding the body. Returns bytes
    received."""
    total = 0
    cp = Checkpoint.flexible()
    with RelayConnection(url, http_timeout=60) as conn:
        while cp.window_scn < last_scn:
            r = conn.stream(cp, size=FETCH, timeout=1.0)
            total += len(r.data)
            if r.partial_scn >= 0:
                cp = cp.within(r.partial_scn, r.partial_count)
            else:
                cp = cp.window_done(r.last_window_scn)
    return total


def drain_raw(url: str, chunks: int) -> int:
    total = 0
    with httpx.Client(base_url=url, timeout=60) as c:
        for i in range(chunks):
            r = c.get(f"/chunk/{i}")
            r.raise_for_status()
            total += len(r.content)
    return total


def _worker(kind: str, url: str, arg: int, start: mp.synchronize.Event, ready: mp.Queue,  # type: ignore[type-arg]
            out: mp.Queue) -> None:  # type: ignore[type-arg]
    # imports done and a client built before the clock starts
    httpx.Client().close()
    if kind == "relay":
        RelayConnection(url).close()
    ready.put(os.getpid())
    start.wait()
    t0, c0 = time.perf_counter(), time.process_time()
    n = drain_relay(url, arg) if kind == "relay" else drain_raw(url, arg)
    out.put((n, time.perf_counter() - t0, time.process_time() - c0))


def run_consumers(kind: str, url: str, arg: int, n: int,
                  server: threading.Thread) -> tuple[int, float, float, float]:
    """(bytes received, wall seconds, consumer CPU seconds, server thread CPU seconds)."""
    ctx = mp.get_context("spawn")
    start = ctx.Event()
    ready: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    out: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    procs = [ctx.Process(target=_worker, args=(kind, url, arg, start, ready, out))
             for _ in range(n)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get()
    time.sleep(0.2)  # the last one reaches start.wait()
    clock = time.pthread_getcpuclockid(server.ident)  # type: ignore[arg-type]
    s0 = time.clock_gettime(clock)
    t0 = time.perf_counter()
    start.set()
    results = [out.get() for _ in procs]
    wall = time.perf_counter() - t0
    server_cpu = time.clock_gettime(clock) - s0
    for p in procs:
        p.join()
    return sum(r[0] for r in results), wall, sum(r[2] for r in results), server_cpu


class RawServer:
    """Bare HTTP/1.1 keep-alive server: GET /chunk/<i> -> the i-th body."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self.thread.start()

    async def _main(self) -> None:
        server = await asyncio.start_server(self._handle, sock=self.sock)
        async with server:
            await server.serve_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1].decode()
                body = self.chunks[int(path.rsplit("/", 1)[1])]
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                             b"Content-Length: %d\r\n\r\n" % len(body))
                writer.write(body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--buffer-mb", type=int, default=64)
    ap.add_argument("--consumers", default="1,4,16")
    ap.add_argument("--rounds", type=int, default=3, help="best of this many runs per side")
    args = ap.parse_args()
    windows, schema, n_events = make_windows(args.buffer_mb * 1024 * 1024)
    capacity = args.buffer_mb * 1024 * 1024 + 4 * 1024 * 1024
    cfg = parse_config({"source": {"url": "sqlite:///unused", "tables": ["rows"]},
                        "buffer": {"capacity_bytes": capacity}, "http": {"port": 0}})
    relay = Relay(cfg, source=ReplaySource(windows, schema))
    relay.start()
    while relay.buffer.max_scn < windows[-1].scn:
        time.sleep(0.1)
    last = windows[-1].scn
    # the exact bodies a consumer gets, cut once, for the raw baseline
    chunks: list[bytes] = []
    cp = Checkpoint.flexible()
    while cp.window_scn < last:
        res = relay.buffer.read(cp, FETCH)
        chunks.append(res.data)
        cp = cp.window_done(res.last_scn)
    raw = RawServer(chunks)
    stats = relay.buffer.stats()
    total_mb = sum(map(len, chunks)) / 1e6
    print(f"buffer: {stats['windows']} windows, {n_events} events, {total_mb:.1f} MB;"
          f" {os.cpu_count()} cores; 1 MiB requests; best of {args.rounds}")
    print(f"{'consumers':>9} | {'relay ev/s':>12} | {'relay MB/s':>10} | {'raw ev/s':>12} |"
          f" {'raw MB/s':>9} | relay/raw | server ms/req relay, raw | consumer ms/req relay, raw")
    relay_thread = next(t for t in threading.enumerate() if t.name == f"databus-{relay.name}")
    requests = len(chunks)
    ratios: dict[str, float] = {}
    rates: dict[str, list[float]] = {}
    cpu: dict[str, dict[str, list[float]]] = {}
    for n in [int(x) for x in args.consumers.split(",")]:
        rt = bt = float("inf")
        # CPU per request, best of the rounds: what each side costs, whatever the load
        rs = bs = rc = bc = float("inf")
        for _ in range(args.rounds):
            # each run starts cold: consumers share the buffer's walks within a run
            # (the relay's fan-out), never across runs (no consumer reads twice)
            relay.buffer.forget_reads()
            rb, t, c, sc = run_consumers("relay", relay.url, last, n, relay_thread)
            rt, rc, rs = min(rt, t), min(rc, c), min(rs, sc)
            bb, t, c, sc = run_consumers("raw", f"http://127.0.0.1:{raw.port}", len(chunks), n,
                                         raw.thread)
            bt, bc, bs = min(bt, t), min(bc, c), min(bs, sc)
            assert rb == bb == n * sum(map(len, chunks)), (rb, bb)
        rev, bev = n * n_events / rt, n * n_events / bt
        ratios[str(n)] = round(rev / bev, 3)
        rates[str(n)] = [round(rev), round(bev)]
        per = 1e3 / (n * requests)
        cpu[str(n)] = {"server_ms": [round(rs * per, 3), round(bs * per, 3)],
                       "consumer_ms": [round(rc * per, 3), round(bc * per, 3)]}
        print(f"{n:>9} | {rev:>12,.0f} | {rb / rt / 1e6:>10.1f} | {bev:>12,.0f} |"
              f" {bb / bt / 1e6:>9.1f} | {rev / bev:>9.2f} | {rs * per:>6.3f}, {bs * per:.3f}"
              f"          | {rc * per:>6.3f}, {bc * per:.3f}")
    relay.stop()
    print("RESULT " + json.dumps({"relay_raw": ratios, "events_per_s": rates, "cpu": cpu,
                                  "buffer_mb": args.buffer_mb, "rounds": args.rounds}))


if __name__ == "__main__":
    main()
