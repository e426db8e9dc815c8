"""The relay's event buffer: serialized events in a fixed circular region.

Contract:

* Holds whole windows (data events + their EOP), oldest first. Appending a
  window evicts whole windows from the head until it fits; ``prev_scn`` is then
  the SCN of the last evicted window.
* Continuity: the buffer holds every window after ``prev_scn``, so a checkpoint
  is servable when its SCN is at least ``prev_scn``; older ones raise
  :class:`ScnNotFoundError`. A buffer started without a known position
  (``prev_scn`` -1) cannot prove anything before its first window, so its
  ``floor_scn`` is that window's SCN: a consumer's checkpoint from before it is
  refused, never answered across a gap, unless the source declared where its
  history is complete (:meth:`EventBuffer.declare_origin`). A checkpoint above the newest window
  raises :class:`ScnAheadError` (naming both positions).
* Events are kept as bytes only (no Python object per event). Each window is
  contiguous: a window that does not fit before the end of the region starts
  again at offset 0 and ``limit`` marks where the valid data ended.
* A sparse SCN index holds at most one (scn, offset) entry per
  ``index_block`` bytes: the first window starting in that block. Lookups
  bisect it and then walk event headers (in C when the ``_select`` extension
  is built, :data:`databus.buffer.select.walk_windows`).
* One writer thread, any number of reader threads; readers copy bytes out
  under a short lock (:meth:`EventBuffer.read`), or take views of them
  (:meth:`EventBuffer.read_pinned`, a relay's answer sent without a copy).
* Consumers at the same position share one walk: :meth:`EventBuffer.read_pinned`
  remembers where its recent reads' data lies while that data is unchanged.
* Pinned reads: the views of a :class:`PinnedRead` stay valid until its
  :meth:`~PinnedRead.release`: the writer never evicts a window from the first
  one a pinned read holds. A writer that must evict it waits; after
  ``pin_grace`` seconds it calls the read's revoke callback (a server aborts
  the connection the views were written to, so they are never sent after an
  eviction) and waits for the release. Evicted bytes are never served.
* With a ``path`` the region is a memory-mapped file, recovered on open (see
  :mod:`databus.buffer.persist`).
"""

from __future__ import annotations

import logging
import mmap
import struct
import sys
import threading
from array import array
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from databus.buffer import select
from databus.buffer.persist import HEADER_SIZE, BufferFile, scan_windows
from databus.buffer.select import Selection, Span, compile_selection
from databus.core import event as ev
from databus.core.checkpoint import Checkpoint
from databus.core.errors import (
    BufferCorruptError,
    BufferFullError,
    ScnAheadError,
    ScnNotFoundError,
)
from databus.core.filters import ServerFilter
from databus.core.window import Window

log = logging.getLogger("databus.buffer")

_EOP = ev.SRC_EOP
_MAX_SCN = (1 << 63) - 1
# total length (offset 17) and source id (offset 31) of an event header
_LEN_SRC = struct.Struct(">17xi10xi")
assert _LEN_SRC.size == ev.OFF_SRC_ID + 4


@dataclass(frozen=True, slots=True)
class ReadResult:
    """What :meth:`EventBuffer.read` serves.

    ``partial`` is true when the data ends inside window ``partial_scn`` (it was
    larger than the byte budget); ``partial_count`` is then the next
    ``windowOffset``: selected data events of that window delivered so far,
    including those the checkpoint skipped.
    """

    data: bytes
    events: int
    data_events: int
    windows: int
    last_scn: int
    partial: bool = False
    partial_scn: int = -1
    partial_count: int = -1


# counts of a read besides its data: events, data_events, windows, last_scn, partial,
# partial_scn, partial_count (ReadResult's fields after data)
_Counts = tuple[int, int, int, int, bool, int, int]


