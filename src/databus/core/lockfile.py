"""An exclusive lock on a small file that says who holds it: two instances of a
component never share a state file, a buffer or a data directory by accident.

:meth:`LockFile.take` holds a ``flock`` on the file (and writes its holder there as
JSON) for as long as the lock lives; a second taker is refused with a
:class:`~databus.core.errors.ConfigError` naming what it wanted and who holds it. The
file stays when the lock is let go: removing it could let two processes lock two
different files of one name. A process that dies lets go with its file descriptors.
"""

from __future__ import annotations

import fcntl
import json
import os
import weakref
from pathlib import Path
from typing import Any

from databus.core.errors import ConfigError


class LockFile:
    """An exclusive ``flock`` on ``path`` (see the module docstring)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd
        # an owner dropped without release() (tests, embedding) lets go when collected
        self._finalizer = weakref.finalize(self, os.close, fd)

    @classmethod
    def take(cls, path: Path, holder: dict[str, Any], refuse: str) -> LockFile:
        """Take the lock, or raise ConfigError: ``refuse``, then who holds it. ``holder``
        says who this taker is (``what``: e.g. ``relay shop-1a2b3c``, ``pid``, ``host``,
        and any of ``url``, ``buffer``, ``data_dir``)."""
        if os.path.lexists(path) and not path.is_file():
            raise ConfigError(f"refusing to use {path} as a lock file: it is not a regular"
                              " file; it was left unchanged")
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        except OSError as exc:
            raise ConfigError(f"cannot lock {path}: {exc.strerror or exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = _holder(fd)
            os.close(fd)
            raise ConfigError(f"{refuse} (held by {other})") from None
        except BaseException:
            os.close(fd)
            raise
        lock = cls(path, fd)
        lock.write(holder)
        return lock

    def write(self, holder: dict[str, Any]) -> None:
        """Say who holds the lock (what a refused taker is told)."""
        if self._fd is None:
            return
        data = json.dumps(holder).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)

    def release(self) -> None:
        if self._fd is not None:
            self._fd = None
            self._finalizer()


def _holder(fd: int) -> str:
    try:
        raw = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        raw = {}
    what = raw.get("what") or (f"relay {raw['relay']}" if raw.get("relay") else None) \
        if isinstance(raw, dict) else None
    if not what:
        return "a process that has not said who it is yet"
    parts = [str(what), f"pid {raw.get('pid', '?')} on {raw.get('host', '?')}"]
    for key in ("url", "buffer", "data_dir"):
        if raw.get(key):
            parts.append(f"{key} {raw[key]}")
    return ", ".join(parts)
