"""The messages ``databus publish`` writes: Debezium's topic names, keys and envelope.

* data topic ``<prefix>.<db>.<table>`` (characters Kafka refuses become ``_``);
* key: the primary key as a struct, ``{"id": 7}`` (a table without a key: no key);
* value: the change envelope ``{"before", "after", "source", "op", "ts_ms",
  "transaction"}``; after a delete, a tombstone (same key, null value) when enabled;
* ``<prefix>.transaction``: ``BEGIN`` and ``END`` per source transaction, keyed
  ``{"id": txid}``, the END with ``event_count`` and ``data_collections``;
* ``__debezium-heartbeat.<prefix>``: ``{"serverName": prefix}`` -> ``{"ts_ms", "scn"}``.

With ``schemas_enable`` every key and value is ``{"schema": <Connect schema>,
"payload": <value>}`` (Kafka Connect's JsonConverter form); without, the payload alone.
Per schema version the codecs and the schema JSON text are built once
(:class:`TableCodec`). Column values: :mod:`databus.kafka.values`.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from databus import __version__
from databus.core.schema import TableSchema
from databus.kafka.config import PublishConfig
from databus.kafka.values import ColumnCodec, ValueOptions, column_codec

_BAD_TOPIC_CHARS = re.compile(r"[^A-Za-z0-9._-]")

SOURCE_FIELDS: list[tuple[str, str, bool]] = [
    # (field, Connect type, optional)
    ("version", "string", False), ("connector", "string", False), ("name", "string", False),
    ("ts_ms", "int64", False), ("snapshot", "string", True), ("db", "string", False),
    ("sequence", "string", True), ("table", "string", True), ("server_id", "int64", True),
    ("gtid", "string", True), ("file", "string", True), ("pos", "int64", True),
    ("row", "int32", True), ("thread", "int64", True), ("query", "string", True),
    ("scn", "int64", False),
]

_TX_BLOCK = {"type": "struct", "optional": True, "name": "event.block", "version": 1,
             "field": "transaction", "fields": [
                 {"type": "string", "optional": False, "field": "id"},
                 {"type": "int64", "optional": False, "field": "total_order"},
                 {"type": "int64", "optional": False, "field": "data_collection_order"}]}

_TX_KEY_SCHEMA = {"type": "struct", "optional": False,
                  "name": "io.debezium.connector.common.TransactionMetadataKey",
                  "fields": [{"type": "string", "optional": False, "field": "id"}]}
_TX_VALUE_SCHEMA = {
    "type": "struct", "optional": False,
    "name": "io.debezium.connector.common.TransactionMetadataValue", "version": 1,
    "fields": [
        {"type": "string", "optional": False, "field": "status"},
        {"type": "string", "optional": False, "field": "id"},
        {"type": "int64", "optional": True, "field": "event_count"},
        {"type": "array", "optional": True, "field": "data_collections", "items": {
            "type": "struct", "optional": False, "name": "event.collection", "version": 1,
            "fields": [{"type": "string", "optional": False, "field": "data_collection"},
                       {"type": "int64", "optional": False, "field": "event_count"}]}},
        {"type": "int64", "optional": False, "field": "ts_ms"}]}
_HEARTBEAT_KEY_SCHEMA = {"type": "struct", "optional": False,
                         "name": "io.debezium.connector.common.ServerNameKey",
                         "fields": [{"type": "string", "optional": False,
                                     "field": "serverName"}]}
_HEARTBEAT_VALUE_SCHEMA = {"type": "struct", "optional": False,
                           "name": "io.debezium.connector.common.Heartbeat",
                           "fields": [{"type": "int64", "optional": False, "field": "ts_ms"},
                                      {"type": "int64", "optional": True, "field": "scn"}]}


def dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def topic_part(text: str) -> str:
    """A name as a part of a topic name (characters Kafka refuses become ``_``)."""
    return _BAD_TOPIC_CHARS.sub("_", text)


@dataclass(frozen=True)
class TxPosition:
    """Where a data event stands in its source transaction."""

    id: str
    total_order: int
    data_collection_order: int


@dataclass
class TableCodec:
    """Topic, key and value encoding of one schema version of one table."""

    topic: str
    columns: list[ColumnCodec]
    key_columns: list[ColumnCodec]
    db: str
    table: str
    key_schema_text: str | None
    value_schema_text: str | None
    schema_name: str = field(default="")

    def row(self, row: dict[str, Any] | None) -> dict[str, Any] | None:
        if row is None:
            return None
        return {c.column: c.convert(row.get(c.column)) for c in self.columns}

    def key(self, row: dict[str, Any] | None) -> dict[str, Any] | None:
        if not self.key_columns or row is None:
            return None
        return {c.column: c.convert(row.get(c.column)) for c in self.key_columns}


class MessageEncoder:
    """Builds every message the publisher writes (see the module docstring)."""

    def __init__(self, cfg: PublishConfig) -> None:
        self.prefix = cfg.topic_prefix
        self.schemas_enable = cfg.schemas_enable
        self.debezium = cfg.value_mode == "debezium"
        self.options = ValueOptions(cfg.value_mode, cfg.decimal_handling_mode,
                                    cfg.time_precision_mode, cfg.bigint_unsigned_handling_mode)
        self.source_name = ("io.debezium.connector.mysql.Source" if self.debezium
                            else "databus.Source")
        self._codecs: dict[bytes, TableCodec] = {}

    # -- topics ----------------------------------------------------------------------

    def data_topic(self, source: str) -> str:
        db, _, table = source.partition(".")
        return f"{self.prefix}.{topic_part(db)}.{topic_part(table)}"

    @property
    def transaction_topic(self) -> str:
        return f"{self.prefix}.transaction"

    @property
    def heartbeat_topic(self) -> str:
        return f"__debezium-heartbeat.{self.prefix}"

    # -- data ------------------------------------------------------------------------

    def codec(self, schema: TableSchema) -> TableCodec:
        found = self._codecs.get(schema.id)
        if found is not None:
            return found
        columns = [column_codec(f, self.options) for f in schema.avro["fields"]]
        by_name = {c.column: c for c in columns}
        keys = [by_name[k] for k in schema.key_columns if k in by_name]
        topic = self.data_topic(schema.name)
        db, _, table = schema.name.partition(".")
        key_schema = value_schema = None
        if self.schemas_enable:
            if keys:
                key_schema = dumps({"type": "struct", "optional": False,
                                    "name": f"{topic}.Key",
                                    "fields": [{**c.schema, "optional": False} for c in keys]})
            value_schema = dumps(self._envelope_schema(topic, columns))
        codec = TableCodec(topic, columns, keys, db, table, key_schema, value_schema,
                           schema.name)
        self._codecs[schema.id] = codec
        return codec

    def _envelope_schema(self, topic: str, columns: list[ColumnCodec]) -> dict[str, Any]:
        row = {"type": "struct", "name": f"{topic}.Value", "optional": True,
               "fields": [c.schema for c in columns]}
        source = {"type": "struct", "optional": False, "name": self.source_name,
                  "field": "source",
                  "fields": [{"type": t, "optional": opt, "field": f}
                             for f, t, opt in SOURCE_FIELDS]}
        return {"type": "struct", "optional": False, "name": f"{topic}.Envelope",
                "version": 1, "fields": [
                    {**row, "field": "before"}, {**row, "field": "after"}, source,
                    {"type": "string", "optional": False, "field": "op"},
                    {"type": "int64", "optional": True, "field": "ts_ms"}, _TX_BLOCK]}

    def _wrap(self, schema_text: str | None, payload: Any) -> bytes:
        if not self.schemas_enable:
            return dumps(payload).encode("utf-8")
        head = schema_text if schema_text is not None else "null"
        return f'{{"schema":{head},"payload":{dumps(payload)}}}'.encode()

    def key(self, codec: TableCodec, row: dict[str, Any] | None) -> bytes | None:
        key = codec.key(row)
        if key is None:
            return None
        return self._wrap(codec.key_schema_text, key)

    def value(self, codec: TableCodec, *, op: str, before: dict[str, Any] | None,
              after: dict[str, Any] | None, meta: dict[str, Any], scn: int, ts_ms: int,
              snapshot: bool, tx: TxPosition | None, now_ms: int) -> bytes:
        """The envelope of one change (``meta``: the event's source position)."""
        payload = {
            "before": codec.row(before),
            "after": codec.row(after),
            "source": {
                "version": __version__, "connector": "mysql" if self.debezium else "databus",
                "name": self.prefix, "ts_ms": ts_ms,
                "snapshot": "true" if snapshot else "false",
                "db": codec.db, "sequence": None, "table": codec.table,
                "server_id": meta.get("server_id"), "gtid": meta.get("gtid"),
                "file": meta.get("file"), "pos": meta.get("pos"), "row": meta.get("row"),
                "thread": None, "query": None, "scn": scn,
            },
            "op": op,
            "ts_ms": now_ms,
            "transaction": None if tx is None else {
                "id": tx.id, "total_order": tx.total_order,
                "data_collection_order": tx.data_collection_order},
        }
        return self._wrap(codec.value_schema_text, payload)

    # -- transaction metadata and heartbeats -------------------------------------------

    def tx_key(self, txid: str) -> bytes:
        return self._wrap(dumps(_TX_KEY_SCHEMA), {"id": txid})

    def tx_begin(self, txid: str, ts_ms: int) -> bytes:
        return self._wrap(dumps(_TX_VALUE_SCHEMA), {
            "status": "BEGIN", "id": txid, "event_count": None, "data_collections": None,
            "ts_ms": ts_ms})

    def tx_end(self, txid: str, ts_ms: int, counts: dict[str, int]) -> bytes:
        return self._wrap(dumps(_TX_VALUE_SCHEMA), {
            "status": "END", "id": txid, "event_count": sum(counts.values()),
            "data_collections": [{"data_collection": c, "event_count": n}
                                 for c, n in counts.items()],
            "ts_ms": ts_ms})

    def heartbeat_key(self) -> bytes:
        return self._wrap(dumps(_HEARTBEAT_KEY_SCHEMA), {"serverName": self.prefix})

    def heartbeat_value(self, scn: int | None) -> bytes:
        return self._wrap(dumps(_HEARTBEAT_VALUE_SCHEMA),
                          {"ts_ms": time.time_ns() // 1_000_000, "scn": scn})
