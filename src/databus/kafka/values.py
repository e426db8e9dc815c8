"""Column values of published rows, and their Kafka Connect schema, in two modes.

A column is described by its Avro field (type, logical type, nullability) and, where
the source recorded it, its declared SQL type (``sql_type``). :func:`column_codec`
turns one field into a :class:`ColumnCodec`: the function that makes a decoded Python
value JSON-ready, and the Connect field schema (``{"type": "int64", ...}``) the
``schema`` part of a message names it with.

``databus`` mode: the values of the JSON envelope (docs/json.md): integers and floats
as numbers, decimals as exact strings, dates, times and timestamps as ISO-8601 text,
bytes as base64.

``debezium`` mode: the values Debezium's MySQL connector writes (its documented type
mapping), so that a consumer written for it reads ours unchanged:

=========================  =========================================================
column (Avro here)         value (Connect schema name)
=========================  =========================================================
DECIMAL (decimal)          precise: base64 of the unscaled value, big-endian two's
                           complement, shortest form (``...connect.data.Decimal``,
                           parameters scale and precision); string: plain text;
                           double: a JSON number
BIGINT UNSIGNED            long: the number, above 2^63-1 wrapped as a Java long;
(decimal(20,0))            precise: as a DECIMAL(20,0) in precise mode
DATE (date)                days since 1970-01-01 (``io.debezium.time.Date``;
                           connect: ``org.apache.kafka.connect.data.Date``)
DATETIME (local-ts)        adaptive: ms since the epoch for precision 0-3
                           (``io.debezium.time.Timestamp``), µs for 4-6
                           (``io.debezium.time.MicroTimestamp``); connect: ms
                           (``org.apache.kafka.connect.data.Timestamp``)
TIMESTAMP (timestamp)      ISO-8601 in UTC, ``Z``, fraction without trailing zeros
                           (``io.debezium.time.ZonedTimestamp``)
TIME (sql_type TIME)       adaptive_time_microseconds: µs (``io.debezium.time.MicroTime``);
                           connect: ms of the day, int32 (``...connect.data.Time``)
bytes                      base64 (Connect's JSON form of bytes)
FLOAT (float)              the shortest text of the 4-byte float (both modes)
=========================  =========================================================

From a MySQL field's declared type (``sql_type``, made by the MySQL source), in
``debezium`` mode: integers as ``int16``/``int32``/``int64`` by width and sign, YEAR
(``io.debezium.time.Year``), BIT(1) as a boolean and BIT(n) as ``io.debezium.data.Bits``
(little-endian bytes), ENUM and SET (``io.debezium.data.Enum``/``EnumSet`` with
``allowed``), GEOMETRY as the ``io.debezium.data.geometry.Geometry`` struct, and
``optional: false`` for NOT NULL columns: what Debezium 3.3's MySQL connector writes
(tests/integration/test_kafka_debezium_exact.py compares with its own output).

What the Avro of a source does not say is guessed, and the guess is documented
(docs/kafka.md): a DATETIME whose precision is unknown (no ``sql_type``) is taken as
precision 6 (µs, nothing lost); a decimal(20, 0) without ``sql_type`` is taken as a
BIGINT UNSIGNED (the MySQL source's Avro for it); a ``long`` is a TIME only when its
``sql_type`` says so. SQLite's union fields are typed by their first non-null branch
and carry any value as stored (bytes as base64).
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import math
import re
import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from databus.core.envelope import json_value
from databus.kafka.config import BigintUnsignedMode, DecimalMode, TimePrecisionMode, ValueMode

Convert = Callable[[Any], Any]

DECIMAL_SCHEMA = "org.apache.kafka.connect.data.Decimal"
CONNECT_DATE = "org.apache.kafka.connect.data.Date"
CONNECT_TIME = "org.apache.kafka.connect.data.Time"
CONNECT_TIMESTAMP = "org.apache.kafka.connect.data.Timestamp"
DBZ_DATE = "io.debezium.time.Date"
DBZ_TIMESTAMP = "io.debezium.time.Timestamp"
DBZ_MICRO_TIMESTAMP = "io.debezium.time.MicroTimestamp"
DBZ_ZONED_TIMESTAMP = "io.debezium.time.ZonedTimestamp"
DBZ_MICRO_TIME = "io.debezium.time.MicroTime"
DBZ_YEAR = "io.debezium.time.Year"
DBZ_BITS = "io.debezium.data.Bits"
DBZ_ENUM = "io.debezium.data.Enum"
DBZ_ENUM_SET = "io.debezium.data.EnumSet"
DBZ_GEOMETRY = "io.debezium.data.geometry.Geometry"

_EPOCH = dt.datetime(1970, 1, 1)
_EPOCH_DAY = dt.date(1970, 1, 1)
_MS = dt.timedelta(milliseconds=1)
_US = dt.timedelta(microseconds=1)
_PRECISION = re.compile(r"\(\s*(\d+)\s*\)")
_EXACT = decimal.Context(prec=200)  # DECIMAL(65,30) has 65 digits: never round them
_QUOTED = re.compile(r"'((?:[^']|'')*)'")


@dataclass(frozen=True)
class ValueOptions:
    """How column values are written (see the module docstring)."""

    mode: ValueMode = "databus"
    decimal_handling_mode: DecimalMode = "precise"
    time_precision_mode: TimePrecisionMode = "adaptive_time_microseconds"
    bigint_unsigned_handling_mode: BigintUnsignedMode = "long"


@dataclass(frozen=True)
class ColumnCodec:
    """One column: its name, the value converter and its Connect field schema."""

    column: str
    convert: Convert
    schema: dict[str, Any]  # {"type": ..., "optional": ..., "field": column, [name, ...]}


# -- value functions (debezium mode) -------------------------------------------------------

def decimal_bytes(value: decimal.Decimal | int, scale: int) -> str:
    """A decimal as Connect's Decimal in JSON: the unscaled integer at ``scale`` as
    big-endian two's complement in the fewest bytes that keep its sign (Java's
    ``BigInteger.toByteArray``), base64-encoded."""
    unscaled = int(value) if isinstance(value, int) else int(
        decimal.Decimal(value).scaleb(scale, _EXACT).to_integral_exact(
            rounding=decimal.ROUND_HALF_EVEN, context=_EXACT))
    bits = unscaled.bit_length() if unscaled >= 0 else (~unscaled).bit_length()
    raw = unscaled.to_bytes(bits // 8 + 1, "big", signed=True)
    return base64.b64encode(raw).decode("ascii")


def java_long(value: int) -> int:
    """An unsigned 64-bit value as a Java long holds it (above 2^63-1: negative)."""
    value = int(value)
    return value - (1 << 64) if value >= 1 << 63 else value


def epoch_days(value: dt.date) -> int:
    return (value - _EPOCH_DAY).days


def epoch_millis(value: dt.datetime) -> int:
    """A local date-time as ms since 1970-01-01T00:00 read as UTC (floor)."""
    return (value.replace(tzinfo=None) - _EPOCH) // _MS


def epoch_micros(value: dt.datetime) -> int:
    return (value.replace(tzinfo=None) - _EPOCH) // _US


def zoned_timestamp(value: dt.datetime) -> str:
    """ISO-8601 in UTC with ``Z``; the fraction as long as needed (none when zero)."""
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC)
    text = value.strftime("%Y-%m-%dT%H:%M:%S")
    if value.microsecond:
        text += "." + f"{value.microsecond:06d}".rstrip("0")
    return text + "Z"


def float32_number(value: float) -> Any:
    """A FLOAT column's value (a 4-byte float widened to a double) as the shortest
    decimal that is the same 4-byte float: ``3.14``, not ``3.140000104904175`` (what
    the server's ``SELECT`` and Java's ``Float.toString`` print)."""
    if not math.isfinite(value):
        return _json_number(value)
    want = struct.pack("<f", value)
    for digits in range(1, 10):
        short = float(f"{value:.{digits}g}")
        if struct.pack("<f", short) == want:
            return short
    return value


def bits_bytes(value: int | decimal.Decimal, length: int) -> str:
    """BIT(n), n > 1, as Debezium's ``Bits``: the bits little-endian in (n+7)//8
    bytes, base64."""
    return base64.b64encode(int(value).to_bytes((length + 7) // 8, "little")).decode("ascii")


def geometry(value: bytes) -> dict[str, Any]:
    """A MySQL geometry value (4-byte little-endian SRID, then WKB) as Debezium's
    ``Geometry`` struct: ``wkb`` base64, ``srid`` null when 0."""
    raw = bytes(value)
    srid = int.from_bytes(raw[:4], "little")
    return {"wkb": base64.b64encode(raw[4:]).decode("ascii"), "srid": srid or None}


def _time_micros(value: Any) -> int:
    if isinstance(value, dt.timedelta):
        return value // _US
    if isinstance(value, dt.time):
        return ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 \
            + value.microsecond
    return int(value)


def _json_number(value: Any) -> Any:
    """A float as JSON allows it: NaN and the infinities as the strings Java prints."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


