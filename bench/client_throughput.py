"""Client throughput: events/s through the consumer callbacks with Avro decoding.

The client pulls 200k events (100 per window) from a real relay over loopback
HTTP, checks both CRCs, reassembles windows, dispatches the callbacks and
decodes every event's row, two ways, each in its own client run:

* per event: ``on_data_event`` reads ``event.after`` of every event;
* batch: ``on_data_events`` reads ``batch.columns`` (one list per column) of
  every run of events (``--batch-rows``: ``batch.rows``, one dict per event).

Baseline (same run, same bytes): a bare loop that only Avro-decodes the same
payloads with ``fastavro.schemaless_reader`` - the floor any Python consumer
pays to see the rows with fastavro. A ratio client/baseline above 1 means the
client (with its compiled decoder) delivers rows faster than that loop alone.

The last line, ``ratio client/baseline: X``, is the per-event figure (issue
#18's row: events/s through ``on_data_event``); the batch figure is printed
above it as ``ratio batch/baseline: Y``.

    .venv/bin/python -m bench.client_throughput [--events 200000] [--batch-rows]
"""

from __future__ import annotations

import argparse
import io
import time

import fastavro

from bench.relay_fanout import ReplaySource, make_windows
from databus.client import ClientConfig, Consumer, DatabusClient, DataEvent, MemoryCheckpointStore
from databus.client.consumer import DataBatch
from databus.client.wiredecode import compiled
from databus.core import event as ev
from databus.relay.config import parse_config
from databus.relay.relay import Relay


class Decode(Consumer):
    def __init__(self) -> None:
        self.events = 0

    def on_data_event(self, event: DataEvent) -> None:
        if event.after is not None:
            self.events += 1


class DecodeColumns(Consumer):
    def __init__(self) -> None:
        self.events = 0

    def on_data_events(self, batch: DataBatch) -> None:
        self.events += len(batch.columns["id"])


class DecodeRows(Consumer):
    def __init__(self) -> None:
        self.events = 0

    def on_data_events(self, batch: DataBatch) -> None:
        self.events += sum(1 for row in batch.rows if row is not None)


def consume(relay: Relay, consumer: Decode | DecodeColumns | DecodeRows, windows: int) -> float:
    """Seconds to pull and dispatch ``windows`` windows from the oldest."""
    client = DatabusClient(ClientConfig(relay=relay.url, poll_timeout=0.1),
                           consumer, MemoryCheckpointStore())
    t0 = time.perf_counter()
    client.run(max_windows=windows)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--batch-rows", action="store_true",
                    help="the batch consumer reads batch.rows instead of batch.columns")
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
        per_event = Decode()
        client_s = consume(relay, per_event, len(windows))
        batch: DecodeColumns | DecodeRows = DecodeRows() if args.batch_rows else DecodeColumns()
        batch_s = consume(relay, batch, len(windows))
    finally:
        relay.stop()
    assert per_event.events == n, (per_event.events, n)
    assert batch.events == n, (batch.events, n)

    parsed = fastavro.parse_schema(schema.avro)
    payloads = [e.payload for w in windows for e in ev.iter_events(w.events, verify=False)]
    t0 = time.perf_counter()
    for p in payloads:
        fastavro.schemaless_reader(io.BytesIO(p), parsed, None)
    base_s = time.perf_counter() - t0

    mb = sum(len(w.events) for w in windows) / 1e6
    shape = "rows" if args.batch_rows else "columns"
    print(f"{n} events, {mb:.1f} MB, {per_window} events/window, "
          f"compiled decoder: {'yes' if compiled() else 'no'}")
    print(f"databus client, on_data_event + event.after:      {n / client_s:>10,.0f} events/s")
    print(f"databus client, on_data_events + batch.{shape:<8} {n / batch_s:>10,.0f} events/s")
    print(f"baseline: fastavro schemaless_reader only:        {n / base_s:>10,.0f} events/s")
    print(f"ratio batch/baseline: {base_s / batch_s:.2f}")
    print(f"ratio client/baseline: {base_s / client_s:.2f}")


if __name__ == "__main__":
    main()
