"""The schema history file a source keeps in its state directory.

Contract: the file (``<state_dir>/<relay>.<kind>-schemas.json``) holds a
:class:`~databus.core.schema.SchemaRegistry` as JSON, replaced atomically on every
write (:func:`~databus.core.atomic.write_atomic`); a missing file is an empty
history; one that cannot be read or parsed is a
:class:`~databus.core.errors.SchemaError` naming it (never silently a fresh start:
the events the relay holds need those schemas). Without a path (no state directory)
nothing is read or written. What goes in, and when, is each source's business
(MySQL :mod:`databus.sources.mysql.versions`, PostgreSQL
:mod:`databus.sources.postgres.versions`, SQLite :mod:`databus.sources.txlog.history`).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from databus.core.atomic import write_atomic
from databus.core.errors import SchemaError
from databus.core.schema import SchemaRegistry, TableSchema


class HistoryFile:
    """One schema history file (``path`` None: none is kept)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path

    def load(self) -> list[TableSchema]:
        """Every recorded schema, each table's versions in order (nothing without a file)."""
        if self.path is None or not self.path.exists():
            return []
        try:
            saved = SchemaRegistry.from_json(self.path.read_bytes())
        except (OSError, SchemaError) as exc:
            raise SchemaError(f"schema history {self.path} is unreadable: {exc}") from exc
        return list(all_schemas(saved))

    def write(self, registry: SchemaRegistry) -> None:
        """Replace the file with ``registry`` (nothing without a path)."""
        if self.path is not None:
            write_atomic(self.path, registry.to_json().encode())


def all_schemas(registry: SchemaRegistry) -> Iterable[TableSchema]:
    """Every schema of ``registry``, by source id, each source's versions in order."""
    for src in registry.source_ids():
        yield from registry.versions(src)
