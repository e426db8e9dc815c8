"""databus.buffer: the relay's event buffer (circular, sparse SCN index, optional mmap
persistence). It depends on core only.

* :mod:`~databus.buffer.ring`: :class:`EventBuffer`, the contract (whole windows,
  continuity, pinned reads, one writer and many readers);
* :mod:`~databus.buffer.region`: the circular region and its SCN index;
* :mod:`~databus.buffer.reads`: what a read takes from the region;
* :mod:`~databus.buffer.results`: what a read answers (:class:`ReadResult`,
  :class:`PinnedRead`);
* :mod:`~databus.buffer.select`: the compiled event selection (``_select.c``);
* :mod:`~databus.buffer.persist`: the memory-mapped file and its recovery.

This file only hands names on.
"""

from databus.buffer.results import PinnedRead, ReadResult
from databus.buffer.ring import EventBuffer

__all__ = ["EventBuffer", "PinnedRead", "ReadResult"]