class PinnedRead:
    """What :meth:`EventBuffer.read_pinned` serves: :class:`ReadResult`'s fields, the
    data as views of the buffer (``parts``, ``size`` bytes in all) instead of a copy.

    The views stay valid until :meth:`release` (see the module docstring): call it
    once they are no longer used, e.g. when the connection they were written to
    has sent them or is gone. :meth:`on_revoke` names what the writer calls (from
    its thread) when it has waited ``pin_grace`` seconds for the release.
    """

    __slots__ = ("_buffer", "_revoke", "_scn", "data_events", "events", "last_scn", "partial",
                 "partial_count", "partial_scn", "parts", "size", "windows")

    def __init__(self, buffer: EventBuffer | None, scn: int, parts: list[memoryview],
                 size: int, counts: _Counts) -> None:
        self._buffer, self._scn, self.parts, self.size = buffer, scn, parts, size
        (self.events, self.data_events, self.windows, self.last_scn, self.partial,
         self.partial_scn, self.partial_count) = counts
        self._revoke: Callable[[], None] | None = None

    def on_revoke(self, callback: Callable[[], None]) -> None:
        """``callback`` (thread-safe) makes the holder stop using the views soon and
        then release them; called at most once, from the writer's thread."""
        self._revoke = callback

    @property
    def held(self) -> bool:
        """Whether the views are still pinned."""
        return self._buffer is not None

    def release(self) -> None:
        """The views are no longer used: the writer may evict their windows (idempotent)."""
        buffer, self._buffer = self._buffer, None
        if buffer is not None:
            # dropped, not release()d: a view the caller passed on may still be referenced
            # (unused) by its holder, which release() would break
            self.parts = []
            buffer._unpin(self)


