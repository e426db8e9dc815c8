"""Relay column types -> MySQL column types, each with the exact encoder of its values.

A relay schema field (:class:`databus.core.schema.TableSchema`) has an Avro type and,
from most sources, the declared SQL type (``sql_type``). :func:`mysql_columns` maps each
field to one MySQL column: its binlog type code, Table_map metadata, signedness,
character set, the column definition used in DDL Query events, and an encoder of values
into the rows-event format. The first matching row wins:

=========================================  =====================  =========================
relay field (sql_type / Avro type)         MySQL column           value
=========================================  =====================  =========================
SQLite ``BOOL``, ``BOOLEAN``               TINYINT(1) (TINY)      the integer (-128..127)
SQLite INTEGER affinity (``INT`` in the    BIGINT (LONGLONG)      the integer
name: INTEGER, INT, BIGINT, TINYINT ...)
SQLite REAL affinity (REAL, FLOAT,         DOUBLE                 the IEEE double, bit-exact
DOUBLE, DOUBLE PRECISION)
SQLite ``[N][VAR]CHAR(n)``,                VARCHAR(n) utf8mb4     the UTF-8 text (n chars
``CHARACTER(n)``...                                               at most, else an error)
SQLite other TEXT affinity (TEXT, CLOB)    LONGTEXT utf8mb4       the UTF-8 text
SQLite BLOB affinity (BLOB, no type)       LONGBLOB (binary)      the bytes
SQLite ``DECIMAL(p,s)``, ``NUMERIC(p,s)``  DECIMAL(p,s)           exact decimal (NEWDECIMAL)
(p <= 65, s <= 30)
SQLite ``DECIMAL``, ``NUMERIC``,           DECIMAL(65,30)         exact decimal (fallback
``NUMBER``, ``MONEY`` (no precision)                              precision, documented)
SQLite ``DATE``                            DATE                   from ISO text YYYY-MM-DD
SQLite ``DATETIME[(f)]``, ``TIMESTAMP``    DATETIME(f) (DATETIME2) from ISO text, no zone;
                                                                  f = 6 when not declared
SQLite ``TIME[(f)]``                       TIME(f) (TIME2)        from HH:MM:SS[.ffffff];
                                                                  f = 6 when not declared
SQLite other NUMERIC affinity (JSON, ...)  LONGTEXT utf8mb4       the value as SQLite's
                                                                  ``CAST(x AS TEXT)``
MySQL-sourced ``TINYINT``..``BIGINT``      the same (TINY, SHORT, the integer
[``UNSIGNED``]                             INT24, LONG, LONGLONG)
MySQL ``YEAR``                             YEAR                   the year
MySQL ``BIT(n)``                           BIGINT UNSIGNED        the bits as an integer
MySQL ``DECIMAL(p,s)`` (Avro decimal)      DECIMAL(p,s)           exact
MySQL ``DATETIME(f)``/``TIMESTAMP(f)``/    DATETIME2/TIMESTAMP2/  exact to f digits
``TIME(f)``/``DATE``                       TIME2/DATE
Avro ``float``                             FLOAT                  the IEEE single
Avro ``double``                            DOUBLE                 the IEEE double
Avro ``long`` / ``int`` / ``boolean``      BIGINT / BIGINT /      the integer (true = 1)
(PostgreSQL, others)                       TINYINT(1)
Avro ``string`` (MySQL strings, ENUM, SET, LONGTEXT utf8mb4       the UTF-8 text
JSON; PostgreSQL text types, numeric ...)
Avro ``bytes`` (MySQL binary strings,      LONGBLOB (binary)      the bytes
GEOMETRY; PostgreSQL bytea)
=========================================  =====================  =========================

Character columns are utf8mb4 with collation id 45 (``utf8mb4_general_ci``), binary
ones id 63: MySQL 8's default 255 (``utf8mb4_0900_ai_ci``) is unknown to MariaDB's
tools, which print an error for it. Every column is nullable in the Table_map unless the
relay field is not (SQLite ``NOT NULL``).

**Values of another storage class.** SQLite lets any column hold any value ('abc' in an
INTEGER column). A value of another class is converted only where that is exact, as
SQLite's ``CAST`` to the column's class would: an integral real or integer-literal text
to an integer column; an integer (below 2**53 in magnitude, or exactly representable) or
number text to a DOUBLE; a number to text (integers as digits, reals by their shortest
round-trip form) or text to its UTF-8 bytes for a BLOB; any number to DECIMAL when it has
no more fractional digits than the scale. Anything else (text in a BIGINT column, a
real with more digits than a DECIMAL's scale, a date text that does not parse, a value
longer than a VARCHAR(n)) raises :class:`~databus.core.errors.SchemaError` naming the
table, column and value; the converter stops there rather than write a wrong value.

The binary forms of DECIMAL and temporal values are :mod:`databus.binlog.values`'; the
Table_map and rows events built from the columns :mod:`databus.binlog.rowevents`'; the
CREATE/ALTER TABLE statements :mod:`databus.binlog.ddl`'.
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from databus.binlog.values import date3, datetime2, decimal_bin, time2, timestamp2
from databus.core.mysqlwire import (
    BINARY_CHARSET,
    T_BLOB,
    T_DATE,
    T_DATETIME2,
    T_DOUBLE,
    T_FLOAT,
    T_INT24,
    T_LONG,
    T_LONGLONG,
    T_NEWDECIMAL,
    T_SHORT,
    T_TIME2,
    T_TIMESTAMP2,
    T_TINY,
    T_VARCHAR,
    T_YEAR,
)
from databus.core.schema import TableSchema

UTF8MB4 = 45  # utf8mb4_general_ci: what character columns are (see the module docstring)

Encoder = Callable[[Any], bytes]


@dataclass(frozen=True)
class MysqlColumn:
    """One MySQL column of a mapped table."""

    name: str
    type_code: int
    meta: bytes  # the Table_map's per-column metadata
    nullable: bool
    unsigned: bool
    charset: int | None  # character columns only
    definition: str  # for DDL: "BIGINT", "VARCHAR(20) CHARACTER SET utf8mb4"...
    encode: Encoder  # a non-NULL value -> its rows-event bytes


_DBL = struct.Struct("<d")
_FLT = struct.Struct("<f")


# -- conversions of SQLite storage classes (see the module docstring) ----------


def _to_int(v: Any) -> int:
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, decimal.Decimal) and v == v.to_integral_value():
        return int(v)
    if isinstance(v, str) and re.fullmatch(r"\s*[+-]?\d+\s*", v):
        return int(v)
    raise ValueError(f"{v!r} is not an integer")


def _to_float(v: Any) -> float:
    if isinstance(v, float):
        return v
    if isinstance(v, int) and not isinstance(v, bool) and float(v) == v:
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            pass
    raise ValueError(f"{v!r} is not exactly a double")


def _to_text(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return str(int(v))
    if isinstance(v, (int, float, decimal.Decimal)):
        return repr(v) if isinstance(v, float) else str(v)
    raise ValueError(f"{v!r} is not text")


def _to_bytes(v: Any) -> bytes:
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    return _to_text(v).encode("utf-8")


def _to_decimal(v: Any) -> decimal.Decimal:
    if isinstance(v, decimal.Decimal):
        return v
    if isinstance(v, bool):
        return decimal.Decimal(int(v))
    if isinstance(v, int):
        return decimal.Decimal(v)
    if isinstance(v, float):
        return decimal.Decimal(repr(v))
    if isinstance(v, str):
        try:
            return decimal.Decimal(v.strip())
        except decimal.InvalidOperation:
            pass
    raise ValueError(f"{v!r} is not a decimal")


def _to_date(v: Any) -> dt.date:
    if isinstance(v, dt.datetime):
        raise ValueError(f"{v!r} is not a date")
    if isinstance(v, dt.date):
        return v
    if isinstance(v, str) and re.fullmatch(r"\d{4}-\d{2}-\d{2}", v):
        return dt.date.fromisoformat(v)
    raise ValueError(f"{v!r} is not a YYYY-MM-DD date")


def _to_datetime(v: Any) -> dt.datetime:
    if isinstance(v, dt.datetime):
        return v
    if isinstance(v, str):
        try:
            out = dt.datetime.fromisoformat(v)
        except ValueError:
            pass
        else:
            if out.tzinfo is None:
                return out
    raise ValueError(f"{v!r} is not a date and time without a zone")


def _to_time_us(v: Any) -> int:
    if isinstance(v, dt.timedelta):
        return v // dt.timedelta(microseconds=1)
    if isinstance(v, int) and not isinstance(v, bool):
        return v  # MySQL-sourced TIME: microseconds
    if isinstance(v, dt.time):
        return ((v.hour * 60 + v.minute) * 60 + v.second) * 1_000_000 + v.microsecond
    if isinstance(v, str):
        m = re.fullmatch(r"(\d{1,3}):(\d{2}):(\d{2})(?:\.(\d{1,6}))?", v)
        if m:
            h, mi, s, f = m.groups()
            return ((int(h) * 60 + int(mi)) * 60 + int(s)) * 1_000_000 + int((f or "").ljust(6, "0"))
    raise ValueError(f"{v!r} is not a time")


# -- column builders ------------------------------------------------------------


def _int_col(name: str, null: bool, tc: int, size: int, unsigned: bool, ddl: str) -> MysqlColumn:
    lo, hi = (0, (1 << (8 * size)) - 1) if unsigned else (-(1 << (8 * size - 1)),
                                                         (1 << (8 * size - 1)) - 1)

    def enc(v: Any) -> bytes:
        n = _to_int(v)
        if not lo <= n <= hi:
            raise ValueError(f"{n} is out of range for {ddl}")
        return n.to_bytes(size, "little", signed=not unsigned)
    return MysqlColumn(name, tc, b"", null, unsigned, None, ddl, enc)


def _double_col(name: str, null: bool) -> MysqlColumn:
    return MysqlColumn(name, T_DOUBLE, bytes([8]), null, False, None, "DOUBLE",
                       lambda v: _DBL.pack(_to_float(v)))


def _float_col(name: str, null: bool) -> MysqlColumn:
    return MysqlColumn(name, T_FLOAT, bytes([4]), null, False, None, "FLOAT",
                       lambda v: _FLT.pack(_to_float(v)))


def _varchar_col(name: str, null: bool, n: int) -> MysqlColumn:
    max_bytes = min(4 * n, 65535)
    width = 1 if max_bytes < 256 else 2

    def enc(v: Any) -> bytes:
        s = _to_text(v)
        b = s.encode("utf-8")
        if len(s) > n or len(b) > max_bytes:
            raise ValueError(f"{len(s)} characters do not fit VARCHAR({n})")
        return len(b).to_bytes(width, "little") + b
    return MysqlColumn(name, T_VARCHAR, max_bytes.to_bytes(2, "little"), null, False, UTF8MB4,
                       f"VARCHAR({n}) CHARACTER SET utf8mb4", enc)


def _long_col(name: str, null: bool, text: bool) -> MysqlColumn:
    def enc(v: Any) -> bytes:
        b = _to_text(v).encode("utf-8") if text else _to_bytes(v)
        return len(b).to_bytes(4, "little") + b
    return MysqlColumn(name, T_BLOB, bytes([4]), null, False, UTF8MB4 if text else BINARY_CHARSET,
                       "LONGTEXT CHARACTER SET utf8mb4" if text else "LONGBLOB", enc)


def _decimal_col(name: str, null: bool, p: int, s: int) -> MysqlColumn:
    return MysqlColumn(name, T_NEWDECIMAL, bytes([p, s]), null, False, None,
                       f"DECIMAL({p},{s})", lambda v: decimal_bin(_to_decimal(v), p, s))


def _date_col(name: str, null: bool) -> MysqlColumn:
    return MysqlColumn(name, T_DATE, b"", null, False, None, "DATE",
                       lambda v: date3(_to_date(v) if not isinstance(v, int) else
                                       dt.date(1970, 1, 1) + dt.timedelta(days=v)))


def _datetime_col(name: str, null: bool, fsp: int) -> MysqlColumn:
    return MysqlColumn(name, T_DATETIME2, bytes([fsp]), null, False, None,
                       f"DATETIME({fsp})" if fsp else "DATETIME",
                       lambda v: datetime2(_to_datetime(v), fsp))


def _timestamp_col(name: str, null: bool, fsp: int) -> MysqlColumn:
    return MysqlColumn(name, T_TIMESTAMP2, bytes([fsp]), null, False, None,
                       f"TIMESTAMP({fsp})" if fsp else "TIMESTAMP",
                       lambda v: timestamp2(_to_datetime(v), fsp))


def _time_col(name: str, null: bool, fsp: int) -> MysqlColumn:
    return MysqlColumn(name, T_TIME2, bytes([fsp]), null, False, None,
                       f"TIME({fsp})" if fsp else "TIME", lambda v: time2(_to_time_us(v), fsp))


def _year_col(name: str, null: bool) -> MysqlColumn:
    return MysqlColumn(name, T_YEAR, b"", null, False, None, "YEAR",
                       lambda v: bytes([_to_int(v) - 1900 if _to_int(v) else 0]))


_PARAMS = re.compile(r"\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\)")
_MYSQL_INTS = {"TINYINT": (T_TINY, 1), "SMALLINT": (T_SHORT, 2), "MEDIUMINT": (T_INT24, 3),
               "INT": (T_LONG, 4), "BIGINT": (T_LONGLONG, 8)}


def _base_type(avro: Any) -> tuple[Any, bool]:
    """The non-null (first) branch of a field's Avro type, and whether null is allowed."""
    if isinstance(avro, list):
        rest = [t for t in avro if t != "null"]
        return (rest[0] if rest else "null"), len(rest) < len(avro)
    return avro, False


