"""A ZooKeeper session: the one place that calls kazoo and translates its errors.

Every other module (relay cluster members, client failover and groups, the CLI)
talks to ZooKeeper through :class:`Session`; nothing outside :mod:`databus.coord`
imports kazoo or catches its exceptions.

Contract:

* **Errors.** Whatever cannot reach ZooKeeper, timed out, or lost its session is
  :class:`~databus.core.errors.CoordinatorUnavailableError` (transient), naming what
  failed. Outcomes a caller decides on are values, not errors: a node that is not
  there reads as ``None``, a ``create`` of a node that exists or a ``set``/``delete``
  whose version moved returns ``False``.
* **Waiting.** ``timeout`` (seconds) bounds a read or write; ``None`` waits as long
  as kazoo does (until the connection is lost, which raises).
* **State.** :attr:`Session.connected` and :attr:`Session.suspended` are the
  connection's state now; :meth:`Session.listen` hears of a lost session and of
  every (re)connection, on kazoo's thread (the callbacks must not block).
* **Fencing.** :meth:`Session.confirm` reads a node within the live session and
  answers only what ZooKeeper confirmed: it waits while the connection is
  suspended, and answers ``False`` once the session is gone.
* **Recipes.** :class:`Election` and :class:`Lease` are kazoo's election and
  semaphore with the same error rule.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    KazooException,
    NodeExistsError,
    NoNodeError,
    OperationTimeoutError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import KazooState

from databus.core.errors import ConfigError, CoordinatorUnavailableError

if TYPE_CHECKING:
    from databus.coord.address import ZkAddress

log = logging.getLogger("databus.coord")


@contextmanager
def translated(what: str) -> Iterator[None]:
    """kazoo errors as :class:`CoordinatorUnavailableError`, naming ``what`` failed."""
    try:
        yield
    except (KazooException, KazooTimeoutError) as exc:
        raise CoordinatorUnavailableError(
            f"ZooKeeper: {what} failed: {type(exc).__name__} {exc}".rstrip()) from exc


def connect(address: ZkAddress, *, session_timeout: float = 10.0,
            connect_timeout: float = 15.0) -> Session:
    """A started session (its connection retried for ever once started)."""
    zk = KazooClient(hosts=address.hosts, timeout=session_timeout,
                     connection_retry={"max_tries": -1, "delay": 0.2, "max_delay": 2.0},
                     command_retry={"max_tries": 3, "delay": 0.1, "max_delay": 1.0},
                     logger=logging.getLogger("databus.coord.kazoo"))
    with translated(f"connecting to {address.hosts}"):
        zk.start(timeout=connect_timeout)
    return Session(zk, address)


class Session:
    """A started kazoo client behind databus errors (see the module docstring)."""

    def __init__(self, zk: KazooClient, address: ZkAddress) -> None:
        self._zk = zk
        self.address = address

    # -- state ------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return bool(self._zk.state == KazooState.CONNECTED)

    @property
    def suspended(self) -> bool:
        """The connection is down but the session may still live."""
        return bool(self._zk.state == KazooState.SUSPENDED)

    def listen(self, *, on_lost: Callable[[], None],
               on_connected: Callable[[], None]) -> None:
        """Call ``on_lost`` when the session is lost and ``on_connected`` on every
        (re)connection (kazoo's thread: neither may block)."""
        def changed(state: str) -> None:
            if state == KazooState.LOST:
                on_lost()
            elif state == KazooState.CONNECTED:
                on_connected()

        self._zk.add_listener(changed)

    def close(self) -> None:
        """End the session (its ephemeral nodes go) and free the client. Never raises:
        a session being closed has nothing left to save."""
        try:
            self._zk.stop()
            self._zk.close()
        except (KazooException, KazooTimeoutError, OSError):
            log.debug("closing the ZooKeeper client failed", exc_info=True)

    # -- nodes ------------------------------------------------------------------------

    def get(self, path: str, *, timeout: float | None = None) -> tuple[bytes, int] | None:
        """``(data, version)`` of a node, or None when it does not exist."""
        with translated(f"reading {path}"):
            try:
                data, stat = self._zk.get_async(path).get(timeout=timeout)
            except NoNodeError:
                return None
        return data or b"", int(stat.version)

    def children(self, path: str, *, timeout: float | None = None) -> list[str] | None:
        """The names of a node's children, or None when the node does not exist."""
        with translated(f"listing {path}"):
            try:
                return list(self._zk.get_children_async(path).get(timeout=timeout))
            except NoNodeError:
                return None

    def exists(self, path: str) -> bool:
        with translated(f"looking for {path}"):
            return self._zk.exists(path) is not None

    def ensure(self, path: str) -> None:
        """Create ``path`` and its parents where missing."""
        with translated(f"creating {path}"):
            self._zk.ensure_path(path)

    def create(self, path: str, data: bytes = b"", *, ephemeral: bool = False) -> bool:
        """Create a node; False when it exists already."""
        with translated(f"creating {path}"):
            try:
                self._zk.create(path, data, ephemeral=ephemeral)
            except NodeExistsError:
                return False
        return True

    def set(self, path: str, data: bytes, *, version: int = -1) -> bool:
        """Write a node's data (only at ``version`` when given); False when the node
        is gone or its version moved."""
        with translated(f"writing {path}"):
            try:
                self._zk.set(path, data, version=version)
            except (NoNodeError, BadVersionError):
                return False
        return True

    def delete(self, path: str, *, version: int = -1,
               timeout: float | None = None) -> bool:
        """Delete a node (only at ``version`` when given); False when it is gone or its
        version moved."""
        with translated(f"deleting {path}"):
            try:
                self._zk.delete_async(path, version=version).get(timeout=timeout)
            except (NoNodeError, BadVersionError):
                return False
        return True

    def increment(self, path: str) -> int:
        """Add one to the counter at ``path`` (created at 0 when missing) by
        compare-and-set, and return the new value: two callers never get the same."""
        with translated(f"incrementing {path}"):
            self._zk.ensure_path(path)
            while True:
                data, stat = self._zk.get(path)
                value = int(data or b"0") + 1
                try:
                    self._zk.set(path, str(value).encode(), version=stat.version)
                    return value
                except BadVersionError:  # another caller moved it first: read again
                    continue

    def confirm(self, path: str, check: Callable[[bytes | None], bool], *,
                still: Callable[[], bool]) -> bool:
        """``check`` of the node's data (None: no node) as read in the live session:
        while the connection is suspended it waits (nothing unconfirmed is answered),
        a read cut by the connection is asked again, and a lost or expired session
        answers False. Gives up (False) as soon as ``still()`` is false."""
        zk = self._zk
        while still():
            if zk.state == KazooState.SUSPENDED:
                time.sleep(0.05)
                continue
            if zk.state != KazooState.CONNECTED:
                return False
            with translated(f"confirming {path}"):
                try:
                    data, _ = zk.get(path)
                except NoNodeError:
                    return check(None)
                except SessionExpiredError:
                    return False
                except (ConnectionLoss, OperationTimeoutError, KazooTimeoutError):
                    time.sleep(0.05)  # the connection dropped under the read: ask again
                    continue
            return check(data)
        return False

    # -- watches and recipes ----------------------------------------------------------

    def watch_data(self, path: str, callback: Callable[[bytes | None], None]) -> None:
        """Call ``callback`` with the node's data (None: no node) now and on every
        change, on kazoo's thread."""
        def changed(data: bytes | None, _stat: Any) -> None:
            callback(data)

        with translated(f"watching {path}"):
            self._zk.DataWatch(path, changed)

    def watch_children(self, path: str, callback: Callable[[list[str]], None]) -> None:
        """Call ``callback`` with the node's children now and on every change, on
        kazoo's thread."""
        with translated(f"watching {path}"):
            self._zk.ChildrenWatch(path, callback)

    def election(self, path: str, identifier: str) -> Election:
        return Election(self._zk, path, identifier)

    def contenders(self, path: str) -> list[str]:
        """The identifiers contending in the election at ``path``, in order."""
        with translated(f"listing the election {path}"):
            return list(self._zk.Election(path).contenders())

    def lease(self, path: str, identifier: str, max_leases: int) -> Lease | None:
        """One of ``max_leases`` leases at ``path`` (kazoo's semaphore), taken without
        waiting; None when all are held."""
        semaphore = self._zk.Semaphore(path, identifier, max_leases=max_leases)
        with translated(f"taking a lease at {path}"):
            try:
                taken = semaphore.acquire(blocking=False)
            except ValueError as exc:  # kazoo: the stored max_leases differs
                raise ConfigError(f"ZooKeeper: the leases at {path}: {exc} (every member"
                                  " must be configured with the same number)") from exc
        return Lease(self, semaphore) if taken else None


class Election:
    """kazoo's election recipe: :meth:`run` blocks until elected, then runs the
    leader's function and returns when it does (or when :meth:`cancel` ends the
    contention first)."""

    def __init__(self, zk: KazooClient, path: str, identifier: str) -> None:
        self._election = zk.Election(path, identifier)
        self._path = path

    def run(self, lead: Callable[[], None]) -> None:
        with translated(f"contending in {self._path}"):
            self._election.run(lead)

    def cancel(self) -> None:
        with translated(f"leaving {self._path}"):
            self._election.cancel()


class Lease:
    """A lease held (see :meth:`Session.lease`); its ephemeral node is :attr:`node`."""

    def __init__(self, session: Session, semaphore: Any) -> None:
        self._session = session
        self._semaphore = semaphore
        self.node: str = semaphore.create_path

    def release(self) -> None:
        """Give the lease back now; without a connected session it goes with the
        session anyway, and nothing is done."""
        if self._session.connected:
            with translated(f"releasing {self.node}"):
                self._semaphore.release()
