"""MySQL 8's binary JSON (the ``JSON`` column type in its binlog) -> JSON text.

MariaDB stores JSON as text and never needs this. The layout follows MySQL's
``json_binary`` format: a type byte, then for objects and arrays an element
count and a byte size (2 bytes each in the small form, 4 in the large form),
key entries (offset, length), value entries (type + offset, or the value
itself for literals and small integers), and the keys and values they point
to; offsets count from the byte after the type. Strings carry a variable-length
size (7 bits per byte). The text uses MySQL's own spacing (``", "`` and
``": "``), as ``SELECT`` shows it.

Not checked against a MySQL 8 server (none can be installed here): tested with
documents built by hand to the format.
"""

from __future__ import annotations

import json
import struct

from databus.core.errors import CorruptEventError

SMALL_OBJECT, LARGE_OBJECT, SMALL_ARRAY, LARGE_ARRAY = 0x00, 0x01, 0x02, 0x03
LITERAL, INT16, UINT16, INT32, UINT32, INT64, UINT64, DOUBLE, STRING = range(0x04, 0x0D)
OPAQUE = 0x0F
_LITERALS = {0x00: "null", 0x01: "true", 0x02: "false"}


def to_text(data: bytes) -> str:
    """The JSON text of a binary JSON value (an empty value is JSON null)."""
    if not data:
        return "null"
    try:
        return _value(data[0], memoryview(data), 1)
    except (IndexError, struct.error, UnicodeDecodeError, KeyError) as exc:
        raise CorruptEventError(f"damaged MySQL binary JSON: {exc}") from exc


def _varlen(buf: memoryview, pos: int) -> tuple[int, int]:
    n = shift = 0
    for _ in range(5):
        b = buf[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return n, pos
        shift += 7
    raise CorruptEventError("binary JSON length longer than 5 bytes")


def _value(t: int, buf: memoryview, pos: int) -> str:
    if t in (SMALL_OBJECT, LARGE_OBJECT, SMALL_ARRAY, LARGE_ARRAY):
        return _container(t, buf, pos)
    if t == LITERAL:
        return _LITERALS[buf[pos]]
    if t in _SCALARS:
        fmt = _SCALARS[t]
        v = struct.unpack_from(fmt, buf, pos)[0]
        return repr(v) if t == DOUBLE else str(v)
    if t == STRING:
        n, pos = _varlen(buf, pos)
        return json.dumps(bytes(buf[pos : pos + n]).decode("utf-8"), ensure_ascii=False)
    if t == OPAQUE:  # a MySQL type inside JSON (DECIMAL, DATE...): shown as a string
        _field_type = buf[pos]
        n, p = _varlen(buf, pos + 1)
        return json.dumps(bytes(buf[p : p + n]).hex(), ensure_ascii=False)
    raise CorruptEventError(f"unknown binary JSON type {t:#x}")


_SCALARS = {INT16: "<h", UINT16: "<H", INT32: "<i", UINT32: "<I", INT64: "<q", UINT64: "<Q",
            DOUBLE: "<d"}


def _container(t: int, buf: memoryview, start: int) -> str:
    large = t in (LARGE_OBJECT, LARGE_ARRAY)
    is_object = t in (SMALL_OBJECT, LARGE_OBJECT)
    w = 4 if large else 2
    fmt = "<I" if large else "<H"
    count = struct.unpack_from(fmt, buf, start)[0]
    pos = start + 2 * w
    keys: list[str] = []
    if is_object:
        for _ in range(count):
            key_off = struct.unpack_from(fmt, buf, pos)[0]
            key_len = struct.unpack_from("<H", buf, pos + w)[0]
            keys.append(bytes(buf[start + key_off : start + key_off + key_len]).decode("utf-8"))
            pos += w + 2
    values: list[str] = []
    for _ in range(count):
        vt = buf[pos]
        if vt == LITERAL or vt in (INT16, UINT16) or (large and vt in (INT32, UINT32)):
            values.append(_value(vt, buf, pos + 1))  # inlined in the entry
        else:
            off = struct.unpack_from(fmt, buf, pos + 1)[0]
            values.append(_value(vt, buf, start + off))
        pos += 1 + w
    if is_object:
        items = (f"{json.dumps(k, ensure_ascii=False)}: {v}" for k, v in zip(keys, values,
                                                                              strict=True))
        return "{" + ", ".join(items) + "}"
    return "[" + ", ".join(values) + "]"
