"""What a cluster member does as a follower beyond copying its leader
(:class:`~databus.relay.cluster.ClusterMember`'s contract, docs/cluster.md): when it may
contend (caught up with the leader's high-water mark and reading it), how long it
waits after its capture failed as leader, when it leaves the election (cut off from a
leader ZooKeeper still lists), and when it drops its buffer (windows of an earlier
epoch's leader; a position the leader no longer holds). A mixin of
:class:`~databus.relay.cluster.ClusterMember`, which owns the state named below.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from databus.coord import MemberNodes, ZkAddress
from databus.core.errors import DatabusError, SourcePositionLostError
from databus.relay.config import ClusterConfig
from databus.relay.highwater import HighWater
from databus.relay.member import Member, idle_source
from databus.sources.chain import ChainSource

log = logging.getLogger("databus.relay.cluster")


class Following:
    """The follower's decisions (module docstring); state and roles are the member's."""

    relay: Member
    config: ClusterConfig
    address: ZkAddress
    role: str
    leader_url: str | None
    _nodes: MemberNodes | None
    _stop: threading.Event
    _leader_changed: threading.Event
    _hw: HighWater
    _roles: Any  # threading.RLock
    _failed_at: float
    _cut_since: float | None
    _synced_epoch: int
    _drops: int  # buffers dropped so far (a contender that drops its own leaves)

    @property
    def url(self) -> str:
        raise NotImplementedError  # ClusterMember's

    def _follow(self) -> None:
        raise NotImplementedError  # ClusterMember's

    def _publish_member(self) -> None:
        raise NotImplementedError  # ClusterMember's

    def _catch_up(self) -> None:
        """Follow without contending until this member holds every window consumers may
        have read (the leader's high-water mark): only then could it lead. With no
        leader for two session timeouts, contend anyway (else nobody would lead)."""
        leaderless_since: float | None = None
        while not self._stop.is_set():
            if self._leader_changed.wait(0.2):
                self._leader_changed.clear()
                self._follow()
            self._publish_member()
            self._copy_again_if_lost()
            source = self.relay.source
            told = source.cluster_hw if isinstance(source, ChainSource) else None
            reading = self.relay.capture_status()["state"] == "running"
            if told is not None and self.relay.buffer.max_scn >= told and reading:
                return  # caught up with what the leader said, and reading it
            if self.leader_url is None or told is None:
                now = time.monotonic()
                leaderless_since = leaderless_since or now
                if (self.leader_url is None and self.relay.buffer.max_scn >= self._hw.told
                        and self.relay.buffer.max_scn >= self._history()) \
                        or now - leaderless_since > 2 * self.config.session_timeout:
                    return
            else:
                leaderless_since = None

    def _history(self) -> int:
        """Where the newest epoch began (-1: no epoch, or ZooKeeper unreadable now): a
        member whose buffer ends before it lacks windows consumers may have read, so
        with no leader it lets a member that holds them take over first (after two
        session timeouts without one it contends anyway: a whole cluster restarted
        without persistent buffers must still elect someone)."""
        if self._nodes is None:
            return -1
        try:
            newest = self._nodes.newest_epoch()
        except DatabusError:
            return -1
        return newest[1] if newest is not None else -1

    def _after_failure(self) -> None:
        """Follow without contending for a while after capture failed as leader (see
        the module docstring): others lead first, and a lone member retries slowly."""
        pause = max(2 * self.config.session_timeout, self.relay.config.retry_max)
        while not self._stop.is_set():
            left = self._failed_at + pause - time.monotonic()
            if left <= 0:
                return
            if self._leader_changed.wait(min(left, 1.0)):
                self._leader_changed.clear()
                self._follow()
            self._publish_member()

    def _cut_from_leader(self) -> bool:
        """A follower whose reads of a leader that ZooKeeper still lists have failed for
        longer than two session timeouts: cut off from it while the leader lives (a dead
        leader's node is gone by then, with a session timeout to spare). Such a member leaves the election (docs/cluster.md,
        "Faults"): in it, it would hold back the leader's high-water mark, and with it
        every consumer of the cluster, for as long as the cut lasts."""
        failing = (self.role == "follower" and self.leader_url not in (None, self.url)
                   and isinstance(self.relay.source, ChainSource)
                   and self.relay.capture_status()["state"] == "retrying")
        if not failing:
            self._cut_since = None
            return False
        now = time.monotonic()
        if self._cut_since is None:
            self._cut_since = now
        return now - self._cut_since > 2 * self.config.session_timeout

    def _reset_if_diverged(self) -> None:
        """Drop the buffer when it holds windows past where the newest epoch began and
        they came from an earlier epoch's leader."""
        assert self._nodes is not None
        try:
            newest = self._nodes.newest_epoch()
        except DatabusError as exc:
            log.warning("cluster %s: %s", self.address, exc)
            return
        if newest is None or newest[0] == self._synced_epoch:
            return
        n, after = newest
        self._synced_epoch = n
        if self.relay.buffer.max_scn > after:
            log.warning("cluster %s: this relay holds windows after scn %d, where epoch %s"
                        " began: they may differ from the new leader's; dropping the buffer"
                        " and copying the leader's", self.address, after, n)
            self.relay.reset_buffer()
            self._drops += 1  # not a contender until caught up again (_catch_up)

    def _copy_again_if_lost(self) -> None:
        """A follower whose copy stopped because the leader no longer holds its position
        (the leader evicted it first: a follower paused, or one copying from the
        leader's oldest window while the leader captures a backlog) drops its buffer and
        copies the leader's again. Stopped, it would serve nothing, and in the election
        it would hold the leader's high-water mark, and every consumer of the cluster,
        at its position until their own positions were evicted (issue #35)."""
        with self._roles:
            status = self.relay.fetcher.status
            if (self.role != "follower" or not isinstance(self.relay.source, ChainSource)
                    or status["state"] != "failed"
                    or not str(status["last_error"]).startswith(
                        f"{SourcePositionLostError.code}:")):
                return
            log.warning("cluster %s: the leader no longer holds this member's position:"
                        " dropping the buffer and copying the leader's again", self.address)
            self.relay.switch_source(idle_source(self.relay.source.registry()))
            self.relay.reset_buffer()
            self._drops += 1  # not a contender until caught up again (_catch_up)
        self._follow()  # a new chain source, from the leader's oldest window
