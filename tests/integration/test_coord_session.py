"""databus.coord.session on a real ZooKeeper: the one translator of kazoo's errors.

Outcomes a caller decides on come back as values (no node, a node that exists, a
version that moved); whatever cannot reach ZooKeeper is CoordinatorUnavailableError,
never a kazoo type; the fencing read answers only what the live session confirmed.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest

from databus.coord import ClusterView, MemberNodes, Session, ZkAddress, connect
from databus.core.errors import ConfigError, CoordinatorUnavailableError
from tests.support.procs import free_port
from tests.support.zookeeper import ZooKeeper


@pytest.fixture
def session(zookeeper: ZooKeeper) -> Iterator[Session]:
    s = connect(ZkAddress(zookeeper.hosts, "t"))
    yield s
    s.close()


def _base() -> str:
    return f"/databus/test/{uuid.uuid4().hex}"


def test_outcomes_a_caller_decides_on_are_values(session: Session) -> None:
    base = _base()
    node = f"{base}/n"
    assert session.get(node) is None and session.children(base) is None
    assert not session.exists(node)
    session.ensure(base)
    assert session.create(node, b"one") is True
    assert session.create(node, b"two") is False  # exists: not an error
    data, version = session.get(node)  # type: ignore[misc]
    assert data == b"one" and session.exists(node)
    assert session.set(node, b"two", version=version) is True
    assert session.set(node, b"three", version=version) is False  # the version moved
    assert session.get(node) == (b"two", version + 1)
    assert session.set(f"{base}/gone", b"x") is False
    assert session.delete(node, version=version) is False
    assert session.delete(node, version=version + 1) is True
    assert session.delete(node) is False
    assert session.children(base) == []


def test_increment_gives_every_caller_its_own_value(zookeeper: ZooKeeper) -> None:
    counter = f"{_base()}/epoch"
    sessions = [connect(ZkAddress(zookeeper.hosts, "t")) for _ in range(3)]
    got: list[int] = []
    lock = threading.Lock()

    def bump(s: Session) -> None:
        for _ in range(20):
            value = s.increment(counter)
            with lock:
                got.append(value)

    try:
        threads = [threading.Thread(target=bump, args=(s,)) for s in sessions for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        for s in sessions:
            s.close()
    assert sorted(got) == list(range(1, 121))


def test_no_zookeeper_is_a_coordinator_unavailable_error() -> None:
    with pytest.raises(CoordinatorUnavailableError, match="connecting to"):
        connect(ZkAddress(f"127.0.0.1:{free_port()}", "t"), connect_timeout=1.0)


def test_a_read_that_times_out_is_a_coordinator_unavailable_error() -> None:
    with ZooKeeper() as zk:
        s = connect(ZkAddress(zk.hosts, "t"))
        try:
            zk.pause()
            try:
                with pytest.raises(CoordinatorUnavailableError, match="reading"):
                    s.get("/databus", timeout=0.5)
                with pytest.raises(CoordinatorUnavailableError):
                    ClusterView(s, ZkAddress(zk.hosts, "t"), timeout=0.5).members()
            finally:
                zk.resume()
        finally:
            s.close()


def test_confirm_answers_only_what_the_live_session_holds(zookeeper: ZooKeeper) -> None:
    address = ZkAddress(zookeeper.hosts, f"c{uuid.uuid4().hex[:8]}")
    s = connect(address)
    nodes = MemberNodes(s, address, "m1")
    nodes.ensure()
    epoch = nodes.new_epoch(after_scn=41)
    assert nodes.newest_epoch() == (epoch, 41)
    assert nodes.holds_epoch(epoch, still=lambda: True)
    assert not nodes.holds_epoch(epoch + 1, still=lambda: True)
    assert not nodes.holds_epoch(epoch, still=lambda: False)  # given up: nothing confirmed
    s.close()
    assert not nodes.holds_epoch(epoch, still=lambda: True)  # no session: never True


def test_leases_are_counted_and_their_number_must_agree(zookeeper: ZooKeeper) -> None:
    address = ZkAddress(zookeeper.hosts, f"l{uuid.uuid4().hex[:8]}")
    a, b = connect(address), connect(address)
    try:
        na, nb = MemberNodes(a, address, "a"), MemberNodes(b, address, "b")
        na.ensure()
        lease = na.coleader_lease(1)
        assert lease is not None and na.holds_lease(lease, still=lambda: True)
        assert nb.coleader_lease(1) is None  # the one lease is held
        lease.release()
        assert not na.holds_lease(lease, still=lambda: True)
        assert nb.coleaders() == 0
        fresh = f"{_base()}/leases"  # kazoo records the number where it creates the node
        one = a.lease(fresh, "a", 1)
        assert one is not None
        with pytest.raises(ConfigError, match="same number"):
            b.lease(fresh, "b", 2)
        one.release()
    finally:
        a.close()
        b.close()


def test_a_leader_node_is_dropped_only_by_its_own_leader(zookeeper: ZooKeeper) -> None:
    address = ZkAddress(zookeeper.hosts, f"d{uuid.uuid4().hex[:8]}")
    s = connect(address)
    try:
        mine, other = MemberNodes(s, address, "m1"), MemberNodes(s, address, "m2")
        mine.ensure()
        mine.write_leader("http://m1", 3, wait=1.0)
        with pytest.raises(CoordinatorUnavailableError, match="still held"):
            other.write_leader("http://m2", 4, wait=0.3)
        assert not other.drop_leader(3) and not mine.drop_leader(2)
        assert mine.leader() == {"id": "m1", "url": "http://m1", "epoch": 3}
        assert mine.drop_leader(3)
        assert mine.leader() is None
    finally:
        s.close()
