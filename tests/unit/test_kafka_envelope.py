"""Messages of ``databus publish``: topic names, keys, the envelope with and without
the Connect schema part, transaction metadata, heartbeats; the publisher's config and
the confluent-kafka error translator."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from databus.core.errors import (
    ConfigError,
    InvalidCheckpointError,
    KafkaFencedError,
    KafkaRequestError,
    KafkaUnavailableError,
)
from databus.core.schema import ColumnSpec, TableSchema, table_schema
from databus.kafka.config import PublishConfig, read_kafka_properties
from databus.kafka.envelope import MessageEncoder, TxPosition, topic_part

BASE = {"relay": "http://127.0.0.1:11115", "bootstrap_servers": "127.0.0.1:9092",
        "topic_prefix": "shop"}

SCHEMA = TableSchema(3, "inventory.order lines", 1, table_schema("inventory", "order lines", [
    ColumnSpec("id", "long", nullable=False), ColumnSpec("line", "long", nullable=False),
    ColumnSpec("price", {"type": "bytes", "logicalType": "decimal", "precision": 8,
                         "scale": 2}),
    ColumnSpec("note", "string")]), ("id", "line"))


def encoder(**more: Any) -> MessageEncoder:
    return MessageEncoder(PublishConfig(**{**BASE, **more}))


def value(enc: MessageEncoder, **more: Any) -> Any:
    import decimal
    codec = enc.codec(SCHEMA)
    args: dict[str, Any] = {
        "op": "c", "before": None,
        "after": {"id": 1, "line": 2, "price": decimal.Decimal("9.99"), "note": None},
        "meta": {"file": "mysql-bin.000003", "pos": 154, "server_id": 1, "row": 0},
        "scn": 42, "ts_ms": 1000, "snapshot": False, "tx": TxPosition("t1", 1, 1),
        "now_ms": 2000}
    args.update(more)
    return json.loads(enc.value(codec, **args))


def test_topics_follow_debezium_naming() -> None:
    enc = encoder()
    assert enc.data_topic("inventory.customers") == "shop.inventory.customers"
    assert enc.codec(SCHEMA).topic == "shop.inventory.order_lines"  # a space is refused
    assert enc.transaction_topic == "shop.transaction"
    assert enc.heartbeat_topic == "__debezium-heartbeat.shop"
    assert topic_part("a/b ü") == "a_b__"


def test_key_is_the_primary_key_struct_with_its_schema() -> None:
    enc = encoder()
    key = json.loads(enc.key(enc.codec(SCHEMA), {"id": 1, "line": 2, "note": "x"}) or b"")
    assert key["payload"] == {"id": 1, "line": 2}
    assert key["schema"]["name"] == "shop.inventory.order_lines.Key"
    assert [f["field"] for f in key["schema"]["fields"]] == ["id", "line"]
    plain = encoder(schemas_enable=False)
    assert json.loads(plain.key(plain.codec(SCHEMA), {"id": 1, "line": 2}) or b"") == \
        {"id": 1, "line": 2}


def test_envelope_of_each_op() -> None:
    enc = encoder(schemas_enable=False)
    created = value(enc)
    assert created["op"] == "c" and created["before"] is None
    assert created["after"] == {"id": 1, "line": 2, "price": "9.99", "note": None}
    assert created["source"]["db"] == "inventory" and created["source"]["table"] == "order lines"
    assert created["source"]["file"] == "mysql-bin.000003" and created["source"]["pos"] == 154
    assert created["source"]["snapshot"] == "false" and created["source"]["scn"] == 42
    assert created["source"]["ts_ms"] == 1000 and created["ts_ms"] == 2000
    assert created["transaction"] == {"id": "t1", "total_order": 1, "data_collection_order": 1}
    row = {"id": 1, "line": 2, "price": None, "note": "n"}
    updated = value(enc, op="u", before=row, after={**row, "note": "m"})
    assert updated["before"]["note"] == "n" and updated["after"]["note"] == "m"
    deleted = value(enc, op="d", before=row, after=None)
    assert deleted["after"] is None and deleted["before"] == row
    read = value(enc, op="r", snapshot=True, tx=None)
    assert read["source"]["snapshot"] == "true" and read["transaction"] is None


def test_envelope_schema_part_describes_the_payload() -> None:
    enc = encoder(value_mode="debezium")
    msg = value(enc)
    schema = msg["schema"]
    assert schema["name"] == "shop.inventory.order_lines.Envelope"
    fields = {f["field"]: f for f in schema["fields"]}
    assert list(fields) == ["before", "after", "source", "op", "ts_ms", "transaction"]
    assert fields["after"]["name"] == "shop.inventory.order_lines.Value"
    price = {f["field"]: f for f in fields["after"]["fields"]}["price"]
    assert price["name"] == "org.apache.kafka.connect.data.Decimal"
    assert msg["payload"]["after"]["price"] == "A+c="  # 999 as Connect Decimal bytes
    assert fields["source"]["name"] == "io.debezium.connector.mysql.Source"
    assert {f["field"] for f in fields["source"]["fields"]} >= set(msg["payload"]["source"])


def test_transaction_metadata_and_heartbeat_messages() -> None:
    enc = encoder(schemas_enable=False)
    assert json.loads(enc.tx_key("t1")) == {"id": "t1"}
    begin = json.loads(enc.tx_begin("t1", 5))
    assert begin == {"status": "BEGIN", "id": "t1", "event_count": None,
                     "data_collections": None, "ts_ms": 5}
    end = json.loads(enc.tx_end("t1", 6, {"inventory.a": 2, "inventory.b": 1}))
    assert end["status"] == "END" and end["event_count"] == 3
    assert end["data_collections"] == [{"data_collection": "inventory.a", "event_count": 2},
                                       {"data_collection": "inventory.b", "event_count": 1}]
    assert json.loads(enc.heartbeat_key()) == {"serverName": "shop"}
    assert json.loads(enc.heartbeat_value(7))["scn"] == 7
    with_schema = encoder()
    assert json.loads(with_schema.tx_end("t1", 6, {}))["schema"]["name"].endswith(
        "TransactionMetadataValue")


# -- config ------------------------------------------------------------------------------------

def test_config_defaults_and_names() -> None:
    cfg = PublishConfig(**BASE)
    assert cfg.publisher_name == "shop" and cfg.transactional_id == "databus-publish-shop"
    assert cfg.tombstones_on_delete and cfg.transaction_metadata and cfg.schemas_enable
    assert PublishConfig(**BASE, name="p2").transactional_id == "databus-publish-p2"


@pytest.mark.parametrize(("more", "field"), [
    ({"topic_prefix": "a b"}, "topic_prefix"),
    ({"relay": "ftp://x"}, "relay"),
    ({"value_mode": "avro"}, "value_mode"),
    ({"decimal_handling_mode": "exact"}, "decimal_handling_mode"),
    ({"kafka_config": {"transactional.id": "x"}}, "kafka_config"),
    ({"heartbeat_interval": -1}, "heartbeat_interval"),
    ({"batch_windows": 0}, "batch_windows"),
    ({"colour": "red"}, "colour"),
])
def test_config_errors_are_one_line_naming_the_field(more: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as exc:
        PublishConfig(**{**BASE, **more})
    assert field in str(exc.value) and "\n" not in str(exc.value)


def test_kafka_properties_file(tmp_path: Path) -> None:
    f = tmp_path / "k.properties"
    f.write_text("# security\nsecurity.protocol=SASL_SSL\nsasl.mechanism = PLAIN\n\n"
                 "sasl.password=a=b\n")
    assert read_kafka_properties(f) == {"security.protocol": "SASL_SSL",
                                        "sasl.mechanism": "PLAIN", "sasl.password": "a=b"}
    f.write_text("nonsense\n")
    with pytest.raises(ConfigError, match=r"k\.properties:1"):
        read_kafka_properties(f)


# -- offsets records and the error translator (need confluent-kafka) ---------------------------

def test_offset_records_round_trip_and_foreign_records_are_refused() -> None:
    pytest.importorskip("confluent_kafka")
    from databus.core.checkpoint import Checkpoint
    from databus.kafka.offsets import offset_record, parse_record

    cp = Checkpoint.flexible().window_done(17)
    back = parse_record("offs", "p", offset_record("p", cp))
    assert back is not None and back.window_scn == 17 and not back.in_window
    assert parse_record("offs", "p", None) is None  # a tombstone resets the publisher
    for foreign in (b"not json", b'{"scn": 3}', offset_record("other", cp)):
        with pytest.raises(InvalidCheckpointError, match="not a databus publisher position"):
            parse_record("offs", "p", foreign)


def test_kafka_errors_are_translated_by_type() -> None:
    pytest.importorskip("confluent_kafka")
    from confluent_kafka import KafkaError, KafkaException

    from databus.kafka.errors import kafka_errors, translate

    assert isinstance(translate(KafkaError(KafkaError._FENCED, fatal=True), "x"),
                      KafkaFencedError)
    # after its fatal error a producer answers every call with _FATAL: fenced, most often
    assert isinstance(translate(KafkaError(KafkaError._FATAL, fatal=True), "x"),
                      KafkaFencedError)
    assert isinstance(translate(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED), "x"),
                      KafkaRequestError)
    assert isinstance(translate(KafkaError(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
                                           fatal=True), "x"), KafkaRequestError)
    timed_out = translate(KafkaError(KafkaError._TIMED_OUT, retriable=True), "committing")
    assert isinstance(timed_out, KafkaUnavailableError) and timed_out.retryable
    assert timed_out.retriable and timed_out.kafka_code == "_TIMED_OUT"
    abortable = translate(KafkaError(KafkaError._STATE, txn_requires_abort=True), "x")
    assert isinstance(abortable, KafkaUnavailableError) and abortable.txn_requires_abort
    with pytest.raises(KafkaUnavailableError, match="producing"), kafka_errors("producing"):
        raise KafkaException(KafkaError(KafkaError._TRANSPORT))
    with pytest.raises(KafkaUnavailableError, match="queue full"), kafka_errors("producing"):
        raise BufferError("Local: Queue full")
