"""From Avro table schemas and binary events to Arrow: the change envelope.

The envelope (one row per data event), in this column order::

    op        string   c | u | d | r | t
    scn       int64    the window's SCN
    sequence  struct<scn int64, index int32>  order of changes: index counts this
                       partition's events inside the window (one key always
                       lands in one partition, so its changes are ordered)
    ts_ms     int64    the event's source timestamp, ms (deterministic on replay)
    source    struct<db, table, scn, file, pos, gtid, server_id, row, snapshot>
    key       string   the event key (integer as decimal text, bytes as UTF-8 or 0x-hex)
    before    struct<columns> | string (valueFormat=json)
    after     struct<columns> | string (valueFormat=json)

Avro to Arrow (a nullable union takes its first non-null branch; SQLite's
multi-branch unions thus take the declared affinity's type): boolean, int,
long, float, double, string, bytes as themselves; decimal -> decimal128 (or
string above 38 digits); date -> date32; time-millis/micros -> int (ms/us of
the day); timestamp-* -> timestamp[us, UTC]; local-timestamp-* ->
timestamp[us]; uuid and enum -> string; fixed -> binary; arrays, maps and
records nest. A value held in another union branch is converted when the
conversion is exact (e.g. 3 to 3.0, "7" stays in a string column only), else
the read fails with :class:`SchemaError` naming the column; valueFormat=json
carries any value.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import uuid
from typing import Any

import pyarrow as pa

from databus.core.envelope import row_to_json
from databus.core.errors import SchemaError
from databus.core.schema import TableSchema

SOURCE_TYPE = pa.struct([
    ("db", pa.string()), ("table", pa.string()), ("scn", pa.int64()), ("file", pa.string()),
    ("pos", pa.int64()), ("gtid", pa.string()), ("server_id", pa.int64()), ("row", pa.int32()),
    ("snapshot", pa.bool_()),
])
SEQUENCE_TYPE = pa.struct([("scn", pa.int64()), ("index", pa.int32())])
_PRIMS: dict[str, pa.DataType] = {
    "boolean": pa.bool_(), "int": pa.int32(), "long": pa.int64(), "float": pa.float32(),
    "double": pa.float64(), "string": pa.string(), "bytes": pa.binary(), "null": pa.null(),
}


def avro_to_arrow(avro: Any) -> pa.DataType:
    """The Arrow type of an Avro type (see the module docstring)."""
    if isinstance(avro, list):
        branches = [b for b in avro if b != "null"]
        if not branches:
            return pa.null()
        return avro_to_arrow(branches[0])
    if isinstance(avro, str):
        if avro in _PRIMS:
            return _PRIMS[avro]
        raise SchemaError(f"named Avro type references are not supported: {avro!r}")
    kind, logical = avro.get("type"), avro.get("logicalType")
    if logical == "decimal":
        precision, scale = int(avro["precision"]), int(avro.get("scale", 0))
        return pa.decimal128(precision, scale) if precision <= 38 else pa.string()
    if logical == "date":
        return pa.date32()
    if logical in ("timestamp-millis", "timestamp-micros", "timestamp-nanos"):
        return pa.timestamp("us", tz="UTC")
    if logical in ("local-timestamp-millis", "local-timestamp-micros", "local-timestamp-nanos"):
        return pa.timestamp("us")
    if logical == "time-millis":
        return pa.int32()
    if logical == "time-micros":
        return pa.int64()
    if kind == "record":
        return pa.struct([(f.get("column", f["name"]), avro_to_arrow(f["type"]))
                          for f in avro["fields"]])
    if kind == "array":
        return pa.list_(avro_to_arrow(avro["items"]))
    if kind == "map":
        return pa.map_(pa.string(), avro_to_arrow(avro["values"]))
    if kind == "enum":
        return pa.string()
    if kind == "fixed":
        return pa.binary()
    return avro_to_arrow(kind)


def envelope_schema(table: TableSchema | None) -> pa.Schema:
    """The Arrow schema of the envelope; ``None`` = JSON strings for before/after."""
    row: pa.DataType = pa.string() if table is None else avro_to_arrow(table.avro)
    return pa.schema([
        ("op", pa.string()), ("scn", pa.int64()), ("sequence", SEQUENCE_TYPE),
        ("ts_ms", pa.int64()), ("source", SOURCE_TYPE), ("key", pa.string()),
        ("before", row), ("after", row),
    ])


FLAT_COLUMNS = ("_op", "_sequence")
"""The columns ``envelope=flat`` adds after the row's (what :func:`databus.spark.changes` adds)."""


def flat_schema(table: TableSchema) -> pa.Schema:
    """The Arrow schema of ``envelope=flat``: the row's columns, ``_op``, ``_sequence``."""
    row = avro_to_arrow(table.avro)
    clash = [f.name for f in row if f.name in FLAT_COLUMNS]
    if clash:
        raise SchemaError(f"{table.name} has columns {clash}: use envelope=full")
    return pa.schema([*row, ("_op", pa.string()), ("_sequence", SEQUENCE_TYPE)])


