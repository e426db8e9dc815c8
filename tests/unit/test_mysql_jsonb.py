"""MySQL 8 binary JSON -> text, on documents built to the format by hand.

No MySQL 8 server can be installed here; the encoder below follows the
published layout (json_binary) independently of the decoder's code.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest

from databus.core.errors import CorruptEventError
from databus.sources.mysql.jsonb import to_text


def _varlen(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _scalar(v: Any) -> tuple[int, bytes]:
    if v is None or isinstance(v, bool):
        return 0x04, bytes([{None: 0, True: 1, False: 2}[v]])
    if isinstance(v, int):
        if -(2**15) <= v < 2**15:
            return 0x05, struct.pack("<h", v)
        if -(2**31) <= v < 2**31:
            return 0x07, struct.pack("<i", v)
        if v < 2**63:
            return 0x09, struct.pack("<q", v)
        return 0x0A, struct.pack("<Q", v)
    if isinstance(v, float):
        return 0x0B, struct.pack("<d", v)
    if isinstance(v, str):
        raw = v.encode()
        return 0x0C, _varlen(len(raw)) + raw
    return _container(v, large=False)


def _container(v: Any, large: bool) -> tuple[int, bytes]:
    w, fmt = (4, "<I") if large else (2, "<H")
    is_obj = isinstance(v, dict)
    items = list(v.items()) if is_obj else [(None, x) for x in v]
    n = len(items)
    header = 2 * w + (n * (w + 2) if is_obj else 0) + n * (1 + w)
    keys = b""
    key_entries = b""
    if is_obj:
        for k, _ in items:
            kb = k.encode()
            key_entries += struct.pack(fmt, header + len(keys)) + struct.pack("<H", len(kb))
            keys += kb
    body = b""
    value_entries = b""
    for _, x in items:
        t, data = _scalar(x) if not isinstance(x, (dict, list)) else _container(x, large)
        inline = t == 0x04 or t in (0x05, 0x06) or (large and t in (0x07, 0x08))
        if inline:
            value_entries += bytes([t]) + data.ljust(w, b"\x00")
        else:
            value_entries += bytes([t]) + struct.pack(fmt, header + len(keys) + len(body))
            body += data
    total = header + len(keys) + len(body)
    t = (0x00 if is_obj else 0x02) + (1 if large else 0)
    return t, struct.pack(fmt, n) + struct.pack(fmt, total) + key_entries + value_entries \
        + keys + body


DOCS = [
    {"a": 1, "b": [True, None, "x"], "c": 2.5},
    [1, -2, 70000, -(2**40), 2**64 - 1, "é😀", {"k": [], "z": {}}],
    {"nested": {"deeper": [1.25, False, "q\"uote\\"]}, "": 0},
    [],
    {},
]


@pytest.mark.parametrize("large", [False, True])
@pytest.mark.parametrize("doc", DOCS)
def test_documents_round_trip_to_mysql_text(doc: Any, large: bool) -> None:
    t, data = _container(doc, large)
    assert json.loads(to_text(bytes([t]) + data)) == doc
    assert to_text(bytes([t]) + data) == json.dumps(doc, ensure_ascii=False,
                                                    separators=(", ", ": "))


@pytest.mark.parametrize("value", [None, True, 7, -40000, 3.5, "plain"])
def test_scalars_at_top_level(value: Any) -> None:
    t, data = _scalar(value)
    assert json.loads(to_text(bytes([t]) + data)) == value


def test_damaged_documents_are_a_typed_error() -> None:
    t, data = _container(DOCS[1], large=False)
    for cut in range(1, len(data)):
        try:
            to_text(bytes([t]) + data[:cut])
        except CorruptEventError:
            continue
    with pytest.raises(CorruptEventError):
        to_text(b"\x0e\x00")
    assert to_text(b"") == "null"
