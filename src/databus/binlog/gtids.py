"""MySQL GTID sets in their text form: parsed, merged, printed, asked.

A GTID set maps a server UUID to the transaction numbers (GNOs) it holds, as sorted,
disjoint, inclusive intervals; its text form is MySQL's (``uuid:1-5:7,uuid2:1-3``). The
binlog service writes one UUID (its data directory's) and reads sets that replicas send
(``COM_BINLOG_DUMP_GTID``, ``@@gtid_executed``) to find where their dump starts.

Contract: :meth:`GtidSet.parse` accepts MySQL's text (whitespace allowed, empty = the
empty set) and raises :class:`~databus.core.errors.ConfigError` on anything else;
``str()`` gives MySQL's text back (merged, sorted, one UUID a line, as
``@@gtid_executed``). Immutable values, no I/O.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from databus.core.errors import ConfigError

_UUID_RE = re.compile(r"^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?"
                      r"[0-9a-fA-F]{12}$")


@dataclass(frozen=True)
class GtidSet:
    """A MySQL GTID set: per server UUID (lower case, dashed) sorted, disjoint, inclusive
    GNO intervals. ``str()`` is MySQL's text form (``uuid:1-5:7,uuid2:1-3``)."""

    sets: dict[str, tuple[tuple[int, int], ...]] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> GtidSet:
        """Parse MySQL's text form (whitespace and newlines allowed, empty = empty set);
        raises :class:`ConfigError` on malformed text."""
        out: dict[str, list[tuple[int, int]]] = {}
        text = "".join(text.split())
        if not text:
            return cls({})
        for part in text.split(","):
            pieces = part.split(":")
            sid = pieces[0]
            if not _UUID_RE.match(sid) or len(pieces) < 2:
                raise ConfigError(f"malformed GTID set element {part!r}")
            sid = str(uuid.UUID(sid))
            for iv in pieces[1:]:
                try:
                    a, _, b = iv.partition("-")
                    first, last = int(a), int(b) if b else int(a)
                except ValueError:
                    raise ConfigError(f"malformed GTID interval {iv!r}") from None
                if first < 1 or last < first:
                    raise ConfigError(f"malformed GTID interval {iv!r}")
                out.setdefault(sid, []).append((first, last))
        return cls({sid: _merge(ivs) for sid, ivs in out.items()})

    @classmethod
    def single(cls, sid: str, first: int, last: int) -> GtidSet:
        return cls({sid: ((first, last),)} if last >= first else {})

    def intervals(self, sid: str) -> tuple[tuple[int, int], ...]:
        return self.sets.get(sid, ())

    def contains(self, sid: str, gno: int) -> bool:
        """Whether ``sid:gno`` is in the set (a dumper skips such transactions)."""
        return any(a <= gno <= b for a, b in self.sets.get(sid, ()))

    def __str__(self) -> str:
        return ",\n".join(
            sid + ":" + ":".join(str(a) if a == b else f"{a}-{b}" for a, b in ivs)
            for sid, ivs in sorted(self.sets.items()) if ivs)


def _merge(ivs: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(ivs):
        if out and a <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return tuple(out)


def range_text(sid: str, first: int, last: int) -> str:
    """``sid:first-last`` (``sid:first`` for one GNO, ``""`` for none)."""
    if last < first:
        return ""
    return f"{sid}:{first}" if first == last else f"{sid}:{first}-{last}"
