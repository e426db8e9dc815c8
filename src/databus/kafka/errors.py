"""The one translator of confluent-kafka's errors into databus's exception tree.

Every call into confluent-kafka that can fail runs inside :func:`kafka_errors`; nothing
else in the package catches ``KafkaException``. The type decides, never the text:

* fenced (``_FENCED``, ``PRODUCER_FENCED``, ``INVALID_PRODUCER_EPOCH``, ``TRANSACTION_
  COORDINATOR_FENCED``), and ``_FATAL``, the code every call of a producer returns
  after its fatal error (fencing, most often):
  :class:`~databus.core.errors.KafkaFencedError`, terminal: another publisher of the
  same name took over, and making a new producer would fence it in turn;
* refused for good (authentication, authorization, invalid configuration or
  arguments, a message larger than the broker takes, an unknown or unsupported
  setting), and any other fatal error: :class:`~databus.core.errors.KafkaRequestError`,
  terminal;
* anything else (timeouts, brokers down, retriable errors, errors that require the
  transaction to be aborted): :class:`~databus.core.errors.KafkaUnavailableError`,
  transient.

The translated error keeps the Kafka error's name (``kafka_code``) and its flags
(``fatal``, ``retriable``, ``txn_requires_abort``) as attributes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from confluent_kafka import KafkaError, KafkaException

from databus.core.errors import (
    KafkaContext,
    KafkaFencedError,
    KafkaRequestError,
    KafkaUnavailableError,
)

FENCED = frozenset({
    KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH,
    KafkaError.TRANSACTION_COORDINATOR_FENCED,
})

REFUSED = frozenset({
    KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED,
    KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED, KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    KafkaError._INVALID_ARG, KafkaError.INVALID_CONFIG, KafkaError.MSG_SIZE_TOO_LARGE,
    KafkaError.RECORD_LIST_TOO_LARGE, KafkaError.INVALID_REPLICATION_FACTOR,
    KafkaError.INVALID_PARTITIONS, KafkaError.POLICY_VIOLATION,
    KafkaError.UNSUPPORTED_SASL_MECHANISM, KafkaError.UNSUPPORTED_VERSION,
    KafkaError._UNSUPPORTED_FEATURE, KafkaError.INVALID_TRANSACTION_TIMEOUT,
    KafkaError.TOPIC_DELETION_DISABLED, KafkaError._NOT_CONFIGURED,
    KafkaError.INVALID_REQUIRED_ACKS, KafkaError.SECURITY_DISABLED,
})


def translate(error: KafkaError, what: str) -> KafkaContext:
    """The databus error for a confluent-kafka ``KafkaError`` raised while ``what``."""
    code = error.code()
    text = f"Kafka: {what} failed: {error.name()}: {error.str()}"
    cls: type[KafkaContext] = KafkaUnavailableError
    if code in FENCED or code == KafkaError._FATAL:
        cls, text = KafkaFencedError, f"{text} (most often: another publisher with the same" \
            " name took over)"
    elif code in REFUSED or error.fatal():
        cls = KafkaRequestError
    return cls(text, kafka_code=error.name(), fatal=bool(error.fatal()),
               retriable=bool(error.retriable()),
               txn_requires_abort=bool(error.txn_requires_abort()))


def error_of(exc: KafkaException) -> KafkaError | None:
    arg = exc.args[0] if exc.args else None
    return arg if isinstance(arg, KafkaError) else None


@contextmanager
def kafka_errors(what: str) -> Iterator[None]:
    """Run a block of confluent-kafka calls; their errors come out translated."""
    try:
        yield
    except KafkaException as exc:
        err = error_of(exc)
        if err is None:
            raise KafkaUnavailableError(f"Kafka: {what} failed: {exc}") from exc
        raise translate(err, what) from exc
    except BufferError as exc:  # the local queue is full: the broker is not keeping up
        raise KafkaUnavailableError(f"Kafka: {what} failed: local queue full ({exc})") from exc