def is_flat(schema: pa.Schema) -> bool:
    """Whether ``schema`` is an ``envelope=flat`` schema (else the full envelope, whose
    last column is always ``after``; a flat row cannot have ``_op``/``_sequence``)."""
    return bool(schema.names[-2:] == list(FLAT_COLUMNS))


def flatten(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """The full envelope ``batch`` as ``schema`` (``envelope=flat``): per row the after
    image, else the before image; ``op`` and ``sequence`` renamed. The reference for
    the compiled flat decode, and exactly what :func:`databus.spark.changes` selects."""
    import pyarrow.compute as pc

    after, before = batch.column("after"), batch.column("before")
    has_after = after.is_valid()
    cols = [pc.if_else(has_after, a, b)
            for a, b in zip(after.flatten(), before.flatten(), strict=True)]
    return pa.RecordBatch.from_arrays(
        [*cols, batch.column("op"), batch.column("sequence")], schema=schema)


def key_text(key: int | bytes) -> str:
    if isinstance(key, int):
        return str(key)
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:
        return "0x" + key.hex()


def convert(value: Any, t: pa.DataType, where: str) -> Any:
    """``value`` as Arrow type ``t`` expects it, or :class:`SchemaError` when not exact."""
    if value is None:
        return None
    if pa.types.is_int64(t) or pa.types.is_int32(t):
        if isinstance(value, bool):
            return int(value)
        if isinstance(value, int):
            return value
        if isinstance(value, dt.time):
            micros = ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000
            micros += value.microsecond
            return micros if pa.types.is_int64(t) else micros // 1000
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif pa.types.is_floating(t):
        if isinstance(value, float):
            return value
        if isinstance(value, int) and not isinstance(value, bool) and float(value) == value:
            return float(value)
    elif pa.types.is_string(t):
        if isinstance(value, str):
            return value
        if isinstance(value, (uuid.UUID, decimal.Decimal)):
            return str(value)
    elif pa.types.is_binary(t):
        if isinstance(value, bytes):
            return value
        if isinstance(value, str):
            return value.encode("utf-8")
    elif pa.types.is_boolean(t):
        if isinstance(value, bool):
            return value
    elif pa.types.is_decimal(t):
        if isinstance(value, decimal.Decimal):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return decimal.Decimal(value)
    elif pa.types.is_timestamp(t) or pa.types.is_date(t):
        if isinstance(value, (dt.date, dt.datetime)):
            return value
    elif pa.types.is_struct(t):
        if isinstance(value, dict):
            return {t.field(i).name: convert(value.get(t.field(i).name), t.field(i).type, where)
                    for i in range(t.num_fields)}
    elif pa.types.is_list(t):
        if isinstance(value, list):
            return [convert(v, t.value_type, where) for v in value]
    elif pa.types.is_map(t) and isinstance(value, dict):
        return [(k, convert(v, t.item_type, where)) for k, v in value.items()]
    raise SchemaError(
        f"column {where}: value {value!r:.60} ({type(value).__name__}) does not fit {t}; use "
        "valueFormat=json to carry any value")


class EnvelopeBuilder:
    """Accumulates envelope rows column by column; :meth:`flush` makes a RecordBatch.

    Rows stay as the Avro decoder produced them until the flush, which builds
    each column with one ``pa.array`` call; values are converted one by one
    (:func:`convert`) only for a column whose values Arrow refuses as they are.
    A table version is checked once against the query's row type: a column the
    query's schema lacks fails (restart the query to pick up the new version),
    a column the version lacks is null.
    """

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        row_type = schema.field("after").type
        self.json_mode = not pa.types.is_struct(row_type)
        self._row_type: pa.StructType | None = None if self.json_mode else row_type
        self._fields: dict[bytes, list[str | None]] = {}  # schema id -> Avro field per column
        self._names: dict[bytes, tuple[str, str]] = {}  # schema id -> (db, table)
        self._reset()

    def _reset(self) -> None:
        self._scalars: list[list[Any]] = [[] for _ in range(13)]
        self._schemas: list[bytes] = []
        self._before: list[Any] = []
        self._after: list[Any] = []

    def __len__(self) -> int:
        return len(self._schemas)

    def _check(self, schema: TableSchema) -> None:
        if schema.id in self._fields or self._row_type is None:
            return
        by_column = {f.get("column", f["name"]): f["name"] for f in schema.avro["fields"]}
        names = [self._row_type.field(i).name for i in range(self._row_type.num_fields)]
        extra = sorted(set(by_column) - set(names))
        if extra:
            raise SchemaError(
                f"{schema.name} v{schema.version} has columns {extra} that the query's schema"
                " lacks: restart the query to pick up the new table version")
        self._fields[schema.id] = [by_column.get(n) for n in names]

    def add(self, op: str, scn: int, index: int, ts_ms: int, schema: TableSchema,
            meta: dict[str, Any], snapshot: bool, key: str, before: dict[str, Any] | None,
            after: dict[str, Any] | None) -> None:
        names = self._names.get(schema.id)
        if names is None:
            self._check(schema)
            db, _, table = schema.name.partition(".")
            names = self._names[schema.id] = (db, table)
        c = self._scalars
        c[0].append(op)
        c[1].append(scn)
        c[2].append(index)
        c[3].append(ts_ms)
        c[4].append(names[0])
        c[5].append(names[1])
        if meta:
            c[6].append(meta.get("file"))
            c[7].append(meta.get("pos"))
            c[8].append(meta.get("gtid"))
            c[9].append(meta.get("server_id"))
            c[10].append(meta.get("row"))
        else:
            for i in range(6, 11):
                c[i].append(None)
        c[11].append(snapshot)
        c[12].append(key)
        self._schemas.append(schema.id)
        if self.json_mode:
            self._before.append(_json_row(schema, before))
            self._after.append(_json_row(schema, after))
        else:
            self._before.append(before)
            self._after.append(after)

    def flush(self) -> pa.RecordBatch:
        try:
            batch = self._build()
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
            raise SchemaError(f"cannot build the Arrow batch: {exc}") from exc
        self._reset()
        return batch

    def _build(self) -> pa.RecordBatch:
        (op, scn, index, ts_ms, db, table, file, pos, gtid, server_id, row, snap,
         key) = self._scalars
        scn_arr = pa.array(scn, pa.int64())
        sequence = pa.StructArray.from_arrays(
            [scn_arr, pa.array(index, pa.int32())], fields=list(SEQUENCE_TYPE))
        source = pa.StructArray.from_arrays(
            [pa.array(db, pa.string()), pa.array(table, pa.string()), scn_arr,
             pa.array(file, pa.string()), pa.array(pos, pa.int64()),
             pa.array(gtid, pa.string()), pa.array(server_id, pa.int64()),
             pa.array(row, pa.int32()), pa.array(snap, pa.bool_())],
            fields=list(SOURCE_TYPE))
        if self._row_type is None:
            before = pa.array(self._before, pa.string())
            after = pa.array(self._after, pa.string())
        else:
            before = self._rows(self._before, self._row_type)
            after = self._rows(self._after, self._row_type)
        return pa.RecordBatch.from_arrays(
            [pa.array(op, pa.string()), scn_arr, sequence, pa.array(ts_ms, pa.int64()), source,
             pa.array(key, pa.string()), before, after], schema=self.schema)

    def _rows(self, rows: list[dict[str, Any] | None], t: pa.StructType) -> pa.StructArray:
        children = []
        ids = self._schemas
        single = len(set(ids)) == 1
        for i in range(t.num_fields):
            f = t.field(i)
            values: list[Any]
            if single:
                name = self._fields[ids[0]][i]
                values = ([None] * len(rows) if name is None
                          else [r.get(name) if r is not None else None for r in rows])
            else:
                values = []
                for r, sid in zip(rows, ids, strict=True):
                    name = self._fields[sid][i]
                    values.append(None if r is None or name is None else r.get(name))
            children.append(_column(values, f.type, f.name))
        mask = pa.array([r is None for r in rows], pa.bool_())
        return pa.StructArray.from_arrays(children, fields=list(t), mask=mask)


def _column(values: list[Any], t: pa.DataType, name: str) -> pa.Array:
    if not _inexact(values, t):
        try:
            return pa.array(values, t)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            pass  # another union branch or a logical type Arrow does not take as is
    converted = [convert(v, t, name) for v in values]
    try:
        return pa.array(converted, t)
    except (pa.ArrowException, OverflowError) as exc:  # e.g. 1e30, a whole float, in int64
        raise SchemaError(f"column {name}: a value does not fit {t} ({exc}); use "
                          "valueFormat=json to carry any value") from exc


def _inexact(values: list[Any], t: pa.DataType) -> bool:
    """Whether ``pa.array(values, t)`` might take a value inexactly instead of refusing
    it: pyarrow truncates floats and Decimals into integer columns (0.1 -> 0, a SQLite
    REAL in an INTEGER-affinity column) and decodes bytes into string columns, without
    a word. Such values go through :func:`convert`, which keeps exact ones only."""
    if pa.types.is_integer(t):
        return any(type(v) is not int and v is not None for v in values)
    if pa.types.is_string(t):
        return any(type(v) is not str and v is not None for v in values)
    return False


def _json_row(schema: TableSchema, row: dict[str, Any] | None) -> str | None:
    if row is None:
        return None
    return json.dumps(row_to_json(schema, row), separators=(",", ":"), ensure_ascii=False)
