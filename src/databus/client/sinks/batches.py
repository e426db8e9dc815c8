"""Whole windows gathered into batches on the client's thread, committed by one writer
thread: while a batch is written, the next one is gathered.

Contract of :class:`BatchPipeline` (the replicate sink's; ``commit`` writes one batch and
its checkpoint in one target transaction):

* **Batches.** :meth:`BatchPipeline.add` appends a whole window to the open batch. The
  batch is sealed (handed to the writer) when it holds ``rows`` row changes or ``bytes``
  bytes of rows, or, by the writer, when it is ``linger`` seconds old and the writer is
  free. A batch sealed by size is first given to ``prepare`` (when set), on the client's
  thread and outside the lock: work done there overlaps the writer's statements. Batches are committed one at a time, in order. At most three are in memory:
  one written, one sealed, one open; :meth:`add` waits while a sealed one waits.
* **Failures.** When ``commit`` raises, nothing after that batch is committed until
  :meth:`discard`: the error is raised by the next :meth:`add`, :meth:`check` or
  :meth:`flush` on the client's thread. Windows up to the failed batch's last one are
  then committed one per batch and synchronously (:meth:`add` waits for the commit and
  raises its error), so a window that keeps failing fails in its own callback, the
  client's retry count is counted against it, and the windows before it are committed.
* **Flush.** :meth:`flush` seals the open batch and returns when every batch is
  committed, raising a failure: what the client's checkpoint save needs.
* **Discard** (the client rolls back): waits for the batch being written (committed or
  not: the caller skips what the target holds when windows come again), drops the rest.

Threading: :meth:`add`, :meth:`check`, :meth:`flush`, :meth:`discard` and :meth:`close`
are called by one thread (the client's); the writer thread is started by the first
:meth:`add` and stopped by :meth:`close`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from databus.client.config import BatchConfig
from databus.client.sinks.apply import Step, Writers
from databus.core.errors import DatabusError, SinkUnavailableError
from databus.core.event import Event

log = logging.getLogger("databus.client.replicate")


@dataclass
class Batch:
    """Whole windows, in order, their row changes (events) and the writer of each
    event's :func:`~databus.client.sinks.apply.writer_key`."""

    started: float
    scns: list[int] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    writers: Writers = field(default_factory=dict)
    nbytes: int = 0
    plan: list[Step] | None = None
    """Its statements, when planned on the client's thread as it was sealed."""

    def describe(self) -> str:
        first, last = self.scns[0], self.scns[-1]
        return f"window {first}" if first == last else f"windows {first}..{last}"


