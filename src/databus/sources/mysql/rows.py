"""Row images of binlog row events, decoded with the table map's metadata.

A TABLE_MAP event carries, per column, its binlog type and type metadata, and
(with ``binlog_row_metadata=FULL``) optional metadata: signedness, charsets,
names, ENUM/SET values, primary key. :class:`TableDef` keeps all of it;
:func:`decode_rows` turns the images of a WRITE/UPDATE/DELETE rows event into
lists of Python values (exact: ``Decimal``, ``date``, ``datetime``, ``timedelta``,
``bytes`` for binary strings, ``str`` for text).

Status: the decoder is generic (one branch per column per value); a decoder
specialised per table version is the planned speed-up (issue #3).
"""

from __future__ import annotations

import datetime as dt
import decimal
import struct
from dataclasses import dataclass, field
from typing import Any

from databus.core.errors import CorruptEventError, SchemaError
from databus.core.mysqlwire import (  # binlog column types, shared with the binlog service
    BINARY_CHARSET,
    T_BIT,
    T_BLOB,
    T_DATE,
    T_DATETIME2,
    T_DOUBLE,
    T_ENUM,
    T_FLOAT,
    T_GEOMETRY,
    T_INT24,
    T_JSON,
    T_LONG,
    T_LONG_BLOB,
    T_LONGLONG,
    T_MEDIUM_BLOB,
    T_NEWDECIMAL,
    T_SET,
    T_SHORT,
    T_STRING,
    T_TIME2,
    T_TIMESTAMP2,
    T_TINY,
    T_TINY_BLOB,
    T_VAR_STRING,
    T_VARCHAR,
    T_YEAR,
)
from databus.sources.mysql import jsonb
from databus.sources.mysql.events import read_lenenc

_INT_SIZES = {T_TINY: 1, T_SHORT: 2, T_INT24: 3, T_LONG: 4, T_LONGLONG: 8}


@dataclass
class TableDef:
    """One table version as the binlog describes it."""

    table_id: int
    schema: str
    table: str
    types: list[int]
    meta: list[int]
    nullable: list[bool]
    names: list[str] = field(default_factory=list)
    unsigned: list[bool] = field(default_factory=list)
    charsets: list[int] = field(default_factory=list)
    enum_values: dict[int, list[str]] = field(default_factory=dict)
    set_values: dict[int, list[str]] = field(default_factory=dict)
    primary_key: list[int] = field(default_factory=list)
    real_types: list[int] = field(default_factory=list)
    codecs: list[str] = field(default_factory=list)  # see resolve_charsets
    raw_values: dict[int, list[bytes]] = field(default_factory=dict)
    value_charsets: dict[int, int] = field(default_factory=dict)


def _bits(buf: memoryview | bytes, pos: int, n: int) -> tuple[list[bool], int]:
    nbytes = (n + 7) // 8
    raw = buf[pos : pos + nbytes]
    return [bool(raw[i >> 3] & (1 << (i & 7))) for i in range(n)], pos + nbytes


