"""The one exception tree of databus.

Every error the library raises derives from :class:`DatabusError`. Whether an
operation may be retried is told by type, never by message text:

* :class:`TransientError` - the same call may succeed later (a server went
  away, a timeout, a consumer callback that failed once). Retry with backoff.
* :class:`TerminalError` - retrying the same call cannot help (bad input, a
  corrupt file, a checkpoint the relay no longer has). Fix the cause or take
  another path (e.g. bootstrap on :class:`ScnNotFoundError`).

Each class carries ``code``: the stable name used in the HTTP error body
``{"error": code, "message": ..., "fields": {...}}`` (:func:`error_body`; ``fields``
keeps the error's context, :attr:`DatabusError.context`) and ``http_status``: the
status a server answers with. Third-party errors are translated where they enter the library
(``raise SourceUnavailableError(...) from exc``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar


class DatabusError(Exception):
    """Root of every databus error."""

    code: ClassVar[str] = "DatabusError"
    http_status: ClassVar[int] = 500
    retryable: ClassVar[bool] = False
    context: ClassVar[tuple[str, ...]] = ()
    """The attributes that keep this error's context (positions, names), each a keyword
    argument of its constructor: a server sends them with the error (``fields`` of
    its JSON body) and :func:`error_from_code` gives them back, so the error a client
    rebuilds holds what the server's held."""

    def fields(self) -> dict[str, Any]:
        """The context attributes and their values (JSON-able: str, int, float, bool,
        None)."""
        return {name: getattr(self, name) for name in self.context}


class TransientError(DatabusError):
    """The operation may succeed if retried later."""

    code = "TransientError"
    http_status = 503
    retryable = True


class TerminalError(DatabusError):
    """Retrying the same operation cannot succeed."""

    code = "TerminalError"


# -- client mistakes (4xx) ---------------------------------------------------


class InvalidRequestError(TerminalError):
    """A request (HTTP parameter, option) is malformed."""

    code = "InvalidRequest"
    http_status = 400


class InvalidCheckpointError(InvalidRequestError):
    """A checkpoint is not valid JSON or breaks the checkpoint contract."""

    code = "InvalidCheckpoint"


class InvalidFilterError(InvalidRequestError):
    """A server-side filter specification is malformed."""

    code = "InvalidFilter"


class UnknownSourceError(InvalidRequestError):
    """A source id or name that this server does not know."""

    code = "UnknownSource"
    http_status = 404


class ScnNotFoundError(TerminalError):
    """The checkpoint is older than anything the relay still holds.

    The consumer must bootstrap (or restart from a newer position).
    """

    code = "ScnNotFound"
    http_status = 410


class BootstrapTooYoungError(TerminalError):
    """The bootstrap store's log does not reach back to the requested SCN
    (it was started, or rebuilt, after that point)."""

    code = "BootstrapTooYoung"
    http_status = 410


class BootstrapTooOldError(TransientError):
    """The bootstrap store has not yet reached the requested SCN (its producer
    or applier is behind the request); asking again later can succeed."""

    code = "BootstrapTooOld"
    http_status = 409


# -- configuration and data -------------------------------------------------


class ConfigError(TerminalError):
    """A configuration file or option is invalid."""

    code = "ConfigError"
    http_status = 400


class CorruptEventError(TerminalError):
    """Bytes that do not form a valid event (bad magic, length, or CRC)."""

    code = "CorruptEvent"


class ScnAheadError(TransientError):
    """The checkpoint is newer than anything the relay holds.

    Transient: a relay that restarted may still be catching up with its source;
    a checkpoint of another source never stops being ahead, and the client's
    retries end with it named. Carries both positions.
    """

    code = "ScnAhead"
    http_status = 409  # the request's position conflicts with the relay's, not a server fault
    context = ("checkpoint_scn", "relay_scn")

    def __init__(self, message: str, *, checkpoint_scn: int = -1, relay_scn: int = -1) -> None:
        super().__init__(message)
        self.checkpoint_scn = checkpoint_scn
        self.relay_scn = relay_scn


