"""Avro binary primitives written by hand where a codec builds records itself
(the SQLite source's rows, the MySQL source's metadata part)."""

from __future__ import annotations

_SMALL = tuple(bytes([i]) for i in range(128))


def varint(n: int) -> bytes:
    """Avro's variable-length encoding of a non-negative integer."""
    if n < 128:
        return _SMALL[n]
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def zigzag(n: int) -> int:
    """Avro's zig-zag mapping of a signed 64-bit integer."""
    return (n << 1) ^ (n >> 63)


def long_bytes(n: int) -> bytes:
    """An Avro ``long``: zig-zag, then variable-length."""
    return varint(zigzag(n))
