"""Binlog files on disk: the data directory's files, index, position map, purge, waiting.

Layout of a data directory (``base`` = ``databus-bin`` by default)::

    <base>.000001, <base>.000002, ...   binlog files (MySQL binlog v4, CRC32 on every event)
    <base>.index                        one ``./<file name>`` per line, oldest first (MySQL's)
    <base>.state                        the position map (JSON, written atomically)
    <base>.lock                         held while a service has the directory open

What a file holds is :mod:`databus.binlog.binfile`'s: header events, then whole
transactions, and a Rotate event naming the next file once it reached ``rotate_bytes``.

**The position map** (:mod:`databus.binlog.posmap`) records every live file and ``end``:
where the last *whole relay window* written ends (file, position, last GNO, last relay
SCN, the file's logical clock). A window's bytes are written and fsynced before the map
is replaced, so after any crash (kill -9 included) the map is never ahead of the file.
:class:`BinlogStore` trusts a file only up to the map when it opens: a longer current
file is truncated back to ``end`` (a torn or unrecorded tail, a Rotate written before
its rotation was recorded), files after it that the map does not list are deleted (only
when they carry our Format_description), and the index is rewritten from the map. The
converter then asks the relay for the windows after ``end.scn``, so no transaction is
written twice or skipped. The SCN of every transaction is its Xid, so SCN <-> (file,
position) <-> GTID is read back from the files (:meth:`BinlogStore.transactions`); the
map itself keeps only the end.

**Readers** (the dumper, ``SHOW BINARY LOGS``): :meth:`files`, :meth:`end`,
:meth:`committed_size`, :meth:`next_file`, :meth:`locate_gtids`, :meth:`check`,
:meth:`wait_beyond`. A reader may send a file's bytes up to :meth:`committed_size` only
(whole transactions; a closed file's full size, its Rotate included). Bytes beyond it may
be a transaction being written. All methods are thread-safe; :meth:`wait_beyond` blocks
on a ``threading.Condition`` (an asyncio server waits through
:class:`~databus.binlog.notifier.StoreNotifier`).

**The writer** (only :class:`databus.binlog.convert.BinlogConverter`): :meth:`append`
takes a batch of whole windows, :meth:`purge` removes old files. One writer thread.

**Purge**: closed files whose closing time is older than the retention are removed from
the map first, then the index, then the disk; the current file never is. The purged set
(``uuid:1-N``) is what :meth:`gtid_purged` returns; a reader that needs a purged
position gets :class:`BinlogPurgedError` (MySQL error 1236's text).

Limits: file numbers have six digits (999999 files); a window is never split across
files (a file may exceed ``rotate_bytes`` by one window).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from databus.binlog import binfile
from databus.binlog import events as ev
from databus.binlog.binfile import TransactionInfo, Window
from databus.binlog.gtids import GtidSet, range_text
from databus.binlog.posmap import End, FileEntry, read_map, write_map
from databus.core.atomic import write_atomic
from databus.core.errors import BufferCorruptError, ConfigError, TerminalError
from databus.core.lockfile import LockFile
from databus.core.mysqlwire import (
    BIN_LOG_HEADER_SIZE,
    FLAGS_OFFSET,
    LOG_EVENT_BINLOG_IN_USE_F,
    EventType,
)


class BinlogPurgedError(TerminalError):
    """A client asked for a binlog position or GTID set this server no longer has (or
    never had). ``mysql_errno`` is 1236 (ER_MASTER_FATAL_ERROR_READING_BINLOG); the
    message is MySQL's text for the case, for the error packet."""

    code = "BinlogPurged"
    http_status = 410
    mysql_errno = 1236


class BinlogGtidAheadError(BinlogPurgedError):
    """The client's GTID set holds transactions of this server's UUID that it never
    wrote (1236 too: MySQL's "Slave has more GTIDs than the master has")."""

    code = "BinlogGtidAhead"


@dataclass(frozen=True, order=True)
class BinlogPos:
    """A position in the binlog: a file name and a byte offset in it. Ordered by
    (file, pos); file names of one base have the same width, so this is binlog order."""

    file: str
    pos: int


