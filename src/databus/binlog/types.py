"""Relay column types -> MySQL column types, and the exact binary encoding of values.

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
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from databus.binlog.events import packed_int
from databus.core.errors import SchemaError
from databus.core.schema import TableSchema

# MySQL column type codes (enum_field_types)
T_DECIMAL, T_TINY, T_SHORT, T_LONG, T_FLOAT, T_DOUBLE, T_NULL, T_TIMESTAMP = 0, 1, 2, 3, 4, 5, 6, 7
T_LONGLONG, T_INT24, T_DATE, T_TIME, T_DATETIME, T_YEAR = 8, 9, 10, 11, 12, 13
T_VARCHAR, T_BIT, T_TIMESTAMP2, T_DATETIME2, T_TIME2 = 15, 16, 17, 18, 19
T_JSON, T_NEWDECIMAL, T_ENUM, T_SET, T_BLOB, T_VAR_STRING, T_STRING = 245, 246, 247, 248, 252, 253, 254

NUMERIC_TYPES = frozenset({T_DECIMAL, T_TINY, T_SHORT, T_LONG, T_FLOAT, T_DOUBLE, T_LONGLONG,
                           T_INT24, T_NEWDECIMAL})
"""Types that get a bit in the Table_map's SIGNEDNESS metadata."""
CHARACTER_TYPES = frozenset({T_STRING, T_VAR_STRING, T_VARCHAR, T_BLOB})
"""Types that get a character set in the Table_map's COLUMN_CHARSET metadata."""

UTF8MB4 = 45  # utf8mb4_general_ci
BINARY = 63

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


# -- value encoders -----------------------------------------------------------

_DIG2BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)


def decimal_bin(value: decimal.Decimal, precision: int, scale: int) -> bytes:
    """MySQL's binary DECIMAL (decimal2bin) of ``value``, which must fit (p, s) exactly."""
    if not value.is_finite():
        raise ValueError(f"{value} is not a finite decimal")
    q = value.quantize(decimal.Decimal(1).scaleb(-scale), context=decimal.Context(prec=200))
    if q != value:
        raise ValueError(f"{value} has more than {scale} fractional digits")
    sign, digits, exp = q.as_tuple()
    text = "".join(map(str, digits))
    assert isinstance(exp, int)
    intg = precision - scale
    int_digits = text[: len(text) + exp] if exp < 0 else text + "0" * exp
    frac_digits = text[len(text) + exp:] if exp < 0 else ""
    int_digits = int_digits.lstrip("0")
    if len(int_digits) > intg:
        raise ValueError(f"{value} does not fit DECIMAL({precision},{scale})")
    int_digits = int_digits.rjust(intg, "0")
    frac_digits = frac_digits.ljust(scale, "0")
    out = bytearray()
    lead = intg % 9
    if lead:
        out += int(int_digits[:lead]).to_bytes(_DIG2BYTES[lead], "big")
    for i in range(lead, intg, 9):
        out += int(int_digits[i:i + 9]).to_bytes(4, "big")
    full = scale - scale % 9
    for i in range(0, full, 9):
        out += int(frac_digits[i:i + 9]).to_bytes(4, "big")
    if scale % 9:
        out += int(frac_digits[full:]).to_bytes(_DIG2BYTES[scale % 9], "big")
    if sign and any(digits):
        out = bytearray(b ^ 0xFF for b in out)
    out[0] ^= 0x80
    return bytes(out)


