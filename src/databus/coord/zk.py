"""ZooKeeper addresses, sessions and the layout of a relay cluster's nodes.

An address is ``zk://HOST:PORT[,HOST:PORT...]/NAME``; a cluster named NAME keeps
its nodes under ``/databus/clusters/NAME``:

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
  its live session (see :mod:`databus.relay.cluster`).

kazoo errors are translated here: whatever cannot reach ZooKeeper or lost its
session is :class:`~databus.core.errors.CoordinatorUnavailableError`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError

from databus.core.access import ZK_ADDRESS
from databus.core.errors import ConfigError, CoordinatorUnavailableError

log = logging.getLogger("databus.coord")

ROOT = "/databus/clusters"


@dataclass(frozen=True)
class ZkAddress:
    """``zk://HOST:PORT[,HOST:PORT]/NAME``."""

    hosts: str
    name: str

    @classmethod
    def parse(cls, text: str) -> ZkAddress:
        m = ZK_ADDRESS.match(text.strip())
        if m is None:
            raise ConfigError(f"not a cluster address: {text!r} (expected"
                              " zk://HOST:PORT[,HOST:PORT...]/NAME)")
        return cls(m["hosts"], m["name"])

    @property
    def path(self) -> str:
        return f"{ROOT}/{self.name}"

    def __str__(self) -> str:
        return f"zk://{self.hosts}/{self.name}"


def is_zk(url: str) -> bool:
    return url.startswith("zk://")


@contextmanager
def translated(what: str) -> Iterator[None]:
    """kazoo errors as databus errors, naming ``what`` failed."""
    try:
        yield
    except (KazooException, KazooTimeoutError) as exc:
        raise CoordinatorUnavailableError(
            f"ZooKeeper: {what} failed: {type(exc).__name__} {exc}".rstrip()) from exc


def zk_client(address: ZkAddress, *, session_timeout: float = 10.0,
              connect_timeout: float = 15.0) -> KazooClient:
    """A started kazoo client (retrying its connection for ever once started)."""
    zk = KazooClient(hosts=address.hosts, timeout=session_timeout,
                     connection_retry={"max_tries": -1, "delay": 0.2, "max_delay": 2.0},
                     command_retry={"max_tries": 3, "delay": 0.1, "max_delay": 1.0},
                     logger=logging.getLogger("databus.coord.kazoo"))
    with translated(f"connecting to {address.hosts}"):
        zk.start(timeout=connect_timeout)
    return zk


class ClusterView:
    """Read-only views of a cluster's nodes (members, leader, epoch)."""

    def __init__(self, zk: KazooClient, address: ZkAddress, *, timeout: float = 10.0) -> None:
        """``timeout``: seconds each read may wait (ZooKeeper unreachable: a
        CoordinatorUnavailableError then, never a read that waits for ever)."""
        self.zk = zk
        self.address = address
        self.timeout = timeout

    def _json(self, path: str) -> dict[str, Any] | None:
        try:
            data, _ = self.zk.get_async(path).get(timeout=self.timeout)
        except NoNodeError:
            return None
        try:
            value = json.loads(data or b"null")
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    def leader(self) -> dict[str, Any] | None:
        with translated("reading the leader"):
            return self._json(f"{self.address.path}/leader")

    def epoch(self) -> int:
        with translated("reading the epoch"):
            try:
                data, _ = self.zk.get_async(f"{self.address.path}/epoch").get(
                    timeout=self.timeout)
            except NoNodeError:
                return 0
        return int(data or b"0")

    def members(self) -> list[dict[str, Any]]:
        base = f"{self.address.path}/members"
        with translated("listing members"):
            try:
                names = sorted(self.zk.get_children_async(base).get(timeout=self.timeout))
            except NoNodeError:
                return []
            found = [self._json(f"{base}/{n}") for n in names]
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
