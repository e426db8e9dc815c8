"""Streamed transactions (pgoutput protocol 2): their messages held until the commit.

With ``streaming 'on'`` (PostgreSQL 14+), the server sends a transaction
larger than ``logical_decoding_work_mem`` while it runs, in blocks (Stream
Start ... Stream Stop) that may interleave with other transactions, and ends
it with Stream Commit or Stream Abort. The source delivers a transaction only
whole, at its commit (:mod:`.source`), so a :class:`Spool` keeps the raw
messages of one streamed transaction in arrival order until then:

* in memory while every open spool together holds at most
  :class:`Budget`'s bound, then in an anonymous temporary file (unlinked at
  creation: a killed relay leaves nothing behind) for the rest of it;
* a **subtransaction abort** (Stream Abort with a subtransaction id) drops the
  messages from the first one of that subtransaction on: subtransactions nest,
  and the server streams a transaction's changes in WAL order, so every message
  after that point belongs to the aborted subtransaction or to one nested in
  it (PostgreSQL's own apply worker truncates its file the same way).
  Relation and Type messages are kept: the server considers the table
  described to this transaction and does not describe it again;
* a **top-level abort** drops the spool; nothing of it was delivered.

A spool's messages are read back once, in order (:meth:`Spool.messages`), at
Stream Commit. Nothing here is durable: a relay that stops mid-transaction
starts again after its last window, and the server streams the transaction
again from its start (the slot keeps its WAL: the slot only moves to SCNs of
delivered windows).
"""

from __future__ import annotations

import os
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from databus.core.errors import SourceUnavailableError

_LEN = struct.Struct(">I")
_KEEP = (0x52, 0x59)  # Relation, Type


class Budget:
    """Bytes of streamed messages held in memory, across every open spool."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0


class Spool:
    """The messages of one streamed transaction (see the module docstring)."""

    def __init__(self, xid: int, budget: Budget, spill_dir: Path | None) -> None:
        self.xid = xid
        self._budget = budget
        self._dir = spill_dir
        self._mem: list[bytes] = []  # the first messages (a prefix)
        self._held = 0  # bytes of _mem counted in the budget
        self._file: BinaryIO | None = None  # the rest, once spilled
        self._file_count = 0
        self._first: dict[int, tuple[int, int]] = {}  # subxid -> (count, file offset)
        self.count = 0
        self.spilled_bytes = 0

    def append(self, payload: bytes, subxid: int) -> None:
        if subxid not in self._first:
            self._first[subxid] = (self.count, self._file.tell() if self._file else 0)
        if self._file is None and self._budget.used + len(payload) <= self._budget.limit:
            self._mem.append(payload)
            self._held += len(payload)
            self._budget.used += len(payload)
        else:
            self._write(payload)
        self.count += 1

    def _write(self, payload: bytes) -> None:
        try:
            if self._file is None:
                if self._dir is not None:
                    self._dir.mkdir(parents=True, exist_ok=True)
                # closed by close(): the file lives as long as the transaction
                self._file = tempfile.TemporaryFile(  # noqa: SIM115
                    dir=self._dir, prefix=f"databus-pg-stream-{self.xid}-")
            self._file.write(_LEN.pack(len(payload)))
            self._file.write(payload)
        except OSError as exc:
            raise SourceUnavailableError(
                f"streamed transaction {self.xid}: cannot spill to disk: {exc}") from exc
        self._file_count += 1
        self.spilled_bytes += 4 + len(payload)

    def abort_subxact(self, subxid: int) -> None:
        """Drop the messages from ``subxid``'s first on (Relation and Type kept)."""
        first = self._first.get(subxid)
        if first is None:
            return  # nothing of it was streamed
        count, offset = first
        kept = [m for m in self._tail(count, offset) if m[0] in _KEEP]
        if count <= len(self._mem):
            dropped = self._mem[count:]
            del self._mem[count:]
            freed = sum(len(m) for m in dropped)
            self._held -= freed
            self._budget.used -= freed
            self._truncate(0)
            self._file_count = 0
        else:
            self._truncate(offset)
            self._file_count = count - len(self._mem)
        self.count = count
        self._first = {x: f for x, f in self._first.items() if f[0] < count}
        for m in kept:  # the server will not describe these tables again
            self.append(m, self.xid)

    def _tail(self, count: int, offset: int) -> list[bytes]:
        out = list(self._mem[count:])
        if self._file is not None:
            start = 0 if count <= len(self._mem) else offset
            out.extend(self._read_file(start))
        return out

    def _truncate(self, offset: int) -> None:
        if self._file is not None:
            try:
                self._file.truncate(offset)
                self._file.seek(offset)
            except OSError as exc:
                raise SourceUnavailableError(
                    f"streamed transaction {self.xid}: spill file: {exc}") from exc

    def _read_file(self, offset: int) -> Iterator[bytes]:
        f = self._file
        assert f is not None
        end = f.seek(0, os.SEEK_END)
        f.seek(offset)
        try:
            while f.tell() < end:
                (n,) = _LEN.unpack(f.read(4))
                yield f.read(n)
        finally:
            f.seek(end)

    def messages(self) -> Iterator[bytes]:
        """Every message, in order (read once, at the commit)."""
        yield from self._mem
        if self._file is not None:
            yield from self._read_file(0)

    def close(self) -> None:
        self._budget.used -= self._held
        self._held = 0
        self._mem = []
        if self._file is not None:
            self._file.close()
            self._file = None
