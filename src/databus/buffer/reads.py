"""What a read takes from the buffer's region: the walks behind
:meth:`EventBuffer.read <databus.buffer.ring.EventBuffer.read>` and
:meth:`~databus.buffer.ring.EventBuffer.read_pinned`.

Contract (the caller holds the buffer's lock; ``off`` is where the first window to
serve starts, ``skip`` how many of its selected data events the checkpoint already
consumed):

* Whole windows are taken in order while they fit in ``max_bytes`` together, none
  past ``upto_scn``; a window is served with its EOP, and only its selected data
  events (``sources``, then the server-side filter), so a selection that keeps no
  event of a window still serves its EOP.
* A first window alone larger than ``max_bytes`` is served in part: its first
  selected events, at least one, and the counts say ``partial`` (see
  :mod:`databus.buffer.results`).
* Without a selection the data are spans of the region (one per run of adjacent
  windows up to the wrap), walked in C when the ``_select`` extension is built; with
  a compiled selection (:func:`~databus.buffer.select.compile_selection`) the kept
  events are copied out in one call per run. The Python walk gives the same answer.
"""

from __future__ import annotations

import sys

from databus.buffer import select
from databus.buffer.region import EOP, Region
from databus.buffer.results import Counts, ReadResult
from databus.buffer.select import Selection, Span
from databus.core import event as ev
from databus.core.filters import ServerFilter

Spans = list[tuple[int, int]]
"""``(start, end)`` slices of the region, in the order served."""


def read_selected(r: Region, off: int, skip: int, max_bytes: int, compiled: Selection,
                  upto_scn: int | None) -> ReadResult:
    """A read with a compiled selection: the windows selected and copied out in one
    call up to the wrap (or the end), no Python object per event, span of events or
    window."""
    mem = r.mem
    chunks: list[bytes] = []
    used = kept_events = windows = 0
    last_scn = -1
    max_scn = r.max_scn if upto_scn is None else min(r.max_scn, upto_scn)
    while True:
        data, end, n, kept, last = compiled.windows(mem, off, r.segment_end(off), skip,
                                                    max_bytes - used, max_scn)
        if data is not None:
            chunks.append(data)
            used += len(data)
            kept_events += kept
            windows += n
            last_scn = last
            skip = 0
            off = r.after_window(end)
            if off == 0 and end != 0:
                continue  # the data goes on at the start of the region
            break  # the newest window, the budget or upto_scn ends the read
        scn = ev.peek_scn(mem, off)
        if windows or scn > max_scn:
            break
        # the first window alone is too large: serve a prefix, at least one event
        spans, _eop, _n = compiled.window(mem, off, skip)
        out, counts = _prefix(r, spans, skip, max_bytes, scn)
        return ReadResult(copy(r, out), *counts)
    return ReadResult(chunks[0] if len(chunks) == 1 else b"".join(chunks),
                      kept_events + windows, kept_events, windows, last_scn)


def copy(r: Region, spans: Spans) -> bytes:
    """The bytes of ``spans``, in one copy."""
    mv = memoryview(r.mem)
    return b"".join([mv[a:b] for a, b in spans])


def collect(r: Region, off: int, skip: int, max_bytes: int, sources: frozenset[int] | None,
            filt: ServerFilter | None, upto_scn: int | None = None) -> tuple[Spans, Counts]:
    """The data (spans of the region) and counts of a read from ``off``."""
    mem = r.mem
    out: Spans = []
    used = events = data_events = windows = 0
    last_scn = -1
    selective = sources is not None or filt is not None
    max_scn = r.max_scn if upto_scn is None else min(r.max_scn, upto_scn)
    walk = select.walk_windows if not selective else None
    while last_scn < max_scn:
        if walk is not None and not skip:
            # whole windows, up to the wrap, in one call: one slice of the buffer
            end, n_windows, n_data, last = walk(mem, off, r.segment_end(off),
                                                max_bytes - used, max_scn, sys.maxsize)
            if n_windows:
                out.append((off, end))
                used += end - off
                events += n_data + n_windows
                data_events += n_data
                windows += n_windows
                last_scn = last
                off = r.after_window(end)
                if off == 0 and end != 0:
                    continue  # the data goes on at the start of the region
                break  # the newest window, the budget or upto_scn ends the read
            # nothing taken: the first window is past upto_scn or alone too large
        scn = ev.peek_scn(mem, off)
        if scn > max_scn:
            break
        end, _n = r.window_end(off)
        if not selective and not skip:
            size = end - off
            if used + size <= max_bytes:
                out.append((off, end))
                used += size
                events += _n + 1
                data_events += _n
                windows += 1
                last_scn = scn
                off = r.after_window(end)
                continue
        # a window served event by event (selection, offset, or too big)
        parts: Spans = []
        size = 0
        count = 0  # selected data events of this window, skipped ones included
        p = off
        while ev.peek_src_id(mem, p) != EOP:
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
            off = r.after_window(end)
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


def _prefix(r: Region, spans: list[Span], skip: int, max_bytes: int, scn: int,
            ) -> tuple[Spans, Counts]:
    """A window larger than the budget: its first selected events (at least one)."""
    mem = r.mem
    out: Spans = []
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
