"""A ``databus relay`` process cut off silently from its PostgreSQL source (every packet
to and from the server's TCP port dropped: no reset, no FIN), while the test's writer
keeps committing through the server's unix socket.

The replication connection sees no error of its own (nothing arrives, nothing fails):
only its deadline tells. Within ``source.network_timeout`` (TCP keepalives on the idle
stream, ``tcp_user_timeout`` on data sent) the relay says so in ``/admin`` (capture
``retrying``, the error named), keeps serving what it holds, and after the heal resumes
from its slot after its newest window: a consumer ends with exactly the committed
transactions, in order, each whole. (Before the deadlines were set, the stream waited
for as long as the kernel keeps an idle connection: hours.)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.support import faults
from tests.support.pg_pipeline import Pipeline, Writer, shop_pipeline
from tests.support.pipeline import relay_args, write_config
from tests.support.verify import check_delivery, read_windows
from tests.support.writers import Repeating

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("nft")]

TIMEOUT = 4  # the relay's source.network_timeout
NOTICE = TIMEOUT + 8.0  # seconds to say so: the deadline plus scheduling slack
CUT = NOTICE + 2.0  # seconds the server stays unreachable



@dataclass
class CutPipeline(Pipeline):
    def args(self, name: str) -> list[str]:
        if name != "relay":
            return super().args(name)
        conf = write_config(self.tmp / "relay.yaml", {
            "source": {"url": self.server.source_url(self.db), "tables": [r"public\..*"],
                       "snapshot_mode": "no_data", "slot": "databus_relay",
                       "publication": "databus_relay", "network_timeout": TIMEOUT},
            "buffer": {"path": str(self.tmp / "relay.buf"), "capacity_bytes": self.buffer},
            "http": {"port": self.port}})
        return relay_args(self.port, config=conf)


class SocketWriter(Writer):
    """:class:`Writer` through the server's unix socket: it commits on while the TCP
    port is cut."""

    def connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(f"host={self.server.root} port={self.server.port}"
                               f" user=postgres dbname={self.db}")


def _capture(p: Pipeline) -> dict[str, Any]:
    return dict(httpx.get(f"{p.url}/admin", timeout=10).json()["capture"])


def test_a_relay_cut_off_from_postgresql_notices_says_so_and_continues(tmp_path: Path) -> None:
    # a session whose client closed during the cut (its FIN dropped) lingers on the
    # server until its TCP keepalive (hours): a smart shutdown would wait for it
    with shop_pipeline(tmp_path, CutPipeline, shutdown="fast") as p:
        w = SocketWriter.recording(p.server, "shop", seed=13)
        with Repeating(w.transaction, 0.005):
            time.sleep(1.5)
            held_before = p.max_scn()
            with faults.cut(p.server.port):
                t0 = time.monotonic()
                capture = p.wait("the relay to notice the silent cut",
                                 lambda: (c := _capture(p))["state"] == "retrying"
                                 and c["error"] and c, NOTICE, interval=0.1)
                noticed = time.monotonic() - t0
                assert p.max_scn() >= held_before  # serving what it holds
                time.sleep(max(0.0, CUT - (time.monotonic() - t0)))
                in_cut = len(w.committed)
            t_heal = time.monotonic()
            p.wait("capture to run again after the heal",
                   lambda: _capture(p)["state"] == "running", 60, interval=0.2)
            resumed = time.monotonic() - t_heal
            time.sleep(1.0)
        assert len(w.committed) > in_cut > 0
        p.wait_delivered(sum(len(t) for t in w.committed), 120)
        stats = check_delivery(read_windows(p.record), w.committed, w.rolled_back)
        assert stats["repeated_windows"] == 0, stats  # the consumer was never cut
        w.con.close()
        print(f"noticed a silent cut in {noticed:.1f}s ({capture['error']}); capture"
              f" ran again {resumed:.1f}s after the heal; {stats}")
