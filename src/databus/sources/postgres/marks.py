"""How far a PostgreSQL capture is complete, in the server's time.

The contract (:meth:`databus.sources.base.Source.captured_until_ns`): a time T such that
every transaction committed before T has been handed to the relay. An empty read does not
prove it here: the walsender may be decoding a long stretch of WAL of tables outside the
publication (or of a bulk load) while sending nothing, and an "empty read means caught
up" rule would report 0 s of lag all that time.

So the capture takes **marks**: every :data:`MARK_INTERVAL` seconds, the wall time T
(taken *before* the query) and the server's WAL end W read just after it
(``pg_current_wal_insert_lsn()``, or the replay position on a standby): every commit before T
lies below W. When the stream, drained and between transactions, reports that the server
has decoded to W or past it (its keepalives' position), T is reached. Keepalives come
on their own only every ``wal_sender_timeout / 2``; while a mark waits, the capture asks
the server for one (a standby status update with the reply flag) at most every
:data:`ASK_INTERVAL` seconds, so an idle source is credited within about a second.

A mark is never credited early: the lag this yields is high by at most the time between
marks and the next keepalive, never low.
"""

from __future__ import annotations

import logging
import time
from collections import deque

from databus.core.errors import DatabusError
from databus.sources.postgres.connection import SqlSession

log = logging.getLogger("databus.sources.postgres")

MARK_INTERVAL = 0.5
ASK_INTERVAL = 0.25
_MAX_MARKS = 64  # a backlog longer than this keeps the oldest marks and thins the newest

WAL_END_SQL = ("SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()"
               " ELSE pg_current_wal_insert_lsn() END - '0/0'::pg_lsn)::bigint")


class CommitMarks:
    """Marks (T, W) taken on the capture's SQL session and credited as the stream's
    position passes them (module docstring). Used by the capture thread only."""

    def __init__(self) -> None:
        self._marks: deque[tuple[int, int]] = deque()
        self._next_mark = 0.0
        self._next_ask = 0.0
        self.until_ns = 0  # the newest T reached; 0: none yet

    def take(self, sql: SqlSession) -> None:
        """Take a mark when one is due (a failed query waits for the next one: capture
        goes on, and the lag only reads high)."""
        now = time.monotonic()
        if now < self._next_mark:
            return
        self._next_mark = now + MARK_INTERVAL
        at = time.time_ns()
        try:
            rows = sql.query(WAL_END_SQL)
        except DatabusError as exc:
            log.debug("no position mark taken: %s", exc)
            return
        if not rows or rows[0][0] is None:
            return
        wal = int(rows[0][0])
        if self._marks and self._marks[-1][1] >= wal:
            self._marks[-1] = (at, wal)  # nothing written since: the newer time holds
        elif len(self._marks) < _MAX_MARKS:
            self._marks.append((at, wal))

    def reached(self, server_lsn: int) -> None:
        """The server decoded up to ``server_lsn`` and everything before it was handed
        over: credit every mark at or below it."""
        marks = self._marks
        while marks and marks[0][1] <= server_lsn:
            at, _ = marks.popleft()
            if at > self.until_ns:
                self.until_ns = at

    def should_ask(self) -> bool:
        """A mark waits for the server's position: time to ask for a keepalive."""
        if not self._marks:
            return False
        now = time.monotonic()
        if now < self._next_ask:
            return False
        self._next_ask = now + ASK_INTERVAL
        return True
