"""The publisher's configuration (:class:`PublishConfig`), a validated model with one
description per field; a bad value is a :class:`~databus.core.errors.ConfigError`
naming the field.

Kafka settings the publisher does not own (security: SASL, TLS; client tuning) are
passed through to librdkafka unchanged in ``kafka_config``; the ones the exactly-once
contract depends on (``transactional.id``, idempotence, acks, isolation) cannot be
overridden there.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from databus.core.access import CLIENT_LEGACY_NAMES, RelayAccess, fold_relay_fields
from databus.core.config import ConfigModel
from databus.core.errors import ConfigError

_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,200}$")

# librdkafka properties the publisher sets itself: its guarantees rest on them
RESERVED_KAFKA_KEYS = frozenset({
    "transactional.id", "enable.idempotence", "acks", "request.required.acks",
    "isolation.level", "enable.auto.commit", "group.id", "bootstrap.servers",
    "max.in.flight.requests.per.connection", "max.in.flight",
})

ValueMode = Literal["databus", "debezium"]
DecimalMode = Literal["precise", "string", "double"]
TimePrecisionMode = Literal["adaptive_time_microseconds", "connect"]
BigintUnsignedMode = Literal["long", "precise"]


class PublishConfig(ConfigModel):
    """Everything ``databus publish`` needs; ``relay``, ``bootstrap_servers`` and
    ``topic_prefix`` are required."""

    relay: RelayAccess = Field(
        description="the relay to read: a URL, a comma-separated list of relays, or a relay"
        " cluster zk://HOST:PORT/NAME, with its credentials (databus.core.access, as every"
        " client)")
    bootstrap_servers: str = Field(
        min_length=1, description="Kafka brokers to start from, HOST:PORT[,HOST:PORT...]")
    topic_prefix: str = Field(
        description="first part of every topic name (Debezium's topic.prefix): data goes to"
        " <prefix>.<db>.<table>, transaction metadata to <prefix>.transaction, heartbeats"
        " to __debezium-heartbeat.<prefix>")
    name: str | None = Field(
        None, description="the publisher's name: its transactional.id is databus-publish-<name>"
        " and its position is the record keyed <name> in the offsets topic. Two publishers"
        " with one name fence each other. Default: the topic prefix")
    sources: list[str | int] = Field(
        default_factory=list,
        description="sources to publish, by name ('db.table') or id; empty = every source")
    offsets_topic: str = Field(
        "databus-publish-offsets",
        description="compacted topic holding each publisher's last published checkpoint,"
        " written in the transaction of the window it follows, and the newest claim of each"
        " name (created if missing)")
    tombstones_on_delete: bool = Field(
        True, description="after each delete, a message with the same key and a null value"
        " (lets Kafka's log compaction drop the key)")
    transaction_metadata: bool = Field(
        True, description="BEGIN and END records per source transaction on"
        " <prefix>.transaction, END with event counts per table (Debezium's"
        " provide.transaction.metadata)")
    heartbeat_interval: float = Field(
        10.0, ge=0, description="seconds without a published window after which a heartbeat"
        " goes to __debezium-heartbeat.<prefix>, then one every interval while idle; 0 = none")
    schemas_enable: bool = Field(
        True, description="JSON with the Kafka Connect 'schema' part beside the 'payload'"
        " (JsonConverter's schemas.enable); false = the payload alone")
    value_mode: ValueMode = Field(
        "databus", description="column values: 'databus' as the JSON envelope of"
        " docs/json.md (decimals as exact strings, dates ISO-8601); 'debezium' as Debezium's"
        " MySQL connector writes them (the three modes below)")
    decimal_handling_mode: DecimalMode = Field(
        "precise", description="value_mode debezium: DECIMAL as Connect Decimal bytes"
        " (precise), a plain string (string) or a double (double)")
    time_precision_mode: TimePrecisionMode = Field(
        "adaptive_time_microseconds", description="value_mode debezium: DATETIME as epoch ms or"
        " µs by its precision and TIME as µs (adaptive_time_microseconds), or Connect's"
        " Timestamp/Time in ms (connect)")
    bigint_unsigned_handling_mode: BigintUnsignedMode = Field(
        "long", description="value_mode debezium: BIGINT UNSIGNED as int64, wrapping above"
        " 2^63-1 as a Java long does (long), or Connect Decimal bytes (precise)")
    batch_windows: int = Field(
        100, ge=1, le=100_000, description="whole windows per Kafka transaction at most; 1 ="
        " a transaction per window (a transaction costs a few ms of round trips)")
    batch_linger: float = Field(
        0.1, ge=0, le=60, description="seconds a transaction stays open for more windows;"
        " then it is committed, also while the relay has nothing new (the latency it adds)")
    topic_partitions: int = Field(
        -1, description="partitions of the data topics the publisher creates; -1 = the"
        " broker's num.partitions")
    topic_replication_factor: int = Field(
        -1, description="replication factor of the topics the publisher creates; -1 = the"
        " broker's default.replication.factor")
    create_topics: bool = Field(
        True, description="create missing topics with the settings above (the offsets topic is"
        " always created compacted, with one partition and hourly segments); false = rely on"
        " the broker's auto.create.topics.enable")
    transaction_timeout_ms: int = Field(
        60_000, ge=1000, le=900_000, description="Kafka transaction timeout: a publisher that"
        " dies inside a transaction holds read_committed consumers back until it restarts or"
        " this passes")
    kafka_config: dict[str, str] = Field(
        default_factory=dict, description="more librdkafka properties (security.protocol,"
        " sasl.*, ssl.*, client tuning), passed to every Kafka client of the publisher")
    poll_timeout: float = Field(2.0, ge=0, le=600, description="relay long-poll seconds")
    max_retries: int = Field(
        100, ge=0, description="publishing one window is retried this many times in a row"
        " (backoff up to backoff_max) before the publisher stops")
    backoff_max: float = Field(10.0, gt=0, description="largest retry delay, seconds")

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, raw: Any) -> Any:
        return fold_relay_fields(raw, CLIENT_LEGACY_NAMES, "PublishConfig")

    @field_validator("topic_prefix", "offsets_topic")
    @classmethod
    def _topic(cls, v: str) -> str:
        if not _TOPIC.match(v) or v in (".", ".."):
            raise ValueError(f"{v!r} is not a Kafka topic name (letters, digits, '.', '_', '-')")
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        if v is not None and not _TOPIC.match(v):
            raise ValueError(f"{v!r}: a publisher name is letters, digits, '.', '_', '-'")
        return v

    @field_validator("kafka_config")
    @classmethod
    def _kafka(cls, v: dict[str, str]) -> dict[str, str]:
        taken = sorted(set(v) & RESERVED_KAFKA_KEYS)
        if taken:
            raise ValueError(f"{', '.join(taken)} cannot be set: the publisher's"
                             " exactly-once delivery depends on its own value")
        return {str(k): str(x) for k, x in v.items()}

    @property
    def publisher_name(self) -> str:
        return self.name if self.name is not None else self.topic_prefix

    @property
    def transactional_id(self) -> str:
        return f"databus-publish-{self.publisher_name}"


def read_kafka_properties(path: Path) -> dict[str, str]:
    """A librdkafka/Java ``.properties`` file: ``key=value`` lines, ``#``/``!`` comments."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read Kafka properties file {path}: {exc.strerror}") from exc
    out: dict[str, str] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        key, sep, value = line.partition("=")
        if not sep:
            key, sep, value = line.partition(":")
        if not sep or not key.strip():
            raise ConfigError(f"{path}:{n}: expected key=value")
        out[key.strip()] = value.strip()
    return out
