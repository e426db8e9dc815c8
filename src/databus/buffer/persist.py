"""The buffer file: a header page and the mmap'ed event region, and its recovery.

File layout: ``HEADER_SIZE`` bytes of header, then ``capacity`` bytes of events.
The header holds two state slots (at 0 and 512), written alternately, each with
a sequence number and a CRC-32; the valid slot with the higher sequence wins,
so a write torn by a crash leaves the previous state readable.

Every block of the file is allocated when it is opened (``posix_fallocate``), so a
store into the mapping never needs disk space: a file system that fills up later costs
the buffer nothing, and one without room for the buffer refuses it at start.

The state is written after the event bytes of an append, so after ``kill -9``
the state never points past bytes that were written. Recovery does not trust
it anyway: :func:`scan_windows` validates every event (both CRCs) and the
window structure and keeps the longest valid prefix of whole windows.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
import stat
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from databus.buffer.select import scan_windows as compiled_scan
from databus.core import event as ev
from databus.core.errors import BufferCorruptError, ConfigError, CorruptEventError

log = logging.getLogger("databus.buffer")

HEADER_SIZE = 4096
MAGIC = b"DBUSBUF1"
LAYOUT_VERSION = 1
_SLOT = struct.Struct(">8sIQQqqq?q")
_CRC = struct.Struct(">I")
_SLOT_OFFSETS = (0, 512)


@dataclass(frozen=True, slots=True)
class FileState:
    seq: int
    head: int
    tail: int
    limit: int
    wrapped: bool
    prev_scn: int


class BufferFile:
    """An open buffer file. ``data`` is a writable view of the event region."""

    def __init__(self, path: Path, fd: int, mm: mmap.mmap, capacity: int, state: FileState):
        self.path = path
        self._fd = fd
        self._mm = mm
        self.capacity = capacity
        self.state = state
        self._seq = state.seq
        self.data = memoryview(mm)[HEADER_SIZE : HEADER_SIZE + capacity]

    @classmethod
    def open(cls, path: Path, capacity: int, start_scn: int) -> BufferFile:
        """Open (recovering the state) or create the file at ``path``.

        Only a regular file that carries the buffer's magic and layout version is
        adopted; any other existing path (a database, a directory, a device, a
        symlink, an empty file, another layout version) is refused with
        :class:`ConfigError` before anything is written, and left as it is. A new
        file is created exclusively with mode 0600 (its new directory 0700).
        """
        exists = os.path.lexists(path)
        if exists:
            check_adoptable(path)
        else:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        flags = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | (0 if exists else os.O_CREAT | os.O_EXCL)
        fd = os.open(path, flags, 0o600)
        try:
            size = os.fstat(fd).st_size
            if exists and size != HEADER_SIZE + capacity:
                raise BufferCorruptError(
                    f"buffer file {path} has {size} bytes; a buffer of capacity {capacity}"
                    f" needs {HEADER_SIZE + capacity} (capacity changed, or file truncated)")
            if not exists or size == 0:
                os.ftruncate(fd, HEADER_SIZE + capacity)
            _allocate(fd, path, HEADER_SIZE + capacity)
            mm = mmap.mmap(fd, HEADER_SIZE + capacity)
        except BaseException:
            os.close(fd)
            if not exists:  # ours, made just now: refused, it must not stay behind
                with contextlib.suppress(OSError):
                    os.unlink(path)
            raise
        try:
            if exists and size:
                state = _read_state(mm, path, capacity)
            else:
                state = FileState(0, 0, 0, 0, False, start_scn)
            bf = cls(path, fd, mm, capacity, state)
            if not (exists and size):
                bf.write_state(0, 0, 0, False, start_scn)
            return bf
        except BaseException:
            mm.close()
            os.close(fd)
            raise

    def write_state(self, head: int, tail: int, limit: int, wrapped: bool, prev_scn: int) -> None:
        self._seq += 1
        slot = _SLOT.pack(MAGIC, LAYOUT_VERSION, self._seq, self.capacity, head, tail, limit,
                          wrapped, prev_scn)
        off = _SLOT_OFFSETS[self._seq % 2]
        self._mm[off : off + _SLOT.size] = slot
        self._mm[off + _SLOT.size : off + _SLOT.size + 4] = _CRC.pack(zlib.crc32(slot))

    def flush(self) -> None:
        self._mm.flush()

    def close(self) -> None:
        self._mm.flush()
        self.data.release()
        self._mm.close()
        os.close(self._fd)


def _allocate(fd: int, path: Path, size: int) -> None:
    """Give every byte of the file its disk blocks now (holes of a file made by ftruncate,
    or by an older version, included), so a store into the mapping never needs space.

    Without it the blocks were taken at the first store into each page, and a store on a
    file system that had filled up meanwhile killed the relay with SIGBUS, without a word
    (tests/faults/test_disk_full.py). A file system without room for the whole buffer
    is refused here, at start, with the sizes named."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            st = os.fstatvfs(fd)
            raise ConfigError(
                f"buffer file {path} needs {size} bytes on its file system, which has"
                f" {st.f_bavail * st.f_frsize} free: {exc.strerror}. Free space there, or"
                " set a smaller buffer.capacity_bytes") from exc
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        log.warning("buffer file %s: its file system cannot reserve blocks ahead (%s); a"
                    " full disk will stop the relay with SIGBUS", path, exc.strerror)


