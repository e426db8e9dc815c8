"""Atomic file writes: a temp file in the same directory, fsync, ``os.replace``.

A reader sees the old content or the new content, never a mix, whatever point
the writer is killed at. Files are created 0600 and new directories 0700. Only a
regular file is ever replaced: a directory, device, socket or symlink at ``path``
is refused (:class:`ConfigError`) and left alone. A full file system (or quota) is a
:class:`StorageFullError` (transient), the old content left in place. Callers that keep state in a file
read it (and refuse what is not theirs) before they first write it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path

from databus.core.errors import ConfigError, StorageFullError


def write_atomic(path: Path, data: bytes, *, fsync: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically (see the module docstring)."""
    if os.path.lexists(path) and not stat.S_ISREG(os.lstat(path).st_mode):
        raise ConfigError(f"refusing to replace {path}: it is not a regular file")
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise _full(path, exc) from exc
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise _full(path, exc) from exc
        raise
    if fsync:
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def _full(path: Path, exc: OSError) -> OSError | StorageFullError:
    """``exc`` as a :class:`StorageFullError` when it says the file system is full."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return StorageFullError(f"cannot write {path}: {exc.strerror} (its file system is"
                                " full; the write is retried once space returns)")
    return exc
