"""Decoding a relay response into envelope record batches, many events per call.

:class:`ChunkDecoder` turns the events of a ``/stream`` response, from an
offset, into one Arrow record batch of at most ``max_rows`` data events, and
reports what the window logic of :mod:`databus.spark.reading` needs (the EOPs
passed, the next window index, whether the batch's end window was reached).

Two implementations with one contract and identical output:

* the compiled one: ``envelope_columns`` of ``databus.client._wiredecode``, the
  one compiled decoder of the wire format (built by setup.py when a C compiler
  and zlib's headers exist), whose event walk (every check, both CRCs) is the
  one the client's ``scan`` uses, with an Arrow sink instead of Python objects:
  headers, keys, metadata and flat Avro rows go straight into Arrow buffers. It
  covers tables whose columns are boolean, int, long, float, double, string or
  bytes (nullable unions included) in ``valueFormat=struct``;
* the Python path (event.decode, fastavro, :class:`~databus.spark.arrow.EnvelopeBuilder`),
  used for everything else and for any range the extension declines: a
  damaged event, an unknown schema version, a value stored in another union
  branch than its column's type, invalid UTF-8, an out-of-range int. The
  Python path then produces the values or raises the typed error
  (:class:`CorruptEventError`, :class:`SchemaError`), exactly as before.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from databus.core import event as ev
from databus.core.envelope import decode_images
from databus.core.schema import METADATA_SCHEMA, SchemaRegistry, TableSchema
from databus.spark import arrow

try:
    _native: Any = importlib.import_module("databus.client._wiredecode")
except ImportError:  # not built: the Python path only
    _native = None

# Avro type -> code; the C side's A_* (keep in step with client/_wiredecode.c)
_AVRO_CODES = {"null": 0, "boolean": 1, "int": 2, "long": 3, "float": 4, "double": 5,
               "string": 6, "bytes": 7}
_ARROW_CODES = {pa.bool_(): 1, pa.int32(): 2, pa.int64(): 3, pa.float32(): 4,
                pa.float64(): 5, pa.string(): 6, pa.binary(): 7}
# the metadata layout the C side reads (the fields in order, each ["null", x])
_META_LAYOUT = [("before", "bytes"), ("txid", "string"), ("file", "string"), ("pos", "long"),
                ("gtid", "string"), ("server_id", "long"), ("row", "int")]


def available() -> bool:
    """Whether the compiled decoder was built."""
    return _native is not None


def _metadata_fits() -> bool:
    fields = METADATA_SCHEMA["fields"]
    return [(f["name"], f["type"]) for f in fields] == [
        (n, ["null", t]) for n, t in _META_LAYOUT]


@dataclass(frozen=True, slots=True)
class Chunk:
    """What one :meth:`ChunkDecoder.decode` call consumed and produced.

    ``eops``: SCNs of the EOPs passed, in order; ``index``: the window index of
    the next data event; ``tail``/``tail_scn``: data events after the last EOP
    passed (all of them when none) and their window; ``done``: the EOP at or
    after ``end_scn`` was passed (the read is complete); ``off``: where the
    next call starts.
    """

    batch: pa.RecordBatch | None
    off: int
    eops: list[int]
    index: int
    tail: int
    tail_scn: int
    done: bool


def _field_plan(avro_type: Any, out: int) -> tuple[int, int, bytes] | None:
    """``(out column, union?, branch codes)`` of a field the C side can decode, else None."""
    if isinstance(avro_type, list):
        if not avro_type or not all(isinstance(b, str) and b in _AVRO_CODES for b in avro_type):
            return None
        return out, 1, bytes(_AVRO_CODES[b] for b in avro_type)
    if isinstance(avro_type, str) and avro_type in _AVRO_CODES and avro_type != "null":
        return out, 0, bytes([_AVRO_CODES[avro_type]])
    return None


class ChunkDecoder:
    """Decodes response chunks for one query's envelope schema (see the module docstring).

    ``schema`` is the full envelope (:func:`~databus.spark.arrow.envelope_schema`)
    or the flat one (:func:`~databus.spark.arrow.flat_schema`, ``envelope=flat``):
    then the batches are :func:`~databus.spark.arrow.flatten` of the full ones,
    which the compiled path builds directly, without the unused columns.

    ``refresh`` fetches the relay's schemas; it is called once, the first time
    an event names a schema version the registry lacks (as the reader always
    did). ``native=False`` forces the Python path (tests compare both).
    """

    def __init__(self, schema: pa.Schema, registry: SchemaRegistry,
                 refresh: Callable[[], SchemaRegistry], *, native: bool = True) -> None:
        self.schema = schema
        self.registry = registry
        self._refresh = refresh
        self._refreshed = False
        self._flat = arrow.is_flat(schema)
        if self._flat:
            row: pa.DataType = pa.struct(list(schema)[:-len(arrow.FLAT_COLUMNS)])
            self._full = pa.schema([*(f for f in arrow.envelope_schema(None) if f.name not in (
                "before", "after")), ("before", row), ("after", row)])
        else:
            row = schema.field("after").type
            self._full = schema
        self._builder = arrow.EnvelopeBuilder(self._full)
        self._row_type: pa.StructType | None = row if pa.types.is_struct(row) else None
        self._kinds: bytes | None = None
        # built on first use: pa.array() makes pyarrow import pandas (a quarter second),
        # which the driver-side source process never needs
        self._ops: pa.Array | None = None
        if native and _native is not None and self._row_type is not None and _metadata_fits():
            codes = [_ARROW_CODES.get(self._row_type.field(i).type)
                     for i in range(self._row_type.num_fields)]
            if all(c is not None for c in codes):
                self._kinds = bytes(c for c in codes if c is not None)
        self._plan()

    @property
    def native(self) -> bool:
        """Whether the compiled decoder is in use (it may still decline a range)."""
        return self._kinds is not None

    def _plan(self) -> None:
        """Plans of the registry's table versions the C side can decode."""
        self._names: list[tuple[str, str]] = []
        plans: list[tuple[bytes, int, tuple[tuple[int, int, bytes], ...]]] = []
        if self._row_type is not None and self._kinds is not None:
            names = [self._row_type.field(i).name for i in range(self._row_type.num_fields)]
            for src in self.registry.source_ids():
                for ts in self.registry.versions(src):
                    plan = self._version_plan(ts, names)
                    if plan is not None:
                        plans.append((ts.id, len(self._names), plan))
                        db, _, table = ts.name.partition(".")
                        self._names.append((db, table))
        self._plans = tuple(plans)
        self._dbs = pa.array([d for d, _ in self._names], pa.string())
        self._tables = pa.array([t for _, t in self._names], pa.string())

    @staticmethod
    def _version_plan(ts: TableSchema, names: list[str]
                      ) -> tuple[tuple[int, int, bytes], ...] | None:
        fields: list[tuple[int, int, bytes]] = []
        for f in ts.avro.get("fields", []):
            column = f.get("column", f["name"])
            if column not in names:
                return None  # the Python path raises "restart the query"
            fp = _field_plan(f["type"], names.index(column))
            if fp is None or any(known[0] == fp[0] for known in fields):
                return None  # two fields for one column: the Python path decides
            fields.append(fp)
        return tuple(fields)

    def decode(self, buf: bytes, off: int, max_rows: int, end_scn: int, index: int) -> Chunk:
        """The events of ``buf`` from ``off``: at most ``max_rows`` (>= 1) data events."""
        if self._kinds is not None:
            res = _native.envelope_columns(buf, off, max_rows, end_scn, index, self._plans,
                                           self._kinds, self._flat)
            if res is not None:
                return self._native_chunk(res)
        return self.decode_python(buf, off, max_rows, end_scn, index)

    def decode_python(self, buf: bytes, off: int, max_rows: int, end_scn: int,
                      index: int) -> Chunk:
        """The reference implementation of :meth:`decode` (event.decode + fastavro)."""
        eops: list[int] = []
        tail, tail_scn, rows, done, n = 0, -1, 0, False, len(buf)
        builder = self._builder
        while off < n and not done:
            e = ev.decode(buf, off)
            length = ev.peek_length(buf, off)
            if e.is_control:
                off += length
                if e.is_eop:
                    eops.append(e.scn)
                    index, tail, tail_scn, done = 0, 0, -1, e.scn >= end_scn
                continue
            if rows >= max_rows:
                break
            if self.registry.find(e.schema_id) is None and not self._refreshed:
                # a table version added after load(): fetch the relay's schemas once
                self.registry = self._refresh()
                self._refreshed = True
                self._plan()
            schema, before, after, meta = decode_images(e, self.registry)
            builder.add(_OP_LETTERS[e.attributes & ev.ATTR_OPCODE_MASK], e.scn, index,
                        e.timestamp_ns // 1_000_000, schema, meta,
                        bool(e.attributes & ev.ATTR_SNAPSHOT), arrow.key_text(e.key), before,
                        after)
            rows, index, tail, tail_scn = rows + 1, index + 1, tail + 1, e.scn
            off += length
        batch = builder.flush() if rows else None
        if batch is not None and self._flat:
            batch = arrow.flatten(batch, self.schema)
        return Chunk(batch, off, eops, index, tail, tail_scn, done)

    def _native_chunk(self, res: tuple[Any, ...]) -> Chunk:
        (done, off, nrows, eops, tail_scn, index, tail, fixed, before, after, bvalid,
         avalid) = res
        batch = self._native_batch(nrows, fixed, before, after, bvalid, avalid) if nrows else None
        return Chunk(batch, off, eops, index, tail, tail_scn, bool(done))

    def _native_batch(self, n: int, fixed: tuple[Any, ...], before: tuple[Any, ...],
                      after: tuple[Any, ...], bvalid: bytes, avalid: bytes) -> pa.RecordBatch:
        if self._ops is None:
            self._ops = pa.array(_OP_LETTERS, pa.string())
        if self._flat:  # before: the row (after image, else before image); no after
            scn, index, _, attr = (_column(t, n, c, always_valid=True)
                                   for t, c in zip(_FIXED_TYPES[:4], fixed[:4], strict=True))
            assert self._row_type is not None
            cols = [_column(self._row_type.field(i).type, n, c) for i, c in enumerate(before)]
            sequence = pa.StructArray.from_arrays([scn, index], fields=list(arrow.SEQUENCE_TYPE))
            return pa.RecordBatch.from_arrays(
                [*cols, self._ops.take(pc.bit_wise_and(attr, 7)), sequence], schema=self.schema)
        (scn, index, ts, attr, slot, key, file, pos, gtid, server_id, row) = (
            _column(t, n, c, always_valid=i < 6)
            for i, (t, c) in enumerate(zip(_FIXED_TYPES, fixed, strict=True)))
        kind = pc.bit_wise_and(attr, 7)
        sequence = pa.StructArray.from_arrays([scn, index], fields=list(arrow.SEQUENCE_TYPE))
        source = pa.StructArray.from_arrays(
            [self._dbs.take(slot), self._tables.take(slot), scn, file, pos, gtid, server_id, row,
             pc.not_equal(pc.bit_wise_and(attr, ev.ATTR_SNAPSHOT), 0)],
            fields=list(arrow.SOURCE_TYPE))
        assert self._row_type is not None
        return pa.RecordBatch.from_arrays(
            [self._ops.take(kind), scn, sequence, ts, source, key,
             self._struct(n, before, bvalid), self._struct(n, after, avalid)],
            schema=self.schema)

    def _struct(self, n: int, cols: tuple[Any, ...], valid: bytes) -> pa.Array:
        t = self._row_type
        assert t is not None
        children = [_column(t.field(i).type, n, c) for i, c in enumerate(cols)]
        return pa.Array.from_buffers(t, n, [pa.py_buffer(valid)], children=children)


_OP_LETTERS = [op.letter for op in sorted(ev.Op)] + [""] * 2  # op letter by the 3 attribute bits
_FIXED_TYPES = [pa.int64(), pa.int32(), pa.int64(), pa.int32(), pa.int32(), pa.string(),
                pa.string(), pa.int64(), pa.string(), pa.int64(), pa.int32()]


def _column(t: pa.DataType, n: int, bufs: tuple[bytes, bytes, bytes], *,
            always_valid: bool = False) -> pa.Array:
    valid, values, data = bufs
    vbuf = None if always_valid else pa.py_buffer(valid)
    if pa.types.is_string(t) or pa.types.is_binary(t):
        return pa.Array.from_buffers(t, n, [vbuf, pa.py_buffer(values), pa.py_buffer(data)])
    return pa.Array.from_buffers(t, n, [vbuf, pa.py_buffer(values)])
