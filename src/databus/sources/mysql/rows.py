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

from databus.core.errors import CorruptEventError
from databus.sources.mysql.events import read_lenenc

# binlog column types
T_DECIMAL, T_TINY, T_SHORT, T_LONG, T_FLOAT, T_DOUBLE, T_NULL, T_TIMESTAMP = 0, 1, 2, 3, 4, 5, 6, 7
T_LONGLONG, T_INT24, T_DATE, T_TIME, T_DATETIME, T_YEAR = 8, 9, 10, 11, 12, 13
T_VARCHAR, T_BIT, T_TIMESTAMP2, T_DATETIME2, T_TIME2 = 15, 16, 17, 18, 19
T_JSON, T_NEWDECIMAL, T_ENUM, T_SET = 245, 246, 247, 248
T_TINY_BLOB, T_MEDIUM_BLOB, T_LONG_BLOB, T_BLOB, T_VAR_STRING, T_STRING, T_GEOMETRY = (
    249, 250, 251, 252, 253, 254, 255)
BINARY_CHARSET = 63
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


def _bits(buf: memoryview | bytes, pos: int, n: int) -> tuple[list[bool], int]:
    nbytes = (n + 7) // 8
    raw = buf[pos : pos + nbytes]
    return [bool(raw[i >> 3] & (1 << (i & 7))) for i in range(n)], pos + nbytes


def parse_table_def(body: memoryview) -> TableDef:
    """A TABLE_MAP event body (checksum removed) -> :class:`TableDef`."""
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
    for i, vals in raw_values.items():
        target = td.set_values if td.real_types[i] == T_SET else td.enum_values
        target[i] = [str(_text(v, enum_cs.get(i, 33))) for v in vals]


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


_CHARSET_CODECS = {8: "latin1", 5: "latin1", 47: "latin1", 48: "latin1", 49: "latin1",
                   94: "latin1", 33: "utf-8", 45: "utf-8", 46: "utf-8", 83: "utf-8",
                   192: "utf-8", 224: "utf-8", 255: "utf-8", 63: ""}


def _text(raw: bytes, charset: int) -> str | bytes:
    codec = _CHARSET_CODECS.get(charset)
    if codec == "":
        return raw
    if codec is None:
        codec = "latin1" if charset < 32 else "utf-8"
    # MySQL's latin1 is cp1252
    return raw.decode("cp1252" if codec == "latin1" else codec, errors="surrogateescape")


def decode_rows(td: TableDef, event_type: int, body: memoryview
                ) -> list[tuple[list[Any] | None, list[Any] | None]]:
    """(before, after) images of every row in a rows event body."""
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
        return _text(bytes(b[pos : pos + ln]), _cs(td, i)), pos + ln
    if t == T_STRING:
        ln = b[pos] if m < 256 else struct.unpack_from("<H", b, pos)[0]
        pos += 1 if m < 256 else 2
        raw = bytes(b[pos : pos + ln])
        if _cs(td, i) == BINARY_CHARSET:  # BINARY(n): the binlog drops the zero padding
            return raw.ljust(m, b"\x00"), pos + ln
        return _text(raw, _cs(td, i)), pos + ln
    if t in (T_BLOB, T_TINY_BLOB, T_MEDIUM_BLOB, T_LONG_BLOB, T_GEOMETRY, T_JSON):
        ln = int.from_bytes(b[pos : pos + m], "little")
        pos += m
        raw = bytes(b[pos : pos + ln])
        if t == T_BLOB and td.types[i] == T_BLOB and _cs(td, i) != BINARY_CHARSET:
            return _text(raw, _cs(td, i)), pos + ln
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


def _cs(td: TableDef, i: int) -> int:
    return td.charsets[i] if td.charsets else 33


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
