"""A MariaDB primary replaced by a promoted replica under a relay.

A second MariaDB replicates the first by GTID (``tests.support.mariadb``:
:func:`start_replication`). The relay captures the primary; it is stopped, the primary
is stopped, the replica promoted, and the relay started again on the replica (a config
change; the same relay name, buffer and state).

A binlog position (the relay's SCN) is a file and offset of one server's binlog: the
relay resumes at it on another server only when that server's binlog there is at the
same point of the history, checked by GTID (``BINLOG_GTID_POS`` must hold the GTID the
relay recorded there: ``databus.sources.mysql.positions``); otherwise capture stops
with ``SourcePositionLost`` naming the GTID a new relay starts after. Three cases:

* ``new-server-id``: no replica, the primary restarted with another ``server_id`` (its
  origin changes, its binlog does not): capture continues exactly;
* ``aligned``: the replica's binlog has the same transactions at the same offsets (it
  logged them from the same start, same event sizes): capture continues exactly, and
  a consumer ends with every transaction committed on both servers, once each;
* ``rotated``: the replica's binlog is at other files (it rotated before replicating):
  ``SourcePositionLost`` with the GTID, nothing read from the replica;
* ``behind``: the replica misses the primary's last transactions (the GTID the relay
  needs is not there): ``SourcePositionLost``, never papered over.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.mariadb import (
    MariaDB,
    promote,
    replica_settings,
    start_replication,
    wait_replicated,
)
from tests.support.mysql_workload import SCHEMA, Workload, connect_writer
from tests.support.pipeline import (
    ProcessPipeline,
    http_url,
    recorder_args,
    relay_args,
    relay_max_scn,
    write_config,
)
from tests.support.procs import free_port, stop
from tests.support.verify import check_delivery, read_windows

pytestmark = pytest.mark.slow


class Relay(ProcessPipeline):
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.port = free_port()
        self.server: MariaDB | None = None

    @property
    def url(self) -> str:
        return http_url(self.port)

    def args(self, name: str) -> list[str]:
        assert self.server is not None
        conf = write_config(self.tmp / "relay.yaml", {
            "name": "failover",  # the same relay (buffer, state) whatever server it reads
            "source": {"url": self.server.url, "tables": [r"shop\..*"],
                       "snapshot_mode": "no_data"},
            "buffer": {"path": str(self.tmp / "relay.buf"), "capacity_bytes": 16 << 20},
            "http": {"port": self.port}})
        if name == "recorder":
            return recorder_args(self.url, self.record, self.tmp / "rec.ckpt")
        return relay_args(self.port, config=conf)

    def ready_url(self, name: str) -> str | None:
        return None if name == "recorder" else f"{self.url}/health/live"

    @property
    def record(self) -> Path:
        return self.tmp / "recorded.jsonl"

    def admin(self) -> dict[str, Any]:
        return dict(httpx.get(f"{self.url}/admin", timeout=10).json())


def _master_scn(m: MariaDB) -> int:
    with m.connect() as con, con.cursor() as cur:
        cur.execute("SHOW MASTER STATUS")
        file, pos = cur.fetchone()[:2]  # type: ignore[index]
        return (int(file.rsplit(".", 1)[1]) << 32) | int(pos)


@pytest.mark.parametrize("case", ["new-server-id", "aligned", "rotated", "behind"])
def test_a_relay_moved_to_a_promoted_replica_continues_by_gtid_or_stops(
        tmp_path: Path, case: str) -> None:
    primary = MariaDB(tmp_path / "primary")
    replica = MariaDB(tmp_path / "replica", settings=replica_settings(2))
    with primary, replica, Relay(tmp_path) as r:
        if case == "rotated":
            replica.execute("FLUSH BINARY LOGS")
        primary.execute(*SCHEMA)
        start_replication(replica, primary)
        wait_replicated(replica, primary)
        r.server = primary
        r.start("relay")
        r.wait_dump(primary)
        r.start("recorder")
        w = Workload(connect_writer(primary.port), seed=83, rollback_ratio=0.0)
        for _ in range(30):
            w.transaction()
        if case == "behind":  # the replica misses the primary's last transactions
            replica.execute("STOP SLAVE")
            for _ in range(5):
                w.transaction()
        else:
            wait_replicated(replica, primary)
        w.con.close()
        top = _master_scn(primary)
        r.wait("the relay to hold the primary's last transaction",
               lambda: relay_max_scn(r.url) == top, 60, interval=0.2)
        needed = primary.gtid_pos()
        stop(r.procs.pop("relay"))
        primary.stop()
        if case == "new-server-id":  # the same server and binlog, another identity
            primary.settings["server-id"] = "5"
            primary.start()
            target = primary
        else:
            promote(replica)
            target = replica
        r.server = target
        r.start("relay")
        if case in ("new-server-id", "aligned"):  # the same history at the same positions
            w.con = connect_writer(target.port)
            for _ in range(30):
                w.transaction()
            w.con.close()
            end = _master_scn(target)
            r.wait("the consumer to hold the replica's last transaction",
                   lambda: bool(windows := read_windows(r.record))
                   and windows[-1][0] == end, 60, interval=0.2)
            stats = check_delivery(read_windows(r.record), w.committed, w.rolled_back)
            assert stats["repeated_windows"] == 0, stats
            assert r.admin()["fetcher"]["state"] == "running"
            log = " ".join(r.log("relay").read_text().split())
            assert "its binlog there has GTID" in log, log[-2000:]  # checked, not assumed
            print(f"{case}: continued after GTID {needed}: {stats}")
            return
        admin = r.wait("the relay to stop capture on the promoted replica",
                       lambda: (a := r.admin())["fetcher"]["state"] == "failed" and a, 60,
                       interval=0.2)
        error = admin["fetcher"]["last_error"]
        assert error.startswith("SourcePositionLost: "), error
        assert f"start_gtid: '{needed}'" in error, error  # where a new relay starts after
        assert relay_max_scn(r.url) == top  # nothing from the replica was stored
        health = httpx.get(f"{r.url}/health/ready", timeout=10)
        assert health.status_code == 503
        print(error)
