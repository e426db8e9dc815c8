"""One run of the pull loop (:meth:`databus.client.client.DatabusClient.run`): fetch
an answer from the relay, reassemble its windows, dispatch them to the consumer, persist
checkpoints, and handle a failing window or relay. The contract (delivery guarantees,
checkpoints, retries) is :mod:`databus.client.client`'s; this module is how one
connection's run keeps it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

from databus.client.checkpoints import CheckpointStore
from databus.client.config import ClientConfig
from databus.client.consumer import Consumer
from databus.client.dispatcher import Dispatcher, SchemaViews, distinct_schemas
from databus.client.falloff import FallOffWatch
from databus.client.lag import LagClock
from databus.client.relay import RelayConnection
from databus.client.retry import Backoff, Stopped
from databus.client.stats import ClientStats
from databus.client.window import DecodedWindow, WindowAssembler
from databus.core import event as ev
from databus.core.checkpoint import Checkpoint
from databus.core.errors import (
    CheckpointStoreError,
    ConsumerCallbackError,
    CorruptEventError,
    DatabusError,
    RelayUnavailableError,
    RetriesExhaustedError,
    ScnNotFoundError,
    TransientError,
)
from databus.core.schema import SchemaRegistry

log = logging.getLogger("databus.client")


class Owner(Protocol):
    """What a run needs of its :class:`~databus.client.client.DatabusClient` (named here
    so this module does not import the one that runs it)."""

    config: ClientConfig
    consumer: Consumer
    store: CheckpointStore
    stats: ClientStats
    registry: SchemaRegistry
    persisted: Checkpoint
    source_ids: list[int]
    _lag: LagClock
    _relay_failing: bool

    def _backoff(self) -> Backoff: ...

    @property
    def _request_ids(self) -> list[int] | None: ...

    def bootstrap(self, stop: threading.Event) -> None: ...

    def refresh_schemas(self, conn: RelayConnection) -> None: ...

    def fall_off_relay(self, position: Checkpoint, exc: ScnNotFoundError) -> None: ...


class Loop:
    """One run of the pull loop (state that lives as long as ``run``)."""

    def __init__(self, client: Owner, conn: RelayConnection, stop: threading.Event,
                 max_windows: int | None, fresh: bool) -> None:
        self.client = client
        self.cfg = client.config
        self.conn = conn
        self.stop = stop
        self.max_windows = max_windows
        self.from_latest = fresh and not self.cfg.from_start
        self.views = SchemaViews(client.registry)
        self.dispatcher = Dispatcher(client.consumer, self.views)
        self.asm = WindowAssembler(client.persisted, verify=self.cfg.verify_crc)
        # after the last window dispatched, in memory (see the consumed property)
        self._consumed = client.persisted
        self._done_scn = self._done_prev = -1  # windows dispatched after _consumed:
        self._done_n = 0  # the last one, the one before it, how many
        self.unsaved = 0  # windows dispatched since the last persisted checkpoint
        self.body_bytes = 0  # of the last /stream answer
        # nobody sees a checkpoint between two windows of one answer when the consumer
        # neither has its own on_checkpoint nor is the checkpoint store: persisting is
        # then done once per answer (see _consume)
        self.coalesce = (not self.dispatcher.checkpoint_observed
                         and not isinstance(client.consumer, CheckpointStore))
        self.force = False
        self.done = 0
        self.relay_backoff = client._backoff()
        self.relay_failures = 0
        self.consumer_backoff = client._backoff()
        self.failing_scn = -2
        self.failures = 0
        self.watch = FallOffWatch(self.cfg.relay.url, self.cfg.fall_off_warning,
                                  bootstrap=self.cfg.bootstrap_url is not None)

    # -- the position -------------------------------------------------------------

    @property
    def consumed(self) -> Checkpoint:
        """The checkpoint after the last window dispatched (built when read: a window
        costs two ints here, not a checkpoint object)."""
        if self._done_n:
            cp = self._consumed
            if self._done_n > 1:
                cp = cp.window_done(self._done_prev)
            self._consumed = cp.window_done(self._done_scn)
            self._done_n = 0
        return self._consumed

    @consumed.setter
    def consumed(self, checkpoint: Checkpoint) -> None:
        self._consumed = checkpoint
        self._done_n = 0

    # -- the loop -------------------------------------------------------------------

    def run(self) -> None:
        """Pull and dispatch until stopped or done; then persist the position reached."""
        linger, linger_after = self.cfg.linger, self.cfg.linger_after_windows
        self.client.stats.state = "online"
        try:
            while not self.stop.is_set() and not self._enough():
                windows = self._fetch()
                if windows is not None:
                    self._consume(windows)
                    if (linger and len(windows) >= linger_after
                            and self.body_bytes < self.cfg.fetch_size // 2):
                        # windows come faster than answers go round: wait for more
                        # (an answer costs both sides more than a window does)
                        self.stop.wait(linger)
        except Stopped:
            pass
        self._final_checkpoint()

    def _enough(self) -> bool:
        return self.max_windows is not None and self.done >= self.max_windows

    def _fetch(self) -> list[DecodedWindow] | None:
        """The next whole windows; None after an idle poll or a handled failure."""
        client, cfg = self.client, self.cfg
        position = self.asm.position
        try:
            resp = self.conn.stream(
                position, client._request_ids, size=cfg.fetch_size,
                filter_json=cfg.filter_for(client.source_ids),
                timeout=cfg.poll_timeout, from_latest=self.from_latest and position.is_flexible)
            windows = self.asm.feed(resp.data)
            self.body_bytes = len(resp.data)
        except ScnNotFoundError as exc:
            client.fall_off_relay(position, exc)  # raises unless it can bootstrap
            self._switch_to_bootstrap()
            return None
        except (TransientError, CorruptEventError) as exc:
            self._relay_failed(exc)
            return None
        self.relay_failures = 0
        self.relay_backoff.reset()
        self.watch.answer(resp.min_scn)
        client.stats.state, client._relay_failing = "online", False
        client._lag.answer(windows, resp.source_time_ns, resp.windows_behind, client.stats.events)
        if self.from_latest and position.is_flexible:
            self._pin_latest(resp.data, resp.max_scn)
        elif position.is_flexible and resp.data and resp.prev_scn >= 0:
            self._started_after_a_gap(resp.prev_scn)
        if not resp.data:
            if self.unsaved:
                try:
                    self._checkpoint()
                except (ConsumerCallbackError, TransientError) as exc:
                    self._window_failed(self.consumed.window_scn, exc)
            return None
        return windows

    def _switch_to_bootstrap(self) -> None:
        """Persist what was consumed, bootstrap, then pull from the relay after the
        bootstrap's target SCN."""
        if self.unsaved:
            try:
                self._checkpoint()
            except (ConsumerCallbackError, TransientError) as exc:
                self._window_failed(self.consumed.window_scn, exc)
                return
        self.client.bootstrap(self.stop)
        self.asm.reset(self.client.persisted)
        self.consumed = self.client.persisted
        self.unsaved = 0
        self.from_latest = False

    def _started_after_a_gap(self, prev_scn: int) -> None:
        """A new consumer (no checkpoint, ``from_start``) starts at the relay's oldest
        window, and the relay said it no longer holds the windows up to ``prev_scn``:
        changes made only in those are missing from what this consumer receives (a
        replica lacks their rows). Said once, as a warning: a target loaded by other
        means may need nothing more."""
        log.warning(
            "%s: a new consumer starts at the relay's oldest window, and the relay no longer"
            " holds the windows up to scn %d: what changed only in those is missing from"
            " what this consumer receives (a new replica lacks those rows). To start"
            " complete: a bootstrap server (bootstrap_url, --bootstrap URL), or a relay"
            " whose buffer still holds its first windows (a larger --buffer-size, a"
            " persistent buffer: --buffer-path)", self.cfg.relay.url, prev_scn)

    def _pin_latest(self, data: bytes, max_scn: int) -> None:
        """``from_start=False``: fix "from now on" to a real position at the first answer.

        Otherwise a replay (or the next idle poll) would ask for "latest" again
        and skip what was committed in between. The position is kept in memory
        only until the first checkpoint is persisted.
        """
        if data:
            pinned = Checkpoint.after(max(ev.peek_scn(data, 0) - 1, 0))
        elif max_scn >= 0:
            pinned = Checkpoint.after(max_scn)
            self.asm.reset(pinned)
        else:
            return  # the relay did not say where it is: ask for "latest" again
        self.from_latest = False
        self.consumed = self.client.persisted = pinned

    def _relay_failed(self, exc: DatabusError) -> None:
        self.relay_failures += 1
        stats, self.client._relay_failing = self.client.stats, True
        stats.relay_errors += 1
        stats.state, stats.last_error = "retrying", f"{exc.code}: {exc}"
        limit = self.cfg.relay_max_retries
        if limit is not None and self.relay_failures > limit:
            raise RetriesExhaustedError(
                f"relay failed {self.relay_failures} times in a row; last error: {exc}") from exc
        log.warning("relay problem (%s: %s), attempt %d; retrying", exc.code, exc,
                    self.relay_failures)
        if self.relay_backoff.wait(self.stop):
            raise Stopped

    def _consume(self, windows: list[DecodedWindow]) -> None:
        try:
            self._ensure_schemas(windows)
        except TransientError as exc:
            self.asm.reset(self.consumed)
            self._relay_failed(exc)
            return
        if self.dispatcher.many:
            self._consume_many(windows)
            return
        every = self.cfg.checkpoint_every_windows
        coalesce = self.coalesce
        dispatch = self.dispatcher.dispatch
        stats = self.client.stats
        for w in windows:
            if self.stop.is_set() or self._enough():
                # the rest is fetched again next time
                self._due_checkpoint()
                self.asm.reset(self.consumed)
                return
            try:
                out = dispatch(w)
            except (ConsumerCallbackError, TransientError) as exc:
                # the windows before it stay consumed as if each had been persisted
                # at its end; only this one is replayed
                if coalesce and not self._due_checkpoint():
                    return
                self._window_failed(w.scn, exc)
                return
            self._done_prev, self._done_scn = self._done_scn, w.scn
            self._done_n += 1
            self.unsaved += 1
            self.force |= out.force_checkpoint
            if self.force or (not coalesce and self.unsaved >= every):
                try:
                    self._checkpoint()
                except (ConsumerCallbackError, TransientError) as exc:
                    self._window_failed(w.scn, exc)
                    return
            stats.windows += 1
            stats.events += out.events
            stats.last_scn = w.scn
            self.done += 1
        if windows:  # the first (kept when a second after the last kept) and the last
            first, last = windows[0], windows[-1]
            self.watch.consumed(first.scn, first.timestamp_ns)
            self.watch.consumed(last.scn, last.timestamp_ns)
        self._due_checkpoint()

    def _consume_many(self, windows: list[DecodedWindow]) -> None:
        """The windows of an answer in one ``on_windows`` call, as one unit: a failure
        replays them all from the persisted checkpoint."""
        given = len(windows)
        if self.max_windows is not None:
            windows = windows[:max(self.max_windows - self.done, 0)]
        if self.stop.is_set() or not windows:
            self.asm.reset(self.consumed)  # the rest is fetched again next time
            return
        try:
            out = self.dispatcher.dispatch_many(windows)
        except (ConsumerCallbackError, TransientError) as exc:
            self._window_failed(windows[0].scn, exc)
            return
        n = len(windows)
        self._done_prev = windows[-2].scn if n > 1 else self._done_scn
        self._done_scn, self._done_n = windows[-1].scn, self._done_n + n
        self.unsaved += n
        self.force |= out.force_checkpoint
        if self.force or self.unsaved >= self.cfg.checkpoint_every_windows:
            try:
                self._checkpoint()
            except (ConsumerCallbackError, TransientError) as exc:
                self._window_failed(windows[-1].scn, exc)
                return
        stats = self.client.stats
        stats.windows += n
        stats.events += out.events
        stats.last_scn = windows[-1].scn
        self.done += n
        self.watch.consumed(windows[0].scn, windows[0].timestamp_ns)
        self.watch.consumed(windows[-1].scn, windows[-1].timestamp_ns)
        if n < given:
            self.asm.reset(self.consumed)  # the rest is fetched again next time

    def _due_checkpoint(self) -> bool:
        """Persist what the windows dispatched so far made due, when persisting is
        coalesced per answer: after the last of them, once. False when that failed
        (the failure was handled: rolled back to the checkpoint persisted before)."""
        if not self.coalesce or self.unsaved < self.cfg.checkpoint_every_windows:
            return True
        scn = self._done_scn if self._done_n else self._consumed.window_scn
        try:
            self._checkpoint()
        except (ConsumerCallbackError, TransientError) as exc:
            self._window_failed(scn, exc)
            return False
        return True

    def _ensure_schemas(self, windows: list[DecodedWindow]) -> None:
        views = self.views
        firsts = [e for w in windows for e in distinct_schemas(w.events)]
        if all(views.known(e) for e in firsts):
            return
        log.info("unknown schema in the stream; fetching /register again")
        self.client.refresh_schemas(self.conn)
        self.views = SchemaViews(self.client.registry)
        self.dispatcher.views = self.views
        for e in firsts:
            if not self.views.known(e):
                # transient: a relay changing role (a cluster member between capture
                # sources) can serve its buffer a moment before it lists every
                # version again; the windows are fetched again after a back-off
                raise RelayUnavailableError(
                    f"relay {self.conn.url} sent an event of source {e.src_id} "
                    f"with schema id {e.schema_id.hex()} that /register does not list")

    # -- checkpoints and failures ----------------------------------------------------

    def _checkpoint(self) -> None:
        """on_checkpoint, then persist ``consumed`` unless the consumer skips it.

        Raises ConsumerCallbackError / TransientError (handled as a window failure).
        """
        cp = self.consumed
        if self.dispatcher.checkpoint(cp.window_scn):
            try:
                self.client.store.save(cp)
            except DatabusError:
                raise
            except Exception as exc:  # broad: a checkpoint store may be the user's own code
                raise CheckpointStoreError(
                    f"saving the checkpoint failed: {type(exc).__name__}: {exc}") from exc
            self.client.persisted = cp
            self.client.stats.checkpoints += 1
            self.client.stats.checkpoint_at = time.time()
        self.unsaved = 0
        self.force = False

    def _window_failed(self, scn: int, exc: DatabusError) -> None:
        client = self.client
        if scn > self.failing_scn:
            self.failing_scn, self.failures = scn, 0
            self.consumer_backoff.reset()
        self.failures += 1
        client.stats.rollbacks += 1
        client.stats.state, client.stats.last_error = "retrying", f"{exc.code}: {exc}"
        persisted = client.persisted
        good = persisted.prev_scn if persisted.in_window else persisted.window_scn
        log.warning("window %d failed (%s); rolling back to %d (failure %d of %d allowed)",
                    scn, exc, good, self.failures, self.cfg.max_retries + 1)
        try:
            self.dispatcher.rollback(good)
        except ConsumerCallbackError as rb_exc:
            log.warning("on_rollback failed too: %s", rb_exc)
        # replay from the persisted checkpoint
        self.asm.reset(persisted)
        self.consumed = persisted
        self.unsaved = 0
        self.force = False
        if self.failures > self.cfg.max_retries:
            raise RetriesExhaustedError(
                f"window {scn} failed {self.failures} times (max_retries="
                f"{self.cfg.max_retries}); last error: {exc}") from exc
        client.stats.replays += 1
        if self.consumer_backoff.wait(self.stop):
            raise Stopped

    def _final_checkpoint(self) -> None:
        """At exit: persist the position reached if it was not yet (a window end)."""
        if not self.unsaved:
            return
        try:
            self._checkpoint()
        except DatabusError as exc:
            log.warning("final checkpoint not saved (%s); the last %d windows will be "
                        "delivered again", exc, self.unsaved)
            try:
                self.dispatcher.rollback(self.client.persisted.window_scn)
            except DatabusError as rb_exc:
                log.warning("on_rollback failed: %s", rb_exc)