class EventBuffer:
    """A fixed-size buffer of windows. See the module docstring."""

    def __init__(self, capacity: int, *, path: Path | None = None, index_block: int = 16 * 1024,
                 start_scn: int = -1, recover: bool = False, pin_grace: float = 1.0) -> None:
        """``start_scn``: the position the source resumes after (every window after it
        will be appended), or -1 when unknown (see the module docstring).

        ``recover``: a persisted file whose windows fail validation is cut to its
        valid prefix (the rest must be read again from the source); without it the
        buffer refuses such a file with :class:`BufferCorruptError` and leaves it
        unchanged.

        ``pin_grace``: how long the writer waits for a pinned read that holds a
        window it must evict before it revokes that read (see the module docstring).
        """
        if capacity < 1024:
            raise ValueError("capacity must be at least 1024 bytes")
        self.capacity = capacity
        self._block = index_block
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._listeners: list[Callable[[], None]] = []
        self._pins: dict[PinnedRead, None] = {}
        self._unpinned = threading.Condition(self._lock)
        self.pin_grace = pin_grace
        self._close_pending = False
        # read_pinned's walks: (offset, skip, max_bytes, upto_scn) -> (its first
        # window's scn, the max_scn it holds for or -1: any, spans, counts)
        self._reads: dict[tuple[int, int, int, int | None],
                          tuple[int, int, list[tuple[int, int]], _Counts]] = {}
        self._ix_scn = array("q")
        self._ix_off = array("q")
        self._ix_first = 0  # entries before this are dead (compacted lazily)
        self._file: BufferFile | None = None
        self.recovered_from_corruption = False
        self.recovery_report = ""
        self._head = self._tail = self._limit = 0
        self._wrapped = False
        self._prev_scn = start_scn
        # where continuity is known to begin when prev_scn is -1 (declare_origin)
        self._origin: int | None = start_scn if start_scn >= 0 else None
        self._min_scn = self._max_scn = -1
        self._windows = self._events = 0
        self._evicted = self._appended = 0
        if path is None:
            # anonymous memory: pages are taken as the buffer fills, not all at start
            self._mem: bytearray | memoryview = memoryview(mmap.mmap(-1, capacity))
        else:
            self._file = BufferFile.open(path, capacity, start_scn)
            self._mem = self._file.data
            st = self._file.state
            self._head, self._tail, self._limit = st.head, st.tail, st.limit
            self._wrapped, self._prev_scn = st.wrapped, st.prev_scn
            try:
                self._recover(recover)
            except BaseException:
                self._file.close()
                raise
            if not self._windows and start_scn > self._prev_scn:
                # nothing recovered: the caller's recorded position is the better floor
                self._prev_scn = start_scn

    # -- properties ----------------------------------------------------------

    @property
    def prev_scn(self) -> int:
        return self._prev_scn

    @property
    def floor_scn(self) -> int:
        """The oldest servable checkpoint SCN (see the module docstring); -1 while a
        buffer without a known position holds nothing."""
        if self._prev_scn >= 0 or not self._windows:
            return self._prev_scn
        return self._origin if self._origin is not None else self._min_scn

    @property
    def origin_known(self) -> bool:
        """Whether the buffer knows where its continuity begins (see ``floor_scn``)."""
        return self._prev_scn >= 0 or self._origin is not None

    def declare_origin(self, scn: int) -> None:
        """The source delivers every change after ``scn`` into this buffer (-1: its
        whole history): checkpoints at or after it are servable. Only before the
        first window of a buffer without a known position."""
        with self._lock:
            if self._windows or self._prev_scn >= 0:
                raise ValueError("declare_origin after windows were stored")
            self._origin = scn

    @property
    def min_scn(self) -> int:
        return self._min_scn

    @property
    def max_scn(self) -> int:
        return self._max_scn if self._windows else self._prev_scn

    @property
    def pinned_reads(self) -> int:
        """Pinned reads not released yet (:meth:`read_pinned`)."""
        return len(self._pins)

    def stats(self) -> dict[str, int]:
        with self._lock:
            used = (self._limit - self._head + self._tail) if self._wrapped else (
                self._tail - self._head)
            return {"capacity": self.capacity, "used_bytes": used, "windows": self._windows,
                    "events": self._events, "min_scn": self._min_scn, "max_scn": self.max_scn,
                    "prev_scn": self._prev_scn, "evicted_windows": self._evicted,
                    "appended_windows": self._appended,
                    "index_entries": len(self._ix_scn) - self._ix_first}

    # -- walking ------------------------------------------------------------

    def _window_end(self, off: int) -> tuple[int, int]:
        """(offset after the window starting at ``off``, its data-event count)."""
        mem = self._mem
        walk = select.walk_windows
        if walk is not None:
            end, _w, n, _s = walk(mem, off, len(mem), sys.maxsize, _MAX_SCN, 1)
            return end, n
        # without the extension: one struct call per event, names bound locally
        unpack = _LEN_SRC.unpack_from
        n = 0
        length, src = unpack(mem, off)
        while src != _EOP:
            off += length
            n += 1
            length, src = unpack(mem, off)
        return off + length, n

    def _segment_end(self, off: int) -> int:
        """Where the contiguous data holding ``off`` ends: ``limit`` for the windows
        before the wrap, else ``tail``."""
        return self._limit if self._wrapped and off >= self._head else self._tail

    def _after_window(self, end: int) -> int:
        if self._wrapped and end == self._limit and end != self._tail:
            return 0
        return end

    # -- writing -------------------------------------------------------------

    def add_listener(self, callback: Callable[[], None]) -> None:
        self._listeners.append(callback)

    def append_window(self, window: Window) -> None:
        """Append a window and its EOP, evicting whole old windows as needed."""
        if self._windows and window.scn <= self._max_scn:
            raise ValueError(f"window scn {window.scn} not above max scn {self._max_scn}")
        eop = ev.encode_eop(window.scn, window.timestamp_ns)
        size = len(window.events) + len(eop)
        if size > self.capacity:
            raise BufferFullError(
                f"window {window.scn} is {size} bytes, larger than the buffer ({self.capacity});"
                " raise buffer.capacity_bytes")
        with self._cond:
            pos = self._make_room(size)
            self._mem[pos : pos + len(window.events)] = window.events
            self._mem[pos + len(window.events) : pos + size] = eop
            self._tail = pos + size
            if not self._wrapped:
                self._limit = self._tail
            if (len(self._ix_off) == self._ix_first
                    or pos // self._block != self._ix_off[-1] // self._block
                    or pos < self._ix_off[-1]):
                self._ix_scn.append(window.scn)
                self._ix_off.append(pos)
            if not self._windows:
                self._min_scn = window.scn
            self._max_scn = window.scn
            self._windows += 1
            self._events += window.count
            self._appended += 1
            self._save_state()
            self._cond.notify_all()
        for cb in self._listeners:
            cb()

    def _make_room(self, size: int) -> int:
        """Evict until ``size`` bytes fit; returns where the window goes."""
        while True:
            if not self._windows:
                self._head = self._tail = self._limit = 0
                self._wrapped = False
                return 0
            if not self._wrapped:
                if self._tail + size <= self.capacity:
                    return self._tail
                # wrap: the data so far ends at limit; the window goes to 0
                self._limit = self._tail
                self._wrapped = True
                self._tail = 0
            if self._tail + size <= self._head:
                return self._tail
            if self._pins:
                self._wait_unpinned()
            self._evict_one()

    def _wait_unpinned(self) -> None:
        """Before the head window is evicted (lock held): wait until no pinned read
        holds it, revoking the reads that hold it after ``pin_grace`` seconds."""
        head = ev.peek_scn(self._mem, self._head)
        revoked: set[PinnedRead] = set()
        while True:
            holding = [p for p in self._pins if p._scn <= head]
            if not holding:
                return
            if self._unpinned.wait(self.pin_grace):
                continue  # a release: look again
            for pin in holding:
                if pin not in revoked:
                    revoked.add(pin)
                    if pin._revoke is not None:
                        log.warning("buffer: a reader held window %d for %.1f s; revoking it so"
                                    " the writer can go on", head, self.pin_grace)
                        pin._revoke()
                    else:
                        log.warning("buffer: a reader held window %d for %.1f s and cannot be"
                                    " revoked; the writer waits for its release", head,
                                    self.pin_grace)

    def _unpin(self, pin: PinnedRead) -> None:
        with self._lock:
            self._pins.pop(pin, None)
            self._unpinned.notify_all()
            if self._close_pending and not self._pins:
                try:
                    self._close_file()
                except BufferError:  # a view is still referenced: unmapped when it goes
                    log.warning("buffer: file closed with views of it still referenced")

    def _evict_one(self) -> None:
        end, n = self._window_end(self._head)
        self._prev_scn = ev.peek_scn(self._mem, self._head)
        self._windows -= 1
        self._events -= n
        self._evicted += 1
        nxt = self._after_window(end)
        if self._wrapped and nxt == 0:
            self._wrapped = False
            self._limit = self._tail
        self._head = nxt
        self._min_scn = ev.peek_scn(self._mem, self._head) if self._windows else -1
        # drop index entries of evicted windows
        while self._ix_first < len(self._ix_scn) and self._ix_scn[self._ix_first] <= self._prev_scn:
            self._ix_first += 1
        if self._ix_first > 1024 and self._ix_first * 2 > len(self._ix_scn):
            del self._ix_scn[: self._ix_first]
            del self._ix_off[: self._ix_first]
            self._ix_first = 0

    def _save_state(self) -> None:
        if self._file is not None:
            self._file.write_state(self._head, self._tail, self._limit, self._wrapped,
                                   self._prev_scn)

    # -- reading -------------------------------------------------------------

    def _find(self, scn: int) -> int:
        """Offset of the first window whose SCN is >= ``scn`` (-1 if none)."""
        lo = self._ix_first
        i = bisect_right(self._ix_scn, scn, lo) - 1
        off = self._head if i < lo else self._ix_off[i]
        mem = self._mem
        walk = select.walk_windows
        while True:
            found = ev.peek_scn(mem, off)
            if found >= scn:
                return off
            if found >= self._max_scn:  # walked the newest window: the end of the data
                return -1
            if walk is None:
                end, _ = self._window_end(off)
            else:  # every window before scn up to the wrap (or the end) in one call
                end, _w, _n, found = walk(mem, off, self._segment_end(off), sys.maxsize,
                                          scn - 1, sys.maxsize)
                if found >= self._max_scn:
                    return -1
            off = self._after_window(end)

    def read(self, checkpoint: Checkpoint, max_bytes: int, *,
             sources: frozenset[int] | None = None,
             filter: ServerFilter | None = None,
             upto_scn: int | None = None) -> ReadResult:
        """Windows after ``checkpoint`` within ``max_bytes`` (see :class:`ReadResult`);
        with ``upto_scn``, none past that SCN (a cluster's replicated windows only)."""
        with self._lock:
            start, skip = self._start(checkpoint)
            if start < 0:
                return ReadResult(b"", 0, 0, 0, -1)
            compiled = (compile_selection(sources, filter)
                        if sources is not None or filter is not None else None)
            if compiled is not None:
                return self._read_selected(start, skip, max_bytes, compiled, upto_scn)
            out, counts = self._collect(start, skip, max_bytes, sources, filter, upto_scn)
            # the one copy, under the lock
            mv = memoryview(self._mem)
            return ReadResult(b"".join([mv[a:b] for a, b in out]), *counts)

    def _read_selected(self, off: int, skip: int, max_bytes: int, compiled: Selection,
                       upto_scn: int | None) -> ReadResult:
        """:meth:`read` with a compiled selection (lock held): the windows selected and
        copied out in one call up to the wrap (or the end), no Python object per event,
        span of events or window."""
        mem = self._mem
        chunks: list[bytes] = []
        used = kept_events = windows = 0
        last_scn = -1
        max_scn = self._max_scn if upto_scn is None else min(self._max_scn, upto_scn)
        while True:
            data, end, n, kept, last = compiled.windows(mem, off, self._segment_end(off), skip,
                                                        max_bytes - used, max_scn)
            if data is not None:
                chunks.append(data)
                used += len(data)
                kept_events += kept
                windows += n
                last_scn = last
                skip = 0
                off = self._after_window(end)
                if off == 0 and end != 0:
                    continue  # the data goes on at the start of the region
                break  # the newest window, the budget or upto_scn ends the read
            scn = ev.peek_scn(mem, off)
            if windows or scn > max_scn:
                break
            # the first window alone is too large: serve a prefix, at least one event
            spans, _eop, _n = compiled.window(mem, off, skip)
            out, counts = self._prefix(spans, skip, max_bytes, scn)
            mv = memoryview(mem)
            return ReadResult(b"".join([mv[a:b] for a, b in out]), *counts)
        return ReadResult(chunks[0] if len(chunks) == 1 else b"".join(chunks),
                          kept_events + windows, kept_events, windows, last_scn)

    def read_pinned(self, checkpoint: Checkpoint, max_bytes: int, *,
                    upto_scn: int | None = None) -> PinnedRead:
        """As :meth:`read` (no selection), the data as pinned views of the buffer
        (:class:`PinnedRead`; release it)."""
        with self._lock:
            start, skip = self._start(checkpoint)
            if start < 0:
                return PinnedRead(None, -1, [], 0, (0, 0, 0, -1, False, -1, -1))
            first = ev.peek_scn(self._mem, start)
            key = (start, skip, max_bytes, upto_scn)
            known = self._reads.get(key)
            if known is not None and known[0] == first and (known[1] < 0
                                                            or known[1] == self._max_scn):
                spans, counts = known[2], known[3]
            else:
                spans, counts = self._collect(start, skip, max_bytes, None, None, upto_scn)
                self._remember(key, first, spans, counts)
            if not spans:
                return PinnedRead(None, -1, [], 0, counts)
            mv = memoryview(self._mem)
            pin = PinnedRead(self, first, [mv[a:b] for a, b in spans],
                             sum(b - a for a, b in spans), counts)
            self._pins[pin] = None
            return pin

    def forget_reads(self) -> None:
        """Drop what :meth:`read_pinned` remembers of earlier reads (a benchmark run
        that must not reuse an earlier run's walks)."""
        with self._lock:
            self._reads.clear()

    def _remember(self, key: tuple[int, int, int, int | None], first: int,
                  spans: list[tuple[int, int]], counts: _Counts) -> None:
        """Keep where a pinned read's data lies: consumers at the same position (a
        fan-out) then share one walk of the windows. An entry is used again while
        the read's first window (``first``, at ``key``'s offset) is held, which keeps
        it and every later window as they were; a read that ended at the newest
        window only while no window was appended (which could extend it)."""
        if len(self._reads) >= 256:
            self._reads.clear()
        growing = not counts[4] and counts[3] == self._max_scn
        self._reads[key] = (first, self._max_scn if growing else -1, spans, counts)

    def _start(self, checkpoint: Checkpoint) -> tuple[int, int]:
        """(offset of the first window to serve, data events of it to skip); -1 when
        there is nothing after ``checkpoint``. Raises what :meth:`read` raises."""
        if not checkpoint.is_flexible:
            if checkpoint.window_scn < self.floor_scn:
                raise self._not_found(checkpoint)
            newest = self.max_scn  # the newest window, or prev_scn when empty
            if checkpoint.window_scn > newest and (self._windows or newest >= 0):
                raise ScnAheadError(
                    f"checkpoint scn {checkpoint.window_scn} is ahead of this relay"
                    f" (newest window: scn {newest}); the relay may still be catching up"
                    " with its source, or the checkpoint belongs to another source",
                    checkpoint_scn=checkpoint.window_scn, relay_scn=newest)
        if not self._windows:
            return -1, 0
        skip = 0
        if checkpoint.is_flexible:
            start = self._head
        elif checkpoint.in_window:
            start = self._find(checkpoint.window_scn)
            if start < 0 or ev.peek_scn(self._mem, start) != checkpoint.window_scn:
                raise ScnNotFoundError(
                    f"window {checkpoint.window_scn} of the checkpoint is not in the buffer")
            skip = checkpoint.window_offset
        else:
            start = self._find(checkpoint.window_scn + 1)
        return start, skip

    def _not_found(self, cp: Checkpoint) -> ScnNotFoundError:
        return ScnNotFoundError(
            f"checkpoint scn {cp.window_scn} is older than the relay's buffer (oldest servable:"
            f" scn {self.floor_scn}); the consumer must bootstrap")

    def _collect(self, off: int, skip: int, max_bytes: int, sources: frozenset[int] | None,
                 filt: ServerFilter | None, upto_scn: int | None = None,
                 ) -> tuple[list[tuple[int, int]], _Counts]:
        """The data (spans of the buffer) and counts of a read from ``off``."""
        mem = self._mem
        out: list[tuple[int, int]] = []  # (start, end) spans of the buffer
        used = events = data_events = windows = 0
        last_scn = -1
        selective = sources is not None or filt is not None
        max_scn = self._max_scn if upto_scn is None else min(self._max_scn, upto_scn)
        walk = select.walk_windows if not selective else None
        while last_scn < max_scn:
            if walk is not None and not skip:
                # whole windows, up to the wrap, in one call: one slice of the buffer
                end, n_windows, n_data, last = walk(mem, off, self._segment_end(off),
                                                    max_bytes - used, max_scn, sys.maxsize)
                if n_windows:
                    out.append((off, end))
                    used += end - off
                    events += n_data + n_windows
                    data_events += n_data
                    windows += n_windows
                    last_scn = last
                    off = self._after_window(end)
                    if off == 0 and end != 0:
                        continue  # the data goes on at the start of the region
                    break  # the newest window, the budget or upto_scn ends the read
                # nothing taken: the first window is past upto_scn or alone too large
            scn = ev.peek_scn(mem, off)
            if scn > max_scn:
                break
            end, _n = self._window_end(off)
            if not selective and not skip:
                size = end - off
                if used + size <= max_bytes:
                    out.append((off, end))
                    used += size
                    events += _n + 1
                    data_events += _n
                    windows += 1
                    last_scn = scn
                    off = self._after_window(end)
                    continue
            # a window served event by event (selection, offset, or too big)
            parts: list[tuple[int, int]] = []
            size = 0
            count = 0  # selected data events of this window, skipped ones included
            p = off
            while ev.peek_src_id(mem, p) != _EOP:
                length = ev.peek_length(mem, p)
                sid = ev.peek_src_id(mem, p)
                keep = (sources is None or sid in sources) and (
                    filt is None or filt.matches(sid, ev.peek_key(mem, p)))
                if keep:
                    count += 1
                    if count > skip:
                        parts.append((p, p + length))
                        size += length
                p += length
            eop_len = ev.peek_length(mem, p)
            if used + size + eop_len <= max_bytes:
                out.extend(parts)
                out.append((p, p + eop_len))
                used += size + eop_len
                events += len(parts) + 1
                data_events += len(parts)
                windows += 1
                last_scn = scn
                skip = 0
                off = self._after_window(end)
                continue
            if windows:  # whole windows already fill the budget
                break
            # the first window alone is too large: serve a prefix, at least one event
            taken = 0
            for part in parts:
                if taken and used + part[1] - part[0] > max_bytes:
                    break
                out.append(part)
                used += part[1] - part[0]
                taken += 1
            return out, (taken, taken, 0, -1, True, scn, skip + taken)
        return out, (events, data_events, windows, last_scn, False, -1, -1)

    def _prefix(self, spans: list[Span], skip: int, max_bytes: int, scn: int,
                ) -> tuple[list[tuple[int, int]], _Counts]:
        """A window larger than the budget: its first selected events (at least one)."""
        mem = self._mem
        out: list[tuple[int, int]] = []
        used = taken = 0
        for start, end, _count in spans:
            q = start
            while q < end:
                length = ev.peek_length(mem, q)
                if taken and used + length > max_bytes:
                    return out, (taken, taken, 0, -1, True, scn, skip + taken)
                out.append((q, q + length))
                used += length
                taken += 1
                q += length
        return out, (taken, taken, 0, -1, True, scn, skip + taken)

    def wait_for(self, scn: int, timeout: float) -> bool:
        """Block until a window newer than ``scn`` is held, or ``timeout``."""
        with self._cond:
            return self._cond.wait_for(lambda: self.max_scn > scn, timeout)

    # -- lifecycle -----------------------------------------------------------

    def flush(self) -> None:
        if self._file is not None:
            with self._lock:
                self._file.flush()

    def __enter__(self) -> EventBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the file (if any). Pinned reads keep their views: the file is closed
        at the last release, and every pinned read is revoked now."""
        if self._file is not None:
            with self._lock:
                if self._pins:
                    self._close_pending = True
                    for pin in self._pins:
                        if pin._revoke is not None:
                            pin._revoke()
                    return
                self._close_file()

    def _close_file(self) -> None:
        if self._file is not None:
            self._mem = bytearray(0)
            self._file.close()
            self._file = None

    # -- recovery ------------------------------------------------------------

    def _recover(self, allowed: bool) -> None:
        """Rebuild counters and the index from the file; a damaged window is refused
        (file unchanged) unless ``allowed``, which keeps the valid prefix."""
        found = scan_windows(self._mem, self._head, self._tail, self._limit, self._wrapped,
                             self._prev_scn)
        if found.corrupt and not allowed:
            assert self._file is not None
            raise BufferCorruptError(
                f"buffer file {self._file.path} is damaged ({found.report}); refusing to"
                " start. Start the relay with buffer.recover: true in its config to keep"
                " the valid windows and read the rest again from the source, or move the file"
                " aside to start empty (consumers behind the source position then get"
                " ScnNotFound and bootstrap)")
        self.recovered_from_corruption = found.corrupt
        self.recovery_report = found.report
        if not found.windows:
            self._head = self._tail = self._limit = 0
            self._wrapped = False
        else:
            self._tail = found.end
            if self._wrapped and found.end > self._head and found.ended_before_wrap:
                self._wrapped = False
            if not self._wrapped:
                self._limit = self._tail
        for scn, off, n in found.windows:
            if (len(self._ix_off) == 0 or off // self._block != self._ix_off[-1] // self._block
                    or off < self._ix_off[-1]):
                self._ix_scn.append(scn)
                self._ix_off.append(off)
            self._events += n
        self._windows = len(found.windows)
        if found.windows:
            self._min_scn = found.windows[0][0]
            self._max_scn = found.windows[-1][0]
        self._save_state()


__all__ = ["HEADER_SIZE", "EventBuffer", "PinnedRead", "ReadResult"]