def parse_table_def(body: memoryview, collations: dict[int, str] | None = None) -> TableDef:
    """A TABLE_MAP event body (checksum removed) -> :class:`TableDef`.

    ``collations`` maps collation ids to character set names (the server's
    ``information_schema.COLLATIONS``); common ids are known without it.
    """
    table_id = int.from_bytes(body[0:6], "little")
    pos = 8
    slen = body[pos]
    schema = bytes(body[pos + 1 : pos + 1 + slen]).decode()
    pos += 2 + slen
    tlen = body[pos]
    table = bytes(body[pos + 1 : pos + 1 + tlen]).decode()
    pos += 2 + tlen
    n, pos = read_lenenc(body, pos)
    types = list(body[pos : pos + n])
    pos += n
    mlen, pos = read_lenenc(body, pos)
    meta_end = pos + mlen
    meta: list[int] = []
    real: list[int] = []
    for t in types:
        rt = t
        if t in (T_FLOAT, T_DOUBLE, T_BLOB, T_GEOMETRY, T_JSON, T_TIMESTAMP2, T_DATETIME2,
                 T_TIME2, T_TINY_BLOB, T_MEDIUM_BLOB, T_LONG_BLOB):
            m = body[pos]
            pos += 1
        elif t in (T_VARCHAR, T_VAR_STRING):
            m = struct.unpack_from("<H", body, pos)[0]
            pos += 2
        elif t in (T_NEWDECIMAL, T_BIT):
            m = (body[pos] << 8) | body[pos + 1]  # (precision, scale) / (bits, bytes)
            pos += 2
        elif t == T_STRING:
            b0, b1 = body[pos], body[pos + 1]
            pos += 2
            if b0 in (T_ENUM, T_SET):
                rt, m = b0, b1
            else:  # CHAR: max length spread over both bytes
                m = (((b0 & 0x30) ^ 0x30) << 4) | b1
        else:
            m = 0
        meta.append(m)
        real.append(rt)
    pos = meta_end
    nullable, pos = _bits(body, pos, n)
    td = TableDef(table_id, schema, table, types, meta, nullable, real_types=real)
    _optional_metadata(td, body, pos)
    resolve_charsets(td, collations or {})
    return td


def _optional_metadata(td: TableDef, body: memoryview, pos: int) -> None:
    n = len(td.types)
    end = len(body)
    raw_values: dict[int, list[bytes]] = {}
    enum_cs: dict[int, int] = {}
    while pos < end:
        kind = body[pos]
        length, pos = read_lenenc(body, pos + 1)
        chunk = body[pos : pos + length]
        pos += length
        if kind == 1:  # SIGNEDNESS: one bit per numeric column, MSB first
            numeric = [i for i, t in enumerate(td.real_types) if t in _INT_SIZES
                       or t in (T_FLOAT, T_DOUBLE, T_NEWDECIMAL)]
            td.unsigned = [False] * n
            for k, i in enumerate(numeric):
                td.unsigned[i] = bool(chunk[k >> 3] & (0x80 >> (k & 7)))
        elif kind in (2, 3):  # DEFAULT_CHARSET / COLUMN_CHARSET for character columns
            td.charsets = _charsets(td, chunk, default=kind == 2)
        elif kind == 4:  # COLUMN_NAME
            p = 0
            while p < len(chunk):
                ln, p = read_lenenc(chunk, p)
                td.names.append(bytes(chunk[p : p + ln]).decode())
                p += ln
        elif kind in (5, 6):  # SET_STR_VALUE / ENUM_STR_VALUE
            cols = [i for i, t in enumerate(td.real_types) if t == (T_SET if kind == 5 else T_ENUM)]
            target = td.set_values if kind == 5 else td.enum_values
            p = 0
            for i in cols:
                count, p = read_lenenc(chunk, p)
                vals = []
                for _ in range(count):
                    ln, p = read_lenenc(chunk, p)
                    vals.append(bytes(chunk[p : p + ln]))
                    p += ln
                raw_values[i] = vals
                target[i] = []
        elif kind in (10, 11):  # ENUM_AND_SET_DEFAULT_CHARSET / _COLUMN_CHARSET
            cols = [i for i, t in enumerate(td.real_types) if t in (T_ENUM, T_SET)]
            p = 0
            if kind == 10:
                dflt, p = read_lenenc(chunk, 0)
                for i in cols:
                    enum_cs[i] = dflt
                while p < len(chunk):
                    idx, p = read_lenenc(chunk, p)
                    enum_cs[cols[idx]], p = read_lenenc(chunk, p)
            else:
                for i in cols:
                    enum_cs[i], p = read_lenenc(chunk, p)
        elif kind == 8:  # SIMPLE_PRIMARY_KEY
            p = 0
            while p < len(chunk):
                idx, p = read_lenenc(chunk, p)
                td.primary_key.append(idx)
        elif kind == 9:  # PRIMARY_KEY_WITH_PREFIX
            p = 0
            while p < len(chunk):
                idx, p = read_lenenc(chunk, p)
                _prefix, p = read_lenenc(chunk, p)
                td.primary_key.append(idx)
    if not td.unsigned:
        td.unsigned = [False] * n
    td.raw_values = raw_values
    td.value_charsets = enum_cs


