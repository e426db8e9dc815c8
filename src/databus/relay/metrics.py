"""Prometheus metrics of one relay (own registry: several relays per process work).

The names, types and labels are docs/operations.md's table (``tests/integration/
test_metrics_doc.py`` compares them). Counters move as things happen; everything
that describes the relay's state (buffer, lag, capture, the source's statistics, the
consumers it knows) is read when ``/metrics`` is scraped, from one
:class:`Observation` the relay makes (:meth:`RelayMetrics.observe`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# a counter's ``_created`` series (when it was made) is no part of the contract and
# doubles the names a scraper stores: off for the process (prometheus_client's switch)
disable_created_metrics()  # type: ignore[no-untyped-call]

CAPTURE_STATES = ("starting", "running", "retrying", "failed", "fenced", "stopped")
"""The fetcher's states (``databus_relay_capture_state``)."""

CONSUMER_STATES = ("online", "stalled", "gone")
"""A listed consumer's states (:mod:`databus.relay.consumers`)."""


@dataclass(frozen=True)
class Observation:
    """The relay's state at one moment, as ``/metrics`` and ``/consumers`` show it."""

    lag_seconds: float
    captured_until_ns: int
    last_window_ns: int
    capture: dict[str, Any]
    buffer: dict[str, int]
    span_seconds: float
    source: dict[str, float]
    consumers: list[dict[str, Any]] = field(default_factory=list)
    span_short: bool = False


class RelayMetrics:
    """Counters and gauges exported on ``/metrics``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.windows_in = Counter(
            "databus_relay_windows_appended", "Windows appended to the buffer", registry=r
        )
        self.events_in = Counter(
            "databus_relay_events_appended", "Data events appended to the buffer", registry=r
        )
        self.source_errors = Counter(
            "databus_relay_source_errors", "Errors reading the source", ["kind"], registry=r
        )
        self.requests = Counter(
            "databus_relay_requests", "HTTP requests", ["endpoint", "status"], registry=r
        )
        self.bytes_out = Counter(
            "databus_relay_stream_bytes", "Bytes of events served by /stream", registry=r
        )
        self.events_out = Counter(
            "databus_relay_stream_events", "Events served by /stream", registry=r
        )
        self.capacity = Gauge("databus_relay_buffer_capacity_bytes", "Buffer size", registry=r)
        self.fetcher_up = Gauge(
            "databus_relay_fetcher_up", "1 while the fetcher is capturing", registry=r
        )
        self._live = _Live()
        r.register(self._live)

    def observe(self, observe: Callable[[], Observation]) -> None:
        """Where the state gauges come from: ``observe()`` at every scrape."""
        self._live.observe = observe

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Live(Collector):
    """The gauges read at scrape time (and the counters the buffer and the source keep)."""

    def __init__(self) -> None:
        self.observe: Callable[[], Observation] | None = None

    def describe(self) -> list[Metric]:
        return []  # the names depend on the source: nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        if self.observe is None:
            return
        o = self.observe()
        yield _gauge("databus_relay_lag_seconds", "Now minus the source time up to which the"
                     " relay holds every committed change", o.lag_seconds)
        yield _gauge("databus_relay_captured_until_timestamp_seconds", "The source time up to"
                     " which the relay holds every committed change",
                     o.captured_until_ns / 1e9)
        yield _gauge("databus_relay_last_window_timestamp_seconds", "Commit time of the newest"
                     " window held", o.last_window_ns / 1e9)
        state = GaugeMetricFamily("databus_relay_capture_state", "The fetcher's state (1: the"
                                  " current one)", labels=["state"])
        for s in CAPTURE_STATES:
            state.add_metric([s], 1.0 if o.capture.get("state") == s else 0.0)
        yield state
        b = o.buffer
        yield _gauge("databus_relay_buffer_min_scn", "Oldest window SCN held", b["min_scn"])
        yield _gauge("databus_relay_buffer_max_scn", "Newest window SCN held", b["max_scn"])
        yield _gauge("databus_relay_buffer_used_bytes", "Bytes used", b["used_bytes"])
        yield _gauge("databus_relay_buffer_windows", "Windows held", b["windows"])
        yield CounterMetricFamily("databus_relay_buffer_evicted_windows", "Windows evicted to"
                                  " make room", value=b["evicted_windows"])
        yield _gauge("databus_relay_buffer_span_seconds", "Source time between the oldest and"
                     " the newest window held", o.span_seconds)
        yield _gauge("databus_relay_buffer_span_short", "1 while the full buffer holds less"
                     " source time than buffer.min_span_seconds", float(o.span_short))
        for name, value in sorted(o.source.items()):
            full = f"databus_relay_source_{name}"
            if name.endswith("_total"):
                yield CounterMetricFamily(full[:-6], f"The source's {name}", value=value)
            else:
                yield _gauge(full, f"The source's {name}", value)
        yield from _consumers(o.consumers)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _consumers(rows: list[dict[str, Any]]) -> Iterator[Metric]:
    count = GaugeMetricFamily("databus_relay_consumers", "Consumers listed, per state",
                              labels=["state"])
    for s in CONSUMER_STATES:
        count.add_metric([s], float(sum(1 for r in rows if r["state"] == s)))
    yield count
    one = ["consumer"]
    lag = GaugeMetricFamily("databus_relay_consumer_lag_seconds", "A consumer's lag as the"
                            " relay sees it", labels=one)
    windows = GaugeMetricFamily("databus_relay_consumer_lag_windows", "Windows held after a"
                                " consumer's position", labels=one)
    seen = GaugeMetricFamily("databus_relay_consumer_last_seen_seconds", "Seconds since a"
                             " consumer's last /stream request", labels=one)
    falling = GaugeMetricFamily("databus_relay_consumer_falling_off", "1 while a consumer is"
                                " about to fall off the buffer", labels=one)
    margin = GaugeMetricFamily("databus_relay_consumer_fall_off_margin_seconds", "Source time"
                               " between the buffer's oldest window and a consumer's position",
                               labels=one)
    state = GaugeMetricFamily("databus_relay_consumer_state", "A consumer's state (1: the"
                              " current one)", labels=["consumer", "state"])
    for r in rows:
        c = [r["name"]]
        lag.add_metric(c, r["seconds_behind"])
        windows.add_metric(c, r["windows_behind"])
        seen.add_metric(c, r["seen_seconds_ago"])
        falling.add_metric(c, 1.0 if r["falling_off"] else 0.0)
        if r["fall_off_margin_seconds"] is not None:
            margin.add_metric(c, r["fall_off_margin_seconds"])
        for s in CONSUMER_STATES:
            state.add_metric([r["name"], s], 1.0 if r["state"] == s else 0.0)
    yield from (lag, windows, seen, falling, margin, state)
