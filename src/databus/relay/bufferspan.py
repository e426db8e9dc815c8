"""A relay's warning when its buffer holds too little source time.

Contract of :class:`BufferSpanWatch` (checked by the fetcher at each state write,
``buffer.flush_interval``):

* The buffer is **short** when it has evicted windows (it is full: older windows are
  gone) and the source time between its oldest and newest window (the timeline's
  span) is below ``buffer.min_span_seconds``: a consumer that stops for longer than
  that span falls off the relay (``ScnNotFound``). ``min_span_seconds`` 0 turns the
  check off. A buffer that never evicted is never short: it still holds everything
  since the relay started.
* While short, a warning is logged at once, then at most once per ``every`` seconds
  (default 5 minutes); it names the span, the capacity, the capacity that would hold
  ``min_span_seconds`` at the recent rate, and the remedies (``--buffer-size`` /
  ``buffer.capacity_bytes``, a persistent buffer ``--buffer-path`` / ``buffer.path``,
  a bootstrap server for the consumers). Coming back above the threshold is logged once.
* :attr:`short` is exported as the gauge ``databus_relay_buffer_span_short``
  (docs/operations.md).

Thread safety: :meth:`check` is called by one thread (the fetcher's); :attr:`short`
is read by any.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger("databus.relay.buffer")

WARN_EVERY = 300.0
"""Seconds between two warnings while the buffer stays short."""


class BufferSpanWatch:
    """See the module docstring."""

    def __init__(self, min_span_seconds: float, *, every: float = WARN_EVERY,
                 persistent: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.min_span = min_span_seconds
        self.every = every
        self.persistent = persistent
        self.clock = clock
        self.short = False
        self.warnings = 0
        self._warned_at: float | None = None

    def check(self, *, evicted: int, span_seconds: float, capacity: int) -> bool:
        """Whether the buffer is short now (see the module docstring); logs as it says."""
        short = self.min_span > 0 and evicted > 0 and span_seconds < self.min_span
        now = self.clock()
        if short and (self._warned_at is None or now - self._warned_at >= self.every):
            self._warned_at = now
            self.warnings += 1
            log.warning("%s", self.message(span_seconds, capacity))
        elif not short and self.short:
            self._warned_at = None
            log.info("relay buffer: it holds %.0f s of the source again (buffer.min_span_seconds"
                     " %g)", span_seconds, self.min_span)
        self.short = short
        return short

    def message(self, span_seconds: float, capacity: int) -> str:
        mib = capacity / (1 << 20)
        need = (f"about {mib * self.min_span / span_seconds:,.0f} MiB"
                if span_seconds > 0 else "a larger one")
        where = "" if self.persistent else "; a persistent buffer (--buffer-path) keeps it"\
            " across restarts"
        return (f"relay buffer holds only {span_seconds:.1f} s of the source ({mib:,.0f} MiB,"
                f" full: older windows are evicted), less than buffer.min_span_seconds"
                f" {self.min_span:g}: a consumer stopped for longer falls off the relay"
                f" (ScnNotFound). Give the relay a larger buffer (--buffer-size /"
                f" buffer.capacity_bytes: {need} at the recent rate){where}, or its"
                " consumers a bootstrap server (--bootstrap)")