def _is_char_column(t: int) -> bool:
    return t in (T_VARCHAR, T_VAR_STRING, T_STRING, T_BLOB, T_TINY_BLOB, T_MEDIUM_BLOB,
                 T_LONG_BLOB)


def _charsets(td: TableDef, chunk: memoryview, default: bool) -> list[int]:
    cols = [i for i, t in enumerate(td.real_types) if _is_char_column(t)]
    out = [BINARY_CHARSET] * len(td.types)
    p = 0
    if default:
        dflt, p = read_lenenc(chunk, 0)
        for i in cols:
            out[i] = dflt
        while p < len(chunk):
            idx, p = read_lenenc(chunk, p)
            cs, p = read_lenenc(chunk, p)
            out[cols[idx]] = cs
    else:
        for i in cols:
            cs, p = read_lenenc(chunk, p)
            out[i] = cs
    return out


# How a column's bytes become text: a Python codec name, or one of these.
CODEC_BINARY = "binary"  # not text: bytes
CODEC_UTF8 = "utf-8"  # utf8mb3, utf8mb4, ascii
CODEC_LATIN1 = "mysql-latin1"  # MySQL's latin1 = cp1252 + the five C1 controls it leaves out

# MySQL/MariaDB character set name -> Python codec
_CHARSET_CODECS = {
    "binary": CODEC_BINARY, "utf8": CODEC_UTF8, "utf8mb3": CODEC_UTF8, "utf8mb4": CODEC_UTF8,
    "ascii": CODEC_UTF8, "latin1": CODEC_LATIN1, "latin2": "iso8859_2", "latin5": "iso8859_9",
    "latin7": "iso8859_13", "cp1250": "cp1250", "cp1251": "cp1251", "cp1256": "cp1256",
    "cp1257": "cp1257", "cp850": "cp850", "cp852": "cp852", "cp866": "cp866",
    "koi8r": "koi8_r", "koi8u": "koi8_u", "greek": "iso8859_7", "hebrew": "iso8859_8",
    "gbk": "gbk", "gb2312": "gb2312", "gb18030": "gb18030", "big5": "big5",
    "sjis": "shift_jis", "cp932": "cp932", "ujis": "euc_jp", "eucjpms": "euc_jp",
    "euckr": "euc_kr", "tis620": "tis_620", "macroman": "mac_roman", "macce": "mac_latin2",
    "ucs2": "utf_16_be", "utf16": "utf_16_be", "utf16le": "utf_16_le", "utf32": "utf_32_be",
}
# collation id -> character set, for the common ids (the source reads the server's
# own table, information_schema.COLLATIONS, and passes it to resolve_charsets)
DEFAULT_COLLATIONS: dict[int, str] = {
    63: "binary", 11: "ascii", 65: "ascii", 33: "utf8mb3", 83: "utf8mb3", 45: "utf8mb4",
    46: "utf8mb4", 255: "utf8mb4", 5: "latin1", 8: "latin1", 15: "latin1", 31: "latin1",
    47: "latin1", 48: "latin1", 49: "latin1", 94: "latin1",
    **{i: "utf8mb3" for i in range(192, 224)}, **{i: "utf8mb4" for i in range(224, 248)},
}
_LATIN1_C1 = {0x80: 0x20AC, 0x82: 0x201A, 0x83: 0x0192, 0x84: 0x201E, 0x85: 0x2026,
              0x86: 0x2020, 0x87: 0x2021, 0x88: 0x02C6, 0x89: 0x2030, 0x8A: 0x0160,
              0x8B: 0x2039, 0x8C: 0x0152, 0x8E: 0x017D, 0x91: 0x2018, 0x92: 0x2019,
              0x93: 0x201C, 0x94: 0x201D, 0x95: 0x2022, 0x96: 0x2013, 0x97: 0x2014,
              0x98: 0x02DC, 0x99: 0x2122, 0x9A: 0x0161, 0x9B: 0x203A, 0x9C: 0x0153,
              0x9E: 0x017E, 0x9F: 0x0178}


