"""Table versions of the MySQL source: Avro types, row images, keys, encoding.

A :class:`Shape` is one binlog table-map shape (columns, binlog types,
charsets, filters) bound to the :class:`Version` (Avro schema) its rows are
encoded with. It encodes a rows event with the compiled codec
(:mod:`.fastpath`) when there is one, else with the Python decoder
(:mod:`.rows`) and fastavro: both give the same bytes.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from databus.core import event as ev
from databus.core import mysqlwire as mw
from databus.core.avrobin import long_bytes
from databus.core.errors import CorruptEventError
from databus.core.schema import MetadataCodec, TableSchema
from databus.sources.mysql import fastpath
from databus.sources.mysql import rows as br

_OPS = {30: ev.Op.INSERT, 23: ev.Op.INSERT, 31: ev.Op.UPDATE, 24: ev.Op.UPDATE,
        32: ev.Op.DELETE, 25: ev.Op.DELETE}


def avro_type(td: br.TableDef, i: int) -> Any:
    t, m = td.real_types[i], td.meta[i]
    if t in (mw.T_TINY, mw.T_SHORT, mw.T_INT24, mw.T_LONG, mw.T_YEAR):
        return "long"
    if t == mw.T_LONGLONG or (t == mw.T_BIT and (m & 0xFF) >= 8):
        if td.unsigned[i] or t == mw.T_BIT:  # 64-bit unsigned does not fit a long
            return {"type": "bytes", "logicalType": "decimal", "precision": 20, "scale": 0}
        return "long"
    if t == mw.T_BIT:
        return "long"
    if t == mw.T_FLOAT:
        return "float"
    if t == mw.T_DOUBLE:
        return "double"
    if t == mw.T_NEWDECIMAL:
        return {"type": "bytes", "logicalType": "decimal", "precision": m >> 8,
                "scale": m & 0xFF}
    if t == mw.T_DATE:
        return {"type": "int", "logicalType": "date"}
    if t == mw.T_TIME2:
        return "long"  # microseconds, may be negative or beyond 24 h
    if t == mw.T_DATETIME2:
        return {"type": "long", "logicalType": "local-timestamp-micros"}
    if t == mw.T_TIMESTAMP2:
        return {"type": "long", "logicalType": "timestamp-micros"}
    if t in (mw.T_ENUM, mw.T_SET, mw.T_JSON):
        return "string"
    if t in (mw.T_VARCHAR, mw.T_VAR_STRING, mw.T_STRING, mw.T_BLOB):
        return "bytes" if td.codecs and td.codecs[i] == br.CODEC_BINARY else "string"
    return "bytes"


_INT_NAMES = {mw.T_TINY: "TINYINT", mw.T_SHORT: "SMALLINT", mw.T_INT24: "MEDIUMINT",
              mw.T_LONG: "INT", mw.T_LONGLONG: "BIGINT"}
_FSP_NAMES = {mw.T_TIME2: "TIME", mw.T_DATETIME2: "DATETIME", mw.T_TIMESTAMP2: "TIMESTAMP"}
_PLAIN_NAMES = {mw.T_YEAR: "YEAR", mw.T_DATE: "DATE", mw.T_GEOMETRY: "GEOMETRY"}


def _quoted(values: list[str]) -> str:
    return ",".join("'" + v.replace("'", "''") + "'" for v in values)


def declared_type(td: br.TableDef, i: int) -> str:
    """The declared SQL type of column ``i`` where its Avro type does not say it, as the
    field's ``sql_type`` (``SMALLINT UNSIGNED``, ``BIT(9)``, ``DATETIME(3)``,
    ``ENUM('a','b')``, ``GEOMETRY``...; other columns (strings, bytes, floats, JSON):
    ""), with `` NOT NULL`` appended for a column that cannot be NULL (alone for the
    other columns). Made only from what
    the binlog's table map and ``information_schema`` both give (types, fsp, precision,
    signedness, enum and set values, nullability), so a snapshot's version of a table
    and the binlog's are the same version."""
    t, m = td.real_types[i], td.meta[i]
    unsigned = bool(td.unsigned) and td.unsigned[i]
    if t in _INT_NAMES:
        name = _INT_NAMES[t] + (" UNSIGNED" if unsigned else "")
    elif t == mw.T_BIT:
        name = f"BIT({(m >> 8) + 8 * (m & 0xFF)})"
    elif t == mw.T_NEWDECIMAL:
        name = f"DECIMAL({m >> 8},{m & 0xFF})"
    elif t in _FSP_NAMES:
        name = _FSP_NAMES[t] + (f"({m})" if m else "")
    elif t in (mw.T_ENUM, mw.T_SET):
        values = (td.enum_values if t == mw.T_ENUM else td.set_values).get(i, [])
        name = f"{'ENUM' if t == mw.T_ENUM else 'SET'}({_quoted(values)})"
    else:
        name = _PLAIN_NAMES.get(t, "")
    nullable = td.nullable[i] if i < len(td.nullable) else True
    return name if nullable else f"{name} NOT NULL".lstrip()