class BufferCorruptError(TerminalError):
    """A persisted event buffer failed validation on recovery."""

    code = "BufferCorrupt"


class SchemaError(TerminalError):
    """A schema is missing, malformed, or a value does not fit it."""

    code = "SchemaError"


class BufferFullError(TerminalError):
    """A single window is larger than the whole event buffer."""

    code = "BufferFull"
    http_status = 507


class SourcePositionLostError(TerminalError):
    """The source can no longer serve the requested position (log purged)."""

    code = "SourcePositionLost"


class StatementError(TerminalError):
    """The source database refused a statement of ours (bad SQL, missing privilege,
    a user-supplied condition that does not compile)."""

    code = "StatementError"


# -- things that go away and come back (retry) -------------------------------


class SourceUnavailableError(TransientError):
    """The source database cannot be reached or failed a query."""

    code = "SourceUnavailable"


class RelayUnavailableError(TransientError):
    """A relay or bootstrap server could not be reached or answered 5xx."""

    code = "RelayUnavailable"


class CoordinatorUnavailableError(TransientError):
    """ZooKeeper could not be reached, or the session was suspended or lost."""

    code = "CoordinatorUnavailable"


class StorageFullError(TransientError):
    """A write found its file system full (or over its quota); nothing was replaced.
    Transient: the same write succeeds once space returns."""

    code = "StorageFull"
    http_status = 507


class StoreUnavailableError(TransientError):
    """A bootstrap store database could not be reached or failed a statement
    for a reason that may pass (lost connection, lock timeout)."""

    code = "StoreUnavailable"


class ConsumerCallbackError(TransientError):
    """A consumer callback returned ERROR or raised; the window is replayed."""

    code = "ConsumerCallbackError"


class ConsumerFatalError(TerminalError):
    """A consumer callback returned ERROR_FATAL; consumption stops."""

    code = "ConsumerFatal"


class SinkUnavailableError(TransientError):
    """A sink's target (database, checkpoint table) could not be reached or failed.

    Raised from a consumer callback or a checkpoint store; the client rolls the
    window back and replays it after a backoff.
    """

    code = "SinkUnavailable"


class KafkaContext(DatabusError):
    """Base of the Kafka errors: the Kafka error's name and flags kept as attributes
    (``kafka_code``, ``fatal``, ``retriable``, ``txn_requires_abort``)."""

    context = ("kafka_code", "fatal", "retriable", "txn_requires_abort")

    def __init__(self, message: str = "", *, kafka_code: str = "", fatal: bool = False,
                 retriable: bool = False, txn_requires_abort: bool = False) -> None:
        super().__init__(message)
        self.kafka_code = kafka_code
        self.fatal = fatal
        self.retriable = retriable
        self.txn_requires_abort = txn_requires_abort


class KafkaUnavailableError(KafkaContext, TransientError):
    """A Kafka broker could not be reached, timed out, or failed a request in a way that
    may pass (leader moving, coordinator loading, a transaction that must be aborted);
    the publisher aborts the window's transaction and publishes it again."""

    code = "KafkaUnavailable"


class CheckpointStoreError(TransientError):
    """Persisting or loading a checkpoint failed for a reason that may pass (I/O)."""

    code = "CheckpointStoreError"


class KafkaFencedError(KafkaContext, TerminalError):
    """Another publisher started with the same name (the same ``transactional.id``) and
    fenced this one: two publishers must never write one name's topics at once."""

    code = "KafkaFenced"


class KafkaRequestError(KafkaContext, TerminalError):
    """Kafka refused a request for a reason retrying cannot fix (authentication,
    authorization, an invalid setting, a message larger than the broker takes)."""

    code = "KafkaRequest"


class RelayProtocolError(TerminalError):
    """A relay answered with something that breaks the ``/stream`` contract
    (a window that starts before the previous one ended, an SCN going back)."""

    code = "RelayProtocolError"


class RetriesExhaustedError(TerminalError):
    """A transient failure persisted beyond the configured retry budget."""

    code = "RetriesExhausted"


