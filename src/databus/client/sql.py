"""SQLAlchemy at the boundary: engines, and the ONE classifier of SQLAlchemy/DBAPI errors
used by every SQL target (the replicate sink, the SQL checkpoint store, the bootstrap
store), for SQLite, PostgreSQL (psycopg) and MariaDB/MySQL (pymysql).

An error that may pass (a lost connection, a lock or deadlock, a serialization
failure, too many connections, a server shutting down) becomes the caller's transient
type (``SinkUnavailableError``, ``StoreUnavailableError``): the caller retries. A full
disk or quota (SQLite ``SQLITE_FULL``, PostgreSQL ``53100 disk_full``, MariaDB/MySQL
``ER_DISK_FULL``/``ER_RECORD_FILE_FULL``) becomes :class:`StorageFullError`, transient
too: the statement's transaction was rolled back whole, and it succeeds once space
returns. Every
other error (syntax, a constraint, a missing table or column, access denied, a value
that does not fit) becomes a terminal :class:`SqlStatementError` that keeps the
operation, the target (URL without password), the driver's error code and SQLSTATE
as fields. Nothing else in the package catches SQLAlchemy errors.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from databus.core.errors import (
    SinkUnavailableError,
    SqlStatementError,
    StorageFullError,
    TransientError,
)
from databus.core.redact import redact_url

# SQLSTATE classes and codes that may pass (PostgreSQL, and MySQL where it sets them)
_TRANSIENT_SQLSTATE_CLASSES = ("08",)  # connection exceptions
_TRANSIENT_SQLSTATES = frozenset({
    "40001",  # serialization_failure
    "40P01",  # deadlock_detected
    "53300",  # too_many_connections
    "55P03",  # lock_not_available
    "57P01", "57P02", "57P03",  # admin/crash shutdown, cannot connect now
})
# MySQL/MariaDB error numbers that may pass
ER_CON_COUNT_ERROR = 1040  # too many connections
ER_SERVER_SHUTDOWN = 1053
ER_LOCK_WAIT_TIMEOUT = 1205
ER_LOCK_DEADLOCK = 1213
CR_CONNECTION_ERROR = 2002
CR_CONN_HOST_ERROR = 2003
CR_SERVER_GONE_ERROR = 2006
CR_SERVER_LOST = 2013
_TRANSIENT_MYSQL = frozenset({ER_CON_COUNT_ERROR, ER_SERVER_SHUTDOWN, ER_LOCK_WAIT_TIMEOUT,
                              ER_LOCK_DEADLOCK, CR_CONNECTION_ERROR, CR_CONN_HOST_ERROR,
                              CR_SERVER_GONE_ERROR, CR_SERVER_LOST})
# SQLite result codes that may pass
SQLITE_BUSY = 5
SQLITE_LOCKED = 6
SQLITE_IOERR = 10
SQLITE_CANTOPEN = 14  # the file's directory or volume is not there (yet)
_TRANSIENT_SQLITE = frozenset({SQLITE_BUSY, SQLITE_LOCKED, SQLITE_IOERR, SQLITE_CANTOPEN})
# a full disk or quota, per driver: (module prefix, error number or SQLSTATE)
SQLITE_FULL = 13
ER_DISK_FULL = 1021
ER_RECORD_FILE_FULL = 1114
_FULL = frozenset({("sqlite3", SQLITE_FULL), ("pymysql", ER_DISK_FULL),
                   ("pymysql", ER_RECORD_FILE_FULL), ("psycopg", "53100")})


def make_engine(url: str) -> sa.Engine:
    """An engine for ``url`` with pre-ping, so dead pooled connections are replaced."""
    return sa.create_engine(url, pool_pre_ping=True)


def redacted(engine: sa.Engine) -> str:
    """The engine URL without its password, for messages (the one helper,
    :func:`databus.core.redact.redact_url`)."""
    return redact_url(engine.url.render_as_string(hide_password=False))


def driver_codes(exc: BaseException) -> tuple[int | None, str | None]:
    """(driver error number, SQLSTATE) of a SQLAlchemy error's DBAPI exception."""
    orig = getattr(exc, "orig", None)
    if orig is None:
        return None, None
    sqlstate = getattr(orig, "sqlstate", None)  # psycopg
    number = getattr(orig, "sqlite_errorcode", None)  # sqlite3
    if number is None and orig.args and isinstance(orig.args[0], int):  # pymysql
        number = orig.args[0]
    if isinstance(number, int) and number > 0xFF and getattr(orig, "sqlite_errorcode", None):
        number &= 0xFF  # SQLite extended codes carry the primary code in the low byte
    return number, sqlstate if isinstance(sqlstate, str) else None


def is_transient(exc: BaseException) -> bool:
    """True for database errors that may pass (see the module docstring)."""
    if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
        return True
    if isinstance(exc, (sa_exc.DisconnectionError, sa_exc.TimeoutError)):
        return True
    if not isinstance(exc, sa_exc.DBAPIError):
        return False
    number, sqlstate = driver_codes(exc)
    if sqlstate is not None and (sqlstate in _TRANSIENT_SQLSTATES
                                 or sqlstate.startswith(_TRANSIENT_SQLSTATE_CLASSES)):
        return True
    orig = exc.orig
    module = type(orig).__module__
    if module.startswith("pymysql") and number in _TRANSIENT_MYSQL:
        return True
    if module.startswith("sqlite3") and number in _TRANSIENT_SQLITE:
        return True
    # psycopg's connection-level failures without a SQLSTATE (the server went away)
    return module.startswith("psycopg") and sqlstate is None and isinstance(
        exc, (sa_exc.OperationalError, sa_exc.InterfaceError))


def is_full(exc: BaseException) -> bool:
    """True for a full disk or quota (see the module docstring)."""
    if not isinstance(exc, sa_exc.DBAPIError):
        return False
    number, sqlstate = driver_codes(exc)
    module = type(exc.orig).__module__.split(".")[0]
    return (module, number) in _FULL or (module, sqlstate) in _FULL


def classify(exc: sa_exc.SQLAlchemyError, what: str, target: str,
             transient: type[TransientError]) -> TransientError | SqlStatementError:
    """The project's error for a SQLAlchemy error raised while doing ``what``."""
    number, sqlstate = driver_codes(exc)
    first = str(getattr(exc, "orig", None) or exc).splitlines()
    detail = first[0] if first else type(exc).__name__
    if is_full(exc):
        return StorageFullError(f"{what} failed on {target}: the disk is full:"
                                f" {type(exc).__name__}: {detail}")
    if is_transient(exc):
        return transient(f"{what} failed on {target}: {type(exc).__name__}: {detail}")
    return SqlStatementError(what=what, target=target, driver_code=number, sqlstate=sqlstate,
                             detail=f"{type(exc).__name__}: {detail}")


@contextmanager
def translate_db_errors(what: str, engine: sa.Engine,
                        transient: type[TransientError] = SinkUnavailableError
                        ) -> Iterator[None]:
    """Translate SQLAlchemy errors raised inside into the project's tree (see
    :func:`classify`)."""
    try:
        yield
    except sa_exc.SQLAlchemyError as exc:
        raise classify(exc, what, redacted(engine), transient) from exc
