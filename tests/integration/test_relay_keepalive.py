"""Keep-alive requests to the relay are answered without a delayed-ACK stall.

Without TCP_NODELAY on the relay's connections, a response written in two
parts (headers, then body) waits for the client's delayed ACK: about 40 ms on
every request after the first of a connection, which is the whole
commit -> on_data_event latency at low rates (bench/mysql_latency.py).
"""

from __future__ import annotations

import statistics
import time

import httpx

from databus.relay.relay import Relay


def test_keep_alive_requests_are_not_delayed(relay: Relay) -> None:
    with httpx.Client(timeout=10) as c:
        c.get(f"{relay.url}/admin")  # the connection's first request is never delayed
        times = []
        for _ in range(15):
            t0 = time.perf_counter()
            assert c.get(f"{relay.url}/containerStats").status_code == 200
            times.append(time.perf_counter() - t0)
    # the stall is >= 40 ms per request; a loaded 2-core machine answers in a few ms
    assert statistics.median(times) < 0.02, times
