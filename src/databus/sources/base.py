"""The source contract: what every fetcher (SQLite txlog, MySQL binlog, a chained
relay) promises to the relay that runs it.

Guarantees a :class:`Source` gives:

* **Position.** An SCN is a 64-bit integer assigned in commit order; windows
  come out with strictly increasing SCNs. The SCN of a window is the position
  to restart *after*: ``read(after_scn=S)`` yields exactly the committed
  windows with an SCN greater than S, in commit order.
* **Windows.** A window holds one or more whole transactions, never a part of
  one, and only committed changes. Each data event is fully encoded
  (:mod:`databus.core.event`) with the window's SCN as its sequence.
* **Restart.** Because of the above, restarting from the last SCN the relay
  stored replays nothing twice and skips nothing, as long as the source still
  has that position; when it does not, :meth:`read` raises
  :class:`~databus.core.errors.SourcePositionLostError`.
* **Errors.** A database that goes away raises
  :class:`~databus.core.errors.SourceUnavailableError` (transient: the relay
  retries with backoff); everything else is a terminal :class:`DatabusError`.

Life cycle (describe cheaply, run separately): a source is built from its
validated config model (:mod:`databus.sources.config`) and its constructor does
no I/O; :meth:`open` connects, installs what capture needs and loads saved state,
and must be called (once; it is idempotent) before :meth:`sources`, :meth:`read`
and the rest; :meth:`close` releases what :meth:`open` took. Used as a context
manager, a source is opened on entry and closed on exit.

Threading: a source is driven by one capture thread. :meth:`read` blocks at
most ``timeout`` seconds and returns early when ``stop`` is set.

Identity: a source is built for a :class:`Capturer` (the relay's resolved identity,
:mod:`databus.relay.identity`): its own state files in ``state_dir`` are named after
``Capturer.name``; what every capturer of one database shares on the server (a
PostgreSQL slot and publication, a SQLite trim registration) after
``Capturer.shared``; a MySQL source connects as replica ``Capturer.server_id``. A
fresh start that finds none of its own but one named ``Capturer.legacy`` (what every
relay was named before names were derived) refuses to start with one line naming
``--name relay`` rather than adopting or orphaning it. :meth:`origin` names the
captured database, the same for every relay capturing it.
"""

from __future__ import annotations

import hashlib
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from databus.core.errors import ConfigError, InvalidRequestError
from databus.core.schema import SchemaRegistry
from databus.core.window import Window

if TYPE_CHECKING:
    from databus.sources.config import AnySourceConfig


LEGACY_NAME = "relay"
"""The name every relay had before names were derived (:mod:`databus.relay.identity`)."""

SERVER_ID_BASE = 3_000_000_000
"""Derived MySQL replica ids lie in ``[SERVER_ID_BASE, SERVER_ID_BASE + 10**9)``: far above
the small ids servers are given by hand, below 2**32."""


def derived_server_id(key: str) -> int:
    """The MySQL/MariaDB replica id a relay uses when none is set: stable for ``key``
    (the relay's name), in ``[SERVER_ID_BASE, SERVER_ID_BASE + 10**9)``."""
    digest = hashlib.sha256(f"databus-server-id:{key}".encode()).digest()
    return SERVER_ID_BASE + int.from_bytes(digest[:8], "big") % 1_000_000_000


@dataclass(frozen=True, slots=True)
class Capturer:
    """Who captures: the names a source keeps its state and server-side objects under
    (see the module docstring)."""

    name: str = LEGACY_NAME
    """The relay's name: the source's state files are ``<state_dir>/<name>.*.json``."""
    shared: str | None = None
    """What the capturers of one database share (PostgreSQL slot and publication
    ``databus_<shared>``, SQLite trim registration); None: ``name``."""
    server_id: int | None = None
    """MySQL replica id when the source config sets none; None: derived from ``name``."""
    legacy: str | None = None
    """A name whose server-side objects a fresh start must not silently adopt or
    orphan (``relay`` when the name was derived); None: the name was given."""
    host: str = ""
    """The machine the relay runs on, as other servers are told (replica host,
    application name)."""

    @property
    def shared_name(self) -> str:
        return self.shared or self.name

    def replica_id(self, configured: int | None) -> int:
        """The MySQL replica id: ``configured``, else this capturer's, else derived."""
        if configured is not None:
            return configured
        return self.server_id if self.server_id is not None else derived_server_id(self.name)

    def label(self, limit: int = 60) -> str:
        """``databus <name>@<host>``: how this relay introduces itself to the database
        (a replica's report host, an application name), cut to ``limit`` characters."""
        return f"databus {self.name}@{self.host or '?'}"[:limit]


