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
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from confluent_kafka import Consumer, IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec  # type: ignore[attr-defined]

from databus.core.checkpoint import Checkpoint
from databus.core.errors import InvalidCheckpointError, KafkaUnavailableError
from databus.kafka.errors import error_of, kafka_errors

FORMAT = "databus-publish-offset/1"


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


def ensure_topic(admin: AdminClient, topic: str, *, partitions: int, replication: int,
                 config: dict[str, str], timeout: float = 30.0) -> bool:
    """Create ``topic`` unless it exists; True when it was created now."""
    with kafka_errors(f"listing topics for {topic}"):
        md = admin.list_topics(topic=topic, timeout=timeout)
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


def read_position(kafka_config: dict[str, str], admin: AdminClient, topic: str, name: str,
                  timeout: float = 120.0) -> Checkpoint | None:
    """The last committed checkpoint of publisher ``name`` (see the module docstring)."""
    with kafka_errors(f"reading {topic}"):
        md = admin.list_topics(topic=topic, timeout=30)
        tmeta = md.topics.get(topic)
        if tmeta is None or tmeta.error is not None or not tmeta.partitions:
            return None
        parts = [TopicPartition(topic, p) for p in sorted(tmeta.partitions)]
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        offsets = admin.list_offsets({tp: latest for tp in parts},
                                     isolation_level=IsolationLevel.READ_UNCOMMITTED,
                                     request_timeout=30)
        ends = {tp.partition: f.result().offset for tp, f in offsets.items()}
    want = name.encode("utf-8")
    found: Checkpoint | None = None
    if all(end <= 0 for end in ends.values()):
        return None
    consumer = Consumer({**kafka_config, "group.id": f"databus-publish-read-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "auto.offset.reset": "earliest", "enable.partition.eof": False})
    try:
        with kafka_errors(f"reading {topic}"):
            consumer.assign([TopicPartition(topic, p, 0) for p in ends])
            deadline = time.monotonic() + timeout
            pending = {p for p, end in ends.items() if end > 0}
            while pending:
                if time.monotonic() > deadline:
                    raise KafkaUnavailableError(
                        f"Kafka: reading {topic} did not reach offsets {ends} within"
                        f" {timeout:g} s (a transaction of another publisher still open?)")
                for msg in consumer.consume(500, timeout=0.5):
                    if msg.error() is not None:
                        continue
                    if msg.key() == want:
                        found = parse_record(topic, name, msg.value())
                for tp in consumer.position([TopicPartition(topic, p) for p in pending]):
                    if tp.offset >= ends[tp.partition]:
                        pending.discard(tp.partition)
    finally:
        consumer.close()
    return found
