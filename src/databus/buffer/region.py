"""The event buffer's circular region: where windows lie, and the sparse SCN index.

Contract (the caller, :class:`databus.buffer.ring.EventBuffer`, holds its lock
around every call; nothing here locks or waits):

* The region holds whole windows (data events + EOP), oldest first, from ``head``.
  A window that does not fit before the end of the region starts again at offset 0
  (``wrapped``) and ``limit`` marks where the data before the wrap ends; each window
  is contiguous.
* :meth:`Region.make_room` evicts whole windows from the head until a window of
  the given size fits; ``prev_scn`` is then the SCN of the last evicted window.
* The sparse index holds at most one (scn, offset) entry per ``block`` bytes: the
  first window starting in that block. :meth:`Region.find` bisects it, then walks
  event headers (in C when the ``_select`` extension is built,
  :data:`databus.buffer.select.walk_windows`).
* Counters (``windows``, ``events``, ``evicted``, ``appended``, ``min_scn``,
  ``max_scn``) describe what the region holds now.
"""

from __future__ import annotations

import struct
import sys
from array import array
from bisect import bisect_right
from collections.abc import Callable

from databus.buffer import select
from databus.buffer.persist import ScanResult
from databus.core import event as ev

EOP = ev.SRC_EOP
MAX_SCN = (1 << 63) - 1
# total length (offset 17) and source id (offset 31) of an event header
_LEN_SRC = struct.Struct(">17xi10xi")
assert _LEN_SRC.size == ev.OFF_SRC_ID + 4


