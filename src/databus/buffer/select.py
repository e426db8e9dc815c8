"""Which events of a buffered window a read selects, compiled when possible.

:data:`walk_windows` walks whole windows in C for reads without a selection
(see its docstring); None without the extension, and the buffer walks event
headers in Python (same result, slower).

:func:`compile_selection` turns a read's source ids and server-side filter
into a :class:`Selection` backed by the optional C extension ``_select``
(built by setup.py where a C compiler and zlib's headers exist). It keeps
exactly the events the Python path of :func:`databus.buffer.reads.collect` keeps (source id in ``sources``,
then :meth:`ServerFilter.matches <databus.core.filters.ServerFilter.matches>`),
without a Python object per event: :meth:`Selection.windows` copies the kept
events of a read's windows out in one call (without a Python object per span
or window either).
Without the extension it returns None and the buffer selects event by event
in Python (same result, slower).

:func:`newest` reduces a read's data to each key's last event (compiled when
possible, :func:`newest_python` its twin).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from databus.core import event as ev
from databus.core.filters import ServerFilter

try:
    from databus.buffer import _select  # type: ignore[attr-defined]
except ImportError:  # not built: the Python path only
    _select = None

WalkWindows = Callable[[bytes | bytearray | memoryview, int, int, int, int, int],
                       tuple[int, int, int, int]]
walk_windows: WalkWindows | None = None if _select is None else _select.walk_windows
"""``walk_windows(mem, off, stop, max_bytes, max_scn, max_windows)`` ->
``(end, windows, data_events, last_scn)``: the whole windows starting at ``off``,
each ending at or before ``stop``, each with an SCN <= ``max_scn``, taken while
they fit in ``max_bytes`` together, at most ``max_windows``; ``end`` is where the
last taken one ends (``off``, and ``last_scn`` -1, when none was). An event header
that leaves ``mem`` or ``stop`` raises ValueError."""

ScanWindows = Callable[[bytes | bytearray | memoryview, int, int, int],
                       tuple[list[tuple[int, int, int]], int, str | None]]
scan_windows: ScanWindows | None = None if _select is None else _select.scan_windows
"""``scan_windows(mem, start, stop, last_scn)`` -> ``(windows, end, error)``: the
valid windows ``(scn, offset, data_events)`` from ``start`` up to ``stop`` (both CRCs
of every event checked, SCNs rising above ``last_scn``, one SCN per window); ``error``
is None when all of it is valid, else why the window at ``end`` is not (the
:func:`databus.buffer.persist.scan_windows` recovery, compiled)."""

Span = tuple[int, int, int]
"""``(start, end, events)``: adjacent selected events of a window."""


def available() -> bool:
    """Whether the compiled selection was built."""
    return _select is not None


@dataclass(frozen=True, slots=True)
class Selection:
    """A compiled (sources, filter) pair; see :func:`compile_selection`."""

    sources: tuple[int, ...] | None
    filters: tuple[tuple[int, int, int, tuple[tuple[int, int], ...]], ...]

    def window(self, mem: bytes | bytearray | memoryview, off: int,
               skip: int = 0) -> tuple[list[Span], int, int]:
        """The selected spans of the window at ``off`` (without its first ``skip``
        selected events), its EOP's offset, its data events."""
        spans, eop, total = _select.select_window(mem, off, self.sources, self.filters, skip)
        return spans, eop, total

    def windows(self, mem: bytes | bytearray | memoryview, off: int, stop: int, skip: int,
                max_bytes: int, max_scn: int) -> tuple[bytes | None, int, int, int, int]:
        """The whole windows from ``off``, none reaching past ``stop``, each with an SCN
        <= ``max_scn``, selected as :meth:`window` selects them (the first without its
        first ``skip`` selected events), taken while their kept events and EOPs fit in
        ``max_bytes`` together: ``(data, end, windows, kept, last_scn)``, ``data`` those
        events and EOPs copied out in one call (None when no window was taken), ``end``
        where the last taken window ends (``off`` for none), ``kept`` the data events in
        ``data``. No Python object per event, span or window."""
        data, end, windows, kept, last_scn = _select.select_windows(
            mem, off, stop, self.sources, self.filters, skip, max_bytes, max_scn)
        return data, end, windows, kept, last_scn


def compile_selection(sources: frozenset[int] | None,
                      filt: ServerFilter | None) -> Selection | None:
    """The compiled selection, or None when the extension is not built."""
    if _select is None:
        return None
    filters = tuple(
        (src, 1 if f.partition_type == "MOD" else 0, f.num_buckets, f.ranges)
        for src, f in (filt.by_source.items() if filt is not None else ()))
    return Selection(None if sources is None else tuple(sorted(sources)), filters)


def newest(data: bytes) -> tuple[bytes, int]:
    """``data`` (whole windows of events, as a selected read copies them out) without
    the data events whose (source id, key) has a later event in ``data``: control events
    (EOPs) and truncates stay in place, so do each key's last event, and before a kept
    data event that follows left-out ones of its window goes a ``SRC_DROPPED`` control
    event whose key says how many (a reader counting a window's data events keeps each
    one's index); ``(reduced data, data events kept)``. Compiled when the extension is
    built; ValueError when an event leaves ``data``."""
    if _select is not None:
        reduced, kept = _select.newest(data)
        return reduced, kept
    return newest_python(data)


def newest_python(data: bytes) -> tuple[bytes, int]:
    """:func:`newest` in Python: the same events kept."""
    mv = memoryview(data)
    starts: list[int] = []
    keys: list[tuple[int, int | bytes] | None] = []
    last: dict[tuple[int, int | bytes], int] = {}
    off = 0
    while off < len(data):
        if len(data) - off < ev.HEADER_LEN:
            raise ValueError("newest: an event leaves the data")
        length = ev.peek_length(mv, off)
        if length < ev.HEADER_LEN or length > len(data) - off:
            raise ValueError("newest: an event leaves the data")
        src = ev.peek_src_id(mv, off)
        low = mv[off + ev.OFF_ATTRIBUTES + 1]  # the attributes' low byte: opcode, key kind
        key = None
        if src >= 0 and low & ev.ATTR_OPCODE_MASK != ev.Op.TRUNCATE:
            room = length - ev.HEADER_LEN
            klen = (int.from_bytes(mv[off + ev.HEADER_LEN:off + ev.HEADER_LEN + 4], "big",
                                   signed=True) if room >= 4 else -1)
            bad = (not 0 <= klen <= room - 4) if low & ev.ATTR_KEY_BYTES else room < 8
            if bad:
                raise ValueError("newest: an event leaves the data")
            key = (src, ev.peek_key(mv, off))
            last[key] = len(starts)
        starts.append(off)
        keys.append(key)
        off += length
    starts.append(len(data))
    out: list[bytes] = []
    kept = dropped = 0
    for i, key in enumerate(keys):
        if key is not None and last[key] != i:
            dropped += 1
            continue
        src = ev.peek_src_id(mv, starts[i])
        if src == ev.SRC_EOP:
            dropped = 0  # a window's index starts again
        elif src >= 0 and dropped:
            out.append(ev.encode(scn=ev.peek_scn(mv, starts[i]), src_id=ev.SRC_DROPPED,
                                 key=dropped, payload=b""))
            dropped = 0
        out.append(data[starts[i]:starts[i + 1]])
        kept += src >= 0
    return b"".join(out), kept
