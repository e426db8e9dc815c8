"""Column include/exclude: which columns of a captured table a source keeps.

One rule for every source (MySQL/MariaDB, PostgreSQL, SQLite), from the source
config's ``include_columns`` and ``exclude_columns`` (regexes, validated there):

* a column's full name is its table's logical source name, a dot, the column's
  name: ``db.table.column`` (MySQL), ``schema.table.column`` (PostgreSQL),
  ``main.table.column`` (SQLite, whose tables are the sources ``main.<table>``).
  A SQLite column also answers to ``table.column``, as its ``tables`` are named:
  a regex may use either name;
* a column is kept when one of its names fully matches a regex of
  ``include_columns`` (an empty list keeps every column) and none matches a
  regex of ``exclude_columns``;
* key columns are always kept, whatever the regexes say: events are keyed by
  them, and consumers, bootstrap stores and server-side filters need the key.

A column left out is absent from the table's schema (the filter is part of a
table version: a table captured with and without it has two versions) and so
from every event of it: inserts, updates (after and before images), deletes,
snapshot rows. Where a source drops the value (decoder, SQL select list) is
each source's business; this module decides which columns, once, for all.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Sequence
from typing import Protocol

from databus.core.errors import ConfigError


class ColumnSettings(Protocol):
    """What a source config gives the filter (every database source's model)."""

    @property
    def include_columns(self) -> Sequence[str]: ...

    @property
    def exclude_columns(self) -> Sequence[str]: ...


def _compile(patterns: Sequence[str]) -> tuple[re.Pattern[str], ...]:
    try:
        return tuple(re.compile(p) for p in patterns)
    except re.error as exc:
        raise ConfigError(f"bad column regex: {exc}") from exc


class ColumnFilter:
    """Compiled ``include_columns`` / ``exclude_columns`` (see the module docstring).
    Immutable: a source that takes new filters while running builds a new one."""

    __slots__ = ("_exclude", "_include")

    def __init__(self, include: Sequence[str] = (), exclude: Sequence[str] = ()) -> None:
        self._include = _compile(include)
        self._exclude = _compile(exclude)

    @classmethod
    def of(cls, config: ColumnSettings) -> ColumnFilter:
        """The filter of a source config."""
        return cls(config.include_columns, config.exclude_columns)

    def __bool__(self) -> bool:
        """Whether any regex is set (an empty filter keeps every column)."""
        return bool(self._include or self._exclude)

    def keeps(self, *names: str) -> bool:
        """Whether a column that is not a key column is kept; ``names``: its full
        name (``<table's source name>.<column>``) and any other it answers to."""
        return ((not self._include
                 or any(p.fullmatch(n) for p in self._include for n in names))
                and not any(p.fullmatch(n) for p in self._exclude for n in names))

    def keep(self, table: str, names: Sequence[str], key_indexes: Collection[int], *,
             alias: str | None = None) -> list[bool]:
        """Per column of ``table`` (its logical source name) in ``names``' order: kept?
        ``key_indexes``: positions of the key columns, always kept; ``alias``: another
        name of the table its columns also answer to (SQLite: the bare table name)."""
        if not self:
            return [True] * len(names)
        if alias is None:
            return [i in key_indexes or self.keeps(f"{table}.{n}")
                    for i, n in enumerate(names)]
        return [i in key_indexes or self.keeps(f"{table}.{n}", f"{alias}.{n}")
                for i, n in enumerate(names)]

    def unmatched(self, full_names: Iterable[str]) -> list[str]:
        """The regexes (include and exclude) that fully match none of ``full_names``:
        most likely misspelt (a column named without its table's namespace), so a
        source that knows its tables at start logs them."""
        names = list(full_names)
        return [p.pattern for p in (*self._include, *self._exclude)
                if not any(p.fullmatch(n) for n in names)]
