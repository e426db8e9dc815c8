"""The client's bootstrap: snapshot, then catch-up, then back to the relay.

:class:`BootstrapRunner` runs on the client's pull thread when the client
falls off the relay (``ScnNotFound``), when a new consumer is configured to
bootstrap, or when the stored checkpoint is a bootstrap checkpoint (a restart
in the middle of a bootstrap). Protocol (see :mod:`databus.bootstrap.server`):

1. ``/startSCN`` with the consumer's online checkpoint -> the bootstrap
   checkpoint, which is persisted at once (so the start SCN never changes for
   this bootstrap, whatever crashes later). For a snapshot bootstrap,
   ``on_bootstrap_snapshot_start(schemas)`` first: the consumer drops what it
   holds of those sources (deletes before the start SCN are not sent).
2. ``/bootstrap`` requests, each answering a batch and the next checkpoint.
   A snapshot batch is delivered as ``on_start_bootstrap_sequence(start)``,
   ``on_bootstrap_event`` per row, ``on_end_bootstrap_sequence(start)``; each
   catch-up window as the same three callbacks with the window's SCN. Then
   ``on_bootstrap_checkpoint`` and the checkpoint is persisted. A consumer
   that overrides ``on_bootstrap_events`` gets, instead of the per-row calls,
   one :class:`~databus.client.consumer.DataBatch` per run of one source and
   schema version within each sequence (rows or columns decoded on access by
   the compiled decoder; for a snapshot answer, straight from the answer's
   bytes, with no Event per row unless the consumer reads ``events``); its
   result and errors count for the whole answer as a per-row one would.
3. When the checkpoint returned is online ("after T"), ``on_end_bootstrap``
   and the client continues with the relay after T: the catch-up delivered
   every window up to T whole, the relay serves the windows after T, so
   there is no gap and no partial window.

Concurrency: callbacks, checkpoints and all state stay on the client's
thread; one helper thread only fetches and parses the next batch (from the
checkpoint the current batch ends with) while the current one is delivered,
with its own HTTP connection. Its CRC checks run without the GIL
(:func:`~databus.client.wiredecode.scan`), so they overlap the delivery. A
prefetched batch is used only if it was asked for the checkpoint then persisted;
otherwise it is dropped.

A bootstrap whose log the store no longer has (``BootstrapTooYoung``: trimmed
by the retention, or the store was rebuilt) starts again from the consumer's
position before it (``bootstrap_since_scn``), at most ``max_retries`` times.

A failing callback or checkpoint store -> ``on_bootstrap_rollback`` and the
batch is fetched again from the persisted checkpoint (``max_retries`` times);
a server that is unavailable or behind (``BootstrapTooOld``) is retried with
backoff like the relay. Restartable at any point: the persisted checkpoint
says which phase and where.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

from databus.client.checkpoints import CheckpointStore
from databus.client.config import ClientConfig
from databus.client.consumer import Consumer, DataBatch, DataEvent, SchemaView
from databus.client.dispatcher import (
    SchemaViews,
    call,
    check_result,
    distinct_schemas,
    schema_runs,
)
from databus.client.relay import RelayConnection
from databus.client.retry import Backoff, Stopped, retry_transient
from databus.client.stats import ClientStats
from databus.client.wiredecode import Scanned, scan, scan_table
from databus.core import event as ev
from databus.core.checkpoint import Checkpoint, ConsumptionMode
from databus.core.errors import (
    BootstrapTooYoungError,
    CheckpointStoreError,
    ConsumerCallbackError,
    ConsumerFatalError,
    DatabusError,
    RelayProtocolError,
    RetriesExhaustedError,
    SchemaError,
    TransientError,
)
from databus.core.schema import SchemaRegistry

log = logging.getLogger("databus.client.bootstrap")
T = TypeVar("T")
_ONLINE = ConsumptionMode.ONLINE_CONSUMPTION


class BootstrapConnection(RelayConnection):
    """A bootstrap server's HTTP API (``/sources`` and ``/register`` as a relay's)."""

    def start_scn(self, online: Checkpoint, source_ids: list[int] | None
                  ) -> tuple[Checkpoint, int]:
        """The bootstrap checkpoint to start with and the snapshot's row count (-1 unknown)."""
        params = self._params(source_ids)
        if not online.is_flexible:
            params["checkPoint"] = online.to_json()
        raw = self._json("/startSCN", params)
        try:
            return Checkpoint.from_dict(raw["checkpoint"]), int(raw.get("snapshotRows", -1))
        except (KeyError, TypeError, ValueError, AttributeError, DatabusError) as exc:
            raise RelayProtocolError(f"{self.url}/startSCN answered {raw!r:.200}") from exc

    def target_scn(self) -> int:
        raw = self._json("/targetSCN", {})
        try:
            return int(raw["targetScn"])
        except (KeyError, TypeError, ValueError) as exc:
            raise RelayProtocolError(f"{self.url}/targetSCN answered {raw!r:.200}") from exc

    def bootstrap(self, cp: Checkpoint, source_ids: list[int] | None, batch_size: int,
                  filter_json: str | None) -> bytes:
        params = self._params(source_ids)
        params["checkPoint"] = cp.to_json()
        params["batchSize"] = str(batch_size)
        if filter_json:
            params["filters"] = filter_json
        return self._get("/bootstrap", params).content

    @staticmethod
    def _params(source_ids: list[int] | None) -> dict[str, str]:
        return {"sources": ",".join(map(str, source_ids))} if source_ids else {}


