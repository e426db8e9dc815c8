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
* Events are kept as bytes only (no Python object per event), each window
  contiguous, in a circular region with a sparse SCN index of at most one entry
  per ``index_block`` bytes (:mod:`databus.buffer.region`). What a read takes from
  it, and how a selection or a byte budget cuts it, is :mod:`databus.buffer.reads`;
  what it answers, :mod:`databus.buffer.results`.
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
import threading
from collections.abc import Callable
from pathlib import Path

from databus.buffer.persist import BufferFile, scan_windows
from databus.buffer.reads import collect, copy, read_selected
from databus.buffer.region import Region
from databus.buffer.results import Counts, PinnedRead, ReadResult
from databus.buffer.select import compile_selection
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
                          tuple[int, int, list[tuple[int, int]], Counts]] = {}
        self._file: BufferFile | None = None
        self.recovered_from_corruption = False
        self.recovery_report = ""
        # where continuity is known to begin when prev_scn is -1 (declare_origin)
        self._origin: int | None = start_scn if start_scn >= 0 else None
        if path is None:
            # anonymous memory: pages are taken as the buffer fills, not all at start
            self._r = Region(memoryview(mmap.mmap(-1, capacity)), index_block,
                             prev_scn=start_scn)
        else:
            self._file = BufferFile.open(path, capacity, start_scn)
            st = self._file.state
            self._r = Region(self._file.data, index_block, head=st.head, tail=st.tail,
                             limit=st.limit, wrapped=st.wrapped, prev_scn=st.prev_scn)
            try:
                self._recover(recover)
            except BaseException:  # not started: the file is closed, the error goes on
                self._file.close()
                raise
            if not self._r.windows and start_scn > self._r.prev_scn:
                # nothing recovered: the caller's recorded position is the better floor
                self._r.prev_scn = start_scn

    # -- properties ----------------------------------------------------------

    @property
    def prev_scn(self) -> int:
        return self._r.prev_scn

    @property
    def floor_scn(self) -> int:
        """The oldest servable checkpoint SCN (see the module docstring); -1 while a
        buffer without a known position holds nothing."""
        r = self._r
        if r.prev_scn >= 0 or not r.windows:
            return r.prev_scn
        return self._origin if self._origin is not None else r.min_scn

    @property
    def origin_known(self) -> bool:
        """Whether the buffer knows where its continuity begins (see ``floor_scn``)."""
        return self._r.prev_scn >= 0 or self._origin is not None

    def declare_origin(self, scn: int) -> None:
        """The source delivers every change after ``scn`` into this buffer (-1: its
        whole history): checkpoints at or after it are servable. Only before the
        first window of a buffer without a known position."""
        with self._lock:
            if self._r.windows or self._r.prev_scn >= 0:
                raise ValueError("declare_origin after windows were stored")
            self._origin = scn

    @property
    def min_scn(self) -> int:
        return self._r.min_scn

    @property
    def max_scn(self) -> int:
        r = self._r
        return r.max_scn if r.windows else r.prev_scn

    @property
    def pinned_reads(self) -> int:
        """Pinned reads not released yet (:meth:`read_pinned`)."""
        return len(self._pins)

    def stats(self) -> dict[str, int]:
        with self._lock:
            r = self._r
            return {"capacity": self.capacity, "used_bytes": r.used, "windows": r.windows,
                    "events": r.events, "min_scn": r.min_scn, "max_scn": self.max_scn,
                    "prev_scn": r.prev_scn, "evicted_windows": r.evicted,
                    "appended_windows": r.appended, "index_entries": r.index_entries}

    # -- writing -------------------------------------------------------------

    def add_listener(self, callback: Callable[[], None]) -> None:
        self._listeners.append(callback)

    def append_window(self, window: Window) -> None:
        """Append a window and its EOP, evicting whole old windows as needed."""
        r = self._r
        if r.windows and window.scn <= r.max_scn:
            raise ValueError(f"window scn {window.scn} not above max scn {r.max_scn}")
        eop = ev.encode_eop(window.scn, window.timestamp_ns)
        size = len(window.events) + len(eop)
        if size > self.capacity:
            raise BufferFullError(
                f"window {window.scn} is {size} bytes, larger than the buffer ({self.capacity});"
                " raise buffer.capacity_bytes")
        with self._cond:
            pos = r.make_room(size, self._before_evict)
            r.put(pos, window.events, eop, window.scn, window.count)
            self._save_state()
            self._cond.notify_all()
        for cb in self._listeners:
            cb()

    def _before_evict(self) -> None:
        """Before the head window is evicted (lock held): wait until no pinned read
        holds it, revoking the reads that hold it after ``pin_grace`` seconds."""
        if not self._pins:
            return
        head = ev.peek_scn(self._r.mem, self._r.head)
        revoked: set[PinnedRead] = set()
        while True:
            holding = [p for p in self._pins if p.first_scn <= head]
            if not holding:
                return
            if self._unpinned.wait(self.pin_grace):
                continue  # a release: look again
            for pin in holding:
                if pin not in revoked:
                    revoked.add(pin)
                    if pin.revoke():
                        log.warning("buffer: a reader held window %d for %.1f s; revoked it so"
                                    " the writer can go on", head, self.pin_grace)
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

    def _save_state(self) -> None:
        if self._file is not None:
            r = self._r
            self._file.write_state(r.head, r.tail, r.limit, r.wrapped, r.prev_scn)

    # -- reading -------------------------------------------------------------

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
                return read_selected(self._r, start, skip, max_bytes, compiled, upto_scn)
            out, counts = collect(self._r, start, skip, max_bytes, sources, filter, upto_scn)
            return ReadResult(copy(self._r, out), *counts)  # the one copy, under the lock

    def read_pinned(self, checkpoint: Checkpoint, max_bytes: int, *,
                    upto_scn: int | None = None) -> PinnedRead:
        """As :meth:`read` (no selection), the data as pinned views of the buffer
        (:class:`PinnedRead`; release it)."""
        with self._lock:
            r = self._r
            start, skip = self._start(checkpoint)
            if start < 0:
                return PinnedRead(None, -1, [], 0, (0, 0, 0, -1, False, -1, -1))
            first = ev.peek_scn(r.mem, start)
            key = (start, skip, max_bytes, upto_scn)
            known = self._reads.get(key)
            if known is not None and known[0] == first and (known[1] < 0
                                                            or known[1] == r.max_scn):
                spans, counts = known[2], known[3]
            else:
                spans, counts = collect(r, start, skip, max_bytes, None, None, upto_scn)
                self._remember(key, first, spans, counts)
            if not spans:
                return PinnedRead(None, -1, [], 0, counts)
            mv = memoryview(r.mem)
            pin = PinnedRead(self._unpin, first, [mv[a:b] for a, b in spans],
                             sum(b - a for a, b in spans), counts)
            self._pins[pin] = None
            return pin

    def forget_reads(self) -> None:
        """Drop what :meth:`read_pinned` remembers of earlier reads (a benchmark run
        that must not reuse an earlier run's walks)."""
        with self._lock:
            self._reads.clear()

    def _remember(self, key: tuple[int, int, int, int | None], first: int,
                  spans: list[tuple[int, int]], counts: Counts) -> None:
        """Keep where a pinned read's data lies: consumers at the same position (a
        fan-out) then share one walk of the windows. An entry is used again while
        the read's first window (``first``, at ``key``'s offset) is held, which keeps
        it and every later window as they were; a read that ended at the newest
        window only while no window was appended (which could extend it)."""
        if len(self._reads) >= 256:
            self._reads.clear()
        growing = not counts[4] and counts[3] == self._r.max_scn
        self._reads[key] = (first, self._r.max_scn if growing else -1, spans, counts)

    def _start(self, checkpoint: Checkpoint) -> tuple[int, int]:
        """(offset of the first window to serve, data events of it to skip); -1 when
        there is nothing after ``checkpoint``. Raises what :meth:`read` raises."""
        r = self._r
        if not checkpoint.is_flexible:
            if checkpoint.window_scn < self.floor_scn:
                raise self._not_found(checkpoint)
            newest = self.max_scn  # the newest window, or prev_scn when empty
            if checkpoint.window_scn > newest and (r.windows or newest >= 0):
                raise ScnAheadError(
                    f"checkpoint scn {checkpoint.window_scn} is ahead of this relay"
                    f" (newest window: scn {newest}); the relay may still be catching up"
                    " with its source, or the checkpoint belongs to another source",
                    checkpoint_scn=checkpoint.window_scn, relay_scn=newest)
        if not r.windows:
            return -1, 0
        skip = 0
        if checkpoint.is_flexible:
            start = r.head
        elif checkpoint.in_window:
            start = r.find(checkpoint.window_scn)
            if start < 0 or ev.peek_scn(r.mem, start) != checkpoint.window_scn:
                raise ScnNotFoundError(
                    f"window {checkpoint.window_scn} of the checkpoint is not in the buffer")
            skip = checkpoint.window_offset
        else:
            start = r.find(checkpoint.window_scn + 1)
        return start, skip

    def _not_found(self, cp: Checkpoint) -> ScnNotFoundError:
        return ScnNotFoundError(
            f"checkpoint scn {cp.window_scn} is older than the relay's buffer (oldest servable:"
            f" scn {self.floor_scn}); the consumer must bootstrap")

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
                        pin.revoke()
                    return
                self._close_file()

    def _close_file(self) -> None:
        if self._file is not None:
            self._r.mem = bytearray(0)
            self._file.close()
            self._file = None

    # -- recovery ------------------------------------------------------------

    def _recover(self, allowed: bool) -> None:
        """Rebuild counters and the index from the file; a damaged window is refused
        (file unchanged) unless ``allowed``, which keeps the valid prefix."""
        r = self._r
        found = scan_windows(r.mem, r.head, r.tail, r.limit, r.wrapped, r.prev_scn)
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
        r.adopt(found)
        self._save_state()


__all__ = ["EventBuffer", "PinnedRead", "ReadResult"]
