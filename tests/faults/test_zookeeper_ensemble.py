"""A relay cluster on a three-node ZooKeeper ensemble (``tests.support.zookeeper``'s
:class:`Ensemble`, from the pinned jars) while a workload with DDL commits into MariaDB.

1. **One ZooKeeper member killed** (-9, the ensemble's own leader: its quorum elects
   another): the members' sessions move to a live server within the session timeout;
   nobody changes role, the epoch stays, the consumer keeps receiving windows.
2. **A majority lost** (two members killed) for a few session timeouts: within the
   session timeout (plus a second of sampling) every member says ZooKeeper is
   unreachable (``/health/ready`` 503 with the ``cluster`` check, ``/admin``
   ``degraded`` 503 with ``leads_now: false``), and ``/admin`` answers at once from the
   member's last view (it used to wait 10 s on a ZooKeeper read). Nobody publishes: the
   leader's newest window stays where it was.
3. **The majority returns**: a leader again (the same one when its session survived),
   the consumer continues, and it ends with exactly the transactions MariaDB committed,
   each whole, in order; both members serve the same windows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support.mariadb import BINLOG_SETTINGS, MariaDB
from tests.support.mysql_workload import SCHEMA, Workload, connect_writer
from tests.support.pipeline import recorder_args
from tests.support.relay_cluster import SESSION, Cluster, wait_agreement, writing
from tests.support.verify import check_delivery, read_windows
from tests.support.zookeeper import Ensemble

pytestmark = pytest.mark.slow

NOTICE = SESSION + 1.0 + 4.0  # session timeout, sampling (1 s), scheduling slack
OUTAGE = NOTICE + SESSION


@dataclass
class ListCluster(Cluster):
    """:class:`Cluster` whose recorder reads the two members by URL (a consumer that
    needs no ZooKeeper itself)."""

    def args(self, name: str) -> list[str]:
        if name == "recorder":
            return recorder_args(f"{self.url('m1')},{self.url('m2')}", self.record,
                                 self.tmp / "rec.ckpt")
        return super().args(name)

    def ready(self, member: str) -> httpx.Response:
        return httpx.get(f"{self.url(member)}/health/ready", timeout=10)


def _windows(c: Cluster) -> int:
    return len(read_windows(c.record))


def test_a_cluster_rides_out_one_zookeeper_member_down_then_a_lost_majority(
        tmp_path: Path) -> None:
    server = MariaDB(tmp_path / "db", settings={**BINLOG_SETTINGS,
                                                  "innodb-flush-log-at-trx-commit": "2"})
    with Ensemble(3) as zk, server:
        server.execute(*SCHEMA)
        source = {"url": server.url, "tables": [r"shop\..*"], "snapshot_mode": "no_data"}
        with ListCluster(tmp_path, tmp_path / "unused.db", zk, "ensemble",  # type: ignore[arg-type]
                         source=source) as c:
            c.start("m1")
            c.wait("m1 to lead", lambda: c.leader() == "m1", 60)
            c.wait_dump(server)
            c.start("m2")
            c.wait("m2 to follow", lambda: c.ready("m2").status_code == 200, 60,
                   interval=0.2)
            c.start("recorder")
            w = Workload(connect_writer(server.port), seed=71)
            with writing(w):
                c.wait("the consumer to receive windows", lambda: _windows(c) > 20, 60)
                epoch = int(c.admin("m1")["cluster"]["epoch"])  # type: ignore[index]

                # 1. one member down (the ensemble's leader: its quorum re-elects)
                gone = zk.leader()
                gone.kill()
                before = _windows(c)
                time.sleep(2 * SESSION)
                assert c.leader() == "m1"
                assert int(c.admin("m1")["cluster"]["epoch"]) == epoch  # type: ignore[index]
                assert c.ready("m1").status_code == 200, c.ready("m1").text
                assert c.ready("m2").status_code == 200, c.ready("m2").text
                one_down = _windows(c) - before
                assert one_down > 0, "the consumer received nothing with one member down"
                gone.start()

                # 2. a majority lost
                lost = zk.servers[:2]
                for s in lost:
                    s.kill()
                t0 = time.monotonic()
                c.wait("every member to say ZooKeeper is unreachable",
                       lambda: all(c.ready(m).status_code == 503 for m in ("m1", "m2")),
                       NOTICE, interval=0.2)
                noticed = time.monotonic() - t0
                t_admin = time.monotonic()
                admin = httpx.get(f"{c.url('m1')}/admin", timeout=30)
                admin_took = time.monotonic() - t_admin
                assert admin.status_code == 503 and admin.json()["status"] == "degraded"
                seen = admin.json()["cluster"]
                assert seen["leads_now"] is False and seen["zookeeper"]["connected"] is False
                assert admin_took < 2.0, f"/admin took {admin_took:.1f}s"
                checks = {ch["name"]: ch for ch in c.ready("m1").json()["checks"]}
                assert not checks["cluster"]["ok"], checks
                held = c.max_scn("m1")
                time.sleep(max(0.0, OUTAGE - (time.monotonic() - t0)))
                assert c.max_scn("m1") == held, "the leader published without ZooKeeper"

                # 3. the majority returns
                for s in lost:
                    s.launch()
                for s in lost:
                    s.wait_serving(90)
                t_heal = time.monotonic()
                leader = c.wait("a leader again", lambda: (n := c.leader()) is not None
                                and c.ready(n).status_code == 200 and n, 60, interval=0.2)
                led = time.monotonic() - t_heal
                before = _windows(c)
                c.wait("the consumer to continue", lambda: _windows(c) > before, 60)
                time.sleep(1.0)
            wait_agreement(c, [c.record])
            stats = check_delivery(read_windows(c.record), w.committed, w.rolled_back)
    print(f"one ZooKeeper member of three down: no role change, the consumer got {one_down}"
          f" windows meanwhile; a majority lost: noticed in {noticed:.1f}s (session"
          f" {SESSION:g}s), /admin answered in {admin_took:.2f}s; after the majority"
          f" returned {leader} led within {led:.1f}s; {stats}")