@dataclass(frozen=True, slots=True)
class ScannedRows:
    """The first ``end`` events of a scanned answer (its snapshot rows), with no
    :class:`~databus.core.event.Event` built per row: what a batch consumer gets."""

    scanned: Scanned
    end: int

    def __len__(self) -> int:
        return self.end

    def events(self) -> list[ev.Event]:
        return self.scanned.events(0, self.end)

    def runs(self) -> list[tuple[int, int]]:
        """``(start, end)`` of each run of one schema (as :func:`schema_runs` cuts)."""
        return [(a, min(b, self.end)) for a, b in self.scanned.runs if a < self.end]


SequenceEvents = list[ev.Event] | ScannedRows


@dataclass
class Batch:
    """One ``/bootstrap`` answer: sequences of events (scn, events) and the next checkpoint."""

    sequences: list[tuple[int, SequenceEvents]] = field(default_factory=list)
    checkpoint: Checkpoint | None = None


def parse_batch(body: bytes, current: Checkpoint, verify: bool = True, *,
                lazy: bool = False) -> Batch:
    """Split an answer into sequences. Snapshot rows form one sequence (SCN =
    the start SCN); catch-up events form one sequence per window (ended by EOP).

    ``lazy`` (a batch consumer): the usual snapshot answer's rows are a
    :class:`ScannedRows`, checked as :func:`scan` checks them but without an
    Event per row."""
    out = Batch()
    pending: list[ev.Event] = []
    snapshot = current.consumption_mode == ConsumptionMode.BOOTSTRAP_SNAPSHOT
    if snapshot and lazy:
        table = scan_table(body, verify=verify)
        n = len(table)
        if n and table.src_ids[n - 1] == ev.SRC_CHECKPOINT and min(
                table.src_ids[:n - 1], default=0) >= 0:
            out.checkpoint = _checkpoint_of(table.events(n - 1)[0])
            if n > 1:
                out.sequences.append((current.bootstrap_start_scn, ScannedRows(table, n - 1)))
            return out
        events = table.events()
    else:
        events = scan(body, verify=verify)
    if (snapshot and events and events[-1].src_id == ev.SRC_CHECKPOINT
            and min([e.src_id for e in events[:-1]], default=0) >= 0):
        # the usual snapshot answer, rows then the checkpoint: no loop per row
        out.checkpoint = _checkpoint_of(events[-1])
        if len(events) > 1:
            out.sequences.append((current.bootstrap_start_scn, events[:-1]))
        return out
    for e in events:
        if e.src_id == ev.SRC_CHECKPOINT:
            out.checkpoint = _checkpoint_of(e)
        elif e.src_id == ev.SRC_EOP:
            out.sequences.append((e.scn, pending))
            pending = []
        elif not e.is_control:
            pending.append(e)
    if pending:
        if not snapshot:
            raise RelayProtocolError("bootstrap catch-up answer ends inside a window")
        out.sequences.append((current.bootstrap_start_scn, pending))
    if out.checkpoint is None:
        raise RelayProtocolError("bootstrap answer without a checkpoint event")
    return out


def _checkpoint_of(e: ev.Event) -> Checkpoint:
    try:
        return Checkpoint.from_dict(json.loads(e.payload))
    except (ValueError, DatabusError) as exc:
        raise RelayProtocolError("bootstrap server sent a bad checkpoint event") from exc


