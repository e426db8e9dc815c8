"""A real relay whose full buffer spans less source time than ``buffer.min_span_seconds``
logs the warning naming the remedy and exports ``databus_relay_buffer_span_short``; with
the setting at 0 it does neither."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import httpx
import pytest

from tests.support.relays import make_relay
from tests.support.shop import Writer
from tests.support.wait import wait_until


def _gauge(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in {url}/metrics")


@pytest.mark.parametrize("min_span", [3600.0, 0.0])
def test_a_full_buffer_shorter_than_the_setting_is_warned_about(
        shop_db: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture,
        min_span: float) -> None:
    relay = make_relay(shop_db, tmp_path, capacity_bytes=64 * 1024, min_span_seconds=min_span)
    with caplog.at_level(logging.WARNING, logger="databus.relay.buffer"), relay, \
            Writer(shop_db) as w:
        url = relay.url
        assert _gauge(url, "databus_relay_buffer_span_short") == 0  # nothing evicted yet
        wait_until(lambda: (w.transaction() or True)
                   and relay.buffer.stats()["evicted_windows"] > 20, 60, "evictions")
        if min_span:
            wait_until(lambda: _gauge(url, "databus_relay_buffer_span_short") == 1, 30,
                       "the gauge to say the buffer is short")
        else:
            for _ in range(5):  # several state writes (flush_interval 0.2 s)
                w.transaction()
                time.sleep(0.25)
            assert _gauge(url, "databus_relay_buffer_span_short") == 0
    told = [r.getMessage() for r in caplog.records if "buffer.min_span_seconds" in r.getMessage()]
    if min_span:
        assert len(told) == 1, told  # once: the next is due in 5 minutes
        assert "--buffer-size" in told[0] and "--buffer-path" in told[0], told[0]
    else:
        assert not told
