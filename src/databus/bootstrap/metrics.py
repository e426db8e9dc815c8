"""A bootstrap server's Prometheus metrics and readiness (docs/operations.md,
"Bootstrap server"): everything is read from the service when ``/metrics`` or
``/health/ready`` is asked (own registry: several services per process work).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from databus.core.errors import DatabusError
from databus.serving.health import Check


class BootstrapMetrics(Collector):
    """``observe()`` gives the service's numbers: a dict with ``lag_seconds`` (None:
    unknown), ``producer_scn``, ``applied_scn``, ``log_min_scn``, ``log_max_scn``,
    ``producer_windows``, ``applier_windows``, ``rebuilds``, ``producer_up``,
    ``applier_up``."""

    def __init__(self, observe: Callable[[], dict[str, Any]]) -> None:
        self.observe = observe
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        o = self.observe()
        lag = o["lag_seconds"]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"databus_bootstrap_{name}", doc, value=value)

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            return CounterMetricFamily(f"databus_bootstrap_{name}", doc, value=value)

        yield gauge("producer_lag_seconds", "The producer's lag behind the relay's source",
                    math.nan if lag is None else lag)
        yield gauge("producer_scn", "The last window stored in the log", o["producer_scn"])
        yield gauge("applied_scn", "The last window folded into the snapshot",
                    o["applied_scn"])
        yield gauge("log_min_scn", "The oldest SCN the log holds", o["log_min_scn"])
        yield gauge("log_max_scn", "The newest SCN the log holds", o["log_max_scn"])
        yield counter("producer_windows", "Windows stored by the producer",
                      o["producer_windows"])
        yield counter("applier_windows", "Windows folded into the snapshot",
                      o["applier_windows"])
        yield counter("rebuilds", "Store rebuilds after the producer fell off the relay",
                      o["rebuilds"])
        up = GaugeMetricFamily("databus_bootstrap_component_up", "1 while the component runs"
                               " without error", labels=["component"])
        up.add_metric(["producer"], 1.0 if o["producer_up"] else 0.0)
        up.add_metric(["applier"], 1.0 if o["applier_up"] else 0.0)
        yield up


def readiness(status: dict[str, Any], store_check: Callable[[], object]) -> list[Check]:
    """The bootstrap server is ready when its producer and its applier run without an
    error (a producer retrying an unreachable relay is not: the log falls behind) and
    its store answers (``store_check()`` raises otherwise). Details give error codes,
    never messages."""
    checks = []
    for part in ("producer", "applier"):
        error = status[part].get("error")
        checks.append(Check(part, not error, "running" if not error else
                            f"error ({str(error).split(':', 1)[0]})"))
    try:
        store_check()
        checks.append(Check("store", True, "answers"))
    except DatabusError as exc:
        checks.append(Check("store", False, exc.code))
    return checks