def _avro_value(v: Any, avro: Any) -> Any:
    if v is None:
        return None
    if isinstance(v, dt.timedelta):
        return v // dt.timedelta(microseconds=1)
    if isinstance(avro, dict) and avro.get("logicalType") == "decimal" and isinstance(v, int):
        return decimal.Decimal(v)
    if avro == "string" and isinstance(v, bytes):
        return v.decode("utf-8")
    if avro == "bytes" and isinstance(v, str):
        return v.encode("utf-8")
    return v


def _key_json(v: Any) -> Any:
    if v is None or isinstance(v, (int, str)):
        return v
    if isinstance(v, bytes):
        return {"hex": v.hex()}
    if isinstance(v, (dt.date, dt.datetime)):
        return v.isoformat()
    return str(v)


# --- hand-made Avro for the metadata part (both codecs share it) --------------

def _u_str(s: str | None) -> bytes:
    if s is None:
        return b"\x00"
    raw = s.encode("utf-8")
    return b"\x02" + long_bytes(len(raw)) + raw


def _u_long(v: int | None) -> bytes:
    return b"\x00" if v is None else b"\x02" + long_bytes(v)


def meta_middle(txid: str | None, file: str, pos: int, gtid: str | None, server_id: int) -> bytes:
    """Avro of the metadata fields between ``before`` and ``row`` (METADATA_SCHEMA order)."""
    return _u_str(txid) + _u_str(file) + _u_long(pos) + _u_str(gtid) + _u_long(server_id)


class RowsMeta:
    """:func:`meta_middle` of rows events, whose transaction id is their GTID: each part
    is built when it changes (the GTID once per transaction, the file and server more
    rarely), not for every rows event, and joined with the position in C where the
    extension is built. (Building all five per rows event was 7% of a relay's capture
    CPU under sysbench's writes, four rows events per transaction.)"""

    __slots__ = ("_file", "_file_part", "_gtid", "_gtid_part", "_head", "_join",
                 "_server_id", "_server_part", "_tail")

    def __init__(self) -> None:
        self._join: Callable[[bytes, int, bytes], bytes] = fastpath.rows_meta() or _join_meta
        self._gtid: str | None = None
        self._file = ""
        self._server_id = 0
        self._gtid_part, self._file_part = _u_str(None), _u_str("")
        self._server_part = _u_long(0)
        self._head = self._gtid_part + self._file_part
        self._tail = self._gtid_part + self._server_part

    def __call__(self, gtid: str | None, file: str, pos: int, server_id: int) -> bytes:
        """``meta_middle(gtid, file, pos, gtid, server_id)``."""
        if gtid is not self._gtid or file is not self._file or server_id != self._server_id:
            # identity first: each transaction's GTID is a new string object
            if gtid != self._gtid:
                self._gtid_part = _u_str(gtid)
            if file != self._file:
                self._file_part = _u_str(file)
            if server_id != self._server_id:
                self._server_part = _u_long(server_id)
            self._gtid, self._file, self._server_id = gtid, file, server_id
            self._head = self._gtid_part + self._file_part
            self._tail = self._gtid_part + self._server_part
        return self._join(self._head, pos, self._tail)


