"""The replication slot a PostgreSQL source owns, and what it acknowledged.

Contract (the **Slot** part of :mod:`.source`):

* Name: ``slot`` from the config, else ``databus_<shared name>`` (:func:`default_name`);
  a start that finds it held by another relay is refused (:meth:`Slot.check`,
  :meth:`Slot.refuse_if_taken`), never fought over.
* Created on a fresh start only (:meth:`Slot.create`, or with an exported snapshot by
  the initial snapshot); a slot that is gone when a position is resumed is a
  :class:`~databus.core.errors.SourcePositionLostError`.
* Acknowledgements: :meth:`Slot.acknowledge` (any thread) records what the relay no
  longer needs; the capture thread takes it with :meth:`Slot.take_ack`, which writes it
  to the state file (``<state_dir>/<relay>.postgres-slot.json``, atomically) *before* the
  server hears of it. The server's confirmed LSN only moves to acknowledged SCNs (and,
  through psycopg2, to keepalive positions with nothing unacknowledged before them).
* Resuming (:meth:`Slot.check_resume`): a confirmed LSN past the relay's position is a
  loss when the relay had acknowledged more than it now holds, else only WAL without
  captured changes (a warning without the state file, which could tell them apart); a
  position inside an interrupted initial snapshot cannot be resumed.
* :meth:`Slot.probe`: the slot as the server sees it, for the stats; a failed probe is
  logged and tried again later (capture does not depend on it).
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from pathlib import Path
from typing import Any

from databus.core.atomic import write_atomic
from databus.core.errors import ConfigError, DatabusError, SourcePositionLostError
from databus.sources.postgres import checks
from databus.sources.postgres import pgoutput as po
from databus.sources.postgres.connection import SqlSession

log = logging.getLogger("databus.sources.postgres")

PROBE_INTERVAL = 5.0
"""Seconds between two reads of the slot's position as the server sees it (stats)."""

SLOT_STATS = ("slot_confirmed_lsn", "slot_lag_bytes", "slot_retained_bytes", "server_wal_lsn")


def default_name(relay_name: str) -> str:
    """``databus_<relay name>`` as a slot/publication name (lowercase, [a-z0-9_])."""
    base = re.sub(r"[^a-z0-9_]", "_", relay_name.lower())
    return f"databus_{base}"[:63]


