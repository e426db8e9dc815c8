"""What a read of the event buffer answers: a copy (:class:`ReadResult`) or views of
the buffer pinned until released (:class:`PinnedRead`).

Both carry the same counts: ``events`` (data events and EOPs served),
``data_events``, ``windows`` (whole windows served), ``last_scn`` (the last whole
window's SCN, -1 when none), and for a window larger than the byte budget
``partial`` with ``partial_scn`` (that window) and ``partial_count`` (the next
``windowOffset``: selected data events of that window delivered so far, including
those the checkpoint skipped).

A :class:`PinnedRead`'s views stay valid until :meth:`~PinnedRead.release`: the
buffer's writer never evicts a window from the first one a pinned read holds; after
its grace period it calls :meth:`~PinnedRead.revoke`, and the holder must stop using
the views soon and release them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

Counts = tuple[int, int, int, int, bool, int, int]
"""The counts of a read besides its data: events, data_events, windows, last_scn,
partial, partial_scn, partial_count (:class:`ReadResult`'s fields after ``data``)."""


@dataclass(frozen=True, slots=True)
class ReadResult:
    """What :meth:`EventBuffer.read <databus.buffer.ring.EventBuffer.read>` serves
    (the counts: see the module docstring)."""

    data: bytes
    events: int
    data_events: int
    windows: int
    last_scn: int
    partial: bool = False
    partial_scn: int = -1
    partial_count: int = -1


class PinnedRead:
    """What :meth:`EventBuffer.read_pinned <databus.buffer.ring.EventBuffer.read_pinned>`
    serves: :class:`ReadResult`'s fields, the data as views of the buffer (``parts``,
    ``size`` bytes in all) instead of a copy.

    The views stay valid until :meth:`release` (see the module docstring): call it
    once they are no longer used, e.g. when the connection they were written to
    has sent them or is gone. :meth:`on_revoke` names what the writer calls (from
    its thread) when it has waited its grace period for the release.
    """

    __slots__ = ("_release", "_revoke", "data_events", "events", "first_scn", "last_scn",
                 "partial", "partial_count", "partial_scn", "parts", "size", "windows")

    def __init__(self, release: Callable[[PinnedRead], None] | None, first_scn: int,
                 parts: list[memoryview], size: int, counts: Counts) -> None:
        """``release``: the buffer's, called once by :meth:`release` (None: nothing
        is pinned); ``first_scn``: the first window the views hold."""
        self._release, self.first_scn, self.parts, self.size = release, first_scn, parts, size
        (self.events, self.data_events, self.windows, self.last_scn, self.partial,
         self.partial_scn, self.partial_count) = counts
        self._revoke: Callable[[], None] | None = None

    def on_revoke(self, callback: Callable[[], None]) -> None:
        """``callback`` (thread-safe) makes the holder stop using the views soon and
        then release them; called at most once, from the writer's thread."""
        self._revoke = callback

    def revoke(self) -> bool:
        """Ask the holder to release (the writer's side); False when it named no way
        to be asked (:meth:`on_revoke`)."""
        if self._revoke is None:
            return False
        self._revoke()
        return True

    @property
    def held(self) -> bool:
        """Whether the views are still pinned."""
        return self._release is not None

    def release(self) -> None:
        """The views are no longer used: the writer may evict their windows (idempotent)."""
        release, self._release = self._release, None
        if release is not None:
            # dropped, not release()d: a view the caller passed on may still be referenced
            # (unused) by its holder, which release() would break
            self.parts = []
            release(self)
