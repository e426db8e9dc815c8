"""A takeover by a member that dropped its buffer (issue #35): two
``databus relay --cluster`` members on a real ZooKeeper capture a SQLite shop under
a continuous writer. The follower is killed and restarted (a restarted member drops
its buffer and copies the leader's again), then the leader is killed: the follower
takes over "after scn S", and a consumer whose checkpoint is exactly S, reading at
once, is served the windows after S (never ScnNotFound): the new leader's buffer
proves continuity from its takeover SCN.

The soak's failure itself: a follower that fell off the leader's buffer (paused while
the leader evicted its position; in the soak, a restarted member copying from the
leader's oldest window while the leader caught up with a backlog) copies the
leader's buffer again instead of stopping for good in the election, where it held the
leader's high-water mark until the leader's consumers fell off its buffer too.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from databus.core.checkpoint import Checkpoint
from tests.support.relay_cluster import Cluster
from tests.support.shop import Writer, create_shop
from tests.support.writers import Repeating
from tests.support.zookeeper import ZooKeeper

LEADS = re.compile(r"member (m\d) leads \(epoch (\d+)\) after scn (-?\d+)")


@contextmanager
def _two_members(tmp_path: Path, zookeeper: ZooKeeper, kind: type[Cluster], name: str,
                 seed: int) -> Iterator[tuple[Cluster, Writer]]:
    """A SQLite shop and its writer (``seed``; not writing yet), and a cluster ``name``
    of ``kind`` whose m1 leads and whose m2 has started."""
    db = tmp_path / "shop.db"
    create_shop(db)
    with Writer(db, seed=seed) as w, kind(tmp_path, db, zookeeper, name) as c:
        c.start("m1")
        c.wait("m1 to lead", lambda: c.leader() == "m1", 60)
        c.start("m2")
        yield c, w


@pytest.fixture
def cluster(tmp_path: Path, zookeeper: ZooKeeper) -> Iterator[tuple[Cluster, Writer]]:
    with _two_members(tmp_path, zookeeper, Cluster, "takeover", seed=35) as (c, w):
        yield c, w


def _log(c: Cluster, member: str) -> str:
    return " ".join(c.log(member).read_text().split())  # the console log wraps lines


@pytest.mark.slow
def test_takeover_after_a_dropped_buffer_serves_the_takeover_scn(
        cluster: tuple[Cluster, Writer]) -> None:
    c, w = cluster
    with Repeating(w.transaction, 0.005):
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


class SmallCluster(Cluster):
    """Members whose buffers hold 256 KiB (a few seconds of the writer)
    and whose ZooKeeper sessions last 10 s (a follower paused for less stays in the election)."""

    def configure(self, member: str, config: dict[str, Any]) -> None:
        config["buffer"]["capacity_bytes"] = 256 << 10
        config["cluster"]["session_timeout"] = 10.0


def _served(c: Cluster, member: str, after: int) -> bool:
    """Whether a consumer reading ``member`` is served a window after ``after``."""
    r = httpx.get(f"{c.url(member)}/stream", timeout=30,
                  params={"checkPoint": Checkpoint.after(after).to_json(), "timeout": "1"})
    assert r.status_code == 200, r.text
    return bool(r.content)


@pytest.mark.slow
def test_a_follower_that_fell_off_the_leaders_buffer_copies_again(
        tmp_path: Path, zookeeper: ZooKeeper) -> None:
    """The soak's failure (issue #35): a follower whose position the leader evicted
    (its copy ran behind the leader's eviction) got ScnNotFound from the leader and
    stopped for good while staying in the election, so the leader's high-water mark
    stayed at its position: consumers were served nothing and fell off the leader's
    buffer. Such a follower drops its buffer and copies the leader's again."""
    with _two_members(tmp_path, zookeeper, SmallCluster, "fell-off", seed=36) as (c, w), \
            Repeating(w.transaction, 0.002):
        c.wait("m2 to catch up and contend", lambda: "m2" in c.contenders(), 60)
        time.sleep(1.0)
        c.procs["m2"].send_signal(signal.SIGSTOP)  # shorter than its session
        try:
            # m2 holds at most what m1 holds now (it copies m1's windows)
            gone = Checkpoint.after(c.max_scn("m1")).to_json()
            c.wait("m1 to evict m2's position", lambda: httpx.get(
                f"{c.url('m1')}/stream", params={"checkPoint": gone, "timeout": "0"},
                timeout=10).status_code == 410, 8.0, interval=0.05)
        finally:
            c.procs["m2"].send_signal(signal.SIGCONT)
        time.sleep(2.0)
        top = c.max_scn("m1")
        # the leader's consumers are served past where m2 fell off
        c.wait("m1's consumers to be served new windows",
               lambda: _served(c, "m1", top), 30, interval=0.5)
        assert "copying the leader's again" in _log(c, "m2")
        # and m2 holds the leader's windows again
        c.wait("m2 to copy the leader's windows", lambda: c.max_scn("m2") >= top, 30)