class Slot:
    """One source's slot (module docstring). ``label``: this relay's application name,
    how its connections are told apart from another relay's."""

    def __init__(self, name: str, *, state: Path | None, label: str, wait: float,
                 legacy: str | None) -> None:
        self.name = name
        self.state_path = state
        self.label = label
        self.wait = wait
        self.legacy = legacy  # a slot every relay had before names were derived
        self.floor = 0  # the slot's confirmed LSN when this session started
        self._lock = threading.Lock()
        self._ack = -1  # what the relay acknowledged
        self._confirmed = -1  # what was confirmed to the server
        self._next_probe = 0.0

    # -- at open ---------------------------------------------------------------------

    def check(self, sql: SqlSession, facts: checks.ServerFacts, database: str) -> None:
        """Refuse a start that would take another relay's slot (or pass over the legacy
        one); creates nothing."""
        if self.legacy is not None:
            checks.check_legacy_slot(sql, self.name, self.legacy, database)
        checks.check_slot(sql, self.name, database, facts, wait=self.wait, label=self.label)

    def refuse_if_taken(self, sql: SqlSession) -> None:
        """Replication could not start: when another relay holds the slot now, that is
        terminal (retrying would only fight it for the slot), naming both."""
        found = checks.slot_facts(sql, self.name)
        if found is None or found.active_pid is None:
            return
        holder = checks.slot_holder(sql, found.active_pid)
        if not holder.startswith(f"{self.label} from "):
            raise ConfigError(
                f"replication slot {self.name} is in use by another process (pid"
                f" {found.active_pid}: {holder or 'not visible to this role'}); this relay"
                f" is {self.label}: two relays cannot share a slot: give each its own name"
                " (--name, name:) or slot (slot:)")

    # -- at a (re)start ----------------------------------------------------------------

    def create(self, sql: SqlSession) -> int:
        """Create the slot (a fresh start without snapshot); its LSN."""
        (row,) = sql.query(
            "SELECT (lsn - '0/0')::bigint FROM pg_create_logical_replication_slot(%s,"
            " 'pgoutput')", (self.name,))
        lsn = int(row[0])
        log.info("created replication slot %s at %s", self.name, po.lsn_text(lsn))
        return lsn

    def check_resume(self, after_scn: int, confirmed: int) -> None:
        """Resuming after ``after_scn`` from a slot confirmed up to ``confirmed``
        (module docstring)."""
        span = self.state().get("snapshot")
        if span and int(span[0]) <= after_scn < int(span[1]):
            raise SourcePositionLostError(
                f"the initial snapshot was interrupted (this relay holds it up to scn"
                f" {after_scn} of {span[0]}..{span[1]}) and cannot be resumed: drop the slot"
                f" (SELECT pg_drop_replication_slot('{self.name}')), the relay's buffer and"
                " state, and start the relay again")
        if confirmed <= after_scn:
            return
        ack = self.state().get("acknowledged")
        saved = None if ack is None else int(ack)
        if saved is not None and after_scn < saved:
            raise SourcePositionLostError(
                f"this relay acknowledged up to {po.lsn_text(saved)} but resumes after"
                f" {po.lsn_text(after_scn)}, and replication slot {self.name} was confirmed"
                f" up to {po.lsn_text(confirmed)}: the changes between are gone; consumers"
                " must bootstrap")
        if saved is None:
            log.warning("replication slot %s was confirmed up to %s, past this relay's"
                        " position %s; without a record of its acknowledgements (state_dir)"
                        " the source cannot prove nothing captured lies between",
                        self.name, po.lsn_text(confirmed), po.lsn_text(after_scn))
        else:
            log.info("replication slot %s was moved to %s over WAL without captured changes",
                     self.name, po.lsn_text(confirmed))

    def started(self, floor: int) -> None:
        """A replication session started from a slot confirmed at ``floor``."""
        self.floor = floor
        with self._lock:
            self._confirmed = -1  # a new session: say it again

    # -- the state file ----------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        if self.state_path is None or not self.state_path.exists():
            return {}
        try:
            raw = json.loads(self.state_path.read_text(encoding="utf-8"))
            if not isinstance(raw, dict):
                raise ValueError("not an object")
            return raw
        except (OSError, ValueError) as exc:
            raise SourcePositionLostError(
                f"slot state {self.state_path} is unreadable ({exc}): cannot prove the slot"
                " holds every change after this relay's position") from exc

    def save(self, **fields: Any) -> None:
        if self.state_path is not None:
            write_atomic(self.state_path, json.dumps({**self.state(), **fields}).encode())

    # -- acknowledgements ------------------------------------------------------------

    def acknowledge(self, scn: int) -> None:
        """The relay no longer needs what is up to ``scn`` (any thread)."""
        with self._lock:
            self._ack = max(self._ack, scn)

    def take_ack(self) -> int | None:
        """An acknowledgement not confirmed to the server yet, recorded in the state file
        first (capture thread); None when there is none. The caller confirms it when it
        is above :attr:`floor` (the server would not take a lower LSN)."""
        with self._lock:
            ack = self._ack
            if ack <= self._confirmed:
                return None
            self._confirmed = ack
        self.save(acknowledged=ack)
        return ack

    # -- stats -----------------------------------------------------------------------

    def probe(self, sql: SqlSession, stats: dict[str, float]) -> None:
        """Every :data:`PROBE_INTERVAL` seconds: the slot's confirmed LSN, its lag behind
        the server's WAL end and the WAL the server keeps for it, into ``stats``."""
        if time.monotonic() < self._next_probe:
            return
        self._next_probe = time.monotonic() + PROBE_INTERVAL
        try:
            rows = sql.query(
                "SELECT (s.confirmed_flush_lsn - '0/0'::pg_lsn)::bigint,"
                " (s.restart_lsn - '0/0'::pg_lsn)::bigint, (w.lsn - '0/0'::pg_lsn)::bigint"
                " FROM pg_replication_slots s, (SELECT CASE WHEN pg_is_in_recovery()"
                " THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END AS lsn) w"
                " WHERE s.slot_name = %s", (self.name,))
        except DatabusError as exc:  # the stats wait for the next probe; capture goes on
            log.debug("slot %s: position not read: %s", self.name, exc)
            return
        if not rows or rows[0][0] is None:
            return
        confirmed, restart, wal = (int(v or 0) for v in rows[0])
        stats["slot_confirmed_lsn"] = float(confirmed)
        stats["slot_lag_bytes"] = float(max(0, wal - confirmed))
        stats["slot_retained_bytes"] = float(max(0, wal - restart))
        stats["server_wal_lsn"] = float(wal)