def _plain(value: Any) -> Any:
    """databus mode: the JSON envelope's value (docs/json.md)."""
    if isinstance(value, float):
        return _json_number(value)
    return json_value(value)


# -- the schema of one field ---------------------------------------------------------------

_PRIMITIVE = {"long": "int64", "int": "int32", "double": "double", "float": "float",
              "string": "string", "bytes": "bytes", "boolean": "boolean"}


def _base_type(avro: Any) -> tuple[Any, bool, bool]:
    """(type without null, nullable, union of several non-null branches)."""
    if isinstance(avro, list):
        branches = [b for b in avro if b != "null"]
        nullable = len(branches) < len(avro)
        if len(branches) == 1:
            return branches[0], nullable, False
        return (branches[0] if branches else "string"), nullable, True
    return avro, False, False


def _fsp(sql_type: str) -> int | None:
    m = _PRECISION.search(sql_type)
    return int(m.group(1)) if m else (0 if sql_type else None)


def column_codec(field: dict[str, Any], options: ValueOptions) -> ColumnCodec:
    """The codec of one Avro record field (see the module docstring)."""
    column = str(field.get("column", field["name"]))
    avro, nullable, union = _base_type(field["type"])
    declared = str(field.get("sql_type", ""))
    sql_type = declared.upper()
    if options.mode == "debezium" and sql_type.endswith("NOT NULL"):
        nullable = False
    convert, schema = _typed(avro, sql_type, union, options, declared)
    return ColumnCodec(column, convert, {**schema, "optional": nullable, "field": column})


