"""The applier: folds the bootstrap log into the snapshot, in SCN order.

For each window after ``applied_scn`` (a batch of up to ``batch_windows`` at a
time): insert / update / snapshot read -> the key's row becomes this image
(stored as an op READ event with the snapshot attribute, without the before
image), delete -> the key's row is removed, truncate -> every row of the
source is removed. A batch is collapsed to the last operation per key (what
applying them in order would leave) and written with the new ``applied_scn``
in one store transaction, so a crash never applies part of a batch.

Retention: with ``retention`` (seconds), every ``trim_interval`` the windows
stored longer ago than that and already folded are deleted from the log and
the log's start moves up (see :meth:`BootstrapStore.trim`).

Limit: a source must send a change of key as a delete of the old key and an
insert of the new one (the SQLite source does); an update event only ever
writes the row of its own key.

Concurrency model: one thread (:meth:`Applier.run`); stop it with the event.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from databus.bootstrap.store import BootstrapStore, key_bytes
from databus.core import event as ev
from databus.core.errors import DatabusError, TransientError

log = logging.getLogger("databus.bootstrap.applier")


def collapse(windows: list[tuple[int, bytes]]
             ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[int]]:
    """(upserts, deletes, truncated sources) that leave the snapshot as applying
    ``windows`` in order would.

    A truncation inside the batch is applied first by the store, so operations
    on that source before it are dropped here.
    """
    last: dict[tuple[int, bytes], tuple[int, bytes | None]] = {}
    truncated: list[int] = []
    for _scn, data in windows:
        for e in ev.iter_events(data):
            if e.is_control:
                continue
            op = e.op
            if op == ev.Op.TRUNCATE:
                for k in [k for k in last if k[0] == e.src_id]:
                    del last[k]
                if e.src_id not in truncated:
                    truncated.append(e.src_id)
                continue
            k = (e.src_id, key_bytes(e.key))
            if op == ev.Op.DELETE:
                last[k] = (e.scn, None)
            else:
                last[k] = (e.scn, ev.encode(
                    scn=e.scn, src_id=e.src_id, key=e.key, payload=e.payload,
                    schema_id=e.schema_id, schema_version=e.schema_version, op=ev.Op.READ,
                    timestamp_ns=e.timestamp_ns, partition=e.partition,
                    extra_attributes=ev.ATTR_SNAPSHOT))
    upserts = [{"src": s, "k": k, "scn": scn, "ev": image}
               for (s, k), (scn, image) in last.items() if image is not None]
    deletes = [{"src": s, "k": k} for (s, k), (_scn, image) in last.items() if image is None]
    return upserts, deletes, truncated


class Applier:
    """Keeps the snapshot of ``store`` up to date with its log."""

    def __init__(self, store: BootstrapStore, *, batch_windows: int = 500,
                 poll_interval: float = 0.2, retry_max: float = 10.0,
                 retention: float | None = None, trim_interval: float = 60.0) -> None:
        self.store = store
        self.retention = retention
        self.trim_interval = trim_interval
        self._next_trim = time.monotonic()
        self.batch_windows = batch_windows
        self.poll_interval = poll_interval
        self.retry_max = retry_max
        self.applied_scn = -1
        self.windows = 0
        self.error: str | None = None

    def step(self) -> int:
        """Apply one batch; the number of windows applied (0 = nothing new)."""
        state = self.store.state()
        if not state.initialized:
            return 0
        windows = self.store.log_after(state.applied_scn, self.batch_windows)
        if not windows:
            self.applied_scn = state.applied_scn
            return 0
        upserts, deletes, truncated = collapse(windows)
        self.store.fold(upserts, deletes, truncated, windows[-1][0])
        self.applied_scn = windows[-1][0]
        self.windows += len(windows)
        return len(windows)

    def trim(self) -> int | None:
        """Drop log windows older than the retention that are folded into the snapshot."""
        if self.retention is None:
            return None
        start = self.store.trim(time.time_ns() - int(self.retention * 1e9),
                                self.store.state().applied_scn)
        if start is not None:
            log.info("bootstrap log trimmed: it now starts after SCN %d", start)
        return start

    def run(self, stop: threading.Event) -> None:
        """Apply until ``stop`` is set; transient store errors are retried with backoff."""
        delay = self.poll_interval
        while not stop.is_set():
            try:
                n = self.step()
                if self.retention is not None and time.monotonic() >= self._next_trim:
                    self._next_trim = time.monotonic() + self.trim_interval
                    self.trim()
                self.error = None
                delay = self.poll_interval
            except TransientError as exc:
                self.error = str(exc)
                log.warning("applier: %s; retrying in %.1fs", exc, delay)
                stop.wait(delay)
                delay = min(delay * 2, self.retry_max)
                continue
            except DatabusError as exc:
                self.error = str(exc)
                log.error("applier stopped: %s", exc)
                raise
            if n == 0:
                stop.wait(self.poll_interval)
