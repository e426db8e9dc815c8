"""A relay cluster with two leaders (``cluster.leaders: 2``): four
``databus relay --cluster`` processes on a real ZooKeeper, two of them capturing the
same SQLite shop at once (the elected leader and a co-leader), under a continuous
multi-table writer.

Two consumers read different capturers: a recorder on ``zk://`` (the leader first)
and one on a list of member URLs with the co-leader first. The leader and the
co-leader are killed -9 in turn; each time the other capturer keeps serving, a
follower takes the free role, and the consumer of the killed one moves to another
member. Both recorders end with exactly the committed transactions, in order, each
whole, and every member serves the same windows byte for byte: the two captures cut
the txlog at the same places (the database's shared cuts).
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support.mariadb import BINLOG_SETTINGS, MariaDB
from tests.support.mysql_workload import SCHEMA, Workload, connect_writer
from tests.support.pipeline import recorder_args
from tests.support.procs import DATABUS
from tests.support.relay_cluster import (
    Cluster,
    same_windows,
    settled,
    wait_agreement,
    writing,
)
from tests.support.shop import Change, Writer, create_shop
from tests.support.verify import check_delivery, read_windows
from tests.support.writers import Repeating
from tests.support.zookeeper import ZooKeeper

MEMBERS = ("m1", "m2", "m3", "m4")


@dataclass
class TwoLeaders(Cluster):
    leaders: int = 2

    def args(self, name: str) -> list[str]:
        if name == "recorder2":  # reads the co-leader first, then the others
            order = self.order or list(MEMBERS)
            urls = ",".join(self.url(m) for m in order)
            return recorder_args(urls, self.record2, self.tmp / "rec2.ckpt")
        return super().args(name)

    order: list[str] | None = None

    def ready_url(self, name: str) -> str | None:
        return None if name == "recorder2" else super().ready_url(name)

    @property
    def record2(self) -> Path:
        return self.tmp / "recorded2.jsonl"

    def members(self) -> list[str]:
        return [n for n in super().members() if n != "recorder2"]

    def roles(self) -> dict[str, str]:
        out = {}
        for m in self.members():
            try:
                out[m] = str(self.admin(m)["cluster"]["role"])  # type: ignore[index]
            except httpx.HTTPError:
                continue
        return out

    def with_role(self, role: str, but: str | None = None) -> str | None:
        return next((m for m, r in self.roles().items() if r == role and m != but), None)


@pytest.fixture
def two_leaders(tmp_path: Path, zookeeper: ZooKeeper) -> Iterator[tuple[TwoLeaders, Writer]]:
    db = tmp_path / "shop.db"
    create_shop(db)
    with Writer(db, seed=43) as w, TwoLeaders(tmp_path, db, zookeeper, "coleaders") as c:
        for m in MEMBERS:
            c.start(m)
        c.wait("a leader", lambda: c.with_role("leader"), 60)
        for _ in range(20):  # the co-leader waits to hold what the leader held
            w.transaction()
        coleader = c.wait("a co-leader", lambda: c.with_role("coleader"), 60)
        c.order = [coleader] + [m for m in MEMBERS if m != coleader]
        c.start("recorder")
        c.start("recorder2")
        yield c, w


@pytest.mark.slow
def test_two_leaders_killed_in_turn_under_writes(
        two_leaders: tuple[TwoLeaders, Writer]) -> None:
    c, w = two_leaders
    rng = random.Random(5)
    killed: list[tuple[str, str]] = []
    with Repeating(w.transaction, 0.005):
        for i in range(6):
            time.sleep(rng.uniform(1.0, 3.0))
            role = ("leader", "coleader")[i % 2]
            victim = c.wait(f"a {role}", lambda r=role: c.with_role(r), 60)
            other = "coleader" if role == "leader" else "leader"
            survivor = c.with_role(other)
            killed.append((role, victim))
            c.kill(victim)
            del c.procs[victim]
            if survivor is not None:  # the other capturer goes on capturing meanwhile
                before = c.max_scn(survivor)
                c.wait("the other capturer to go on", lambda s=survivor, b=before:
                       c.max_scn(s) > b, 30)
            c.wait(f"a new {role}", lambda r=role, v=victim: c.with_role(r, but=v), 60)
            c.start(victim)  # back as a member
        time.sleep(1.0)
    settled(c, w, [c.record, c.record2])
    for record in (c.record, c.record2):
        stats = check_delivery(read_windows(record), w.committed, w.rolled_back)
        # at-least-once of the window in flight when a consumer's member died
        assert stats["repeated_windows"] <= 6, stats
    windows = same_windows(c)
    assert len(windows) > 50_000
    roles = c.roles()
    assert sorted(roles.values()) == ["coleader", "follower", "follower", "leader"], roles
    # the co-leaders captured for themselves (they did not copy): each says where it began
    coled = [m for m in MEMBERS if "co-leads after scn" in " ".join(c.log(m).read_text().split())]
    assert len(coled) >= 2, coled
    print(f"killed: {killed}")


@pytest.mark.slow
def test_a_paused_coleader_publishes_nothing_after_losing_its_lease(
        two_leaders: tuple[TwoLeaders, Writer]) -> None:
    """The co-leader paused (SIGSTOP) until its ZooKeeper session expired: a follower
    takes the free lease; the old co-leader, resumed, refuses the windows it read while
    it slept and follows the leader again; every member ends with the same windows."""
    c, w = two_leaders
    old = c.wait("a co-leader", lambda: c.with_role("coleader"), 60)

    def status_roles() -> list[str]:
        status = json.loads(subprocess.run(
            [*DATABUS, "cluster", "status", c.address, "--json"], capture_output=True,
            text=True, timeout=60, check=True).stdout)
        return sorted(m["role"] for m in status["members"])

    # the members publish their roles one by one: the status may lag the co-leader
    c.wait("`databus cluster status` to list the four roles",
           lambda: status_roles() == ["coleader", "follower", "follower", "leader"], 60,
           interval=0.5)
    proc = c.procs[old]
    proc.send_signal(signal.SIGSTOP)
    try:
        for _ in range(30):  # committed while the co-leader sleeps
            w.transaction()
        c.wait("another co-leader", lambda: c.with_role("coleader", but=old), 60)
    finally:
        proc.send_signal(signal.SIGCONT)
    for _ in range(30):
        w.transaction()
    settled(c, w, [c.record, c.record2])
    c.wait("the old co-leader to follow", lambda: c.roles().get(old) == "follower", 30)
    log = " ".join(c.log(old).read_text().split())  # the console log wraps long lines
    assert "this relay no longer leads its cluster" in log, log[-3000:]
    for record in (c.record, c.record2):
        check_delivery(read_windows(record), w.committed, w.rolled_back)
    same_windows(c)


def _without_snapshot_rows(windows: list[tuple[int, list[Change]]]
                           ) -> list[tuple[int, list[Change]]]:
    """The windows' source changes: incremental-snapshot rows (``r``) and its
    notifications left out, and windows left empty by that."""
    out = []
    for scn, events in windows:
        kept = [e for e in events if e[1] != "r" and e[0] != "notifications"]
        if kept:
            out.append((scn, kept))
    return out


@pytest.mark.slow
def test_two_leaders_on_mariadb_through_ddl_and_an_incremental_snapshot(
        tmp_path: Path, zookeeper: ZooKeeper) -> None:
    """Four members, two capturing one MariaDB (SCN = binlog position) under the
    workload with its DDL. An incremental snapshot is signalled mid-run: its chunks
    depend on when they are read, so only the leader takes them; the co-leader stops
    at the signal, copies the chunk windows from the leader as a follower, and takes
    its lease again when the snapshot is over. The leader and then the co-leader are
    killed -9. Every member ends with the same windows; both recorders receive exactly
    the committed transactions (besides the snapshot's rows)."""
    server = MariaDB(tmp_path / "db", settings={**BINLOG_SETTINGS,
                                                  "innodb-flush-log-at-trx-commit": "2"})
    with server:
        server.execute(*SCHEMA, "CREATE DATABASE databus",
                       "CREATE TABLE databus.signals (id VARCHAR(64) PRIMARY KEY,"
                       " type VARCHAR(32) NOT NULL, data TEXT)")
        source = {"url": server.url, "tables": [r"shop\..*"], "snapshot_mode": "no_data",
                  "snapshot_chunk_size": 50}
        with TwoLeaders(tmp_path, tmp_path / "unused.db", zookeeper, "mariadb2",
                        source=source) as c:
            for m in MEMBERS:
                c.start(m)
            c.wait("a leader", lambda: c.with_role("leader"), 60)
            c.wait_dump(server)
            w = Workload(connect_writer(server.port), seed=67)
            for _ in range(20):
                w.transaction()
            coleader = c.wait("a co-leader", lambda: c.with_role("coleader"), 60)
            c.order = [coleader] + [m for m in MEMBERS if m != coleader]
            c.start("recorder")
            c.start("recorder2")
            with writing(w):
                time.sleep(2.0)
                with server.connect() as con, con.cursor() as cur:
                    cur.execute("INSERT INTO databus.signals VALUES (%s, %s, %s)",
                                ("snap1", "execute-snapshot",
                                 json.dumps({"data-collections": [r"shop\.accounts"]})))
                c.wait("the co-leader to stop at the snapshot and co-lead again", lambda:
                       any("the leader runs a snapshot" in " ".join(c.log(m).read_text()
                                                                     .split())
                           for m in MEMBERS) and c.with_role("coleader"), 90)
                for role in ("leader", "coleader"):
                    time.sleep(2.0)
                    victim = c.wait(f"a {role}", lambda r=role: c.with_role(r), 60)
                    c.kill(victim)
                    del c.procs[victim]
                    c.wait(f"a new {role}", lambda r=role, v=victim: c.with_role(r, but=v),
                           60)
                    c.start(victim)
                time.sleep(2.0)
            wait_agreement(c, [c.record, c.record2])
            for record in (c.record, c.record2):
                windows = read_windows(record)
                assert any(e[1] == "r" for _, events in windows for e in events)
                check_delivery(_without_snapshot_rows(windows), w.committed, w.rolled_back)
