"""Names of captured tables, the same rule for every source.

* A table's logical source name is ``<db>.<table>`` (MySQL), ``<schema>.<table>``
  (PostgreSQL), ``main.<table>`` (SQLite).
* Its logical source id is the CRC-32 of that name's UTF-8 bytes, masked to 31 bits
  (:func:`source_id`): stable across restarts and relays, positive as an int32.
"""

from __future__ import annotations

import zlib

from databus.core.errors import SchemaError


def source_id(name: str) -> int:
    """The logical source id of a table's ``db.table`` name (module docstring)."""
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


def split_name(name: str, what: str = "db.table") -> tuple[str, str]:
    """``(db, table)`` of a ``db.table`` name; :class:`SchemaError` naming ``what``
    (``db.table``, ``schema.table``) when either part is missing."""
    db, _, table = name.partition(".")
    if not db or not table:
        raise SchemaError(f"table names are {what}, got {name!r}")
    return db, table
