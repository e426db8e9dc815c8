"""The offsets topic: each publisher's last published checkpoint, kept in Kafka.

One compacted topic (one partition) holds a record per publisher, keyed by its name;
the value is ``{"format": "databus-publish-offset/1", "publisher": name, "checkpoint":
{...}, "scn": S, "ts_ms": T}``. The record is written inside the Kafka transaction of
the window it follows, so a reader that sees the window's messages sees the record and
the other way round.

:func:`read_position` reads the topic from its start to the high-water mark taken when
it starts, as a ``read_committed`` consumer: it returns only when every transaction
written before that mark is resolved (committed or aborted), so a record committed
before the call is never missed (a foreign publisher's open transaction delays it up to
that publisher's transaction timeout). The last record of the name wins; a tombstone
(null value) for the name resets the publisher to "no position". A record of the name
that is not ours is refused (never adopt what is not ours).

**Claims.** The same topic holds, keyed ``<name>/claim`` (``/`` is never in a name), the
newest *claim* of the name: ``{"format": "databus-publish-claim/1", "publisher": name,
"instance": id, "host": H, "pid": P, "ts_ms": T}``, written outside any transaction by
each publisher when it starts, before its ``init_transactions``. Fencing by
``transactional.id`` says that *someone* took the name, and the broker's reply to the
fenced one is not always a fencing error (an ``EndTxn`` answered ``UNKNOWN`` was seen):
the claim says who holds it. :func:`newer_claim` reads claims ``read_uncommitted`` (a
claim is never part of a transaction, and must not wait for one) from an offset on.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec  # type: ignore[attr-defined]

from databus.core.checkpoint import Checkpoint
from databus.core.errors import InvalidCheckpointError, KafkaUnavailableError
from databus.kafka.errors import error_of, kafka_errors, translate

FORMAT = "databus-publish-offset/1"
CLAIM_FORMAT = "databus-publish-claim/1"


def offset_record(name: str, checkpoint: Checkpoint) -> bytes:
    """The value of a publisher's position record."""
    return json.dumps({"format": FORMAT, "publisher": name, "checkpoint": checkpoint.to_dict(),
                       "scn": checkpoint.window_scn, "ts_ms": time.time_ns() // 1_000_000},
                      separators=(",", ":")).encode("utf-8")


def parse_record(topic: str, name: str, value: bytes | None) -> Checkpoint | None:
    """The checkpoint of a record keyed ``name``; None for a tombstone."""
    if value is None:
        return None
    try:
        raw: Any = json.loads(value)
        if not isinstance(raw, dict) or raw.get("format") != FORMAT or raw.get(
                "publisher") != name:
            raise ValueError("not a databus publisher position")
        return Checkpoint.from_dict(raw["checkpoint"])
    except (ValueError, KeyError, InvalidCheckpointError) as exc:
        raise InvalidCheckpointError(
            f"topic {topic} holds a record keyed {name!r} that is not a databus publisher"
            f" position ({exc}); use another --name or --offsets-topic, or delete the"
            " record (a tombstone) to start this publisher again from scratch") from exc


def _list_topics(admin: AdminClient, timeout: float) -> Any:
    """Every topic's metadata. Never a request naming the topic: librdkafka's clients
    allow the broker to create a topic they ask about (``allow.auto.create.topics``,
    on for producers and admin clients), and a broker that does (its default) makes it
    with its own settings: the offsets topic not compacted, data topics without
    ``topic_partitions``."""
    return admin.list_topics(timeout=timeout)


def ensure_topic(admin: AdminClient, topic: str, *, partitions: int, replication: int,
                 config: dict[str, str], timeout: float = 30.0) -> bool:
    """Create ``topic`` unless it exists; True when it was created now."""
    with kafka_errors(f"listing topics for {topic}"):
        md = _list_topics(admin, timeout)
    found = md.topics.get(topic)
    if found is not None and found.error is None and found.partitions:
        return False
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions,
                                            replication_factor=replication, config=config)],
                                  operation_timeout=timeout, request_timeout=timeout)
    with kafka_errors(f"creating topic {topic}"):
        try:
            futures[topic].result()
        except KafkaException as exc:  # already created by someone else is fine
            err = error_of(exc)
            if err is not None and err.name() == "TOPIC_ALREADY_EXISTS":
                return False
            raise
    return True


def read_position(kafka_config: dict[str, Any], admin: AdminClient, topic: str, name: str,
                  timeout: float = 120.0) -> Checkpoint | None:
    """The last committed checkpoint of publisher ``name`` (see the module docstring)."""
    want = name.encode("utf-8")
    found: list[Checkpoint | None] = [None]

    def record(msg: Message) -> None:
        if msg.key() == want:
            found[0] = parse_record(topic, name, msg.value())

    _scan(kafka_config, admin, topic, record, start=None, committed=True, timeout=timeout)
    return found[0]


