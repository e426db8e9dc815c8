"""PostgreSQL types -> Avro: the table version of a pgoutput Relation, row encoding.

pgoutput sends every value as text, the output of the column type's output
function, i.e. what ``SELECT col::text`` returns in a session with the source's
settings (:data:`~databus.sources.postgres.connection.SESSION_SETTINGS`).
A value keeps that text unless a plain Avro type holds it exactly:

============================  ==========  ===================================
PostgreSQL                    Avro        value
============================  ==========  ===================================
smallint, integer, bigint,    long        the integer
oid
boolean                       boolean     ``t`` -> true
real, double precision        double      the number; NaN and +-Infinity too
bytea                         bytes       the bytes (hex text decoded)
everything else               string      the text, unchanged: numeric (any
                                          precision, NaN, +-Infinity), money,
                                          char/varchar/text, date/time types
                                          (infinity too), interval, uuid,
                                          json/jsonb, arrays, enums, domains,
                                          network and bit types, tsvector,
                                          types of extensions
============================  ==========  ===================================

Each field's ``sql_type`` is the column's type as ``format_type`` names it. A
domain or an enum is the text of its base type or label.
"""

from __future__ import annotations

import binascii
import json
import struct
from collections.abc import Callable
from typing import Any

from databus.core.avrobin import long_bytes
from databus.core.errors import SchemaError
from databus.core.schema import AvroType, ColumnSpec, TableSchema, table_schema
from databus.sources.common.names import source_id

BOOL, BYTEA, INT8, INT2, INT4, OID, FLOAT4, FLOAT8 = 16, 17, 20, 21, 23, 26, 700, 701
INTEGERS = frozenset({INT8, INT2, INT4, OID})

_AVRO: dict[int, AvroType] = {BOOL: "boolean", BYTEA: "bytes", INT8: "long", INT2: "long",
                              INT4: "long", OID: "long", FLOAT4: "double", FLOAT8: "double"}


def avro_type(type_oid: int) -> AvroType:
    return _AVRO.get(type_oid, "string")


