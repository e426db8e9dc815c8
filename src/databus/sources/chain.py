"""A chain relay's source: another relay, read over HTTP like any client.

``databus relay --source databus+http://HOST:PORT`` (or ``databus+https://``, or
``databus+zk://HOST:PORT/NAME`` for any member of a relay cluster) serves
the windows of the relay it reads: the same SCNs, the same window boundaries and
the same event bytes (payload, metadata, key, timestamp, partition: every event is
stored as it arrived, after both CRCs are checked), the EOP written again with the
upstream EOP's timestamp, so it is byte-identical too. Source ids and schemas are
the upstream's (``/sources`` and ``/register``), so a consumer can switch between
the two relays with its checkpoint.

Contract beyond :mod:`databus.sources.base`:

* **Tables.** ``source.tables`` are regexes on ``db.table`` (full match; empty = every
  table the upstream serves and the token may read). Events of other tables are
  left out of their window; the window itself is kept, empty if need be, so the
  sequence of SCNs is the upstream's.
* **Position.** ``read(after_scn)`` asks the upstream for the windows after
  ``after_scn``: the relay's own MaxSCN, kept in its persistent buffer, so a
  restarted chain relay resumes right after the last window it stored. A window
  larger than one answer arrives in parts and is stored whole.
* **No bootstrap.** A chain relay never asks anyone for snapshot data: when the
  upstream no longer holds the position (``ScnNotFound``) capture stops with
  :class:`~databus.core.errors.SourcePositionLostError`; consumers that fall off
  the chain relay bootstrap as from any relay.
* **Upstream loss.** An unreachable or failing upstream raises
  :class:`~databus.core.errors.SourceUnavailableError`: the relay retries without
  limit, with backoff, and shows it in ``/admin`` (fetcher state ``retrying``) and
  in ``databus_relay_source_errors_total``. A 401/403 is terminal. An upstream that
  stops answering without an error (packets dropped silently) counts as lost after
  ``source.network_timeout`` seconds beyond the long poll.
* **Origin.** :meth:`ChainSource.origin` is the upstream's (its ``Databus-Origin``
  header on ``/sources``), so a chain relay names the same database as its upstream.
* **Credentials.** ``source.token_file``, ``source.ca_file``, ``source.cert_file``,
  ``source.key_file`` (:class:`~databus.core.access.RelayCredentials`), else the client
  environment variables (``DATABUS_TOKEN``, ``DATABUS_TOKEN_FILE``, ``DATABUS_CA_FILE``,
  ...).
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from databus.client.credentials import Credentials
from databus.client.relay import RelayConnection
from databus.core import event as ev
from databus.core.checkpoint import Checkpoint
from databus.core.errors import (
    ConfigError,
    DatabusError,
    RelayProtocolError,
    RelayUnavailableError,
    ScnNotFoundError,
    SourcePositionLostError,
    SourceUnavailableError,
    TransientError,
    error_from_code,
)
from databus.core.schema import SchemaRegistry
from databus.core.window import Window
from databus.sources.base import Source, SourceInfo

if TYPE_CHECKING:
    from databus.sources.config import ChainSourceConfig

log = logging.getLogger("databus.sources.chain")

SCHEMES = ("databus+http", "databus+https", "databus+zk")
FETCH_BYTES = 8 << 20
"""Bytes asked for per upstream request: whole windows up to this, a part of a larger one."""


def upstream_url(url: str) -> str:
    """``databus+http://h:p/`` -> ``http://h:p`` (the upstream relay's base URL);
    ``databus+zk://HOST:PORT/NAME`` -> the relay cluster's address (any member)."""
    for scheme in SCHEMES:
        if url.startswith(scheme + "://"):
            return url[len("databus+"):].rstrip("/")
    raise ConfigError(f"a chain relay's source URL starts with databus+http://,"
                      f" databus+https:// or databus+zk://, not {url!r}")


