"""MariaDB's compressed binlog events (``log_bin_compress=ON``), expanded into the plain
events they stand for, so the one row decoder (compiled and Python) and the one query
parser read them.

MariaDB writes, instead of a QUERY or a v1/v2 rows event whose data is at least
``log_bin_compress_min_len`` bytes:

* ``QUERY_COMPRESSED_EVENT`` (165): the statement text after ``db\\0`` is compressed;
* ``{WRITE,UPDATE,DELETE}_ROWS_COMPRESSED_EVENT_V1`` (166-168) and
  ``..._ROWS_COMPRESSED_EVENT`` (169-171, the v2 forms): the row images after the
  column bitmaps are compressed; the table id, flags, column count and bitmaps stay.

A compressed part starts with one byte ``1 alg(3 bits) lenlen(3 bits)``, then the
uncompressed length as ``lenlen`` big-endian bytes, then the data; the only algorithm
MariaDB defines is 0, zlib. Anything else, or data that does not inflate to the stated
length, is a :class:`CorruptEventError`: never skipped.
"""

from __future__ import annotations

import zlib

from databus.core.errors import CorruptEventError
from databus.sources.mysql.events import read_lenenc

QUERY_COMPRESSED = 165
# compressed rows type -> the plain type whose layout it keeps
ROWS_PLAIN = {166: 23, 167: 24, 168: 25, 169: 30, 170: 31, 171: 32}
COMPRESSED = frozenset({QUERY_COMPRESSED, *ROWS_PLAIN})
_UPDATES = frozenset({24, 31})  # two column bitmaps
_V2 = frozenset({30, 31, 32})  # an extra-data block after the flags
_QUERY_POST_HEADER = 13  # thread id 4, exec time 4, db length 1, error code 2, status length 2


def inflate(part: bytes | memoryview) -> bytes:
    """The data of one compressed part (see the module docstring)."""
    if not part:
        raise CorruptEventError("compressed binlog data is empty")
    head = part[0]
    lenlen, alg = head & 0x07, (head & 0x70) >> 4
    if not head & 0x80 or not 1 <= lenlen <= 4 or len(part) < 1 + lenlen:
        raise CorruptEventError(f"bad compressed binlog header byte 0x{head:02x}")
    if alg != 0:
        raise CorruptEventError(f"compressed binlog data uses algorithm {alg} (only zlib, 0,"
                                " exists)")
    size = int.from_bytes(part[1:1 + lenlen], "big")
    try:
        out = zlib.decompress(part[1 + lenlen:])
    except zlib.error as exc:
        raise CorruptEventError(f"compressed binlog data does not inflate: {exc}") from exc
    if len(out) != size:
        raise CorruptEventError(f"compressed binlog data inflated to {len(out)} bytes,"
                                f" its header says {size}")
    return out


def _rows_data_start(plain_type: int, body: memoryview) -> int:
    pos = 8  # table id (6) and flags (2)
    if plain_type in _V2:
        pos += int.from_bytes(body[pos:pos + 2], "little")  # the length counts itself
    columns, pos = read_lenenc(body, pos)
    bitmap = (columns + 7) // 8
    return pos + bitmap * (2 if plain_type in _UPDATES else 1)


def expand(event_type: int, body: memoryview) -> tuple[int, memoryview]:
    """The plain event type and body a compressed event stands for."""
    if event_type == QUERY_COMPRESSED:
        if len(body) < _QUERY_POST_HEADER:
            raise CorruptEventError("compressed QUERY event shorter than its post-header")
        db_len = body[8]
        status_len = int.from_bytes(body[11:13], "little")
        text = _QUERY_POST_HEADER + status_len + db_len + 1  # after the db name's NUL
        return 2, memoryview(bytes(body[:text]) + inflate(body[text:]))
    plain = ROWS_PLAIN[event_type]
    start = _rows_data_start(plain, body)
    if start > len(body):
        raise CorruptEventError("compressed rows event shorter than its column bitmaps")
    return plain, memoryview(bytes(body[:start]) + inflate(body[start:]))
