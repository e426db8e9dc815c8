"""The consumers a relay served lately: who, where each is, how far behind.

The relay keeps no state a consumer depends on (each request carries its checkpoint);
this table is only what it saw, for operators (``GET /consumers``, the
``databus_relay_consumer_*`` metrics, ``databus status``; docs/operations.md).

Contract:

* Every ``/stream`` request is recorded (:meth:`ConsumerTable.seen`) under the name its
  ``X-Databus-Consumer`` header gives, else ``(unnamed) <client address>``, with its
  checkpoint, its token's name, and when its long poll ends. A request costs a dict
  lookup and a few stores; everything else is computed when the table is read.
* Bounded: at most ``max_listed`` consumers; a new one beyond that pushes out the one
  seen longest ago. A consumer not seen for ``forget_after`` seconds is dropped when the
  table is read.
* :meth:`ConsumerTable.rows` computes, for each consumer, its position, seconds and
  windows behind (from the relay's :class:`~databus.relay.timeline.Timeline`), its
  state (``online``, ``stalled``, ``gone``) and whether it is about to fall off the
  buffer (see docs/operations.md for each definition).
* Thread safety: :meth:`seen` runs on the event loop, :meth:`rows` on any thread; an
  entry is replaced whole under the GIL and the dict is copied before it is walked.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from databus.core.checkpoint import Checkpoint
from databus.core.errors import InvalidRequestError
from databus.relay.config import ConsumersConfig
from databus.relay.timeline import Timeline

MAX_NAME = 200
"""Longest consumer name a request may give."""

STATES = ("online", "stalled", "gone")


def check_name(raw: str | None) -> str | None:
    """A consumer name from the ``X-Databus-Consumer`` header (stripped; None when
    absent or empty), or 400 ``InvalidRequest``."""
    if raw is None:
        return None
    name = raw.strip()
    if len(name) > MAX_NAME:
        raise InvalidRequestError(
            f"X-Databus-Consumer is {len(name)} characters long; at most {MAX_NAME}")
    return name or None


@dataclass(slots=True)
class _Seen:
    """What the relay saw of one consumer (its last request)."""

    name: str
    token: str | None
    address: str
    member: bool
    consumed: int  # the last window it consumed whole (-1: none)
    window_scn: int  # the window it is inside (-1: none)
    window_offset: int
    first_seen: float  # wall clock
    last_seen: float  # monotonic
    last_seen_wall: float
    poll_end: float  # monotonic: when its last long poll ends at the latest
    requests: int


class ConsumerTable:
    """See the module docstring."""

    def __init__(self, config: ConsumersConfig | None = None) -> None:
        self.config = config if config is not None else ConsumersConfig()
        self._seen: dict[str, _Seen] = {}

    def __len__(self) -> int:
        return len(self._seen)

    def seen(self, name: str | None, token: str | None, address: str, cp: Checkpoint,
             poll_end: float, *, member: bool = False) -> None:
        """A ``/stream`` request of consumer ``name`` from ``address`` with checkpoint
        ``cp``, long-polling until ``poll_end`` (``time.monotonic()``) at the latest."""
        key = name if name is not None else f"(unnamed) {address}"
        now = time.monotonic()
        if cp.is_flexible:
            consumed, window, offset = -1, -1, -1
        elif cp.window_offset == -1:
            consumed, window, offset = cp.window_scn, -1, -1
        else:
            consumed, window, offset = cp.prev_scn, cp.window_scn, cp.window_offset
        entry = self._seen.get(key)
        if entry is None:
            if len(self._seen) >= self.config.max_listed:
                oldest = min(self._seen.values(), key=lambda e: e.last_seen)
                del self._seen[oldest.name]
            self._seen[key] = _Seen(key, token, address, member, consumed, window, offset,
                                    time.time(), now, time.time(), poll_end, 1)
            return
        entry.token, entry.address, entry.member = token, address, member
        entry.consumed, entry.window_scn, entry.window_offset = consumed, window, offset
        entry.last_seen, entry.last_seen_wall, entry.poll_end = now, time.time(), poll_end
        entry.requests += 1

    def rows(self, timeline: Timeline, *, min_scn: int, evicting: bool,
             relay_lag: float) -> list[dict[str, Any]]:
        """Every consumer still listed (see the module docstring), most behind first.
        ``min_scn``: the buffer's oldest window (-1: empty); ``evicting``: whether the
        buffer has evicted windows (so the oldest moves on); ``relay_lag``: the relay's
        own lag in seconds (what a consumer that consumed everything is behind)."""
        cfg = self.config
        now = time.monotonic()
        now_ns = time.time_ns()
        for key in [k for k, e in list(self._seen.items())
                    if now - e.last_seen > cfg.forget_after]:
            self._seen.pop(key, None)
        oldest_ns = timeline.time_of(min_scn) if min_scn >= 0 and evicting else None
        out: list[dict[str, Any]] = []
        for e in list(self._seen.values()):
            first_ns, behind = timeline.after(e.consumed)
            seconds = relay_lag if first_ns is None else max(now_ns - first_ns, 0) / 1e9
            silent = now - max(e.last_seen, e.poll_end)
            state = ("gone" if now - e.last_seen > cfg.gone_after else
                     "stalled" if silent > cfg.stalled_after else "online")
            margin = None
            if oldest_ns is not None:
                # the source time the consumer's position is ahead of the oldest window
                pos_ns = first_ns if first_ns is not None else timeline.last_window_ns
                margin = max(pos_ns - oldest_ns, 0) / 1e9
            out.append({
                "name": e.name, "token": e.token, "address": e.address, "member": e.member,
                "position": {"scn": e.window_scn if e.window_scn >= 0 else e.consumed,
                             "window_offset": e.window_offset},
                "seconds_behind": round(seconds, 3), "windows_behind": behind,
                "last_seen": round(e.last_seen_wall, 3),
                "seen_seconds_ago": round(max(now - e.last_seen, 0.0), 3),
                "first_seen": round(e.first_seen, 3), "requests": e.requests,
                "state": state,
                "falling_off": bool(margin is not None and behind > 0
                                    and margin < cfg.fall_off_warning),
                "fall_off_margin_seconds": None if margin is None else round(margin, 3),
            })
        out.sort(key=lambda r: (-r["seconds_behind"], r["name"]))
        return out
