"""Which events of a buffered window a read selects, compiled when possible.

:func:`compile_selection` turns a read's source ids and server-side filter
into a :class:`Selection` backed by the optional C extension ``_select``
(built by setup.py where a C compiler and zlib's headers exist). It keeps
exactly the events the Python path of :meth:`EventBuffer._collect
<databus.buffer.ring.EventBuffer._collect>` keeps (source id in ``sources``,
then :meth:`ServerFilter.matches <databus.core.filters.ServerFilter.matches>`),
without a Python object per event. Without the extension it returns None and
the buffer selects event by event in Python (same result, slower).
"""

from __future__ import annotations

from dataclasses import dataclass

from databus.core.filters import ServerFilter

try:
    from databus.buffer import _select  # type: ignore[attr-defined]
except ImportError:  # not built: the Python path only
    _select = None

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


def compile_selection(sources: frozenset[int] | None,
                      filt: ServerFilter | None) -> Selection | None:
    """The compiled selection, or None when the extension is not built."""
    if _select is None:
        return None
    filters = tuple(
        (src, 1 if f.partition_type == "MOD" else 0, f.num_buckets, f.ranges)
        for src, f in (filt.by_source.items() if filt is not None else ()))
    return Selection(None if sources is None else tuple(sorted(sources)), filters)