def _fsp(sql: str, default: int) -> int:
    m = _PARAMS.search(sql)
    return min(int(m.group(1)), 6) if m else default


def map_column(name: str, avro: Any, sql_type: str, *, sqlite: bool) -> MysqlColumn:
    """The MySQL column of one relay field (see the module docstring's table)."""
    base, null = _base_type(avro)
    sql = sql_type.upper().replace(" NOT NULL", "").strip()
    word = sql.split("(")[0].strip()
    params = _PARAMS.search(sql)
    logical = base.get("logicalType") if isinstance(base, dict) else None
    if sqlite:
        if word in ("BOOL", "BOOLEAN"):
            return _int_col(name, null, T_TINY, 1, False, "TINYINT(1)")
        if "INT" in sql:
            return _int_col(name, null, T_LONGLONG, 8, False, "BIGINT")
        if "CHAR" in sql or "CLOB" in sql or "TEXT" in sql:
            if params and "CHAR" in word and int(params.group(1)) > 0:
                return _varchar_col(name, null, min(int(params.group(1)), 16383))
            return _long_col(name, null, text=True)
        if "BLOB" in sql or not sql:
            return _long_col(name, null, text=False)
        if "REAL" in sql or "FLOA" in sql or "DOUB" in sql:
            return _double_col(name, null)
        if word in ("DECIMAL", "NUMERIC", "NUMBER", "MONEY", "SMALLMONEY"):
            if params and params.group(2) is not None:
                p, s = int(params.group(1)), int(params.group(2))
                if 0 < p <= 65 and s <= min(p, 30):
                    return _decimal_col(name, null, p, s)
            elif params and 0 < int(params.group(1)) <= 65:
                return _decimal_col(name, null, int(params.group(1)), 0)
            return _decimal_col(name, null, 65, 30)
        if word == "DATE":
            return _date_col(name, null)
        if word in ("DATETIME", "TIMESTAMP"):
            return _datetime_col(name, null, _fsp(sql, 6))
        if word == "TIME":
            return _time_col(name, null, _fsp(sql, 6))
        return _long_col(name, null, text=True)
    # MySQL-sourced (sql_type from the source's table map) and other sources
    if (word in _MYSQL_INTS and base in ("long", "int")) or (
            word == "BIGINT" and logical == "decimal"):
        tc, size = _MYSQL_INTS[word]
        uns = "UNSIGNED" in sql
        return _int_col(name, null, tc, size, uns, word + (" UNSIGNED" if uns else ""))
    if word == "YEAR":
        return _year_col(name, null)
    if word == "BIT":
        return _int_col(name, null, T_LONGLONG, 8, True, "BIGINT UNSIGNED")
    if logical == "decimal":
        p, s = int(base.get("precision", 65)), int(base.get("scale", 0))
        if 0 < p <= 65 and s <= min(p, 30):
            return _decimal_col(name, null, p, s)
        return _long_col(name, null, text=True)
    if logical == "date":
        return _date_col(name, null)
    if logical in ("local-timestamp-micros", "local-timestamp-millis"):
        return _datetime_col(name, null, _fsp(sql, 6))
    if logical in ("timestamp-micros", "timestamp-millis"):
        return _timestamp_col(name, null, _fsp(sql, 6))
    if word == "TIME" and base == "long":
        return _time_col(name, null, _fsp(sql, 6))
    if base == "float":
        return _float_col(name, null)
    if base == "double":
        return _double_col(name, null)
    if base in ("long", "int"):
        return _int_col(name, null, T_LONGLONG, 8, False, "BIGINT")
    if base == "boolean":
        return _int_col(name, null, T_TINY, 1, False, "TINYINT(1)")
    if base == "bytes" or (logical is None and isinstance(base, dict) and base.get(
            "type") in ("bytes", "fixed")):
        return _long_col(name, null, text=False)
    return _long_col(name, null, text=True)


def is_sqlite(schema: TableSchema) -> bool:
    """Whether a schema comes from the SQLite (txlog) source: its fields are unions of
    every storage class (see :mod:`databus.sources.txlog.rows`)."""
    fields = schema.avro.get("fields", [])
    if not fields:
        return False
    for f in fields:
        t = f["type"]
        branches = {b for b in (t if isinstance(t, list) else [t]) if b != "null"}
        if branches != {"long", "double", "string", "bytes"}:
            return False
    return True


def mysql_columns(schema: TableSchema) -> list[MysqlColumn]:
    """The MySQL columns of one table version, in field order."""
    sqlite = is_sqlite(schema)
    return [map_column(f.get("column", f["name"]), f["type"], f.get("sql_type", ""),
                       sqlite=sqlite) for f in schema.avro["fields"]]
