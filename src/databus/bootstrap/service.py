"""One bootstrap service: initial load, producer, applier and HTTP server.

Concurrency model: the producer (after the initial load, if configured) and
the applier each run on their own thread; the server runs on asyncio
(uvicorn) and does its store reads in Starlette's thread pool. They share
nothing but the store, whose transactions keep them consistent. A component
that stops with a terminal error is reported by ``/admin``; the server keeps
serving what the store holds.

Initial load: when configured and the store has not completed one
(``initial_scn`` missing, also after a crash during it), the store is
emptied, the source's rows are read at a known SCN
(:mod:`databus.sources.txlog.initial`) into the snapshot, and the producer
continues from that SCN. Progress (rows, rate, ETA) is logged every
``progress_interval`` seconds. When the producer falls off the relay
(``ScnNotFound``: the service was down longer than the relay keeps
windows), the store is rebuilt the same way, since its log would have a gap;
consumers in the middle of a bootstrap get ``BootstrapTooYoung`` and start
theirs again. Without an initial load the producer stops with that error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from typing import Any

from starlette.applications import Starlette

from databus.bootstrap.applier import Applier
from databus.bootstrap.config import BootstrapConfig
from databus.bootstrap.metrics import BootstrapMetrics, readiness
from databus.bootstrap.producer import Producer
from databus.bootstrap.server import BootstrapServer, build_app
from databus.bootstrap.store import BootstrapStore, key_bytes
from databus.client.credentials import Credentials
from databus.core.errors import DatabusError, ScnNotFoundError
from databus.core.redact import redact_url
from databus.core.window import Window
from databus.serving.health import Check
from databus.serving.service import HttpService
from databus.sources.columns import ColumnFilter
from databus.sources.protect import Protector
from databus.sources.txlog.initial import InitialSnapshot

log = logging.getLogger("databus.bootstrap")


class LoadProgress:
    """Logs the initial load's ``done/total rows, rate, ETA`` at most every ``interval``
    seconds."""

    def __init__(self, what: str, total: int, interval: float) -> None:
        self.what, self.total, self.interval = what, total, interval
        self.start = self.last = time.monotonic()
        self.done = 0

    def add(self, n: int, force: bool = False) -> None:
        self.done += n
        now = time.monotonic()
        if not force and now - self.last < self.interval:
            return
        self.last = now
        rate = self.done / max(now - self.start, 1e-9)
        left = max(self.total - self.done, 0)
        eta = f"{left / rate:.0f}s" if rate > 0 else "?"
        log.info("%s: %d/%d rows, %.0f rows/s, ETA %s", self.what, self.done, self.total,
                 rate, eta)


def initial_load(cfg: BootstrapConfig, store: BootstrapStore, force: bool = False) -> int | None:
    """Run the initial load if it is configured and not done (or ``force``); returns
    its SCN."""
    il = cfg.initial_load
    if il is None or (not force and store.get("initial_scn") is not None):
        return None
    store.start_initial_load()
    protector = Protector(il.columns)
    columns = ColumnFilter(il.include_columns, il.exclude_columns)  # the relay's
    with InitialSnapshot(il.path, il.tables, columns=columns) as snap:
        progress = LoadProgress(f"initial load of {il.path}", snap.count(), cfg.progress_interval)
        registry = snap.registry()
        batch: list[dict[str, Any]] = []
        for e in snap.events():
            data = e.data
            if protector:  # the clear value never reaches the store
                data = bytes(protector.window(Window(snap.scn, data, 1, 0), registry).events)
            batch.append({"src": e.src_id, "k": key_bytes(e.key), "scn": snap.scn, "ev": data})
            if len(batch) >= 5000:
                store.load_rows(batch)
                progress.add(len(batch))
                batch = []
        if batch:
            store.load_rows(batch)
        progress.add(len(batch), force=True)
        store.finish_initial_load(snap.scn)
        log.info("initial load done at SCN %d", snap.scn)
        return snap.scn


class BootstrapService(HttpService):
    """Runs a whole bootstrap service; ``run()`` blocks, ``start()``/``stop()`` use a thread
    (see :class:`databus.serving.HttpService`)."""

    admin_paths = frozenset({"/admin"})

    def __init__(self, config: BootstrapConfig) -> None:
        super().__init__(config.http, "bootstrap")
        self.config = config
        self.store = BootstrapStore(config.store.connect_url())
        creds = Credentials.from_env(**config.relay.credential_fields())
        self.producer = Producer(self.store, config.relay.url, fetch_size=config.fetch_size,
                                 poll_timeout=config.poll_timeout, credentials=creds)
        self.applier = Applier(self.store, batch_windows=config.apply_batch_windows,
                               poll_interval=config.apply_interval,
                               retention=config.log_retention,
                               trim_interval=config.trim_interval)
        self.server = BootstrapServer(self.store, config.default_batch, self.status)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.load_error: str | None = None
        self.rebuilds = 0  # store rebuilds after the producer fell off the relay
        self.metrics = BootstrapMetrics(self.observe)

    def observe(self) -> dict[str, Any]:
        """The numbers ``/metrics`` shows (docs/operations.md)."""
        st = self.store.state()
        status = self.status()
        return {"lag_seconds": self.producer.lag_seconds(),
                "producer_scn": self.producer.last_scn, "applied_scn": st.applied_scn,
                "log_min_scn": st.log_start_scn, "log_max_scn": st.log_max_scn,
                "producer_windows": self.producer.windows,
                "applier_windows": self.applier.windows, "rebuilds": self.rebuilds,
                "producer_up": not status["producer"]["error"],
                "applier_up": not status["applier"]["error"]}

    def readiness(self) -> list[Check]:
        """What ``/health/ready`` checks: producer, applier, store."""
        return readiness(self.status(), self.store.state)

    def status(self) -> dict[str, Any]:
        return {"rebuilds": self.rebuilds,
                "producer": {"relay": redact_url(self.config.relay.url),
                             "last_scn": self.producer.last_scn,
                             "lag_seconds": self.producer.lag_seconds(),
                             "windows": self.producer.windows,
                             "state": "failed" if self.load_error else self.producer.state,
                             "error": self.load_error or self.producer.error},
                "applier": {"applied_scn": self.applier.applied_scn,
                            "windows": self.applier.windows, "state": self.applier.state,
                            "error": self.applier.error}}

    def _produce(self) -> None:
        rebuild = False
        while not self._stop.is_set():
            if not self._load(rebuild):
                return
            try:
                self.producer.run(self._stop)
                return
            except ScnNotFoundError as exc:
                if self.config.initial_load is None:
                    return  # recorded in producer.error, shown by /admin
                # the log would have a gap: rebuild the store from a new initial load
                # (consumers in the middle of a bootstrap start theirs again)
                log.warning("producer fell off the relay (%s); rebuilding the store with a "
                            "new initial load", exc)
                self.rebuilds += 1
                rebuild = True
            except DatabusError:
                return  # recorded in producer.error, shown by /admin

    def _load(self, rebuild: bool) -> bool:
        """The initial load (when configured and due), retried while transient."""
        while not self._stop.is_set():
            try:
                initial_load(self.config, self.store, force=rebuild)
                self.load_error = None
                return True
            except DatabusError as exc:
                self.load_error = f"initial load: {exc.code}: {exc}"
                log.warning("%s; retrying", self.load_error)
                if not exc.retryable or self._stop.wait(2.0):
                    return False
        return False

    def _apply(self) -> None:
        with contextlib.suppress(DatabusError):  # recorded in applier.error
            self.applier.run(self._stop)

    # -- serving (HttpService) ------------------------------------------------

    def build_app(self) -> Starlette:
        return build_app(self.server, self.metrics.render, self.readiness)

    def on_listening(self) -> None:
        for name, fn in (("producer", self._produce), ("applier", self._apply)):
            t = threading.Thread(target=fn, name=f"databus-bootstrap-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    async def on_shutdown(self) -> None:
        self._stop.set()
        for t in self._threads:
            await asyncio.get_running_loop().run_in_executor(None, t.join, 30.0)
        self.store.close()

    def request_exit(self, *_: Any) -> None:
        self._stop.set()  # the producer and the applier stop while the server drains
        super().request_exit()