_DBZ_INTS = {"TINYINT": "int16", "TINYINT UNSIGNED": "int16", "SMALLINT": "int16",
             "SMALLINT UNSIGNED": "int32", "MEDIUMINT": "int32", "MEDIUMINT UNSIGNED": "int32",
             "INT": "int32", "INT UNSIGNED": "int64", "BIGINT": "int64"}


def _mysql_typed(base: Any, sql_type: str, declared: str) -> tuple[Convert, dict[str, Any]] | None:
    """debezium mode: the columns only a MySQL field's declared type tells apart."""
    head = sql_type.removesuffix("NOT NULL").rstrip()
    if base == "long" and head in _DBZ_INTS:
        return _plain, {"type": _DBZ_INTS[head]}
    if base == "long" and head == "YEAR":
        return _plain, {"type": "int32", "name": DBZ_YEAR, "version": 1}
    if head.startswith("BIT(") and base in ("long", "bytes"):
        length = _fsp(head) or 1
        if length == 1:
            return _nullsafe(lambda v: bool(int(v))), {"type": "boolean"}
        return (_nullsafe(lambda v: bits_bytes(v, length)),
                {"type": "bytes", "name": DBZ_BITS, "version": 1,
                 "parameters": {"length": str(length)}})
    if head.startswith(("ENUM(", "SET(")) and base == "string":
        allowed = ",".join(v.replace("''", "'") for v in _QUOTED.findall(
            declared[declared.index("(") + 1: declared.rindex(")")]))
        name = DBZ_ENUM if head.startswith("ENUM(") else DBZ_ENUM_SET
        return _plain, {"type": "string", "name": name, "version": 1,
                        "parameters": {"allowed": allowed}}
    if head == "GEOMETRY" and base == "bytes":
        return _nullsafe(geometry), {
            "type": "struct", "name": DBZ_GEOMETRY, "version": 1, "doc": "Geometry",
            "fields": [{"type": "bytes", "optional": False, "field": "wkb"},
                       {"type": "int32", "optional": True, "field": "srid"}]}
    return None


