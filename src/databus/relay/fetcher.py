"""The capture thread: moves windows from a :class:`Source` into the buffer.

Concurrency model: one dedicated thread per relay reads the source (blocking
database I/O) and appends to the buffer; the asyncio HTTP server only reads the
buffer. The bridge is the buffer's listener callback, which the relay turns
into a wake of the event loop: one pending at a time, at most one per
``Relay.WAKE_INTERVAL`` (:mod:`databus.relay.relay`).

Failure handling: a :class:`TransientError` (database went away, locked) is
retried with exponential backoff, interruptibly; a terminal error stops
capture, is reported by ``/admin`` and the metrics, and the relay keeps
serving what it holds.

Durability: every ``flush_interval`` seconds the buffer is flushed and the
relay state (max SCN, trim SCN, floor SCN, and the relay's name, which tells it
from state written before names were derived: :mod:`databus.relay.identity`)
written atomically; then the source
is told it may drop what has fallen off the buffer
(``Source.acknowledge(prev_scn)``), so the source keeps everything the relay
might need to rebuild its buffer.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from databus.buffer import EventBuffer
from databus.core.atomic import write_atomic
from databus.core.errors import (
    BufferCorruptError,
    DatabusError,
    StorageFullError,
    TransientError,
)
from databus.core.window import Window
from databus.relay.bufferspan import BufferSpanWatch
from databus.relay.metrics import RelayMetrics
from databus.relay.timeline import Timeline
from databus.sources.base import Source
from databus.sources.protect import Protector

log = logging.getLogger("databus.relay")


@dataclass(frozen=True)
class RelayState:
    """What a relay persists besides its buffer."""

    max_scn: int = -1
    trim_scn: int = -1
    # the oldest checkpoint the buffer could serve (EventBuffer.floor_scn): a restart
    # with an empty buffer resumes after it when nothing was trimmed yet
    floor_scn: int = -1
    # floor -1 because the source declared its whole history complete (not unknown)
    complete_from_start: bool = False
    name: str = ""  # the relay's; "" in state written before names were derived

    @property
    def resume_scn(self) -> int:
        """Where a relay restarting with an empty buffer resumes its source: after the
        trim point, or, when nothing was trimmed, after the floor it proved (never -1
        after windows were held: a source's fresh start would jump over the gap)."""
        if self.trim_scn >= 0:
            return self.trim_scn
        if self.floor_scn >= 0:
            return self.floor_scn
        return -1 if self.complete_from_start else self.max_scn

    @classmethod
    def load(cls, path: Path | None) -> RelayState | None:
        if path is None or not path.exists():
            return None
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            return cls(max_scn=int(raw["max_scn"]), trim_scn=int(raw["trim_scn"]),
                       floor_scn=int(raw.get("floor_scn", -1)),
                       complete_from_start=bool(raw.get("complete_from_start", False)),
                       name=str(raw.get("name", "")))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise BufferCorruptError(f"relay state file {path} is unreadable: {exc}") from exc

    def save(self, path: Path) -> None:
        data = json.dumps({"name": self.name, "max_scn": self.max_scn,
                           "trim_scn": self.trim_scn, "floor_scn": self.floor_scn,
                           "complete_from_start": self.complete_from_start}).encode()
        write_atomic(path, data)


class Fetcher:
    """Runs ``source`` into ``buffer`` on a daemon thread until :meth:`stop`."""

    def __init__(
        self,
        source: Source,
        buffer: EventBuffer,
        metrics: RelayMetrics,
        *,
        state_path: Path | None,
        name: str = "",
        flush_interval: float,
        retry_initial: float,
        retry_max: float,
        protector: Protector | None = None,
        guard: Callable[[], bool] | None = None,
        ack_limit: Callable[[], int] | None = None,
        timeline: Timeline | None = None,
        span_watch: BufferSpanWatch | None = None,
    ) -> None:
        """``guard`` (a cluster leader's fencing): asked before each batch of windows is
        appended; False drops the batch and ends the run in state ``fenced``.
        ``ack_limit``: the source is never told more than this SCN is durable (a
        cluster leader must keep what its followers do not hold yet). ``timeline``: told
        the commit time of every window appended and when the source was caught up
        (:mod:`databus.relay.timeline`). ``span_watch``: checked at each state write
        (:mod:`databus.relay.bufferspan`)."""
        self._timeline = timeline if timeline is not None else Timeline()
        self._span_watch = span_watch
        self._guard = guard
        self._ack_limit = ack_limit
        self._source = source
        self._buffer = buffer
        self._metrics = metrics
        self._state_path = state_path
        self._name = name
        self._flush_interval = flush_interval
        self._retry_initial = retry_initial
        self._retry_max = retry_max
        self._protector = protector if protector else None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="databus-fetcher", daemon=True)
        self._lock = threading.Lock()
        self._status: dict[str, Any] = {"state": "starting", "last_error": None, "retries": 0,
                                         "since": time.time()}

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def status(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._status)

    def _set(self, **kw: Any) -> None:
        with self._lock:
            if kw.get("state", self._status["state"]) != self._status["state"]:
                kw["since"] = time.time()  # when the state began (/health/ready says it)
            self._status.update(kw)
        self._metrics.fetcher_up.set(1 if self._status["state"] == "running" else 0)

    def _run(self) -> None:
        backoff = self._retry_initial
        last_flush = time.monotonic()
        self._set(state="running")
        while not self._stop.is_set():
            try:
                if time.monotonic() - last_flush >= self._flush_interval:
                    # first: while the state cannot be written (a full disk: a transient
                    # StorageFull) nothing more is read, so nothing is served past it
                    self.checkpoint()
                    last_flush = time.monotonic()
                if not self._buffer.origin_known and self._buffer.max_scn < 0:
                    # a fresh start: ask the source where its history is complete
                    origin = self._source.complete_after(-1)
                    if origin is not None:
                        self._buffer.declare_origin(origin)
                read_at = time.time_ns()
                windows = self._source.read(self._buffer.max_scn, self._stop, 0.5)
                if windows and self._guard is not None and not self._guard():
                    log.warning("not publishing %d window(s) from scn %d: this relay no longer"
                                " leads its cluster", len(windows), windows[0].scn)
                    self._set(state="fenced", last_error="leadership lost")
                    break
                if windows:
                    self._append(windows)
                self._caught_up(read_at, bool(windows))
                if self._status["state"] != "running":
                    self._set(state="running", last_error=None)
                backoff = self._retry_initial
            except TransientError as exc:
                self._metrics.source_errors.labels(kind="transient").inc()
                log.warning("source error, retrying in %.1fs: %s", backoff, exc)
                if isinstance(exc, StorageFullError):  # the state is written before any
                    last_flush = -math.inf             # more is read (see checkpoint above)
                self._set(state="retrying", last_error=f"{exc.code}: {exc}",
                          retries=self._status["retries"] + 1)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self._retry_max)
                continue
            except DatabusError as exc:
                self._metrics.source_errors.labels(kind="terminal").inc()
                log.error("capture stopped: %s", exc)
                self._set(state="failed", last_error=f"{exc.code}: {exc}")
                break
            # broad: the capture thread's top; a bug must not kill the relay silently
            except Exception as exc:
                self._metrics.source_errors.labels(kind="bug").inc()
                log.exception("capture stopped by an unexpected error")
                self._set(state="failed", last_error=f"{type(exc).__name__}: {exc}")
                break
        try:
            self.checkpoint()
        except TransientError as exc:  # stopping: the next start resumes from the last one
            log.error("could not persist the relay's state at stop: %s", exc)
        if self._status["state"] not in ("failed", "fenced"):
            self._set(state="stopped")

    def _caught_up(self, read_at: int, found: bool) -> None:
        """After a read that started at ``read_at``: the source's own word on how far it
        is complete, else, when the read found nothing (and was not cut short by a stop),
        everything committed before it started is held."""
        told = self._source.captured_until_ns()
        if told is not None:
            self._timeline.caught_up(told)
        elif not found and not self._stop.is_set():
            self._timeline.caught_up(read_at)

    def _append(self, windows: list[Window]) -> None:
        """Append one read's windows in order; the counters move once per read (a read
        of one-row transactions holds up to a few dozen windows)."""
        protector, append = self._protector, self._buffer.append_window
        events = appended = 0
        try:
            for w in windows:
                if protector is not None:  # before the buffer: no clear value kept
                    w = protector.window(w, self._source.registry())
                append(w)
                appended += 1
                events += w.count
        finally:  # what reached the buffer is counted, also when an append failed
            self._metrics.windows_in.inc(appended)
            self._metrics.events_in.inc(events)
            self._timeline.appended(windows[:appended])

    def checkpoint(self) -> None:
        """Flush the buffer, persist the state, let the source trim."""
        buf = self._buffer
        buf.flush()
        state = RelayState(max_scn=buf.max_scn, trim_scn=buf.prev_scn, floor_scn=buf.floor_scn,
                           complete_from_start=buf.origin_known and buf.floor_scn < 0,
                           name=self._name)
        if self._state_path is not None:
            state.save(self._state_path)
        self._timeline.trim(buf.min_scn)
        if self._span_watch is not None:
            self._span_watch.check(evicted=buf.stats()["evicted_windows"],
                                   span_seconds=self._timeline.span_ns(buf.min_scn) / 1e9,
                                   capacity=buf.capacity)
        trim = state.trim_scn
        if self._ack_limit is not None and trim >= 0:
            try:
                trim = min(trim, self._ack_limit())
            except TransientError:
                trim = -1  # not knowing what followers hold: trim nothing
        if trim >= 0:
            try:
                self._source.acknowledge(trim)
            except TransientError as exc:
                log.warning("could not acknowledge scn %d to the source: %s", trim, exc)
