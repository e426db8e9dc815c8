"""A consumer group: one consumer's callbacks on N worker threads.

:class:`ConsumerGroup` is itself a :class:`Consumer`, so any client drives it
like a single consumer. Inside:

* data events are routed by key: worker ``abs(key_hash(key)) % N``
  (:func:`databus.core.filters.key_hash`, stable for int and bytes keys), so
  all events of one key go to the same worker, in commit order;
* control callbacks (start/end of sequence and of source, checkpoint,
  rollback, error, start/stop of consumption, and their bootstrap variants)
  go to every worker, in order with its data events; bootstrap events are
  routed like data events;
* ``on_end_data_event_sequence`` returns only when every worker has finished
  the window, and reports the first failure of any worker (ERROR_FATAL before
  ERROR). The client persists the checkpoint only after that, so windows stay
  atomic: a checkpoint never covers a window some worker has not finished.

A worker whose window failed skips the window's remaining data events (the
window is rolled back and replayed anyway). Give a list of N consumers (one
per worker; each is only ever called by its own thread), or one consumer and
``threads=N`` (then it is shared and must be thread-safe).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from databus.client.consumer import Consumer, ConsumerResult, DataEvent, Result
from databus.client.dispatcher import call
from databus.core.errors import ConsumerFatalError, DatabusError
from databus.core.filters import key_hash
from databus.core.schema import TableSchema

_Outcome = tuple[ConsumerResult | DatabusError, DatabusError | None, bool]
_Task = tuple[str, tuple[Any, ...], "Future[_Outcome] | None"]

# sync callbacks after which a worker's per-window state starts afresh
_WINDOW_CLOSERS = frozenset({"on_end_data_event_sequence", "on_rollback",
                             "on_start_consumption", "on_stop_consumption",
                             "on_end_bootstrap_sequence", "on_bootstrap_rollback",
                             "on_start_bootstrap", "on_end_bootstrap"})
_ROUTED = frozenset({"on_data_event", "on_bootstrap_event"})


class _Worker:
    def __init__(self, consumer: Consumer, index: int) -> None:
        self.consumer = consumer
        self.queue: queue.SimpleQueue[_Task | None] = queue.SimpleQueue()
        self.error: DatabusError | None = None  # first failure in the current window
        self.force = False  # a callback answered CHECKPOINT in the current window
        self.thread = threading.Thread(target=self._run, name=f"databus-group-{index}",
                                       daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            task = self.queue.get()
            if task is None:
                return
            name, args, fut = task
            if name in _ROUTED and self.error is not None:
                continue  # this window failed already; it will be replayed
            outcome: ConsumerResult | DatabusError
            try:
                outcome = call(name, getattr(self.consumer, name), *args)
            except DatabusError as exc:
                outcome = exc
            if isinstance(outcome, DatabusError):
                if fut is None and self.error is None:
                    self.error = outcome
            elif outcome is ConsumerResult.CHECKPOINT:
                self.force = True
            if fut is not None:
                fut.set_result((outcome, self.error, self.force))
                if name in _WINDOW_CLOSERS:
                    self.error, self.force = None, False


class ConsumerGroup(Consumer):
    """Runs callbacks on worker threads; see the module docstring.

    Threads start with the first callback and end with ``on_stop_consumption``
    or :meth:`close`.
    """

    def __init__(self, consumers: Consumer | Sequence[Consumer],
                 threads: int | None = None) -> None:
        if isinstance(consumers, Consumer):
            members = [consumers] * (threads if threads is not None else 1)
        else:
            members = list(consumers)
            if threads is not None and threads != len(members):
                raise ValueError("threads must equal the number of consumers given")
        if not members:
            raise ValueError("a consumer group needs at least one consumer")
        self.consumers = members
        self._workers: list[_Worker] | None = None

    @property
    def size(self) -> int:
        return len(self.consumers)

    # -- plumbing ----------------------------------------------------------------

    def _pool(self) -> list[_Worker]:
        if self._workers is None:
            self._workers = [_Worker(c, i) for i, c in enumerate(self.consumers)]
        return self._workers

    def _post(self, name: str, *args: Any) -> None:
        for w in self._pool():
            w.queue.put((name, args, None))

    def _sync(self, name: str, *args: Any) -> list[_Outcome]:
        futures: list[Future[_Outcome]] = []
        for w in self._pool():
            fut: Future[_Outcome] = Future()
            w.queue.put((name, args, fut))
            futures.append(fut)
        return [f.result() for f in futures]

    @staticmethod
    def _combine(outcomes: list[_Outcome], *, window: bool) -> Result:
        errors: list[DatabusError] = []
        results: list[ConsumerResult] = []
        force = False
        for outcome, window_error, window_force in outcomes:
            if isinstance(outcome, DatabusError):
                errors.append(outcome)
            else:
                results.append(outcome)
            if window:
                if window_error is not None:
                    errors.append(window_error)
                force |= window_force
        fatal = [e for e in errors if isinstance(e, ConsumerFatalError)]
        if fatal or errors:
            raise (fatal or errors)[0]
        if ConsumerResult.SKIP_CHECKPOINT in results:
            return ConsumerResult.SKIP_CHECKPOINT
        if force or ConsumerResult.CHECKPOINT in results:
            return ConsumerResult.CHECKPOINT
        return None

    def __enter__(self) -> ConsumerGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the worker threads after they finished their queued callbacks."""
        workers, self._workers = self._workers, None
        for w in workers or ():
            w.queue.put(None)
        for w in workers or ():
            w.thread.join()

    # -- callbacks ---------------------------------------------------------------

    def on_start_consumption(self) -> Result:
        return self._combine(self._sync("on_start_consumption"), window=False)

    def on_stop_consumption(self) -> Result:
        try:
            return self._combine(self._sync("on_stop_consumption"), window=False)
        finally:
            self.close()

    def on_start_data_event_sequence(self, scn: int) -> Result:
        self._post("on_start_data_event_sequence", scn)
        return None

    def on_start_source(self, source_name: str, schema: TableSchema) -> Result:
        self._post("on_start_source", source_name, schema)
        return None

    def _route(self, name: str, event: DataEvent) -> None:
        workers = self._pool()
        w = workers[abs(key_hash(event.key)) % len(workers)]
        w.queue.put((name, (event,), None))

    def on_data_event(self, event: DataEvent) -> Result:
        self._route("on_data_event", event)
        return None

    def on_end_source(self, source_name: str, schema: TableSchema) -> Result:
        self._post("on_end_source", source_name, schema)
        return None

    def on_end_data_event_sequence(self, scn: int) -> Result:
        return self._combine(self._sync("on_end_data_event_sequence", scn), window=True)

    def on_checkpoint(self, scn: int) -> Result:
        return self._combine(self._sync("on_checkpoint", scn), window=False)

    def on_rollback(self, scn: int) -> Result:
        return self._combine(self._sync("on_rollback", scn), window=False)

    def on_error(self, exc: BaseException) -> Result:
        self._combine(self._sync("on_error", exc), window=False)
        return None

    # -- bootstrap: the same routing ------------------------------------------------

    def on_start_bootstrap(self) -> Result:
        return self._combine(self._sync("on_start_bootstrap"), window=False)

    def on_bootstrap_snapshot_start(self, sources: list[TableSchema]) -> Result:
        return self._combine(self._sync("on_bootstrap_snapshot_start", sources), window=False)

    def on_start_bootstrap_sequence(self, scn: int) -> Result:
        self._post("on_start_bootstrap_sequence", scn)
        return None

    def on_bootstrap_event(self, event: DataEvent) -> Result:
        self._route("on_bootstrap_event", event)
        return None

    def on_end_bootstrap_sequence(self, scn: int) -> Result:
        return self._combine(self._sync("on_end_bootstrap_sequence", scn), window=True)

    def on_bootstrap_checkpoint(self, scn: int) -> Result:
        return self._combine(self._sync("on_bootstrap_checkpoint", scn), window=False)

    def on_bootstrap_rollback(self, scn: int) -> Result:
        return self._combine(self._sync("on_bootstrap_rollback", scn), window=False)

    def on_end_bootstrap(self) -> Result:
        return self._combine(self._sync("on_end_bootstrap"), window=False)
