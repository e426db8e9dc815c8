"""Exponential backoff with jitter and interruptible waits.

Waits use :meth:`threading.Event.wait`, so a stop request ends them at once;
nothing in the client sleeps with :func:`time.sleep`.
"""

from __future__ import annotations

import random
import threading


class Backoff:
    """Delays ``initial * 2**(n-1)`` capped at ``maximum``, with "equal jitter".

    The ``n``-th delay is drawn uniformly from ``[d/2, d]`` where ``d`` is the
    capped exponential value, so retries of many clients spread out while each
    still waits at least half the nominal time. Not thread-safe; one per loop.
    """

    def __init__(self, initial: float, maximum: float, *, seed: int | None = None) -> None:
        if initial <= 0 or maximum < initial:
            raise ValueError("backoff needs 0 < initial <= maximum")
        self.initial = initial
        self.maximum = maximum
        self.attempt = 0
        self._rng = random.Random(seed)

    def reset(self) -> None:
        """Forget past failures (after a success)."""
        self.attempt = 0

    def next_delay(self) -> float:
        """Count one more failure and return how long to wait before retrying."""
        self.attempt += 1
        nominal = min(self.maximum, self.initial * 2.0 ** min(self.attempt - 1, 60))
        return self._rng.uniform(nominal / 2.0, nominal)

    def wait(self, stop: threading.Event) -> bool:
        """Wait the next delay; True when ``stop`` was set (the caller should quit)."""
        return stop.wait(self.next_delay())
