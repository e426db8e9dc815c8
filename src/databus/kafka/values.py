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
=========================  =========================================================

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

_EPOCH = dt.datetime(1970, 1, 1)
_EPOCH_DAY = dt.date(1970, 1, 1)
_MS = dt.timedelta(milliseconds=1)
_US = dt.timedelta(microseconds=1)
_PRECISION = re.compile(r"\(\s*(\d+)\s*\)")


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
        decimal.Decimal(value).scaleb(scale).to_integral_exact(rounding=decimal.ROUND_HALF_EVEN))
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
    sql_type = str(field.get("sql_type", "")).upper()
    convert, schema = _typed(avro, sql_type, union, options)
    return ColumnCodec(column, convert, {**schema, "optional": nullable, "field": column})


def _typed(avro: Any, sql_type: str, union: bool,
           o: ValueOptions) -> tuple[Convert, dict[str, Any]]:
    debezium = o.mode == "debezium"
    if union:  # SQLite: any storage class in any column; typed by the affinity's branch
        return _plain, {"type": _PRIMITIVE.get(avro if isinstance(avro, str) else "", "string")}
    logical = avro.get("logicalType") if isinstance(avro, dict) else None
    base = avro.get("type") if isinstance(avro, dict) else avro
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
        if base in ("double", "float"):
            return _json_number, {"type": _PRIMITIVE[base]}
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
