"""The pull loop: fetch windows from a relay and dispatch them to a consumer.

Concurrency model: :meth:`DatabusClient.run` runs on the caller's thread and
does everything there (HTTP, decoding, callbacks, checkpoint writes), one
window after another; a :class:`~databus.client.group.ConsumerGroup` consumer
fans callbacks out to worker threads of its own. Stop it from any thread with
the ``stop`` event; it returns within one long poll (``poll_timeout`` plus
``http_timeout`` at worst), after finishing the window it is dispatching.

Delivery guarantees:

* Windows are dispatched whole (split windows are reassembled first), in SCN
  order, each as start sequence / sources / end sequence.
* At least once: the checkpoint is persisted only at a window end, after the
  window and ``on_checkpoint`` succeeded (every window, or every
  ``checkpoint_every_windows`` windows, or when a callback returned
  CHECKPOINT; also when the relay is idle and when the client stops). After a
  failure or a restart, the windows after the persisted checkpoint are
  delivered again, whole and identical.
* When nobody can see a checkpoint between two windows (the consumer keeps
  ``Consumer.on_checkpoint`` and is not itself the checkpoint store), the
  checkpoints due while the windows of one ``/stream`` answer are dispatched are
  persisted once, after the last of them (or before a failing window is rolled
  back, so only that window is replayed, or when the client stops); never
  ahead of a window whose callbacks have not all returned. A crash can then
  replay up to one answer's windows.
* A failing window (ERROR or an exception from a callback, or a checkpoint
  that could not be saved) -> ``on_rollback(scn of the persisted checkpoint)``,
  backoff, then replay from the persisted checkpoint (fetched again from the
  relay). After ``max_retries`` replays of the same failure: ``on_error`` and
  :class:`~databus.core.errors.RetriesExhaustedError`.
* ERROR_FATAL -> ``on_error`` and :class:`~databus.core.errors.ConsumerFatalError`.
* Relay unavailable (transient) -> logged and retried with backoff, forever by
  default (``relay_max_retries``).
* Checkpoint older than the relay's buffer -> with a ``bootstrap_url``: a
  bootstrap (:mod:`databus.client.bootstrap`), then the relay again after its
  target SCN; without one, ``on_error`` and
  :class:`~databus.core.errors.ScnNotFoundError` whose message names what would have
  kept the consumer on the relay. Before that, a consumer whose position comes within
  ``fall_off_warning`` seconds of source time of the relay's oldest window is warned
  about in the log (:mod:`databus.client.falloff`).

Starting position: the stored checkpoint (a bootstrap checkpoint resumes that
bootstrap); with none stored, a bootstrap when ``bootstrap_url`` is set and
``bootstrap_new_consumers``, else a flexible checkpoint (the oldest window the
relay holds) unless ``from_start=False`` (only windows committed from now on).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from databus.client.bootstrap import BootstrapRunner
from databus.client.checkpoints import (
    CheckpointStore,
    FileCheckpointStore,
    MemoryCheckpointStore,
    consumer_name,
)
from databus.client.config import ClientConfig
from databus.client.consumer import Consumer
from databus.client.dispatcher import Dispatcher, SchemaViews, call, distinct_schemas
from databus.client.falloff import FallOffWatch, fell_off
from databus.client.lag import LagClock
from databus.client.metrics import ConsumerMetrics, measure
from databus.client.relay import RelayConnection
from databus.client.retry import Backoff, Stopped, retry_transient
from databus.client.stats import ClientStats
from databus.client.window import DecodedWindow, WindowAssembler
from databus.core import event as ev
from databus.core.checkpoint import Checkpoint, ConsumptionMode
from databus.core.errors import (
    CheckpointStoreError,
    ConfigError,
    ConsumerCallbackError,
    CorruptEventError,
    DatabusError,
    RelayUnavailableError,
    RetriesExhaustedError,
    ScnNotFoundError,
    TransientError,
    UnknownSourceError,
)
from databus.core.schema import SchemaRegistry

log = logging.getLogger("databus.client")
T = TypeVar("T")


class DatabusClient:
    """Consumes a relay's stream with ``consumer``; see the module docstring.

    ``checkpoint_store``: where the position is kept. When None: the consumer
    itself if it is a :class:`CheckpointStore` (sinks that commit their
    position with their effect), else ``FileCheckpointStore(config.checkpoint_path)``
    when a path is configured, else memory only (a restart begins again).
    Stores the client created itself are closed when :meth:`run` returns.
    """

    def __init__(self, config: ClientConfig, consumer: Consumer,
                 checkpoint_store: CheckpointStore | None = None) -> None:
        self.config = config
        self.consumer = consumer
        self._own_store = False
        if checkpoint_store is None:
            if isinstance(consumer, CheckpointStore):
                checkpoint_store = consumer
            elif config.checkpoint_path is not None:
                checkpoint_store = FileCheckpointStore(config.checkpoint_path)
                self._own_store = True
            else:
                log.warning("no checkpoint store configured: the position is kept in memory only")
                checkpoint_store = MemoryCheckpointStore()
                self._own_store = True
        self.store = checkpoint_store
        self.name = config.consumer_name or consumer_name(checkpoint_store)
        """This consumer's name: sent with every request, the label of its metrics."""
        self.stats = ClientStats()
        self._lag = LagClock(lambda: self.stats.last_scn)
        self._relay_failing = False  # the last request to the relay failed
        self.source_ids: list[int] = []
        self.registry = SchemaRegistry()
        self.persisted = Checkpoint.flexible()
        self._stop_requested = threading.Event()
        self._running_stop: threading.Event | None = None

    # -- public --------------------------------------------------------------

    def stop(self) -> None:
        """Ask :meth:`run` to return (after the window being dispatched).

        Safe to call from any thread and from a signal handler: the events are
        set from a helper thread, so the handler never blocks on a lock the
        interrupted thread holds.
        """
        targets = [e for e in (self._stop_requested, self._running_stop) if e is not None]

        def set_all() -> None:
            for e in targets:
                e.set()

        threading.Thread(target=set_all, name="databus-client-stop", daemon=True).start()

    def run(self, stop: threading.Event | None = None, max_windows: int | None = None) -> None:
        """Consume until ``stop`` is set (or :meth:`stop` is called), ``max_windows``
        windows were dispatched, or an error that retrying cannot fix (raised after
        ``on_error``)."""
        stop = stop if stop is not None else self._stop_requested
        self._running_stop = stop
        if self._stop_requested.is_set():
            stop.set()
        conn = RelayConnection(self.config.relay.url, http_timeout=self.config.http_timeout,
                               credentials=self.config.credentials(), consumer=self.name)
        started = False
        self.stats.state = "starting"
        try:
            try:
                fresh = self._prepare(conn, stop)
                call("on_start_consumption", self.consumer.on_start_consumption)
                started = True
                if self._bootstrap_first(fresh):
                    self.bootstrap(stop)
                    fresh = False
                _Loop(self, conn, stop, max_windows, fresh).run()
            except Stopped:
                pass
            except DatabusError as exc:
                self.stats.state, self.stats.last_error = "failed", f"{exc.code}: {exc}"
                self._notify_error(exc)
                raise
            self.stats.state = "stopped"
        finally:
            if started:
                try:
                    call("on_stop_consumption", self.consumer.on_stop_consumption)
                except DatabusError as exc:
                    log.warning("on_stop_consumption failed: %s", exc)
            conn.close()
            if self._own_store:
                self.store.close()

    # -- start-up ----------------------------------------------------------------

    def _prepare(self, conn: RelayConnection, stop: threading.Event) -> bool:
        """Resolve sources, load schemas and the checkpoint; True if none was stored."""
        backoff = self._backoff()
        self.source_ids = self._retry(lambda: self._resolve(conn), "listing sources", stop,
                                      backoff)
        self.registry = self._retry(lambda: conn.register(self._request_ids), "loading schemas",
                                    stop, backoff)
        stored = self._retry(self.store.load, "loading the checkpoint", stop, backoff)
        self.persisted = stored if stored is not None else Checkpoint.flexible()
        log.info("consuming %s from %s, checkpoint %s", self.source_ids, self.config.relay.url,
                 self.persisted.to_json() if stored is not None else "none (new consumer)")
        return stored is None

    @property
    def _request_ids(self) -> list[int] | None:
        """Ids sent to the relay; None (= all, including sources added later) when
        the configuration names none."""
        return self.source_ids if self.config.sources else None

    def _resolve(self, conn: RelayConnection) -> list[int]:
        served = conn.sources()
        by_name = {name: sid for sid, name in served}
        ids = {sid for sid, _ in served}
        if not self.config.sources:
            return sorted(ids)
        missing = [s for s in self.config.sources
                   if (s if isinstance(s, int) else by_name.get(s)) not in ids]
        if missing:  # the relay says why: not served (404), or not for this token (403)
            names = [s for s in missing if isinstance(s, str)]
            if names:
                conn.sources(names)
            numbers = [s for s in missing if isinstance(s, int)]
            if numbers:
                conn.register(numbers)
        out: list[int] = []
        for s in self.config.sources:
            sid = s if isinstance(s, int) else by_name.get(s)
            if sid is None or sid not in ids:
                raise UnknownSourceError(
                    f"relay {self.config.relay.url} has no source {s!r}; it serves "
                    f"{sorted(served, key=lambda p: p[0])}")
            if sid not in out:
                out.append(sid)
        return out

    def _backoff(self) -> Backoff:
        return Backoff(self.config.backoff_initial, self.config.backoff_max)

    def _retry(self, fn: Callable[[], T], what: str, stop: threading.Event,
               backoff: Backoff) -> T:
        return retry_transient(fn, what, stop, backoff, limit=self.config.relay_max_retries,
                               on_failure=self._count_relay_error)

    def _count_relay_error(self, _: Exception) -> None:
        self.stats.relay_errors += 1

    def refresh_schemas(self, conn: RelayConnection) -> None:
        """Fetch ``/register`` again (after a schema change at the source)."""
        self.registry = conn.register(self._request_ids)

    # -- bootstrap -----------------------------------------------------------------

    def _bootstrap_first(self, fresh: bool) -> bool:
        """Whether to bootstrap before pulling from the relay."""
        if self.persisted.consumption_mode != ConsumptionMode.ONLINE_CONSUMPTION:
            if self.config.bootstrap_url is None:
                raise ConfigError(
                    f"the stored checkpoint is a bootstrap checkpoint "
                    f"({self.persisted.consumption_mode.value}); configure bootstrap_url to "
                    "finish that bootstrap")
            return True
        return fresh and self.config.bootstrap_url is not None \
            and self.config.bootstrap_new_consumers

    def bootstrap(self, stop: threading.Event) -> None:
        """Bootstrap from the persisted checkpoint (see :mod:`databus.client.bootstrap`);
        afterwards ``persisted`` is the online checkpoint to continue on the relay."""
        runner = BootstrapRunner(self.config, self.consumer, self.store, self.stats,
                                 self._request_ids, stop, on_saved=self._saved)
        self.stats.state, self._lag.bootstrap_since = "bootstrapping", time.time()
        try:
            self.persisted = runner.run(self.persisted)
        finally:
            self._lag.bootstrap_since = None

    def _saved(self, checkpoint: Checkpoint) -> None:
        self.persisted = checkpoint
        self.stats.checkpoint_at = time.time()

    # -- what it measures ------------------------------------------------------------

    def metrics(self) -> ConsumerMetrics:
        """This consumer's numbers now (docs/operations.md, "Consumers"): lag in seconds
        and windows, checkpoint age, counters, state. Safe from any thread."""
        return measure(self.name, self.stats, self._lag, relay_failing=self._relay_failing)

    # -- errors ------------------------------------------------------------------

    def fall_off_relay(self, position: Checkpoint, exc: ScnNotFoundError) -> None:
        """The relay no longer holds ``position``: returns when a bootstrap server is
        configured (the caller bootstraps), else raises (:func:`~.falloff.fell_off`)."""
        fell_off(self.config.relay.url, self.config.bootstrap_url, position, exc)

    def _notify_error(self, exc: DatabusError) -> None:
        try:
            self.consumer.on_error(exc)
        except Exception:  # broad: user code, told of an error that is handled anyway
            log.exception("on_error raised")


class _Loop:
    """One run of the pull loop (state that lives as long as ``run``)."""

    def __init__(self, client: DatabusClient, conn: RelayConnection, stop: threading.Event,
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

