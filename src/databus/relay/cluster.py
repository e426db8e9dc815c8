"""A relay as a member of a relay cluster: one leader captures from the database, the
other members chain from the leader; when the leader goes, a follower takes over.

``databus relay --cluster zk://HOST:PORT/NAME --source ...`` (or ``cluster:`` in the
config file). Coordination is ZooKeeper's, through kazoo's election recipe; the
node layout is in :mod:`databus.coord.cluster`, which does every ZooKeeper read and
write. What consumers may read (the high-water mark) is :mod:`databus.relay.highwater`;
what a member needs of its relay, and its source between roles, :mod:`databus.relay.member`.

**Roles.** Every member registers an ephemeral node and joins the election. The
elected member bumps the cluster's ``epoch`` (compare-and-set), records where its
epoch starts (``epochs/<n>``: the SCN of the last window it holds), writes the
``leader`` node and switches its relay's source to the database: capture continues
right after the last window it holds, so a window has the same SCN on every
member. Everyone else is a follower: its source is a chain source reading the
leader's ``/stream`` (:mod:`databus.sources.chain`); when the ``leader`` node
changes, it re-points. A follower contends only once it holds the leader's
high-water mark; one that cannot read a leader ZooKeeper still lists for two session
timeouts leaves the election (:meth:`ClusterMember._cut_from_leader`) until it can.

**Fencing.** A leader publishes a batch of windows only after the session is
connected and the ``epoch`` node, read in that session, still holds its own epoch
(:class:`~databus.relay.fetcher.Fetcher`'s guard). A leader whose session is
suspended waits; one whose session was lost or whose epoch was replaced publishes
nothing more (fetcher state ``fenced``) and becomes a follower. A member (old leader
or follower) that holds windows past the point where the newest epoch starts (it
copied or captured windows the new leader never had) drops its buffer and copies the
new leader's: its windows could otherwise differ from the cluster's.
So does a follower the leader answers ``ScnNotFound`` (it fell off the leader's
buffer): stopped, it would hold the leader's high-water mark at its position. A member
that drops its buffer while contending leaves the election (elected in between, it steps
back) until it holds the leader's mark again (:mod:`databus.relay.following`).

**Capture failures.** A leader whose capture stopped on a terminal error (fetcher
state ``failed``) does not stay leader while capturing nothing: it deletes its
``leader`` node, leaves the election (another member is elected and captures after
its own newest window) and follows; it stands for election again only after
``max(2 * session_timeout, retry_max)`` seconds, so a lone member retries at that
pace. Every member's node in ZooKeeper carries its capture state (``capture``:
state, what it reads, the error), shown by ``/admin`` and ``databus cluster status``.
A member whose capture stopped (leader or follower) answers consumers' reads 503
``RelayUnavailable`` (:meth:`ClusterMember.check_serving`), so clients move to
another member instead of waiting on one that will serve nothing new.

**Trimming.** A leader lets its source trim only what every live member holds
(the smallest ``max_scn`` members report), so a follower that takes over finds
what it still needs in the source.

**Co-leaders** (``leaders: k`` > 1). Up to k-1 followers that hold every window the
leader held when it last reported no snapshot running take a lease (kazoo's
Semaphore on ``coleaders``) and capture from the database too, right after their
newest window. Every capturer cuts the same windows (MySQL: one binlog transaction
each; SQLite: the database's shared cuts, ``window_cuts: shared``), so a co-leader
serves all it captured and needs no high-water mark; it leaves the election while
it co-leads. It runs no snapshot (snapshots depend on when rows are read): its
source is ``no_data`` and ``capture_only``, and when that source meets another
capturer's snapshot signal the member follows the leader again until the snapshot
is over. Fencing: it publishes only while its session is connected and its lease
node, read in that session, exists.

Limits (docs/cluster.md): positions are SCNs, so a new leader must read the same
database the old one did (the same SQLite file, the same MySQL/MariaDB server), and
capture resumes by SCN; with k leaders, snapshots are the leader's alone.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from databus.coord import ClusterView, Election, Lease, MemberNodes, Session, connect
from databus.core.errors import (
    CoordinatorUnavailableError,
    DatabusError,
    RelayUnavailableError,
)
from databus.core.schema import SchemaRegistry
from databus.relay.config import ClusterConfig
from databus.relay.following import Following
from databus.relay.highwater import HighWater
from databus.relay.identity import default_member_id
from databus.relay.member import Member, idle_source, is_idle
from databus.relay.zkwatch import ZkWatch
from databus.sources.base import Source
from databus.sources.chain import ChainSource
from databus.sources.config import ChainSourceConfig

log = logging.getLogger("databus.relay.cluster")


class ClusterMember(Following):
    """Runs a relay's role in its cluster on a thread (see the module docstring)."""

    def __init__(self, relay: Member, config: ClusterConfig) -> None:
        self.relay = relay
        self.config = config
        self.address = config.zk_address()
        self.path = self.address.path
        self.member_id = config.member_id or default_member_id()
        self.role = "starting"
        self.epoch = 0  # the epoch this member leads in (0: not leading)
        self._synced_epoch = 0  # the epoch whose leader this member's windows come from
        self.leader_url: str | None = None
        self._session: Session | None = None
        self._nodes: MemberNodes | None = None
        self._stop = threading.Event()
        self._lost = threading.Event()  # the session was lost while leading
        self._leader_changed = threading.Event()
        self._hw = HighWater(relay)
        self._contenders_stale = threading.Event()  # the election changed: read it again
        self._zk = ZkWatch(config.session_timeout)  # reachable? and /admin's view
        self._roles = threading.RLock()  # one role change at a time (election vs watch)
        self._lease: Lease | None = None  # a co-leader's
        self._failed_at = float("-inf")  # when capture as leader last failed (monotonic)
        self._cut_since: float | None = None  # a follower failing to read its leader since
        self._drops = 0  # buffers dropped (following.py); compared while contending
        self._drops_contending = 0  # the count when this member joined the election
        self._thread = threading.Thread(target=self._run, name="databus-cluster", daemon=True)

    # -- life cycle ------------------------------------------------------------------

    @property
    def url(self) -> str:
        return self.config.advertise_url or self.relay.url

    def start(self) -> None:
        session = connect(self.address, session_timeout=self.config.session_timeout)
        self._session = session
        self._nodes = nodes = MemberNodes(session, self.address, self.member_id)
        self._zk.attach(nodes)
        try:
            session.listen(on_lost=self._on_lost, on_connected=self._on_connected)
            nodes.ensure()
            self._register()
            session.watch_data(f"{self.path}/leader", self._on_leader)
            session.watch_children(f"{self.path}/election", self._on_election)
        except BaseException:
            session.close()
            raise
        self._thread.start()
        log.info("cluster %s: member %s joined at %s", self.address, self.member_id, self.url)

    def stop(self) -> None:
        self._stop.set()
        self._leader_changed.set()
        if self._thread.is_alive():
            self._thread.join(15)
        if self._session is not None:
            self._session.close()

    def status(self) -> dict[str, Any]:
        """For ``/admin``: this member, and the cluster as ZooKeeper shows it."""
        out: dict[str, Any] = {"address": str(self.address), "member": self.member_id,
                               "role": self.role, "epoch": self.epoch,
                               "leader_url": self.leader_url}
        out["leads_now"] = self.role == "leader" and not self._zk.unreachable()
        out.update(self._zk.view())  # never waits on ZooKeeper (the last view, its age)
        return out

    def coordinator_problem(self) -> str | None:
        """Why this member cannot act on its role now (ZooKeeper unreachable longer than
        the session timeout: :mod:`databus.relay.zkwatch`), or None."""
        down = self._zk.down_for()
        if down <= self.config.session_timeout:
            return None
        what = ("it publishes nothing" if self.role == "leader"
                else "its leader cannot publish")
        return (f"ZooKeeper unreachable for {down:.1f} s (session timeout"
                f" {self.config.session_timeout:g} s): {what} until it is back")

    # -- ZooKeeper callbacks (kazoo's threads) -----------------------------------------

    def _on_lost(self) -> None:
        self._lost.set()
        self._leader_changed.set()

    def _on_connected(self) -> None:
        # a new session after a lost one: the ephemeral member node is gone
        threading.Thread(target=self._register_quietly, daemon=True).start()

    def _on_leader(self, data: bytes | None) -> None:
        try:
            leader = json.loads(data) if data else None
        except ValueError:
            leader = None
        url = leader.get("url") if isinstance(leader, dict) else None
        if url != self.leader_url:
            self.leader_url = url
            self._leader_changed.set()

    def _on_election(self, _children: list[str]) -> None:
        self._contenders_stale.set()  # read by the member thread: no blocking call here

    def _refresh_contenders(self) -> None:
        nodes = self._nodes
        if nodes is None or not self._contenders_stale.is_set():
            return
        self._contenders_stale.clear()
        try:
            ids = set(nodes.contenders())
        except DatabusError as exc:
            log.warning("cluster %s: %s", self.address, exc)
            self._contenders_stale.set()
            return
        ids.discard(self.member_id)
        if self._hw.contenders(ids):
            self.relay.wake()  # one gone can raise what consumers may read

    # -- what consumers may read (the high-water mark) -----------------------------------

    def follower_at(self, member: str, held: int) -> bool:
        """A member's read says it holds every window up to ``held``; True when that
        raised the high-water mark (:mod:`databus.relay.highwater`)."""
        return self._hw.follower_at(self.role, member, held)

    def serve_limit(self) -> int:
        """The newest window consumers may read (:mod:`databus.relay.highwater`)."""
        return self._hw.limit(self.role)

    def check_serving(self) -> None:
        """Refuse a consumer's read while this member's capture stopped on a terminal
        error (as a leader before it gave up, or as a follower that can no longer copy):
        it would answer nothing new for ever, and a client only moves to another member
        on an error. :class:`RelayUnavailableError` (503) makes it move."""
        status = self.relay.fetcher.status
        if status["state"] == "failed":
            raise RelayUnavailableError(
                f"cluster member {self.member_id} does not capture ({status['last_error']}):"
                f" read another member of {self.address}")

    # -- the member node ------------------------------------------------------------

    def _member_record(self) -> dict[str, Any]:
        # read before max_scn: "no snapshot running" then covers every window up to it
        snapshot = bool(self.relay.source.stats().get("snapshot_running", 0.0))
        return {"id": self.member_id, "url": self.url, "role": self.role,
                "epoch": self.epoch, "max_scn": self.relay.buffer.max_scn,
                "snapshot_running": snapshot, "name": self.relay.capturer.name,
                "capture": self.relay.capture_status(), "updated": time.time()}

    def _register(self) -> None:
        assert self._nodes is not None
        self._nodes.register(self._member_record())

    def _register_quietly(self) -> None:
        try:
            self._register()
        except DatabusError as exc:
            log.warning("cluster %s: re-registering failed: %s", self.address, exc)

    def _publish_member(self) -> None:
        nodes = self._nodes
        if self._zk.warn_once():
            log.warning("cluster %s: member %s (%s): %s", self.address, self.member_id,
                        self.role, self.coordinator_problem())
        if nodes is None or not nodes.session.connected:
            return
        try:
            if not nodes.publish(self._member_record()):
                self._register_quietly()  # a new session: the node went with the old one
        # broad: a heartbeat from the member's thread; besides ZooKeeper's errors the
        # record asks the source for its stats, and nothing here may end the thread (the
        # next beat retries)
        except Exception as exc:
            log.debug("member heartbeat failed: %s", exc)

    # -- roles -------------------------------------------------------------------------

    def _run(self) -> None:
        nodes = self._nodes
        assert nodes is not None
        while not self._stop.is_set():
            self._follow()
            if self._stop.is_set():
                break
            self._catch_up()
            self._after_failure()
            if self._stop.is_set():
                break
            lease = self._colead_lease()
            if lease is not None:
                self._colead(lease)
                continue
            election = nodes.election()
            self._drops_contending = self._drops
            worker = threading.Thread(target=self._contend, args=(election,), daemon=True)
            worker.start()
            # follow the leader until elected (then _contend runs _lead) or stopped, or
            # until a co-leader's lease could be had
            while worker.is_alive() and not self._stop.is_set():
                if self._leader_changed.wait(1.0):
                    self._leader_changed.clear()
                    if self.role == "follower":
                        self._follow()
                self._publish_member()
                self._copy_again_if_lost()
                if self.role == "follower" and self._colead_ready():
                    break
                if self._drops != self._drops_contending:
                    log.warning("cluster %s: this member dropped its buffer: leaving the"
                                " election until it holds the leader's mark again",
                                self.address)
                    break
                if self._cut_from_leader():
                    log.warning(
                        "cluster %s: the leader at %s has not answered this member for %.0f"
                        " s while it still leads: leaving the election, so the leader's"
                        " high-water mark no longer waits for this member; joining again"
                        " once caught up", self.address, self.leader_url,
                        time.monotonic() - (self._cut_since or time.monotonic()))
                    break
            election.cancel()
            # elected meanwhile: _lead runs until leadership ends (it never is cut short)
            while worker.is_alive() and not self._stop.is_set():
                worker.join(0.5)
            worker.join(10)

    def _contend(self, election: Election) -> None:
        try:
            election.run(self._lead)
        # broad: the top of the contending thread; whatever ends the contention (a
        # lost session, a leader node never freed, a failure while leading) is logged
        # and the member's thread makes it join again
        except Exception as exc:
            log.info("cluster %s: left the election (%s); joining again", self.address, exc)
            self._stop.wait(1.0)

    def _follow(self) -> None:
        """Be a follower of the current leader (none yet: wait for one)."""
        with self._roles:
            if self.role == "leader":
                return
            url = self.leader_url
            if url == self.url:
                url = None  # our own old leader node, until its session ends
            self.role = "follower"
            self.epoch = 0
            self._reset_if_diverged()
            source = self.relay.source
            current = source.url if isinstance(source, ChainSource) else None
            if url is None:
                if current is None and not is_idle(source):
                    self.relay.switch_source(idle_source(self.relay.source.registry()))
                return  # else: keep retrying the old leader until a new one shows
            upstream = url.rstrip("/")
            if current == upstream:
                return
            log.info("cluster %s: following the leader at %s", self.address, upstream)
            # a leader that stops answering silently counts as lost within the
            # cluster's own deadline, not a chain relay's default 30 s
            chain = ChainSource(ChainSourceConfig(url=f"databus+{upstream}",
                                                  network_timeout=self.config.follower_timeout(),
                                                  **self.config.credential_fields()),
                                name=self.relay.capturer.name, member_id=self.member_id)
            self.relay.switch_source(chain)
        self._publish_member()

    def _lead(self) -> None:
        """Called by the election when this member leads; returns when it no longer does."""
        nodes = self._nodes
        assert nodes is not None
        if self._drops != self._drops_contending:
            # elected between dropping its buffer and leaving the election: it holds less
            # than consumers may have read, so it steps back (the next contender leads)
            log.warning("cluster %s: elected right after dropping its buffer: not leading",
                        self.address)
            return
        self._lost.clear()
        with self._roles:
            self.role = "leader"
            published = self.relay.source.registry()  # the versions copied from the old leader
            # copying from the old leader stops first: the epoch starts after what we hold
            self.relay.switch_source(idle_source(self.relay.source.registry()))
            try:
                epoch = nodes.new_epoch(self.relay.buffer.max_scn)
                self.epoch = self._synced_epoch = epoch
                source = self._capture_source(published)
                self.relay.switch_source(source, guard=self._may_publish,
                                         ack_limit=self._ack_limit)
            except DatabusError as exc:
                log.error("cluster %s: cannot capture as leader: %s", self.address, exc)
                self.role = "follower"
                self.epoch = 0
                self._stop.wait(2.0)
                return
        log.info("cluster %s: member %s leads (epoch %d) after scn %d", self.address,
                 self.member_id, epoch, self.relay.buffer.max_scn)
        nodes.write_leader(self.url, epoch, wait=self.config.session_timeout * 2)
        self._publish_member()
        self._contenders_stale.set()
        failed: str | None = None

        def ended() -> bool:
            nonlocal failed
            self._refresh_contenders()
            fetcher = self.relay.fetcher.status
            if fetcher["state"] == "failed":  # terminal: another member may capture
                failed = str(fetcher["last_error"])
            return fetcher["state"] in ("fenced", "failed")

        self._capture_while(ended, beat=0.0)  # the next beat says "running" soon
        if failed is not None:
            log.error("cluster %s: member %s gives up leading (epoch %d): its capture"
                      " stopped (%s); another member takes over", self.address,
                      self.member_id, epoch, failed)
            self._failed_at = time.monotonic()
        else:
            log.warning("cluster %s: member %s no longer leads (epoch %d)", self.address,
                        self.member_id, epoch)
        with self._roles:
            self._hw.told = self.serve_limit()  # what consumers have been served stays
            self.role = "follower"
            self.epoch = 0
            self.relay.switch_source(idle_source(self.relay.source.registry()))  # capture stops: someone else leads
        if failed is not None:
            try:  # the next leader need not wait for this member's session to end
                nodes.drop_leader(epoch)
            except (DatabusError, ValueError) as exc:
                log.info("cluster %s: leader node not deleted: %s", self.address, exc)
            self._publish_member()

    def _capture_while(self, ended: Callable[[], bool], *, beat: float) -> None:
        """While this member captures (as leader or co-leader): its record rewritten
        once a second (the last time at ``beat``), until the session is lost, the member
        stops or ``ended()``."""
        while not self._stop.is_set() and not self._lost.is_set() and not ended():
            self._lost.wait(0.1)
            if time.monotonic() - beat >= 1.0:
                self._publish_member()
                beat = time.monotonic()

    def _capture_source(self, published: SchemaRegistry, *, coleader: bool = False) -> Source:
        """The database source this member captures with as (co-)leader, opened, with
        the schema versions already published. With leaders > 1 every capturer cuts
        windows the same way (SQLite: the database's shared cuts); a co-leader's starts
        no snapshot (``no_data``: a lost position is an error, never a snapshot)."""
        config = self.relay.config.source
        update: dict[str, Any] = {}
        if self.config.leaders > 1:
            update["window_cuts"] = "shared"
        if coleader:
            update["snapshot_mode"] = "no_data"
        if update:
            config = config.model_copy(update=update)
        source = self.relay.open_source(config)
        try:
            if coleader:
                source.capture_only()
            source.open()  # idempotent: switch_source opens it again
            source.adopt_schemas(published)
        except BaseException:  # not handed on: closed here, and the error goes on
            source.close()
            raise
        return source

    # -- co-leaders (leaders > 1) ---------------------------------------------------------

    def _colead_ready(self) -> bool:
        """Whether this follower may capture beside the leader: leaders > 1, a free
        co-leader lease, and it holds every window the leader held when the leader last
        said no snapshot of its was running (so no snapshot window is missing here)."""
        nodes = self._nodes
        if self.config.leaders < 2 or nodes is None or self.leader_url in (None, self.url):
            return False
        try:
            view = ClusterView(nodes.session, self.address, timeout=2.0)
            leader = view.leader()
            if leader is None:
                return False
            record = next((m for m in view.members() if m.get("id") == leader.get("id")), None)
            held = nodes.coleaders()
        except DatabusError as exc:
            log.debug("cluster %s: %s", self.address, exc)
            return False
        if record is None or record.get("snapshot_running", True) or held >= self.config.leaders - 1:
            return False
        leader_scn = int(record.get("max_scn", -1))
        return leader_scn >= 0 and self.relay.buffer.max_scn >= leader_scn

    def _colead_lease(self) -> Lease | None:
        """A co-leader's lease, or None when none may be had now."""
        nodes = self._nodes
        if nodes is None or not self._colead_ready():
            return None
        try:
            return nodes.coleader_lease(self.config.leaders - 1)
        except DatabusError as exc:
            log.info("cluster %s: %s", self.address, exc)
        return None

    def _colead(self, lease: Lease) -> None:
        """Capture beside the leader while the lease is held, then follow again."""
        self._lease = lease
        source: Source | None = None
        with self._roles:
            self.role = "coleader"
            published = self.relay.source.registry()
            self.relay.switch_source(idle_source(self.relay.source.registry()))
            try:
                source = self._capture_source(published, coleader=True)
                self.relay.switch_source(source, guard=self._may_colead,
                                         ack_limit=self._ack_limit)
            except DatabusError as exc:
                log.error("cluster %s: cannot capture as co-leader: %s", self.address, exc)
                source = None
        if source is not None:
            log.info("cluster %s: member %s co-leads after scn %d", self.address,
                     self.member_id, self.relay.buffer.max_scn)
            self._publish_member()
            self._capture_while(self._colead_ended(source), beat=time.monotonic())
        with self._roles:
            self._hw.told = self.relay.buffer.max_scn
            self.role = "follower"
            self.relay.switch_source(idle_source(self.relay.source.registry()))
        self._lost.clear()
        try:
            lease.release()
        except DatabusError as exc:  # ephemeral: it goes with the session anyway
            log.info("cluster %s: %s", self.address, exc)
        if source is None:
            self._stop.wait(2.0)

    def _colead_ended(self, source: Source) -> Callable[[], bool]:
        """When a co-leader stops capturing: its capture stopped, the leader runs a
        snapshot, or no leader was left for two session timeouts."""
        leaderless_since: float | None = None

        def ended() -> bool:
            nonlocal leaderless_since
            if self.relay.fetcher.status["state"] in ("fenced", "failed"):
                return True
            if source.stats().get("snapshot_elsewhere"):
                log.info("cluster %s: the leader runs a snapshot; member %s follows"
                         " it again", self.address, self.member_id)
                return True
            now = time.monotonic()
            leaderless_since = (leaderless_since or now) if self.leader_url is None else None
            if leaderless_since is not None \
                    and now - leaderless_since > 2 * self.config.session_timeout:
                # nobody else is left to be elected: step down and stand for leader
                log.info("cluster %s: no leader; co-leader %s stands for election",
                         self.address, self.member_id)
                return True
            return False

        return ended

    # -- fencing and trimming (the fetcher's thread) ------------------------------------

    def _may_publish(self) -> bool:
        """Whether this member still leads: its session is connected and the ``epoch``
        node, read in that session, holds its epoch. While the connection is down but
        the session may live, it waits: nothing is published that ZooKeeper has not
        confirmed."""
        nodes, epoch = self._nodes, self.epoch
        return nodes is not None and epoch != 0 and nodes.holds_epoch(
            epoch, still=lambda: self.epoch == epoch and self._capturing())

    def _may_colead(self) -> bool:
        """A co-leader's fencing: its session is connected and its lease node, read in
        that session, still exists (it went with an expired session)."""
        nodes, lease = self._nodes, self._lease
        return nodes is not None and lease is not None and nodes.holds_lease(
            lease, still=lambda: self.role == "coleader" and self._capturing())

    def _capturing(self) -> bool:
        return not self._stop.is_set() and not self._lost.is_set()

    def _ack_limit(self) -> int:
        nodes = self._nodes
        if nodes is None:
            raise CoordinatorUnavailableError("no ZooKeeper session")
        members = nodes.members()
        scns = [int(m.get("max_scn", -1)) for m in members if m.get("id") != self.member_id]
        return min(scns, default=self.relay.buffer.max_scn)