def charset_codec(collation_id: int, collations: dict[int, str]) -> str:
    """The codec of a collation id; a clear error for a character set we cannot read."""
    name = collations.get(collation_id) or DEFAULT_COLLATIONS.get(collation_id)
    if name is None:
        raise SchemaError(f"unknown collation id {collation_id}")
    codec = _CHARSET_CODECS.get(name)
    if codec is None:
        raise SchemaError(f"character set {name} (collation {collation_id}) is not supported")
    return codec


def charset_codec_by_name(name: str) -> str:
    """The codec of a character set name (``information_schema`` gives names)."""
    codec = _CHARSET_CODECS.get(name)
    if codec is None:
        raise SchemaError(f"character set {name} is not supported")
    return codec


def text(raw: bytes, codec: str) -> str | bytes:
    """Column bytes as the value a SELECT returns: str, or bytes for binary."""
    if codec == CODEC_BINARY:
        return raw
    try:
        if codec == CODEC_LATIN1:
            return raw.decode("latin-1").translate(_LATIN1_C1)
        return raw.decode(codec)
    except UnicodeDecodeError as exc:
        raise CorruptEventError(f"column bytes are not valid {codec}: {exc}") from exc


def resolve_charsets(td: TableDef, collations: dict[int, str]) -> None:
    """Sets ``td.codecs`` and decodes ENUM/SET value names, from the collation ids."""
    td.codecs = [charset_codec(cs, collations) if _is_char_column(t) else CODEC_BINARY
                 for t, cs in zip(td.real_types, td.charsets or [33] * len(td.types),
                                  strict=True)]
    for i, vals in td.raw_values.items():
        target = td.set_values if td.real_types[i] == T_SET else td.enum_values
        target[i] = [str(text(v, charset_codec(td.value_charsets.get(i, 33), collations)))
                     for v in vals]


# how a table version's event keys are formed
KEY_INT, KEY_ROWINDEX, KEY_JSON = "int", "row-index", "json"


def key_mode(td: TableDef) -> str:
    """A single integer key column that fits int64 -> int key; no primary key ->
    the row's index in its transaction; anything else -> a JSON array (bytes)."""
    if not td.primary_key:
        return KEY_ROWINDEX
    if len(td.primary_key) == 1:
        i = td.primary_key[0]
        t = td.real_types[i]
        if t in _INT_SIZES and not (t == T_LONGLONG and td.unsigned[i]):
            return KEY_INT
    return KEY_JSON


def decode_rows(td: TableDef, event_type: int, body: memoryview
                ) -> list[tuple[list[Any] | None, list[Any] | None]]:
    """(before, after) images of every row in a rows event body.

    A body that does not fit the table map raises :class:`CorruptEventError`.
    """
    try:
        return _decode_rows(td, event_type, body)
    except (struct.error, IndexError, ValueError, OverflowError) as exc:
        raise CorruptEventError(f"rows event of {td.schema}.{td.table} is damaged: {exc}"
                                ) from exc


def _decode_rows(td: TableDef, event_type: int, body: memoryview
                 ) -> list[tuple[list[Any] | None, list[Any] | None]]:
    v2 = event_type >= 30
    pos = 8
    if v2:
        extra = struct.unpack_from("<H", body, pos)[0]
        pos += extra  # the length includes its own two bytes
    n, pos = read_lenenc(body, pos)
    present, pos = _bits(body, pos, n)
    update = event_type in (24, 31)
    present_after = present
    if update:
        present_after, pos = _bits(body, pos, n)
    if not any(present) or not any(present_after):
        # an image without columns would consume nothing: corrupt, not a loop
        raise CorruptEventError(f"rows event of {td.schema}.{td.table} names no column")
    out: list[tuple[list[Any] | None, list[Any] | None]] = []
    end = len(body)
    while pos < end:
        image, pos = _image(td, body, pos, present)
        if update:
            after, pos = _image(td, body, pos, present_after)
            out.append((image, after))
        elif event_type in (25, 32):
            out.append((image, None))
        else:
            out.append((None, image))
    return out


