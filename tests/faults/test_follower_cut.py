"""A relay cluster's follower cut off silently from its leader (the follower alone: the
leader still reaches ZooKeeper and its own consumers).

Two ``databus relay --cluster`` members capture a SQLite shop under a writer. Each
advertises its URL through a forwarder of its own (``tests.support.netcut``), so the
follower reads its leader through the leader's forwarder, and the packets of that path
alone can be dropped (``tests.support.faults``: no reset, no FIN). The follower's
deadline on its leader is ``cluster.upstream_timeout``, by default the session timeout
(it used to be a chain relay's 30 s): within it the follower counts the leader as lost,
says so (``/admin`` capture ``retrying`` with the error, ``/health/ready`` 503), keeps
serving what it holds. Two session timeouts later, the leader still listed in
ZooKeeper, it leaves the election (docs/cluster.md), so the leader's high-water mark
stops waiting for it and the leader's own consumers get new windows again while the cut
lasts. After the heal it copies again after its newest window and joins the election
once caught up. Its consumer (reading the follower by URL) ends with exactly the
committed transactions; both members serve the same windows, byte for byte. Nobody
changes role.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import faults
from tests.support.netcut import Cuttable
from tests.support.pipeline import recorder_args
from tests.support.procs import free_port
from tests.support.relay_cluster import SESSION, Cluster, same_windows, settled
from tests.support.shop import Writer, create_shop
from tests.support.verify import check_delivery, read_windows
from tests.support.writers import Repeating
from tests.support.zookeeper import ZooKeeper

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("nft")]

MEMBERS = ("m1", "m2")
NOTICE = SESSION + 0.5 + 6.0  # the deadline (default: the session timeout), long poll, slack
LEAVE = NOTICE + 2 * SESSION + 4.0  # then out of the election (slack for the watch)
CUT = LEAVE + 3.0



@dataclass
class AdvertisedCluster(Cluster):
    """:class:`Cluster` whose members advertise their URL through a forwarder each; the
    recorder reads ``m2`` (the follower) by its own URL."""

    links: dict[str, Cuttable] = field(default_factory=dict)

    def args(self, name: str) -> list[str]:
        if name == "recorder":
            return recorder_args(self.url("m2"), self.record, self.tmp / "rec.ckpt")
        return super().args(name)

    def configure(self, member: str, config: dict[str, Any]) -> None:
        if member in self.links:
            config["cluster"]["advertise_url"] = f"http://127.0.0.1:{self.links[member].port}"

    def served(self, member: str) -> int:
        """The newest window ``member`` serves a consumer now (its high-water mark)."""
        r = httpx.get(f"{self.url(member)}/stream", params={"size": str(64 << 20),
                                                           "timeout": "0"}, timeout=30)
        return int(r.headers["x-databus-last-window-scn"])

    def ready(self, member: str) -> httpx.Response:
        return httpx.get(f"{self.url(member)}/health/ready", timeout=10)


@pytest.fixture
def cluster(tmp_path: Path, zookeeper: ZooKeeper) -> Iterator[tuple[AdvertisedCluster, Writer]]:
    db = tmp_path / "shop.db"
    create_shop(db)
    ports = {m: free_port() for m in MEMBERS}
    with ExitStack() as stack:
        links = {m: stack.enter_context(Cuttable(ports[m])) for m in MEMBERS}
        w = stack.enter_context(Writer(db, seed=61))
        c = stack.enter_context(AdvertisedCluster(tmp_path, db, zookeeper, "followercut",
                                                  ports=dict(ports), links=links))
        c.start("m1")
        c.wait("m1 to lead", lambda: c.leader() == "m1", 60)
        c.start("m2")
        c.wait("m2 to follow", lambda: c.admin("m2")["cluster"]["role"]  # type: ignore[index]
               == "follower" and c.ready("m2").status_code == 200, 60, interval=0.2)
        c.start("recorder")
        yield c, w


def test_a_follower_cut_off_from_its_leader_notices_within_its_deadline_and_resumes(
        cluster: tuple[AdvertisedCluster, Writer]) -> None:
    c, w = cluster
    with Repeating(w.transaction, 0.01):
        c.wait("the follower to hold windows", lambda: c.max_scn("m2") > 0, 60)
        with faults.cut(c.links["m1"].port):
            t0 = time.monotonic()
            capture = c.wait("the follower to notice the silent cut",
                             lambda: (cap := c.admin("m2")["capture"])["state"]  # type: ignore[index]
                             == "retrying" and cap["error"] and cap, NOTICE, interval=0.1)
            noticed = time.monotonic() - t0
            ready = c.ready("m2")
            assert ready.status_code == 503, ready.text
            held = c.max_scn("m2")
            assert held > 0  # it serves what it holds
            leader_before, served_before = c.max_scn("m1"), c.served("m1")
            # out of the election: the leader serves its consumers again, without it
            c.wait("the cut follower to leave the election",
                   lambda: "m2" not in c.contenders(), LEAVE, interval=0.2)
            left = time.monotonic() - t0
            served_at_leave = c.served("m1")
            time.sleep(max(0.0, CUT - (time.monotonic() - t0)))
            # nobody changed role: the leader still reaches ZooKeeper and captures
            assert c.admin("m1")["cluster"]["role"] == "leader"  # type: ignore[index]
            assert c.admin("m2")["cluster"]["role"] == "follower"  # type: ignore[index]
            assert c.max_scn("m1") > leader_before
            # what the leader's own consumers get meanwhile: windows every member in the
            # election holds (docs/cluster.md); the cut follower is no longer in it
            served_during = c.served("m1") - served_before
            assert c.served("m1") > served_at_leave, "the leader's consumers got nothing new"
        t_heal = time.monotonic()
        c.wait("the follower to copy again after the heal",
               lambda: c.admin("m2")["capture"]["state"] == "running"  # type: ignore[index]
               and c.ready("m2").status_code == 200, 60, interval=0.2)
        resumed = time.monotonic() - t_heal
        c.wait("the follower to join the election again once caught up",
               lambda: "m2" in c.contenders(), 60, interval=0.2)
        time.sleep(1.0)
    settled(c, w)  # the follower and its consumer hold the last window
    same_windows(c)  # the follower's windows are the leader's, byte for byte
    stats = check_delivery(read_windows(c.record), w.committed, w.rolled_back)
    assert stats["repeated_windows"] == 0, stats
    print(f"follower cut off from its leader noticed it in {noticed:.1f}s"
          f" (session {SESSION:g}s; {capture['error']}); held scn {held} during the cut;"
          f" left the election {left:.1f}s after the cut;"
          f" copied again {resumed:.1f}s after the heal; the leader's own consumers got"
          f" {served_during} more windows during the cut; {stats}")


def test_the_followers_deadline_is_the_setting_or_the_session_timeout() -> None:
    from pydantic import ValidationError

    from databus.relay.config import ClusterConfig

    address = "zk://127.0.0.1:2181/shop"
    assert ClusterConfig(address=address, session_timeout=6).follower_timeout() == 6
    assert ClusterConfig(address=address, upstream_timeout=2.5).follower_timeout() == 2.5
    with pytest.raises(ValidationError, match="upstream_timeout"):
        ClusterConfig(address=address, upstream_timeout=0.1)
