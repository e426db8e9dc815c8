"""A relay cluster's leader cut off silently from ZooKeeper while its consumers still
reach it (a partition between the relay and the coordinator only).

Three ``databus relay --cluster`` members capture a SQLite shop under a writer; each
reaches ZooKeeper through a forwarder of its own (``tests.support.netcut``), so the
packets of one member alone can be dropped (``tests.support.faults``: no reset, no
FIN). The leader's are, for a few session timeouts: its session expires, another
member is elected and captures; the old leader publishes nothing ZooKeeper did not
confirm (its windows stay a prefix of the cluster's), and once the cut heals it
follows the new leader and says it no longer leads. A consumer on ``zk://`` ends with
exactly the committed transactions, in order, each whole; every member serves the
same windows.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import faults
from tests.support.netcut import Cuttable
from tests.support.relay_cluster import SESSION, Cluster, same_windows, settled
from tests.support.shop import Writer, create_shop
from tests.support.verify import check_delivery, read_windows
from tests.support.writers import Repeating
from tests.support.zookeeper import ZooKeeper

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("nft")]

MEMBERS = ("m1", "m2", "m3")



@dataclass
class ForwardedCluster(Cluster):
    """:class:`Cluster` whose members each reach ZooKeeper through their own forwarder."""

    links: dict[str, Cuttable] = field(default_factory=dict)

    def configure(self, member: str, config: dict[str, Any]) -> None:
        if member in self.links:
            config["cluster"]["address"] = (f"zk://127.0.0.1:{self.links[member].port}"
                                            f"/{self.name}")


def _wake(link: Cuttable) -> None:
    with suppress(OSError):
        link._listener.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def cluster(tmp_path: Path, zookeeper: ZooKeeper) -> Iterator[tuple[ForwardedCluster, Writer]]:
    db = tmp_path / "shop.db"
    create_shop(db)
    with ExitStack() as stack:
        links = {}
        for m in MEMBERS:
            links[m] = link = stack.enter_context(Cuttable(zookeeper.port))
            # runs just before the forwarder's exit: a listener closed from another
            # thread does not wake its accept() on Linux, a shutdown does (no 5 s join)
            stack.callback(_wake, link)
        w = stack.enter_context(Writer(db, seed=41))
        c = stack.enter_context(ForwardedCluster(tmp_path, db, zookeeper, "zkcut",
                                                 links=links))
        for m in MEMBERS:
            c.start(m)
        c.wait("a leader", c.leader, 60)
        c.start("recorder")
        yield c, w


def test_a_leader_cut_off_from_zookeeper_stops_leading_and_publishes_nothing_after(
        cluster: tuple[ForwardedCluster, Writer]) -> None:
    c, w = cluster
    with Repeating(w.transaction, 0.01):
        time.sleep(1.5)
        old = c.wait("a leader", c.leader, 60)
        epoch_before = int(c.admin(old)["cluster"]["epoch"])  # type: ignore[index]
        with faults.cut(c.links[old].port):
            t0 = time.monotonic()
            new = c.wait("another member to lead", lambda: c.leader_among(old), 60,
                         interval=0.2)
            elected = time.monotonic() - t0
            # the old leader still answers its consumers (only ZooKeeper is cut off)
            assert c.max_scn(old) >= 0
            time.sleep(SESSION)  # new windows from the new leader only
            # what an operator sees of it meanwhile: /admin answers from the member's
            # last view at once (it used to wait 10 s on a ZooKeeper read) and says the
            # member cannot confirm it leads
            t_admin = time.monotonic()
            answer = httpx.get(f"{c.url(old)}/admin", timeout=60)
            admin_took = time.monotonic() - t_admin
            seen_cut = answer.json()
            assert admin_took < 2.0, f"/admin took {admin_took:.1f}s"
            assert answer.status_code == 503 and seen_cut["cluster"]["leads_now"] is False
        t_heal = time.monotonic()
        c.wait("the old leader to follow", lambda: c.admin(old)["cluster"]["role"]  # type: ignore[index]
               == "follower", 60, interval=0.2)
        followed = time.monotonic() - t_heal
        time.sleep(1.0)
    settled(c, w)
    stats = check_delivery(read_windows(c.record), w.committed, w.rolled_back)
    same_windows(c)
    assert int(c.admin(new)["cluster"]["epoch"]) > epoch_before  # type: ignore[index]
    log = " ".join(c.log(old).read_text().split())
    assert "no longer leads" in log, log[-3000:]
    # it published nothing after it lost the lead: its windows stayed a prefix of the
    # new leader's, so it never had to drop its buffer
    assert "dropping the buffer" not in log, log[-3000:]
    print(f"during the cut {old}'s /admin took {admin_took:.1f}s and said: cluster"
          f" {seen_cut['cluster']}, capture {seen_cut['capture']}")
    print(f"leader {old} cut off from ZooKeeper: {new} led {elected:.1f}s after the cut"
          f" (session {SESSION:g}s); {old} followed {followed:.1f}s after the heal; {stats}")
