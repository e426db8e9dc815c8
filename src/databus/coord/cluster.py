"""The nodes of a relay cluster in ZooKeeper: what members write, what anyone reads.

A cluster named NAME (address ``zk://HOST:PORT[,HOST:PORT...]/NAME``) keeps its nodes
under ``/databus/clusters/NAME``:

* ``members/<id>``: ephemeral, one per live relay: JSON ``{"id", "url", "role",
  "max_scn", "epoch", "snapshot_running", "name", "capture", "updated"}``, rewritten as
  it changes and once a second; ``capture`` is the relay's capture state (``state``:
  the fetcher's, e.g. running or failed; ``reads``: database, upstream or nothing;
  ``capturing``; ``error``);
* ``election/``: kazoo's election recipe (sequential ephemeral nodes; the lowest
  leads);
* ``leader``: ephemeral, written by the leader once it leads: ``{"id", "url",
  "epoch"}``;
* ``epoch``: a counter, incremented (compare-and-set) by every new leader. A leader
  publishes a window only after reading its own epoch back from this node within
  its live session (:meth:`MemberNodes.holds_epoch`);
* ``epochs/<n>``: where epoch ``n`` began: ``{"leader", "after_scn", "at"}``;
* ``coleaders/``: the co-leaders' leases (kazoo's semaphore, ``leaders`` - 1 of them).

:class:`ClusterView` reads them (``/admin``, ``databus cluster status``, clients
looking for a member); :class:`MemberNodes` is what one member writes. What the roles
mean is :mod:`databus.relay.cluster`'s. Errors: see :mod:`databus.coord.session`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from databus.coord.address import ZkAddress
from databus.coord.session import Election, Lease, Session
from databus.core.errors import CoordinatorUnavailableError


class ClusterView:
    """Read-only views of a cluster's nodes (members, leader, epoch)."""

    def __init__(self, session: Session, address: ZkAddress, *, timeout: float = 10.0) -> None:
        """``timeout``: seconds each read may wait (ZooKeeper unreachable: a
        CoordinatorUnavailableError then, never a read that waits for ever)."""
        self.session = session
        self.address = address
        self.timeout = timeout

    def _json(self, path: str) -> dict[str, Any] | None:
        found = self.session.get(path, timeout=self.timeout)
        if found is None:
            return None
        try:
            value = json.loads(found[0] or b"null")
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    def leader(self) -> dict[str, Any] | None:
        return self._json(f"{self.address.path}/leader")

    def epoch(self) -> int:
        found = self.session.get(f"{self.address.path}/epoch", timeout=self.timeout)
        return int(found[0] or b"0") if found is not None else 0

    def members(self) -> list[dict[str, Any]]:
        base = f"{self.address.path}/members"
        names = self.session.children(base, timeout=self.timeout)
        found = [self._json(f"{base}/{n}") for n in sorted(names or [])]
        return [m for m in found if m is not None]

    def urls(self) -> list[str]:
        """Member URLs, the leader's first, then the co-leaders' (they capture, so they
        hold the newest windows when the leader is gone): where a client should read."""
        leader = self.leader()
        members = [m for m in self.members() if m.get("url")]
        capturing = sorted(members, key=lambda m: m.get("role") != "coleader")  # stable
        urls = [str(m["url"]) for m in capturing]
        if leader and leader.get("url") in urls:
            urls.remove(leader["url"])
            urls.insert(0, str(leader["url"]))
        return urls

    def status(self) -> dict[str, Any]:
        """The cluster at a glance: ``leader`` carries its member record's ``capture``
        and ``healthy`` (it captures from the database now), so a leader whose capture
        stopped is not shown as a healthy one."""
        leader, members = self.leader(), self.members()
        if leader is not None:
            record = next((m for m in members if m.get("id") == leader.get("id")), {})
            capture = record.get("capture")
            leader = {**leader, "capture": capture,
                      "healthy": isinstance(capture, dict) and bool(capture.get("capturing"))
                      and capture.get("reads") == "database"}
        return {"cluster": str(self.address), "epoch": self.epoch(), "leader": leader,
                "members": members}


