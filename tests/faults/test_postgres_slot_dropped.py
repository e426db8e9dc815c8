"""A PostgreSQL relay's replication slot dropped by an operator, while the relay runs
(its walsender terminated first, as the server requires) and again while it is down.

Never papered over: the relay stops capture with ``SourcePositionLost`` naming the slot
and the recovery (in ``/admin``, degraded, and in its log), creates no new slot (which
would start after a gap), keeps serving what it holds, and a consumer has exactly the
transactions committed before the drop; the transactions committed after it are never
served as if they continued the old stream.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.pg_pipeline import Pipeline, Writer, shop_pipeline
from tests.support.postgres import PostgreSQL
from tests.support.verify import check_delivery, read_windows

pytestmark = pytest.mark.slow

SLOT = "databus_relay"


def _admin(p: Pipeline) -> tuple[int, dict[str, Any]]:
    r = httpx.get(f"{p.url}/admin", timeout=10)
    return r.status_code, dict(r.json())


def _drop_slot(server: PostgreSQL) -> None:
    """What an operator does: end the walsender that holds the slot, then drop it (again,
    if the relay reconnected in between)."""
    def dropped() -> bool:
        server.execute("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots"
                       f" WHERE slot_name = '{SLOT}' AND active_pid IS NOT NULL")
        try:
            server.execute(f"SELECT pg_drop_replication_slot('{SLOT}')")
        except Exception as exc:  # active again: the relay reconnected first
            if "is active" not in str(exc):
                raise
            return False
        return True

    deadline = time.monotonic() + 30
    while not dropped():
        assert time.monotonic() < deadline, "the slot could not be dropped in 30 s"
        time.sleep(0.05)


def _slots(server: PostgreSQL) -> int:
    return int(server.scalar("SELECT count(*) FROM pg_replication_slots"))


def _stopped_on_lost_slot(p: Pipeline) -> dict[str, Any]:
    status, admin = _admin(p)
    capture = admin["capture"]
    if capture["state"] != "failed":
        return {}
    assert status == 503 and admin["status"] == "degraded", admin
    return dict(capture)


def _check_message(error: str) -> None:
    assert error.startswith("SourcePositionLost:"), error
    assert f"replication slot {SLOT} is gone" in error, error
    assert "bootstrap" in error and "move" in error, error  # the recovery, named


def test_a_dropped_slot_stops_capture_loudly_and_is_never_papered_over(
        tmp_path: Path) -> None:
    with shop_pipeline(tmp_path) as p:
        server = p.server
        w = Writer.recording(server, "shop", seed=7)
        for _ in range(150):
            w.transaction()
        p.wait_delivered(sum(len(t) for t in w.committed), 60)
        held = p.max_scn()

        # dropped while the relay runs
        _drop_slot(server)
        capture = p.wait("the relay to stop on the lost slot",
                         lambda: _stopped_on_lost_slot(p), 30, interval=0.2)
        _check_message(str(capture["error"]))
        before_drop = list(w.committed)
        for _ in range(30):  # committed after the drop: never served
            w.transaction()
        time.sleep(2.0)
        assert p.max_scn() == held
        assert _slots(server) == 0, "a new slot would continue after a gap"
        stats = check_delivery(read_windows(p.record), before_drop, w.rolled_back)
        assert f"replication slot {SLOT} is gone" in p.log("relay").read_text()

        # and found gone by a restart (dropped while the relay was down)
        p.kill("relay")
        p.start("relay")
        capture = p.wait("the restarted relay to refuse the lost slot",
                         lambda: _stopped_on_lost_slot(p), 30, interval=0.2)
        _check_message(str(capture["error"]))
        assert p.max_scn() == held  # it serves what it holds, nothing new
        assert _slots(server) == 0
        w.con.close()
        print(f"slot dropped: capture stopped with {capture['error']!r}; {stats}")
