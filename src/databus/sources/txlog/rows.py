"""Column types, row images and keys of one SQLite table version.

Avro types. SQLite is dynamically typed: a column's declared type only gives it
an *affinity*, and any column may hold a value of any storage class ('abc' in
an INTEGER column is stored as text). So every field is a union: ``"null"``
(unless the column is NOT NULL), then the Avro type of the column's affinity,
then the other storage classes, in the order long, double, string, bytes:

==========================================  ================  ===================
declared type (SQLite's affinity rules)     affinity          first Avro branch
==========================================  ================  ===================
contains ``INT``                            INTEGER           long
contains ``CHAR``, ``CLOB`` or ``TEXT``     TEXT              string
contains ``BLOB``, or no declared type      BLOB (none)       bytes
contains ``REAL``, ``FLOA`` or ``DOUB``     REAL              double
anything else (NUMERIC, DECIMAL, BOOLEAN,   NUMERIC           long
DATE, DATETIME, ...)
==========================================  ================  ===================

Every value is carried exactly as SQLite stored it (what ``SELECT`` returns):
integers as long, reals as double (bit-exact), text as string, blobs as bytes,
NULL as null. Nothing is converted: a NUMERIC column's ``'12.50'`` was already
turned into the real 12.5 by SQLite when stored; a DATE column usually holds
text. Text that is not valid UTF-8 (possible through SQLite's C API) is carried
as bytes. The field's ``sql_type`` is the declared type.

Keys. The declared primary key, in key order. A single-column key of INTEGER
affinity is an int64 event key (a value that is not an integer, possible for a
non-rowid ``INT PRIMARY KEY``, falls back to the bytes form); every other key is
bytes: the UTF-8 JSON array of the key values (integers and text as JSON,
reals as JSON numbers with the shortest exact repr, NULL as null, blobs as
``{"hex": "..."}``). A table without a declared primary key is keyed by its
rowid (int64), which is not a field of the row.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from typing import Any

from databus.core import event as ev
from databus.core.avrobin import varint, zigzag
from databus.core.schema import ColumnSpec, MetadataCodec, TableSchema, table_schema
from databus.sources.columns import ColumnFilter
from databus.sources.txlog.catalog import TableVersion

_STORAGE = ("long", "double", "string", "bytes")
_AFFINITY_AVRO = {"INTEGER": "long", "TEXT": "string", "BLOB": "bytes", "REAL": "double",
                  "NUMERIC": "long"}


def affinity(decl_type: str) -> str:
    """SQLite's column affinity of a declared type (its rules, in their order)."""
    d = decl_type.upper()
    if "INT" in d:
        return "INTEGER"
    if "CHAR" in d or "CLOB" in d or "TEXT" in d:
        return "TEXT"
    if "BLOB" in d or not d:
        return "BLOB"
    if "REAL" in d or "FLOA" in d or "DOUB" in d:
        return "REAL"
    return "NUMERIC"


def avro_branches(decl_type: str) -> list[str]:
    """The non-null branches of a column's Avro union (see the module docstring)."""
    first = _AFFINITY_AVRO[affinity(decl_type)]
    return [first, *(t for t in _STORAGE if t != first)]


_DOUBLE = struct.Struct("<d")


def _key_json(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"hex": value.hex()}
    return value


