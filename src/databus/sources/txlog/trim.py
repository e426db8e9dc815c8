"""Trimming the txlog: which relays read it, and what all of them have read.

Contract (the **Trimming** part of :mod:`.sqlite`):

* Each source registers its relay's shared name (``Capturer.shared_name``: the relay's
  name, or its cluster's) in ``_databus_relays`` when it starts (:func:`register`:
  position -1, or the trim point, or kept from before); :func:`acknowledge` moves it.
  Two relays with different names never share a row, so neither trims what the other
  has not read.
* A relay whose name was derived (``Capturer.legacy``) that finds no row of its own but
  one named ``relay`` (every relay's name before names were derived) refuses to start,
  naming ``--name relay``: adopting the row could take another relay's position,
  ignoring it would hold back trimming for ever.
* Txlog rows at or below the lowest position of all registered relays are deleted,
  with the cuts at or below them, in batches of ``_TRIM_BATCH`` rows, each its own
  short write transaction with a pause between them so application writers get the
  lock; ``_databus_meta.trimmed_scn`` records the highest SCN deleted. A relay that is
  gone for good must be removed (:func:`databus.sources.txlog.catalog.forget_relay`)
  or the txlog keeps growing.

Callers hold the source's write lock and translate ``sqlite3`` errors
(:func:`._db.translated`).
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from databus.core.errors import ConfigError
from databus.sources.txlog._db import begin_immediate, rollback_quietly, write_one

_TRIM_BATCH = 5000  # txlog rows deleted per write transaction
_TRIM_PAUSE = 0.002  # seconds between trim batches, so application writers get the lock


def register(con: sqlite3.Connection, path: Path, name: str, legacy: str | None, *,
             busy_timeout: float) -> None:
    """This relay's row of ``_databus_relays`` (kept when it exists), after refusing a
    start beside a legacy row (module docstring)."""
    _refuse_legacy_row(con, path, name, legacy)
    write_one(con, "INSERT OR IGNORE INTO _databus_relays VALUES (?, coalesce((SELECT v FROM"
              " _databus_meta WHERE k = 'trimmed_scn'), -1), ?)", (name, time.time()),
              busy_timeout=busy_timeout)


def _refuse_legacy_row(con: sqlite3.Connection, path: Path, name: str,
                       legacy: str | None) -> None:
    if legacy is None or legacy == name:
        return
    rows = dict(con.execute("SELECT name, acked_scn FROM _databus_relays WHERE name IN (?, ?)",
                            (name, legacy)).fetchall())
    if name in rows or legacy not in rows:
        return
    raise ConfigError(
        f"{path} has a trim registration {legacy!r} (acknowledged scn"
        f" {rows[legacy]}) from before relays had their own names, and none for this"
        f" relay ({name!r}): if it is this relay's, start it with --name"
        f" {legacy} (name: {legacy}) to keep its position; if no relay named {legacy}"
        " captures this database any more, remove it (databus.sources.txlog.catalog."
        f"forget_relay(path, {legacy!r})); to start beside it, give this relay a name")


def acknowledge(con: sqlite3.Connection, name: str, scn: int, *, busy_timeout: float) -> None:
    """Record ``scn`` as relay ``name``'s position and trim what every relay read."""
    first = True
    while True:
        begin_immediate(con, busy_timeout=busy_timeout)
        try:
            if first:
                con.execute(
                    "INSERT INTO _databus_relays VALUES (?, ?, ?) ON CONFLICT(name)"
                    " DO UPDATE SET acked_scn = excluded.acked_scn,"
                    " updated_at = excluded.updated_at", (name, scn, time.time()))
                first = False
            done = _trim_batch(con)
            con.execute("COMMIT")
        except BaseException:
            rollback_quietly(con)
            raise
        if done:
            return
        time.sleep(_TRIM_PAUSE)


def _trim_batch(con: sqlite3.Connection) -> bool:
    """Delete up to one batch of txlog rows all relays acknowledged, and the cuts at or
    below them; True when none are left."""
    low = con.execute("SELECT min(acked_scn) FROM _databus_relays").fetchone()[0]
    if low is None:
        return True
    row = con.execute("SELECT scn FROM _databus_txlog WHERE scn <= ? ORDER BY scn"
                      " LIMIT 1 OFFSET ?", (low, _TRIM_BATCH - 1)).fetchone()
    last = row is None
    if last:
        row = con.execute("SELECT max(scn) FROM _databus_txlog WHERE scn <= ?", (low,)
                          ).fetchone()
    hi = row[0] if row is not None else None
    if hi is None:
        return True
    con.execute("DELETE FROM _databus_txlog WHERE scn <= ?", (hi,))
    con.execute("DELETE FROM _databus_cuts WHERE scn <= ?", (hi,))
    con.execute("INSERT INTO _databus_meta VALUES ('trimmed_scn', ?) ON CONFLICT(k)"
                " DO UPDATE SET v = max(v, excluded.v)", (hi,))
    return last
