"""A ``databus relay`` process cut off silently from its MariaDB source (every packet to
and from the server's TCP port dropped: no reset, no FIN), while the test's writer keeps
committing through the server's unix socket.

* Streaming (the cut both ways, or one way only: the relay's packets to the server
  dropped, ``to``, or the server's to the relay, ``from``): the relay notices within its deadline (the binlog stream's read timeout,
  five heartbeats), says so in ``/admin`` (capture ``retrying``, the error named), keeps
  serving what it holds, and after the heal continues from its newest window: a
  consumer ends with exactly the committed transactions, in order, each whole.
* Mid-snapshot: a chunk query that meets the cut has a deadline too (before the fix a
  SQL session waited on the dead socket without one, for as long as the kernel keeps
  retransmitting, ~15 minutes); the snapshot resumes after the heal and every row is
  read.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pymysql
import pytest
import yaml
from pymysql.constants import CLIENT

from tests.support import faults
from tests.support.mariadb import MariaDB
from tests.support.mysql_workload import SCHEMA, Workload
from tests.support.pipeline import RelayPipeline, recorder_args, relay_args
from tests.support.procs import free_port, served_lines
from tests.support.relay_cluster import writing
from tests.support.verify import check_delivery, read_windows

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("nft")]

NOTICE = 15.0  # seconds: read timeout (5 heartbeats of 1 s) plus scheduling slack
CUT = 12.0  # seconds the server stays unreachable: past the read and connect timeouts



def _writer(server: MariaDB) -> Any:
    """The workload's connection through the server's unix socket: it writes on while
    the TCP port is cut."""
    return pymysql.connect(unix_socket=str(server.socket), user="root", password="",
                           database="shop", charset="utf8mb4", autocommit=True,
                           client_flag=CLIENT.MULTI_STATEMENTS, connect_timeout=10)


def _admin(url: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/admin", timeout=10).json())


def _capture(url: str) -> dict[str, Any]:
    return dict(_admin(url)["capture"])


def _noticed(url: str, t0: float, deadline: float) -> tuple[float, str]:
    """Seconds from ``t0`` until the relay's ``/admin`` shows capture retrying, and the
    error it names; fails after ``deadline`` seconds."""
    while time.monotonic() - t0 < deadline:
        cap = _capture(url)  # the relay's own HTTP port is not cut: it answers
        if cap["state"] == "retrying" and cap["error"]:
            return time.monotonic() - t0, str(cap["error"])
        time.sleep(0.1)
    raise AssertionError(f"the relay did not notice a silent cut within {deadline:g}s: "
                         f"{_admin(url)}")


@dataclass
class Pipeline(RelayPipeline):
    """A relay on ``server`` (from flags, or from ``config``) and a recorder of it."""

    tmp: Path
    server: MariaDB
    port: int
    config: Path | None = None

    def args(self, name: str) -> list[str]:
        if name == "recorder":
            return recorder_args(self.url, self.record, self.tmp / "rec.ckpt")
        if self.config is not None:
            return relay_args(self.port, config=self.config)
        return relay_args(self.port, source=self.server.url, tables=r"shop\..*",
                          buffer_path=self.tmp / "relay.buf")


# one asymmetric cut here (the server's answers dropped), the other in test_client_cut:
# each case costs about 20 s
@pytest.mark.parametrize("direction", ["both", "from"])
def test_a_relay_cut_off_from_mariadb_notices_says_so_and_continues(
        tmp_path: Path, direction: faults.Direction) -> None:
    server = MariaDB(tmp_path / "db")
    with server, Pipeline(tmp_path, server, free_port()) as p:
        server.execute(*SCHEMA)
        p.start("relay")
        p.wait_dump(server)
        p.start("recorder")
        w = Workload(_writer(server), seed=71)
        with writing(w):
            time.sleep(1.5)
            held_before = p.max_scn()
            with faults.cut(server.port, direction):
                t0 = time.monotonic()
                noticed, error = _noticed(p.url, t0, NOTICE)
                # it keeps serving what it holds while it cannot reach its source
                assert p.max_scn() >= held_before
                time.sleep(max(0.0, CUT - (time.monotonic() - t0)))
                committed_in_cut = len(w.committed)
            t_heal = time.monotonic()
            p.wait("capture to run again after the heal",
                   lambda: _capture(p.url)["state"] == "running", 60, interval=0.2)
            resumed = time.monotonic() - t_heal
            time.sleep(1.5)
        assert committed_in_cut > 0
        total = sum(len(t) for t in w.committed)

        def delivered() -> bool:
            seen = {scn: len(ev) for scn, ev in read_windows(p.record)}
            return sum(seen.values()) >= total

        p.wait("the recorder to hold every committed change", delivered, 120, interval=0.5)
        stats = check_delivery(read_windows(p.record), w.committed, w.rolled_back)
        assert stats["repeated_windows"] == 0, stats  # the consumer was never cut
        log = p.log("relay").read_text()
        assert "retrying" in log  # the operator sees it in the log too
        print(f"noticed a silent cut ({direction}) in {noticed:.1f}s ({error}); capture ran again "
              f"{resumed:.1f}s after the heal; {stats}")


ROWS, CHUNK = 12_000, 100
SQL_TIMEOUT = 3  # source.network_timeout: the deadline of each chunk query's answer


def _snapshot_keys(url: str) -> list[int]:
    """The ``id`` of every ``r`` event the relay holds."""
    rows = (json.loads(line) for line in served_lines(url))
    return [int(row["after"]["id"]) for row in rows
            if row.get("op") == "r" and row["source"]["table"] == "t"]


def _notices(url: str) -> list[dict[str, Any]]:
    """The snapshot notices the relay holds (``databus.notifications``), in order."""
    sources = httpx.get(f"{url}/sources", timeout=10).json()
    src = next(s["id"] for s in sources if s["name"] == "databus.notifications")
    r = httpx.get(f"{url}/stream", params={"sources": str(src), "output": "json",
                                           "size": str(64 << 20), "timeout": "0"}, timeout=30)
    return [json.loads(x)["after"] for x in r.text.splitlines() if '"op"' in x]


def _snap(url: str, counter: str) -> float:
    """The relay's ``snapshot_<counter>_total`` (from ``/admin``)."""
    return float(_admin(url)["source"][f"snapshot_{counter}_total"])


