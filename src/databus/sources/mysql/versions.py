"""The table versions one MySQL source knows, and its schema history.

Contract:

* A **version** is one Avro schema of one table (columns after the column filters,
  their Avro and declared types, the key); its id is the schema's digest, its number
  counts that table's shapes in the order the stream meets them (1, 2, ...).
* **History**: with a history path, every version the stream has used is written there
  (:mod:`databus.sources.common.history`) when it is added and loaded by
  :meth:`Versions.load`, so numbers and ids
  survive restarts and a restarted relay serves the schemas of the events it holds.
  Versions another relay published (a cluster's former leader) join it through
  :meth:`Versions.adopt`.
* **Listed versions**: :meth:`Versions.list_tables` gives each captured table with no
  version yet the one information_schema describes now, so the relay names it in
  ``/sources`` and ``/register`` before its first change. Such a version is
  *provisional* until the stream meets it (then it is the table's version like any
  other) or :meth:`Versions.confirm_listed` says the dump starts at the binlog's end
  (where the table is as it was described). A shape the stream meets first for a table
  whose only versions are provisional ones replaces them (it takes their number: an
  older shape replayed from the binlog never gets a higher number than the current
  one), and :meth:`Versions.adopt` drops them before it adds what a cluster published.
  Provisional versions never reach the history file; no event was ever encoded with
  one that was dropped.

Threading: the capture thread adds; server threads read :attr:`Versions.registry` and
:meth:`Versions.sources` (the registry and the source list are replaced whole when a
provisional version is dropped, never changed under a reader).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from pathlib import Path

from databus.core.errors import SchemaError
from databus.core.schema import (
    ColumnSpec,
    MetadataCodec,
    SchemaRegistry,
    TableSchema,
    table_schema,
)
from databus.sources.base import SourceInfo
from databus.sources.common.history import HistoryFile, all_schemas
from databus.sources.common.names import source_id
from databus.sources.mysql import rows as br
from databus.sources.mysql.tables import Shape, Version, avro_type, declared_type

log = logging.getLogger("databus.sources.mysql")


class Versions:
    """Versions by id, shapes by table map, the registry the relay serves (see the
    module doc). ``compiled``: shapes get the C codec where it applies."""

    def __init__(self, history: Path | None, compiled: bool) -> None:
        self.history = HistoryFile(history)
        self.compiled = compiled
        self.registry = SchemaRegistry()
        self._versions: dict[bytes, Version] = {}  # by schema id
        self._shapes: dict[bytes, Shape] = {}  # by table map body (without table id)
        self._by_src: dict[int, SourceInfo] = {}
        self._listed: set[bytes] = set()  # ids of provisional versions (list_tables)

    def sources(self) -> list[SourceInfo]:
        return sorted(self._by_src.values(), key=lambda s: s.id)

    def internal(self, schema: TableSchema) -> None:
        """A logical source of the source's own (schema changes, notifications)."""
        self.registry.add(schema)
        self._by_src[schema.src_id] = SourceInfo(schema.src_id, schema.name)

    def load(self) -> None:
        """The history file's versions (nothing when there is none)."""
        for s in self.history.load():
            self._add(s, save=False)

    def adopt(self, registry: SchemaRegistry) -> None:
        """Versions a former leader published join the history (numbering and ids
        continue after a failover); provisional versions go first, so none collides
        with a published number."""
        self._drop(set(self._listed))
        for s in all_schemas(registry):
            if s.id not in self._versions:
                self._add(s)

    def forget_shapes(self) -> None:
        """Column filters changed: shapes are built again (versions stay)."""
        self._shapes.clear()

    def shape(self, key: bytes, td: br.TableDef, keep: Callable[[br.TableDef], list[bool]],
              *, listing: bool = False) -> Shape:
        """The shape of a table map (``key``: its body without the table id, or another
        signature of the definition) with the column filters ``keep(td)`` (asked only for
        a shape not met before: it is on the path of every rows event), and its version:
        an existing one with the same schema, else a new number. ``listing``: a
        provisional version for :meth:`list_tables`."""
        shape = self._shapes.get(key)
        if shape is not None:
            if self._listed and not listing and shape.version.schema.id in self._listed:
                self._confirm({shape.version.schema.id})
            return shape
        return self._new_shape(key, td, keep(td), listing)

    def _new_shape(self, key: bytes, td: br.TableDef, keep: list[bool], listing: bool
                   ) -> Shape:
        name = f"{td.schema}.{td.table}"
        src = source_id(name)
        names = td.names or [f"col{i}" for i in range(len(td.types))]
        specs = [ColumnSpec(n, avro_type(td, i), nullable=True, sql_type=declared_type(td, i))
                 for i, n in enumerate(names) if keep[i]]
        keys = tuple(names[i] for i in td.primary_key)
        avro = table_schema(td.schema, td.table, specs)
        probe = TableSchema(src, name, 0, avro, keys)
        # a version recorded before fields carried their declared type (sql_type) is the
        # same table version: it is kept, with its id (schema histories stay valid)
        legacy = TableSchema(src, name, 0, table_schema(
            td.schema, td.table, [ColumnSpec(c.name, c.avro_type, c.nullable) for c in specs]),
            keys)
        known = self._known(src)
        version = next((self._versions[s.id] for s in known
                        if s.id == probe.id and s.key_columns == keys), None) or next(
            (self._versions[s.id] for s in known
             if s.id == legacy.id and s.key_columns == keys), None)
        if version is not None and not listing and version.schema.id in self._listed:
            self._confirm({version.schema.id})
        if version is None:
            if not listing:
                # the stream's first shape of a table known only from information_schema:
                # the described one may be newer (a replay), so it leaves the numbering
                self._drop({s.id for s in known if s.id in self._listed})
                known = self._known(src)
            number = max((s.version for s in known), default=0) + 1
            version = self._add(TableSchema(src, name, number, avro, keys), save=not listing)
            if listing:
                self._listed.add(version.schema.id)
        shape = Shape(td, version, keep, MetadataCodec.ID, self.compiled)
        self._shapes[key] = shape
        return shape

    def list_tables(self, defs: Iterable[tuple[str, br.TableDef | SchemaError]],
                    keep: Callable[[br.TableDef], list[bool]]) -> None:
        """Provisional versions for tables with none yet, from their information_schema
        definitions (see the module doc); a table that could not be described is listed
        from its first change on."""
        known = set(self.registry.source_ids())
        for name, td in defs:
            if source_id(name) in known:
                continue
            if isinstance(td, SchemaError):
                log.info("%s is listed from its first change on: %s", name, td)
                continue
            self.shape(signature(td), td, keep, listing=True)

    def confirm_listed(self) -> None:
        """The dump starts at the binlog's end: the tables are as they were described,
        so their listed versions are theirs (and written to the history)."""
        self._confirm(set(self._listed))

    # -- internals -----------------------------------------------------------------

    def _known(self, src: int) -> list[TableSchema]:
        reg = self.registry
        return reg.versions(src) if src in reg.source_ids() else []

    def _add(self, schema: TableSchema, *, save: bool = True) -> Version:
        version = Version(schema)
        self._versions[schema.id] = version
        self.registry.add(schema)
        self._by_src[schema.src_id] = SourceInfo(schema.src_id, schema.name)
        if save:
            self._save()
        return version

    def _confirm(self, ids: set[bytes]) -> None:
        if ids & self._listed:
            self._listed -= ids
            self._save()

    def _drop(self, ids: set[bytes]) -> None:
        """Provisional versions ``ids`` leave: registry, sources and shapes replaced whole."""
        if not ids:
            return
        self._listed -= ids
        reg = self.registry
        kept = [s for s in all_schemas(reg) if s.id not in ids]
        self.registry = SchemaRegistry(kept)
        for i in ids:
            self._versions.pop(i, None)
        self._shapes = {k: v for k, v in self._shapes.items()
                        if v.version.schema.id not in ids}
        self._by_src = {s.src_id: SourceInfo(s.src_id, s.name) for s in kept}

    def _save(self) -> None:
        if self.history.path is None:
            return
        reg = self.registry
        if self._listed:  # provisional versions stay out of the history
            reg = SchemaRegistry([s for s in all_schemas(reg) if s.id not in self._listed])
        self.history.write(reg)


def signature(td: br.TableDef) -> bytes:
    """The shape key of a table described by information_schema (snapshots, listing)."""
    return json.dumps(["information_schema", td.schema, td.table, td.names, td.real_types,
                       td.meta, td.unsigned, td.codecs, td.primary_key,
                       sorted(td.enum_values.items()),
                       sorted(td.set_values.items())]).encode()
