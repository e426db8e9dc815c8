"""Calling a consumer's callbacks for one whole window.

The dispatcher is the only place that interprets callback results; it turns
them into exceptions the pull loop acts on:

* ERROR, or any exception -> :class:`~databus.core.errors.ConsumerCallbackError`
  (transient: the loop rolls back and replays);
* ERROR_FATAL, or raising ``ConsumerFatalError``, or returning something that
  is not a :class:`ConsumerResult` -> :class:`~databus.core.errors.ConsumerFatalError`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from databus.client.consumer import (
    Consumer,
    ConsumerResult,
    DataBatch,
    DataEvent,
    SchemaView,
    WindowBatch,
)
from databus.client.window import DecodedWindow
from databus.core.errors import (
    ConsumerCallbackError,
    ConsumerFatalError,
    SchemaError,
    UnknownSourceError,
)
from databus.core.event import Event
from databus.core.schema import SchemaRegistry

_SUCCESS = ConsumerResult.SUCCESS
_CHECKPOINT = ConsumerResult.CHECKPOINT
_SKIP = ConsumerResult.SKIP_CHECKPOINT


def check_result(result: Any, what: str) -> ConsumerResult:
    """Normalise a callback's return value; raise for ERROR / ERROR_FATAL."""
    if result is None:
        return _SUCCESS
    if result is ConsumerResult.ERROR:
        raise ConsumerCallbackError(f"{what} returned ERROR")
    if result is ConsumerResult.ERROR_FATAL:
        raise ConsumerFatalError(f"{what} returned ERROR_FATAL")
    if isinstance(result, ConsumerResult):
        return result
    raise ConsumerFatalError(f"{what} returned {result!r}; expected a ConsumerResult or None")


def call(what: str, fn: Callable[..., Any], *args: Any, context: str = "") -> ConsumerResult:
    """Run one callback; exceptions become typed consumer errors (their message names
    ``context``: the window, the table, the events). The per-row loops inline it."""
    try:
        result = fn(*args)
    except ConsumerFatalError:
        raise
    except ConsumerCallbackError:
        raise
    except Exception as exc:  # broad: user code; whatever it raises rolls the window back
        where = f" ({context})" if context else ""
        raise ConsumerCallbackError(f"{what} raised {type(exc).__name__}: {exc}{where}") from exc
    return check_result(result, what)


class SchemaViews:
    """:class:`SchemaView` per schema id (and latest per source), built on demand."""

    def __init__(self, registry: SchemaRegistry) -> None:
        self.registry = registry
        self._by_id: dict[bytes, SchemaView] = {}
        self._latest: dict[int, SchemaView] = {}

    def known(self, event: Event) -> bool:
        if event.schema_id:
            return self.registry.find(event.schema_id) is not None
        try:
            self.registry.latest(event.src_id)
        except (UnknownSourceError, IndexError):
            return False
        return True

    def view(self, event: Event) -> SchemaView:
        sid = event.schema_id
        if sid:
            v = self._by_id.get(sid)
            if v is None:
                v = self._by_id[sid] = SchemaView(self.registry.get(sid), self.registry)
            return v
        # an event without schema (e.g. a truncate): the source's latest version
        v = self._latest.get(event.src_id)
        if v is None:
            try:
                schema = self.registry.latest(event.src_id)
            except (UnknownSourceError, IndexError) as exc:
                raise SchemaError(f"no schema for source {event.src_id}") from exc
            v = self._latest[event.src_id] = SchemaView(schema, self.registry)
        return v


def distinct_schemas(events: list[Event]) -> list[Event]:
    """The first event of each schema id in ``events`` (of each source, for events
    without one): what a schema check needs to look at."""
    firsts: dict[bytes | int, Event] = {}
    last_sid = b""
    for event in events:
        sid = event.schema_id
        if sid and sid is last_sid:  # the scan shares one digest object per body
            continue
        last_sid = sid
        firsts.setdefault(sid or event.src_id, event)
    return list(firsts.values())


def schema_runs(events: list[Event], views: SchemaViews | Callable[[Event], SchemaView]
                ) -> list[tuple[SchemaView, int, int]]:
    """``(view, start, end)`` of each run of ``events`` with the same schema view
    (what one :class:`DataBatch` holds); a view lookup per change of schema only.
    ``views``: the views, or the function giving an event's view."""
    view_of = views.view if isinstance(views, SchemaViews) else views
    runs: list[tuple[SchemaView, int, int]] = []
    current: SchemaView | None = None
    last_sid = b""
    start = 0
    for i, event in enumerate(events):
        sid = event.schema_id
        if sid and sid is last_sid:  # the scan shares one digest object per body
            continue
        view = view_of(event)
        last_sid = sid
        if view is not current:
            if current is not None:
                runs.append((current, start, i))
            current, start = view, i
    if current is not None:
        runs.append((current, start, len(events)))
    return runs


@dataclass(frozen=True, slots=True)
class Dispatched:
    """What happened while dispatching a window."""

    events: int
    force_checkpoint: bool  # some callback returned CHECKPOINT


def inherited(consumer: Consumer, name: str) -> bool:
    """Whether ``consumer``'s callback ``name`` is :class:`Consumer`'s own (does nothing,
    returns None), neither overridden by its class nor replaced on the instance."""
    fn = getattr(consumer, name)
    return getattr(fn, "__func__", None) is getattr(Consumer, name)