def _find(cls: type[DatabusError], code: str) -> type[DatabusError] | None:
    if cls.code == code:
        return cls
    for sub in cls.__subclasses__():
        found = _find(sub, code)
        if found is not None:
            return found
    return None


def error_from_code(code: str, message: str,
                    fields: Mapping[str, Any] | None = None) -> DatabusError:
    """Rebuild the typed error named by an HTTP error body's ``error`` field, with the
    context its ``fields`` carry (only the class's :attr:`~DatabusError.context`
    attributes, and only JSON scalars; anything else is left at its default).

    Walks the class tree at call time, so subclasses defined anywhere count.
    """
    cls = _find(DatabusError, code)
    if cls is None:
        return TerminalError(f"{code}: {message}")
    kwargs = {k: v for k, v in (fields or {}).items()
              if k in cls.context and (v is None or isinstance(v, (str, int, float, bool)))}
    try:
        return cls(message, **kwargs)
    except TypeError:  # a value of the wrong type for its field: the message still says it
        return cls(message)


def error_body(exc: DatabusError) -> dict[str, Any]:
    """The JSON body a server answers ``exc`` with: ``error`` (its code), ``message``,
    and ``fields`` when it has context (:func:`error_from_code` reads it back)."""
    body: dict[str, Any] = {"error": exc.code, "message": str(exc)}
    fields = exc.fields()
    if fields:
        body["fields"] = fields
    return body


class SqlStatementError(TerminalError):
    """A SQL target refused a statement for a reason retrying cannot fix (syntax, a
    constraint, a missing table, access denied). Keeps its context as fields."""

    code = "SqlStatementError"
    context = ("what", "target", "driver_code", "sqlstate", "detail")

    def __init__(self, message: str = "", *, what: str = "", target: str = "",
                 driver_code: int | None = None, sqlstate: str | None = None,
                 detail: str = "") -> None:
        self.what, self.target = what, target
        self.driver_code, self.sqlstate, self.detail = driver_code, sqlstate, detail
        if not message:
            codes = ", ".join(x for x in (f"error {driver_code}" if driver_code else "",
                                          f"SQLSTATE {sqlstate}" if sqlstate else "") if x)
            message = f"{what} failed on {target}" + (f" ({codes})" if codes else "") + \
                f": {detail}"
        super().__init__(message)


class UnsupportedEventError(TerminalError):
    """The source's change log holds an event this source cannot read; capture stops at
    its position instead of skipping it (its changes would be lost without a word)."""

    code = "UnsupportedEvent"


class UnsupportedMediaTypeError(InvalidRequestError):
    """A request body of a content type the endpoint does not take (state-changing
    endpoints take ``application/json`` only)."""

    code = "UnsupportedMediaType"
    http_status = 415


class ForbiddenError(TerminalError):
    """The request is understood and refused: a foreign ``Origin`` or ``Host`` on a
    state-changing endpoint (or, with authentication, a token without the right)."""

    code = "Forbidden"
    http_status = 403


class UnauthorizedError(TerminalError):
    """The request carries no token, or one the server does not know (401). Terminal:
    retrying with the same token cannot succeed."""

    code = "Unauthorized"
    http_status = 401


class TlsVerificationError(TerminalError):
    """A server's TLS certificate does not verify against the CAs the client trusts.
    Terminal: retrying reaches the same certificate; the remedy is the client's CA
    setting (``ca_file``, ``--ca-file``, ``DATABUS_CA_FILE``) or the server's
    certificate."""

    code = "TlsVerification"


class PayloadTooLargeError(InvalidRequestError):
    """A request body larger than the server's ``max_body_bytes`` (413); the server
    stops reading it at the limit."""

    code = "PayloadTooLarge"
    http_status = 413


class HeadersTooLargeError(InvalidRequestError):
    """A request line plus headers larger than the server's ``max_header_bytes`` (431)."""

    code = "HeadersTooLarge"
    http_status = 431


class RequestTimeoutError(InvalidRequestError):
    """A request body that did not arrive whole within the server's ``read_timeout``
    (408); the server stops waiting for it."""

    code = "RequestTimeout"
    http_status = 408
