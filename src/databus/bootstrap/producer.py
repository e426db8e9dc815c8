"""The producer: a relay client that appends every window to the bootstrap log.

It pulls ``/stream`` with its own checkpoint (kept in the store, written in the
same transaction as the windows it covers), so after a crash it asks the relay
for exactly the windows after the last ones stored: none lost, none stored
twice. A window the relay splits (larger than one response) is held in memory
until its EOP arrives and only then stored.

The relay's ``/sources`` and ``/register`` are copied into the store at start
and again whenever a window carries a schema id the stored copy lacks, so the
bootstrap server can serve schemas without the relay.

A relay that no longer holds the producer's position
(:class:`~databus.core.errors.ScnNotFoundError`) stops the producer with that
error: the log would have a gap. Rebuild the store (initial load) then.

Concurrency model: one thread (:meth:`Producer.run`); stop it with the event.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time

from databus.bootstrap.store import BootstrapStore
from databus.client.credentials import Credentials
from databus.client.relay import RelayConnection
from databus.core import event as ev
from databus.core.checkpoint import Checkpoint
from databus.core.errors import DatabusError, TransientError
from databus.core.schema import SchemaRegistry

log = logging.getLogger("databus.bootstrap.producer")


class Producer:
    """Copies a relay's windows into ``store``'s log."""

    def __init__(self, store: BootstrapStore, relay_url: str, *, fetch_size: int = 8 << 20,
                 poll_timeout: float = 2.0, http_timeout: float = 30.0,
                 retry_max: float = 10.0, credentials: Credentials | None = None) -> None:
        """``credentials``: the relay token and TLS files (default: the environment's)."""
        self.store = store
        self.credentials = credentials
        self.relay_url = relay_url
        self.fetch_size = fetch_size
        self.poll_timeout = poll_timeout
        self.http_timeout = http_timeout
        self.retry_max = retry_max
        self.registry = SchemaRegistry()
        self.last_scn = -1
        self.windows = 0
        self.error: str | None = None
        self.state = "running"  # "retrying" (a transient error), "failed" (a terminal one)
        self.relay_time_ns = 0  # the relay's captured-until at the last answer that was all
        self.window_ns = 0  # commit time of the newest window stored
        self.at_head = False  # the last answer left nothing the relay held
        self._eop_ns = 0

    def lag_seconds(self) -> float | None:
        """How far the log is behind the relay's source (docs/operations.md): at the
        relay's head, the relay's own lag (growing while the relay cannot be read);
        behind, the age of the newest window stored. None before the first answer."""
        now = time.time_ns()
        if self.at_head and self.relay_time_ns:
            return max(now - self.relay_time_ns, 0) / 1e9 if self.error else 0.0
        return max(now - self.window_ns, 0) / 1e9 if self.window_ns else None

    def _refresh_schemas(self, conn: RelayConnection) -> None:
        sources = conn.sources()
        self.registry = conn.register()
        # together: the server answers /register for every source it lists, so a
        # reader must never see a new source before its schemas (a 404 to a client)
        self.store.put_all({"registry": self.registry.to_json(),
                            "sources": json.dumps([{"id": i, "name": n} for i, n in sources])})

    def _split(self, data: bytes, pending: bytearray, pending_count: int
               ) -> tuple[list[tuple[int, bytes]], int, int, bool]:
        """Whole windows in ``pending + data``; the rest stays in ``pending``.

        Returns (windows, data events of the unfinished window, its scn or -1,
        whether a schema id unknown to :attr:`registry` was seen).
        """
        pending += data
        windows: list[tuple[int, bytes]] = []
        off = start = 0
        count = pending_count
        scn = -1
        unknown = False
        end = len(pending)
        while off < end:
            e = ev.decode(pending, off)  # checks both CRCs before anything is stored
            size = ev.peek_length(pending, off)
            if e.src_id == ev.SRC_EOP:
                windows.append((e.scn, bytes(pending[start:off + size])))
                self._eop_ns = e.timestamp_ns  # the window's commit time
                start, count, scn = off + size, 0, -1
            elif not e.is_control:
                count += 1
                scn = e.scn
                if e.schema_id and self.registry.find(e.schema_id) is None:
                    unknown = True
            off += size
        del pending[:start]
        return windows, count, scn, unknown

    def step(self, conn: RelayConnection, state: dict[str, object]) -> int:
        """One ``/stream`` request; stores the whole windows it completes."""
        cp = state["cp"]
        pending = state["pending"]
        assert isinstance(cp, Checkpoint) and isinstance(pending, bytearray)
        position = state["position"]
        assert isinstance(position, Checkpoint)
        resp = conn.stream(position, None, size=self.fetch_size, timeout=self.poll_timeout)
        self.at_head = resp.windows_behind == 0
        if resp.source_time_ns > 0:
            self.relay_time_ns = resp.source_time_ns
        if not resp.data:
            return 0
        count0 = int(str(state["count"]))
        windows, count, scn, unknown = self._split(resp.data, pending, count0)
        if unknown:
            self._refresh_schemas(conn)
        for w_scn, _ in windows:
            cp = cp.window_done(w_scn)
        if windows:
            self.store.append(windows, cp)
            self.last_scn = windows[-1][0]
            self.windows += len(windows)
            self.window_ns = self._eop_ns
        state["cp"] = cp
        state["count"] = count
        if pending and scn < 0:
            pending.clear()  # control events outside a window carry nothing to store
        state["position"] = cp.within(scn, count) if pending else cp
        return len(windows)

    def run(self, stop: threading.Event) -> None:
        """Produce until ``stop`` is set. Transient errors are retried with backoff."""
        delay = 0.2
        with RelayConnection(self.relay_url, http_timeout=self.http_timeout,
                             credentials=self.credentials,
                             consumer=f"bootstrap@{socket.gethostname()}") as conn:
            state: dict[str, object] | None = None
            while not stop.is_set():
                try:
                    if state is None:
                        self._refresh_schemas(conn)
                        if not self.store.state().initialized:
                            # no initial load: the relay is assumed to hold the
                            # source's history from its beginning
                            self.store.append([], Checkpoint.flexible(), log_start_scn=-1)
                        cp = self.store.producer_checkpoint() or Checkpoint.flexible()
                        state = {"cp": cp, "pending": bytearray(), "count": 0, "position": cp}
                        log.info("producer starting from %s", cp.to_json())
                    self.step(conn, state)
                    self.error = None
                    self.state = "running"
                    delay = 0.2
                except TransientError as exc:
                    self.error = str(exc)
                    self.state = "retrying"
                    log.warning("producer: %s; retrying in %.1fs", exc, delay)
                    state = None  # start again from the stored checkpoint
                    stop.wait(delay)
                    delay = min(delay * 2, self.retry_max)
                except DatabusError as exc:
                    self.error = f"{exc.code}: {exc}"
                    self.state = "failed"
                    log.error("producer stopped: %s", self.error)
                    raise
