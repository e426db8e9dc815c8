"""What the consumers of a relay cluster member may read: the high-water mark.

A window a consumer saw must survive the loss of any one member, so consumers read
only windows every member that could capture next holds:

* the **leader** serves up to the smallest position among itself and the members in
  the election (only caught-up followers join it); each follower's position is what
  its last read of the leader's ``/stream`` said it holds (:meth:`HighWater.follower_at`);
* a **follower** serves up to what its leader last said (the ``X-Databus-Cluster-Hw``
  header its chain source keeps), and keeps that mark when the leader goes;
* a **co-leader** serves all it captured: every capturer cuts the same windows, so a
  member that captures next makes the same ones.

Not thread-safe by itself: the relay's request handlers and the member's thread call
it; each call reads or replaces whole values (a dict entry, a set), never a partial
state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from databus.sources.chain import ChainSource

if TYPE_CHECKING:
    from databus.relay.member import Member


class HighWater:
    """The high-water mark of one member (see the module docstring)."""

    def __init__(self, relay: Member) -> None:
        self.relay = relay
        self.told = -1  # the last mark a leader sent (followers), or what was served
        self._positions: dict[str, int] = {}  # what each follower holds (its last read)
        # the members that may lead next (in the election), but this one
        self._contenders: set[str] = set()

    def contenders(self, ids: set[str]) -> bool:
        """The members in the election but this one are ``ids``; True when that changed
        (one gone can raise the mark)."""
        if ids == self._contenders:
            return False
        self._contenders = ids
        return True

    def follower_at(self, role: str, member: str, held: int) -> bool:
        """A member's read says it holds every window up to ``held``; True when that
        raised the mark."""
        before = self.limit(role)
        if held > self._positions.get(member, -2):
            self._positions[member] = held
        return self.limit(role) > before

    def limit(self, role: str) -> int:
        """The newest window consumers may read from a member in ``role``."""
        own = self.relay.buffer.max_scn
        if role == "coleader":
            return own
        if role == "leader":
            held = [self._positions.get(m, -1) for m in self._contenders]
            return min([own, *held])
        source = self.relay.source
        if isinstance(source, ChainSource) and source.cluster_hw is not None:
            self.told = source.cluster_hw
        return min(own, self.told)
