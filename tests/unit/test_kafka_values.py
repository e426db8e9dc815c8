"""Column values of ``databus publish``: the Debezium-exact mode against the MySQL
connector's documented type mapping (values worked out from its rules: epoch days,
epoch ms/µs by precision, ZonedTimestamp text, Connect Decimal bytes), and the
databus mode against docs/json.md."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
from typing import Any

import pytest

from databus.kafka.values import (
    CONNECT_DATE,
    CONNECT_TIME,
    CONNECT_TIMESTAMP,
    DBZ_DATE,
    DBZ_MICRO_TIME,
    DBZ_MICRO_TIMESTAMP,
    DBZ_TIMESTAMP,
    DBZ_ZONED_TIMESTAMP,
    DECIMAL_SCHEMA,
    ColumnCodec,
    ValueOptions,
    column_codec,
    decimal_bytes,
    java_long,
    zoned_timestamp,
)

DBZ = ValueOptions(mode="debezium")
CONNECT = ValueOptions(mode="debezium", time_precision_mode="connect")
PLAIN = ValueOptions()

DEC_10_2 = {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}
UBIGINT = {"type": "bytes", "logicalType": "decimal", "precision": 20, "scale": 0}
DATE = {"type": "int", "logicalType": "date"}
DATETIME = {"type": "long", "logicalType": "local-timestamp-micros"}
TIMESTAMP = {"type": "long", "logicalType": "timestamp-micros"}


def codec(avro: Any, options: ValueOptions, *, sql_type: str = "",
          nullable: bool = True) -> ColumnCodec:
    field: dict[str, Any] = {"name": "c", "type": ["null", avro] if nullable else avro}
    if sql_type:
        field["sql_type"] = sql_type
    return column_codec(field, options)


# -- DECIMAL ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "expected"), [
    (decimal.Decimal("12.34"), b"\x04\xd2"),      # unscaled 1234
    (decimal.Decimal("-1.00"), b"\x9c"),          # unscaled -100, one byte keeps the sign
    (decimal.Decimal("1.28"), b"\x00\x80"),       # 128 needs a 0x00 so it stays positive
    (decimal.Decimal("-1.29"), b"\xff\x7f"),      # -129
    (decimal.Decimal("0.00"), b"\x00"),
    (decimal.Decimal("99999999.99"), (9999999999).to_bytes(5, "big", signed=True)),
])
def test_decimal_precise_is_unscaled_twos_complement_base64(value: decimal.Decimal,
                                                             expected: bytes) -> None:
    c = codec(DEC_10_2, DBZ)
    assert c.convert(value) == base64.b64encode(expected).decode()
    assert c.schema == {"type": "bytes", "name": DECIMAL_SCHEMA, "version": 1,
                        "parameters": {"scale": "2", "connect.decimal.precision": "10"},
                        "optional": True, "field": "c"}


def test_decimal_at_a_larger_scale_is_scaled_exactly() -> None:
    assert decimal_bytes(decimal.Decimal("1.5"), 3) == base64.b64encode(b"\x05\xdc").decode()


def test_decimal_string_and_double_modes() -> None:
    s = codec(DEC_10_2, ValueOptions(mode="debezium", decimal_handling_mode="string"))
    assert s.convert(decimal.Decimal("12.30")) == "12.30" and s.schema["type"] == "string"
    assert s.convert(decimal.Decimal("1E+2")) == "100"  # plain, never an exponent
    d = codec(DEC_10_2, ValueOptions(mode="debezium", decimal_handling_mode="double"))
    assert d.convert(decimal.Decimal("12.30")) == 12.3 and d.schema["type"] == "double"
    assert s.convert(None) is None and d.convert(None) is None


# -- BIGINT UNSIGNED ---------------------------------------------------------------------------

def test_bigint_unsigned_long_mode_wraps_like_a_java_long() -> None:
    c = codec(UBIGINT, DBZ)
    assert c.schema["type"] == "int64" and "name" not in c.schema
    assert c.convert(decimal.Decimal(5)) == 5
    assert c.convert(decimal.Decimal(2**63 - 1)) == 2**63 - 1
    assert c.convert(decimal.Decimal(2**63)) == -(2**63)
    assert c.convert(decimal.Decimal(2**64 - 1)) == -1
    assert java_long(11111111111111111111) == 11111111111111111111 - 2**64


def test_bigint_unsigned_precise_mode_is_a_decimal_of_scale_0() -> None:
    c = codec(UBIGINT, ValueOptions(mode="debezium", bigint_unsigned_handling_mode="precise"))
    # 11111111111111111111 = 0x9A3298AFB5AC71C7: the high bit is set, so a 0x00 leads
    assert c.convert(decimal.Decimal(11111111111111111111)) == "AJoymK+1rHHH"
    assert c.schema["parameters"] == {"scale": "0", "connect.decimal.precision": "20"}


def test_a_decimal_20_0_declared_as_decimal_follows_the_decimal_mode() -> None:
    c = codec(UBIGINT, ValueOptions(mode="debezium", decimal_handling_mode="string"),
              sql_type="DECIMAL(20,0)")
    assert c.convert(decimal.Decimal(7)) == "7"
    u = codec(UBIGINT, DBZ, sql_type="BIGINT UNSIGNED")
    assert u.convert(decimal.Decimal(2**64 - 2)) == -2


# -- dates and times -------------------------------------------------------------------------

def test_date_is_days_since_the_epoch() -> None:
    c = codec(DATE, DBZ)
    assert c.convert(dt.date(1970, 1, 1)) == 0
    assert c.convert(dt.date(2018, 6, 20)) == 17702
    assert c.convert(dt.date(1969, 12, 31)) == -1
    assert c.schema == {"type": "int32", "name": DBZ_DATE, "version": 1, "optional": True,
                        "field": "c"}
    assert codec(DATE, CONNECT).schema["name"] == CONNECT_DATE
    assert codec(DATE, CONNECT).convert(dt.date(2018, 6, 20)) == 17702


def test_datetime_without_fraction_is_epoch_millis_read_as_utc() -> None:
    c = codec(DATETIME, DBZ, sql_type="DATETIME")
    assert c.convert(dt.datetime(2018, 6, 20, 6, 37, 3)) == 1529476623000
    assert c.schema["name"] == DBZ_TIMESTAMP and c.schema["type"] == "int64"
    assert codec(DATETIME, DBZ, sql_type="DATETIME(3)").convert(
        dt.datetime(2018, 6, 20, 6, 37, 3, 123000)) == 1529476623123


def test_datetime_with_micro_precision_is_epoch_micros() -> None:
    for sql_type in ("DATETIME(6)", "DATETIME(4)", ""):  # unknown precision: µs, nothing lost
        c = codec(DATETIME, DBZ, sql_type=sql_type)
        assert c.schema["name"] == DBZ_MICRO_TIMESTAMP
        assert c.convert(dt.datetime(2018, 6, 20, 6, 37, 3, 123456)) == 1529476623123456
    assert codec(DATETIME, DBZ).convert(dt.datetime(1969, 12, 31, 23, 59, 59, 999999)) == -1


def test_datetime_in_connect_mode_is_millis() -> None:
    c = codec(DATETIME, CONNECT, sql_type="DATETIME(6)")
    assert c.schema["name"] == CONNECT_TIMESTAMP
    assert c.convert(dt.datetime(2018, 6, 20, 6, 37, 3, 123456)) == 1529476623123


def test_timestamp_is_zoned_iso_text_in_utc() -> None:
    c = codec(TIMESTAMP, DBZ)
    assert c.schema["name"] == DBZ_ZONED_TIMESTAMP and c.schema["type"] == "string"
    assert c.convert(dt.datetime(2018, 6, 20, 13, 37, 3, tzinfo=dt.UTC)) == "2018-06-20T13:37:03Z"
    assert c.convert(dt.datetime(2018, 6, 20, 13, 37, 3, 120000, tzinfo=dt.UTC)) \
        == "2018-06-20T13:37:03.12Z"
    pdt = dt.timezone(dt.timedelta(hours=-7))
    assert zoned_timestamp(dt.datetime(2018, 6, 20, 6, 37, 3, tzinfo=pdt)) == "2018-06-20T13:37:03Z"
    assert codec(TIMESTAMP, CONNECT).schema["name"] == DBZ_ZONED_TIMESTAMP  # in every mode


def test_time_is_micros_or_connect_millis() -> None:
    micros = ((10 * 60 + 15) * 60 + 30) * 1_000_000 + 123456
    c = codec("long", DBZ, sql_type="TIME(6)")
    assert c.convert(micros) == micros
    assert c.schema == {"type": "int64", "name": DBZ_MICRO_TIME, "version": 1,
                        "optional": True, "field": "c"}
    k = codec("long", CONNECT, sql_type="TIME")
    assert k.convert(micros) == micros // 1000
    assert k.schema["type"] == "int32" and k.schema["name"] == CONNECT_TIME
    t = codec({"type": "long", "logicalType": "time-micros"}, DBZ)
    assert t.convert(dt.time(10, 15, 30, 123456)) == micros
    # a long that is not declared TIME stays a number
    assert codec("long", DBZ).schema == {"type": "int64", "optional": True, "field": "c"}
    assert codec("long", DBZ, sql_type="TIMESTAMP").schema["type"] == "int64"


# -- the rest, and the databus mode ------------------------------------------------------------

def test_bytes_are_base64_and_floats_numbers() -> None:
    assert codec("bytes", DBZ).convert(b"\x00\xff") == "AP8="
    assert codec("double", DBZ).convert(1.5) == 1.5
    assert codec("double", DBZ).convert(float("nan")) == "NaN"
    assert codec("float", PLAIN).convert(float("-inf")) == "-Infinity"


def test_databus_mode_writes_the_json_envelope_values() -> None:
    assert codec(DEC_10_2, PLAIN).convert(decimal.Decimal("12.30")) == "12.30"
    assert codec(DEC_10_2, PLAIN).schema["type"] == "string"
    assert codec(DATE, PLAIN).convert(dt.date(2018, 6, 20)) == "2018-06-20"
    assert codec(TIMESTAMP, PLAIN).convert(
        dt.datetime(2018, 6, 20, 13, 37, 3, tzinfo=dt.UTC)) == "2018-06-20T13:37:03Z"
    assert codec(UBIGINT, PLAIN).convert(decimal.Decimal(2**64 - 1)) == str(2**64 - 1)


def test_sqlite_unions_take_the_first_branch_and_carry_any_value() -> None:
    c = column_codec({"name": "x", "type": ["null", "long", "double", "string", "bytes"],
                      "sql_type": "INTEGER"}, DBZ)
    assert c.schema == {"type": "int64", "optional": True, "field": "x"}
    assert c.convert(b"\x01") == "AQ==" and c.convert("abc") == "abc" and c.convert(3) == 3


def test_column_names_are_the_tables_own() -> None:
    c = column_codec({"name": "full_name", "column": "full name", "type": "string"}, DBZ)
    assert c.column == "full name" and c.schema["field"] == "full name"
    assert c.schema["optional"] is False
