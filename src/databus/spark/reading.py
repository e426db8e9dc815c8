"""Relay access for the Spark source, free of Spark: sources, planning, bucket reads.

Offsets (what Spark writes to its checkpoint's offset log) are one Databus checkpoint
per MOD bucket, stamped with the relay and the sources (:mod:`databus.spark.offsets`).
A batch ``(start, end]`` is the windows after ``start`` up to and including window
``end``; reading it again reads the same events in the same order (the relay's windows
are immutable), which is what makes a restart from Spark's checkpoint lose and repeat
nothing.

One exception: a relay with a *memory* buffer that crashes may regroup the
changes after its trim point into different windows (SQLite: one window). A
batch whose end window no longer exists then reads through the first window
past it, and the next batch reads that window again (at least once; harmless
for :func:`databus.spark.apply.apply_changes`). Relays with a persistent buffer
keep their windows across crashes.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from databus.client.relay import RelayConnection
from databus.client.retry import Backoff
from databus.core import event as ev
from databus.core.checkpoint import Checkpoint
from databus.core.errors import (
    DatabusError,
    ForbiddenError,
    RelayProtocolError,
    RelayUnavailableError,
    TransientError,
    UnauthorizedError,
    UnknownSourceError,
)
from databus.core.filters import ServerFilter
from databus.spark.offsets import (  # re-exported: callers took them from here
    OFFSET_VERSION as OFFSET_VERSION,
)
from databus.spark.offsets import (
    offset_of as offset_of,
)
from databus.spark.offsets import (
    offset_scn as offset_scn,
)
from databus.spark.options import StreamOptions

if TYPE_CHECKING:
    import pyarrow as pa

    from databus.spark.fastread import ChunkDecoder

T = TypeVar("T")

ORIGIN_HEADER = "Databus-Origin"


def relay_catalog(conn: RelayConnection) -> tuple[list[tuple[int, str]], str | None]:
    """``(id, name)`` of every source the relay serves this token, and the relay's origin
    (its ``Databus-Origin`` header: what it captures; None when it sends none)."""
    # the response itself, for its header (RelayConnection.sources() keeps only the body)
    r = conn._get("/sources", {})
    try:
        raw = r.json()
        served = [(int(s["id"]), str(s["name"])) for s in raw]
    except (ValueError, KeyError, TypeError) as exc:
        raise RelayUnavailableError(f"{conn.url}/sources did not answer a JSON list of "
                                    "sources") from exc
    origin = r.headers.get(ORIGIN_HEADER)
    return served, (origin.strip() or None) if origin is not None else None


def resolve_sources(conn: RelayConnection, wanted: tuple[str, ...],
                    served: list[tuple[int, str]] | None = None) -> list[tuple[int, str]]:
    """``(id, name)`` of the wanted sources, matched against ``served`` (the relay's
    ``/sources`` when None).

    A wanted source missing there is asked of the relay by itself (``/register`` for an
    id, ``/sources?names=`` for a name): a relay that serves it to other tokens answers
    403, raised as :class:`ForbiddenError` (the token may not read it); otherwise
    :class:`UnknownSourceError` names what the relay serves.
    """
    known = conn.sources() if served is None else served
    out: list[tuple[int, str]] = []
    for w in wanted:
        match = [s for s in known if str(s[0]) == w or s[1] == w or s[1].split(".", 1)[-1] == w]
        if len(match) != 1:
            if not match:
                _refused(conn, w)
            names = ", ".join(f"{n} ({i})" for i, n in known) or "none"
            what = "is ambiguous" if match else "is not served"
            raise UnknownSourceError(
                f"databus source: source {w!r} {what} by relay {conn.url}; it serves: {names}")
        out.append(match[0])
    return out


def _refused(conn: RelayConnection, wanted: str) -> None:
    """Raise :class:`ForbiddenError` when the relay says ``wanted`` (missing from this
    token's ``/sources``) is a source the token may not read; return otherwise."""
    try:
        if wanted.isdigit():
            conn.register([int(wanted)])
        else:
            conn._get("/sources", {"names": wanted})
    except (ForbiddenError, UnauthorizedError) as exc:
        raise type(exc)(f"databus source: the relay {conn.url} refuses source {wanted!r} to "
                        f"this token: {exc}") from exc
    except DatabusError:
        return  # unknown to the relay, or a relay that cannot say: "not served"


@dataclass(frozen=True, slots=True)
class Scan:
    """Where a planning scan stopped: the last whole window taken and its predecessor."""

    scn: int
    prev_scn: int
    rows: int


def retrying(call: Callable[[], T], retry_seconds: float) -> T:
    """``call()``, retrying a :class:`TransientError` (relay restarting) for ``retry_seconds``."""
    backoff = Backoff(0.2, 2.0)
    deadline = time.monotonic() + retry_seconds
    while True:
        try:
            return call()
        except TransientError:
            if time.monotonic() >= deadline:
                raise
            threading.Event().wait(backoff.next_delay())


def _fetch(conn: RelayConnection, cp: Checkpoint, src_ids: list[int], size: int) -> bytes:
    return conn.stream(cp, src_ids, size=size, timeout=0.0).data


def relay_top(conn: RelayConnection, src_ids: list[int], retry_seconds: float = 0.0) -> int:
    """The newest window SCN the relay holds (-1 when empty).

    An unreachable relay is retried for ``retry_seconds`` (a relay restart
    should not fail a running query), then the error propagates.
    """
    # a one-byte budget returns at most one event; only the header matters
    return retrying(lambda: conn.stream(None, src_ids, size=1, timeout=0.0).max_scn,
                     retry_seconds)


def scan_limit(conn: RelayConnection, src_ids: list[int], start: Checkpoint, top: int, *,
               max_rows: int | None, max_bytes: int | None, fetch_bytes: int,
               retry_seconds: float = 0.0) -> Scan:
    """Walk whole windows after ``start`` (up to ``top``) within the row/byte limits.

    At least one window is taken even when it alone exceeds a limit (or the
    fetch budget: the relay then serves a prefix of it). Only event headers
    are read (no payload decoding).
    """
    cp = start
    rows = used = 0
    last, prev = start.window_scn, start.prev_scn
    while last < top:
        budget = fetch_bytes if max_bytes is None else max(min(fetch_bytes, max_bytes - used), 1)
        data = retrying(partial(_fetch, conn, cp, src_ids, budget), retry_seconds)
        if not data:
            break
        off, n, win_rows, win_bytes, ended = 0, len(data), 0, 0, False
        while off < n:
            length = ev.peek_length(data, off)
            win_bytes += length
            if ev.peek_src_id(data, off) != ev.SRC_EOP:
                win_rows += 1
                off += length
                continue
            scn = ev.peek_scn(data, off)
            off += length
            ended = True
            over = ((max_rows is not None and rows + win_rows > max_rows)
                    or (max_bytes is not None and used + win_bytes > max_bytes))
            if over and last != start.window_scn:
                return Scan(last, prev, rows)
            rows, used = rows + win_rows, used + win_bytes
            prev, last = last, scn
            win_rows = win_bytes = 0
            if over or scn >= top:
                return Scan(last, prev, rows)
        if not ended:
            # the next window alone exceeds the budget: only a prefix of it came
            if last != start.window_scn:
                return Scan(last, prev, rows)
            return Scan(ev.peek_scn(data, 0), last, rows + win_rows)
        cp = Checkpoint.after(last, prev)
    return Scan(last, prev, rows)


DataEvent = tuple[ev.Event, int]
"""A data event read by a bucket, and its index among that bucket's events of the window."""


@dataclass(slots=True)
class _Cursor:
    """Where a bucket read stands: the checkpoint of the next fetch, the next window index."""

    cp: Checkpoint
    index: int

    def eop(self, scn: int) -> None:
        """Window ``scn`` has been read whole."""
        cp = self.cp
        self.cp = Checkpoint.after(scn, cp.window_scn if not cp.in_window else cp.prev_scn)
        self.index = 0

    def partial(self, win_scn: int, count: int) -> None:
        """The response ended inside window ``win_scn`` after ``count`` more data events."""
        cp = self.cp
        done = cp.window_offset if cp.in_window and cp.window_scn == win_scn else 0
        self.cp = cp.within(win_scn, done + count)


def read_bucket(opts: StreamOptions, src_ids: list[int], bucket: int, start: dict[str, Any],
                end_scn: int, stop: threading.Event | None = None) -> Iterator[DataEvent]:
    """The data events of MOD bucket ``bucket`` after ``start`` through window ``end_scn``.

    Deterministic for a given (start, end_scn) while the relay holds those
    windows. An unreachable relay is retried for ``relay_retry_seconds``; a
    relay that no longer holds the windows fails with a typed terminal error.
    """
    cur = _cursor(start)
    for data in _responses(opts, src_ids, bucket, cur, end_scn, stop):
        off, n = 0, len(data)
        win_scn, win_count = -1, 0
        while off < n:
            e = ev.decode(data, off)
            off += ev.peek_length(data, off)
            if e.is_eop:
                cur.eop(e.scn)
                win_scn, win_count = -1, 0
                if e.scn >= end_scn:
                    return
                continue
            if e.is_control:
                continue
            win_scn, win_count = e.scn, win_count + 1
            yield e, cur.index
            cur.index += 1
        if win_scn != -1:  # the response ended inside a window too large for the budget
            cur.partial(win_scn, win_count)


def read_bucket_batches(opts: StreamOptions, src_ids: list[int], bucket: int,
                        start: dict[str, Any], end_scn: int, decoder: ChunkDecoder,
                        stop: threading.Event | None = None) -> Iterator[pa.RecordBatch]:
    """What :func:`read_bucket` reads, as envelope record batches of at most
    ``rows_per_arrow_batch`` rows, decoded many events per call by ``decoder``
    (same rows, same order, same ``sequence.index``)."""
    cur = _cursor(start)
    for data in _responses(opts, src_ids, bucket, cur, end_scn, stop):
        off, n = 0, len(data)
        win_scn, win_count = -1, 0
        while off < n:
            ch = decoder.decode(data, off, opts.rows_per_arrow_batch, end_scn, cur.index)
            for scn in ch.eops:
                cur.eop(scn)
            if ch.eops:
                win_scn, win_count = ch.tail_scn, ch.tail
            elif ch.tail:
                win_scn, win_count = ch.tail_scn, win_count + ch.tail
            cur.index, off = ch.index, ch.off
            if ch.batch is not None:
                yield ch.batch
            if ch.done:
                return
        if win_scn != -1:  # the response ended inside a window too large for the budget
            cur.partial(win_scn, win_count)


def prefetched(make: Callable[[threading.Event], Iterator[T]], depth: int) -> Iterator[T]:
    """The items of ``make(stop)``, produced by a worker thread up to ``depth`` ahead.

    For a bucket read: the next relay response is fetched and decoded while
    Spark's worker sends the current batches to the JVM. The items come in
    the order ``make`` produces them (a read stays deterministic); an error in
    the thread is raised here, after the items produced before it. When the
    consumer stops early (Spark closes the iterator: ``GeneratorExit``), the
    thread is told to stop (``stop`` is set, ``make``'s generator is closed,
    so its relay connection too) and joined before this generator returns:
    no thread outlives the read. ``depth`` 0 reads in the calling thread.
    """
    stop = threading.Event()
    if depth <= 0:
        yield from make(stop)
        return
    items: queue.Queue[tuple[int, Any]] = queue.Queue(maxsize=depth)

    def offer(kind: int, value: Any) -> bool:
        while not stop.is_set():
            try:
                items.put((kind, value), timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        gen = make(stop)
        try:
            for item in gen:
                if not offer(0, item):
                    return
            offer(1, None)
        except BaseException as exc:  # broad: the prefetch thread's top; raised by the consumer
            offer(2, exc)
        finally:
            close = getattr(gen, "close", None)
            if close is not None:
                close()

    worker = threading.Thread(target=work, name="databus-spark-prefetch", daemon=True)
    worker.start()
    try:
        while True:
            kind, value = items.get()
            if kind == 0:
                yield value
            elif kind == 1:
                return
            else:
                raise value
    finally:
        stop.set()
        worker.join()


def _cursor(start: dict[str, Any]) -> _Cursor:
    cp = Checkpoint.from_dict(start)
    return _Cursor(cp, cp.window_offset if cp.in_window else 0)


def _responses(opts: StreamOptions, src_ids: list[int], bucket: int, cur: _Cursor,
               end_scn: int, stop: threading.Event | None) -> Iterator[bytes]:
    """The non-empty ``/stream`` responses of a bucket read from ``cur.cp``.

    The consumer advances ``cur`` through each response before asking for the
    next one, and stops after the window ``end_scn``.
    """
    stop = stop or threading.Event()
    if not cur.cp.in_window and cur.cp.window_scn >= end_scn:
        return
    filt = (ServerFilter.mod(src_ids, opts.partitions, bucket, bucket + 1).to_json()
            if opts.partitions > 1 else None)
    backoff = Backoff(0.2, 5.0)
    failing_since: float | None = None  # the relay is unreachable since
    behind_since: float | None = None  # the relay holds less than the batch since
    empty_at_top = 0
    with opts.connection() as conn:
        while True:
            try:
                resp = conn.stream(cur.cp, src_ids, size=opts.fetch_bytes, filter_json=filt,
                                   timeout=1.0)
            except TransientError:
                now = time.monotonic()
                failing_since = failing_since or now
                if now - failing_since > opts.relay_retry_seconds:
                    raise
                if backoff.wait(stop):
                    return
                continue
            failing_since = None
            backoff.reset()
            if not resp.data:
                if resp.max_scn >= end_scn:
                    # once may be a window appended between the read and the header
                    empty_at_top += 1
                    if empty_at_top > 1:
                        raise RelayProtocolError(
                            f"relay {opts.relay} served nothing after {cur.cp.to_json()} though"
                            f" it holds windows up to {resp.max_scn} (batch end {end_scn})")
                    continue
                # the relay is behind the planned end (e.g. refilling after a restart)
                behind_since = behind_since or time.monotonic()
                if time.monotonic() - behind_since > opts.relay_retry_seconds:
                    raise RelayProtocolError(
                        f"relay {opts.relay} holds windows only up to {resp.max_scn} but the batch"
                        f" ends at {end_scn}: it lost windows it had served (memory buffer?)")
                continue
            empty_at_top, behind_since = 0, None
            yield resp.data
