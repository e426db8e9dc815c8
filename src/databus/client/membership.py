"""A dynamic client group: member processes share N partitions of a stream through
ZooKeeper, and rebalance as members come and go.

``databus replicate --group zk://HOST:PORT/GROUP --group-partitions N ...`` or
:class:`DynamicGroup` in the library. Partition ``p`` is the server-side MOD bucket
``p`` of every named source (``ClientConfig.partitions``/``member``), so all changes
of one key reach one partition, in commit order.

Nodes under ``/databus/groups/GROUP``:

* ``members/<id>``: ephemeral, one per live member;
* ``partitions/<p>/owner``: ephemeral, ``"<member> <epoch>"``, held by the member
  that runs partition ``p``;
* ``partitions/<p>/epoch``: a counter each new owner increments (compare-and-set).

**Assignment.** The live members, sorted, own the partitions round-robin
(``p % len(members)``). When the member list changes every member computes the
same new assignment: it first stops the partitions it gives up (the window in
hand finishes or rolls back; the owner node goes), then takes the new ones once
their owner node is free, so a partition never has two owners at once.

**Fencing.** A partition's consumer checks, at the start and at the end of every
window, that its owner node still holds its ``member epoch`` in a connected
session; otherwise that partition stops with
:class:`~databus.core.errors.ConsumerFatalError` before it commits anything. A
member whose session expired (paused, partitioned) loses its owner nodes with it,
and its partitions go to others.

**Checkpoints** are per partition: ``checkpoint_store(p)`` (for ``replicate``, the
target row ``replicate-GROUP-p<p>``, committed with each window), so a new owner
resumes where the old one committed. Delivery stays at-least-once: a window the
old owner applied but did not checkpoint is applied again.

**Callbacks.** ``listener.on_partitions_assigned(ps)`` and
``on_partitions_revoked(ps)`` tell the application which partitions it runs: the
first before any window of those partitions runs, the second after their last
window ended and before their owner nodes are released (so before another member
can take them). A member that dies hears of nothing.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from databus.client.checkpoints import CheckpointStore
from databus.client.client import DatabusClient
from databus.client.config import ClientConfig
from databus.client.consumer import Consumer, Result, WindowBatch
from databus.client.dispatcher import takes_many
from databus.coord import Session, ZkAddress, connect
from databus.core.errors import (
    ConfigError,
    ConsumerFatalError,
    CoordinatorUnavailableError,
    DatabusError,
)

log = logging.getLogger("databus.client.group")

GROUPS = "/databus/groups"


@dataclass(frozen=True)
class Ownership:
    """Who runs a partition, in which epoch (what a fenced consumer records)."""

    partition: int
    member: str
    epoch: int


class GroupListener(Protocol):
    def on_partitions_assigned(self, partitions: list[int]) -> None: ...

    def on_partitions_revoked(self, partitions: list[int]) -> None: ...


_CALLBACKS = [name for name in vars(Consumer) if name.startswith("on_")]


class _Fenced(Consumer):
    """Delegates every callback to ``inner``; checks ownership around each window."""

    def __init__(self, inner: Consumer, check: Callable[[], None]) -> None:
        self.inner = inner
        self.check = check

    def on_start_data_event_sequence(self, scn: int) -> Result:
        self.check()
        return self.inner.on_start_data_event_sequence(scn)

    def on_end_data_event_sequence(self, scn: int) -> Result:
        self.check()  # before the window (and its checkpoint) can be committed
        return self.inner.on_end_data_event_sequence(scn)

    def on_checkpoint(self, scn: int) -> Result:
        self.check()
        return self.inner.on_checkpoint(scn)


def _delegate(name: str) -> Callable[..., Any]:
    def call(self: _Fenced, *args: Any) -> Any:
        return getattr(self.inner, name)(*args)

    call.__name__ = name
    return call


for _name in _CALLBACKS:
    if _name not in vars(_Fenced) and _name != "on_windows":
        setattr(_Fenced, _name, _delegate(_name))


class _FencedMany(_Fenced):
    """:class:`_Fenced` of a consumer that takes many windows per call (``on_windows``:
    :func:`databus.client.dispatcher.takes_many`): ownership checked around each call.
    A plain :class:`_Fenced` does not define ``on_windows``, so its inner consumer gets
    the per-window callbacks it expects."""

    def on_windows(self, batch: WindowBatch) -> Result:
        self.check()
        result = self.inner.on_windows(batch)
        self.check()  # before the windows (and their checkpoint) can be committed
        return result


def fenced(inner: Consumer, check: Callable[[], None]) -> _Fenced:
    """``inner`` with its ownership checked around each window (or each batch of
    windows, for a consumer that takes many)."""
    return (_FencedMany if takes_many(inner) else _Fenced)(inner, check)


class _Partition:
    """One partition run by this member: a client on a thread."""

    def __init__(self, group: DynamicGroup, p: int, epoch: int) -> None:
        self.p = p
        self.epoch = epoch
        self.stop = threading.Event()
        self.group = group
        n = group.partitions
        cfg = group.config.model_copy(update={"partitions": f"MOD:{n}", "member": p})
        cfg = ClientConfig.model_validate(cfg.model_dump())
        owner = Ownership(p, group.member_id, epoch)
        consumer = fenced(group.consumer_factory(owner), lambda: group.check_owner(p, epoch))
        self.client = DatabusClient(cfg, consumer, group.store_factory(p))
        self.thread = threading.Thread(target=self._run, name=f"databus-partition-{p}",
                                       daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        try:
            self.client.run(stop=self.stop)
        except ConsumerFatalError as exc:
            log.warning("partition %d stopped: %s", self.p, exc)
        # broad: the top of the partition's thread; DynamicGroup.run reports it
        except BaseException as exc:
            self.error = exc
            log.error("partition %d failed: %s", self.p, exc)
            self.group.wake.set()


class DynamicGroup:
    """One member of a dynamic client group (see the module docstring)."""

    def __init__(self, address: str, config: ClientConfig, *, partitions: int,
                 consumer_factory: Callable[[Ownership], Consumer],
                 store_factory: Callable[[int], CheckpointStore],
                 member_id: str | None = None, session_timeout: float = 4.0,
                 listener: GroupListener | None = None) -> None:
        if not config.sources:
            raise ConfigError("a client group needs its sources named (a table added later"
                              " would reach every member)")
        if config.filter is not None or config.partitions is not None:
            raise ConfigError("a client group's partitions are its filter: give no filter"
                              " or partitions")
        if not 1 <= partitions <= 10_000:
            raise ConfigError(f"a group has 1 to 10000 partitions, not {partitions}")
        self.address = ZkAddress.parse(address)
        self.path = f"{GROUPS}/{self.address.name}"
        self.config = config
        self.partitions = partitions
        self.consumer_factory = consumer_factory
        self.store_factory = store_factory
        self.member_id = member_id or f"{socket.gethostname()}-{os.getpid()}"
        self.session_timeout = session_timeout
        self.listener = listener
        self.running: dict[int, _Partition] = {}
        self.wake = threading.Event()
        self._members: list[str] = []
        self._session: Session | None = None

    # -- ownership ------------------------------------------------------------------

    def check_owner(self, p: int, epoch: int) -> None:
        """Raise :class:`ConsumerFatalError` unless this member still runs ``p`` in
        ``epoch`` (its owner node, read in a connected session)."""
        session = self._session
        if session is None or not session.connected:
            raise ConsumerFatalError(f"partition {p}: no ZooKeeper session to confirm"
                                     " ownership")
        try:
            found = session.get(f"{self.path}/partitions/{p}/owner")
        except DatabusError as exc:  # connection lost: not ours to commit
            raise ConsumerFatalError(f"partition {p}: ownership not confirmed ({exc})") from exc
        if found is None:
            raise ConsumerFatalError(f"partition {p}: ownership not confirmed (no owner node)")
        if found[0] != self._owner(epoch):
            raise ConsumerFatalError(f"partition {p} now belongs to"
                                     f" {found[0].decode(errors='replace')!r}")

    def _owner(self, epoch: int) -> bytes:
        """What this member writes in an owner node it holds in ``epoch``."""
        return f"{self.member_id} {epoch}".encode()

    def _take(self, p: int) -> int | None:
        """Become ``p``'s owner: a new epoch, the owner node; None while another holds it."""
        session = self._session
        assert session is not None
        base = f"{self.path}/partitions/{p}"
        if session.exists(f"{base}/owner"):
            return None
        epoch = session.increment(f"{base}/epoch")
        if not session.create(f"{base}/owner", self._owner(epoch), ephemeral=True):
            return None
        return epoch

    def _release(self, p: int, epoch: int) -> None:
        """Delete ``p``'s owner node if it is still this member's. Bounded: without a
        connected session it does nothing (the node is ephemeral and goes with the
        session), and each call waits at most a session timeout, so a member asked to
        stop while ZooKeeper is unreachable still exits."""
        session = self._session
        assert session is not None
        if not session.connected:
            return
        node = f"{self.path}/partitions/{p}/owner"
        try:
            found = session.get(node, timeout=self.session_timeout)
            if found is not None and found[0] == self._owner(epoch):
                session.delete(node, version=found[1], timeout=self.session_timeout)
        except DatabusError as exc:  # the session is going: its owner node goes with it
            log.debug("releasing partition %d: %s", p, exc)

    # -- assignment -----------------------------------------------------------------

    def assigned(self) -> set[int]:
        members = sorted(self._members)
        if self.member_id not in members:
            return set()
        i = members.index(self.member_id)
        return {p for p in range(self.partitions) if p % len(members) == i}

    def _on_members(self, children: list[str]) -> None:
        self._members = list(children)
        self.wake.set()

    def _rebalance(self) -> None:
        target = self.assigned()
        give_up = sorted(set(self.running) - target)
        if give_up:
            for p in give_up:
                self.running[p].stop.set()
            stopped = [self.running.pop(p) for p in give_up]
            for part in stopped:
                part.thread.join(60)
            if self.listener is not None:  # before another member may take them
                self.listener.on_partitions_revoked(give_up)
            for part in stopped:
                self._release(part.p, part.epoch)
            log.info("member %s gave up partitions %s", self.member_id, give_up)
        taken: list[_Partition] = []
        for p in sorted(target - set(self.running)):
            epoch = self._take(p)
            if epoch is None:
                continue  # its old owner has not let go yet: the next pass
            taken.append(_Partition(self, p, epoch))
        if taken:
            # the listener hears of partitions before their first window runs, and of
            # revoked ones after their last window ended (above)
            if self.listener is not None:
                self.listener.on_partitions_assigned([part.p for part in taken])
            for part in taken:
                self.running[part.p] = part
                part.thread.start()
            log.info("member %s runs partitions %s", self.member_id, sorted(self.running))

    def run(self, stop: threading.Event) -> None:
        """Join the group and run the assigned partitions until ``stop``."""
        session = connect(self.address, session_timeout=self.session_timeout)
        self._session = session
        try:
            session.ensure(f"{self.path}/members")
            for p in range(self.partitions):
                session.ensure(f"{self.path}/partitions/{p}")
            if not session.create(f"{self.path}/members/{self.member_id}", ephemeral=True):
                # a member of that name, or this one's last session not expired yet
                raise CoordinatorUnavailableError(
                    f"ZooKeeper: joining the group {self.address} failed: a member named"
                    f" {self.member_id!r} is there already")
            session.watch_children(f"{self.path}/members", self._on_members)
            log.info("member %s joined group %s (%d partitions)", self.member_id,
                     self.address, self.partitions)
            while not stop.is_set():
                self.wake.wait(0.2)
                self.wake.clear()
                for p, part in list(self.running.items()):
                    if not part.thread.is_alive():  # fenced or failed: let it go
                        self.running.pop(p)
                        self._release(p, part.epoch)
                        if part.error is not None and not isinstance(part.error,
                                                                     DatabusError):
                            raise part.error
                if session.connected:
                    try:
                        self._rebalance()
                    except DatabusError as exc:
                        log.warning("rebalance: %s", exc)
        finally:
            for part in self.running.values():
                part.stop.set()
            for p, part in list(self.running.items()):
                part.thread.join(60)
                self._release(p, part.epoch)
            self.running.clear()
            session.close()
