"""The schema history of a SQLite relay: every schema it emitted, kept across runs.

A SQLite source's table versions live in the database (``_databus_versions``),
so a restarted relay rebuilds its schemas from there, unless its
``include_columns``/``exclude_columns`` changed in between: the same table
version then gives another schema (other fields, another id), and the events
the relay buffered before carry the old one. So every schema the source
registers is also recorded in ``<state_dir>/<relay>.sqlite-schemas.json``
(:mod:`databus.sources.common.history`; written only when a schema is new to it), and a source
opening with that file serves the recorded schemas its filters no longer give
as well. They are ordered before the current ones, so each table's latest
schema (what a consumer of an event without a schema, or a bootstrap, is
given) stays the current one. Without a state directory nothing is recorded:
the relay's buffer is in memory and starts empty.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from databus.core.schema import SchemaRegistry, TableSchema
from databus.sources.common.history import HistoryFile, all_schemas


class SchemaHistory:
    """One relay's recorded schemas (see the module docstring); ``path`` None: off."""

    def __init__(self, path: Path | None) -> None:
        self.file = HistoryFile(path)
        self._recorded: set[bytes] = set()
        self._started = False

    def start(self, current: SchemaRegistry, sources: Collection[int]) -> SchemaRegistry:
        """The registry to serve: ``current`` (the schemas the source gives now), after
        the recorded schemas of ``sources`` it does not hold; recorded at once."""
        saved = self._load()
        ids = {s.id for s in all_schemas(current)}
        past = [s for s in saved if s.id not in ids and s.src_id in sources]
        registry = current
        if past:
            registry = SchemaRegistry(past)
            for s in all_schemas(current):
                registry.add(s)
        self._started = True
        self.record(registry)
        return registry

    def _load(self) -> list[TableSchema]:
        schemas = self.file.load()
        self._recorded = {s.id for s in schemas}
        return schemas

    def record(self, registry: SchemaRegistry) -> None:
        """Write ``registry`` (which holds every recorded schema: :meth:`start` made it)
        when it has a schema not recorded yet; nothing before :meth:`start`."""
        if self.file.path is None or not self._started:
            return
        ids = {s.id for s in all_schemas(registry)}
        if not ids <= self._recorded:
            self.file.write(registry)
            self._recorded |= ids
