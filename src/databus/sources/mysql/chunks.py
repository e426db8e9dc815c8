"""Reading a table in primary-key chunks, with values exactly as the binlog gives them.

Incremental snapshots (:mod:`.incremental`) read tables with ``SELECT`` while
the binlog streams. For their rows to be the same events as streamed rows
(same Avro schema version, same values, same keys), this module

* builds the :class:`~.rows.TableDef` a table map would carry from
  ``information_schema.COLUMNS`` (:func:`table_def`), so a table can be
  snapshotted before the binlog has shown it;
* selects each column in a form that converts exactly (FLOAT through DOUBLE,
  since its text form has only six digits; the session in UTC for TIMESTAMP)
  and turns ``SELECT`` values into the decoder's values (:func:`to_binlog_values`,
  the Python path; the compiled reader parses the same text in C, see
  :func:`.fastpath.encode_text`);
* writes the chunk query: seek by key (``WHERE key > last ORDER BY key LIMIT n``;
  a composite key as the lexicographic OR of its columns), never OFFSET, with
  an optional extra condition.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from typing import Any

from databus.core import mysqlwire as mw
from databus.core.errors import SchemaError
from databus.sources.mysql import rows as br

_INTS = {"tinyint": mw.T_TINY, "smallint": mw.T_SHORT, "mediumint": mw.T_INT24,
         "int": mw.T_LONG, "integer": mw.T_LONG, "bigint": mw.T_LONGLONG}
_BLOBS = ("tinytext", "text", "mediumtext", "longtext", "tinyblob", "blob", "mediumblob",
          "longblob", "json")
_GEOMETRY = ("geometry", "point", "linestring", "polygon", "multipoint", "multilinestring",
             "multipolygon", "geometrycollection")

COLUMNS_SQL = (
    "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, CHARACTER_SET_NAME, NUMERIC_PRECISION,"
    " NUMERIC_SCALE, DATETIME_PRECISION, IS_NULLABLE FROM information_schema.COLUMNS"
    " WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION")
KEY_SQL = (
    "SELECT COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE WHERE TABLE_SCHEMA = %s"
    " AND TABLE_NAME = %s AND CONSTRAINT_NAME = 'PRIMARY' ORDER BY ORDINAL_POSITION")
# the same two, for every table of the schemas given (one query each however many tables)
ALL_COLUMNS_SQL = (
    "SELECT TABLE_SCHEMA, TABLE_NAME, COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, CHARACTER_SET_NAME,"
    " NUMERIC_PRECISION, NUMERIC_SCALE, DATETIME_PRECISION, IS_NULLABLE"
    " FROM information_schema.COLUMNS WHERE TABLE_SCHEMA IN ({})"
    " ORDER BY TABLE_SCHEMA, TABLE_NAME, ORDINAL_POSITION")
ALL_KEYS_SQL = (
    "SELECT TABLE_SCHEMA, TABLE_NAME, COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE"
    " WHERE TABLE_SCHEMA IN ({}) AND CONSTRAINT_NAME = 'PRIMARY'"
    " ORDER BY TABLE_SCHEMA, TABLE_NAME, ORDINAL_POSITION")


def _values(column_type: str) -> list[str]:
    inner = column_type[column_type.index("(") + 1 : column_type.rindex(")")]
    return [v.replace("''", "'") for v in re.findall(r"'((?:[^']|'')*)'", inner)]


def table_def(db: str, table: str, columns: Sequence[Sequence[Any]], key: Sequence[str]
              ) -> br.TableDef:
    """The TableDef of a table from its ``COLUMNS_SQL`` and ``KEY_SQL`` rows."""
    if not columns:
        raise SchemaError(f"table {db}.{table} does not exist")
    names: list[str] = []
    types: list[int] = []
    meta: list[int] = []
    unsigned: list[bool] = []
    codecs: list[str] = []
    td = br.TableDef(0, db, table, types, meta, [], names=names, unsigned=unsigned,
                     codecs=codecs)
    for i, (name, data_type, column_type, charset, precision, scale, fsp, _null) in enumerate(
            columns):
        dtype = str(data_type).lower()
        ctype = str(column_type).lower()
        names.append(str(name))
        unsigned.append("unsigned" in ctype)
        codec = br.CODEC_BINARY if charset is None else br.charset_codec_by_name(str(charset))
        m = 0
        if dtype in _INTS:
            t = _INTS[dtype]
        elif dtype in ("decimal", "numeric"):
            t, m = mw.T_NEWDECIMAL, (int(precision) << 8) | int(scale)
        elif dtype == "float":
            t = mw.T_FLOAT
        elif dtype in ("double", "real"):
            t = mw.T_DOUBLE
        elif dtype == "bit":
            bits = int(precision)
            t, m = mw.T_BIT, ((bits % 8) << 8) | (bits // 8)
        elif dtype == "year":
            t = mw.T_YEAR
        elif dtype == "date":
            t = mw.T_DATE
        elif dtype in ("time", "datetime", "timestamp"):
            t = {"time": mw.T_TIME2, "datetime": mw.T_DATETIME2,
                 "timestamp": mw.T_TIMESTAMP2}[dtype]
            m = int(fsp or 0)
        elif dtype in ("char", "binary"):
            t = mw.T_STRING
            codec = br.CODEC_BINARY if dtype == "binary" else codec
        elif dtype in ("varchar", "varbinary"):
            t = mw.T_VARCHAR
            codec = br.CODEC_BINARY if dtype == "varbinary" else codec
        elif dtype in _BLOBS:
            t = mw.T_BLOB
            codec = br.CODEC_BINARY if dtype.endswith("blob") else codec
        elif dtype == "enum":
            t = mw.T_ENUM
            td.enum_values[i] = _values(str(column_type))
        elif dtype == "set":
            t = mw.T_SET
            td.set_values[i] = _values(str(column_type))
        elif dtype in _GEOMETRY:
            t = mw.T_GEOMETRY
        else:
            raise SchemaError(f"column {name} of {db}.{table}: type {dtype} cannot be snapshotted")
        types.append(t)
        meta.append(m)
        codecs.append(codec if t in (mw.T_STRING, mw.T_VARCHAR, mw.T_BLOB) else br.CODEC_BINARY)
    td.real_types = list(types)
    td.nullable = [str(c[7]).upper() == "YES" for c in columns]
    td.primary_key = [names.index(k) for k in key]
    return td


def select_list(td: br.TableDef) -> str:
    """The columns of a chunk query, each in a form that converts exactly."""
    out = []
    for name, t in zip(td.names, td.real_types, strict=True):
        q = quote(name)
        out.append(f"CAST({q} AS DOUBLE)" if t == mw.T_FLOAT else q)
    return ", ".join(out)


def to_binlog_values(td: br.TableDef, row: Sequence[Any]) -> list[Any]:
    """``SELECT`` values (pymysql, session time zone UTC) -> the binlog decoder's values."""
    out: list[Any] = []
    for v, t in zip(row, td.real_types, strict=True):
        if v is None:
            out.append(None)
        elif t == mw.T_BIT:
            out.append(int.from_bytes(v, "big"))
        elif t in (mw.T_DATE, mw.T_DATETIME2, mw.T_TIMESTAMP2) and isinstance(v, str):
            out.append(None)  # zero dates (and dates with a zero part) are null
        elif t == mw.T_TIMESTAMP2:
            out.append(v.replace(tzinfo=dt.UTC))
        else:
            out.append(v)
    return out


def quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def chunk_query(td: br.TableDef, key: Sequence[str], after: Sequence[Any] | None,
                upto: Sequence[Any] | None, limit: int, condition: str | None
                ) -> tuple[str, list[Any]]:
    """``SELECT`` of the next chunk: rows with ``after`` < key <= ``upto`` (None: no
    bound), in key order, at most ``limit``; the composite-key seek is the
    lexicographic OR ``(a > x) OR (a = x AND b > y) ...``."""
    where: list[str] = []
    params: list[Any] = []
    if upto is not None:
        cols = ", ".join(quote(k) for k in key)
        where.append(f"({cols}) <= ({', '.join(['%s'] * len(key))})")
        params.extend(upto)
    if after is not None:
        ors = []
        for i in range(len(key)):
            parts = [f"{quote(k)} = %s" for k in key[:i]] + [f"{quote(key[i])} > %s"]
            params.extend([*after[:i], after[i]])
            ors.append("(" + " AND ".join(parts) + ")")
        where.append("(" + " OR ".join(ors) + ")")
    if condition:  # '%' is the driver's placeholder mark here: a LIKE pattern's must double
        where.append(f"({condition.replace('%', '%%')})")
    sql = (f"SELECT {select_list(td)} FROM {quote(td.schema)}.{quote(td.table)}"
           + (f" WHERE {' AND '.join(where)}" if where else "")
           + f" ORDER BY {', '.join(quote(k) for k in key)} LIMIT {int(limit)}")
    return sql, params
