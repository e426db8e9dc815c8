"""A consumer's lag, as the consumer itself knows it (docs/operations.md, "Time in the
stream").

A consumer's lag is the age of the oldest change it has not consumed yet: now minus the
commit time of the first window after its position; when it consumed everything the
relay held at its last answer, the relay's own lag then (the relay's ``captured until``
time, ``X-Databus-Source-Time-Ns``, against the clock when the answer came). So it is
near 0 for a consumer that keeps up, idle or busy, grows with the clock while a window
waits (a slow callback, a failing target), and never jumps at the first change after
an idle hour.

:class:`LagClock` is fed once per ``/stream`` answer (:meth:`LagClock.answer`: the
answer's windows, the relay's time and the windows it held beyond them) and reads the
consumer's position from a callable (the last window consumed whole), so the pull loop
pays nothing per window. Its readers (:meth:`lag`) run on any thread.
"""

from __future__ import annotations

import time
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol


class Timed(Protocol):
    """A window as the clock needs it (:class:`~databus.client.window.DecodedWindow`)."""

    scn: int
    timestamp_ns: int


class LagClock:
    """See the module docstring. ``consumed()``: the SCN of the last window consumed
    whole (-1: none)."""

    def __init__(self, consumed: Callable[[], int]) -> None:
        self._consumed = consumed
        self._scns: list[int] = []  # the last answer's windows
        self._times: list[int] = []
        self._relay_ns = 0  # the relay's captured-until at the last answer (0: unknown)
        self._answered_ns = 0  # when the last answer came
        self._beyond = 0  # windows the relay held after the last answer's windows
        self._last_ns = 0  # commit time of the newest window received
        self._at_head = False  # the last answer left nothing the relay held
        self._rates: deque[tuple[float, int]] = deque(maxlen=128)  # (monotonic, events)
        self.bootstrap_since: float | None = None  # wall clock: a bootstrap runs since

    def answer(self, windows: Sequence[Timed], relay_ns: int, beyond: int,
               events: int) -> None:
        """A ``/stream`` answer: its whole ``windows``, the relay's ``captured until``
        (-1: not said), the windows it held beyond the answer (-1: not said) and the
        consumer's events counter so far (for the rate)."""
        if windows:
            self._scns = [w.scn for w in windows]
            self._times = [w.timestamp_ns for w in windows]
            self._last_ns = windows[-1].timestamp_ns
        else:
            self._scns, self._times = [], []
        self._relay_ns = relay_ns if relay_ns > 0 else 0
        self._answered_ns = time.time_ns()
        self._beyond = max(beyond, 0)
        self._at_head = beyond == 0
        now = time.monotonic()
        if not self._rates or now - self._rates[-1][0] >= 1.0:
            self._rates.append((now, events))

    def lag(self, *, relay_reachable: bool = True) -> tuple[float | None, int | None]:
        """(seconds, windows) behind now; None where unknown (no answer yet, or a relay
        that does not say its time). ``relay_reachable`` False (its requests fail): the
        relay's last word is all there is, and it gets older with the clock."""
        now = time.time_ns()
        if self.bootstrap_since is not None:
            return max(time.time() - self.bootstrap_since, 0.0), None
        consumed = self._consumed()
        i = bisect_right(self._scns, consumed)
        if i < len(self._scns):  # windows received and not consumed yet
            return max(now - self._times[i], 0) / 1e9, len(self._scns) - i + self._beyond
        if not self._answered_ns:
            return None, None
        if self._at_head:
            if not self._relay_ns:
                return None, 0
            if not relay_reachable:
                return max(now - self._relay_ns, 0) / 1e9, 0
            return max(self._answered_ns - self._relay_ns, 0) / 1e9, 0
        # behind, between answers: the newest window consumed is the best lower bound
        return (max(now - self._last_ns, 0) / 1e9 if self._last_ns else None), self._beyond

    def events_per_second(self, events: int, window: float = 60.0) -> float:
        """Events consumed per second over about the last ``window`` seconds."""
        now = time.monotonic()
        old = [(t, n) for t, n in self._rates if now - t <= window]
        if not old:
            return 0.0
        t0, n0 = old[0]
        return (events - n0) / (now - t0) if now - t0 >= 0.5 else 0.0
