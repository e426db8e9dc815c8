"""A relay: source -> fetcher thread -> event buffer -> HTTP.

Start-up decides where capture resumes:

* a persistent buffer that recovers with windows resumes after its newest
  window (``buffer.max_scn``);
* otherwise the buffer starts empty at the relay state's ``resume_scn`` (its
  trim SCN, what the source was last allowed to drop, or, when nothing was
  trimmed, the floor the buffer had proved); the source re-reads everything
  after it. Consumers whose checkpoint is older than that get ``ScnNotFound``;
* with no state at all the source starts where it starts (its end, a snapshot,
  a configured GTID) and the buffer proves continuity only from its first window
  on (:mod:`databus.buffer.ring`): an older checkpoint gets ``ScnNotFound``,
  never a jump over what changed while the relay was down. The log and
  ``/admin`` (``continuity``) say which range cannot be served.

A buffer file whose header is unreadable, or whose windows fail validation, is
refused (the relay does not start; the file is left as it is) unless
``buffer.recover`` is set, which keeps the valid windows and reads the rest
again from the source.

Before any of that the relay resolves its identity (:mod:`databus.relay.identity`:
its name, given or derived, and what is named after it) and locks its state and
buffer file: a second relay with the same name in the same state directory, or the
same buffer file, is refused with one line naming both; so is state from before names
were derived that this relay cannot prove its own.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp

from databus.buffer import EventBuffer
from databus.buffer.persist import HEADER_SIZE
from databus.core.errors import BufferCorruptError, DatabusError
from databus.relay.app import build_app as relay_app
from databus.relay.bufferspan import BufferSpanWatch
from databus.relay.cluster import ClusterMember
from databus.relay.config import RelayConfig
from databus.relay.consumers import ConsumerTable
from databus.relay.fetcher import Fetcher, RelayState
from databus.relay.identity import Claim, check_legacy_state, resolve
from databus.relay.member import idle_source, is_idle
from databus.relay.metrics import Observation, RelayMetrics
from databus.relay.timeline import Timeline
from databus.serving.health import Check
from databus.serving.service import HttpService
from databus.sources import open_source
from databus.sources.base import Capturer, Source
from databus.sources.chain import ChainSource
from databus.sources.config import AnySourceConfig
from databus.sources.protect import Protector

log = logging.getLogger("databus.relay")


class Relay(HttpService):
    """One relay. ``run()`` serves until interrupted; ``start()``/``stop()`` run it
    on a background thread (tests, embedding); see :class:`databus.serving.HttpService`."""

    admin_paths = frozenset({"/signal", "/admin"})

    def __init__(self, config: RelayConfig, source: Source | None = None) -> None:
        super().__init__(config.http, "relay")
        self.config = config
        self.metrics = RelayMetrics()
        self.timeline = Timeline()
        self.span_watch = BufferSpanWatch(config.buffer.min_span_seconds,
                                          persistent=config.buffer.path is not None)
        self.consumers = ConsumerTable(config.consumers)
        self.identity = identity = resolve(config)
        self.state_dir = identity.state_dir
        self.state_path = identity.state_path
        self.capturer: Capturer = identity.capturer()
        self.cluster: ClusterMember | None = None
        self._origin = ""
        # the locks first: a path that is not a buffer, a buffer or a state another relay
        # uses, are refused before anything is written (capture triggers, state files)
        self._claim = Claim(identity, config)
        try:
            check_legacy_state(identity)
            if source is None and config.cluster is not None:
                source = idle_source()  # the member's role decides: database or chain
            self.source = source if source is not None else self.open_source(config.source)
            state = RelayState.load(self.state_path)
            start_scn = state.resume_scn if state is not None else -1
            self.buffer = self._open_buffer(start_scn)
            try:
                self.source.open()  # connects and installs capture: start-up errors here
            except BaseException:
                self.buffer.close()
                raise
        except BaseException:
            self._claim.release()
            raise
        # said once the start cannot be refused any more (a refusal is one line)
        log.info("relay %s: name %s; state %s%s", identity.name, identity.origin,
                 self.state_path or "kept nowhere (memory buffer, no state_dir)",
                 f"; shared name {identity.shared}" if identity.shared != identity.name else "")
        self.continuity = self._continuity(start_scn)
        self.metrics.capacity.set(self.buffer.capacity)
        self.metrics.observe(self.observe)
        self.fetcher = self._fetcher(self.source)
        self.stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed = asyncio.Event()
        self._wake_pending = False
        self._last_wake = float("-inf")
        self.buffer.add_listener(self._on_append)
        self._switching = threading.Lock()
        if config.cluster is not None:
            self.cluster = ClusterMember(self, config.cluster)

    def open_source(self, config: AnySourceConfig) -> Source:
        """A source for ``config`` under this relay's identity (not yet opened)."""
        return open_source(config, state_dir=self.state_dir, capturer=self.capturer)

    def origin(self) -> str:
        """The captured database's identity (:meth:`Source.origin`): the current
        source's, else the last one known (a cluster member between roles)."""
        now = self.source.origin()
        if now:
            self._origin = now
        return self._origin

    def _fetcher(self, source: Source, guard: Callable[[], bool] | None = None,
                 ack_limit: Callable[[], int] | None = None) -> Fetcher:
        config = self.config
        return Fetcher(source, self.buffer, self.metrics, state_path=self.state_path,
                       name=self.identity.name,
                       flush_interval=config.buffer.flush_interval,
                       retry_initial=config.retry_initial, retry_max=config.retry_max,
                       protector=Protector(config.source.columns), guard=guard,
                       ack_limit=ack_limit, timeline=self.timeline,
                       span_watch=self.span_watch)

    def switch_source(self, source: Source, *, guard: Callable[[], bool] | None = None,
                      ack_limit: Callable[[], int] | None = None) -> None:
        """Capture from ``source`` from now on (a cluster member changing role): the
        running fetcher stops (its windows are in the buffer), ``source`` is opened and
        a new fetcher continues after the buffer's MaxSCN. Raises what ``open()``
        raises; the old source is closed either way."""
        with self._switching:
            self.fetcher.stop()
            old, self.source = self.source, source
            try:
                source.open()
            finally:
                old.close()
            self.fetcher = self._fetcher(source, guard, ack_limit)
            if self._loop is not None and not self.stopping:
                self.fetcher.start()

    def reset_buffer(self) -> None:
        """Drop every window and the recorded position (a cluster member whose windows
        may differ from its new leader's): capture starts again from the source's
        oldest window. Consumers with older checkpoints get ScnNotFound here."""
        with self._switching:
            self.fetcher.stop()
            self.buffer.close()
            path = self.config.buffer.path
            for f in (path, self.state_path):
                if f is not None:
                    f.unlink(missing_ok=True)
            self.buffer = self._open_buffer(-1)
            self.timeline.reset()
            self.buffer.add_listener(self._on_append)
            self.fetcher = self._fetcher(self.source)
            if self._loop is not None and not self.stopping:
                self.fetcher.start()
        log.warning("relay %s: buffer dropped; it starts again from its source's oldest"
                    " window", self.identity.name)

    def _open_buffer(self, start_scn: int) -> EventBuffer:
        cfg = self.config.buffer
        capacity = cfg.capacity_bytes
        if (cfg.path is not None and "capacity_bytes" not in cfg.model_fields_set
                and cfg.path.is_file() and cfg.path.stat().st_size > HEADER_SIZE):
            # a buffer file keeps the capacity it was made with unless one is given (one
            # made before the default grew is adopted, not refused)
            capacity = cfg.path.stat().st_size - HEADER_SIZE
        try:
            buf = EventBuffer(capacity, path=cfg.path, index_block=cfg.index_block,
                              start_scn=start_scn, recover=cfg.recover)
        except BufferCorruptError as exc:
            if not cfg.recover or cfg.path is None:
                raise
            aside = cfg.path.with_name(f"{cfg.path.name}.corrupt-{int(time.time())}")
            os.replace(cfg.path, aside)
            log.error("buffer file unusable (%s); buffer.recover is set: moved it to %s,"
                      " starting empty", exc, aside)
            buf = EventBuffer(capacity, path=cfg.path, index_block=cfg.index_block,
                              start_scn=start_scn)
        if buf.recovered_from_corruption:
            log.error("buffer recovery dropped corrupt data (buffer.recover is set): %s",
                      buf.recovery_report)
        return buf

    def _continuity(self, start_scn: int) -> str:
        """What this relay can prove about its history, logged once and shown in
        ``/admin``."""
        if self.buffer.max_scn >= 0 or start_scn >= 0:
            text = (f"continuous from scn {self.buffer.floor_scn}: checkpoints older than"
                    " that get ScnNotFound")
        else:
            text = ("started without a recorded position: checkpoints older than the first"
                    " window it captures get ScnNotFound (consumers bootstrap)")
        log.info("relay %s: %s", self.identity.name, text)
        return text

    # -- asyncio bridge ------------------------------------------------------
    #
    # Appends come from the fetcher thread, one per window; long polls wait on the
    # event loop. A wake is one pass over every waiting request (a buffer read and an
    # answer each), so its cost is per wake, not per window. Two rules keep wakes from
    # following the window rate:
    #
    # * one pending wake at a time: an append while a wake is already scheduled (not
    #   yet run) schedules nothing; that wake reads after it, so it sees the window;
    # * at most one wake per WAKE_INTERVAL: a wake due sooner than that after the
    #   last one is run at last + WAKE_INTERVAL. Windows arriving faster than that
    #   are answered together (10 windows per answer at 10,000 windows/s); a window
    #   after a quiet interval is answered at once. A window waits at most
    #   WAKE_INTERVAL more than it would with a wake per append.

    WAKE_INTERVAL = 0.001
    """Seconds between two wakes of long polls, at least (see above)."""

    def changed_event(self) -> asyncio.Event:
        """An event set at the next wake after an append (take it before reading the
        buffer: every append after that read is followed by a wake that sets it)."""
        return self._changed

    def _on_append(self) -> None:
        # the fetcher's thread (or any thread, through wake()): the flag is read and
        # set under the GIL; two threads both scheduling a wake is harmless (two wakes)
        if self._wake_pending:
            return
        loop = self._loop
        if loop is not None and not loop.is_closed():
            self._wake_pending = True
            try:
                loop.call_soon_threadsafe(self._schedule_wake)
            except RuntimeError:  # the loop closed in between
                self._wake_pending = False

    def wake(self) -> None:
        """Wake long polls (more windows became servable); safe from any thread."""
        self._on_append()

    def _schedule_wake(self) -> None:
        """On the loop: wake now, or at WAKE_INTERVAL after the last wake."""
        assert self._loop is not None
        due = self._last_wake + self.WAKE_INTERVAL
        if self._loop.time() >= due:
            self._notify()
        else:
            self._loop.call_at(due, self._notify)

    def _notify(self) -> None:
        # cleared before the event is set: an append after this point schedules a new
        # wake; one before it is in the buffer before the woken requests read it
        self._wake_pending = False
        if self._loop is not None:
            self._last_wake = self._loop.time()
        old, self._changed = self._changed, asyncio.Event()
        old.set()

    # -- stats -------------------------------------------------------------

    def fetcher_status(self) -> dict[str, Any]:
        return self.fetcher.status

    def capture_status(self) -> dict[str, Any]:
        """Whether this relay captures, for ``/admin`` and a cluster member's record:
        ``state`` (the fetcher's: starting, running, retrying, failed, fenced, stopped),
        ``reads`` (database, upstream: a chain or a cluster follower, nothing: a cluster
        member between roles), ``capturing`` and the last ``error``."""
        status = self.fetcher.status
        source = self.source
        reads = ("nothing" if is_idle(source) else
                 "upstream" if isinstance(source, ChainSource) else "database")
        return {"state": status["state"], "reads": reads,
                "capturing": reads != "nothing" and status["state"] in ("starting", "running",
                                                                        "retrying"),
                "error": status["last_error"]}

    def refresh_gauges(self) -> None:
        """Nothing to refresh: ``/metrics`` reads the relay's state when scraped
        (:meth:`observe`)."""

    def observe(self, *, consumers: bool = True) -> Observation:
        """The relay's state now: lag, capture, buffer, the source's statistics and
        (unless ``consumers`` is False) the consumers it served lately
        (docs/operations.md)."""
        buf = self.buffer.stats()
        timeline = self.timeline
        timeline.trim(buf["min_scn"])
        lag = timeline.lag_ns(time.time_ns()) / 1e9
        rows = (self.consumers.rows(timeline, min_scn=buf["min_scn"],
                                    evicting=buf["evicted_windows"] > 0,
                                    relay_lag=lag)
                if consumers else [])
        return Observation(
            lag_seconds=lag, captured_until_ns=timeline.captured_until_ns,
            last_window_ns=timeline.last_window_ns, capture=self.capture_status(),
            buffer=buf, span_seconds=timeline.span_ns(buf["min_scn"]) / 1e9,
            span_short=self.span_watch.short,
            source=self.source.stats(), consumers=rows)

    def readiness(self) -> list[Check]:
        """What ``/health/ready`` checks: capture runs (for a cluster member, from the
        database as a (co-)leader or from its leader as a follower)."""
        status = self.fetcher.status
        capture = self.capture_status()
        state = status["state"]
        since = max(time.time() - float(status.get("since") or time.time()), 0.0)
        why = ""
        if status.get("last_error"):
            why = f" ({str(status['last_error']).split(':', 1)[0]})"
        if capture["reads"] == "nothing":
            return [Check("capture", False, "a cluster member between roles: it captures"
                          f" nothing (for {since:.1f} s)")]
        ok = state == "running"
        what = "from its leader" if capture["reads"] == "upstream" and self.cluster else (
            "from its upstream relay" if capture["reads"] == "upstream" else "from the database")
        detail = f"capture {state}{why} {what} since {since:.1f} s"
        checks = [Check("capture", ok, detail)]
        problem = self.cluster.coordinator_problem() if self.cluster is not None else None
        if problem is not None:  # it cannot know whether its role still holds
            checks.append(Check("cluster", False, problem))
        return checks

    def stats(self) -> dict[str, Any]:
        return {
            "name": self.identity.name,
            "identity": self.identity.describe(),
            "origin": self.origin(),
            "sources": [{"id": s.id, "name": s.name} for s in self.source.sources()],
            "buffer": self.buffer.stats(),
            "fetcher": self.fetcher.status,
            # checkpoints below servable_from_scn get ScnNotFound (-1 before the first
            # window of a relay that started without a recorded position)
            "continuity": {"servable_from_scn": self.buffer.floor_scn, "note": self.continuity},
            **({"cluster": self.cluster.status()} if self.cluster is not None else {}),
        }

    # -- serving (HttpService) ------------------------------------------------

    def build_app(self) -> ASGIApp:
        return relay_app(self)

    def on_listening(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()
        self._claim.serving_at(self.url)
        self.fetcher.start()
        if self.cluster is not None:
            self.cluster.start()  # after the port is known: members advertise their URL

    async def on_exit_requested(self) -> None:
        # long polls wake and answer what they have: no request is left for uvicorn
        # to cancel (which logged an ASGI traceback and answered 500)
        self.stopping = True
        self._notify()

    async def on_shutdown(self) -> None:
        self.stopping = True
        self._notify()
        loop = asyncio.get_running_loop()
        if self.cluster is not None:
            await loop.run_in_executor(None, self.cluster.stop)
        await loop.run_in_executor(None, self.fetcher.stop)
        self.buffer.close()
        self.source.close()
        self._claim.release()

    def reload(self, new: RelayConfig) -> None:
        """Hand the source its new ``source`` section (tables added or removed while
        running; ``new`` is the config file read again, with the command line's options
        over it). Other sections need a restart. A source that cannot change is logged;
        the relay goes on."""
        try:
            if new.source == self.config.source:
                log.info("relay %s: config read again; the source's is unchanged",
                         self.identity.name)
                return
            self.source.reconfigure(new.source)
            self.config = self.config.model_copy(update={"source": new.source})
            log.info("relay %s: source config reloaded", self.identity.name)
        except DatabusError as exc:
            log.error("relay %s: config not reloaded: %s", self.identity.name, exc)