class Region:
    """The windows in ``mem`` and where they are (see the module docstring)."""

    def __init__(self, mem: bytearray | memoryview, block: int, *, head: int = 0,
                 tail: int = 0, limit: int = 0, wrapped: bool = False,
                 prev_scn: int = -1) -> None:
        self.mem = mem
        self.capacity = len(mem)
        self.block = block
        self.head, self.tail, self.limit, self.wrapped = head, tail, limit, wrapped
        self.prev_scn = prev_scn
        self.min_scn = self.max_scn = -1
        self.windows = self.events = 0
        self.evicted = self.appended = 0
        self.ix_scn = array("q")
        self.ix_off = array("q")
        self.ix_first = 0  # entries before this are dead (compacted lazily)

    @property
    def used(self) -> int:
        """Bytes the windows take."""
        return (self.limit - self.head + self.tail) if self.wrapped else self.tail - self.head

    @property
    def index_entries(self) -> int:
        return len(self.ix_scn) - self.ix_first

    # -- walking ------------------------------------------------------------------------

    def window_end(self, off: int) -> tuple[int, int]:
        """(offset after the window starting at ``off``, its data-event count)."""
        mem = self.mem
        walk = select.walk_windows
        if walk is not None:
            end, _w, n, _s = walk(mem, off, len(mem), sys.maxsize, MAX_SCN, 1)
            return end, n
        # without the extension: one struct call per event, names bound locally
        unpack = _LEN_SRC.unpack_from
        n = 0
        length, src = unpack(mem, off)
        while src != EOP:
            off += length
            n += 1
            length, src = unpack(mem, off)
        return off + length, n

    def segment_end(self, off: int) -> int:
        """Where the contiguous data holding ``off`` ends: ``limit`` for the windows
        before the wrap, else ``tail``."""
        return self.limit if self.wrapped and off >= self.head else self.tail

    def after_window(self, end: int) -> int:
        """Where the window after the one ending at ``end`` starts."""
        if self.wrapped and end == self.limit and end != self.tail:
            return 0
        return end

    def find(self, scn: int) -> int:
        """Offset of the first window whose SCN is >= ``scn`` (-1 if none)."""
        lo = self.ix_first
        i = bisect_right(self.ix_scn, scn, lo) - 1
        off = self.head if i < lo else self.ix_off[i]
        mem = self.mem
        walk = select.walk_windows
        while True:
            found = ev.peek_scn(mem, off)
            if found >= scn:
                return off
            if found >= self.max_scn:  # walked the newest window: the end of the data
                return -1
            if walk is None:
                end, _ = self.window_end(off)
            else:  # every window before scn up to the wrap (or the end) in one call
                end, _w, _n, found = walk(mem, off, self.segment_end(off), sys.maxsize,
                                          scn - 1, sys.maxsize)
                if found >= self.max_scn:
                    return -1
            off = self.after_window(end)

    # -- writing ------------------------------------------------------------------------

    def make_room(self, size: int, before_evict: Callable[[], None]) -> int:
        """Evict until ``size`` bytes fit; returns where the window goes.
        ``before_evict`` runs before each eviction (it may wait for readers)."""
        while True:
            if not self.windows:
                self.head = self.tail = self.limit = 0
                self.wrapped = False
                return 0
            if not self.wrapped:
                if self.tail + size <= self.capacity:
                    return self.tail
                # wrap: the data so far ends at limit; the window goes to 0
                self.limit = self.tail
                self.wrapped = True
                self.tail = 0
            if self.tail + size <= self.head:
                return self.tail
            before_evict()
            self.evict_one()

    def put(self, pos: int, events: bytes, eop: bytes, scn: int, count: int) -> None:
        """Write a window (``count`` data events, then its EOP) at ``pos``, which
        :meth:`make_room` returned."""
        end = pos + len(events)
        self.mem[pos:end] = events
        self.mem[end : end + len(eop)] = eop
        self.tail = end + len(eop)
        if not self.wrapped:
            self.limit = self.tail
        ix_off = self.ix_off  # as _index, inline: this runs once per window
        if (len(ix_off) == self.ix_first or pos // self.block != ix_off[-1] // self.block
                or pos < ix_off[-1]):
            self.ix_scn.append(scn)
            ix_off.append(pos)
        if not self.windows:
            self.min_scn = scn
        self.max_scn = scn
        self.windows += 1
        self.events += count
        self.appended += 1

    def evict_one(self) -> None:
        end, n = self.window_end(self.head)
        self.prev_scn = ev.peek_scn(self.mem, self.head)
        self.windows -= 1
        self.events -= n
        self.evicted += 1
        nxt = self.after_window(end)
        if self.wrapped and nxt == 0:
            self.wrapped = False
            self.limit = self.tail
        self.head = nxt
        self.min_scn = ev.peek_scn(self.mem, self.head) if self.windows else -1
        # drop index entries of evicted windows
        while self.ix_first < len(self.ix_scn) and self.ix_scn[self.ix_first] <= self.prev_scn:
            self.ix_first += 1
        if self.ix_first > 1024 and self.ix_first * 2 > len(self.ix_scn):
            del self.ix_scn[: self.ix_first]
            del self.ix_off[: self.ix_first]
            self.ix_first = 0

    # -- recovery -----------------------------------------------------------------------

    def adopt(self, found: ScanResult) -> None:
        """Hold exactly the valid windows a scan of a persisted file found (its
        :func:`~databus.buffer.persist.scan_windows`, from this region's state)."""
        if not found.windows:
            self.head = self.tail = self.limit = 0
            self.wrapped = False
        else:
            self.tail = found.end
            if self.wrapped and found.end > self.head and found.ended_before_wrap:
                self.wrapped = False
            if not self.wrapped:
                self.limit = self.tail
        # one pass with locals: a 2 GiB buffer holds millions of windows
        ix_scn, ix_off, block = self.ix_scn, self.ix_off, self.block
        last = ix_off[-1] if len(ix_off) > self.ix_first else -1
        for scn, off, _n in found.windows:
            if last < 0 or off // block != last // block or off < last:
                ix_scn.append(scn)
                ix_off.append(off)
                last = off
        self.events += sum(n for _s, _o, n in found.windows)
        self.windows = len(found.windows)
        if found.windows:
            self.min_scn = found.windows[0][0]
            self.max_scn = found.windows[-1][0]
