"""Source time in a relay: when each window it holds was committed, and up to when it
holds every committed change.

Contract:

* :attr:`Timeline.captured_until_ns` is the source time (ns since the Unix epoch) up to
  which the relay holds every committed change: the newest window's commit time, or a
  later time at which a read of the source found nothing new (:meth:`caught_up`). It
  never goes back. ``now - captured_until_ns`` is the relay's lag: near 0 while an idle
  source is read, growing while capture stops (docs/operations.md, "Time in the
  stream").
* :meth:`Timeline.appended` records the windows the fetcher appended, in SCN order;
  each gets an ordinal (1, 2, ...: windows appended since start). Samples (SCN, commit
  time, ordinal) are kept for every recent window; when more than ``keep`` are held the
  older half is thinned (every other sample dropped), so positions far back are known
  to within a few percent and memory stays bounded. :meth:`trim` drops samples older
  than the buffer's oldest window (one is kept at or before it).
* :meth:`after` answers, for a consumer's position, the commit time of the first window
  after it and how many windows the relay holds after it; :meth:`span_ns` the source
  time between the buffer's oldest and newest window.
* Thread safety: one writer (the fetcher's thread), readers on any thread; a lock keeps
  each call consistent. Appends cost a few array appends per window.
"""

from __future__ import annotations

import threading
import time
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable

from databus.core.window import Window

KEEP = 1 << 18
"""Samples held before the older half is thinned (24 bytes each)."""


class Timeline:
    """See the module docstring."""

    def __init__(self, keep: int = KEEP) -> None:
        self.started_ns = time.time_ns()
        self._lock = threading.Lock()
        self._keep = max(keep, 16)
        self._scn = array("q")
        self._ts = array("q")
        self._ord = array("q")
        self.ordinal = 0
        """Windows appended since start (the newest window's ordinal)."""
        self.captured_until_ns = 0
        """See the module docstring (0: nothing known yet)."""
        self.last_window_ns = 0
        """Commit time of the newest window appended (0: none yet)."""

    # -- the writer ------------------------------------------------------------------------

    def appended(self, windows: Iterable[Window]) -> None:
        """The fetcher appended ``windows`` (in SCN order) to the buffer."""
        with self._lock:
            scns, tss, ords = self._scn, self._ts, self._ord
            n = self.ordinal
            newest = self.last_window_ns
            for w in windows:
                n += 1
                scns.append(w.scn)
                tss.append(w.timestamp_ns)
                ords.append(n)
                if w.timestamp_ns > newest:
                    newest = w.timestamp_ns
            self.ordinal = n
            self.last_window_ns = newest
            if newest > self.captured_until_ns:
                self.captured_until_ns = newest
            if len(scns) > self._keep:
                self._thin()

    def caught_up(self, ns: int) -> None:
        """The source held no change committed before ``ns`` that the buffer lacks (a
        read that found nothing new started then, or the source said so)."""
        if ns > self.captured_until_ns:
            self.captured_until_ns = ns  # one store: readers see the old or the new value

    def trim(self, min_scn: int) -> None:
        """The buffer's oldest window is ``min_scn``: forget samples before it (the one
        at or before it stays, for positions at the buffer's floor)."""
        with self._lock:
            i = bisect_right(self._scn, min_scn) - 1
            if i > 0:
                del self._scn[:i]
                del self._ts[:i]
                del self._ord[:i]

    def reset(self) -> None:
        """The buffer was dropped (a cluster member starting over): no window is held."""
        with self._lock:
            del self._scn[:], self._ts[:], self._ord[:]

    def _thin(self) -> None:
        """Drop every other sample of the older half (lock held)."""
        half = len(self._scn) // 2
        for arr in (self._scn, self._ts, self._ord):
            arr[:half] = arr[:half:2]

    # -- readers ---------------------------------------------------------------------------

    def after(self, scn: int) -> tuple[int | None, int]:
        """For a consumer that consumed every window up to ``scn`` (-1: none): the
        commit time of the first window held after it (None when there is none) and
        how many windows are held after it."""
        with self._lock:
            scns = self._scn
            if not scns or scns[-1] <= scn:
                return None, 0
            i = bisect_right(scns, scn)  # the first sample after scn
            behind = self.ordinal - self._ord[i] + 1
            if i > 0 and self._ord[i] - self._ord[i - 1] > 1:
                # thinned: windows between the two samples are unknown; count half of them
                behind += (self._ord[i] - self._ord[i - 1] - 1) // 2
            return self._ts[i], behind

    def behind(self, scn: int) -> int:
        """Windows held after ``scn`` (the window count of :meth:`after`)."""
        return self.after(scn)[1]

    def time_of(self, scn: int) -> int | None:
        """Commit time of the newest window at or before ``scn`` that is sampled, or of
        the oldest one when ``scn`` is before every sample (None: nothing held)."""
        with self._lock:
            if not self._scn:
                return None
            i = max(bisect_left(self._scn, scn + 1) - 1, 0)
            return self._ts[i]

    def span_ns(self, min_scn: int) -> int:
        """Source time between the window ``min_scn`` (the buffer's oldest) and the
        newest one; 0 when nothing is held."""
        oldest = self.time_of(min_scn) if min_scn >= 0 else None
        if oldest is None:
            return 0
        return max(self.last_window_ns - oldest, 0)

    def lag_ns(self, now_ns: int) -> int:
        """``now_ns`` minus :attr:`captured_until_ns` (0 when that would be negative);
        while nothing is known, since the relay started (a capture that never ran is as
        far behind as that)."""
        until = self.captured_until_ns or self.started_ns
        return max(now_ns - until, 0)
