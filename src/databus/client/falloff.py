"""Seeing a consumer fall off the relay's buffer coming, and saying what would have kept it.

The relay keeps a bounded buffer; a consumer whose checkpoint is older than the oldest
window it still holds gets ``ScnNotFound``. Every ``/stream`` answer says which window is
the oldest (``X-Databus-Min-Scn``); the client knows the source commit time of the
windows it consumed. :class:`FallOffWatch` keeps one (SCN, commit time) sample per second
of source time it consumed, finds the commit time of the relay's oldest window among
them, and when the consumer's own position is less than ``margin`` seconds of source time
ahead of it, and the buffer evicts windows (its oldest window moved since the first
answer), logs a warning (once per ``every`` seconds) naming the remedies while there
is still time. It warns as well when a consumer that keeps up is that close: the buffer
then holds less than ``margin`` seconds of the stream, and any pause longer than that
(a restart, a slow target) makes the consumer fall off.

It knows nothing of SCN arithmetic (SCNs are only compared), and says nothing when its
samples do not reach back to the relay's oldest window (a consumer that started later).

:func:`remedy` is the one text of what keeps a consumer on the relay, used by the
warning and by the error when a consumer without a bootstrap server fell off.
"""

from __future__ import annotations

import logging
import time
from collections import deque

from databus.core.checkpoint import Checkpoint
from databus.core.errors import ScnNotFoundError

log = logging.getLogger("databus.client")


def remedy(bootstrap: bool) -> str:
    """What keeps a consumer this far behind from losing its place, in one sentence."""
    boot = ("" if bootstrap else
            "give the consumer a bootstrap server (--bootstrap URL, bootstrap_url) to catch"
            " up from a snapshot after a fall-off; ")
    return (f"{boot}give the relay a larger buffer (--buffer-size, buffer.capacity_bytes),"
            " persistent so that a restart keeps it (--buffer-path, buffer.path)")


def fell_off(relay: str, bootstrap_url: str | None, position: Checkpoint,
             exc: ScnNotFoundError) -> None:
    """The relay ``relay`` no longer holds ``position``: with a bootstrap server, logged
    (the caller bootstraps); without one, a terminal :class:`ScnNotFoundError` saying
    what would have kept the consumer on the relay."""
    if bootstrap_url is not None:
        log.warning("relay %s no longer holds checkpoint %d (%s); switching to the "
                    "bootstrap server %s", relay, position.window_scn, exc, bootstrap_url)
        return
    raise ScnNotFoundError(
        f"checkpoint windowScn={position.window_scn} (windowOffset={position.window_offset}) "
        f"is older than the oldest window relay {relay} still holds ({exc}): this consumer"
        f" fell off the relay's buffer. To go on without a gap, {remedy(False)}; or delete"
        " the stored checkpoint to start again from the relay's oldest window, accepting"
        " the gap") from exc


class FallOffWatch:
    """See the module docstring. One per pull loop; not thread-safe."""

    def __init__(self, relay: str, margin: float, *, bootstrap: bool, every: float = 60.0,
                 keep: int = 4 * 3600) -> None:
        self.relay = relay
        self.margin_ns = int(margin * 1e9)
        self.bootstrap = bootstrap
        self.every = every
        self._samples: deque[tuple[int, int]] = deque(maxlen=keep)  # (scn, commit ns)
        self._last = (-1, 0)  # the last window consumed: (scn, commit ns)
        self._warned = float("-inf")
        self._first_floor = -1  # the oldest window of the first answer seen
        self.warnings = 0

    def consumed(self, scn: int, timestamp_ns: int) -> None:
        """The consumer is past window ``scn``, committed at ``timestamp_ns``."""
        self._last = (scn, timestamp_ns)
        samples = self._samples
        if not samples or timestamp_ns - samples[-1][1] >= 1_000_000_000:
            samples.append((scn, timestamp_ns))

    def answer(self, min_scn: int) -> float | None:
        """The relay's oldest window is ``min_scn`` (-1: not said): the consumer's margin
        in seconds of source time when it is known, warning when it is short."""
        if self.margin_ns <= 0 or min_scn < 0:
            return None
        if self._first_floor < 0:
            self._first_floor = min_scn
        samples = self._samples
        while len(samples) > 1 and samples[1][0] <= min_scn:
            samples.popleft()  # the window the floor is at or past: only the last one
        if not samples or samples[0][0] > min_scn:
            return None  # the floor is older than any window seen: far enough
        pos_scn, pos_ns = self._last
        floor_ns = samples[0][1]
        margin = max(pos_ns - floor_ns, 0)
        if margin < self.margin_ns and min_scn > self._first_floor:  # the buffer evicts
            now = time.monotonic()
            if now - self._warned >= self.every:
                self._warned = now
                self.warnings += 1
                log.warning(
                    "this consumer (at window %d) is %.1f s of source time ahead of the"
                    " oldest window relay %s holds (%d): it falls off the buffer, and gets"
                    " ScnNotFound, if it falls that much further behind; %s", pos_scn,
                    margin / 1e9, self.relay, min_scn, remedy(self.bootstrap))
        return margin / 1e9
