"""A mapped table's Table_map and rows events: the bodies the converter hands the store.

:func:`table_map_body` writes MySQL 8's Table_map with full optional metadata
(``binlog_row_metadata=FULL``: signedness, column character sets, column names, the
primary key); :func:`rows_body_head` the rows v2 post-header and column bitmaps
(``binlog_row_image=FULL``: every column present); :func:`row_image` one row's image
(its NULL bitmap, then each value in the column's binary form).

Contract: a value that a column cannot hold exactly raises
:class:`~databus.core.errors.SchemaError` naming the place, the column and the value
(nothing inexact is written); names longer than MySQL's 255 bytes are refused the same
way. :data:`NUMERIC_TYPES` and :data:`CHARACTER_TYPES` are MySQL's rule for which
columns the SIGNEDNESS and charset metadata cover (a reader of the metadata needs it
too). Pure functions.
"""

from __future__ import annotations

import decimal
from typing import Any

from databus.binlog.events import packed_int
from databus.binlog.types import UTF8MB4, MysqlColumn
from databus.core import mysqlwire as mw
from databus.core.errors import SchemaError

NUMERIC_TYPES = frozenset({mw.T_DECIMAL, mw.T_TINY, mw.T_SHORT, mw.T_LONG, mw.T_FLOAT,
                           mw.T_DOUBLE, mw.T_LONGLONG, mw.T_INT24, mw.T_NEWDECIMAL})
"""Types that get a bit in the Table_map's SIGNEDNESS metadata."""
CHARACTER_TYPES = frozenset({mw.T_STRING, mw.T_VAR_STRING, mw.T_VARCHAR, mw.T_BLOB})
"""Types that get a character set in the Table_map's COLUMN_CHARSET metadata."""


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
