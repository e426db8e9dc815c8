"""The compiled row codec: a decoder specialised per table version.

:func:`compile_codec` turns one table version (a :class:`~.rows.TableDef` with
its Avro schema) into a ``RowCodec`` of the C extension ``_rowcodec``: one
opcode per column, fixed once, so that encoding a rows event is a single C
call that goes from binlog bytes to finished events (header, CRCs, key,
metadata and Avro payload) without a Python object per value.

The same codec reads snapshot chunks (:func:`encode_text`): the text-protocol
row packets of a chunk ``SELECT`` (split off the socket's buffer by
:func:`scan_rows`) become Avro payloads and event keys, and
``RowCodec.snapshot_events`` makes the ``r`` events, when the result's
columns are what the program expects (:func:`text_compatible`).

Contract: for every table version it accepts, the codec's output is
byte-identical to the pure-Python path (:mod:`.rows` decoding, fastavro
encoding, :func:`databus.core.event.encode`); the tests compare the two on the
whole type matrix (tests/integration/test_mysql_snapshot_codec.py does the
same for snapshot rows). It returns ``None`` (the caller then uses the Python path)
when the extension is not built, or the table has a column or key it does not
compile: pre-5.6 temporal types, MySQL 8 binary JSON, a character set other
than utf8/utf8mb4/ascii/latin1/binary, or a key column that is not an integer
or a text column.
"""

from __future__ import annotations

import logging
from typing import Any

from databus.core import mysqlwire as mw
from databus.core.errors import CorruptEventError
from databus.sources.mysql import rows as br

log = logging.getLogger("databus.sources.mysql")

try:  # the extension is optional: a machine without a C compiler runs the Python path
    from databus.sources.mysql import _rowcodec  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - depends on the build
    _rowcodec = None

# opcodes: keep in step with _rowcodec.c
(OP_INT8, OP_UINT8, OP_INT16, OP_UINT16, OP_INT24, OP_UINT24, OP_INT32, OP_UINT32, OP_INT64,
 OP_UINT64_DEC, OP_FLOAT, OP_DOUBLE, OP_DECIMAL, OP_VARSTR, OP_CHAR, OP_BINARY_PAD, OP_BLOB,
 OP_ENUM, OP_SET, OP_BIT_LONG, OP_BIT_DEC, OP_YEAR, OP_DATE, OP_DATETIME2, OP_TIMESTAMP2,
 OP_TIME2) = range(1, 27)
CONV_COPY, CONV_UTF8, CONV_LATIN1 = 0, 1, 2
KEY_INT, KEY_ROWINDEX, KEY_JSON = 0, 1, 2

_INTS = {mw.T_TINY: (OP_INT8, OP_UINT8), mw.T_SHORT: (OP_INT16, OP_UINT16),
         mw.T_INT24: (OP_INT24, OP_UINT24), mw.T_LONG: (OP_INT32, OP_UINT32),
         mw.T_LONGLONG: (OP_INT64, OP_UINT64_DEC)}
_TEXT_CONV = {br.CODEC_BINARY: CONV_COPY, br.CODEC_UTF8: CONV_UTF8,
              br.CODEC_LATIN1: CONV_LATIN1}
_NO_VALUES: tuple[bytes, ...] = ()


def available() -> bool:
    """Whether the C extension is built."""
    return _rowcodec is not None


class _Unsupported(Exception):
    pass


