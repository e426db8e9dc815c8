"""Whose binlog a MariaDB/MySQL relay's position is, checked before it resumes there.

An SCN is a file number and an offset in one server's binlog. Another server (a
promoted replica, a primary behind a failover address) has the same transactions at
other files and offsets, or other transactions at the same ones: resuming there at
the old file and offset would skip, repeat or misread changes without a word.

**The record.** With a ``state_dir`` the source keeps ``<name>.mysql-position.json``:
the server it reads (its origin, :meth:`MysqlSource.origin`) and pairs ``(scn, gtid)``:
a window's SCN and the GTID of the last transaction read at or before it, written at
most once a second while windows flow and when the source closes (the newest
:data:`KEEP`: a relay's recorded position may lag the newest window it read).

**The check** (:meth:`PositionRecord.check`), before a dump resumes at ``after_scn``:
when the server's origin is the recorded one, nothing (the same server). When it
differs (a server restarted with a new ``server_id``, a replica promoted, another
server behind the same address), the newest pair at or before ``after_scn`` is asked
of that server: MariaDB's ``BINLOG_GTID_POS(file, offset)`` there must contain the
recorded GTID, which only the same binlog does; then capture resumes and the record
takes the new origin. Otherwise (or on MySQL, whose server_uuid changes only with the
server) the position is another server's: :class:`SourcePositionLostError` naming
both servers, the GTID the relay last recorded and the recovery (a new relay with
``source.start_gtid`` after that GTID, consumers bootstrapping). Not even
``snapshot_mode: when_needed`` streams on from there: the other server's SCNs need not
be above the ones the relay holds. Without a record (no ``state_dir``, a state written before this
check) nothing is checked, as before.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from databus.core.atomic import write_atomic
from databus.core.errors import DatabusError, SourcePositionLostError
from databus.sources.mysql.connection import SqlSession

log = logging.getLogger("databus.sources.mysql")

def binlog_scn(file: str, pos: int) -> int:
    """The SCN of a binlog position: the file's number above, the offset below."""
    return (int(file.rsplit(".", 1)[1]) << 32) | pos


KEEP = 32  # pairs kept: one a second, so the newest half a minute of positions
EVERY = 1.0  # seconds between writes while windows flow


class PositionRecord:
    """See the module docstring. ``path`` None: nothing kept, nothing checked."""

    def __init__(self, state_dir: Path | None, name: str) -> None:
        self.path = path = state_dir / f"{name}.mysql-position.json" if state_dir else None
        self._origin = ""
        self._pairs: list[tuple[int, str]] = []
        self._gtid: str | None = None  # the last GTID read
        self._newest: tuple[int, str] | None = None  # not yet written
        self._written_at = 0.0
        if path is not None and path.exists():
            try:
                data = json.loads(path.read_text())
                self._origin = str(data["origin"])
                self._pairs = [(int(s), str(g)) for s, g in data["at"]][-KEEP:]
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("%s unreadable (%s): the server is not checked at this start",
                            path, exc)

    def gtid_read(self, gtid: str) -> None:
        """A transaction's GTID event was read."""
        self._gtid = gtid

    def window(self, scn: int, origin: str) -> None:
        """A window at ``scn`` leaves the source (read from ``origin``)."""
        if self.path is None or self._gtid is None:
            return
        self._origin = origin
        self._newest = (scn, self._gtid)
        if time.monotonic() - self._written_at >= EVERY:
            self.flush()

    def flush(self) -> None:
        """Write the newest pair (the source closes, or a second passed)."""
        if self.path is None or self._newest is None:
            return
        if not self._pairs or self._pairs[-1] != self._newest:
            self._pairs = [*self._pairs, self._newest][-KEEP:]
        self._newest = None
        self._written_at = time.monotonic()
        write_atomic(self.path, json.dumps({"origin": self._origin,
                                            "at": self._pairs}).encode())

    def close(self) -> None:
        """:meth:`flush`, never raising: the pairs written before stay."""
        try:
            self.flush()
        except (OSError, DatabusError) as exc:  # StorageFull included
            log.warning("%s not written: %s", self.path, exc)

    def check(self, after_scn: int, origin: str, where: str,
              gtid_pos: Callable[[int], str | None] | None) -> None:
        """Raise :class:`SourcePositionLostError` when ``after_scn`` is not a position
        of the binlog of the server ``origin`` (at ``where``, host:port); see the module
        docstring. ``gtid_pos(scn)``: the server's GTID state at that position (None:
        no such position), or None on servers without it (MySQL)."""
        if self.path is None or not self._origin or origin == self._origin or after_scn < 0:
            return
        at = [(s, g) for s, g in self._pairs if s <= after_scn]
        if at and gtid_pos is not None:
            scn, gtid = at[-1]
            state = gtid_pos(scn)
            if state is not None and gtid in state.split(","):
                log.warning("the server at %s is %s, not %s as when scn %d was read, but"
                            " its binlog there has GTID %s: the same binlog (a restarted"
                            " server with a new identity); capture resumes", where, origin,
                            self._origin, scn, gtid)
                self._origin = origin
                self._write_origin()
                return
            found = (f"has GTID state {state!r} there" if state else
                     "has no such position")
        else:
            scn, gtid = at[-1] if at else (-1, "")
            found = "cannot be asked (MySQL)" if gtid_pos is None else "was not recorded"
        last = self._pairs[-1] if self._pairs else (scn, gtid)
        since = (f"source.start_gtid: '{last[1]}' (the last GTID it recorded, at scn {last[0]})"
                 if last[1] else "source.start_gtid set to the GTID state it holds")
        raise SourcePositionLostError(
            f"binlog position scn {after_scn} is not on this server: it was read from"
            f" {self._origin}, and the server at {where} is {origin}, whose binlog"
            f" {found}" + (f" (wanted GTID {gtid} at scn {scn})" if gtid else "") + ":"
            " another server's binlog (a promoted replica?) has other positions. Recovery:"
            f" start a new relay (a new buffer and state) on it with {since}; its consumers"
            " bootstrap (ScnNotFound)")

    def _write_origin(self) -> None:
        if self.path is not None:
            data: dict[str, Any] = {"origin": self._origin, "at": self._pairs}
            write_atomic(self.path, json.dumps(data).encode())


def gtid_at(sql: SqlSession, file_name: str, offset: int) -> str | None:
    """The server's GTID state at ``file_name``:``offset`` of its binlog
    (``BINLOG_GTID_POS``, MariaDB), None when it has none there."""
    (row,) = sql.query("SELECT BINLOG_GTID_POS(%s, %s)", (file_name, offset))
    return str(row[0]) if row[0] is not None else None
