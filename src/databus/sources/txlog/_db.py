"""Opening SQLite connections and translating ``sqlite3`` errors at the boundary.

Every ``sqlite3`` call of the txlog package runs inside :func:`translated`, so no
``sqlite3`` exception leaves the package:

* busy / locked / I/O / cannot-open / out-of-memory / disk-full / interrupted
  (the SQLite primary result codes below) become
  :class:`~databus.core.errors.SourceUnavailableError`: transient, the relay
  retries with backoff;
* everything else (a missing databus table, a corrupt file, a closed
  connection) becomes :class:`~databus.core.errors.TerminalError`.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from databus.core.errors import ConfigError, SourceUnavailableError, TerminalError

# SQLite primary result codes that may pass: BUSY, LOCKED, NOMEM, INTERRUPT,
# IOERR, FULL, CANTOPEN, PROTOCOL.
_TRANSIENT_CODES = frozenset({5, 6, 7, 9, 10, 13, 14, 15})
_BUSY = 5


def connect(path: Path, *, busy_timeout: float) -> sqlite3.Connection:
    """Open an existing database file read-write in autocommit mode.

    The file is never created (``mode=rw``). ``busy_timeout`` is how long a
    statement waits for a lock held by another connection before failing with
    "database is locked". The connection may be used from any thread (the
    callers serialise access with their own locks).
    """
    if not path.is_file():
        raise ConfigError(f"SQLite database {path} does not exist")
    uri = path.absolute().as_uri() + "?mode=rw"
    with translated(f"opening {path}"):
        con = sqlite3.connect(uri, uri=True, timeout=busy_timeout, isolation_level=None,
                              check_same_thread=False)
        try:
            con.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
        except BaseException:
            con.close()
            raise
    return con


def begin_immediate(con: sqlite3.Connection, *, busy_timeout: float) -> None:
    """``BEGIN IMMEDIATE`` on ``con``, retried about every 0.1 ms for up to
    ``busy_timeout`` seconds while another connection holds the write lock; then
    the last ``sqlite3`` error is raised ("database is locked").

    SQLite's own busy handler sleeps up to 100 ms between tries, while an
    application committing back to back leaves the lock free for microseconds
    between its transactions: with it, a short write of ours would wait for the
    application to pause, however long that takes.
    """
    con.execute("PRAGMA busy_timeout = 0")
    try:
        deadline = time.monotonic() + busy_timeout
        while True:
            try:
                con.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                code = getattr(exc, "sqlite_errorcode", _BUSY)
                if (code & 0xFF) != _BUSY or time.monotonic() >= deadline:
                    raise
            time.sleep(0.0001)
    finally:
        con.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")


def is_transient(exc: sqlite3.Error) -> bool:
    """Whether ``exc`` may pass when retried (see the module docstring)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:
        return isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc)
    return (code & 0xFF) in _TRANSIENT_CODES


@contextmanager
def translated(what: str) -> Iterator[None]:
    """Re-raise ``sqlite3`` errors as databus errors, naming ``what`` failed."""
    try:
        yield
    except sqlite3.Error as exc:
        if is_transient(exc):
            raise SourceUnavailableError(f"SQLite: {what}: {exc}") from exc
        raise TerminalError(f"SQLite: {what}: {exc}") from exc


def rollback_quietly(con: sqlite3.Connection) -> None:
    """End ``con``'s transaction after a failure; a failing ROLLBACK changes nothing."""
    if con.in_transaction:
        with suppress(sqlite3.Error):  # the original error is what the caller reports
            con.execute("ROLLBACK")


def write_one(con: sqlite3.Connection, sql: str, params: tuple[object, ...], *,
              busy_timeout: float) -> None:
    """Run one statement in its own write transaction, asking for the write lock with
    :func:`begin_immediate` (SQLite's busy handler, sleeping up to 100 ms between tries,
    can wait past ``busy_timeout`` for an application that commits back to back and
    fail with "database is locked")."""
    begin_immediate(con, busy_timeout=busy_timeout)
    try:
        con.execute(sql, params)
        con.execute("COMMIT")
    except BaseException:
        rollback_quietly(con)
        raise