def _op(td: br.TableDef, i: int) -> tuple[int, int, int, int, tuple[bytes, ...]]:
    """(opcode, a, b, conversion, ENUM/SET values) of column ``i``."""
    t, m = td.real_types[i], td.meta[i]
    if t in _INTS:
        signed_op, unsigned_op = _INTS[t]
        return (unsigned_op if td.unsigned[i] else signed_op), 0, 0, 0, _NO_VALUES
    if t == mw.T_FLOAT:
        return OP_FLOAT, 0, 0, 0, _NO_VALUES
    if t == mw.T_DOUBLE:
        return OP_DOUBLE, 0, 0, 0, _NO_VALUES
    if t == mw.T_NEWDECIMAL:
        return OP_DECIMAL, m >> 8, m & 0xFF, 0, _NO_VALUES
    if t == mw.T_YEAR:
        return OP_YEAR, 0, 0, 0, _NO_VALUES
    if t == mw.T_DATE:
        return OP_DATE, 0, 0, 0, _NO_VALUES
    if t == mw.T_DATETIME2:
        return OP_DATETIME2, m, 0, 0, _NO_VALUES
    if t == mw.T_TIMESTAMP2:
        return OP_TIMESTAMP2, m, 0, 0, _NO_VALUES
    if t == mw.T_TIME2:
        return OP_TIME2, m, 0, 0, _NO_VALUES
    if t == mw.T_BIT:
        nbytes = (m & 0xFF) + (1 if m >> 8 else 0)
        return (OP_BIT_DEC if (m & 0xFF) >= 8 else OP_BIT_LONG), nbytes, 0, 0, _NO_VALUES
    if t in (mw.T_ENUM, mw.T_SET):
        names = td.enum_values.get(i, []) if t == mw.T_ENUM else td.set_values.get(i, [])
        values = tuple(v.encode("utf-8") for v in names)
        return (OP_ENUM if t == mw.T_ENUM else OP_SET), m, 0, 0, values
    codec = td.codecs[i] if td.codecs else br.CODEC_UTF8
    if t in (mw.T_VARCHAR, mw.T_VAR_STRING, mw.T_STRING):
        if codec not in _TEXT_CONV:
            raise _Unsupported(f"character set codec {codec}")
        lb = 1 if m < 256 else 2
        if t == mw.T_STRING and codec == br.CODEC_BINARY:
            return OP_BINARY_PAD, lb, m, CONV_COPY, _NO_VALUES
        return (OP_CHAR if t == mw.T_STRING else OP_VARSTR), lb, 0, _TEXT_CONV[codec], _NO_VALUES
    if t in (mw.T_BLOB, mw.T_GEOMETRY):
        if t == mw.T_BLOB and codec not in _TEXT_CONV:
            raise _Unsupported(f"character set codec {codec}")
        conv = _TEXT_CONV[codec] if t == mw.T_BLOB else CONV_COPY
        return OP_BLOB, m, 0, conv, _NO_VALUES
    raise _Unsupported(f"binlog type {t}")


def compile_codec(td: br.TableDef, *, src_id: int, schema_id: bytes, schema_version: int,
                  meta_id: bytes, keep: list[bool]) -> Any | None:
    """A ``RowCodec`` for this table version, or None (use the Python path).

    ``keep[i]`` is false for a column a column filter leaves out of the events.
    """
    if _rowcodec is None:
        return None
    name = f"{td.schema}.{td.table}"
    try:
        ops = tuple((*_op(td, i), not keep[i]) for i in range(len(td.types)))
        mode = br.key_mode(td)
        if mode == br.KEY_JSON:
            for i in td.primary_key:
                if ops[i][0] in (OP_BINARY_PAD,) or (ops[i][0] in (OP_VARSTR, OP_CHAR, OP_BLOB)
                                                     and ops[i][3] == CONV_COPY):
                    raise _Unsupported("binary key column")
                if ops[i][0] not in (OP_INT8, OP_UINT8, OP_INT16, OP_UINT16, OP_INT24,
                                     OP_UINT24, OP_INT32, OP_UINT32, OP_INT64, OP_UINT64_DEC,
                                     OP_VARSTR, OP_CHAR, OP_BLOB, OP_ENUM, OP_SET):
                    raise _Unsupported("key column type")
        c_mode = {br.KEY_INT: KEY_INT, br.KEY_ROWINDEX: KEY_ROWINDEX, br.KEY_JSON: KEY_JSON}[mode]
        return _rowcodec.RowCodec(ops, tuple(td.primary_key), c_mode, src_id, schema_id,
                                  schema_version, meta_id, name)
    except _Unsupported as exc:
        log.info("%s v%d uses the Python row decoder (%s)", name, schema_version, exc)
        return None


# --- snapshot chunks: SELECT result rows (text protocol) -------------------------