class BootstrapProgress:
    """Logs the bootstrap's progress (rows, rate, ETA) every ``interval`` seconds."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.total = -1  # snapshot rows announced by /startSCN (-1: resumed, unknown)
        self.rows = 0
        self.start = self.last = time.monotonic()
        self.mode: ConsumptionMode | None = None

    def batch(self, cp: Checkpoint, batch: Batch) -> None:
        if cp.consumption_mode != self.mode:  # counts and rates per phase
            self.mode = cp.consumption_mode
            self.rows = 0
            self.start = time.monotonic()
        n = sum(len(evs) for _, evs in batch.sequences)
        self.rows += n
        now = time.monotonic()
        if now - self.last < self.interval:
            return
        self.last = now
        rate = self.rows / max(now - self.start, 1e-9)
        if cp.consumption_mode == ConsumptionMode.BOOTSTRAP_SNAPSHOT:
            eta = (f", ETA {max(self.total - self.rows, 0) / rate:.0f}s"
                   if self.total >= 0 and rate > 0 else "")
            of = f"/{self.total}" if self.total >= 0 else ""
            log.info("bootstrap snapshot of %s: %d%s rows, %.0f rows/s%s", cp.snapshot_source,
                     self.rows, of, rate, eta)
        else:
            log.info("bootstrap catch-up: window %d of target %d, %d events, %.0f events/s",
                     cp.window_scn, cp.bootstrap_target_scn, self.rows, rate)


class BootstrapRunner:
    """Runs one bootstrap for a client, on the client's thread; see the module docstring.

    It delivers to ``consumer``, persists in ``store``, counts into ``stats`` and asks
    for ``source_ids`` (None: every source). ``on_saved`` sees every checkpoint
    persisted, so the client's own position follows the bootstrap as it goes.
    """

    def __init__(self, config: ClientConfig, consumer: Consumer, store: CheckpointStore,
                 stats: ClientStats, source_ids: list[int] | None, stop: threading.Event,
                 *, on_saved: Callable[[Checkpoint], None]) -> None:
        self.cfg = config
        self.consumer = consumer
        self.store = store
        self.stats = stats
        self.source_ids = source_ids
        self.stop = stop
        self.on_saved = on_saved
        self.persisted = Checkpoint.flexible()  # the position persisted last (set by run)
        assert self.cfg.bootstrap_url is not None
        creds = self.cfg.credentials()
        self.conn = BootstrapConnection(self.cfg.bootstrap_url,
                                        http_timeout=self.cfg.http_timeout, credentials=creds)
        # the prefetch thread's own connection (an httpx client per thread)
        self.prefetch_conn = BootstrapConnection(self.cfg.bootstrap_url,
                                                 http_timeout=self.cfg.http_timeout,
                                                 credentials=creds)
        self.pool = ThreadPoolExecutor(max_workers=1,
                                       thread_name_prefix="databus-bootstrap-prefetch")
        self.backoff = Backoff(self.cfg.backoff_initial, self.cfg.backoff_max)
        self.registry = SchemaRegistry()
        self.views = SchemaViews(self.registry)
        self.progress = BootstrapProgress(self.cfg.bootstrap_progress_interval)
        self.batched = type(consumer).on_bootstrap_events is not Consumer.on_bootstrap_events

    def _ids(self) -> list[int] | None:
        return self.source_ids

    def _retry(self, fn: Callable[[], T], what: str) -> T:
        """``fn`` through transient errors, as the client retries the relay."""
        return retry_transient(fn, what, self.stop, self.backoff,
                               limit=self.cfg.relay_max_retries, on_failure=self._count_error)

    def _count_error(self, _: Exception) -> None:
        self.stats.relay_errors += 1

    def _load_registry(self) -> None:
        self.registry = self._retry(lambda: self.conn.register(self._ids()),
                                    "loading schemas from the bootstrap server")
        self.views = SchemaViews(self.registry)

    def run(self, position: Checkpoint) -> Checkpoint:
        """Bootstrap from ``position`` (online, or a bootstrap checkpoint to resume);
        returns the persisted online checkpoint to continue with on the relay."""
        try:
            return self._run(position)
        finally:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.conn.close()
            self.prefetch_conn.close()

    def _run(self, position: Checkpoint) -> Checkpoint:
        consumer = self.consumer
        self.persisted = position
        self._load_registry()
        if position.consumption_mode == _ONLINE:
            call("on_start_bootstrap", consumer.on_start_bootstrap)
            # asking, resetting and persisting the start is retried as one step
            self._retry(lambda: self._begin(position), "starting the bootstrap")
        else:
            log.info("resuming the bootstrap at %s", position.to_json())
            call("on_start_bootstrap", consumer.on_start_bootstrap)
        failures = restarts = 0
        ahead: tuple[Checkpoint, Future[Batch]] | None = None
        while self.persisted.consumption_mode != _ONLINE:
            if self.stop.is_set():
                raise Stopped
            cp = self.persisted
            batch = None
            if ahead is not None and ahead[0] == cp:
                try:
                    batch = ahead[1].result()
                except DatabusError as exc:  # fetched again below, with the usual retries
                    log.debug("prefetched bootstrap batch failed: %s", exc)
            ahead = None
            if batch is None:
                try:
                    batch = self._retry(lambda cp=cp: self._fetch(self.conn, cp),  # type: ignore[misc]
                                        "fetching a bootstrap batch")
                except BootstrapTooYoungError as exc:
                    restarts += 1
                    self._restart(cp, exc, restarts)
                    continue
            self._ensure_schemas(batch)
            nxt = batch.checkpoint
            if nxt is not None and nxt.consumption_mode != _ONLINE:
                # fetch the next batch while this one is delivered
                ahead = (nxt, self.pool.submit(self._fetch, self.prefetch_conn, nxt))
            try:
                self._deliver(batch, cp)
                failures = 0
                self.progress.batch(cp, batch)
            except (ConsumerCallbackError, TransientError) as exc:
                ahead = None
                failures += 1
                self.stats.rollbacks += 1
                log.warning("bootstrap batch failed (%s); rolling back (failure %d of %d)",
                            exc, failures, self.cfg.max_retries + 1)
                try:
                    call("on_bootstrap_rollback", consumer.on_bootstrap_rollback,
                         cp.bootstrap_start_scn)
                except ConsumerCallbackError as rb_exc:
                    log.warning("on_bootstrap_rollback failed too: %s", rb_exc)
                if failures > self.cfg.max_retries:
                    raise RetriesExhaustedError(
                        f"a bootstrap batch failed {failures} times; last error: {exc}") from exc
                if self.backoff.wait(self.stop):
                    raise Stopped from None
        call("on_end_bootstrap", consumer.on_end_bootstrap)
        log.info("bootstrap done; continuing on the relay after SCN %d",
                 self.persisted.window_scn)
        return self.persisted

    def _restart(self, cp: Checkpoint, exc: BootstrapTooYoungError, restarts: int) -> None:
        """The store no longer has this bootstrap's log (trimmed or rebuilt): start a
        new bootstrap from the consumer's position before this one. Correct because
        a snapshot bootstrap resets the consumer's rows first, and a catch-up replays
        every change after that position in order."""
        if restarts > self.cfg.max_retries:
            raise exc
        since = cp.bootstrap_since_scn
        position = Checkpoint.after(since) if since >= 0 else Checkpoint.flexible()
        log.warning("%s; starting the bootstrap again from %s (restart %d)", exc,
                    "scratch" if since < 0 else f"SCN {since}", restarts)
        self.stats.rollbacks += 1
        try:
            call("on_bootstrap_rollback", self.consumer.on_bootstrap_rollback,
                 cp.bootstrap_start_scn)
        except ConsumerCallbackError as rb_exc:
            log.warning("on_bootstrap_rollback failed too: %s", rb_exc)
        self._retry(lambda: self._begin(position), "starting the bootstrap again")

    def _begin(self, position: Checkpoint) -> None:
        """``/startSCN``, the snapshot reset, and the first bootstrap checkpoint persisted."""
        consumer = self.consumer
        cp, total = self.conn.start_scn(position, self._ids())
        self.progress.total = total
        log.info("bootstrapping from %s: %s", self.cfg.bootstrap_url, cp.to_json())
        if cp.consumption_mode == ConsumptionMode.BOOTSTRAP_SNAPSHOT:
            known = self.registry.source_ids()
            schemas = [self.registry.latest(i) for i in (self._ids() or known) if i in known]
            call("on_bootstrap_snapshot_start", consumer.on_bootstrap_snapshot_start, schemas)
        try:
            self._save(cp)
        except TransientError:
            try:
                call("on_bootstrap_rollback", consumer.on_bootstrap_rollback,
                     cp.bootstrap_start_scn)
            except ConsumerCallbackError as exc:
                log.warning("on_bootstrap_rollback failed too: %s", exc)
            raise

    def _fetch(self, conn: BootstrapConnection, cp: Checkpoint) -> Batch:
        """One ``/bootstrap`` request, parsed (runs on either thread; touches no state)."""
        body = conn.bootstrap(cp, self._ids(), self.cfg.bootstrap_batch_size,
                              self.cfg.filter_for(self._ids() or []))
        return parse_batch(body, cp, self.cfg.verify_crc, lazy=self.batched)

    def _ensure_schemas(self, batch: Batch) -> None:
        # one event per schema (or per source, for events without one) is enough
        firsts: list[ev.Event] = []
        for _, evs in batch.sequences:
            if isinstance(evs, ScannedRows):
                firsts += [evs.scanned.events(a, a + 1)[0] for a, _ in evs.runs()]
            else:
                firsts += distinct_schemas(evs)
        if any(not self.views.known(e) for e in firsts):
            self._load_registry()
            for e in firsts:
                if not self.views.known(e):
                    raise SchemaError(f"bootstrap server sent source {e.src_id} schema "
                                      f"{e.schema_id.hex()} that its /register lacks")

    def _deliver(self, batch: Batch, cp: Checkpoint) -> None:
        c = self.consumer
        last = cp.bootstrap_start_scn
        for scn, events in batch.sequences:
            call("on_start_bootstrap_sequence", c.on_start_bootstrap_sequence, scn)
            if self.batched:
                self._deliver_runs(scn, events)
            else:
                self._deliver_each(events.events() if isinstance(events, ScannedRows)
                                   else events)
            call("on_end_bootstrap_sequence", c.on_end_bootstrap_sequence, scn)
            self.stats.events += len(events)
            last = scn
        call("on_bootstrap_checkpoint", c.on_bootstrap_checkpoint, last)
        assert batch.checkpoint is not None
        self._save(batch.checkpoint)

    def _deliver_each(self, events: list[ev.Event]) -> None:
        """``on_bootstrap_event`` per event of a sequence."""
        on_event = self.consumer.on_bootstrap_event
        # a view lookup per run of one schema, not per row
        for view, start, end in schema_runs(events, self.views):
            for i, e in enumerate(events[start:end], start + 1):
                # inline of call(): this loop runs once per row
                try:
                    result = on_event(DataEvent(e, view, i, i))
                except (ConsumerFatalError, ConsumerCallbackError):
                    raise
                except Exception as exc:  # broad: user code (see dispatcher.call)
                    raise ConsumerCallbackError(
                        f"on_bootstrap_event raised {type(exc).__name__}: {exc} "
                        f"(source {e.src_id}, key {e.key!r})") from exc
                if result is not None:
                    check_result(result, "on_bootstrap_event")

    def _deliver_runs(self, scn: int, events: SequenceEvents) -> None:
        """``on_bootstrap_events`` once per run of one schema view in a sequence;
        event orders are positions in the sequence, as the per-event path gives."""
        on_events = self.consumer.on_bootstrap_events
        runs: list[tuple[SchemaView, int, int]]
        if isinstance(events, ScannedRows):
            sc = events.scanned
            runs = [(self.views.view(sc.events(a, a + 1)[0]), a, b) for a, b in events.runs()]
        else:
            runs = schema_runs(events, self.views)
        for view, start, end in runs:
            run = (DataBatch(scn, events.scanned, view, start + 1, start + 1, start=start,
                             end=end) if isinstance(events, ScannedRows)
                   else DataBatch(scn, events[start:end], view, start + 1, start + 1))
            call("on_bootstrap_events", on_events, run,
                 context=f"scn {scn}, {view.schema.name}, {len(run)} events")

    def _save(self, cp: Checkpoint) -> None:
        try:
            self.store.save(cp)
        except DatabusError:
            raise
        except Exception as exc:  # broad: a checkpoint store may be the user's own code
            raise CheckpointStoreError(
                f"saving the bootstrap checkpoint failed: {type(exc).__name__}: {exc}") from exc
        self.persisted = cp
        self.on_saved(cp)
        self.stats.checkpoints += 1
