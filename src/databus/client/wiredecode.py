"""The client's batch decoder: ``/stream`` bodies to events, Avro rows to Python values.

Functions every consumer path goes through, each with a compiled half
(``_wiredecode.c``, built by setup.py where a C compiler is available) and a
pure-Python half with the same output:

* :func:`scan` - every event of a body in one call: version, magic, lengths and
  (``verify``) both CRCs, header, key, metadata and payload parts, as
  :func:`databus.core.event.iter_events` does. A damaged or truncated body raises
  :class:`~databus.core.errors.CorruptEventError`, the same error with the same
  message on both halves (the compiled half hands any body it does not accept to
  the Python half, which raises). The compiled half checks every byte before it
  builds any object, and checks bodies of 64 KiB or more without holding the GIL
  (another thread, e.g. the one delivering the previous batch, runs meanwhile).
* :func:`scan_table` - the same checks, same errors, but no object per event: a
  :class:`Scanned` holds the body and int64 columns (each event's offset, source
  id, attributes, payload offset and length) and the runs of one schema; its
  :meth:`Scanned.events` builds the events of a range when they are wanted, and
  :meth:`RowDecoder.rows_at` / :meth:`RowDecoder.columns_at` decode payloads in
  place from those spans. The bootstrap client uses it for batch consumers.
* :class:`RowDecoder` - one table version's Avro rows into ``dict`` rows keyed by
  column name (``row``, ``rows``) or into one list per column (``columns``, no
  dict per row on the compiled half), with the values fastavro gives (``Decimal``,
  ``date``, ``datetime`` through fastavro's own logical-type readers). Bad row
  bytes raise :class:`~databus.core.errors.SchemaError` on both halves. The
  compiled half handles flat records of null, boolean, int, long, float, double,
  string, bytes and unions of them (every schema the sources write); other
  schemas, and any value it does not read exactly as fastavro (an int beyond 32
  bits, a boolean byte other than 0/1), go to fastavro.

Zero-copy: ``scan`` reads the body through the buffer protocol (the HTTP
response's bytes, or a memoryview of them) and ``RowDecoder`` reads each payload
in place (bytes or any buffer); the only copies are the per-event ``payload`` and
``key`` bytes that :class:`~databus.core.event.Event` holds (none on the
``scan_table`` path until events are asked for). The body must not change while a
call reads it, nor while a :class:`Scanned` refers to it (``bytes`` never do).

One decoder for every consumer (issue #18): ``_wiredecode.c`` is the one compiled
decoder of the wire format. Its event walk (every check above, both CRCs) has two
sinks: Python objects (this module: :func:`scan`, :func:`scan_table`,
:class:`RowDecoder`) and Arrow buffers (``envelope_columns``, the compiled half of
:mod:`databus.spark.fastread`, used by the Spark source and the snapshot reader),
with the same branch type codes (below) and the same refusals (anything not read
exactly as the Python path is handed to it). The relay client
(``client/window.py``), the bootstrap client (``client/bootstrap.py``: ``scan``,
or ``scan_table`` for a consumer of batches) and the replicate sink (through
``DataEvent``) decode with this module; the Spark readers through ``fastread``.
Both Python fallbacks walk with :mod:`databus.core.event` and decode rows with
fastavro; tests hold each compiled sink to its fallback and the two sinks to each
other (``tests/unit/test_wiredecode_sinks.py``).

Thread safety: all are safe to call from any thread; a ``RowDecoder`` holds no
mutable state.
"""

from __future__ import annotations

import importlib
from array import array
from collections.abc import Callable, Sequence
from typing import Any

from databus.core import event as ev
from databus.core.schema import TableSchema

try:
    _native: Any = importlib.import_module("databus.client._wiredecode")
except ImportError:  # no C compiler where databus was installed
    _native = None

# Avro type -> code; the C side's A_* (the Arrow sink's column kinds use the same codes)
_CODES = {"null": 0, "boolean": 1, "int": 2, "long": 3, "float": 4, "double": 5,
          "string": 6, "bytes": 7}

Buffer = bytes | bytearray | memoryview


def compiled() -> bool:
    """Whether the compiled half was built."""
    return _native is not None