# MySQL field types of a result, as the chunk SELECT (chunks.select_list) gives them
_F_DECIMAL, _F_TINY, _F_SHORT, _F_LONG, _F_FLOAT, _F_DOUBLE = 0, 1, 2, 3, 4, 5
_F_TIMESTAMP, _F_LONGLONG, _F_INT24, _F_DATE, _F_TIME, _F_DATETIME, _F_YEAR = 7, 8, 9, 10, 11, 12, 13
_F_VARCHAR, _F_BIT, _F_JSON, _F_NEWDECIMAL = 15, 16, 245, 246
_F_TEXT = frozenset({_F_VARCHAR, _F_JSON, 249, 250, 251, 252, 253, 254})
_TEXT_FIELDS: dict[int, frozenset[int]] = {
    **{op: frozenset({_F_TINY, _F_SHORT, _F_LONG, _F_LONGLONG, _F_INT24})
       for op in (OP_INT8, OP_UINT8, OP_INT16, OP_UINT16, OP_INT24, OP_UINT24, OP_INT32,
                  OP_UINT32, OP_INT64, OP_UINT64_DEC)},
    OP_YEAR: frozenset({_F_YEAR}), OP_FLOAT: frozenset({_F_DOUBLE}),
    OP_DOUBLE: frozenset({_F_DOUBLE}), OP_DECIMAL: frozenset({_F_DECIMAL, _F_NEWDECIMAL}),
    OP_DATE: frozenset({_F_DATE}), OP_DATETIME2: frozenset({_F_DATETIME}),
    OP_TIMESTAMP2: frozenset({_F_TIMESTAMP}), OP_TIME2: frozenset({_F_TIME}),
    OP_BIT_LONG: frozenset({_F_BIT}), OP_BIT_DEC: frozenset({_F_BIT}),
    OP_ENUM: _F_TEXT, OP_SET: _F_TEXT, OP_VARSTR: _F_TEXT, OP_CHAR: _F_TEXT,
    OP_BINARY_PAD: _F_TEXT, OP_BLOB: _F_TEXT | {255},
}


def text_compatible(td: br.TableDef, columns: list[tuple[int, int, str | None]]) -> bool:
    """Whether a chunk result (``RawResult.columns``) reads as the compiled codec
    of ``td`` expects: per column the field type its opcode parses, text
    decoded as UTF-8 exactly where the Python path gets ``str`` and kept as
    bytes where it gets ``bytes``. Anything else uses the Python path."""
    if len(columns) != len(td.types):
        return False
    for i, (ftype, _charset, encoding) in enumerate(columns):
        try:
            op, _a, _b, conv, _values = _op(td, i)
        except _Unsupported:
            return False
        if ftype not in _TEXT_FIELDS.get(op, ()):
            return False
        if op in (OP_VARSTR, OP_CHAR, OP_BLOB, OP_ENUM, OP_SET, OP_BINARY_PAD):
            decoded = op in (OP_ENUM, OP_SET) or (op != OP_BINARY_PAD and conv != CONV_COPY)
            if (encoding == "utf8") != decoded or (not decoded and encoding is not None):
                return False
        elif op in (OP_BIT_LONG, OP_BIT_DEC):
            if encoding is not None:
                return False
        elif encoding != "ascii":
            return False
    return True


def encode_text(codec: Any, rows: list[bytes], table: str, tail: Any = ()
                ) -> list[tuple[int | bytes, bytes, Any]]:
    """(event key, Avro payload, ``tail``) of each text-protocol row; a row that
    does not parse raises :class:`CorruptEventError`."""
    try:
        out: list[tuple[int | bytes, bytes, Any]] = codec.encode_text(rows, table, tail)
    except (ValueError, OverflowError) as exc:  # OverflowError: a FLOAT beyond its range
        raise CorruptEventError(f"cannot read a snapshot row of {table}: {exc}") from exc
    return out


def scan_rows() -> Any | None:
    """The C splitter of buffered text-protocol row packets, or None (not built)."""
    return None if _rowcodec is None else _rowcodec.scan_rows


def frames() -> Any | None:
    """The C cutter of whole binlog event packets (``_binlogframes.c``), or None."""
    return None if _rowcodec is None else _rowcodec.frames


def rows_meta() -> Any | None:
    """The C joiner of a rows event's metadata part (``tables.RowsMeta``), or None."""
    return None if _rowcodec is None else _rowcodec.rows_meta