@dataclass(frozen=True, slots=True)
class SourceInfo:
    """A logical source: one captured table."""

    id: int
    name: str  # "db.table"


class Source(ABC):
    """A change source. See the module docstring for the guarantees."""

    def open(self) -> None:  # noqa: B027 - optional hook: sources without I/O need none
        """Connect and install what capture needs (see the module docstring)."""

    def __enter__(self) -> Source:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @abstractmethod
    def sources(self) -> list[SourceInfo]:
        """The logical sources this source captures (stable ids)."""

    @abstractmethod
    def registry(self) -> SchemaRegistry:
        """Schemas of every table version this source has emitted or will emit."""

    @abstractmethod
    def read(self, after_scn: int, stop: threading.Event, timeout: float) -> list[Window]:
        """Committed windows with SCN > ``after_scn``, in commit order.

        Returns an empty list when nothing new was committed within ``timeout``
        seconds or ``stop`` was set.
        """

    def signal(self, kind: str, data: dict[str, Any] | None) -> str:
        """Send a signal (e.g. ``execute-snapshot``) through the source's own log, so it
        takes effect in commit order; returns its id. Sources without signals raise
        :class:`~databus.core.errors.InvalidRequestError`."""
        raise InvalidRequestError(f"{type(self).__name__} takes no signals")

    def reconfigure(self, config: AnySourceConfig) -> None:
        """Apply a changed source config while running (e.g. tables added). Sources
        that cannot raise :class:`~databus.core.errors.ConfigError`; the running
        config then stays."""
        raise ConfigError(f"{type(self).__name__} cannot change its config while running")

    def capture_only(self) -> None:  # noqa: B027 - optional hook: most sources never snapshot mid-stream
        """Make this source one of several capturing the same database at once (a relay
        cluster's co-leader, docs/cluster.md): it runs no snapshot of its own, since
        snapshot rows depend on when they are read and only one capturer may take
        them. A source whose log can show that another capturer started one (MySQL: a
        row of the signal table) returns nothing from that transaction on and reports
        ``snapshot_elsewhere`` = 1 in :meth:`stats`; its owner then stops using it.
        Call before the first :meth:`read`."""

    def origin(self) -> str:
        """The captured database's identity: stable across restarts and the same for
        every relay capturing that database (so a checkpoint, whose SCNs are that
        database's, is portable between them): SQLite ``sqlite:<installation id>``,
        MySQL/MariaDB ``mysql:<server uuid or host:port/server_id>``, PostgreSQL
        ``postgresql:<system identifier>/<database>``, a chain relay its upstream's.
        Known once :meth:`open` ran; ``""`` when the source cannot tell (the relay then
        sends no ``Databus-Origin`` header)."""
        return ""

    def stats(self) -> dict[str, float]:
        """Numbers the relay exports as ``databus_relay_source_stat{name=...}``;
        called from other threads, so it returns a fresh dict."""
        return {}

    def captured_until_ns(self) -> int | None:
        """The source time (ns since the Unix epoch) up to which :meth:`read` has returned
        every committed change, when the source can tell better than the relay's rule
        ("a read that returned nothing started at a time when nothing else was
        committed"): a chain relay its upstream's, a log reader the time it last reached
        the end of the log. None: the relay's rule applies. The relay's lag is measured
        against it (docs/operations.md, "Time in the stream"); called on the capture
        thread after each read."""
        return None

    def complete_after(self, after_scn: int) -> int | None:
        """The SCN after which ``read(after_scn, ...)`` delivers every committed change,
        or None when the source cannot say (then the relay proves continuity only from
        the first window it stores). ``after_scn >= 0``: that position itself; -1 (a
        fresh start): -1 only when the source re-reads its whole history from the
        beginning (no snapshot, nothing trimmed), the trim point when it re-reads what
        is left, None when it starts at its end or with a snapshot."""
        return after_scn if after_scn >= 0 else None

    def adopt_schemas(self, registry: SchemaRegistry) -> None:  # noqa: B027 - optional hook
        """Take over schema versions other members already published (a relay cluster's
        new leader, before it reads), so versions and ids continue where they were.
        Sources whose versions live in the captured database itself need nothing."""

    def acknowledge(self, scn: int) -> None:  # noqa: B027 - optional hook
        """Everything up to ``scn`` is durable in the relay; the source may trim it."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections. Idempotent."""
