"""Client throughput: events/s through ``on_data_event`` with Avro decoding.

The client pulls 200k events (100 per window) from a real relay over loopback
HTTP, checks both CRCs, reassembles windows, dispatches the callbacks and
decodes every event's row (``event.after``).

Baseline (same run, same bytes): a bare loop that only Avro-decodes the same
payloads with ``fastavro.schemaless_reader`` - the floor any Python consumer
pays to see the rows. The ratio client/baseline shows what everything else
(HTTP, CRCs, windows, callbacks) costs on top.

    .venv/bin/python -m bench.client_throughput [--events 200000]
"""

from __future__ import annotations

import argparse
import io
import time

import fastavro

from bench.relay_fanout import ReplaySource, make_windows
from databus.client import ClientConfig, Consumer, DatabusClient, DataEvent, MemoryCheckpointStore
from databus.core import event as ev
from databus.relay.config import parse_config
from databus.relay.relay import Relay


class Decode(Consumer):
    def __init__(self) -> None:
        self.events = 0

    def on_data_event(self, event: DataEvent) -> None:
        if event.after is not None:
            self.events += 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=200_000)
    args = ap.parse_args()
    per_window = 100
    windows, schema, _ = make_windows(args.events * 170, per_window=per_window)
    windows = windows[: args.events // per_window]
    n = len(windows) * per_window
    cfg = parse_config({"source": {"url": "sqlite:///unused", "tables": ["rows"]},
                        "buffer": {"capacity_bytes": 256 * 1024 * 1024}, "http": {"port": 0}})
    relay = Relay(cfg, source=ReplaySource(windows, schema))
    relay.start()
    try:
        relay.buffer.wait_for(windows[-1].scn - 1, 60)
        consumer = Decode()
        client = DatabusClient(ClientConfig(relay_url=relay.url, poll_timeout=0.1),
                               consumer, MemoryCheckpointStore())
        t0 = time.perf_counter()
        client.run(max_windows=len(windows))
        client_s = time.perf_counter() - t0
    finally:
        relay.stop()
    assert consumer.events == n, (consumer.events, n)

    parsed = fastavro.parse_schema(schema.avro)
    payloads = [e.payload for w in windows for e in ev.iter_events(w.events, verify=False)]
    t0 = time.perf_counter()
    for p in payloads:
        fastavro.schemaless_reader(io.BytesIO(p), parsed, None)
    base_s = time.perf_counter() - t0

    mb = sum(len(w.events) for w in windows) / 1e6
    print(f"{n} events, {mb:.1f} MB, {per_window} events/window")
    print(f"databus client (HTTP+CRC+windows+callbacks+Avro): {n / client_s:>10,.0f} events/s")
    print(f"baseline: fastavro schemaless_reader only:        {n / base_s:>10,.0f} events/s")
    print(f"ratio client/baseline: {base_s / client_s:.2f}")


if __name__ == "__main__":
    main()