class MemberNodes(ClusterView):
    """The nodes one member (``member_id``) writes, and its fencing reads."""

    def __init__(self, session: Session, address: ZkAddress, member_id: str) -> None:
        super().__init__(session, address)
        self.member_id = member_id
        self.path = address.path
        self._member = f"{self.path}/members/{member_id}"

    def ensure(self) -> None:
        for sub in ("members", "election", "epochs", "coleaders"):
            self.session.ensure(f"{self.path}/{sub}")

    def register(self, record: dict[str, Any]) -> None:
        """Write this member's node (ephemeral), whether or not it is there."""
        data = json.dumps(record).encode()
        if not self.session.create(self._member, data, ephemeral=True):
            self.session.set(self._member, data)

    def publish(self, record: dict[str, Any]) -> bool:
        """Rewrite this member's node; False when it is gone (a new session: register
        again)."""
        return self.session.set(self._member, json.dumps(record).encode())

    def new_epoch(self, after_scn: int) -> int:
        """Take the next epoch (compare-and-set) and record that it begins after
        ``after_scn``."""
        epoch = self.session.increment(f"{self.path}/epoch")
        node = f"{self.path}/epochs/{epoch:010d}"
        record = {"leader": self.member_id, "after_scn": after_scn, "at": time.time()}
        if not self.session.create(node, json.dumps(record).encode()):
            raise CoordinatorUnavailableError(f"ZooKeeper: {node} exists already")
        return epoch

    def newest_epoch(self) -> tuple[int, int] | None:
        """``(n, after_scn)`` of the newest epoch recorded, or None before any."""
        epochs = self.session.children(f"{self.path}/epochs")
        if not epochs:
            return None
        newest = max(epochs, key=int)
        found = self.session.get(f"{self.path}/epochs/{newest}")
        if found is None:
            return None
        return int(newest), int(json.loads(found[0])["after_scn"])

    def write_leader(self, url: str, epoch: int, *, wait: float) -> None:
        """Create the ``leader`` node; an old leader's node lives until its session
        ends, so wait up to ``wait`` seconds for it to go."""
        node = f"{self.path}/leader"
        data = json.dumps({"id": self.member_id, "url": url, "epoch": epoch}).encode()
        deadline = time.monotonic() + wait
        while not self.session.create(node, data, ephemeral=True):
            if time.monotonic() > deadline:
                raise CoordinatorUnavailableError(
                    f"ZooKeeper: writing the leader node failed: {node} still held after"
                    f" {wait:.0f} s")
            time.sleep(0.2)

    def drop_leader(self, epoch: int) -> bool:
        """Delete the ``leader`` node when it is still this member's for ``epoch``;
        False when it was not (gone, or another's). A node that is not JSON raises
        ValueError."""
        node = f"{self.path}/leader"
        found = self.session.get(node)
        if found is None:
            return False
        mine = json.loads(found[0] or b"{}")
        if mine.get("id") != self.member_id or mine.get("epoch") != epoch:
            return False
        return self.session.delete(node, version=found[1])

    def holds_epoch(self, epoch: int, *, still: Callable[[], bool]) -> bool:
        """Fencing of a leader: the ``epoch`` node, read in the live session, holds
        ``epoch`` (see :meth:`Session.confirm`)."""
        return self.session.confirm(f"{self.path}/epoch",
                                    lambda data: int(data or b"0") == epoch, still=still)

    def holds_lease(self, lease: Lease, *, still: Callable[[], bool]) -> bool:
        """Fencing of a co-leader: its lease node exists, read in the live session."""
        return self.session.confirm(lease.node, lambda data: data is not None, still=still)

    def election(self) -> Election:
        return self.session.election(f"{self.path}/election", self.member_id)

    def contenders(self) -> list[str]:
        return self.session.contenders(f"{self.path}/election")

    def coleaders(self) -> int:
        """How many co-leader leases are held."""
        return len(self.session.children(f"{self.path}/coleaders") or [])

    def coleader_lease(self, leases: int) -> Lease | None:
        return self.session.lease(f"{self.path}/coleaders", self.member_id, leases)
