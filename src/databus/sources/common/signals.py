"""Signals: rows of the signal table that steer incremental snapshots, the same
contract for every server source (MySQL/MariaDB, PostgreSQL).

The signal table (``signal_table``, default ``databus.signals``) has the columns
``id`` (varchar 64, the key), ``type`` (varchar 32) and ``data`` (text, a JSON
object). Its rows are never captured as data: the source meets them in its log, in
commit order, and hands them to the snapshot coordinator (:mod:`.incremental`).
Kinds sent from outside (:data:`KINDS`): ``execute-snapshot`` (``{"data-collections":
[regex, ...], "additional-conditions": [{"data-collection": "db.t", "filter":
"SQL"}], "surrogate-key": "column"}``), ``stop-snapshot``, ``pause-snapshot``,
``resume-snapshot``. Kinds the coordinator writes itself (:data:`MARKS`): the low and
high watermarks of a chunk and a marker that carries notices.

:func:`send` is what ``Source.signal`` does, for every source alike:

* an unknown kind, or an ``execute-snapshot`` whose ``data-collections`` is not a
  non-empty list of regexes each matching a captured table that exists, or whose
  ``additional-conditions`` do not parse against their table's columns
  (:mod:`.sqlfilter`), is an :class:`~databus.core.errors.InvalidRequestError` and
  nothing is written;
* the row is inserted on a connection of its own (thread-safe: the capture thread
  meets it in the log), with the conditions re-emitted from their parse tree;
* a database that refuses the statement (the table missing, no right to insert:
  :class:`~databus.core.errors.StatementError` or
  :class:`~databus.core.errors.ConfigError`) is an ``InvalidRequestError`` naming the
  table (the caller can fix it); a database that cannot be reached stays a
  :class:`~databus.core.errors.SourceUnavailableError` (transient: try again).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from databus.core.errors import ConfigError, InvalidRequestError, StatementError
from databus.sources.common.sqlfilter import checked_conditions

OPEN, CLOSE, NOTIFY = "snapshot-window-open", "snapshot-window-close", "snapshot-notify"
MARKS = (OPEN, CLOSE, NOTIFY)
"""Rows the snapshot coordinator writes itself."""

EXECUTE, STOP, PAUSE, RESUME = ("execute-snapshot", "stop-snapshot", "pause-snapshot",
                                "resume-snapshot")
KINDS = (EXECUTE, STOP, PAUSE, RESUME)
"""Signals sent from outside."""

Signal = tuple[str, str, str | None]
"""A signal-table row as the log shows it: (id, type, data)."""


class SignalTable(Protocol):
    """What :func:`send` needs from a source's database, on one session."""

    def tables(self) -> list[str]:
        """Captured tables that exist now, ``db.table``."""
        ...

    def write_watermark(self, wid: str, kind: str, data: str) -> None:
        """Insert one signal-table row (autocommit)."""
        ...


def send(kind: str, data: dict[str, Any] | None, table: SignalTable, *, name: str,
         close: Callable[[], None], wanted: Callable[[str], bool],
         columns: Callable[[str, str], list[str]], dialect: str = "mysql",
         qualifier: str = "db") -> str:
    """Insert the signal ``kind`` with ``data`` into the signal table ``name`` through
    ``table`` (on a session of its own, which ``close`` ends, whatever happens); its id
    (module docstring). ``wanted``, ``columns``, ``dialect``, ``qualifier``: how
    ``additional-conditions`` are checked (:func:`.sqlfilter.checked_conditions`)."""
    try:
        if kind not in KINDS:
            raise InvalidRequestError(f"unknown signal {kind!r}; one of {', '.join(KINDS)}")
        sid = uuid.uuid4().hex
        if kind == EXECUTE:
            # refused here (400, nothing written) rather than an ERROR notice later
            matched_tables(data, table.tables())
            # filters parsed against their table's columns and re-emitted from the parse
            # tree: the stored signal row only ever holds SQL generated there
            data = checked_conditions(data or {}, wanted=wanted, columns=columns,
                                      dialect=dialect, qualifier=qualifier)
        table.write_watermark(sid, kind, json.dumps(data or {}))
    except (StatementError, ConfigError) as exc:
        raise InvalidRequestError(f"cannot write to {name}: {exc}") from exc
    finally:
        close()
    return sid


def matched_tables(data: dict[str, Any] | None, tables: Sequence[str]) -> list[str]:
    """The tables of ``tables`` (captured tables that exist now) an ``execute-snapshot``
    signal's ``data-collections`` names; :class:`InvalidRequestError` when it is not a
    non-empty list of regexes (matched whole, on ``db.table``) each naming at least one
    of them. Checked when a signal is sent (a 400 answer, nothing written) and again
    when it commits (tables may have gone in between: then an ERROR notice)."""
    patterns = (data or {}).get("data-collections")
    if not isinstance(patterns, list) or not patterns \
            or not all(isinstance(p, str) for p in patterns):
        raise InvalidRequestError(
            "execute-snapshot needs data-collections: a non-empty list of regexes on the"
            " captured tables' names")
    try:
        regexes = [re.compile(p) for p in patterns]
    except re.error as exc:
        raise InvalidRequestError(f"data-collections: bad regex: {exc}") from exc
    unknown = [p for p, r in zip(patterns, regexes, strict=True)
               if not any(r.fullmatch(t) for t in tables)]
    if unknown:
        names = ", ".join(f"'{u}'" for u in unknown)
        raise InvalidRequestError(
            f"execute-snapshot: no captured table matches {names} (regexes matched whole on"
            " the names of existing captured tables)")
    return [t for t in tables if any(r.fullmatch(t) for r in regexes)]
