"""Which tables a server source captures: regexes on a table's logical name.

Contract (MySQL/MariaDB and PostgreSQL sources, from ``tables`` and
``exclude_tables`` of their config):

* a table is captured when its name (``db.table``, ``schema.table``) fully matches a
  regex of ``tables`` (none given: every table) and none of ``exclude_tables``;
* the signal table is never a captured table: its rows are signals and watermarks;
* a regex that does not compile is a :class:`~databus.core.errors.ConfigError` when
  the filter is built (before any connection);
* answers are cached per name (the check is on every rows event's path); the cache is
  bounded, since tables come and go.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from databus.core.errors import ConfigError

_CACHED = 4096  # names remembered before the cache starts again


def regexes(patterns: Sequence[str], what: str = "table") -> list[re.Pattern[str]]:
    """``patterns`` compiled; :class:`ConfigError` naming the bad one."""
    try:
        return [re.compile(p) for p in patterns]
    except re.error as exc:
        raise ConfigError(f"bad {what} regex: {exc}") from exc


class TableFilter:
    """The captured tables of one source (module docstring); call it with a name."""

    def __init__(self, tables: Sequence[str], exclude: Sequence[str],
                 signal_table: str | None = None) -> None:
        self.include = regexes(list(tables) or [".*"])
        self.exclude = regexes(exclude)
        self.signal_table = signal_table
        self._known: dict[str, bool] = {}

    def __call__(self, name: str) -> bool:
        known = self._known.get(name)
        if known is not None:
            return known
        wanted = (name != self.signal_table
                  and any(p.fullmatch(name) for p in self.include)
                  and not any(p.fullmatch(name) for p in self.exclude))
        if len(self._known) >= _CACHED:
            self._known = {}  # a new dict: another thread may be reading the old one
        self._known[name] = wanted
        return wanted

    def none_match(self, example: str = "db.table', e.g. 'shop\\..*") -> str:
        """The one line that says this filter matches no existing table."""
        less = (f" less exclude_tables {[p.pattern for p in self.exclude]}"
                if self.exclude else "")
        return (f"no table matches tables {[p.pattern for p in self.include]}{less}"
                f" (regexes matched whole on '{example}')")