def test_a_silent_cut_mid_snapshot_is_noticed_and_the_snapshot_resumes(
        tmp_path: Path) -> None:
    server = MariaDB(tmp_path / "db")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = tmp_path / "relay.yaml"
    config.write_text(yaml.safe_dump({
        "source": {"url": server.url, "tables": [r"shop\.t"], "snapshot_mode": "initial",
                   "snapshot_chunk_size": CHUNK, "network_timeout": SQL_TIMEOUT},
        "buffer": {"path": str(tmp_path / "relay.buf"), "capacity_bytes": 256 << 20},
        "http": {"port": port}}))

    with server, Pipeline(tmp_path, server, port, config) as p:
        server.execute("CREATE DATABASE shop",
                       "CREATE TABLE shop.t (id INT PRIMARY KEY, v INT, s VARCHAR(20))",
                       # one statement (MariaDB's sequence engine): one commit, one fsync
                       f"INSERT INTO shop.t SELECT seq, seq, 'old' FROM shop.seq_0_to_{ROWS - 1}")
        p.start("relay")
        p.wait("the snapshot's first chunks", lambda: _snap(url, "chunk_done") >= 5, 60)
        with faults.cut(server.port):
            t0 = time.monotonic()
            noticed, error = _noticed(url, t0, NOTICE)
            read_in_cut = _snap(url, "rows")
            time.sleep(max(0.0, CUT - (time.monotonic() - t0)))
        assert read_in_cut < ROWS, "the snapshot ended before the cut: use more rows"
        p.wait("the snapshot to complete after the heal",
               lambda: _snap(url, "completed") >= 1, 180, interval=0.5)
        kinds = [n["kind"] for n in _notices(url)]
        assert kinds.count("STARTED") == 1 and kinds[-1] == "COMPLETED", kinds
        assert "ABORTED" not in kinds, kinds  # a lost network is retried, not an abort
        keys = _snapshot_keys(url)
        assert sorted(set(keys)) == list(range(ROWS))
        # only the chunk in flight at the cut is read again
        assert len(keys) <= ROWS + CHUNK, len(keys) - ROWS
        print(f"noticed a silent cut mid-snapshot in {noticed:.1f}s ({error}); "
              f"{read_in_cut} rows read before it")