class VersionCodec:
    """Turns txlog images of one table version into Avro rows and event keys.

    Images are always whole (every column of the version, as the triggers log
    them); ``keep`` (one flag per column, :mod:`databus.sources.columns`) leaves
    columns out of the schema, the rows and the payloads: a column not kept is
    never encoded. Keys are read from the whole image (key columns are always kept).
    """

    def __init__(self, tv: TableVersion, keep: Sequence[bool] | None = None) -> None:
        self.tv = tv
        self.width = len(tv.columns)
        if keep is not None and len(keep) != self.width:
            raise ValueError(f"{tv.name}: {len(keep)} column flags for {self.width} columns")
        kept = [i for i in range(self.width) if keep is None or keep[i]]
        # positions of the kept columns in an image; None: every column
        self.kept: tuple[int, ...] | None = None if len(kept) == self.width else tuple(kept)
        columns = [tv.columns[i] for i in kept]
        specs = [ColumnSpec(c.name, avro_branches(c.decl_type), nullable=not c.not_null,
                            sql_type=c.decl_type) for c in columns]
        self.schema = TableSchema(tv.src, tv.name, tv.version,
                                  table_schema("main", tv.table, specs), tv.keys)
        self.fields = tuple(f["name"] for f in self.schema.avro["fields"])
        names = [c.name for c in tv.columns]
        self._key_idx = tuple(names.index(k) for k in tv.keys)
        self._int_key = len(tv.keys) == 1 and affinity(
            tv.columns[self._key_idx[0]].decl_type) == "INTEGER"
        # a union whose first branch is double would take an int as double:
        # such values (never produced by SQLite's REAL affinity) go as ("long", v)
        self._real_fields = tuple(f for f, c in zip(self.fields, columns, strict=True)
                                  if affinity(c.decl_type) == "REAL")
        # per field: Python type -> the Avro union branch index, as its encoded byte
        py = {"null": type(None), "long": int, "double": float, "string": str, "bytes": bytes}
        self._branches = tuple(
            {py[b]: varint(2 * i) for i, b in enumerate(f["type"])}
            for f in self.schema.avro["fields"])

    def keep_mask(self) -> list[bool]:
        """Per column of the version: kept?"""
        kept = self.kept
        return [kept is None or i in kept for i in range(self.width)]

    def project(self, values: tuple[Any, ...] | list[Any]) -> tuple[Any, ...] | list[Any]:
        """The kept columns' values of a whole image."""
        kept = self.kept
        if kept is None or len(values) != self.width:
            return values  # a wrong width: encode() lets fastavro name the error
        return [values[i] for i in kept]

    def row(self, values: tuple[Any, ...] | list[Any]) -> dict[str, Any]:
        """The Avro row (field name -> value) of a whole image in column order."""
        out = dict(zip(self.fields, self.project(values), strict=True))
        for f in self._real_fields:
            v = out[f]
            if type(v) is int:
                out[f] = ("long", v)
        return out

    def encode(self, values: tuple[Any, ...] | list[Any]) -> bytes:
        """Avro binary of a whole image (byte-identical to ``schema.encode(row(values))``).

        Written directly: every field is a union of null/long/double/string/bytes,
        so each value is its branch index then its plain Avro encoding. A value of
        any other type goes through fastavro (which raises SchemaError).
        """
        if len(values) != self.width:
            return self.schema.encode(self.row(values))
        kept = self.kept
        out: list[bytes] = []
        for v, branches in zip(values if kept is None else [values[i] for i in kept],
                               self._branches, strict=True):
            t = type(v)
            head = branches.get(t)
            if head is None:
                return self.schema.encode(self.row(values))
            out.append(head)
            if t is int:
                out.append(varint(zigzag(v)))
            elif t is float:
                out.append(_DOUBLE.pack(v))
            elif t is str:
                data = v.encode("utf-8")
                out.append(varint(len(data) << 1))  # lengths are zig-zag longs too
                out.append(data)
            elif t is bytes:
                out.append(varint(len(v) << 1))
                out.append(v)
        return b"".join(out)

    def key(self, values: tuple[Any, ...] | list[Any], rowid: int | None) -> int | bytes:
        """The event key of an image (see the module docstring)."""
        if not self._key_idx:
            if rowid is None:
                raise ValueError(f"{self.tv.name}: a rowid-keyed row without rowid")
            return rowid
        if self._int_key:
            v = values[self._key_idx[0]]
            if type(v) is int:
                return v
        return json.dumps([_key_json(values[i]) for i in self._key_idx],
                          separators=(",", ":"), ensure_ascii=False).encode()


    def read_event(self, image: tuple[Any, ...] | list[Any], rowid: int | None, *, scn: int,
                   timestamp_ns: int) -> tuple[int | bytes, bytes]:
        """(event key, encoded event) of a row as a snapshot read: op ``r``,
        the snapshot attribute, sequence ``scn``; payload and key exactly as a
        change event of the same image would have them."""
        key = self.key(image, rowid)
        return key, ev.encode(
            scn=scn, src_id=self.tv.src, key=key, payload=self.encode(image),
            schema_id=self.schema.id, schema_version=self.tv.version, op=ev.Op.READ,
            timestamp_ns=timestamp_ns, extra_attributes=ev.ATTR_SNAPSHOT)


def keep_of(columns: ColumnFilter, tv: TableVersion) -> list[bool] | None:
    """The keep flags of ``tv``'s columns under ``columns`` (None: every column);
    columns are named ``main.<table>.<column>`` or ``<table>.<column>``, key columns
    always kept."""
    if not columns:
        return None
    names = [c.name for c in tv.columns]
    return columns.keep(tv.name, names, {names.index(k) for k in tv.keys}, alias=tv.table)


class WindowMetadata:
    """The metadata part of the events of one window: ``before``, ``txid``, ``row``.

    Written directly as Avro of :data:`~databus.core.schema.METADATA_SCHEMA`
    (its fields in order: before, txid, file, pos, gtid, server_id, row; each a
    union with null first). The layout is checked against
    :class:`~databus.core.schema.MetadataCodec` once; if that schema ever
    changes, the codec is used instead.
    """

    def __init__(self, codec: MetadataCodec, txid: str) -> None:
        self._codec = codec
        self._txid = txid
        raw = txid.encode("utf-8")
        self._middle = b"\x02" + varint(len(raw) << 1) + raw + b"\x00\x00\x00\x00\x02"
        self._direct = all(
            self._encode(b, r) == codec.encode({"before": b, "txid": txid, "row": r})
            for b in (None, b"", b"\x00" * 200) for r in (0, 1, 64, 1 << 20))

    def _encode(self, before: bytes | None, row: int) -> bytes:
        head = b"\x00" if before is None else b"\x02" + varint(len(before) << 1) + before
        return head + self._middle + varint(zigzag(row))

    def encode(self, before: bytes | None, row: int) -> bytes:
        """Avro of {before, txid, row} (other fields null)."""
        if self._direct:
            return self._encode(before, row)
        return self._codec.encode({"before": before, "txid": self._txid, "row": row})
