"""A takeover by a member that dropped its buffer (issue #35): two
``databus relay --cluster`` members on a real ZooKeeper capture a SQLite shop under
a continuous writer. The follower is killed and restarted (a restarted member drops
its buffer and copies the leader's again), then the leader is killed: the follower
takes over "after scn S", and a consumer whose checkpoint is exactly S, reading at
once, is served the windows after S (never ScnNotFound): the new leader's buffer
proves continuity from its takeover SCN.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from databus.core.checkpoint import Checkpoint
from tests.support.relay_cluster import Cluster
from tests.support.shop import Writer, create_shop
from tests.support.zookeeper import ZooKeeper

LEADS = re.compile(r"member (m\d) leads \(epoch (\d+)\) after scn (-?\d+)")


@pytest.fixture
def cluster(tmp_path: Path, zookeeper: ZooKeeper) -> Iterator[tuple[Cluster, Writer]]:
    db = tmp_path / "shop.db"
    create_shop(db)
    with Writer(db, seed=35) as w, Cluster(tmp_path, db, zookeeper, "takeover") as c:
        c.start("m1")
        c.wait("m1 to lead", lambda: c.leader() == "m1", 60)
        c.start("m2")
        yield c, w


def _log(c: Cluster, member: str) -> str:
    return " ".join(c.log(member).read_text().split())  # the console log wraps lines


@pytest.mark.slow
def test_takeover_after_a_dropped_buffer_serves_the_takeover_scn(
        cluster: tuple[Cluster, Writer]) -> None:
    c, w = cluster
    done, errors = threading.Event(), []

    def write() -> None:
        try:
            while not done.is_set():
                w.transaction()
                done.wait(0.005)
        except BaseException as exc:
            errors.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        c.wait("m2 to catch up and contend", lambda: "m2" in c.contenders(), 60)
        time.sleep(1.0)
        # the follower restarts: it drops its buffer and copies the leader's again
        c.kill("m2")
        del c.procs["m2"]
        c.start("m2")
        c.wait("m2 to drop its buffer", lambda: "dropping the buffer" in _log(c, "m2"), 30)
        c.wait("m2 to catch up and contend again", lambda: "m2" in c.contenders(), 60)
        time.sleep(1.0)
        # the leader goes: the follower that dropped its buffer takes over
        c.kill("m1")
        del c.procs["m1"]
        found = c.wait("m2 to take over", lambda: LEADS.search(_log(c, "m2")), 60)
        took = int(found.group(3))
        assert took >= 0, found.group(0)
        # a consumer whose checkpoint is exactly the takeover SCN reads at once
        cp = Checkpoint.after(took).to_json()
        r = httpx.get(f"{c.url('m2')}/stream", params={"checkPoint": cp, "timeout": "5"},
                      timeout=30)
        assert r.status_code == 200, r.text
        # and is served the windows the new leader captured after it
        c.wait("windows after the takeover SCN", lambda: c.max_scn("m2") > took, 30)
        r = httpx.get(f"{c.url('m2')}/stream", params={"checkPoint": cp, "timeout": "5"},
                      timeout=30)
        assert r.status_code == 200, r.text
        assert r.content, "nothing served after the takeover SCN"
    finally:
        done.set()
        writer.join(30)
    assert not errors, errors
