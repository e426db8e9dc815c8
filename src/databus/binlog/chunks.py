"""The packets of recently framed binlog chunks, shared by the dumps of one server.

See :class:`FramedChunks` for the contract (what is shared, when it is valid, how much
is held) and the measured reason. Event-loop only.
"""

from __future__ import annotations

from collections import OrderedDict

ChunkKey = tuple[str, int, int, int]  # file, offset, bytes read, first sequence number


class FramedChunks:
    """The packets of recently framed file chunks, shared by the dumps of one server.

    Dumps that start at the same place (file, position, packet sequence number: replicas
    started together, several tools reading one history) read the same chunks and frame
    them into the same packets: the first dump at a chunk reads and frames it, the
    others send its packets without a read or a framing of their own. The packets are a
    function of the key alone (file, offset, bytes read, first sequence number): a
    file's bytes after its Format_description and below its committed size never change
    while the server runs (the store truncates only when it opens; a rotation rewrites
    the Format_description's in-use flag, which no shared chunk holds: chunks from
    inside the Format_description, which only a position that is no event boundary
    gives, are never shared; a purge removes whole files, whose names are never
    reused). Only dumps that share their start with another live dump use it: a dump
    alone frames into its own reused buffer, which stays in the CPU's cache (packets
    kept for others are written to fresh memory: ~30 % more of a lone dump's CPU,
    measured).

    Measured reason (bench/RESULTS.md): with four ``mariadb-binlog`` clients reading one
    binlog, the file reads' copy was ~23 % of the server's CPU and the framing ~14 %;
    sharing took the server's CPU per four-client read from 49-51 ms to 40-41 ms.

    Holds at most ``max_bytes`` of packets (plus Python's per-entry overhead, which
    matters only for the small chunks of dumps tailing the binlog together), the least
    recently used going first, and none once no two live dumps share a start; an
    entry's bytes stay valid for a dump that still sends them after it went (bytes
    objects). Event-loop only (not thread-safe).
    """

    def __init__(self, max_bytes: int = 16 << 20) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[ChunkKey, tuple[bytes, int, int, int]] = OrderedDict()
        self._size = 0
        self._starts: dict[tuple[str, int, int], int] = {}
        self.hits = 0
        self.misses = 0

    def join(self, start: tuple[str, int, int]) -> None:
        """A dump starting at ``start`` (file, position, sequence number) begins."""
        self._starts[start] = self._starts.get(start, 0) + 1

    def leave(self, start: tuple[str, int, int]) -> None:
        """That dump ended; once no two live dumps share a start, the packets go too (no
        memory held for dumps that are gone)."""
        left = self._starts.pop(start, 1) - 1
        if left:
            self._starts[start] = left
        if self._entries and all(n < 2 for n in self._starts.values()):
            self._entries.clear()
            self._size = 0

    def shared(self, start: tuple[str, int, int]) -> bool:
        """Whether another live dump started at ``start``."""
        return self._starts.get(start, 0) > 1

    def get(self, key: ChunkKey) -> tuple[bytes, int, int, int] | None:
        """``(packets, consumed, count, next_seq)`` framed before for ``key``, or None."""
        got = self._entries.get(key)
        if got is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end(key)
        return got

    def put(self, key: ChunkKey, framed: tuple[bytes, int, int, int]) -> None:
        if len(framed[0]) > self.max_bytes:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self._size -= len(old[0])
        self._entries[key] = framed
        self._size += len(framed[0])
        while self._size > self.max_bytes:
            _, (packets, *_) = self._entries.popitem(last=False)
            self._size -= len(packets)

    def __len__(self) -> int:
        return len(self._entries)
