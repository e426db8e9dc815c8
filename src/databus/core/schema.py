"""Avro schemas of captured tables: one schema per table version, id = digest.

A source describes a table as a list of :class:`ColumnSpec` (name, Avro type,
nullability) plus its key columns; :func:`table_schema` turns that into an
Avro record schema. The schema id is the MD5 digest (16 bytes) of the schema's
canonical JSON text (keys sorted, no spaces), so equal schemas have equal ids on
every machine. Not Avro's Parsing Canonical Form: it drops ``logicalType``,
``precision`` and ``scale``, so ``DECIMAL(10,2)`` and ``DECIMAL(12,4)`` would
share an id and a consumer would decode one with the other's scale.

The metadata part of a data event is Avro of :data:`METADATA_SCHEMA`: the
before image (Avro of the row schema, as bytes) and where the change came from.
"""

from __future__ import annotations

import hashlib
import io
import json
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import fastavro

from databus.core import jsonsafe
from databus.core.errors import SchemaError, UnknownSourceError

AvroType = str | dict[str, Any] | list[Any]

METADATA_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "EventMetadata",
    "namespace": "databus",
    "fields": [
        {"name": "before", "type": ["null", "bytes"], "default": None},
        {"name": "txid", "type": ["null", "string"], "default": None},
        {"name": "file", "type": ["null", "string"], "default": None},
        {"name": "pos", "type": ["null", "long"], "default": None},
        {"name": "gtid", "type": ["null", "string"], "default": None},
        {"name": "server_id", "type": ["null", "long"], "default": None},
        {"name": "row", "type": ["null", "int"], "default": None},
    ],
}


INTERNAL_PREFIX = "databus."
"""Logical sources named so are the system's own notices, not captured tables."""

SCHEMA_CHANGES = "databus.schema_changes"
"""Logical source of DDL notices (one row per table a DDL statement changes)."""


