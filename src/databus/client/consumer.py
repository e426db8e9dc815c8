"""The consumer API: callbacks, their results, and the data event they receive.

Subclass :class:`Consumer` and override what you need; every callback returns a
:class:`ConsumerResult` or ``None`` (= SUCCESS). For each window the client
calls, on one thread (see :mod:`databus.client.client`)::

    on_start_data_event_sequence(scn)
      on_start_source(name, schema)      # one run of events of one source+schema
        on_data_event(event) ...         # or, if overridden, on_data_events(batch) once
      on_end_source(name, schema)
      ...                                # further runs, in commit order
    on_end_data_event_sequence(scn)
    on_checkpoint(scn)                   # only when a checkpoint is due

and persists the checkpoint only after all of these succeeded. Results:

* SUCCESS / None: go on.
* CHECKPOINT: go on, and persist the checkpoint at the end of this window
  even if ``checkpoint_every_windows`` would not.
* SKIP_CHECKPOINT (from ``on_checkpoint``): do not persist this time; the
  window counts as consumed in memory. Elsewhere it means SUCCESS.
* ERROR, or an exception: ``on_rollback(scn of the last persisted
  checkpoint)``, then the windows after that checkpoint are fetched again and
  replayed (at-least-once), with bounded retries.
* ERROR_FATAL (or raising :class:`~databus.core.errors.ConsumerFatalError`):
  consumption stops with ``ConsumerFatalError``.

Batches: a consumer that overrides ``on_data_events`` gets one
:class:`DataBatch` per run of a source instead of ``on_data_event`` calls; it
reads ``batch.rows`` (dicts) or ``batch.columns`` (one list per column),
decoded on access by the compiled decoder (:mod:`databus.client.wiredecode`).
Its result counts for the whole run; the checkpoint rules above are unchanged.
The bootstrap has the same choice: ``on_bootstrap_events`` instead of
``on_bootstrap_event`` gets one :class:`DataBatch` per run of a source within
each bootstrap sequence (a snapshot batch or a catch-up window).
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, Any

from databus.client.wiredecode import RowDecoder, Scanned
from databus.core.envelope import envelope
from databus.core.event import ATTR_OPCODE_MASK, Event, Op

if TYPE_CHECKING:
    from databus.client.window import DecodedWindow
    from databus.core.schema import MetadataCodec, SchemaRegistry, TableSchema


class ConsumerResult(Enum):
    """What a callback tells the client."""

    SUCCESS = "SUCCESS"
    CHECKPOINT = "CHECKPOINT"
    SKIP_CHECKPOINT = "SKIP_CHECKPOINT"
    ERROR = "ERROR"
    ERROR_FATAL = "ERROR_FATAL"


Result = ConsumerResult | None
_DELETE = int(Op.DELETE)


class SchemaView:
    """A table schema plus what data events need to present rows by column name.

    Shared by all events of one schema version; immutable. ``decoder`` is the
    version's :class:`~databus.client.wiredecode.RowDecoder` (compiled where built).
    """

    __slots__ = ("decoder", "metadata_codec", "registry", "schema")

    def __init__(self, schema: TableSchema, registry: SchemaRegistry) -> None:
        self.schema = schema
        self.registry = registry
        self.metadata_codec: MetadataCodec = registry.metadata
        self.decoder = RowDecoder(schema)

    def row(self, data: bytes) -> dict[str, Any]:
        """Decode Avro row bytes into a dict keyed by column names."""
        return self.decoder.row(data)


class DataEvent:
    """One data event as a consumer sees it.

    ``event`` is the core :class:`~databus.core.event.Event`. Row images are
    decoded lazily, once, on first access: ``after`` (insert, update, snapshot
    read), ``before`` (delete; update when the source sent it) and ``metadata``
    (txid, file, pos, gtid, server_id, row; empty when absent), all keyed by
    the table's column names with Python values (``Decimal``, ``datetime``...).

    ``total_order`` is the 1-based position of the event among the window's
    data events, ``collection_order`` among those of the same source.
    A DataEvent is handed to one thread only; it is not meant to be shared.
    """

    __slots__ = ("_after", "_before", "_decoded", "_meta", "_view", "collection_order",
                 "event", "total_order")

    def __init__(self, event: Event, view: SchemaView, total_order: int = 0,
                 collection_order: int = 0) -> None:
        self.event = event
        self._view = view
        self.total_order = total_order
        self.collection_order = collection_order
        self._decoded = False
        self._after: dict[str, Any] | None = None
        self._before: dict[str, Any] | None = None
        self._meta: dict[str, Any] | None = None

    # -- header fields (no decoding) -----------------------------------------

    @property
    def scn(self) -> int:
        return self.event.scn

    @property
    def op(self) -> Op:
        return self.event.op

    @property
    def key(self) -> int | bytes:
        return self.event.key

    @property
    def src_id(self) -> int:
        return self.event.src_id

    @property
    def source(self) -> str:
        """The logical source name, ``db.table``."""
        return self._view.schema.name

    @property
    def schema(self) -> TableSchema:
        return self._view.schema

    @property
    def timestamp_ns(self) -> int:
        return self.event.timestamp_ns

    @property
    def is_snapshot(self) -> bool:
        return self.event.is_snapshot

    # -- lazily decoded images -------------------------------------------------

    def _decode(self) -> None:
        ev = self.event
        view = self._view
        row = view.row(ev.payload) if ev.payload else None
        if ev.attributes & ATTR_OPCODE_MASK == _DELETE:
            self._before = row
        else:
            self._after = row
        self._decoded = True

    @property
    def after(self) -> dict[str, Any] | None:
        if not self._decoded:
            self._decode()
        return self._after

    @property
    def before(self) -> dict[str, Any] | None:
        if not self._decoded:
            self._decode()
        if self._before is None and self.event.attributes & ATTR_OPCODE_MASK != _DELETE:
            raw = self._metadata_raw().get("before")
            if raw is not None:
                self._before = self._view.row(raw)
        return self._before

    def _metadata_raw(self) -> dict[str, Any]:
        if self._meta is None:
            md = self.event.metadata
            self._meta = self._view.metadata_codec.decode(md) if md is not None else {}
        return self._meta

    @property
    def metadata(self) -> dict[str, Any]:
        """Source position and transaction id (the before image is in ``before``)."""
        return {k: v for k, v in self._metadata_raw().items() if k != "before"}

    def envelope(self) -> dict[str, Any]:
        """The Debezium-compatible JSON envelope (see ``docs/json.md``)."""
        return envelope(self.event, self._view.registry, total_order=self.total_order,
                        data_collection_order=self.collection_order)

    def __repr__(self) -> str:
        return (f"DataEvent(scn={self.scn}, source={self.source!r}, op={self.op.name}, "
                f"key={self.key!r})")


class DataBatch:
    """A run of data events of one source and schema version, within one window.

    What :meth:`Consumer.on_data_events` receives: the events between one
    ``on_start_source`` and its ``on_end_source``, in commit order. The row
    images are decoded on first access, all at once, by the compiled batch
    decoder where it was built; the consumer picks the shape by what it reads:

    * ``rows``: one dict per event, keyed by column name (as ``DataEvent.after``);
    * ``columns``: one list per column, keyed by column name, in schema order
      (``columns["id"][i]`` is event i's value); no dict is built per row.

    Both hold the row image each event carries: the row after the change
    (insert, update, snapshot read), the deleted row for a delete (``ops[i]``
    says which); ``None`` (rows) or ``None`` in every column (columns) for an
    event without a row (a truncate). The before image of an update, the
    source position and the envelope are on the per-event view
    (:meth:`data_events`). ``events`` are the core
    :class:`~databus.core.event.Event` objects; a bootstrap snapshot batch builds
    them only when ``events``, ``keys`` or :meth:`data_events` is read (``rows``,
    ``columns`` and ``ops`` read the answer's bytes in place). A batch is handed to one thread;
    it is not meant to be shared, nor kept after the callback (a replay
    delivers new batches).

    :meth:`Consumer.on_bootstrap_events` receives the same kind of batch: a run
    of one source and schema version within one bootstrap sequence, ``scn``
    the sequence's SCN (a snapshot batch's start SCN, or the catch-up window's).
    """

    __slots__ = ("_columns", "_end", "_events", "_first_collection", "_first_total", "_rows",
                 "_scanned", "_start", "_view", "scn")

    def __init__(self, scn: int, events: list[Event] | Scanned, view: SchemaView,
                 first_total: int = 1, first_collection: int = 1, *, start: int = 0,
                 end: int | None = None) -> None:
        """``events``: the run's events, or a scanned body whose events ``start`` to
        ``end`` are the run (then no :class:`Event` is built unless ``events`` or
        :meth:`data_events` is read)."""
        self.scn = scn
        self._view = view
        self._first_total = first_total
        self._first_collection = first_collection
        self._rows: list[dict[str, Any] | None] | None = None
        self._columns: dict[str, list[Any]] | None = None
        if isinstance(events, Scanned):
            self._scanned: Scanned | None = events
            self._start, self._end = start, len(events) if end is None else end
            self._events: list[Event] | None = None
        else:
            self._scanned = None
            self._start, self._end = 0, len(events)
            self._events = events

    def __len__(self) -> int:
        return self._end - self._start

    @property
    def events(self) -> list[Event]:
        """The core events (built on first access when the batch came from a scan)."""
        if self._events is None:
            assert self._scanned is not None
            self._events = self._scanned.events(self._start, self._end)
        return self._events

    @property
    def source(self) -> str:
        """The logical source name, ``db.table``."""
        return self._view.schema.name

    @property
    def schema(self) -> TableSchema:
        return self._view.schema

    @property
    def ops(self) -> list[Op]:
        if self._events is None and self._scanned is not None:
            attrs = self._scanned.attributes[self._start:self._end]
            return [Op(a & ATTR_OPCODE_MASK) for a in attrs]
        return [Op(e.attributes & ATTR_OPCODE_MASK) for e in self.events]

    @property
    def keys(self) -> list[int | bytes]:
        return [e.key for e in self.events]

    def _spans(self) -> tuple[Scanned, memoryview, memoryview] | None:
        """The payloads' places in the scanned body, when every event has a payload."""
        sc = self._scanned
        if sc is None:
            return None
        lengths = sc.payload_lengths[self._start:self._end]
        if lengths and min(lengths) == 0:
            return None
        return sc, sc.payload_offsets[self._start:self._end], lengths

    @property
    def rows(self) -> list[dict[str, Any] | None]:
        if self._rows is None:
            decoder = self._view.decoder
            spans = self._spans()
            if spans is not None:
                sc, offsets, lengths = spans
                self._rows = list(decoder.rows_at(sc.body, offsets, lengths))
                return self._rows
            events = self.events
            if all(e.payload for e in events):
                self._rows = list(decoder.rows([e.payload for e in events]))
            else:
                self._rows = [decoder.row(e.payload) if e.payload else None for e in events]
        return self._rows

    @property
    def columns(self) -> dict[str, list[Any]]:
        if self._columns is None:
            decoder = self._view.decoder
            spans = self._spans()
            if spans is not None:
                sc, offsets, lengths = spans
                self._columns = decoder.columns_at(sc.body, offsets, lengths)
                return self._columns
            events = self.events
            if all(e.payload for e in events):
                self._columns = decoder.columns([e.payload for e in events])
            else:
                cols: dict[str, list[Any]] = {name: [] for name in decoder.names}
                for row in self.rows:
                    for name, lst in cols.items():
                        lst.append(None if row is None else row[name])
                self._columns = cols
        return self._columns

    def data_events(self) -> list[DataEvent]:
        """The per-event views (``before``, ``metadata``, ``envelope()``, orders)."""
        view, t, c = self._view, self._first_total, self._first_collection
        return [DataEvent(e, view, t + i, c + i) for i, e in enumerate(self.events)]

    def __repr__(self) -> str:
        return f"DataBatch(scn={self.scn}, source={self.source!r}, events={len(self)})"


def _each(callback: Any, batch: DataBatch) -> Result:
    """``callback`` for each event of ``batch``: the first ERROR or ERROR_FATAL ends
    it and is returned; otherwise CHECKPOINT if one answered it."""
    out: Result = None
    for event in batch.data_events():
        result = callback(event)
        if result is ConsumerResult.ERROR or result is ConsumerResult.ERROR_FATAL or (
                result is not None and not isinstance(result, ConsumerResult)):
            return result  # the client judges it as it judges a per-event answer
        if result is ConsumerResult.CHECKPOINT:
            out = result
    return out


class WindowBatch:
    """What :meth:`Consumer.on_windows` receives: ``windows``, whole windows in commit
    order (each with its SCN and its data events, without the EOP), and ``view``,
    the :class:`SchemaView` of any of their events. Handed to one thread; not kept
    after the callback (a replay delivers a new one)."""

    __slots__ = ("view", "windows")

    def __init__(self, windows: list[DecodedWindow],
                 view: Callable[[Event], SchemaView]) -> None:
        self.windows = windows
        self.view = view

    def __len__(self) -> int:
        return len(self.windows)


class Consumer:
    """Base consumer: every callback does nothing and returns None (= SUCCESS).

    Callbacks run on the client's thread (or a consumer group's worker threads,
    see :mod:`databus.client.group`); a consumer instance is never called by
    two threads at once unless it is shared in a group.
    """

    # -- lifecycle -----------------------------------------------------------

    def on_start_consumption(self) -> Result:
        """Called once before the first window."""
        return None

    def on_stop_consumption(self) -> Result:
        """Called once when the client stops (normally or on error)."""
        return None

    # -- online consumption ----------------------------------------------------

    def on_start_data_event_sequence(self, scn: int) -> Result:
        """A window with SCN ``scn`` begins."""
        return None

    def on_start_source(self, source_name: str, schema: TableSchema) -> Result:
        """A run of events of one source (all with ``schema``) begins."""
        return None

    def on_data_event(self, event: DataEvent) -> Result:
        """One row change."""
        return None

    def on_data_events(self, batch: DataBatch) -> Result:
        """A run of row changes of one source (see :class:`DataBatch`).

        Override it to receive batches: the client then calls it once per run,
        between ``on_start_source`` and ``on_end_source``, and never calls
        ``on_data_event``. Results and errors count for the whole run, as one
        ``on_data_event`` result would: ERROR or an exception rolls back and
        replays the whole window.

        Not overridden, it hands each event to :meth:`on_data_event` (the client
        itself does that without building a batch). So a consumer that wraps
        another and forwards every callback, this one included, still delivers
        every event to a per-event consumer.
        """
        return _each(self.on_data_event, batch)

    def on_end_source(self, source_name: str, schema: TableSchema) -> Result:
        """The run of events of ``source_name`` ends."""
        return None

    def on_end_data_event_sequence(self, scn: int) -> Result:
        """Window ``scn`` has been delivered completely."""
        return None

    def on_windows(self, batch: WindowBatch) -> Result:
        """Many whole windows at once (see :class:`WindowBatch`), for a consumer that
        applies them in bulk. Override it and the client calls it once per relay
        answer, with the answer's whole windows, INSTEAD of the per-window sequence
        (no ``on_start_data_event_sequence``, source or data callbacks for them);
        ``on_checkpoint`` and ``on_rollback`` are unchanged. The result counts for every
        window of the batch: ERROR or an exception rolls back to the last persisted
        checkpoint and replays them all; CHECKPOINT persists the position after the
        last one. Not overridden, the per-window callbacks are called.
        """
        return None

    def on_rollback(self, scn: int) -> Result:
        """Undo everything after window ``scn`` (-1: after nothing); it will be replayed."""
        return None

    def on_checkpoint(self, scn: int) -> Result:
        """The client is about to persist the checkpoint after window ``scn``."""
        return None

    def on_error(self, exc: BaseException) -> Result:
        """Consumption is about to stop because of ``exc`` (it is raised after this)."""
        return None

    # -- bootstrap (called by the bootstrap client) -------------------------------

    def on_start_bootstrap(self) -> Result:
        return None

    def on_bootstrap_snapshot_start(self, sources: list[TableSchema]) -> Result:
        """A snapshot bootstrap of ``sources`` begins (once per bootstrap, before
        its checkpoint is first persisted; not again when it resumes).

        The snapshot replaces what the consumer holds of these sources: rows
        deleted before the snapshot's start SCN are not sent as deletes, so a
        consumer that keeps state drops its rows of these sources here.
        """
        return None

    def on_start_bootstrap_sequence(self, scn: int) -> Result:
        return None

    def on_bootstrap_event(self, event: DataEvent) -> Result:
        """One snapshot row (op READ) or catch-up change."""
        return None

    def on_bootstrap_events(self, batch: DataBatch) -> Result:
        """A run of bootstrap events of one source and schema version (see
        :class:`DataBatch`), within one bootstrap sequence.

        Override it to receive batches: the bootstrap client then calls it once
        per run, between ``on_start_bootstrap_sequence`` and
        ``on_end_bootstrap_sequence``, and never calls ``on_bootstrap_event``.
        Results and errors count for the whole run, as one ``on_bootstrap_event``
        result would: ERROR or an exception -> ``on_bootstrap_rollback`` and the
        whole ``/bootstrap`` answer is delivered again from the persisted
        checkpoint.

        Not overridden, it hands each event to :meth:`on_bootstrap_event`, as
        :meth:`on_data_events` does.
        """
        return _each(self.on_bootstrap_event, batch)

    def on_end_bootstrap_sequence(self, scn: int) -> Result:
        return None

    def on_bootstrap_checkpoint(self, scn: int) -> Result:
        return None

    def on_bootstrap_rollback(self, scn: int) -> Result:
        return None

    def on_end_bootstrap(self) -> Result:
        return None