def _typed(avro: Any, sql_type: str, union: bool, o: ValueOptions,
           declared: str = "") -> tuple[Convert, dict[str, Any]]:
    debezium = o.mode == "debezium"
    if union:  # SQLite: any storage class in any column; typed by the affinity's branch
        return _plain, {"type": _PRIMITIVE.get(avro if isinstance(avro, str) else "", "string")}
    logical = avro.get("logicalType") if isinstance(avro, dict) else None
    base = avro.get("type") if isinstance(avro, dict) else avro
    if debezium and sql_type:
        found = _mysql_typed(base, sql_type, declared)
        if found is not None:
            return found
    if logical == "decimal":
        return _decimal(int(avro.get("precision", 0)), int(avro.get("scale", 0)), sql_type, o)
    if logical == "date":
        if not debezium:
            return _plain, {"type": "string"}
        name = CONNECT_DATE if o.time_precision_mode == "connect" else DBZ_DATE
        return _nullsafe(epoch_days), {"type": "int32", "name": name, "version": 1}
    if logical in ("time-micros", "time-millis") or (
            debezium and base in ("long", "int") and sql_type.startswith("TIME")
            and not sql_type.startswith("TIMESTAMP")):
        if not debezium:
            return _plain, {"type": "string"}
        if o.time_precision_mode == "connect":
            return (_nullsafe(lambda v: _time_micros(v) // 1000),
                    {"type": "int32", "name": CONNECT_TIME, "version": 1})
        return _nullsafe(_time_micros), {"type": "int64", "name": DBZ_MICRO_TIME, "version": 1}
    if logical in ("local-timestamp-micros", "local-timestamp-millis"):
        if not debezium:
            return _plain, {"type": "string"}
        if o.time_precision_mode == "connect":
            return (_nullsafe(epoch_millis),
                    {"type": "int64", "name": CONNECT_TIMESTAMP, "version": 1})
        fsp = _fsp(sql_type) if sql_type.startswith("DATETIME") else None
        if fsp is None:
            fsp = 3 if logical == "local-timestamp-millis" else 6
        if fsp <= 3:
            return _nullsafe(epoch_millis), {"type": "int64", "name": DBZ_TIMESTAMP, "version": 1}
        return (_nullsafe(epoch_micros),
                {"type": "int64", "name": DBZ_MICRO_TIMESTAMP, "version": 1})
    if logical in ("timestamp-micros", "timestamp-millis"):
        if not debezium:
            return _plain, {"type": "string"}
        return (_nullsafe(zoned_timestamp),
                {"type": "string", "name": DBZ_ZONED_TIMESTAMP, "version": 1})
    if logical == "uuid":
        return _nullsafe(lambda v: str(uuid.UUID(str(v)))), {"type": "string"}
    if isinstance(base, str) and base in _PRIMITIVE:
        if base == "float":
            return _nullsafe(float32_number), {"type": "float"}
        if base == "double":
            return _json_number, {"type": "double"}
        return _plain, {"type": _PRIMITIVE[base]}
    return _plain, {"type": "string"}  # enum, fixed, duration...: as the JSON envelope


def _decimal(precision: int, scale: int, sql_type: str,
             o: ValueOptions) -> tuple[Convert, dict[str, Any]]:
    if o.mode != "debezium":
        return _plain, {"type": "string"}
    unsigned_bigint = ("BIGINT" in sql_type and "UNSIGNED" in sql_type) or (
        not sql_type and precision == 20 and scale == 0)
    if unsigned_bigint and o.bigint_unsigned_handling_mode == "long":
        return _nullsafe(java_long), {"type": "int64"}
    mode = "precise" if unsigned_bigint else o.decimal_handling_mode
    if mode == "string":
        return _nullsafe(lambda v: format(decimal.Decimal(v), "f")), {"type": "string"}
    if mode == "double":
        return _nullsafe(lambda v: float(v)), {"type": "double"}
    params = {"scale": str(scale)}
    if precision:
        params["connect.decimal.precision"] = str(precision)
    return (_nullsafe(lambda v: decimal_bytes(v, scale)),
            {"type": "bytes", "name": DECIMAL_SCHEMA, "version": 1, "parameters": params})


def _nullsafe(fn: Convert) -> Convert:
    def convert(value: Any) -> Any:
        return None if value is None else fn(value)
    return convert
