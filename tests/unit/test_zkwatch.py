"""A cluster member's ZooKeeper view (``databus.relay.zkwatch``) read by many status
requests at once (the operator's page polls ``/consumers`` and ``/admin`` every 2 s,
beside Prometheus and ``cluster status``): no read fails because another one is
starting the refresh. ZooKeeper's answer is replaced by a fixed one: what is tested is
the readers' hand-over, not the cluster read (tests/e2e covers that on a real server)."""

from __future__ import annotations

import sys
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from databus.relay import zkwatch
from databus.relay.zkwatch import ZkWatch


class _FixedView:
    def __init__(self, session: object, address: object, timeout: float) -> None:
        pass

    def status(self) -> dict[str, Any]:
        return {"members": [], "leader": None}


def test_concurrent_status_reads_never_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight threads reading the view 300 times each, a refresh allowed on every read
    and the interpreter switching threads as often as it can: none raises (it used to:
    a read could join the refresh thread another read had made and not yet started,
    ``cannot join thread before it is started``, a 500 on ``/consumers``)."""
    monkeypatch.setattr(zkwatch, "ClusterView", _FixedView)
    monkeypatch.setattr(zkwatch, "VIEW_EVERY", 0.0)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        watch = ZkWatch(10.0)
        nodes = SimpleNamespace(session=SimpleNamespace(connected=True), address="zk")
        watch.attach(nodes)  # type: ignore[arg-type]
        errors: list[BaseException] = []

        def reads() -> None:
            try:
                for _ in range(300):
                    watch.view()
            except BaseException as exc:  # collected, asserted below
                errors.append(exc)

        threads = [threading.Thread(target=reads) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors[:1]
        assert watch.view()["view"] == {"members": [], "leader": None}
    finally:
        sys.setswitchinterval(switch)