def scan(body: Buffer, *, verify: bool = True, native: bool = True) -> list[ev.Event]:
    """Every event of ``body`` (concatenated binary events), in order.

    Both CRCs are checked unless ``verify`` is false; a damaged, truncated or
    malformed body raises :class:`~databus.core.errors.CorruptEventError` and
    returns nothing. ``native=False`` forces the Python half.
    """
    if native and _native is not None:
        out: list[ev.Event] | None = _native.scan(body, verify, ev.Event)
        if out is not None:
            return out
    return list(ev.iter_events(body, verify=verify))


# int64 columns of a scan_table, in the C side's order
_COLS = ("offsets", "src_ids", "attributes", "payload_offsets", "payload_lengths")


class Scanned:
    """A checked body and where each of its events is, without an object per event.

    What :func:`scan_table` returns: one int64 column per field below (a
    ``memoryview`` of format ``q``, index i = the body's i-th event), and ``runs``:
    ``(start, end)`` of each run of events with the same schema id (or, for
    events without one, the same source), the runs a
    :class:`~databus.client.consumer.DataBatch` holds. :meth:`events` builds the
    :class:`~databus.core.event.Event` objects of a range when asked (equal to what
    :func:`scan` gives; the CRCs were checked by the scan, the lengths are checked
    again). Immutable; safe to share between threads.
    """

    __slots__ = ("_native", "attributes", "body", "offsets", "payload_lengths",
                 "payload_offsets", "runs", "src_ids")

    def __init__(self, body: Buffer, table: bytes, runs: list[tuple[int, int]],
                 native: bool) -> None:
        self.body = body
        self.runs = runs
        self._native = native
        mv = memoryview(table).cast("q")
        n = len(mv) // len(_COLS)
        self.offsets, self.src_ids, self.attributes, self.payload_offsets, \
            self.payload_lengths = (mv[i * n:(i + 1) * n] for i in range(len(_COLS)))

    def __len__(self) -> int:
        return len(self.offsets)

    def events(self, start: int = 0, end: int | None = None) -> list[ev.Event]:
        """The events ``start`` to ``end`` (exclusive), as :func:`scan` gives them."""
        offsets = self.offsets[start:end]
        if self._native and _native is not None:
            out: list[ev.Event] | None = _native.events_at(self.body, offsets, ev.Event)
            if out is not None:
                return out
        return [ev.decode(self.body, off, verify=False) for off in offsets]


def scan_table(body: Buffer, *, verify: bool = True, native: bool = True) -> Scanned:
    """Where every event of ``body`` is (:class:`Scanned`), checked as :func:`scan`
    checks it (same errors), without building an object per event."""
    if native and _native is not None:
        out: tuple[bytes, list[tuple[int, int]]] | None = _native.scan_table(body, verify)
        if out is not None:
            return Scanned(body, out[0], out[1], True)
    cols: list[list[int]] = [[] for _ in _COLS]
    runs: list[tuple[int, int]] = []
    offset, start, last = 0, 0, None
    for i, e in enumerate(ev.iter_events(body, verify=verify)):
        total = ev.peek_length(body, offset)
        for col, v in zip(cols, (offset, e.src_id, e.attributes,
                                 offset + total - len(e.payload), len(e.payload)), strict=True):
            col.append(v)
        run_key = e.schema_id if e.schema_id else e.src_id
        if i and run_key != last:
            runs.append((start, i))
            start = i
        last = run_key
        offset += total
    if cols[0]:
        runs.append((start, len(cols[0])))
    return Scanned(body, array("q", [v for col in cols for v in col]).tobytes(), runs, False)


def _branch(t: Any) -> tuple[int, Callable[[Any], Any] | None] | None:
    """The type code and logical-type converter of one union branch; None when the
    compiled half does not decode this type."""
    from fastavro.read import LOGICAL_READERS

    if isinstance(t, str):
        code = _CODES.get(t)
        return None if code is None else (code, None)
    if isinstance(t, dict) and isinstance(t.get("type"), str):
        code = _CODES.get(t["type"])
        if code is None:
            return None
        logical = t.get("logicalType")
        reader = LOGICAL_READERS.get(f"{t['type']}-{logical}") if logical else None
        if reader is None:
            return code, None

        def convert(value: Any, _read: Any = reader, _schema: Any = t) -> Any:
            return _read(value, _schema, None)

        return code, convert
    return None


