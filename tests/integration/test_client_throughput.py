"""Client throughput: 200k small events served from memory, each .after decoded.

Prints events/s for the whole client (HTTP + CRC checks + reassembly +
dispatch + Avro decoding) and for the dispatcher alone on the same events.
"""

from __future__ import annotations

import time

from databus.client import ClientConfig, Consumer, DatabusClient, DataEvent, MemoryCheckpointStore
from databus.client.dispatcher import Dispatcher, SchemaViews
from databus.client.window import WindowAssembler
from databus.core.checkpoint import Checkpoint
from tests.integration.test_client_memrelay import MemoryRelay, customer, item

EVENTS = 200_000
PER_WINDOW = 100


class Decode(Consumer):
    def __init__(self) -> None:
        self.events = 0
        self.checksum = 0

    def on_data_event(self, event: DataEvent) -> None:
        after = event.after
        assert after is not None
        self.events += 1
        self.checksum += len(after)


def test_client_throughput_200k_events() -> None:
    relay = MemoryRelay()
    windows = EVENTS // PER_WINDOW
    body = bytearray()
    for w in range(windows):
        scn = 1000 + w
        half = PER_WINDOW // 2  # two runs per window: customers, then items
        events = [customer(scn, w * PER_WINDOW + i, name=f"c{i}") for i in range(half)]
        events += [item(scn, w, i, qty=i) for i in range(PER_WINDOW - half)]
        relay.add_window(scn, events)
    for held in relay.windows:
        body += b"".join(held.events) + held.eop
    relay.start()
    try:
        consumer = Decode()
        client = DatabusClient(ClientConfig(relay_url=relay.url, poll_timeout=0.1),
                               consumer, MemoryCheckpointStore())
        t0 = time.perf_counter()
        client.run(max_windows=windows)
        elapsed = time.perf_counter() - t0
    finally:
        relay.stop()
    assert consumer.events == EVENTS and client.stats.windows == windows
    rate = EVENTS / elapsed

    # the same bytes through the assembler and dispatcher only (no HTTP)
    local = Decode()
    t0 = time.perf_counter()
    asm = WindowAssembler(Checkpoint.flexible())
    dispatcher = Dispatcher(local, SchemaViews(relay.registry))
    for win in asm.feed(bytes(body)):
        dispatcher.dispatch(win)
    local_elapsed = time.perf_counter() - t0
    assert local.events == EVENTS
    local_rate = EVENTS / local_elapsed
    print(f"\nclient over HTTP: {EVENTS} events in {elapsed:.2f}s = {rate:,.0f} events/s "
          f"({len(body) / elapsed / 1e6:.1f} MB/s); assembler+dispatcher alone: "
          f"{local_rate:,.0f} events/s")
    assert rate > 5_000
