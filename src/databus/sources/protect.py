"""Column protection: mask, truncate or hash chosen columns before an event is stored.

The relay's capture thread passes every window through :meth:`Protector.window`
before it reaches the buffer, so no buffer file, consumer, bootstrap store fed by
the relay or snapshot served by it ever holds the clear value (streamed changes
and snapshot reads alike: both arrive as windows).

Rules (``source.columns`` in the relay config) name a table by regex on
``db.table`` and a column by name, with exactly one action:

* ``mask: "***"``: the value becomes that string;
* ``truncate: N``: the first N characters;
* ``hash: {salt: S}``: the lowercase hex SHA-256 (or ``algorithm: sha512``) of
  the UTF-8 bytes of S followed by the UTF-8 bytes of the value, so equal values
  stay equal (joins still work) without being readable.

NULL stays NULL. Only string columns can be protected (for SQLite, whose columns
take any type, a number or blob in a protected column is protected as its text, a
blob as hex), and never a key column
(a masked key would merge rows); a rule whose table matches a schema that lacks
the column, or has it as another type or as a key, stops capture with a
ConfigError when that schema is first seen, instead of storing clear values.

Cost: windows without a protected table are passed on untouched (the same bytes);
events of protected tables are decoded, rewritten and encoded again.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from typing import Any

from databus.core import event as ev
from databus.core.errors import ConfigError
from databus.core.schema import SchemaRegistry, TableSchema
from databus.core.window import Window
from databus.sources.config import ColumnRule

Action = Callable[[str], str]
_KEEP = ev.ATTR_OPCODE_MASK | ev.ATTR_KEY_BYTES | ev.ATTR_HAS_METADATA


def _action(rule: ColumnRule) -> Action:
    if rule.mask is not None:
        fixed = rule.mask
        return lambda _v: fixed
    if rule.truncate is not None:
        n = rule.truncate
        return lambda v: v[:n]
    assert rule.hash is not None
    salt, algorithm = rule.hash.salt.encode("utf-8"), rule.hash.algorithm
    return lambda v: hashlib.new(algorithm, salt + v.encode("utf-8", "surrogatepass")).hexdigest()


def _is_string(avro_type: Any) -> bool:
    if isinstance(avro_type, list):  # SQLite's columns: any of null, string, long, ...
        return any(_is_string(t) for t in avro_type if t != "null")
    if isinstance(avro_type, dict):
        return avro_type.get("type") == "string" and "logicalType" not in avro_type
    return bool(avro_type == "string")


class Protector:
    """Applies column rules to windows (one capture thread; not thread-safe)."""

    def __init__(self, rules: Sequence[ColumnRule]) -> None:
        self.rules = [(re.compile(r.table), r.column, _action(r), r) for r in rules]
        self._plans: dict[bytes, list[tuple[str, Action]] | None] = {}
        self._candidates: dict[int, bool] = {}  # source id -> a rule names its table

    def __bool__(self) -> bool:
        return bool(self.rules)

    def _plan(self, schema: TableSchema) -> list[tuple[str, Action]] | None:
        plan = self._plans.get(schema.id)
        if plan is not None or schema.id in self._plans:
            return plan
        fields = {f.get("column", f["name"]): f for f in schema.avro["fields"]}
        steps: list[tuple[str, Action]] = []
        for table_re, column, action, rule in self.rules:
            if not table_re.fullmatch(schema.name):
                continue
            where = f"column rule {rule.table!r}/{column!r} on {schema.name} v{schema.version}"
            field = fields.get(column)
            if field is None:
                raise ConfigError(f"{where}: the table has no column {column!r}"
                                  f" (columns: {sorted(fields)})")
            if column in schema.key_columns:
                raise ConfigError(f"{where}: {column!r} is part of the key; a protected key"
                                  " would merge rows")
            if not _is_string(field["type"]):
                raise ConfigError(f"{where}: only string columns can be protected, this one"
                                  f" is {field['type']!r}")
            steps.append((field["name"], action))
        plan = steps or None
        self._plans[schema.id] = plan
        return plan

    def _candidate(self, src: int, registry: SchemaRegistry) -> bool:
        known = self._candidates.get(src)
        if known is None:
            name = registry.latest(src).name
            known = any(table_re.fullmatch(name) for table_re, *_ in self.rules)
            self._candidates[src] = known
        return known

    def window(self, w: Window, registry: SchemaRegistry) -> Window:
        """``w`` with the protected columns of its events rewritten (``w`` itself when
        none of its events belongs to a protected table)."""
        data = w.events
        mv = memoryview(data)
        off, end = 0, len(data)
        touched = False
        while off < end:
            src = ev.peek_src_id(data, off)
            if src >= 0 and self._candidate(src, registry):
                touched = True
                break
            off += ev.peek_length(data, off)
        if not touched:
            return w
        out: list[bytes | memoryview] = []
        off = 0
        while off < end:
            size = ev.peek_length(data, off)
            src = ev.peek_src_id(data, off)
            if src < 0 or not self._candidate(src, registry):
                out.append(mv[off:off + size])
            else:
                out.append(self._event(ev.decode(data, off, verify=False), registry,
                                       mv[off:off + size]))
            off += size
        return Window(w.scn, b"".join(out), w.count, w.timestamp_ns)

    def _event(self, e: ev.Event, registry: SchemaRegistry,
               raw: memoryview) -> bytes | memoryview:
        schema = registry.get(e.schema_id)
        plan = self._plan(schema)
        if plan is None:
            return raw
        payload = self._row(schema, e.payload, plan) if e.payload else e.payload
        metadata = e.metadata
        if metadata is not None:
            meta = registry.metadata.decode(metadata)
            if meta.get("before") is not None:
                meta["before"] = self._row(schema, meta["before"], plan)
                metadata = registry.metadata.encode(meta)
        return ev.encode(scn=e.scn, src_id=e.src_id, key=e.key, payload=payload,
                         schema_id=e.schema_id, schema_version=e.schema_version, op=e.op,
                         timestamp_ns=e.timestamp_ns, partition=e.partition,
                         metadata=metadata, metadata_schema_id=e.metadata_schema_id,
                         extra_attributes=e.attributes & ~_KEEP)

    @staticmethod
    def _row(schema: TableSchema, data: bytes, plan: list[tuple[str, Action]]) -> bytes:
        row = schema.decode(data)
        for name, action in plan:
            value = row.get(name)
            if value is None:
                continue
            if not isinstance(value, str):  # a number or blob in a SQLite TEXT column
                value = value.hex() if isinstance(value, bytes) else str(value)
            row[name] = action(value)
        return schema.encode(row)
