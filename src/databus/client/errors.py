"""Errors raised only by the client library.

They extend the core tree (:mod:`databus.core.errors`), so callers catch them as
:class:`~databus.core.errors.TransientError` / ``TerminalError`` like any other.
They never travel over HTTP, so :func:`~databus.core.errors.error_from_code`
need not know them.
"""

from __future__ import annotations

from databus.core.errors import TerminalError, TransientError


class SinkUnavailableError(TransientError):
    """A sink's target (database, checkpoint table) could not be reached or failed.

    Raised from a consumer callback or a checkpoint store; the client rolls the
    window back and replays it after a backoff.
    """

    code = "SinkUnavailable"


class CheckpointStoreError(TransientError):
    """Persisting or loading a checkpoint failed for a reason that may pass (I/O)."""

    code = "CheckpointStoreError"


class RelayProtocolError(TerminalError):
    """A relay answered with something that breaks the ``/stream`` contract.

    For example a window that starts before the previous one ended, or an SCN
    that goes backwards. Retrying the same request cannot help.
    """

    code = "RelayProtocolError"
