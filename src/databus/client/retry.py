"""Exponential backoff with jitter, interruptible waits, and retrying transient errors.

Waits use :meth:`threading.Event.wait`, so a stop request ends them at once;
nothing in the client sleeps with :func:`time.sleep`.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from typing import TypeVar

from databus.core.errors import RetriesExhaustedError, TransientError

log = logging.getLogger("databus.client")
T = TypeVar("T")


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


class Stopped(Exception):
    """The stop event was set while waiting: the client unwinds and returns."""


def retry_transient(fn: Callable[[], T], what: str, stop: threading.Event, backoff: Backoff,
                    *, limit: int | None, on_failure: Callable[[TransientError], None]) -> T:
    """``fn()``, called again after each :class:`TransientError` with ``backoff``.

    ``on_failure`` sees each such error (to count it). Raises :class:`Stopped` when
    ``stop`` is set before a call or during a wait, and
    :class:`~databus.core.errors.RetriesExhaustedError` after more than ``limit``
    failures (None: no limit). Other errors pass through at once.
    """
    failures = 0
    while True:
        if stop.is_set():
            raise Stopped
        try:
            result = fn()
        except TransientError as exc:
            failures += 1
            on_failure(exc)
            if limit is not None and failures > limit:
                raise RetriesExhaustedError(
                    f"{what} failed {failures} times; last error: {exc}") from exc
            log.warning("%s failed (%s); retrying", what, exc)
            if backoff.wait(stop):
                raise Stopped from None
            continue
        backoff.reset()
        return result
