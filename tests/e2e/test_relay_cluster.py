"""A relay cluster of three ``databus relay --cluster zk://...`` processes on a real
ZooKeeper, capturing a SQLite shop under a continuous multi-table writer.

* Leader kill -9 five times (each killed leader comes back as a member): a consumer
  reading the cluster address (``zk://``) ends with exactly the committed
  transactions, in order, each whole (nothing lost, nothing repeated), and every
  member serves the same windows under the same SCNs. The other clients fail over
  too: a chain relay on ``databus+zk://``, ``replicate`` on a list of the members'
  URLs (its replica ends equal to the source) and a bootstrap service whose producer
  reads ``zk://`` (its log ends at the last window).
* Fencing: a leader paused (SIGSTOP) until its ZooKeeper session expired publishes
  no window after it lost the lead; resumed, it becomes a follower whose windows
  are the new leader's.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from tests.support.mariadb import BINLOG_SETTINGS, MariaDB
from tests.support.mysql_workload import SCHEMA, Workload, connect_writer
from tests.support.procs import DATABUS
from tests.support.relay_cluster import (
    Cluster,
    same_windows,
    settled,
    wait_agreement,
    writing,
)
from tests.support.shop import (
    TABLES,
    Writer,
    as_text,
    create_shop,
    table_rows,
    target_rows,
)
from tests.support.verify import check_delivery, read_windows
from tests.support.writers import Repeating
from tests.support.zookeeper import ZooKeeper


@pytest.fixture
def cluster(tmp_path: Path, zookeeper: ZooKeeper,
            request: pytest.FixtureRequest) -> Iterator[tuple[Cluster, Writer]]:
    db = tmp_path / "shop.db"
    create_shop(db)
    name = request.node.name.replace("[", "-").replace("]", "")[:60]
    with Writer(db, seed=29) as w, Cluster(tmp_path, db, zookeeper, name) as c:
        for m in ("m1", "m2", "m3"):
            c.start(m)
        c.wait("a leader", c.leader, 60)
        c.start("recorder")
        yield c, w


@pytest.mark.slow
def test_leader_killed_five_times_under_writes(cluster: tuple[Cluster, Writer]) -> None:
    c, w = cluster
    c.start("chain")
    c.start("replicate")
    c.start("bootstrap")
    rng = random.Random(3)
    leaders = []
    with Repeating(w.transaction, 0.005):
        for _ in range(5):
            time.sleep(rng.uniform(1.0, 3.0))
            leader = c.wait("a leader", c.leader, 60)
            leaders.append(leader)
            c.kill(leader)
            del c.procs[leader]
            c.wait("a new leader", lambda old=leader: (n := c.leader()) not in (None, old)
                   and n, 60)
            c.start(leader)  # back as a member (its buffer may be dropped: it diverged)
        time.sleep(1.0)
    settled(c, w)
    stats = check_delivery(read_windows(c.record), w.committed, w.rolled_back)
    # at-least-once of the window in flight at each failover, nothing more
    assert stats["repeated_windows"] <= 5, stats
    windows = same_windows(c)
    assert len(windows) > 100_000
    # a chain relay on the cluster address followed every failover
    c.wait("the chain relay to hold the same windows", lambda: c.body("chain") == windows, 60)
    # the bootstrap service's producer on zk:// followed every failover
    top = max(c.max_scn(m) for m in c.members())
    c.wait("the bootstrap log to hold the last window", lambda: c.target_scn() == top, 60)
    # replicate on a list of member URLs failed over too: its replica equals the source
    replica = sa.create_engine(f"sqlite:///{c.tmp / 'replica.db'}")
    try:
        def replica_equal() -> bool:
            try:
                # a SQLite target keeps some columns typed (keys as integers): both
                # sides as text
                return all({as_text(r) for r in table_rows(w.path, t)}
                           == {as_text(r) for r in target_rows(replica, t)} for t in TABLES)
            except sa.exc.OperationalError:  # a table not created yet
                return False

        c.wait("the replica on a URL list to equal the source", replica_equal, 120,
               interval=1.0)
    finally:
        replica.dispose()
    epochs = json.loads(httpx.get(f"{c.url('m1')}/admin", timeout=10).content)["cluster"]
    assert epochs["view"]["epoch"] >= 6, epochs  # five failovers after the first election
    print(f"leaders killed: {leaders}; {stats}")


@pytest.mark.slow
def test_a_paused_leader_publishes_nothing_after_losing_the_lead(
        cluster: tuple[Cluster, Writer]) -> None:
    c, w = cluster
    for _ in range(50):
        w.transaction()
    settled(c, w)
    old = c.wait("a leader", c.leader, 60)
    # roles and positions, as ZooKeeper shows them, from the command line
    out = subprocess.run([*DATABUS, "cluster", "status", c.address, "--json"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    status = json.loads(out)
    assert status["leader"]["id"] == old and status["epoch"] >= 1
    assert sorted(m["id"] for m in status["members"]) == ["m1", "m2", "m3"]
    assert {m["role"] for m in status["members"]} == {"leader", "follower"}
    text = subprocess.run([*DATABUS, "cluster", "status", c.address], capture_output=True,
                          text=True, timeout=60, check=True).stdout
    assert f"leader {old}" in text and text.count("max_scn") == 3, text
    epoch_before = int(c.admin(old)["cluster"]["epoch"])  # type: ignore[index]
    proc = c.procs[old]
    proc.send_signal(signal.SIGSTOP)
    try:
        for _ in range(30):  # committed while the leader sleeps
            w.transaction()
        c.wait("another leader", lambda: (n := c.leader_among(old)) and n, 60)
    finally:
        proc.send_signal(signal.SIGCONT)
    for _ in range(30):
        w.transaction()
    settled(c, w)
    admin = c.admin(old)
    assert admin["cluster"]["role"] == "follower", admin  # type: ignore[index]
    log = " ".join(c.log(old).read_text().split())  # the console log wraps long lines
    assert "no longer leads" in log
    # it woke with the changes committed while it slept already read, and refused them
    assert "this relay no longer leads its cluster" in log, log[-3000:]
    # every member held the same windows when it paused, so the new epoch began after
    # its newest window: had it published anything after, its windows would have
    # diverged and it would have dropped its buffer on becoming a follower
    assert "dropping the buffer" not in log, log[-3000:]
    check_delivery(read_windows(c.record), w.committed, w.rolled_back)
    same_windows(c)
    assert int(c.admin(c.leader() or old)["cluster"]["epoch"]) > epoch_before  # type: ignore[index]


@pytest.mark.slow
def test_a_zookeeper_outage_of_ten_seconds(tmp_path: Path) -> None:
    """ZooKeeper paused for 10 s under writes: members keep serving what they hold, no
    member leads on stale information (the leader publishes nothing it cannot confirm),
    and everything resumes when ZooKeeper returns: exact delivery, identical members."""
    db = tmp_path / "shop.db"
    create_shop(db)
    with ZooKeeper() as zk, Writer(db, seed=37) as w, \
            Cluster(tmp_path, db, zk, "outage") as c:
        for m in ("m1", "m2", "m3"):
            c.start(m)
        c.wait("a leader", c.leader, 60)
        c.start("recorder")
        for _ in range(50):
            w.transaction()
        settled(c, w)
        served_before = {m: c.body(m) for m in c.members()}
        zk.pause()
        try:
            t0 = time.monotonic()
            while time.monotonic() - t0 < 10:
                w.transaction()  # committed while nobody can confirm a leader
                for m in c.members():  # every member answers from its buffer
                    assert c.body(m).startswith(served_before[m][:1000])
                time.sleep(0.05)
        finally:
            zk.resume()
        for _ in range(50):
            w.transaction()
        settled(c, w)
        check_delivery(read_windows(c.record), w.committed, w.rolled_back)
        same_windows(c)
        assert c.leader() is not None


@pytest.mark.slow
def test_a_mariadb_cluster_fails_over_twice_through_ddl(tmp_path: Path,
                                                       zookeeper: ZooKeeper) -> None:
    """Three members capturing one MariaDB (SCN = binlog position): the leader killed
    -9 twice under the workload with its DDL; the new leader continues the binlog after
    its newest window and the schema versions the old leader published. A recorder on
    ``zk://`` ends with exactly the committed transactions."""
    server = MariaDB(tmp_path / "db", settings={**BINLOG_SETTINGS,
                                                  "innodb-flush-log-at-trx-commit": "2"})
    with server:
        server.execute(*SCHEMA)
        source = {"url": server.url, "tables": [r"shop\..*"], "snapshot_mode": "no_data"}
        with Cluster(tmp_path, tmp_path / "unused.db", zookeeper, "mariadb",
                     source=source) as c:
            for m in ("m1", "m2", "m3"):
                c.start(m)
            c.wait("a leader", c.leader, 60)
            c.wait_dump(server)
            c.start("recorder")
            w = Workload(connect_writer(server.port), seed=61)
            with writing(w):
                for _ in range(2):
                    time.sleep(2.0)
                    leader = c.wait("a leader", c.leader, 60)
                    c.kill(leader)
                    del c.procs[leader]
                    c.wait("a new leader", lambda old=leader: (n := c.leader()) not in
                           (None, old) and n, 60)
                    c.start(leader)
                time.sleep(2.0)
            wait_agreement(c, [c.record])
            check_delivery(read_windows(c.record), w.committed, w.rolled_back)