class ChainSource(Source):
    """Reads the windows of the relay at ``config.url`` (see the module docstring)."""

    def __init__(self, config: ChainSourceConfig, *, name: str = "relay",
                 member_id: str | None = None) -> None:
        """``member_id``: this relay is a member of the upstream's cluster (its reads
        tell the leader what it holds, and the leader tells it what every member
        holds: :attr:`cluster_hw`)."""
        self.config = config
        self.member_id = member_id
        self.cluster_hw: int | None = None
        self.name = name
        self.url = upstream_url(config.url)
        try:
            self._patterns = [re.compile(p) for p in config.tables]
        except re.error as exc:
            raise ConfigError(f"bad table regex in source.tables: {exc}") from exc
        self._credentials = Credentials.from_env(**config.credential_fields())
        self._conn: RelayConnection | None = None
        self._sources: list[SourceInfo] = []
        self._listed: set[int] = set()  # every id the upstream listed
        self._wanted: set[int] = set()  # the ids ``tables`` select
        self._registry = SchemaRegistry()  # only grows: versions are never taken back
        self._origin = ""
        self._lock = threading.Lock()
        # a window that arrived in parts: the position after the parts held
        self._position: Checkpoint | None = None
        self._done_scn = -2  # the last window handed to the relay (-2: none yet)
        self._part = bytearray()
        self._part_count = 0
        self._until_ns = 0  # the upstream's captured-until when this relay held all it had
        self._stats = {"upstream_max_scn": -1.0, "upstream_bytes_total": 0.0,
                       "windows_total": 0.0,
                       "events_left_out_total": 0.0}

    # -- life cycle --------------------------------------------------------------

    def open(self) -> None:
        if self._conn is not None:
            return
        headers = {"X-Databus-Member": self.member_id} if self.member_id else None
        self._conn = RelayConnection(self.url, credentials=self._credentials, headers=headers,
                                     consumer=f"relay {self.name}",
                                     http_timeout=self.config.network_timeout)
        try:
            self._refresh()
        except TransientError as exc:  # serve what the buffer holds; capture retries
            log.warning("upstream relay %s not reachable yet (%s); capture retries", self.url,
                        exc)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # -- what it serves -------------------------------------------------------------

    def sources(self) -> list[SourceInfo]:
        return list(self._sources)

    def registry(self) -> SchemaRegistry:
        return self._registry

    def stats(self) -> dict[str, float]:
        with self._lock:
            return dict(self._stats)

    def origin(self) -> str:
        """The upstream relay's origin (its last ``/sources`` answer)."""
        return self._origin

    def captured_until_ns(self) -> int | None:
        """The upstream's ``captured until`` (``X-Databus-Source-Time-Ns``) of the last
        answer that left nothing behind: a chain relay is as far behind as its upstream."""
        return self._until_ns or None

    def _conn_or_fail(self) -> RelayConnection:
        if self._conn is None:
            raise ConfigError("the chain source was not opened")
        return self._conn

    def _refresh(self) -> None:
        """The upstream's sources (those ``tables`` select) and their schemas."""
        conn = self._conn_or_fail()
        with _translated(self.url):
            listed = conn.sources()
            self._origin = conn.origin or self._origin
            chosen = [SourceInfo(i, n) for i, n in listed
                      if not self._patterns or any(p.fullmatch(n) for p in self._patterns)]
            registry = conn.register([s.id for s in chosen]) if chosen else SchemaRegistry()
        if self._patterns and not chosen and listed:
            log.warning("no table of upstream %s matches source.tables %s (it serves %s)",
                        self.url, self.config.tables, ", ".join(n for _, n in listed))
        for i in registry.source_ids():
            for schema in registry.versions(i):
                self._registry.add(schema)
        self._listed = {i for i, _ in listed}
        self._wanted = {s.id for s in chosen}
        self._sources = chosen

    # -- reading -------------------------------------------------------------------

    def read(self, after_scn: int, stop: threading.Event, timeout: float) -> list[Window]:
        conn = self._conn_or_fail()
        if not self._sources:
            self._refresh()
        if after_scn != self._done_scn or self._position is None:
            # a (re)start: after the relay's MaxSCN; a part held for another position goes
            self._position = Checkpoint.after(after_scn) if after_scn >= 0 else None
            self._done_scn = after_scn
            self._part.clear()
            self._part_count = 0
        deadline = time.monotonic() + timeout
        while True:
            hw_before = self.cluster_hw
            position = self._position
            with _translated(self.url):
                hw = ({"X-Databus-Member-Hw": str(self.cluster_hw)}
                      if self.member_id and self.cluster_hw is not None else None)
                resp = conn.stream(position, None, size=FETCH_BYTES,
                                   timeout=max(0.0, min(timeout, deadline - time.monotonic())),
                                   headers=hw)
            windows = self._windows(resp.data)
            if resp.cluster_hw is not None:
                self.cluster_hw = resp.cluster_hw
            if resp.windows_behind == 0 and not self._part:  # all the upstream holds
                self._until_ns = max(self._until_ns, resp.source_time_ns)
            with self._lock:
                self._stats["upstream_max_scn"] = float(resp.max_scn)
                self._stats["upstream_bytes_total"] += len(resp.data)
                self._stats["windows_total"] += len(windows)
            if (windows or not resp.data or stop.is_set() or time.monotonic() >= deadline
                    or resp.cluster_hw != hw_before):
                return windows
            # only a part of a large window came: ask for the rest at once

    def _windows(self, data: bytes) -> list[Window]:
        """Whole windows of an answer; a trailing part is kept for the next request.

        All or nothing: on an error nothing changes, and the same request can be
        repeated. Kept events are copied as runs of adjacent bytes (one slice per
        window when nothing is left out), not one by one."""
        out: list[Window] = []
        position = self._position if self._position is not None else Checkpoint.flexible()
        parts: list[bytes] = [bytes(self._part)] if self._part else []
        part_count = self._part_count
        part_scn = position.window_scn if position.in_window else -1
        offset = position.window_offset if position.in_window else 0
        seen_in_part = 0
        last_done = self._done_scn
        left_out = 0
        view = memoryview(data)
        run = -1  # start of the run of kept events being collected
        off, end = 0, len(data)
        while off < end:
            length = ev.check_event(data, off)  # both CRCs: nothing damaged is stored
            src = ev.peek_src_id(data, off)
            if src == ev.SRC_EOP:
                scn = ev.peek_scn(data, off)
                if part_scn not in (-1, scn) or scn <= last_done:
                    raise RelayProtocolError(
                        f"upstream {self.url}: window {scn} out of order (open window"
                        f" {part_scn}, last stored {last_done})")
                if run >= 0:
                    parts.append(view[run:off].tobytes())
                    run = -1
                ts = ev.peek_timestamp(data, off)
                out.append(Window(scn, b"".join(parts), part_count, ts))
                position = position.window_done(scn)
                last_done = scn
                parts = []
                part_count, part_scn, offset, seen_in_part = 0, -1, 0, 0
            elif src >= 0:
                scn = ev.peek_scn(data, off)
                if part_scn == -1:
                    if scn <= last_done:
                        raise RelayProtocolError(
                            f"upstream {self.url}: event of window {scn} after window"
                            f" {last_done}")
                    part_scn = scn
                elif scn != part_scn:
                    raise RelayProtocolError(f"upstream {self.url}: window {scn} began"
                                             f" before window {part_scn} ended")
                seen_in_part += 1
                if src not in self._listed:  # a table created upstream since: list again
                    self._refresh()
                if src in self._wanted:
                    self._check_schema(data, off)
                    if run < 0:
                        run = off
                    part_count += 1
                else:
                    left_out += 1
                    if run >= 0:
                        parts.append(view[run:off].tobytes())
                        run = -1
            else:
                if src <= ev.SRC_ERROR_FIRST:
                    raise _control_error(data, off, self.url)
                # other control events (checkpoints) carry nothing to store
                if run >= 0:
                    parts.append(view[run:off].tobytes())
                    run = -1
            off += length
        if run >= 0:
            parts.append(view[run:end].tobytes())
        if part_scn != -1 and seen_in_part:
            position = position.within(part_scn, offset + seen_in_part)
        self._position = position
        self._part, self._part_count = bytearray(b"".join(parts)), part_count
        if out:
            self._done_scn = out[-1].scn
        if left_out:
            with self._lock:
                self._stats["events_left_out_total"] += left_out
        return out

    def _check_schema(self, data: bytes, off: int) -> None:
        """Fetch ``/register`` again for a schema version this source has not served yet
        (a table changed upstream), so ``/register`` here always covers the events."""
        schema_id = ev.peek_schema_id(data, off)
        if self._registry.find(schema_id) is not None:
            return
        self._refresh()
        if self._registry.find(schema_id) is None:
            raise RelayProtocolError(f"upstream {self.url} sent an event whose schema"
                                     f" {schema_id.hex()} its /register does not know")

    def complete_after(self, after_scn: int) -> int | None:
        # the upstream proves continuity (ScnNotFound when it cannot); a fresh chain
        # relay starts at the upstream's oldest window, whose history it cannot vouch for
        return after_scn if after_scn >= 0 else None


@contextmanager
def _translated(url: str) -> Iterator[None]:
    """Client errors at the boundary: upstream loss is transient for the relay's
    fetcher, a lost position is :class:`SourcePositionLostError`."""
    try:
        yield
    except ScnNotFoundError as exc:
        raise SourcePositionLostError(
            f"upstream relay {url} no longer holds this relay's position ({exc}); a chain"
            " relay never bootstraps: start it with an empty buffer to follow the upstream"
            " from its oldest window") from exc
    except RelayUnavailableError as exc:
        raise SourceUnavailableError(f"upstream relay {url}: {exc}") from exc


def _control_error(data: bytes, off: int, url: str) -> DatabusError:
    e = ev.decode(data, off)
    try:
        body = json.loads(e.payload)
        fields = body.get("fields")
        return error_from_code(str(body["error"]), f"upstream {url}: {body.get('message', '')}",
                               fields if isinstance(fields, dict) else None)
    except (ValueError, KeyError, TypeError):
        return RelayProtocolError(f"upstream {url} sent error event {e.src_id} at scn {e.scn}")
