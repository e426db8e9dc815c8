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
from databus.client.dispatcher import call
from databus.client.falloff import fell_off
from databus.client.lag import LagClock
from databus.client.loop import Loop
from databus.client.metrics import ConsumerMetrics, measure
from databus.client.relay import RelayConnection
from databus.client.retry import Backoff, Stopped, retry_transient
from databus.client.stats import ClientStats
from databus.core.checkpoint import Checkpoint, ConsumptionMode
from databus.core.errors import (
    ConfigError,
    DatabusError,
    ScnNotFoundError,
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
                Loop(self, conn, stop, max_windows, fresh).run()
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
