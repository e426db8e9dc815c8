"""Avro column types -> SQLAlchemy column types, for tables a sink creates.

=============================================  =====================================
Avro (nullable = a union with "null")          SQL column (SQLAlchemy type)
=============================================  =====================================
boolean                                        BOOLEAN
int                                            INTEGER
long                                           BIGINT
float                                          FLOAT
double                                         DOUBLE (DOUBLE PRECISION on PostgreSQL)
string, enum                                   TEXT; VARCHAR(255) for key columns on MariaDB/MySQL
bytes, fixed                                   BLOB / BYTEA (LargeBinary); VARBINARY(255) keys on MariaDB
decimal (bytes/fixed, precision, scale)        NUMERIC(precision, scale); on SQLite TEXT
                                               holding the exact value ("12.340")
date                                           DATE
time-millis, time-micros                       TIME (TIME(6) on MariaDB)
timestamp-millis, timestamp-micros             TIMESTAMP WITH TIME ZONE on PostgreSQL; DATETIME(6)
                                               holding UTC on MariaDB; DATETIME (UTC) on SQLite
local-timestamp-millis/-micros                 DATETIME / TIMESTAMP (no zone)
uuid (string)                                  UUID on PostgreSQL, CHAR(32) elsewhere (SQLAlchemy Uuid)
union of several non-null branches             TEXT; values as text (numbers as digits,
(e.g. a fallback string branch)                bytes base64, dates ISO-8601). On SQLite,
                                               whose columns hold any value: the source's
                                               declared type (field ``sql_type``) or the
                                               first branch's, values stored unchanged
array, map, record                             TEXT holding the JSON (see docs/json.md)
=============================================  =====================================

Columns are NOT NULL when their Avro type is not nullable, and always for key
columns, which form the primary key.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql
from sqlalchemy.types import TypeEngine, UserDefinedType

from databus.core.envelope import json_value

Converter = Callable[[Any], Any]


@dataclass(frozen=True, slots=True)
class ColumnType:
    """How one Avro field is stored: SQL type, nullability, value conversion."""

    type: TypeEngine[Any]
    nullable: bool
    convert: Converter | None = None


class DeclaredType(UserDefinedType[Any]):
    """A column type rendered as given, with values passed through unchanged.

    Used on SQLite for columns whose values may be of several storage classes.
    """

    cache_ok = True

    def __init__(self, spec: str) -> None:
        self.spec = spec

    def get_col_spec(self, **_: Any) -> str:
        return self.spec


_AFFINITY = {"long": "INTEGER", "int": "INTEGER", "boolean": "INTEGER", "double": "REAL",
             "float": "REAL", "string": "TEXT", "bytes": "BLOB"}
_SAFE_DECL = re.compile(r"^[A-Za-z][A-Za-z0-9_ ]{0,40}(\(\s*\d+\s*(,\s*\d+\s*)?\))?$")


def _sqlite_any(branches: list[Any], sql_type: str) -> TypeEngine[Any]:
    if sql_type and _SAFE_DECL.match(sql_type):
        return DeclaredType(sql_type)
    first = branches[0] if branches and isinstance(branches[0], str) else ""
    return DeclaredType(_AFFINITY.get(first, "BLOB"))


def _as_text(value: Any) -> Any:
    if value is None or isinstance(value, str):
        return value
    out = json_value(value)
    return out if isinstance(out, str) else json.dumps(out, separators=(",", ":"))


def _as_json(value: Any) -> Any:
    if value is None:
        return None
    return json.dumps(json_value(value), separators=(",", ":"), ensure_ascii=False)


def _utc_naive(value: Any) -> Any:
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.UTC).replace(tzinfo=None)
    return value


def _text(key: bool, dialect: str) -> TypeEngine[Any]:
    return sa.String(255) if key and dialect in ("mysql", "mariadb") else sa.Text()


def _binary(key: bool, dialect: str) -> TypeEngine[Any]:
    return mysql.VARBINARY(255) if key and dialect in ("mysql", "mariadb") else sa.LargeBinary()


def _logical(t: dict[str, Any], key: bool, dialect: str) -> ColumnType | None:
    lt = t.get("logicalType")
    base = t.get("type")
    mysql_like = dialect in ("mysql", "mariadb")
    if lt == "decimal" and base in ("bytes", "fixed"):
        if dialect == "sqlite":  # SQLite's NUMERIC is a float: keep decimals exact as text
            return ColumnType(_text(key, dialect), True, _as_text)
        return ColumnType(sa.Numeric(int(t.get("precision", 38)), int(t.get("scale", 0))), True)
    if lt == "date" and base == "int":
        return ColumnType(sa.Date(), True)
    if lt in ("time-millis", "time-micros"):
        return ColumnType(mysql.TIME(fsp=6) if mysql_like else sa.Time(), True)
    if lt in ("timestamp-millis", "timestamp-micros"):
        if dialect == "postgresql":
            return ColumnType(sa.DateTime(timezone=True), True)
        return ColumnType(mysql.DATETIME(fsp=6) if mysql_like else sa.DateTime(), True,
                          _utc_naive)
    if lt in ("local-timestamp-millis", "local-timestamp-micros"):
        return ColumnType(mysql.DATETIME(fsp=6) if mysql_like else sa.DateTime(), True)
    if lt == "uuid" and base == "string":
        return ColumnType(sa.Uuid(), True)
    return None


def _primitive(t: str, key: bool, dialect: str) -> ColumnType:
    if t == "boolean":
        return ColumnType(sa.Boolean(), True)
    if t == "int":
        return ColumnType(sa.Integer(), True)
    if t == "long":
        return ColumnType(sa.BigInteger(), True)
    if t == "float":
        return ColumnType(sa.Float(), True)
    if t == "double":
        return ColumnType(sa.Double(), True)
    if t in ("bytes", "fixed"):
        return ColumnType(_binary(key, dialect), True)
    if t == "string":
        return ColumnType(_text(key, dialect), True)
    return ColumnType(_text(key, dialect), True, _as_text)


def column_type(avro_type: Any, *, key: bool = False, dialect: str = "sqlite",
                sql_type: str = "") -> ColumnType:
    """The SQL column for an Avro field type (``dialect``: SQLAlchemy dialect name;
    ``sql_type``: the source's declared column type, when the schema has it)."""
    nullable = False
    t = avro_type
    if isinstance(t, list):
        nullable = "null" in t
        branches = [b for b in t if b != "null"]
        if len(branches) != 1:
            if dialect == "sqlite":
                return ColumnType(_sqlite_any(branches, sql_type), nullable and not key)
            return ColumnType(_text(key, dialect), nullable and not key, _as_text)
        t = branches[0]
    if isinstance(t, dict):
        logical = _logical(t, key, dialect)
        if logical is not None:
            return ColumnType(logical.type, nullable and not key, logical.convert)
        kind = t.get("type")
        if kind == "enum":
            return ColumnType(_text(key, dialect), nullable and not key)
        if kind in ("array", "map", "record"):
            return ColumnType(sa.Text(), nullable and not key, _as_json)
        t = kind
    if isinstance(t, str):
        prim = _primitive(t, key, dialect)
        return ColumnType(prim.type, nullable and not key, prim.convert)
    return ColumnType(_text(key, dialect), nullable and not key, _as_text)
