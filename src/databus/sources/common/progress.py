"""Snapshot progress records kept beside the relay state, shared by the sources.

A source that snapshots records, with the SCN of every window that moved the
snapshot on, the snapshot's state after that window (any JSON-serialisable
dict; ``None`` = no snapshot running). A relay restarted after SCN ``S`` asks
for the state :meth:`ProgressRecords.at` ``S``: the newest record at or before
it, i.e. the state after the last window its buffer holds. Decimals, dates,
datetimes, timedeltas and bytes survive the JSON round trip.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from databus.core.atomic import write_atomic
from databus.core.errors import SchemaError

_RECORDS = 64  # progress records kept: the relay restarts at one of its recent SCNs


def _to_json(v: Any) -> Any:
    if isinstance(v, decimal.Decimal):
        return {"decimal": str(v)}
    if isinstance(v, dt.datetime):
        return {"datetime": v.isoformat()}
    if isinstance(v, dt.date):
        return {"date": v.isoformat()}
    if isinstance(v, dt.timedelta):
        return {"micros": v // dt.timedelta(microseconds=1)}
    if isinstance(v, bytes):
        return {"hex": v.hex()}
    if isinstance(v, list):
        return [_to_json(x) for x in v]
    if isinstance(v, dict):
        return {k: _to_json(x) for k, x in v.items()}
    return v


def _from_json(v: Any) -> Any:
    if isinstance(v, list):
        return [_from_json(x) for x in v]
    if isinstance(v, dict):
        if len(v) == 1:
            (tag, x), = v.items()
            conv: dict[str, Callable[[Any], Any]] = {
                "decimal": decimal.Decimal, "datetime": dt.datetime.fromisoformat,
                "date": dt.date.fromisoformat, "hex": bytes.fromhex,
                "micros": lambda m: dt.timedelta(microseconds=m)}
            if tag in conv:
                return conv[tag](x)
        return {k: _from_json(x) for k, x in v.items()}
    return v


class ProgressRecords:
    """(SCN, snapshot state) pairs, newest last; in a file when ``path`` is set.

    ``keep``: records kept by :meth:`add` (the relay is expected to restart at
    one of its recent SCNs). ``None``: :meth:`add` keeps every record and the
    owner drops those no restart needs with :meth:`forget_before`.
    """

    def __init__(self, path: Path | None, keep: int | None = _RECORDS) -> None:
        self.path = path
        self.keep = keep
        self.records: list[tuple[int, dict[str, Any] | None]] = []
        if path is not None and path.exists():
            try:
                raw = json.loads(path.read_text(encoding="utf-8"))
                self.records = [(int(s), _from_json(st)) for s, st in raw["records"]]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise SchemaError(f"snapshot progress {path} is unreadable: {exc}") from exc

    def add(self, scn: int, state: dict[str, Any] | None) -> None:
        self.records = [r for r in self.records if r[0] < scn]
        if self.keep is not None:
            self.records = self.records[-(self.keep - 1):] if self.keep > 1 else []
        self.records.append((scn, state))
        self._save()

    def forget_before(self, scn: int, *, keep_last: int = _RECORDS) -> None:
        """Drop the records older than the newest one at or before ``scn`` (a
        restart never goes back before ``scn``), keeping at least the
        ``keep_last`` newest ones."""
        older = sum(1 for s, _ in self.records if s <= scn) - 1
        cut = min(older, len(self.records) - keep_last)
        if cut > 0:
            self.records = self.records[cut:]
            self._save()

    def at(self, scn: int) -> dict[str, Any] | None:
        """The state as of ``scn``: the newest record at or before it."""
        found = [st for s, st in self.records if s <= scn]
        return found[-1] if found else None

    def _save(self) -> None:
        if self.path is not None:
            body = {"records": [[s, _to_json(st)] for s, st in self.records]}
            write_atomic(self.path, json.dumps(body).encode())