def check_adoptable(path: Path) -> None:
    """Refuse (ConfigError) an existing ``path`` that is not a buffer file of this layout:
    a relay must never take over, move or overwrite a file it did not write."""
    st = os.lstat(path)
    what = ("a symbolic link" if stat.S_ISLNK(st.st_mode) else "a directory"
            if stat.S_ISDIR(st.st_mode) else None if stat.S_ISREG(st.st_mode)
            else "a device, socket or pipe")
    if what is None:
        with path.open("rb") as fh:
            head = fh.read(_SLOT_OFFSETS[-1] + _SLOT.size)
        slots = [head[o:o + _SLOT.size] for o in _SLOT_OFFSETS]
        ours = [x for x in slots if x[:len(MAGIC)] == MAGIC]
        if not ours:
            what = "an empty file" if not head else "not a databus buffer file"
        elif all(_SLOT.unpack(x)[1] != LAYOUT_VERSION for x in ours if len(x) == _SLOT.size):
            what = f"a databus buffer of another layout version (this one reads {LAYOUT_VERSION})"
    if what is not None:
        raise ConfigError(f"refusing to use {path} as the relay's buffer file: it is {what};"
                          " it was left unchanged. Give a new path or an existing buffer file")


def _read_state(mm: mmap.mmap, path: Path, capacity: int) -> FileState:
    best: FileState | None = None
    for off in _SLOT_OFFSETS:
        raw = mm[off : off + _SLOT.size]
        crc = _CRC.unpack(mm[off + _SLOT.size : off + _SLOT.size + 4])[0]
        if zlib.crc32(raw) != crc:
            continue
        magic, version, seq, cap, head, tail, limit, wrapped, prev = _SLOT.unpack(raw)
        if magic != MAGIC or version != LAYOUT_VERSION:
            continue
        if cap != capacity:
            raise BufferCorruptError(
                f"buffer file {path} was made with capacity {cap}, configured {capacity}")
        if not (0 <= head <= capacity and 0 <= tail <= capacity and 0 <= limit <= capacity):
            continue
        if best is None or seq > best.seq:
            best = FileState(seq, head, tail, limit, wrapped, prev)
    if best is None:
        raise BufferCorruptError(f"buffer file {path} has no valid header (not a databus"
                                 " buffer, or its header is damaged)")
    return best


@dataclass
class ScanResult:
    """Valid windows found by :func:`scan_windows`: (scn, offset, data events)."""

    windows: list[tuple[int, int, int]] = field(default_factory=list)
    end: int = 0
    corrupt: bool = False
    report: str = ""
    ended_before_wrap: bool = False


def scan_windows(mem: memoryview | bytearray, head: int, tail: int, limit: int, wrapped: bool,
                 prev_scn: int) -> ScanResult:
    """Validate the windows from ``head`` to ``tail``; keep the longest valid prefix."""
    segments = [(head, limit), (0, tail)] if wrapped else [(head, tail)]
    res = ScanResult(end=head)
    last_scn = prev_scn
    scan = compiled_scan or _scan_segment
    for seg_index, (start, stop) in enumerate(segments):
        windows, end, error = scan(mem, start, stop, last_scn)
        res.windows += windows
        if windows:
            last_scn = windows[-1][0]
            res.end = end
        if error is not None:
            res.corrupt = True
            res.report = (f"dropped everything from offset {end} on: {error};"
                          f" kept {len(res.windows)} windows")
            log.warning("buffer recovery: %s", res.report)
            res.end = end
            res.ended_before_wrap = wrapped and seg_index == 0
            return res
    if wrapped and not res.windows:
        res.ended_before_wrap = True
    return res


def _scan_segment(mem: memoryview | bytearray, start: int, stop: int,
                  last_scn: int) -> tuple[list[tuple[int, int, int]], int, str | None]:
    """The windows of one segment: the Python twin of the compiled ``scan_windows``
    (:mod:`databus.buffer.select`), used when the extension is not built."""
    windows: list[tuple[int, int, int]] = []
    off = start
    with memoryview(mem)[:stop] as view:
        while off < stop:
            win_start, n, scn = off, 0, None
            try:
                while True:
                    length = ev.check_event(view, off)
                    e_scn = ev.peek_scn(view, off)
                    if scn is None:
                        scn = e_scn
                        if scn <= last_scn:
                            raise CorruptEventError(f"scn {scn} not above {last_scn}")
                    elif e_scn != scn:
                        raise CorruptEventError(f"scn {e_scn} inside window {scn}")
                    off += length
                    if ev.peek_src_id(view, off - length) == ev.SRC_EOP:
                        break
                    n += 1
            except CorruptEventError as exc:
                return windows, win_start, str(exc)
            assert scn is not None
            windows.append((scn, win_start, n))
            last_scn = scn
    return windows, off, None