def _bytea(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    if raw.startswith(b"\\x"):
        try:
            return binascii.unhexlify(raw[2:])
        except (binascii.Error, ValueError):
            pass
    raise SchemaError(f"bytea value not in hex form: {raw[:20]!r}")


def _bool(text: str | bytes) -> bool:
    return text in ("t", b"t")


def _text(text: str | bytes) -> str | bytes:
    return text  # UTF-8 bytes stay bytes until written (see _avro_string)


def converter(type_oid: int) -> Callable[[Any], Any]:
    """Text of a value (str, or UTF-8 bytes from pgoutput) -> the Python value its Avro
    type takes (``string`` columns: the text as given)."""
    if type_oid in INTEGERS:
        return int
    if type_oid in (FLOAT4, FLOAT8):
        return float
    if type_oid == BOOL:
        return _bool
    if type_oid == BYTEA:
        return _bytea
    return _text


_DOUBLE = struct.Struct("<d")
_LONGS = tuple(long_bytes(i) for i in range(4096))  # lengths and small numbers


def _avro_long(v: Any) -> bytes:
    return _LONGS[v] if 0 <= v < 4096 else long_bytes(v)


def _avro_bool(v: Any) -> bytes:
    return b"\x01" if v else b"\x00"


def _avro_double(v: Any) -> bytes:
    return _DOUBLE.pack(v)


def _avro_bytes(v: Any) -> bytes:
    n = len(v)
    return (_LONGS[n] if n < 4096 else long_bytes(n)) + bytes(v)


def _avro_string(v: Any) -> bytes:
    raw = v if isinstance(v, bytes) else str(v).encode("utf-8")
    n = len(raw)
    return (_LONGS[n] if n < 4096 else long_bytes(n)) + raw


_ENCODERS: dict[Any, Callable[[Any], bytes]] = {
    "long": _avro_long, "boolean": _avro_bool, "double": _avro_double, "bytes": _avro_bytes,
    "string": _avro_string}


def _key_json(v: Any) -> Any:
    if isinstance(v, bytes):
        return {"hex": v.hex()}
    if isinstance(v, float):
        return repr(v)
    return v


class TableVersion:
    """One shape of one table (columns, types, key) and its Avro schema.

    Its columns are the ones the source keeps (:mod:`databus.sources.columns`);
    ``wire`` gives their positions among the relation's ``width`` columns (the
    tuples pgoutput sends) when some are left out, else it is None. Every other
    method works on the kept columns only: a tuple from the wire goes through
    :meth:`project` first; snapshots select the kept columns themselves.
    """

    def __init__(self, schema: TableSchema, type_oids: list[int], key_index: list[int],
                 wire: tuple[int, ...] | None = None, width: int | None = None) -> None:
        self.schema = schema
        self.wire = wire
        self.width = len(type_oids) if width is None else width
        if wire is not None and (len(wire) != len(type_oids)
                                 or any(not 0 <= w < self.width for w in wire)):
            raise SchemaError(f"{schema.name}: kept columns {wire} do not fit {self.width}")
        self.type_oids = type_oids
        self.fields = [f["name"] for f in schema.avro["fields"]]
        self.convert = [converter(t) for t in type_oids]
        # Avro binary by hand (every field is ["null", T]: union index 0 or 1, then T):
        # the same bytes fastavro writes for these types, several times faster
        self._avro = [avro_type(t) for t in type_oids]
        self.avro_types: tuple[AvroType, ...] = tuple(self._avro)
        self._encoders = [_ENCODERS[a] for a in self._avro]
        self.key_index = key_index  # positions of the key columns; empty: row index
        self.int_key = len(key_index) == 1 and type_oids[key_index[0]] in INTEGERS

    def project(self, texts: list[Any]) -> list[Any]:
        """A relation's tuple (all its columns) -> the values of the kept columns."""
        wire = self.wire
        if wire is None:
            return texts
        if len(texts) != self.width:
            raise SchemaError(f"{self.schema.name}: a tuple of {len(texts)} columns for a"
                              f" relation of {self.width}")
        return [texts[i] for i in wire]

    def typed(self, texts: list[Any]) -> tuple[list[Any], bytes]:
        """Texts (None for NULL) -> (typed values, their Avro record): :meth:`values`
        and :meth:`encode` in one pass."""
        values: list[Any] = []
        out: list[bytes] = []
        for t, conv, enc in zip(texts, self.convert, self._encoders, strict=True):
            if t is None:
                values.append(None)
                out.append(b"\x00")
            else:
                v = conv(t)
                values.append(v)
                out.append(b"\x02" + enc(v))
        return values, b"".join(out)

    def values(self, texts: list[Any]) -> list[Any]:
        """Texts (None for NULL) -> typed values (text columns: as given)."""
        return [None if t is None else c(t) for t, c in zip(texts, self.convert, strict=True)]

    def record(self, values: list[Any]) -> dict[str, Any]:
        """The Avro record of typed values (text as str)."""
        return {f: v.decode("utf-8") if isinstance(v, bytes) and a == "string" else v
                for f, v, a in zip(self.fields, values, self._avro, strict=True)}

    def encode(self, values: list[Any]) -> bytes:
        return b"".join([b"\x00" if v is None else b"\x02" + enc(v)
                         for v, enc in zip(values, self._encoders, strict=True)])

    def key(self, values: list[Any], row_index: int) -> int | bytes:
        if not self.key_index:
            return row_index
        if self.int_key and values[self.key_index[0]] is not None:
            return int(values[self.key_index[0]])
        return json.dumps([_key_json(values[i].decode("utf-8")
                                     if self._avro[i] == "string" and isinstance(values[i], bytes)
                                     else values[i]) for i in self.key_index],
                          ensure_ascii=False, separators=(",", ":")).encode()


def version_schema(namespace: str, table: str, names: list[str], type_oids: list[int],
                   sql_types: list[str], keys: list[str], number: int) -> TableSchema:
    """The Avro schema of one table version (every column nullable, as pgoutput may
    send NULL for any column of a key-only old tuple)."""
    specs = [ColumnSpec(n, avro_type(t), nullable=True, sql_type=s)
             for n, t, s in zip(names, type_oids, sql_types, strict=True)]
    name = f"{namespace}.{table}"
    return TableSchema(source_id(name), name, number, table_schema(namespace, table, specs),
                       tuple(keys))
