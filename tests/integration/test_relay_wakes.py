"""Long polls are woken per interval, not per append: a burst of windows appended faster
than ``Relay.WAKE_INTERVAL`` costs a few wakes, and no window is left without one (a
relay capturing a real SQLite file, served by uvicorn; windows appended to its buffer
from another thread as its fetcher does)."""

from __future__ import annotations

import threading
import time

import httpx

from databus.core.checkpoint import Checkpoint
from databus.core.window import Window
from databus.relay.relay import Relay


def _count_wakes(relay: Relay) -> list[float]:
    """The times of the relay's wakes from now on (its wake, wrapped on the instance)."""
    times: list[float] = []
    wake = relay._notify

    def counted() -> None:
        times.append(time.monotonic())
        wake()

    relay._notify = counted  # type: ignore[method-assign]
    return times


def _poll(relay: Relay, after: int, out: list[bytes]) -> None:
    with httpx.Client(base_url=relay.url, timeout=30) as c:
        r = c.get("/stream", params={"timeout": "10",
                                     "checkPoint": Checkpoint.after(after).to_json()})
        out.append(r.content)


def test_a_burst_of_appends_shares_wakes_and_its_last_window_is_answered(relay: Relay) -> None:
    base = max(relay.buffer.max_scn, 0) + 1_000_000
    relay.buffer.append_window(Window(base, b"", 0, 0))
    answers: list[bytes] = []
    poller = threading.Thread(target=_poll, args=(relay, base, answers))
    poller.start()
    time.sleep(0.3)  # the poll waits at the newest window
    wakes = _count_wakes(relay)
    n = 2000
    t0 = time.monotonic()
    for k in range(1, n + 1):
        relay.buffer.append_window(Window(base + k, b"", 0, 0))
    last_append = time.monotonic()
    poller.join(15)
    time.sleep(0.05)
    assert answers and answers[0], "the waiting poll was not answered"
    # one wake per WAKE_INTERVAL at most (and one more after the burst), not one per window
    assert len(wakes) <= (last_append - t0) / Relay.WAKE_INTERVAL + 2
    assert len(wakes) < n / 4
    # the last append was followed by a wake: nothing appended stays unannounced
    assert wakes[-1] >= last_append

    # a poll at the newest window is answered at the next append, within the interval
    answers.clear()
    poller = threading.Thread(target=_poll, args=(relay, base + n, answers))
    poller.start()
    time.sleep(0.3)
    t1 = time.monotonic()
    relay.buffer.append_window(Window(base + n + 1, b"", 0, 0))
    poller.join(15)
    assert answers and answers[0]
    assert time.monotonic() - t1 < 2.0
