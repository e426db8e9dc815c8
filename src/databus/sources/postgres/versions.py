"""The table versions one PostgreSQL source knows, and its schema history.

Contract:

* A **version** is one shape of one table as a Relation message describes it (column
  names, type oids and modifiers, flags, replica identity): its schema holds the kept
  columns only (``include_columns``/``exclude_columns``, :mod:`databus.sources.columns`;
  key columns always kept), typed as :mod:`.types` says; its key is the primary key,
  else the replica identity's index columns, else none (rows keyed by their index in
  the window).
* **Numbers** count a table's distinct schemas in the order they are met (1, 2, ...); a
  shape whose schema and key are already known (from the history, or another shape
  that projects to the same columns) takes that version's number and id.
* **History**: every new version is written at once to
  ``<state_dir>/<relay>.postgres-schemas.json`` (:mod:`databus.sources.common.history`)
  and loaded by :meth:`Versions.load`, so numbers and ids survive restarts and a
  restarted relay serves the schemas of the events it holds.

Threading: the capture thread adds versions; server threads read :attr:`registry` and
:meth:`Versions.sources`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from databus.core.schema import SchemaRegistry, TableSchema
from databus.sources.base import SourceInfo
from databus.sources.columns import ColumnFilter
from databus.sources.common.history import HistoryFile
from databus.sources.postgres import pgoutput as po
from databus.sources.postgres.connection import SqlSession
from databus.sources.postgres.types import TableVersion, version_schema

log = logging.getLogger("databus.sources.postgres")


class Versions:
    """Versions by relation shape, the registry the relay serves (module docstring)."""

    def __init__(self, history: Path | None, columns: ColumnFilter) -> None:
        self.history = HistoryFile(history)
        self.columns = columns
        self.registry = SchemaRegistry()
        self._by_src: dict[int, SourceInfo] = {}
        self._versions: dict[tuple[Any, ...], TableVersion] = {}  # by relation shape

    def sources(self) -> list[SourceInfo]:
        return sorted(self._by_src.values(), key=lambda s: s.id)

    def load(self) -> None:
        """The history file's versions (nothing when there is none)."""
        for s in self.history.load():
            self.add(s, save=False)

    def add(self, schema: TableSchema, *, save: bool = True) -> None:
        """A version joins the registry (and the history file when ``save``)."""
        self.registry.add(schema)
        self._by_src[schema.src_id] = SourceInfo(schema.src_id, schema.name)
        if save:
            self.history.write(self.registry)

    def of(self, msg: po.Relation, sql: SqlSession) -> TableVersion:
        """The version of a relation's shape, made (with two catalog queries on ``sql``)
        and recorded when new."""
        sig = (msg.namespace, msg.name, msg.replica_identity,
               tuple((c.name, c.type_oid, c.typmod, c.flags) for c in msg.columns))
        version = self._versions.get(sig)
        if version is None:
            version = self._versions[sig] = self._new(msg, sql)
        return version

    def _new(self, msg: po.Relation, sql: SqlSession) -> TableVersion:
        names = [c.name for c in msg.columns]
        oids = [c.type_oid for c in msg.columns]
        rows = sql.query(
            "SELECT format_type(t.oid, NULLIF(t.mod, -1)) FROM unnest(%s::oid[], %s::int[])"
            " WITH ORDINALITY AS t(oid, mod, n) ORDER BY t.n",
            (oids, [c.typmod for c in msg.columns]))
        sql_types = [str(r[0]) for r in rows]
        pk = [str(r[0]) for r in sql.query(
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid"
            " AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s AND i.indisprimary"
            " ORDER BY array_position(i.indkey, a.attnum)", (msg.oid,))]
        if pk and all(k in names for k in pk):
            keys = pk
        elif msg.replica_identity in ("d", "i"):
            keys = [c.name for c in msg.columns if c.in_identity]
        else:
            keys = []
        # include/exclude_columns: the version holds the kept columns only
        keep = self.columns.keep(f"{msg.namespace}.{msg.name}", names,
                                 {names.index(k) for k in keys})
        wire = None if all(keep) else tuple(i for i, k in enumerate(keep) if k)
        if wire is not None:
            names = [names[i] for i in wire]
            oids = [oids[i] for i in wire]
            sql_types = [sql_types[i] for i in wire]
        probe = version_schema(msg.namespace, msg.name, names, oids, sql_types, keys, 0)
        src = probe.src_id
        known = self.registry.versions(src) if src in self.registry.source_ids() else []
        schema = next((s for s in known if s.id == probe.id and s.key_columns == tuple(keys)),
                      None)
        if schema is None:
            number = max((s.version for s in known), default=0) + 1
            schema = version_schema(msg.namespace, msg.name, names, oids, sql_types, keys,
                                    number)
            self.add(schema)
            log.info("table %s.%s: version %d (%d columns%s)", msg.namespace, msg.name,
                     number, len(names), "" if wire is None else
                     f" of {len(msg.columns)}: include/exclude_columns")
        return TableVersion(schema, oids, [names.index(k) for k in keys], wire,
                            len(msg.columns))