_PER_WINDOW = ("on_start_data_event_sequence", "on_start_source", "on_data_event",
               "on_data_events", "on_end_source", "on_end_data_event_sequence")


def takes_many(consumer: Consumer) -> bool:
    """Whether ``consumer`` is given many windows per call: it overrides ``on_windows``,
    and no per-window callback is overridden below the class that did (a subclass that
    changes one of them gets the per-window calls it expects) nor on the instance."""
    own = getattr(consumer, "__dict__", {})
    if inherited(consumer, "on_windows") or "on_windows" in own:
        return False
    mro = type(consumer).__mro__
    owner = next(k for k in mro if "on_windows" in vars(k))
    above = mro[mro.index(owner):]
    for name in _PER_WINDOW:
        if name in own or next(k for k in mro if name in vars(k)) not in above:
            return False
    return True


class Dispatcher:
    """Delivers whole windows to one consumer (see :mod:`databus.client.consumer`).

    A consumer that overrides ``on_windows`` gets the windows of an answer in one call
    (:meth:`dispatch_many`). A consumer that overrides ``on_data_events`` gets one :class:`DataBatch` per
    run of one source (``batched``); any other gets ``on_data_event`` per event.
    Sequence, source and checkpoint callbacks the consumer inherits from
    :class:`Consumer` (which do nothing and return None, i.e. SUCCESS) are not
    called: the result is the same, without their cost per window.
    """

    def __init__(self, consumer: Consumer, views: SchemaViews) -> None:
        self.consumer = consumer
        self.views = views
        self.batched = type(consumer).on_data_events is not Consumer.on_data_events
        self._start_seq = not inherited(consumer, "on_start_data_event_sequence")
        self._end_seq = not inherited(consumer, "on_end_data_event_sequence")
        self._sources = not (inherited(consumer, "on_start_source")
                             and inherited(consumer, "on_end_source"))
        self.many = takes_many(consumer)
        """Whether the consumer takes many whole windows per call (``on_windows``)."""
        self.checkpoint_observed = not inherited(consumer, "on_checkpoint")
        """Whether ``on_checkpoint`` is the consumer's own (it sees each checkpoint)."""

    def dispatch(self, window: DecodedWindow) -> Dispatched:
        """Call the sequence, source and data callbacks of ``window``, in order."""
        c = self.consumer
        scn = window.scn
        force = self._start_seq and call(
            "on_start_data_event_sequence", c.on_start_data_event_sequence,
            scn) is _CHECKPOINT
        events = window.events
        total = window.first_offset
        per_source: dict[int, int] = {}
        sources = self._sources
        for view, start, end in schema_runs(events, self.views):
            name = view.schema.name
            if sources:
                force |= call("on_start_source", c.on_start_source, name,
                              view.schema) is _CHECKPOINT
            run = events[start:end]
            src_id = run[0].src_id
            n = per_source.get(src_id, 0)
            if self.batched:
                batch = DataBatch(scn, run, view, total + 1, n + 1)
                force |= call("on_data_events", c.on_data_events, batch,
                              context=f"scn {scn}, {name}, {len(run)} events") is _CHECKPOINT
            else:
                force |= self._each(run, view, scn, total, n)
            total += len(run)
            per_source[src_id] = n + len(run)
            if sources:
                force |= call("on_end_source", c.on_end_source, name,
                              view.schema) is _CHECKPOINT
        if self._end_seq:
            force |= call("on_end_data_event_sequence", c.on_end_data_event_sequence,
                          scn) is _CHECKPOINT
        return Dispatched(len(events), force)

    def dispatch_many(self, windows: list[DecodedWindow]) -> Dispatched:
        """``on_windows`` with ``windows`` (a consumer that overrides it: :attr:`many`)."""
        first, last = windows[0].scn, windows[-1].scn
        force = call("on_windows", self.consumer.on_windows,
                     WindowBatch(windows, self.views.view),
                     context=f"windows {first}..{last}") is _CHECKPOINT
        return Dispatched(sum([len(w.events) for w in windows]), force)

    def _each(self, run: list[Event], view: SchemaView, scn: int, total: int, n: int) -> bool:
        """``on_data_event`` for each event of a run; True if one answered CHECKPOINT."""
        on_data = self.consumer.on_data_event
        force = False
        for event in run:
            total += 1
            n += 1
            try:
                result = on_data(DataEvent(event, view, total, n))
            except (ConsumerFatalError, ConsumerCallbackError):
                raise
            except Exception as exc:  # broad: user code (see call)
                raise ConsumerCallbackError(
                    f"on_data_event raised {type(exc).__name__}: {exc} "
                    f"(scn {scn}, {view.schema.name}, key {event.key!r})") from exc
            if result is not None and result is not _SUCCESS:
                force |= check_result(result, "on_data_event") is _CHECKPOINT
        return force

    def checkpoint(self, scn: int) -> bool:
        """``on_checkpoint``; False when it answered SKIP_CHECKPOINT."""
        if not self.checkpoint_observed:
            return True
        return call("on_checkpoint", self.consumer.on_checkpoint, scn) is not _SKIP

    def rollback(self, scn: int) -> None:
        call("on_rollback", self.consumer.on_rollback, scn)