def _plan(schema: TableSchema, names: Sequence[str]) -> tuple[Any, ...] | None:
    """The compiled decoder's field plan, or None when a field is not flat."""
    fields = schema.avro.get("fields")
    if schema.avro.get("type") != "record" or not isinstance(fields, list):
        return None
    out = []
    for f, name in zip(fields, names, strict=True):
        t = f["type"]
        branches = t if isinstance(t, list) else [t]
        decoded = [_branch(b) for b in branches]
        if not branches or len(branches) > 16 or any(d is None for d in decoded):
            return None
        codes = bytes(d[0] for d in decoded if d is not None)
        convs = tuple(d[1] for d in decoded if d is not None)
        out.append((name, isinstance(t, list), codes, convs))
    return tuple(out)


class RowDecoder:
    """Avro rows of one table version -> values keyed by the table's column names.

    ``row``/``rows`` give dicts (in schema order), ``columns`` a dict of lists.
    Output and errors are the same on both halves; ``native=False`` forces fastavro.
    """

    __slots__ = ("_c", "_renamed", "names", "schema")

    def __init__(self, schema: TableSchema, *, native: bool = True) -> None:
        self.schema = schema
        self.names: tuple[str, ...] = tuple(schema.column_names)
        self._renamed = self.names != tuple(f["name"] for f in schema.avro["fields"])
        plan = _plan(schema, self.names) if native and _native is not None else None
        self._c: Any = _native.RowDecoder(plan) if plan is not None else None

    @property
    def native(self) -> bool:
        """Whether rows of this schema are decoded by the compiled half."""
        return self._c is not None

    def _py_row(self, data: Buffer) -> dict[str, Any]:
        raw = self.schema.decode(bytes(data))
        if not self._renamed:
            return raw
        return dict(zip(self.names, raw.values(), strict=True))

    def row(self, data: Buffer) -> dict[str, Any]:
        """One row; :class:`SchemaError` when ``data`` is not a row of this schema."""
        if self._c is not None:
            out: dict[str, Any] | None = self._c.row(data)
            if out is not None:
                return out
        return self._py_row(data)

    def rows(self, payloads: Sequence[Buffer]) -> list[dict[str, Any]]:
        """Many rows, one dict each."""
        if self._c is not None:
            out: list[dict[str, Any]] | None = self._c.rows(payloads)
            if out is not None:
                return out
        return [self._py_row(p) for p in payloads]

    def rows_at(self, body: Buffer, offsets: Buffer, lengths: Buffer) -> list[dict[str, Any]]:
        """:meth:`rows` of the payloads ``body[offsets[i]:offsets[i] + lengths[i]]``
        (int64 arrays, e.g. a :class:`Scanned`'s columns), read in place."""
        if self._c is not None:
            out: list[dict[str, Any]] | None = self._c.rows_at(body, offsets, lengths)
            if out is not None:
                return out
        return self.rows(_spans(body, offsets, lengths))

    def columns_at(self, body: Buffer, offsets: Buffer, lengths: Buffer
                   ) -> dict[str, list[Any]]:
        """:meth:`columns` of the payloads at those spans, read in place."""
        if self._c is not None:
            cols: tuple[list[Any], ...] | None = self._c.columns_at(body, offsets, lengths)
            if cols is not None:
                return dict(zip(self.names, cols, strict=True))
        return self.columns(_spans(body, offsets, lengths))

    def columns(self, payloads: Sequence[Buffer]) -> dict[str, list[Any]]:
        """Many rows as one list per column (keys in schema order)."""
        if self._c is not None:
            cols: tuple[list[Any], ...] | None = self._c.columns(payloads)
            if cols is not None:
                return dict(zip(self.names, cols, strict=True))
        out: dict[str, list[Any]] = {name: [] for name in self.names}
        lists = list(out.values())
        for p in payloads:
            for lst, v in zip(lists, self._py_row(p).values(), strict=True):
                lst.append(v)
        return out


def _spans(body: Buffer, offsets: Buffer, lengths: Buffer) -> list[memoryview]:
    mv = memoryview(body)
    offs, lens = memoryview(offsets).cast("B").cast("q"), memoryview(lengths).cast("B").cast("q")
    return [mv[o:o + n] for o, n in zip(offs, lens, strict=True)]


__all__ = ["RowDecoder", "Scanned", "compiled", "scan", "scan_table"]