def claim_key(name: str) -> bytes:
    return f"{name}/claim".encode()


def write_claim(kafka_config: dict[str, Any], topic: str, name: str, instance: str,
                timeout: float = 30.0) -> dict[int, int]:
    """Write this instance's claim of ``name`` and wait for the broker's
    acknowledgement (all in-sync replicas); returns where it is ({partition: offset}:
    the ``start`` of :func:`newer_claim`)."""
    value = json.dumps({"format": CLAIM_FORMAT, "publisher": name, "instance": instance,
                        "host": socket.gethostname(), "pid": os.getpid(),
                        "ts_ms": time.time_ns() // 1_000_000}, separators=(",", ":"))
    producer = Producer({**kafka_config, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 0, "client.id": f"databus-claim-{name}"})
    reports: list[Message] = []
    with kafka_errors(f"claiming the name {name} in {topic}"):
        producer.produce(topic, key=claim_key(name), value=value.encode("utf-8"),
                         on_delivery=lambda _err, msg: reports.append(msg))
        producer.flush(timeout)
    if not reports:
        raise KafkaUnavailableError(f"Kafka: claiming the name {name} in {topic}: not"
                                    f" acknowledged within {timeout:g} s")
    err = reports[0].error()
    if err is not None:
        raise translate(err, f"claiming the name {name} in {topic}")
    partition, offset = reports[0].partition(), reports[0].offset()
    assert partition is not None and offset is not None
    return {partition: offset}


def newer_claim(kafka_config: dict[str, Any], admin: AdminClient, topic: str, name: str,
                instance: str, start: dict[int, int],
                timeout: float = 60.0) -> tuple[dict[str, Any] | None, dict[int, int]]:
    """The newest claim of ``name`` from ``start`` on, when it is not ``instance``'s own
    (None: there is none, or the newest is ours), and the offsets read up to (the next
    call may start there). A claim that is not valid JSON is taken as foreign."""
    want = claim_key(name)
    newest: list[dict[str, Any] | None] = [None]

    def record(msg: Message) -> None:
        value = msg.value()
        if msg.key() != want or value is None:
            return
        try:
            raw = json.loads(value)
        except ValueError:
            raw = None
        newest[0] = raw if isinstance(raw, dict) else {"instance": "?", "value": repr(value)}

    end = _scan(kafka_config, admin, topic, record, start=start, committed=False,
                timeout=timeout)
    claim = newest[0]
    return (None if claim is None or claim.get("instance") == instance else claim), end


def _scan(kafka_config: dict[str, Any], admin: AdminClient, topic: str,
          each: Callable[[Message], None], *, start: dict[int, int] | None,
          committed: bool, timeout: float) -> dict[int, int]:
    """Call ``each`` on every record of ``topic`` from ``start`` (per partition, only
    those; None: every partition from its beginning) to its high-water marks taken now
    (``committed``: as a ``read_committed`` consumer, which waits until every
    transaction below the marks is settled); returns the marks (the ``start`` of a
    later call that reads on)."""
    begin = start or {}
    with kafka_errors(f"reading {topic}"):
        md = _list_topics(admin, 30)
        tmeta = md.topics.get(topic)
        if tmeta is None or tmeta.error is not None or not tmeta.partitions:
            return dict(begin)
        # records of one key are all in one partition: a reader that knows it reads
        # only that one
        parts = [TopicPartition(topic, p) for p in sorted(tmeta.partitions)
                 if start is None or p in start]
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        offsets = admin.list_offsets({tp: latest for tp in parts},
                                     isolation_level=IsolationLevel.READ_UNCOMMITTED,
                                     request_timeout=30)
        ends: dict[int, int] = {tp.partition: f.result().offset for tp, f in offsets.items()}
    pending = {p for p, end in ends.items() if end > begin.get(p, 0)}
    if not pending:
        return ends
    consumer = Consumer({**kafka_config, "group.id": f"databus-publish-read-{uuid.uuid4().hex}",
                         "enable.auto.commit": False,
                         "isolation.level": "read_committed" if committed else "read_uncommitted",
                         "auto.offset.reset": "earliest", "enable.partition.eof": False})
    try:
        with kafka_errors(f"reading {topic}"):
            consumer.assign([TopicPartition(topic, p, begin.get(p, 0)) for p in pending])
            deadline = time.monotonic() + timeout
            while pending:
                if time.monotonic() > deadline:
                    raise KafkaUnavailableError(
                        f"Kafka: reading {topic} did not reach offsets {ends} within"
                        f" {timeout:g} s (a transaction of another publisher still open?)")
                for msg in consumer.consume(500, timeout=0.5):
                    if msg.error() is None:
                        each(msg)
                for tp in consumer.position([TopicPartition(topic, p) for p in pending]):
                    if tp.offset >= ends[tp.partition]:
                        pending.discard(tp.partition)
    finally:
        consumer.close()
    return ends