def _frac(us: int, fsp: int) -> bytes:
    if fsp == 0:
        if us:
            raise ValueError("fractional seconds in a column without them")
        return b""
    div = 10 ** (6 - fsp)
    if us % div:
        raise ValueError(f"more than {fsp} fractional digits")
    n = (fsp + 1) // 2
    scale: int = 10 ** (6 - 2 * n)
    return (us // scale).to_bytes(n, "big")


def datetime2(v: dt.datetime, fsp: int) -> bytes:
    ym = v.year * 13 + v.month
    intpart = (((ym << 5) | v.day) << 17) | (v.hour << 12) | (v.minute << 6) | v.second
    return (intpart + 0x8000000000).to_bytes(5, "big") + _frac(v.microsecond, fsp)


def timestamp2(v: dt.datetime, fsp: int) -> bytes:
    if v.tzinfo is None:
        v = v.replace(tzinfo=dt.UTC)
    ts = v.timestamp()
    seconds = int(ts // 1)
    return seconds.to_bytes(4, "big") + _frac(v.microsecond, fsp)


def time2(us_total: int, fsp: int) -> bytes:
    """TIME2 of a signed duration in microseconds."""
    neg = us_total < 0
    a = -us_total if neg else us_total
    secs, us = divmod(a, 1_000_000)
    h, rest = divmod(secs, 3600)
    m, s = divmod(rest, 60)
    if h > 838:
        raise ValueError("TIME beyond 838:59:59")
    div = 10 ** (6 - fsp)
    if us % div:
        raise ValueError(f"more than {fsp} fractional digits")
    packed = (((h << 12) | (m << 6) | s) << 24) | us
    if neg:
        packed = -packed
    intpart = packed >> 24
    frac = packed - (intpart << 24)  # floor remainder
    if fsp == 0:
        return (intpart + 0x800000).to_bytes(3, "big")
    if fsp <= 2:
        # MySQL stores INT_PART and the C remainder of the packed value: for a negative
        # value with a fraction, the int part is one higher and the fraction negative
        if neg and frac:
            intpart += 1
            frac -= 1 << 24
        return (intpart + 0x800000).to_bytes(3, "big") + (
            int(frac / 10000) & 0xFF).to_bytes(1, "big")
    if fsp <= 4:
        if neg and frac:
            intpart += 1
            frac -= 1 << 24
        return (intpart + 0x800000).to_bytes(3, "big") + (
            int(frac / 100) & 0xFFFF).to_bytes(2, "big")
    return (packed + 0x800000000000).to_bytes(6, "big")


def date3(v: dt.date) -> bytes:
    return (v.day | (v.month << 5) | (v.year << 9)).to_bytes(3, "little")


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
    return MysqlColumn(name, T_BLOB, bytes([4]), null, False, UTF8MB4 if text else BINARY,
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


# -- Table_map and rows images -------------------------------------------------


def _bitmap_lsb(bits: list[bool]) -> bytes:
    out = bytearray((len(bits) + 7) // 8)
    for i, b in enumerate(bits):
        if b:
            out[i >> 3] |= 1 << (i & 7)
    return bytes(out)


def _bitmap_msb(bits: list[bool]) -> bytes:
    out = bytearray((len(bits) + 7) // 8)
    for i, b in enumerate(bits):
        if b:
            out[i >> 3] |= 0x80 >> (i & 7)
    return bytes(out)


def _tlv(kind: int, value: bytes) -> bytes:
    return bytes([kind]) + packed_int(len(value)) + value


def table_map_body(table_id: int, db: str, table: str, cols: list[MysqlColumn],
                   key_columns: tuple[str, ...]) -> bytes:
    """Table_map body with MySQL 8's full optional metadata (binlog_row_metadata=FULL):
    SIGNEDNESS, COLUMN_CHARSET, COLUMN_NAME, SIMPLE_PRIMARY_KEY."""
    dbb, tb = db.encode("utf-8"), table.encode("utf-8")
    if len(dbb) > 255 or len(tb) > 255:
        raise SchemaError(f"{db}.{table}: names longer than 255 bytes")
    meta = b"".join(c.meta for c in cols)
    out = bytearray(table_id.to_bytes(6, "little") + (1).to_bytes(2, "little"))
    out += bytes([len(dbb)]) + dbb + b"\0" + bytes([len(tb)]) + tb + b"\0"
    out += packed_int(len(cols)) + bytes(c.type_code for c in cols)
    out += packed_int(len(meta)) + meta
    out += _bitmap_lsb([c.nullable for c in cols])
    numeric = [c.unsigned for c in cols if c.type_code in NUMERIC_TYPES]
    if numeric:
        out += _tlv(1, _bitmap_msb(numeric))
    charsets = [c.charset for c in cols if c.type_code in CHARACTER_TYPES]
    if charsets:
        out += _tlv(3, b"".join(packed_int(cs or UTF8MB4) for cs in charsets))
    names = b"".join(packed_int(len(c.name.encode())) + c.name.encode() for c in cols)
    out += _tlv(4, names)
    index = {c.name: i for i, c in enumerate(cols)}
    pk = [index[k] for k in key_columns if k in index]
    if pk and len(pk) == len(key_columns):
        out += _tlv(8, b"".join(packed_int(i) for i in pk))
    return bytes(out)


def row_image(cols: list[MysqlColumn], values: list[Any], where: str) -> bytes:
    """One row image (every column present): the NULL bitmap, then each non-NULL value."""
    out = bytearray(_bitmap_lsb([v is None for v in values]))
    for c, v in zip(cols, values, strict=True):
        if v is None:
            continue
        try:
            out += c.encode(v)
        except (ValueError, OverflowError, TypeError, decimal.InvalidOperation) as exc:
            raise SchemaError(f"{where}: column {c.name!r} ({c.definition}): value {v!r}"
                              f" cannot be written exactly: {exc}") from exc
    return bytes(out)


def rows_body_head(table_id: int, ncols: int, update: bool, last: bool) -> bytes:
    """The rows v2 post-header (table id, flags, no extra data) and the columns-present
    bitmap(s): every column present (binlog_row_image=FULL)."""
    present = _bitmap_lsb([True] * ncols)
    return (table_id.to_bytes(6, "little") + (1 if last else 0).to_bytes(2, "little")
            + (2).to_bytes(2, "little") + packed_int(ncols) + present
            + (present if update else b""))


def create_table_sql(db: str, table: str, cols: list[MysqlColumn],
                     key_columns: tuple[str, ...]) -> str:
    """The CREATE TABLE of a mapped table version."""
    parts = [f"{quote(c.name)} {c.definition}{'' if c.nullable else ' NOT NULL'}" for c in cols]
    names = {c.name for c in cols}
    if key_columns and all(k in names for k in key_columns):
        parts.append("PRIMARY KEY (" + ", ".join(quote(k) for k in key_columns) + ")")
    return f"CREATE TABLE IF NOT EXISTS {quote(db)}.{quote(table)} (" + ", ".join(parts) + ")"


def alter_table_sql(db: str, table: str, old: list[MysqlColumn],
                    new: list[MysqlColumn]) -> str | None:
    """An ALTER TABLE that turns the ``old`` columns into the ``new`` ones (dropped
    columns, modified definitions, added columns in place); None when equal."""
    old_by = {c.name: c for c in old}
    new_names = {c.name for c in new}
    clauses = [f"DROP COLUMN {quote(c.name)}" for c in old if c.name not in new_names]
    prev: str | None = None
    for c in new:
        d = f"{quote(c.name)} {c.definition}{'' if c.nullable else ' NOT NULL'}"
        where = f" AFTER {quote(prev)}" if prev else " FIRST"
        o = old_by.get(c.name)
        if o is None:
            clauses.append(f"ADD COLUMN {d}{where}")
        elif (o.definition, o.nullable) != (c.definition, c.nullable):
            clauses.append(f"MODIFY COLUMN {d}")
        prev = c.name
    if not clauses and [c.name for c in old] == [c.name for c in new]:
        return None
    if not clauses:  # only the order changed
        prev = None
        for c in new:
            d = f"{quote(c.name)} {c.definition}{'' if c.nullable else ' NOT NULL'}"
            clauses.append(f"MODIFY COLUMN {d}" + (f" AFTER {quote(prev)}" if prev else " FIRST"))
            prev = c.name
    return f"ALTER TABLE {quote(db)}.{quote(table)} " + ", ".join(clauses)


def quote(name: str) -> str:
    """A MySQL identifier in backquotes."""
    return "`" + name.replace("`", "``") + "`"
