"""A running PostgreSQL source: what :meth:`.source.PostgresSource.open` makes.

It holds everything that exists only while the source runs (the SQL session, the
replication stream and its decoder, the initial snapshot being read, the incremental
snapshots, positions, counters) and keeps the **SCN**, **Slot**, **Progress** and
**Snapshots** parts of :mod:`.source`'s contract:

* :meth:`Capture.read` (re)starts replication when the relay's position is not where
  the stream is: a fresh start (``after_scn < 0``) creates the slot (with the initial
  snapshot when the mode asks for one, :mod:`.snapshot`); a resumed one checks the slot
  against the position (:meth:`.slot.Slot.check_resume`). Windows with an SCN up to
  the position are dropped (the server may send them again).
* A read hands over up to 64 windows, as soon as the socket has no more messages
  ready; with none, it waits for one until ``timeout``.
* Progress windows: when nothing captured arrived for ``progress_interval`` seconds but
  the server's keepalives report a position past the last window (outside any
  transaction, streamed or not, and while no incremental snapshot runs), an empty
  window at that position.
* Acknowledgements reach the server from the capture thread, before each batch read.
* A :class:`~databus.core.errors.DatabusError` in a read ends the stream (a partly read
  transaction is dropped); the next read starts again at the relay's position.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from databus.core.errors import SourcePositionLostError, SourceUnavailableError, StatementError
from databus.core.window import Window
from databus.sources.common.incremental import Snapshots, idle_stats
from databus.sources.config import PostgresSourceConfig
from databus.sources.postgres import checks
from databus.sources.postgres import pgoutput as po
from databus.sources.postgres.connection import (
    PgUrl,
    ReplicationStream,
    SnapshotSession,
    SqlSession,
    close_quietly,
    create_slot_exporting,
)
from databus.sources.postgres.decoder import CHANGES, DECODER_STATS, Decoder
from databus.sources.postgres.marks import CommitMarks
from databus.sources.postgres.slot import SLOT_STATS, Slot
from databus.sources.postgres.snapshot import InitialSnapshot
from databus.sources.postgres.streams import Budget
from databus.sources.postgres.versions import Versions

log = logging.getLogger("databus.sources.postgres")

_MAX_WINDOWS_PER_READ = 64
_BATCH = 1024  # messages taken from the socket at once

STATS = (*SLOT_STATS, *DECODER_STATS, "server_lsn", "snapshot_rows_total", "snapshot_running")


def idle_capture_stats() -> dict[str, float]:
    """Every stat key of a PostgreSQL source, zero (before it opened)."""
    return {**idle_stats(), **dict.fromkeys(STATS, 0.0)}


class Capture:
    """The running part of one PostgreSQL source (module docstring)."""

    def __init__(self, config: PostgresSourceConfig, *, url: PgUrl, sql: SqlSession,
                 slot: Slot, publication: str, streaming: bool,
                 tables: list[checks.TableFacts], versions: Versions,
                 wanted: Callable[[str], bool], snaps: Snapshots | None,
                 compiled: bool | None, budget: Budget, spill_dir: Path | None) -> None:
        self.config = config
        self.url = url
        self.sql = sql
        self.slot = slot
        self.publication = publication
        self.streaming = streaming
        self.tables = tables
        self.versions = versions
        self.snaps = snaps
        self._wanted = wanted
        self._compiled = compiled
        self._budget = budget  # streamed transactions' messages in memory, every session's
        self._spill_dir = spill_dir
        # every key from the start: the relay's metrics thread copies the dict
        self.stats: dict[str, float] = dict.fromkeys(STATS, 0.0)
        self.decoder = self._new_decoder(0)
        self.stream: ReplicationStream | None = None
        self.snap: InitialSnapshot | None = None
        self.snapshot_done = False  # initial_only: nothing more after it
        self.stream_scn = -2
        self.last_scn = -1
        self.last_out = time.monotonic()
        self.marks = CommitMarks()  # how far capture is complete in source time

    def _new_decoder(self, server_lsn: int) -> Decoder:
        decoder = Decoder(compiled=self._compiled,
                          version_of=lambda rel: self.versions.of(rel, self.sql),
                          wanted=self._wanted, signal_table=self.config.signal_table,
                          sql=self.sql, snaps=self.snaps, stats=self.stats,
                          budget=self._budget, spill_dir=self._spill_dir)
        decoder.server_lsn = server_lsn  # the server's position outlives a session
        return decoder

    # -- life cycle ------------------------------------------------------------------

    def close_stream(self) -> None:
        if self.stream is not None:
            self.stream.close()
            self.stream = None
        if self.snap is not None:
            self.snap.close()
            self.snap = None
            self.stats["snapshot_running"] = 0.0
        self.decoder.close()
        self.stream_scn = -2

    def close(self) -> None:
        self.close_stream()
        self.sql.close()

    # -- (re)starts ------------------------------------------------------------------

    def _start(self, after_scn: int) -> None:
        """Check the slot against ``after_scn`` (create it on a fresh start, with the
        initial snapshot when the mode asks for one) and start replication after it."""
        self.close_stream()
        found = checks.slot_facts(self.sql, self.slot.name)
        if found is None:
            if after_scn >= 0:
                raise self._slot_gone(after_scn)
            if self.config.snapshot_mode != "no_data":
                self._start_snapshot()
                return
            floor = self.slot.create(self.sql)
        else:
            floor = found.confirmed_lsn or 0
            if after_scn >= 0:
                self.slot.check_resume(after_scn, floor)
        self._open_stream(after_scn, floor)

    def _open_stream(self, after_scn: int, floor: int) -> None:
        try:
            self.stream = ReplicationStream(self.url, slot=self.slot.name,
                                            publication=self.publication,
                                            start_lsn=max(after_scn, 0),
                                            streaming=self.streaming)
        except SourceUnavailableError:
            self.slot.refuse_if_taken(self.sql)
            raise
        except StatementError:
            # dropped between the check in _start and START_REPLICATION (an operator
            # ending the walsender, then dropping the slot while the relay reconnects)
            if after_scn >= 0 and checks.slot_facts(self.sql, self.slot.name) is None:
                raise self._slot_gone(after_scn) from None
            raise
        self.slot.started(floor)
        self.stream_scn = after_scn
        self.last_scn = after_scn
        # the server sends every Relation again in a new session
        self.decoder.close()
        self.decoder = self._new_decoder(self.decoder.server_lsn)
        if self.snaps is not None:
            self.snaps.restore(after_scn)
        log.info("replication of slot %s started after %s", self.slot.name,
                 po.lsn_text(after_scn) if after_scn >= 0 else "its confirmed position")

    def _slot_gone(self, after_scn: int) -> SourcePositionLostError:
        """The slot is gone while the relay resumes after ``after_scn``: never papered
        over with a new slot (which would start after a gap); the recovery, named."""
        return SourcePositionLostError(
            f"replication slot {self.slot.name} is gone (dropped, or invalidated by the"
            f" server): the changes after scn {after_scn} (LSN {po.lsn_text(after_scn)})"
            " cannot be read. To capture again, move this relay's buffer file and state"
            " files (<state_dir>/<relay>.*) aside and start it: it creates a new slot"
            " (snapshot_mode initial snapshots the rows as they are then); consumers"
            " behind it get ScnNotFound and must bootstrap")

    def _start_snapshot(self) -> None:
        """Create the slot exporting its snapshot and start reading the tables in it."""
        lsn, name, holder = create_slot_exporting(self.url, self.slot.name)
        try:
            session = SnapshotSession(self.url, name)
        finally:
            close_quietly(holder)  # the import keeps the snapshot
        try:
            snap = InitialSnapshot(session, lsn, self.tables,
                                   lambda rel: self.versions.of(rel, self.sql),
                                   self.config.snapshot_chunk_size, time.time_ns())
        except BaseException:
            session.close()
            raise
        self.slot.save(snapshot=[snap.first_scn, lsn])
        log.info("created replication slot %s at %s; initial snapshot of %d table(s) in %d"
                 " chunk window(s)", self.slot.name, po.lsn_text(lsn), len(snap.plan),
                 snap.chunks)
        self.snap = snap
        self.slot.floor = lsn
        self.stream_scn = -1
        self.stats["snapshot_running"] = 1.0

    def _snapshot_read(self, after_scn: int) -> list[Window]:
        snap = self.snap
        assert snap is not None
        if after_scn != self.stream_scn:
            raise SourcePositionLostError(
                f"the initial snapshot of slot {self.slot.name} was asked to resume after"
                f" scn {after_scn}; it cannot (see Slot.check_resume)")
        window = snap.next_window()
        if window is not None:
            self.stream_scn = window.scn
            self.stats["snapshot_rows_total"] += window.count
            return [window]
        log.info("initial snapshot done: %d rows", snap.rows)
        snap.close()
        self.snap = None
        self.stats["snapshot_running"] = 0.0
        if self.config.snapshot_mode == "initial_only":
            self.snapshot_done = True
            return []
        self._open_stream(after_scn, snap.lsn)
        return []

    # -- reading ---------------------------------------------------------------------

    def read(self, after_scn: int, stop: threading.Event, timeout: float) -> list[Window]:
        if self.snapshot_done:
            stop.wait(timeout)  # initial_only: nothing more after the snapshot
            return []
        if self.snap is None and (self.stream is None or after_scn != self.stream_scn):
            self._start(after_scn)
        if self.snap is not None:
            return self._snapshot_read(after_scn)
        stream = self.stream
        assert stream is not None
        decoder = self.decoder
        deadline = time.monotonic() + timeout
        out: list[Window] = []
        marks = self.marks
        while not stop.is_set() and len(out) < _MAX_WINDOWS_PER_READ:
            self._confirm(stream)
            marks.take(self.sql)
            if self.snaps is not None:
                self.snaps.step()  # the next chunk of a running incremental snapshot
            wait = 0.0 if out else max(0.0, min(deadline - time.monotonic(), 0.25))
            batch = stream.read_many(wait, _BATCH)
            if not batch:
                if decoder.between:
                    decoder.server_lsn = max(decoder.server_lsn, stream.server_lsn)
                    marks.reached(decoder.server_lsn)  # credited once out is handed over
                    if marks.should_ask():
                        stream.ask_position()
                if out:
                    break
                progress = self._progress()
                if progress is not None:
                    out.append(progress)
                    break
                if time.monotonic() >= deadline:
                    break
                continue
            change = decoder.rows.change
            for payload in batch:
                # the hot path: a row change of a transaction, decoded in C when built
                if (decoder.txn is not None and payload[:1] in CHANGES
                        and change(payload, 0) >= 0):
                    continue
                window = decoder.payload(payload)
                if window is not None and window.scn > after_scn:
                    out.append(window)
        if out:
            self.stream_scn = self.last_scn = out[-1].scn
            self.last_out = time.monotonic()
        self.stats["server_lsn"] = float(decoder.server_lsn)
        self.slot.probe(self.sql, self.stats)
        return out

    def _confirm(self, stream: ReplicationStream) -> None:
        ack = self.slot.take_ack()
        if ack is None:
            return
        if self.snaps is not None:
            self.snaps.acknowledge(ack)  # a restart never goes back before it
        if ack > self.slot.floor:  # never back: the server would take a lower LSN
            stream.confirm(ack)

    def _progress(self) -> Window | None:
        # never inside a transaction, nor while a streamed one is open (the slot cannot
        # release its WAL before that transaction's start anyway)
        every = self.config.progress_interval
        lsn = self.decoder.server_lsn
        if (not every or not self.decoder.between
                or (self.snaps is not None and self.snaps.active)
                or time.monotonic() - self.last_out < every
                or lsn <= max(self.last_scn, self.stream_scn)):
            return None
        return Window(lsn, b"", 0, time.time_ns())

    def all_stats(self) -> dict[str, float]:
        """The counters, the slot's gauges, and the snapshots' state."""
        snaps = self.snaps.stats() if self.snaps is not None else idle_stats()
        out = {**snaps, **self.stats}
        out["snapshot_rows_total"] += snaps["snapshot_rows_total"]
        out["snapshot_running"] = float(bool(self.stats["snapshot_running"])
                                        or bool(snaps["snapshot_running"]))
        return out