def _image(td: TableDef, body: memoryview, pos: int, present: list[bool]
           ) -> tuple[list[Any], int]:
    cols = [i for i, p in enumerate(present) if p]
    nulls, pos = _bits(body, pos, len(cols))
    row: list[Any] = [None] * len(td.types)
    for k, i in enumerate(cols):
        if nulls[k]:
            continue
        try:
            row[i], pos = _value(td, i, body, pos)
        except (struct.error, IndexError, ValueError) as exc:
            raise CorruptEventError(f"cannot decode column {i} of {td.schema}.{td.table}:"
                                    f" {exc}") from exc
    return row, pos


def _value(td: TableDef, i: int, b: memoryview, pos: int) -> tuple[Any, int]:
    t, m = td.real_types[i], td.meta[i]
    if t in _INT_SIZES:
        size = _INT_SIZES[t]
        return int.from_bytes(b[pos : pos + size], "little", signed=not td.unsigned[i]), pos + size
    if t == T_FLOAT:
        return struct.unpack_from("<f", b, pos)[0], pos + 4
    if t == T_DOUBLE:
        return struct.unpack_from("<d", b, pos)[0], pos + 8
    if t == T_NEWDECIMAL:
        return _decimal(b, pos, m >> 8, m & 0xFF)
    if t in (T_VARCHAR, T_VAR_STRING):
        ln = b[pos] if m < 256 else struct.unpack_from("<H", b, pos)[0]
        pos += 1 if m < 256 else 2
        return text(bytes(b[pos : pos + ln]), _codec(td, i)), pos + ln
    if t == T_STRING:
        ln = b[pos] if m < 256 else struct.unpack_from("<H", b, pos)[0]
        pos += 1 if m < 256 else 2
        raw = bytes(b[pos : pos + ln])
        if _codec(td, i) == CODEC_BINARY:  # BINARY(n): the binlog drops the zero padding
            return raw.ljust(m, b"\x00"), pos + ln
        return text(raw, _codec(td, i)), pos + ln
    if t in (T_BLOB, T_TINY_BLOB, T_MEDIUM_BLOB, T_LONG_BLOB, T_GEOMETRY, T_JSON):
        ln = int.from_bytes(b[pos : pos + m], "little")
        pos += m
        raw = bytes(b[pos : pos + ln])
        if t == T_BLOB and _codec(td, i) != CODEC_BINARY:
            return text(raw, _codec(td, i)), pos + ln
        if t == T_JSON:  # MySQL 8 binary JSON (MariaDB logs JSON as text, a BLOB)
            return jsonb.to_text(raw), pos + ln
        return raw, pos + ln
    if t == T_ENUM:
        idx = int.from_bytes(b[pos : pos + m], "little")
        values = td.enum_values.get(i, [])
        return (values[idx - 1] if 0 < idx <= len(values) else ""), pos + m
    if t == T_SET:
        bits = int.from_bytes(b[pos : pos + m], "little")
        values = td.set_values.get(i, [])
        return ",".join(v for k, v in enumerate(values) if bits >> k & 1), pos + m
    if t == T_BIT:
        # metadata: (bits % 8, whole bytes)
        nbytes = (m & 0xFF) + (1 if m >> 8 else 0)
        return int.from_bytes(b[pos : pos + nbytes], "big"), pos + nbytes
    if t == T_YEAR:
        y = b[pos]
        return (1900 + y if y else 0), pos + 1
    if t == T_DATE:
        v = int.from_bytes(b[pos : pos + 3], "little")
        y, mo, d = v >> 9, (v >> 5) & 15, v & 31
        return (dt.date(y, mo, d) if y and mo and d else None), pos + 3
    if t == T_DATETIME2:
        return _datetime2(b, pos, m)
    if t == T_TIMESTAMP2:
        secs = int.from_bytes(b[pos : pos + 4], "big")
        frac, pos = _frac(b, pos + 4, m)
        if secs == 0 and frac == 0:
            return None, pos  # the zero timestamp
        return dt.datetime.fromtimestamp(secs, dt.UTC) + dt.timedelta(microseconds=frac), pos
    if t == T_TIME2:
        return _time2(b, pos, m)
    raise ValueError(f"binlog type {t} is not decoded yet")


