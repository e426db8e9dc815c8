"""SQLAlchemy helpers shared by the SQL checkpoint store and the replicate sink."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from databus.core.errors import SinkUnavailableError


def make_engine(url: str) -> sa.Engine:
    """An engine for ``url`` with pre-ping, so dead pooled connections are replaced."""
    return sa.create_engine(url, pool_pre_ping=True)


def redacted(engine: sa.Engine) -> str:
    """The engine URL without its password, for messages."""
    return engine.url.render_as_string(hide_password=True)


def is_transient(exc: BaseException) -> bool:
    """True for database errors that may pass: lost connections, locks, timeouts."""
    if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(exc, (sa_exc.OperationalError, sa_exc.InterfaceError,
                            sa_exc.DisconnectionError, sa_exc.TimeoutError))


@contextmanager
def translate_db_errors(what: str, engine: sa.Engine) -> Iterator[None]:
    """Turn transient SQLAlchemy errors into :class:`SinkUnavailableError`.

    Other errors (a value that does not fit a column, a missing privilege)
    propagate unchanged.
    """
    try:
        yield
    except sa_exc.SQLAlchemyError as exc:
        if is_transient(exc):
            raise SinkUnavailableError(
                f"{what} failed on {redacted(engine)}: {type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}"
            ) from exc
        raise