def _join_meta(head: bytes, pos: int, tail: bytes) -> bytes:
    """What ``_rowcodec.rows_meta`` does, where the extension is not built."""
    return head + _u_long(pos) + tail


class Version:
    """One Avro version of one table (what the events say)."""

    def __init__(self, schema: TableSchema) -> None:
        self.schema = schema
        self.types = [f["type"][1] for f in schema.avro["fields"]]
        self.fields = [f["name"] for f in schema.avro["fields"]]


class Shape:
    """One table-map shape: how to decode its rows into one :class:`_Version`."""

    def __init__(self, td: br.TableDef, version: Version, keep: list[bool], meta_id: bytes,
                 fast: bool) -> None:
        self.td = td
        self.version = version
        self.keep = keep
        self.name = f"{td.schema}.{td.table}"
        self.mode = br.key_mode(td)
        s = version.schema
        self.codec = fastpath.compile_codec(td, src_id=s.src_id, schema_id=s.id,
                                            schema_version=s.version, meta_id=meta_id,
                                            keep=keep) if fast else None

    def encode(self, etype: int, body: memoryview, scn: int, ts_ns: int, meta_mid: bytes,
               row_index: int) -> tuple[bytes, int]:
        if self.codec is not None:
            try:
                data, n = self.codec.encode(body, etype, scn, ts_ns, meta_mid, row_index,
                                            self.name)
            except ValueError as exc:
                raise CorruptEventError(f"cannot decode a rows event of {self.name}: {exc}"
                                        ) from exc
            return data, n
        return self._encode_py(etype, body, scn, ts_ns, meta_mid, row_index)

    def row(self, values: list[Any]) -> dict[str, Any]:
        """Decoder values -> the Avro record of this version (filtered columns out)."""
        v = self.version
        kept = [x for x, k in zip(values, self.keep, strict=True) if k]
        return {f: _avro_value(x, a) for f, x, a in zip(v.fields, kept, v.types, strict=True)}

    def key(self, values: list[Any], index: int) -> int | bytes:
        """The event key of a row (decoder values; ``index``: its place in the txn)."""
        if self.mode == br.KEY_ROWINDEX:
            return index
        kv = [values[i] for i in self.td.primary_key]
        if self.mode == br.KEY_INT and isinstance(kv[0], int):
            return kv[0]
        return json.dumps([_key_json(x) for x in kv], ensure_ascii=False,
                          separators=(",", ":")).encode()

    def _encode_py(self, etype: int, body: memoryview, scn: int, ts_ns: int, meta_mid: bytes,
                   row_index: int) -> tuple[bytes, int]:
        s = self.version.schema
        out: list[bytes] = []

        def event(op: ev.Op, key: int | bytes, image: list[Any], before: bytes | None) -> None:
            index = row_index + len(out)
            meta = b"\x00" if before is None else b"\x02" + long_bytes(len(before)) + before
            out.append(ev.encode(
                scn=scn, src_id=s.src_id, key=key, payload=s.encode(self.row(image)),
                schema_id=s.id, schema_version=s.version, op=op, timestamp_ns=ts_ns,
                metadata=meta + meta_mid + _u_long(index), metadata_schema_id=MetadataCodec.ID))

        for before, after in br.decode_rows(self.td, etype, body):
            index = row_index + len(out)
            if before is not None and after is not None:
                old_key, new_key = self.key(before, index), self.key(after, index)
                if self.mode != br.KEY_ROWINDEX and old_key != new_key:
                    # a key change is a delete of the old key and an insert of the new one
                    event(ev.Op.DELETE, old_key, before, None)
                    event(ev.Op.INSERT, new_key, after, None)
                else:
                    event(ev.Op.UPDATE, new_key, after, s.encode(self.row(before)))
            else:
                image = after if after is not None else before
                assert image is not None
                event(_OPS[etype], self.key(image, index), image, None)
        return b"".join(out), len(out)


@dataclass
class PendingRows:
    """A rows event waiting for its transaction's commit (encoded with the SCN)."""

    shape: Shape
    etype: int
    body: memoryview
    meta_mid: bytes