def schema_digest(avro: dict[str, Any]) -> bytes:
    """MD5 of the canonical JSON text (every attribute kept): the schema id."""
    text = json.dumps(avro, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.md5(text.encode("utf-8")).digest()


@dataclass(frozen=True, slots=True)
class ColumnSpec:
    """One column: its name, Avro type (without null) and whether it may be NULL."""

    name: str
    avro_type: AvroType
    nullable: bool = True
    sql_type: str = ""


def _avro_name(text: str) -> str:
    """A valid Avro name ([A-Za-z_][A-Za-z0-9_]*): other characters become ``_``
    (non-ASCII letters too: Java and Spark readers reject them)."""
    out = "".join(c if (c.isascii() and c.isalnum()) or c == "_" else "_" for c in text)
    return out if out and not out[0].isdigit() else f"_{out}"


def table_schema(namespace: str, table: str, columns: Iterable[ColumnSpec]) -> dict[str, Any]:
    """The Avro record schema of a table version."""
    fields: list[dict[str, Any]] = []
    used: set[str] = set()
    for col in columns:
        name = _avro_name(col.name)
        if name in used:  # "a-b" beside "a_b", or two non-ASCII names: keep both
            n = 2
            while f"{name}_{n}" in used:
                n += 1
            name = f"{name}_{n}"
        used.add(name)
        ftype: AvroType = col.avro_type
        if col.nullable:
            ftype = ["null", *col.avro_type] if isinstance(col.avro_type, list) else ["null", col.avro_type]
        entry: dict[str, Any] = {"name": name, "type": ftype}
        if col.nullable:
            entry["default"] = None
        if col.sql_type:
            entry["sql_type"] = col.sql_type
        if name != col.name:
            entry["column"] = col.name
        fields.append(entry)
    return {
        "type": "record",
        "name": _avro_name(table),
        "namespace": _avro_name(namespace),
        "fields": fields,
    }


@dataclass(frozen=True)
class TableSchema:
    """One version of one logical source's schema."""

    src_id: int
    name: str  # "db.table"
    version: int
    avro: dict[str, Any]
    key_columns: tuple[str, ...]
    id: bytes = field(init=False)
    _parsed: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            parsed = fastavro.parse_schema(self.avro)
        # broad: fastavro's boundary; it raises several unrelated types (its own,
        # ValueError, TypeError, KeyError, ...), every one a schema it refuses
        except Exception as exc:
            raise SchemaError(f"invalid Avro schema for {self.name}: {exc}") from exc
        object.__setattr__(self, "_parsed", parsed)
        object.__setattr__(self, "id", schema_digest(self.avro))

    @property
    def column_names(self) -> list[str]:
        return [f.get("column", f["name"]) for f in self.avro["fields"]]

    def encode(self, row: dict[str, Any]) -> bytes:
        """Avro binary of a row whose keys are the Avro field names."""
        buf = io.BytesIO()
        try:
            fastavro.schemaless_writer(buf, self._parsed, row)
        except (ValueError, TypeError, AttributeError, KeyError) as exc:
            raise SchemaError(f"row does not fit schema {self.name} v{self.version}: {exc}") from exc
        return buf.getvalue()

    def decode(self, data: bytes) -> dict[str, Any]:
        try:
            out = fastavro.schemaless_reader(io.BytesIO(data), self._parsed, None)
        # broad: fastavro's boundary; bad bytes raise EOFError, ValueError, IndexError,
        # OverflowError, ...: every one is data that does not decode
        except Exception as exc:
            raise SchemaError(f"cannot decode {self.name} v{self.version}: {exc}") from exc
        if not isinstance(out, dict):
            raise SchemaError(f"{self.name} v{self.version} is not a record schema")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.src_id,
            "name": self.name,
            "version": self.version,
            "schemaId": self.id.hex(),
            "keys": list(self.key_columns),
            "schema": self.avro,
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TableSchema:
        try:
            ts = cls(
                src_id=int(raw["id"]),
                name=str(raw["name"]),
                version=int(raw["version"]),
                avro=raw["schema"],
                key_columns=tuple(raw["keys"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SchemaError(f"malformed schema entry: {exc}") from exc
        if ts.id.hex() != raw.get("schemaId", ts.id.hex()):
            raise SchemaError(f"schema id mismatch for {ts.name} v{ts.version}")
        return ts


class MetadataCodec:
    """Encodes/decodes the metadata part."""

    ID: ClassVar[bytes] = schema_digest(METADATA_SCHEMA)  # the metadata schema id

    def __init__(self) -> None:
        self._parsed = fastavro.parse_schema(METADATA_SCHEMA)
        self.id = self.ID

    def encode(self, meta: dict[str, Any]) -> bytes:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, self._parsed, meta)
        return buf.getvalue()

    def decode(self, data: bytes) -> dict[str, Any]:
        try:
            out = fastavro.schemaless_reader(io.BytesIO(data), self._parsed, None)
        except Exception as exc:  # broad: fastavro's boundary, as in TableSchema.decode
            raise SchemaError(f"cannot decode the metadata part: {exc}") from exc
        if not isinstance(out, dict):
            raise SchemaError("metadata part is not a record")
        return out


class SchemaRegistry:
    """All table versions known to a relay or a client, by id and by source.

    Thread-safe: a capture thread may add a version while server threads read.
    """

    def __init__(self, schemas: Iterable[TableSchema] = ()) -> None:
        self._lock = threading.Lock()
        self._by_id: dict[bytes, TableSchema] = {}
        self._by_src: dict[int, list[TableSchema]] = {}
        self.metadata = MetadataCodec()
        for s in schemas:
            self.add(s)

    def add(self, schema: TableSchema) -> None:
        """Register a version (idempotent for an identical schema)."""
        with self._lock:
            known = self._by_id.get(schema.id)
            if known is not None and known.src_id == schema.src_id:
                return
            self._by_id[schema.id] = schema
            # readers hold the old list; a new one is swapped in whole
            versions = sorted([*self._by_src.get(schema.src_id, []), schema],
                              key=lambda s: s.version)
            by_src = dict(self._by_src)
            by_src[schema.src_id] = versions
            self._by_src = by_src

    def get(self, schema_id: bytes) -> TableSchema:
        try:
            return self._by_id[schema_id]
        except KeyError:
            raise SchemaError(f"unknown schema id {schema_id.hex()}") from None

    def find(self, schema_id: bytes) -> TableSchema | None:
        return self._by_id.get(schema_id)

    def versions(self, src_id: int) -> list[TableSchema]:
        try:
            return list(self._by_src[src_id])
        except KeyError:
            raise UnknownSourceError(f"unknown source id {src_id}") from None

    def latest(self, src_id: int) -> TableSchema:
        return self.versions(src_id)[-1]

    def source_ids(self) -> list[int]:
        return sorted(self._by_src.copy())

    def to_json(self, src_ids: Iterable[int] | None = None) -> str:
        ids = self.source_ids() if src_ids is None else list(src_ids)
        return json.dumps([s.to_dict() for i in ids for s in self.versions(i)])

    @classmethod
    def from_json(cls, text: str | bytes) -> SchemaRegistry:
        try:
            raw = jsonsafe.loads(text, 64)  # Avro types nest: a list > schema > field > type
        except ValueError as exc:
            raise SchemaError(f"schema list is not JSON: {exc}") from exc
        if not isinstance(raw, list):
            raise SchemaError("schema list must be a JSON array")
        return cls(TableSchema.from_dict(r) for r in raw)
