"""What a consumer measures of itself: :class:`ConsumerMetrics` (``DatabusClient.metrics()``)
and the same numbers in Prometheus's text format (:func:`render`), for the consumer
commands' ``--metrics-port`` and programs that serve their own ``/metrics``.

Names, types and labels are docs/operations.md's table ("Consumers"); every series has
the label ``consumer``. A process running several clients (a dynamic group's partitions)
renders one set per client.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from databus.client.lag import LagClock
from databus.client.stats import ClientStats

STATES = ("starting", "online", "bootstrapping", "retrying", "failed", "stopped")
"""A consumer's states (docs/operations.md)."""


@dataclass(frozen=True, slots=True)
class ConsumerMetrics:
    """A consumer's numbers at one moment (docs/operations.md, "Consumers")."""

    consumer: str
    """Its name, as sent to the relay (``X-Databus-Consumer``)."""
    state: str
    """One of :data:`STATES`."""
    lag_seconds: float | None
    """Age of the oldest change not consumed yet (None: not known yet)."""
    lag_windows: int | None
    """Windows the relay held after its position at the last answer, plus those received
    and not consumed yet (None: not known)."""
    checkpoint_age_seconds: float
    """Since the position was last persisted (since the start, before the first)."""
    position_scn: int
    """The last window consumed whole (-1: none)."""
    windows: int
    events: int
    events_per_second: float
    checkpoints: int
    relay_errors: int
    consumer_errors: int
    retries: int
    last_error: str | None


def measure(name: str, st: ClientStats, lag: LagClock, *,
            relay_failing: bool) -> ConsumerMetrics:
    """A consumer's numbers now, from its counters and its :class:`LagClock`."""
    seconds, windows = lag.lag(relay_reachable=not relay_failing)
    since = st.checkpoint_at if st.checkpoint_at is not None else st.started_at
    return ConsumerMetrics(
        consumer=name, state=st.state, lag_seconds=seconds, lag_windows=windows,
        checkpoint_age_seconds=max(time.time() - since, 0.0), position_scn=st.last_scn,
        windows=st.windows, events=st.events, events_per_second=lag.events_per_second(st.events),
        checkpoints=st.checkpoints, relay_errors=st.relay_errors, consumer_errors=st.rollbacks,
        retries=st.replays, last_error=st.last_error)


READY_STATES = ("online", "bootstrapping")
"""The states in which a consumer is ready (``/health/ready`` of its metrics port)."""


def readiness(rows: Iterable[ConsumerMetrics]) -> list[tuple[str, bool, str]]:
    """One check ``(name, ok, detail)`` per consumer: ok while it is online or
    bootstrapping (docs/operations.md, "Health"); the detail names its state and its
    last error's code, never the message."""
    out = []
    for m in rows:
        why = f" (last error {m.last_error.split(':', 1)[0]})" if m.last_error else ""
        out.append((f"consumer {m.consumer}", m.state in READY_STATES,
                    f"{m.state}{why if m.state not in READY_STATES else ''}"))
    return out


def render(metrics: Iterable[ConsumerMetrics]) -> bytes:
    """``metrics`` in Prometheus's text format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collected(lambda: list(metrics)))
    return generate_latest(registry)


class Collected(Collector):
    """A Prometheus collector over ``source()`` (the consumers' metrics at each scrape)."""

    def __init__(self, source: Callable[[], list[ConsumerMetrics]]) -> None:
        self.source = source

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        rows = self.source()
        one = ["consumer"]

        def gauge(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=one)

        lag = gauge("databus_consumer_lag_seconds", "Age of the oldest change not consumed")
        windows = gauge("databus_consumer_lag_windows", "Windows behind the relay")
        age = gauge("databus_consumer_checkpoint_age_seconds", "Since the position was"
                    " last persisted")
        position = gauge("databus_consumer_position_scn", "The last window consumed whole")
        rate = gauge("databus_consumer_events_per_second", "Events consumed per second over"
                     " the last minute")
        win_total = CounterMetricFamily("databus_consumer_windows", "Windows consumed",
                                        labels=one)
        ev_total = CounterMetricFamily("databus_consumer_events", "Data events consumed",
                                       labels=one)
        cp_total = CounterMetricFamily("databus_consumer_checkpoints", "Positions persisted",
                                       labels=one)
        errors = CounterMetricFamily("databus_consumer_errors", "Errors: relay (retried),"
                                     " consumer (the window rolled back)",
                                     labels=["consumer", "kind"])
        retries = CounterMetricFamily("databus_consumer_retries", "Windows replayed after a"
                                      " consumer failure", labels=one)
        state = GaugeMetricFamily("databus_consumer_state", "The consumer's state (1: the"
                                  " current one)", labels=["consumer", "state"])
        nan = float("nan")
        for m in rows:
            c = [m.consumer]
            lag.add_metric(c, nan if m.lag_seconds is None else m.lag_seconds)
            windows.add_metric(c, nan if m.lag_windows is None else m.lag_windows)
            age.add_metric(c, m.checkpoint_age_seconds)
            position.add_metric(c, m.position_scn)
            rate.add_metric(c, m.events_per_second)
            win_total.add_metric(c, m.windows)
            ev_total.add_metric(c, m.events)
            cp_total.add_metric(c, m.checkpoints)
            errors.add_metric([m.consumer, "relay"], m.relay_errors)
            errors.add_metric([m.consumer, "consumer"], m.consumer_errors)
            retries.add_metric(c, m.retries)
            for s in STATES:
                state.add_metric([m.consumer, s], 1.0 if m.state == s else 0.0)
        yield from (lag, windows, age, position, win_total, ev_total, rate, cp_total, errors,
                    retries, state)
