"""The relay's event buffer (circular, sparse SCN index, optional mmap persistence)."""

from databus.buffer.ring import EventBuffer, ReadResult

__all__ = ["EventBuffer", "ReadResult"]
