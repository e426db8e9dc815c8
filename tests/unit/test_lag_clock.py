"""A consumer's own lag (:class:`databus.client.lag.LagClock`, docs/operations.md "Time
in the stream"): the age of the oldest change not consumed, the relay's lag when caught
up, growing with the clock while the relay cannot be reached, never a jump after idling."""

from __future__ import annotations

import time
from dataclasses import dataclass

from databus.client.lag import LagClock
from databus.client.metrics import ConsumerMetrics, readiness, render


@dataclass
class W:
    scn: int
    timestamp_ns: int


def test_windows_waiting_count_from_the_oldest_one_not_consumed() -> None:
    consumed = [-1]
    clock = LagClock(lambda: consumed[0])
    now = time.time_ns()
    clock.answer([W(10, now - 30 * 10**9), W(11, now - 20 * 10**9)], now, 5, 0)
    seconds, windows = clock.lag()
    assert seconds is not None and 29.5 < seconds < 31 and windows == 7
    consumed[0] = 10
    seconds, windows = clock.lag()
    assert seconds is not None and 19.5 < seconds < 21 and windows == 6


def test_caught_up_the_relays_lag_and_it_grows_only_while_the_relay_is_unreachable() -> None:
    clock = LagClock(lambda: 11)
    now = time.time_ns()
    # an hour idle: the relay's captured-until is now, whatever the last change's age
    clock.answer([W(11, now - 3600 * 10**9)], now - 10**8, 0, 0)
    seconds, windows = clock.lag()
    assert seconds is not None and seconds < 1 and windows == 0
    time.sleep(0.3)
    assert (clock.lag()[0] or 0) < 1  # reachable: the relay's word at its last answer
    grown = clock.lag(relay_reachable=False)[0]
    assert grown is not None and grown >= 0.35


def test_nothing_known_before_the_first_answer_and_a_bootstrap_counts_from_its_start() -> None:
    clock = LagClock(lambda: -1)
    assert clock.lag() == (None, None)
    clock.bootstrap_since = time.time() - 5
    seconds, windows = clock.lag()
    assert seconds is not None and seconds >= 5 and windows is None


def test_rendered_names_and_readiness() -> None:
    m = ConsumerMetrics(consumer="c1", state="retrying", lag_seconds=None, lag_windows=3,
                        checkpoint_age_seconds=1.5, position_scn=9, windows=2, events=4,
                        events_per_second=0.0, checkpoints=1, relay_errors=2,
                        consumer_errors=0, retries=0, last_error="RelayUnavailable: gone")
    text = render([m]).decode()
    assert 'databus_consumer_lag_seconds{consumer="c1"} NaN' in text
    assert 'databus_consumer_errors_total{consumer="c1",kind="relay"} 2.0' in text
    assert 'databus_consumer_state{consumer="c1",state="retrying"} 1.0' in text
    assert "_created" not in text
    assert readiness([m]) == [("consumer c1", False, "retrying (last error RelayUnavailable)")]
