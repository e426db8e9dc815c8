"""The catalog: the tables the binlog defines, as ``information_schema`` shows them.

``information_schema.COLUMNS``/``TABLES``/``SCHEMATA``, ``SHOW COLUMNS`` and ``SHOW CREATE
TABLE`` answer from a :data:`Catalog`: a callable giving every ``(db, table)``'s columns
(:class:`ColumnInfo`), called at each statement so that a schema change shows at once.
Both catalogs read Table_map bodies back (:func:`parse_table_map`: names, types,
signedness, character sets and primary key from the optional metadata the converter
writes):

* :class:`AnnouncedCatalog` (the service's): the definition of each table's current
  version that the converter records in the position map with every batch, so the answer
  matches the binlog's end and survives purges, as MySQL's catalog does;
* :class:`TableMapCatalog`: the latest Table_map of each table in the live files (data
  directories written before definitions were recorded; a table shows once a row of it
  was written).

Thread-safe to call from the server's statements (they read the store, which is).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from databus.binlog.rowevents import CHARACTER_TYPES, NUMERIC_TYPES
from databus.binlog.store import BinlogStore
from databus.core import mysqlwire as mw
from databus.core.mysqlwire import (
    BIN_LOG_HEADER_SIZE,
    HEADER_LEN,
    LEN_OFFSET,
    TYPE_OFFSET,
    EventType,
)


@dataclass(frozen=True)
class ColumnInfo:
    """One captured column as information_schema.COLUMNS shows it."""

    name: str
    data_type: str  # "bigint", "varchar", ...
    column_type: str  # "bigint", "varchar(255)", "decimal(10,2)", ...
    nullable: bool = True
    key: str = ""  # "PRI" for a primary-key column
    charset: str | None = None
    collation: str | None = None
    char_max_length: int | None = None
    numeric_precision: int | None = None
    numeric_scale: int | None = None


# (db, table) -> columns in order; a callable so that schema changes show at once
Catalog = Callable[[], dict[tuple[str, str], list[ColumnInfo]]]


_CHARSETS = {8: ("latin1", "latin1_swedish_ci", 1), 33: ("utf8mb3", "utf8mb3_general_ci", 3),
             45: ("utf8mb4", "utf8mb4_general_ci", 4), 46: ("utf8mb4", "utf8mb4_bin", 4),
             63: ("binary", "binary", 1), 255: ("utf8mb4", "utf8mb4_0900_ai_ci", 4)}
_INT_NAMES = {mw.T_TINY: "tinyint", mw.T_SHORT: "smallint", mw.T_INT24: "mediumint", mw.T_LONG: "int",
              mw.T_LONGLONG: "bigint"}
# bytes of each column type's Table_map metadata (the others have none)
_META_LEN = {mw.T_FLOAT: 1, mw.T_DOUBLE: 1, mw.T_BLOB: 1, mw.T_GEOMETRY: 1, mw.T_JSON: 1, mw.T_VARCHAR: 2,
             mw.T_VAR_STRING: 2, mw.T_NEWDECIMAL: 2, mw.T_BIT: 2, mw.T_STRING: 2, mw.T_ENUM: 2, mw.T_SET: 2,
             mw.T_TIMESTAMP2: 1, mw.T_DATETIME2: 1, mw.T_TIME2: 1}


def _packed(data: bytes, off: int) -> tuple[int, int]:
    first = data[off]
    if first < 251:
        return first, off + 1
    size = {252: 2, 253: 3, 254: 8}[first]
    return int.from_bytes(data[off + 1:off + 1 + size], "little"), off + 1 + size


def _column_type(code: int, meta: bytes, unsigned: bool, charset: int | None) -> str:
    mbmax = _CHARSETS.get(charset or 63, ("", "", 1))[2]
    binary = charset in (None, 63)
    if code in _INT_NAMES:
        return _INT_NAMES[code] + (" unsigned" if unsigned else "")
    if code in (mw.T_FLOAT, mw.T_DOUBLE):
        return "float" if code == mw.T_FLOAT else "double"
    if code == mw.T_NEWDECIMAL:
        return f"decimal({meta[0]},{meta[1]})"
    if code in (mw.T_TIMESTAMP2, mw.T_DATETIME2, mw.T_TIME2):
        name = {mw.T_TIMESTAMP2: "timestamp", mw.T_DATETIME2: "datetime", mw.T_TIME2: "time"}[code]
        return f"{name}({meta[0]})" if meta[0] else name
    if code in (mw.T_VARCHAR, mw.T_VAR_STRING):
        n = int.from_bytes(meta[:2], "little")
        return f"varbinary({n})" if binary else f"varchar({n // mbmax})"
    if code == mw.T_BLOB:
        size = {1: "tiny", 2: "", 3: "medium", 4: "long"}.get(meta[0], "long")
        return size + ("blob" if binary else "text")
    if code == mw.T_STRING:
        real, n = meta[0], meta[1]
        if real == mw.T_ENUM:
            return "enum"
        if real == mw.T_SET:
            return "set"
        return f"binary({n})" if binary else f"char({n // mbmax})"
    if code == mw.T_BIT:
        return f"bit({meta[0] + meta[1] * 8})"
    return {mw.T_DATE: "date", mw.T_YEAR: "year", mw.T_JSON: "json", mw.T_TIMESTAMP: "timestamp",
            mw.T_DATETIME: "datetime", mw.T_TIME: "time"}.get(code, "blob")


def parse_table_map(body: bytes) -> tuple[str, str, list[ColumnInfo]]:
    """(db, table, columns) of a Table_map event body (header and checksum removed),
    from its optional metadata (binlog_row_metadata=FULL: names, signedness, charsets,
    primary key)."""
    off = 8
    db = body[off + 1:off + 1 + body[off]].decode("utf-8", "replace")
    off += 2 + body[off]
    table = body[off + 1:off + 1 + body[off]].decode("utf-8", "replace")
    off += 2 + body[off]
    n, off = _packed(body, off)
    types = list(body[off:off + n])
    off += n
    meta_len, off = _packed(body, off)
    meta_end = off + meta_len
    metas = []
    for t in types:
        k = _META_LEN.get(t, 0)
        metas.append(bytes(body[off:off + k]))
        off += k
    off = meta_end
    nulls = body[off:off + (n + 7) // 8]
    off += (n + 7) // 8
    names = [f"col{i + 1}" for i in range(n)]
    unsigned = [False] * n
    charsets: list[int | None] = [None] * n
    pk: set[int] = set()
    char_cols = [i for i, t in enumerate(types) if t in CHARACTER_TYPES]
    num_cols = [i for i, t in enumerate(types) if t in NUMERIC_TYPES]
    while off < len(body):
        kind = body[off]
        length, off = _packed(body, off + 1)
        value, off = body[off:off + length], off + length
        if kind == 1:  # SIGNEDNESS
            for j, i in enumerate(num_cols):
                unsigned[i] = bool(value[j // 8] & (0x80 >> (j % 8)))
        elif kind == 2:  # DEFAULT_CHARSET: default, then (column, charset) pairs
            default, p = _packed(value, 0)
            exceptions = {}
            while p < len(value):
                col, p = _packed(value, p)
                exceptions[col], p = _packed(value, p)
            for j, i in enumerate(char_cols):
                charsets[i] = exceptions.get(j, default)
        elif kind == 3:  # COLUMN_CHARSET
            p = 0
            for i in char_cols:
                charsets[i], p = _packed(value, p)
        elif kind == 4:  # COLUMN_NAME
            p = 0
            for i in range(n):
                size, p = _packed(value, p)
                names[i] = value[p:p + size].decode("utf-8", "replace")
                p += size
        elif kind in (8, 9):  # SIMPLE_PRIMARY_KEY, PRIMARY_KEY_WITH_PREFIX
            p = 0
            while p < len(value):
                col, p = _packed(value, p)
                pk.add(col)
                if kind == 9:
                    _, p = _packed(value, p)
    cols = []
    for i, t in enumerate(types):
        ctype = _column_type(t, metas[i], unsigned[i], charsets[i])
        cs_id = charsets[i]
        cs = _CHARSETS.get(cs_id) if cs_id is not None and cs_id != 63 else None
        cols.append(ColumnInfo(
            name=names[i], data_type=ctype.split("(")[0].split()[0], column_type=ctype,
            nullable=bool(nulls[i // 8] & (1 << (i % 8))), key="PRI" if i in pk else "",
            charset=cs[0] if cs else None, collation=cs[1] if cs else None))
    return db, table, cols


class AnnouncedCatalog:
    """The tables the binlog has defined up to its end (:data:`Catalog`): the definition
    the converter records with every batch in the position map (the Table_map of each
    table's current version, as its last CREATE/ALTER TABLE says), so the answer matches
    :meth:`BinlogStore.end` and a table whose events were all purged is still known, as
    in MySQL. Data directories written before definitions were recorded fall back to the
    Table_map events in the live files (:class:`TableMapCatalog`)."""

    def __init__(self, store: BinlogStore) -> None:
        self._store = store
        self._fallback = TableMapCatalog(store)

    def __call__(self) -> dict[tuple[str, str], list[ColumnInfo]]:
        defs = self._store.writer_meta().get("tables")
        if not isinstance(defs, dict):
            return self._fallback()
        out: dict[tuple[str, str], list[ColumnInfo]] = {}
        for body in defs.values():
            db, table, cols = parse_table_map(bytes.fromhex(body))
            out[(db, table)] = cols
        return out


class TableMapCatalog:
    """The captured tables' columns as the binlog's latest Table_map of each says
    (:data:`Catalog`). Reads only what was appended since the last call; a table shows
    once a row of it was written."""

    def __init__(self, store: BinlogStore) -> None:
        self._store = store
        self._tables: dict[tuple[str, str], list[ColumnInfo]] = {}
        self._file = ""
        self._pos = 0

    def __call__(self) -> dict[tuple[str, str], list[ColumnInfo]]:
        for name, size in self._store.files():
            if name < self._file:
                continue
            start = self._pos if name == self._file else BIN_LOG_HEADER_SIZE
            if size <= start:
                self._file, self._pos = name, max(start, size)
                continue
            try:
                with self._store.path(name).open("rb") as f:
                    f.seek(start)
                    data = f.read(size - start)
            except OSError:
                continue  # purged meanwhile
            off = 0
            while off + HEADER_LEN <= len(data):
                (length,) = struct.unpack_from("<I", data, off + LEN_OFFSET)
                if length < HEADER_LEN or off + length > len(data):
                    break
                if data[off + TYPE_OFFSET] == EventType.TABLE_MAP:
                    try:
                        db, table, cols = parse_table_map(data[off + HEADER_LEN:off + length - 4])
                        self._tables[(db, table)] = cols
                    except (IndexError, KeyError, UnicodeDecodeError):
                        pass  # not ours to judge: the dump sends it as it is
                off += length
            self._file, self._pos = name, start + off
        return dict(self._tables)