class BinlogStore:
    """The binlog files of one data directory (see the module docstring).

    The constructor opens (or creates) the directory, locks it (``<base>.lock``: one
    binlog service per directory and base name, a second is refused naming the first)
    and recovers it to the map; it raises :class:`ConfigError` for a directory that
    holds another server's or a foreign state file, or that another service holds,
    :class:`BufferCorruptError` for a file shorter than its map.
    """

    _NAME_RE: ClassVar[str] = r"\.(\d{6})$"

    def __init__(self, data_dir: Path, *, base: str = "databus-bin", server_id: int = 1,
                 rotate_bytes: int = 64 * 1024 * 1024) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", base):
            raise ConfigError(f"binlog base name {base!r}: letters, digits, '_', '.', '-' only")
        self.data_dir = Path(data_dir)
        self.base = base
        self.server_id = server_id
        self.rotate_bytes = rotate_bytes
        self._cond = threading.Condition(threading.Lock())
        self._closed = False
        self._fd: int | None = None
        self._state_path = self.data_dir / f"{base}.state"
        self._index_path = self.data_dir / f"{base}.index"
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._lock = LockFile.take(
            self.data_dir / f"{base}.lock",
            {"what": f"binlog service {base}", "pid": os.getpid(),
             "host": socket.gethostname(), "data_dir": str(self.data_dir.resolve())},
            f"refusing to open the binlog files {self.data_dir / base}.*: another binlog"
            " service writes them; give each service its own data_dir (--data-dir)")
        self._files: list[FileEntry] = []
        self._purged_gno = 0
        self._meta: dict[str, Any] = {}
        self._next_meta: dict[str, Any] = {}
        self._holds: set[object] = set()  # sessions holding FLUSH TABLES WITH READ LOCK
        self._appending = False
        try:
            if self._state_path.exists():
                self._load()
            else:
                self.server_uuid = str(uuid.uuid4())
                self._files = []
                self._end = End("", 0, 0, -1, 0)
                self._create_file(1, first_gno=1)
            self._recover()
        except BaseException:
            self._lock.release()
            raise

    # -- readers -------------------------------------------------------------

    def files(self) -> list[tuple[str, int]]:
        """(name, committed size) of every live file, oldest first."""
        with self._cond:
            return [(f.name, self._committed(f)) for f in self._files]

    def end(self) -> BinlogPos:
        """The end of the last whole transaction (``SHOW MASTER STATUS``)."""
        with self._cond:
            return BinlogPos(self._end.file, self._end.pos)

    def last_scn(self) -> int:
        """The relay SCN of the last window written (-1: none yet)."""
        with self._cond:
            return self._end.scn

    def last_gno(self) -> int:
        with self._cond:
            return self._end.gno

    def gtid_executed(self) -> str:
        """``uuid:1-N`` for the N transactions written, ``""`` when none."""
        with self._cond:
            return range_text(self.server_uuid, 1, self._end.gno)

    def gtid_purged(self) -> str:
        """``uuid:1-P`` for the transactions in purged files, ``""`` when none."""
        with self._cond:
            return range_text(self.server_uuid, 1, self._purged_gno)

    def path(self, name: str) -> Path:
        """The file's path (the name is checked to be one of ours)."""
        if not re.fullmatch(re.escape(self.base) + self._NAME_RE, name):
            raise BinlogPurgedError(f"Could not find first log file name in binary log index"
                                    f" file ({name!r} is not a binlog name of this server)")
        return self.data_dir / name

    def committed_size(self, name: str) -> int:
        """Bytes of ``name`` a reader may send; :class:`BinlogPurgedError` if unknown."""
        with self._cond:
            return self._committed(self._entry(name))

    def next_file(self, name: str) -> str | None:
        """The file after ``name`` once it exists (None while ``name`` is current)."""
        with self._cond:
            names = [f.name for f in self._files]
            if name not in names:
                self._entry(name)  # raises
            i = names.index(name)
            return names[i + 1] if i + 1 < len(names) else None

    def check(self, pos: BinlogPos) -> None:
        """:class:`BinlogPurgedError` unless ``pos`` is in a live file and not past its
        committed end (MySQL's 1236 texts). Positions below 4 count as 4."""
        with self._cond:
            entry = self._entry(pos.file)
            size = self._committed(entry)
        if pos.pos > size:
            raise BinlogPurgedError("Client requested master to start replication from "
                                    "position > file size")

    def locate_gtids(self, gtid_set: str) -> BinlogPos:
        """Where a client whose executed set is ``gtid_set`` starts: the GTID event of
        the first transaction of ours not in the set (the end when it has them all).

        The client's set may have holes above that point: the dumper skips every
        transaction whose GTID :meth:`GtidSet.contains` (MySQL does the same).
        Raises :class:`BinlogPurgedError` when a transaction it lacks was purged and
        :class:`BinlogGtidAheadError` when it holds GNOs of our UUID beyond ours.
        """
        have = GtidSet.parse(gtid_set)
        mine = have.intervals(self.server_uuid)
        with self._cond:
            last = self._end.gno
            purged = self._purged_gno
            end = BinlogPos(self._end.file, self._end.pos)
        if mine and mine[-1][1] > last:
            raise BinlogGtidAheadError(
                "Slave has more GTIDs than the master has, using the master's SERVER_UUID. "
                "This may indicate that the end of the binary log was truncated or that the "
                "last binary log file was lost, e.g., after a power or disk failure when "
                "sync_binlog != 1. The master may or may not have rolled back transactions "
                "that were already replicated to the slave. Suggest to replicate any "
                "transactions that master has rolled back from slave to master, and/or "
                "commit empty transactions on master to account for transactions that have "
                "been committed on master but are not included in GTID_EXECUTED.")
        want = 1
        for a, b in mine:
            if a > want:
                break
            want = b + 1
        if want > last:
            return end
        if want <= purged:
            missing = GtidSet.single(self.server_uuid, want, purged)
            raise BinlogPurgedError(
                "Cannot replicate because the master purged required binary logs. Replicate "
                "the missing transactions from elsewhere, or provision a new slave from "
                "backup. Consider increasing the master's binary log expiration period. The "
                f"GTID set sent by the slave is '{have}', and the missing transactions are "
                f"'{missing}'.")
        return self._gno_pos(want)

    def wait_beyond(self, pos: BinlogPos, timeout: float) -> bool:
        """Block until :meth:`end` is beyond ``pos`` (True) or ``timeout`` seconds or
        :meth:`close` passed (False unless data arrived)."""
        with self._cond:
            self._cond.wait_for(
                lambda: self._closed or BinlogPos(self._end.file, self._end.pos) > pos,
                timeout)
            return BinlogPos(self._end.file, self._end.pos) > pos

    def transactions(self, name: str, start: int = 4) -> Iterator[TransactionInfo]:
        """The whole transactions of a live file from ``start`` (a transaction
        boundary), read from the file: the SCN <-> position <-> GTID map."""
        size = self.committed_size(name)
        with open(self.path(name), "rb") as fh:
            data = fh.read(size)
        yield from binfile.read_transactions(data, name, start)

    def close(self) -> None:
        """Wake every waiter and close the writer's file (idempotent)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            self._lock.release()

    # -- the writer ----------------------------------------------------------

    def writer_meta(self) -> dict[str, Any]:
        """What the writer recorded with the end at its last :meth:`append` (JSON)."""
        with self._cond:
            return dict(self._meta)

    def hold(self, owner: object) -> None:
        """``FLUSH TABLES WITH READ LOCK``: return once no append is in progress; then
        no append starts until every holder called :meth:`release` (blocking: call it
        off an event loop). The binlog's end and its tables stay as they are meanwhile,
        so a client can read the position and the catalog as one consistent state."""
        with self._cond:
            self._holds.add(owner)
            self._cond.wait_for(lambda: not self._appending or self._closed)

    def release(self, owner: object) -> None:
        """``UNLOCK TABLES`` or the holder's connection ended (idempotent)."""
        with self._cond:
            if owner in self._holds:
                self._holds.discard(owner)
                self._cond.notify_all()

    def append(self, windows: Sequence[Window], *, meta: dict[str, Any] | None = None) -> None:
        """Write whole windows, fsync, then record the map (see the module docstring),
        with ``meta`` (the writer's own JSON state, e.g. the schema versions announced).
        Rotates before a window when the current file reached ``rotate_bytes``.
        A window's SCN must be above :meth:`last_scn`. Waits while a reader holds the
        read lock (:meth:`hold`)."""
        with self._cond:
            self._cond.wait_for(lambda: not self._holds or self._closed)
            if self._closed:
                raise TerminalError("the binlog store is closed")
            self._appending = True
        try:
            self._append(windows, meta)
        finally:
            with self._cond:
                self._appending = False
                self._cond.notify_all()

    def _append(self, windows: Sequence[Window], meta: dict[str, Any] | None) -> None:
        if meta is not None:
            self._next_meta = meta
        buf = bytearray()
        end = End(**vars(self._end))
        fd = self._writer_fd()
        for w in windows:
            if w.scn <= end.scn:
                raise TerminalError(f"binlog window {w.scn} is not after {end.scn}")
            if end.pos + len(buf) >= self.rotate_bytes and end.seq > 0:
                self._flush(fd, buf)
                end.pos += len(buf)
                buf.clear()
                self._publish(end)
                self._rotate(int(w.timestamp_us // 1_000_000))
                end = End(**vars(self._end))
                fd = self._writer_fd()
            for txn in w.transactions:
                end.gno += 1
                end.seq += 1
                buf += binfile.encode_transaction(
                    txn, w, server_id=self.server_id, server_uuid=self.server_uuid,
                    gno=end.gno, seq=end.seq, start=end.pos + len(buf))
            end.scn = w.scn
        end.pos += len(buf)
        self._flush(fd, buf)
        self._publish(end)

    def purge(self, older_than: float) -> list[str]:
        """Remove closed files closed before ``older_than`` (epoch seconds), oldest
        first, never the current one; returns their names."""
        with self._cond:
            gone: list[FileEntry] = []
            for f in self._files[:-1]:
                if f.closed is None or f.closed >= older_than:
                    break
                gone.append(f)
            if not gone:
                return []
            keep = self._files[len(gone):]
            purged = keep[0].first_gno - 1
        self._write_state(keep, self._end, purged)
        with self._cond:
            self._files = keep
            self._purged_gno = purged
        self._write_index()
        for f in gone:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.data_dir / f.name)
        return [f.name for f in gone]

    # -- internals -----------------------------------------------------------

    def _entry(self, name: str) -> FileEntry:
        for f in self._files:
            if f.name == name:
                return f
        raise BinlogPurgedError("Could not find first log file name in binary log index file")

    def _committed(self, f: FileEntry) -> int:
        return self._end.pos if f.name == self._end.file else f.size

    def _name(self, number: int) -> str:
        if number > 999999:
            raise TerminalError("binlog file numbers are exhausted (999999)")
        return f"{self.base}.{number:06d}"

    def _create_file(self, number: int, *, first_gno: int) -> None:
        """Write a new current file's header events, then record it (map, index)."""
        name = self._name(number)
        now = time.time()
        head = binfile.header_events(server_id=self.server_id, server_uuid=self.server_uuid,
                                     first_gno=first_gno, timestamp=int(now))
        path = self.data_dir / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, head)
            os.fsync(fd)
        finally:
            os.close(fd)
        self._fsync_dir()
        files = [*self._files, FileEntry(name, first_gno, now)]
        end = End(name, len(head), self._end.gno, self._end.scn, 0)
        self._write_state(files, end, self._purged_gno)
        with self._cond:
            self._files = files
            self._end = end
            self._cond.notify_all()
        self._write_index()

    def _rotate(self, ts: int) -> None:
        """End the current file with a Rotate, clear its in-use flag, start the next."""
        cur = self._files[-1]
        number = int(cur.name.rsplit(".", 1)[1]) + 1
        nxt = self._name(number)
        fd = self._writer_fd()
        pos = self._end.pos
        rot = ev.frame(EventType.ROTATE, ev.rotate(nxt), timestamp=ts,
                       server_id=self.server_id, start=pos)
        _pwrite_all(fd, rot, pos)
        # the in-use flag is outside the FDE's checksum (see events.py)
        os.pwrite(fd, (0).to_bytes(2, "little"), BIN_LOG_HEADER_SIZE + FLAGS_OFFSET)
        os.fsync(fd)
        os.close(fd)
        self._fd = None
        closed = FileEntry(cur.name, cur.first_gno, cur.created, time.time(), pos + len(rot))
        with self._cond:
            self._files = [*self._files[:-1], closed]
        self._create_file(number, first_gno=self._end.gno + 1)

    def _writer_fd(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.data_dir / self._end.file, os.O_WRONLY)
        return self._fd

    def _flush(self, fd: int, buf: bytearray) -> None:
        if not buf:
            return
        _pwrite_all(fd, buf, self._end.pos)
        os.fsync(fd)

    def _publish(self, end: End) -> None:
        if (end.pos, end.gno, end.scn) == (self._end.pos, self._end.gno, self._end.scn) \
                and self._next_meta == self._meta:
            return
        meta = self._next_meta
        self._write_state(self._files, end, self._purged_gno, meta)
        with self._cond:
            self._end = end
            self._meta = meta
            self._cond.notify_all()

    def _gno_pos(self, gno: int) -> BinlogPos:
        with self._cond:
            files = list(self._files)
        entry = files[0]
        for f in files:
            if f.first_gno <= gno:
                entry = f
        for t in self.transactions(entry.name):
            if t.gno == gno:
                return BinlogPos(t.file, t.pos)
        raise BufferCorruptError(f"GTID {self.server_uuid}:{gno} is not in {entry.name}")

    def _fsync_dir(self) -> None:
        dfd = os.open(self.data_dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def _write_state(self, files: list[FileEntry], end: End, purged: int,
                     meta: dict[str, Any] | None = None) -> None:
        write_map(self._state_path, base=self.base, server_uuid=self.server_uuid,
                  files=files, end=end, purged_gno=purged,
                  writer=self._meta if meta is None else meta)

    def _write_index(self) -> None:
        with self._cond:
            names = [f.name for f in self._files]
        write_atomic(self._index_path, "".join(f"./{n}\n" for n in names).encode())

    def _load(self) -> None:
        pmap = read_map(self._state_path, self.base)
        self.server_uuid, self._files, self._end = pmap.server_uuid, pmap.files, pmap.end
        self._purged_gno, self._meta = pmap.purged_gno, pmap.writer
        self._next_meta = self._meta

    def _recover(self) -> None:
        """Bring the files back to the map (see the module docstring)."""
        cur = self.data_dir / self._end.file
        try:
            size = cur.stat().st_size
        except FileNotFoundError:
            raise BufferCorruptError(f"binlog file {cur} of the map is missing") from None
        if size < self._end.pos:
            raise BufferCorruptError(
                f"binlog file {cur} has {size} bytes, its map says {self._end.pos} were written")
        with open(cur, "rb") as fh:
            data = fh.read(self._end.pos)
        if not binfile.ends_whole(data, self._end.pos):
            raise BufferCorruptError(f"binlog file {cur} does not end a whole event at "
                                     f"{self._end.pos} as its map says")
        if size > self._end.pos or \
                not data[BIN_LOG_HEADER_SIZE + FLAGS_OFFSET] & LOG_EVENT_BINLOG_IN_USE_F:
            fd = os.open(cur, os.O_WRONLY)
            try:
                os.truncate(cur, self._end.pos)
                os.pwrite(fd, LOG_EVENT_BINLOG_IN_USE_F.to_bytes(2, "little"),
                          BIN_LOG_HEADER_SIZE + FLAGS_OFFSET)
                os.fsync(fd)
            finally:
                os.close(fd)
        live = {f.name for f in self._files}
        number = int(self._end.file.rsplit(".", 1)[1])
        for p in self.data_dir.glob(f"{self.base}.[0-9][0-9][0-9][0-9][0-9][0-9]"):
            n = int(p.name.rsplit(".", 1)[1])
            # after the current file: a rotation not recorded; before the oldest: a purge
            # not finished. Removed only when the bytes are ours.
            if p.name not in live and n != number and binfile.is_ours(p):
                p.unlink()
        self._write_index()


def _pwrite_all(fd: int, data: bytes | bytearray, pos: int) -> None:
    """Write all of ``data`` at ``pos``: a short write (a file system filling up) is
    continued, and one that writes nothing raises ENOSPC, never passes for whole (the
    position map, written after, is what makes bytes visible)."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, pos)
        if n <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view, pos = view[n:], pos + n
