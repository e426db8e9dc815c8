"""Chain relay: how fast a chain relay copies its upstream, and the latency it adds.

1. **Copy rate.** An upstream relay (its own process) holds ``--buffer-mb`` of
   windows. A chain relay process (``databus relay --source databus+http://...``)
   starts empty and copies all of them; the figure is windows/s until its MaxSCN
   equals the upstream's. Baseline, same run: a consumer process that reads the same
   windows straight from the upstream with the same request size, checking and
   assembling them the same way (``RelayConnection``, whole windows, both CRCs),
   but storing nothing and serving nothing.
2. **Added latency.** The upstream captures live windows (one every 20 ms, stamped
   with their capture time); one consumer process long-polls the upstream, another
   the chain relay. Each records, per window, arrival time minus capture time; the
   figure is the chain's minus the direct one (p50, p99, max).

    .venv/bin/python -m bench.chain_relay [--buffer-mb 64] [--live-windows 500]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench.relay_fanout import ReplaySource, make_windows
from databus.client.relay import RelayConnection
from databus.core import event as ev
from databus.core.checkpoint import Checkpoint
from databus.core.schema import SchemaRegistry, TableSchema
from databus.core.window import Window
from databus.relay.config import parse_config
from databus.relay.relay import Relay
from databus.sources.base import Source, SourceInfo
from databus.sources.chain import FETCH_BYTES


class LiveSource(Source):
    """After the replayed windows, one new window every ``interval`` s, stamped with
    the time it was made."""

    def __init__(self, schema: TableSchema, interval: float) -> None:
        self._registry = SchemaRegistry([schema])
        self.schema = schema
        self.interval = interval

    def sources(self) -> list[SourceInfo]:
        return [SourceInfo(1, "bench.rows")]

    def registry(self) -> SchemaRegistry:
        return self._registry

    def read(self, after_scn: int, stop: threading.Event, timeout: float) -> list[Window]:
        if stop.wait(self.interval):
            return []
        scn = after_scn + 1
        now = time.time_ns()
        payload = self.schema.encode({"id": scn, "name": "live", "amount": 1.0, "note": "x"})
        e = ev.encode(scn=scn, src_id=1, key=scn, payload=payload, schema_id=self.schema.id,
                      op=ev.Op.INSERT, timestamp_ns=now)
        return [Window(scn, e, 1, now)]


def _upstream(mb: int, live: bool, port_out: mp.Queue) -> None:  # type: ignore[type-arg]
    windows, schema, _ = make_windows(mb << 20)
    source: Source = (LiveSource(schema, 0.02) if live else ReplaySource(windows, schema))
    cfg = parse_config({"source": {"url": "sqlite:///unused", "tables": ["rows"]},
                        "buffer": {"capacity_bytes": (mb + 8) << 20}, "http": {"port": 0}})
    relay = Relay(cfg, source=source)
    relay.start()
    if not live:
        while relay.buffer.max_scn < windows[-1].scn:
            time.sleep(0.05)
    port_out.put((relay.port, relay.buffer.max_scn))
    threading.Event().wait()  # until terminated


def _start_upstream(mb: int, live: bool) -> tuple[mp.Process, str, int]:
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    proc = ctx.Process(target=_upstream, args=(mb, live, out), daemon=True)
    proc.start()
    port, top = out.get(timeout=300)
    return proc, f"http://127.0.0.1:{port}", top


def _direct_read(url: str, top: int, out: mp.Queue) -> None:  # type: ignore[type-arg]
    """The baseline: every window from the upstream, whole and checked, kept nowhere."""
    t0 = time.perf_counter()
    cp = Checkpoint.flexible()
    windows = 0
    with RelayConnection(url) as conn:
        while cp.window_scn < top:
            data = conn.stream(cp, None, size=FETCH_BYTES, timeout=1.0).data
            off = 0
            while off < len(data):
                length = ev.check_event(data, off)
                if ev.peek_src_id(data, off) == ev.SRC_EOP:
                    cp = cp.window_done(ev.peek_scn(data, off))
                    windows += 1
                off += length
    out.put((windows, time.perf_counter() - t0))


def _latencies(url: str, count: int, out: mp.Queue) -> None:  # type: ignore[type-arg]
    """Arrival minus capture time (ms) of the next ``count`` windows."""
    got: dict[int, float] = {}
    cp: Checkpoint | None = None
    with RelayConnection(url) as conn:
        top = conn.stream(None, None, size=1, timeout=0).max_scn
        cp = Checkpoint.after(top)
        while len(got) < count:
            data = conn.stream(cp, None, size=1 << 20, timeout=5.0).data
            now = time.time_ns()
            for e in ev.iter_events(data):
                if e.is_eop:
                    got[e.scn] = (now - e.timestamp_ns) / 1e6
                    cp = cp.window_done(e.scn)
    out.put(got)


def _chain(upstream: str, tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "databus", "relay", "--source", f"databus+{upstream}",
         "--port", str(port), "--buffer-size", str(256 << 20)],
        stdout=(tmp / "chain.log").open("ab"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(f"{url}/health", timeout=1)
            return proc, url
        except httpx.TransportError:
            time.sleep(0.05)
    raise RuntimeError(f"the chain relay did not start: see {tmp / 'chain.log'}")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _max_scn(url: str) -> int:
    return int(httpx.get(f"{url}/containerStats/buffer/max_scn", timeout=10).json())


def copy_rate(mb: int, tmp: Path) -> None:
    up, url, top = _start_upstream(mb, live=False)
    try:
        ctx = mp.get_context("spawn")
        out: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
        reader = ctx.Process(target=_direct_read, args=(url, top, out))
        reader.start()
        windows, direct = out.get(timeout=600)
        reader.join()
        chain, curl = _chain(url, tmp)
        # it copies from its start, before it answers: count from its first answer
        t0, first = time.perf_counter(), _max_scn(curl)
        try:
            while _max_scn(curl) < top:
                time.sleep(0.02)
            copied = time.perf_counter() - t0
            same = (httpx.get(f"{curl}/stream", params={"size": str(1 << 20), "timeout": "0"}
                              ).content
                    == httpx.get(f"{url}/stream", params={"size": str(1 << 20), "timeout": "0"}
                                 ).content)
        finally:
            chain.terminate()
            chain.wait(30)
        print(f"copy: {windows} windows ({mb} MiB), {FETCH_BYTES >> 20} MiB requests")
        print(f"  direct read  {windows / direct:>10,.0f} windows/s ({direct:.2f} s)")
        rate = (top - max(first, 0)) / copied  # window SCNs are 1, 2, 3...
        print(f"  chain relay  {rate:>10,.0f} windows/s ({top - max(first, 0)} windows after"
              f" its first answer, {copied:.2f} s); first answer identical: {same}")
        print(f"  chain/direct {rate / (windows / direct):.2f}")
    finally:
        up.terminate()


def added_latency(count: int, tmp: Path) -> None:
    up, url, _ = _start_upstream(1, live=True)
    chain, curl = _chain(url, tmp)
    try:
        time.sleep(1.0)
        ctx = mp.get_context("spawn")
        out_d: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
        out_c: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
        procs = [ctx.Process(target=_latencies, args=(url, count, out_d)),
                 ctx.Process(target=_latencies, args=(curl, count, out_c))]
        for p in procs:
            p.start()
        direct, chained = out_d.get(timeout=600), out_c.get(timeout=600)
        for p in procs:
            p.join()
    finally:
        chain.terminate()
        chain.wait(30)
        up.terminate()
    both = sorted(set(direct) & set(chained))
    added = sorted(chained[s] - direct[s] for s in both)

    def pct(xs: list[float], q: float) -> float:
        return xs[min(len(xs) - 1, int(q * len(xs)))]

    d = sorted(direct[s] for s in both)
    c = sorted(chained[s] for s in both)
    print(f"latency over {len(both)} live windows (one every 20 ms), ms: p50 / p99 / max")
    print(f"  upstream direct  {pct(d, .5):6.1f} / {pct(d, .99):6.1f} / {d[-1]:6.1f}")
    print(f"  via chain relay  {pct(c, .5):6.1f} / {pct(c, .99):6.1f} / {c[-1]:6.1f}")
    print(f"  added by chain   {pct(added, .5):6.1f} / {pct(added, .99):6.1f} /"
          f" {added[-1]:6.1f} (mean {statistics.fmean(added):.1f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--buffer-mb", type=int, default=64)
    ap.add_argument("--live-windows", type=int, default=500)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="databus-bench-chain-") as d:
        copy_rate(args.buffer_mb, Path(d))
        added_latency(args.live_windows, Path(d))


if __name__ == "__main__":
    main()
