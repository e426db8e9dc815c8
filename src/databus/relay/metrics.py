"""Prometheus metrics of one relay (own registry: several relays per process work)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest


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
        self.min_scn = Gauge("databus_relay_buffer_min_scn", "Oldest window SCN held", registry=r)
        self.max_scn = Gauge("databus_relay_buffer_max_scn", "Newest window SCN held", registry=r)
        self.used_bytes = Gauge("databus_relay_buffer_used_bytes", "Bytes used", registry=r)
        self.capacity = Gauge("databus_relay_buffer_capacity_bytes", "Buffer size", registry=r)
        self.fetcher_up = Gauge(
            "databus_relay_fetcher_up", "1 while the fetcher is capturing", registry=r
        )
        self.source_stat = Gauge(
            "databus_relay_source_stat", "A statistic the source publishes (e.g. snapshot"
            " progress)", ["name"], registry=r
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