def _codec(td: TableDef, i: int) -> str:
    return td.codecs[i] if td.codecs else CODEC_UTF8


def _frac(b: memoryview, pos: int, fsp: int) -> tuple[int, int]:
    nbytes = (fsp + 1) // 2
    if not nbytes:
        return 0, pos
    v = int.from_bytes(b[pos : pos + nbytes], "big")
    return v * (100 ** (3 - nbytes)), pos + nbytes


def _datetime2(b: memoryview, pos: int, fsp: int) -> tuple[dt.datetime | None, int]:
    v = int.from_bytes(b[pos : pos + 5], "big") - 0x8000000000
    frac, pos = _frac(b, pos + 5, fsp)
    ym = v >> 22 & 0x1FFFF
    y, mo = divmod(ym, 13)
    d = v >> 17 & 31
    hh, mi, ss = v >> 12 & 31, v >> 6 & 63, v & 63
    if not (y and mo and d):
        return None, pos  # zero dates
    return dt.datetime(y, mo, d, hh, mi, ss, frac), pos


def _time2(b: memoryview, pos: int, fsp: int) -> tuple[dt.timedelta, int]:
    nbytes = (fsp + 1) // 2
    raw = int.from_bytes(b[pos : pos + 3 + nbytes], "big")
    total_bits = 8 * (3 + nbytes)
    # stored as an offset-binary number of (seconds << frac_bits) | fraction
    v = raw - (1 << (total_bits - 1))
    frac_bits = 8 * nbytes
    sign = -1 if v < 0 else 1
    v = abs(v)
    frac = v & ((1 << frac_bits) - 1) if frac_bits else 0
    hms = v >> frac_bits
    h, mi, s = hms >> 12 & 0x3FF, hms >> 6 & 63, hms & 63
    micros = frac * (100 ** (3 - nbytes)) if nbytes else 0
    return sign * dt.timedelta(hours=h, minutes=mi, seconds=s, microseconds=micros), \
        pos + 3 + nbytes


_DIG2BYTES = [0, 1, 1, 2, 2, 3, 3, 4, 4, 4]


def _decimal(b: memoryview, pos: int, precision: int, scale: int) -> tuple[decimal.Decimal, int]:
    intg = precision - scale
    size = (intg // 9) * 4 + _DIG2BYTES[intg % 9] + (scale // 9) * 4 + _DIG2BYTES[scale % 9]
    raw = bytearray(b[pos : pos + size])
    negative = not raw[0] & 0x80
    raw[0] ^= 0x80
    if negative:
        raw = bytearray(x ^ 0xFF for x in raw)
    digits = []
    p = 0
    lead = intg % 9
    if lead:
        n = _DIG2BYTES[lead]
        digits.append(str(int.from_bytes(raw[p : p + n], "big")))
        p += n
    for _ in range(intg // 9):
        digits.append(f"{int.from_bytes(raw[p : p + 4], 'big'):09d}")
        p += 4
    frac = []
    for _ in range(scale // 9):
        frac.append(f"{int.from_bytes(raw[p : p + 4], 'big'):09d}")
        p += 4
    tail = scale % 9
    if tail:
        n = _DIG2BYTES[tail]
        frac.append(f"{int.from_bytes(raw[p : p + n], 'big'):0{tail}d}")
    text = ("-" if negative else "") + ("".join(digits).lstrip("0") or "0")
    if scale:
        text += "." + "".join(frac)
    return decimal.Decimal(text), pos + size