class BatchPipeline:
    """See the module docstring."""

    def __init__(self, commit: Callable[[Batch], None], config: BatchConfig,
                 name: str = "replicate", prepare: Callable[[Batch], None] | None = None
                 ) -> None:
        self._commit = commit
        self._prepare = prepare
        self.cfg = config
        self.name = name
        self._cv = threading.Condition()
        self._open: Batch | None = None
        self._sealed: Batch | None = None
        self._busy = False
        self._error: Exception | None = None
        self._careful_until = -1  # windows up to this one: a batch each, synchronously
        self._closing = False
        self._thread: threading.Thread | None = None
        self.committed = 0
        """Batches committed so far."""
        self.windows = 0
        """Windows in them."""
        self.writer_cpu = 0.0
        """CPU seconds the writer thread spent committing."""

    # -- the client's thread ----------------------------------------------------------

    def add(self, scn: int, events: list[Event], nbytes: int,
            writers: Writers | None = None) -> None:
        """Window ``scn`` (its row changes) into the open batch; see the module docstring."""
        self.add_windows([scn], events, nbytes, writers)

    def careful(self, scn: int) -> bool:
        """Whether window ``scn`` is one a failed batch held: it must be added alone."""
        return scn <= self._careful_until

    def add_windows(self, scns: list[int], events: list[Event], nbytes: int,
                    writers: Writers | None = None) -> None:
        """Whole windows ``scns`` (``events``: their row changes, in order) into the open
        batch, as one: sealed together (check :meth:`careful` before giving more than
        one window)."""
        cfg = self.cfg
        with self._cv:
            self._raise()
            if self._thread is None:
                self._start()
            batch = self._open
            if batch is None:
                batch = self._open = Batch(time.monotonic())
                self._cv.notify_all()  # the writer times the linger from now
            batch.scns += scns
            batch.events += events
            if writers:
                batch.writers.update(writers)
            batch.nbytes += nbytes
            careful = scns[0] <= self._careful_until
            full = len(batch.events) >= cfg.rows or batch.nbytes >= cfg.bytes
            if careful or (full and self._prepare is None):
                self._seal()
            elif full:  # prepared outside the lock, while the writer writes the one before
                self._open = None
            if careful:
                self._wait_idle()
                self._raise()
                return
            if not full or self._prepare is None:
                return
        self._prepare(batch)
        with self._cv:
            self._open = batch
            self._seal()

    def check(self) -> None:
        """Raise the failure of a batch the writer could not commit, if any."""
        if self._error is not None:
            with self._cv:
                self._raise()

    def flush(self) -> None:
        """Commit everything added; raise a failure (see the module docstring)."""
        with self._cv:
            self._raise()
            if self._open is not None:
                self._seal()
            self._wait_idle()
            self._raise()

    def discard(self) -> None:
        """Wait for the batch being written, drop the others and any failure."""
        with self._cv:
            while self._busy:
                self._cv.wait(1.0)
            self._open = self._sealed = None
            self._error = None

    def close(self) -> None:
        """Stop the writer; batches not committed are dropped. Idempotent."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._open = self._sealed = None

    @property
    def pending(self) -> bool:
        """Whether windows were added that are not committed yet."""
        return self._open is not None or self._sealed is not None or self._busy

    def _start(self) -> None:
        self._closing = False
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"databus-{self.name}-writer")
        self._thread.start()

    def _seal(self) -> None:
        """Hand the open batch to the writer (waiting while another sealed one waits)."""
        while self._sealed is not None and self._error is None:
            self._writer_alive()
            self._cv.wait(1.0)
        self._raise()
        self._sealed, self._open = self._open, None
        self._cv.notify_all()

    def _wait_idle(self) -> None:
        """Until every sealed batch is committed, or one failed."""
        while (self._busy or self._sealed is not None) and self._error is None:
            self._writer_alive()
            self._cv.wait(1.0)

    def _writer_alive(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            raise SinkUnavailableError(f"the {self.name} writer thread is not running")

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    # -- the writer thread -----------------------------------------------------------------

    def _next(self) -> Batch | None:
        """The next batch to commit, waiting for one; None when closing."""
        linger = self.cfg.linger
        with self._cv:
            while not self._closing:
                if self._error is None:
                    if self._sealed is not None:
                        batch, self._sealed = self._sealed, None
                        self._busy = True
                        self._cv.notify_all()
                        return batch
                    if self._open is not None:
                        wait = self._open.started + linger - time.monotonic()
                        if wait <= 0:
                            batch, self._open = self._open, None
                            self._busy = True
                            return batch
                        self._cv.wait(wait)
                        continue
                self._cv.wait()
            return None

    def _run(self) -> None:
        while (batch := self._next()) is not None:
            error: Exception | None = None
            cpu = time.thread_time()
            try:
                self._commit(batch)
            except DatabusError as exc:
                error = exc
            except Exception as exc:  # broad: a bug must not end the writer unseen
                log.exception("committing %s failed", batch.describe())
                error = exc
            self.writer_cpu += time.thread_time() - cpu
            with self._cv:
                self._busy = False
                if error is None:
                    self.committed += 1
                    self.windows += len(batch.scns)
                else:
                    self._error = error
                    self._careful_until = max(self._careful_until, batch.scns[-1])
                    if len(batch.scns) > 1:
                        log.warning("%s failed (%s); they are applied again one window per"
                                    " transaction", batch.describe(), error)
                self._cv.notify_all()
