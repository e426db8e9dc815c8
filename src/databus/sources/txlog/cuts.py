"""Shared window cuts of the SQLite source (``window_cuts: shared``).

With local cuts (:mod:`.sqlite`) a window ends where this reader's snapshot ended, so two
relays capturing the same database cut it differently. With shared cuts window
boundaries are rows of ``_databus_cuts`` (SCNs of txlog rows), a property of the
database, and every shared-cut reader emits the same windows:

* the window after position ``S`` holds exactly the txlog rows with
  ``S < scn <= c``, ``c`` the smallest cut above ``S``; its SCN is ``c``, its
  timestamp the ``ts`` of the txlog row at ``c`` (so its bytes are the same on
  every reader);
* a reader that finds txlog rows above ``S`` but no cut above ``S`` adds one at
  the txlog's highest SCN in a ``BEGIN IMMEDIATE`` transaction of its writer
  connection, re-reading the highest SCN and the newest cut inside it (nothing is
  inserted when another reader cut there or above first). SQLite has one writer:
  holding the write lock, no application transaction is half-written, so a cut
  always falls between transactions. The lock is asked for every 0.1 ms for up to
  ``busy_timeout`` (:func:`~databus.sources.txlog._db.begin_immediate`), then
  the read fails with SourceUnavailableError;
* one read returns every window of the cuts already present above ``S`` (a
  reader behind a backlog: several), up to ``_CUTS_PER_READ`` windows or about
  ``_ROWS_PER_READ`` own rows (always at least one whole window);
* a window without own rows is not sent (the next one covers its range: positions
  are compared with ``>``), except as the empty progress window below, whose SCN
  is then a cut. Which empty windows a reader sends depends on its timing; the
  windows with events do not;
* snapshot chunk windows (one reader snapshots) keep the SCN of their read
  transaction (as does the empty window that may follow a snapshot's last,
  eventless chunk); the window after one again ends at the smallest cut above it.


The cost: one short write transaction (a commit) per poll that finds new data
without a cut, taking the application's write lock briefly.

Callers run :func:`read_cuts` inside their read transaction (after checking the
schema and the position) and :func:`add_cut` on their writer connection, holding their
write lock and translating ``sqlite3`` errors.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

from databus.sources.txlog._db import begin_immediate, rollback_quietly

# what one read returns at most (a relay behind a backlog catches up in steps, each a
# bounded amount of memory); at least one whole window, whatever its size
_CUTS_PER_READ = 1000
_ROWS_PER_READ = 20_000

Rows = list[tuple[Any, ...]]
Cut = tuple[int, int, Rows]
"""A window of cuts: (its cut SCN, the ts of the txlog row there, its own rows)."""


def read_cuts(con: sqlite3.Connection, start: int,
              own_rows: Callable[[sqlite3.Connection, int, int, int], Rows]
              ) -> tuple[list[Cut], bool]:
    """The windows of the cuts above ``start`` (module docstring), and whether the txlog
    has rows above ``start`` that no cut ends. ``own_rows(con, start, top, limit)``: the
    source's txlog rows in ``(start, top]``, the first ``limit`` (-1: all)."""
    # a cut's txlog row is trimmed with the cut; LEFT JOIN only guards the bytes
    found = con.execute(
        "SELECT c.scn, coalesce(t.ts, 0) FROM _databus_cuts c LEFT JOIN _databus_txlog t"
        " ON t.scn = c.scn WHERE c.scn > ? ORDER BY c.scn LIMIT ?",
        (start, _CUTS_PER_READ)).fetchall()
    if not found:
        top = con.execute("SELECT max(scn) FROM _databus_txlog").fetchone()[0]
        return [], top is not None and top > start
    rows = own_rows(con, start, int(found[-1][0]), _ROWS_PER_READ)
    if len(rows) >= _ROWS_PER_READ:  # keep the windows whose rows were all read
        edge = rows[-1][0]
        whole = [c for c in found if c[0] <= edge]
        if whole:
            found = whole
            rows = [r for r in rows if r[0] <= whole[-1][0]]
        else:  # one window larger than the budget: whole all the same
            found = found[:1]
            rows = own_rows(con, start, int(found[0][0]), -1)
    out: list[Cut] = []
    i = 0
    for cut, ts in found:
        j = i
        while j < len(rows) and rows[j][0] <= cut:
            j += 1
        out.append((int(cut), int(ts), rows[i:j]))
        i = j
    return out, False


def add_cut(con: sqlite3.Connection, *, busy_timeout: float) -> int:
    """Commit a cut at the txlog's highest SCN, unless the newest cut is there or above
    already (another reader cut first); the number of cuts added (0 or 1)."""
    # holding the write lock, no application transaction is half-written: the highest
    # SCN read here ends a committed transaction
    begin_immediate(con, busy_timeout=busy_timeout)
    try:
        cur = con.execute(
            "INSERT INTO _databus_cuts (scn) SELECT top FROM (SELECT max(scn) AS top"
            " FROM _databus_txlog) WHERE top > coalesce((SELECT max(scn) FROM"
            " _databus_cuts), -1)")
        con.execute("COMMIT")
    except BaseException:
        rollback_quietly(con)
        raise
    return int(cur.rowcount)
