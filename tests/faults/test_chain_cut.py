"""A chain relay cut off silently from the relay it reads (every packet to and from the
upstream's port dropped: no reset, no FIN) while a writer commits into the upstream's
SQLite database.

Within ``source.network_timeout`` beyond its long poll the chain relay counts the
upstream as lost, says so in ``/admin`` (capture ``retrying``, the error named) and
keeps serving what it holds; after the heal it continues after its newest window and
ends holding the upstream's windows byte for byte, and its consumer has exactly the
committed transactions. (Before the setting, the deadline was the client library's
fixed 30 s.)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import faults
from tests.support.pipeline import (
    ProcessPipeline,
    http_url,
    recorder_args,
    relay_args,
    relay_max_scn,
    write_config,
)
from tests.support.procs import free_port
from tests.support.shop import TABLES, Writer, create_shop, txlog_max
from tests.support.verify import check_delivery, read_windows
from tests.support.writers import Repeating

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("nft")]

TIMEOUT = 3  # the chain relay's source.network_timeout
NOTICE = TIMEOUT + 8.0  # seconds to say so: long poll, deadline, scheduling slack
CUT = NOTICE + 2.0



@dataclass
class Chain(ProcessPipeline):
    tmp: Path
    db: Path
    ports: dict[str, int] = field(default_factory=lambda: {"up": free_port(),
                                                           "chain": free_port()})

    def url(self, name: str) -> str:
        return http_url(self.ports[name])

    def args(self, name: str) -> list[str]:
        if name == "up":
            return relay_args(self.ports["up"], source=f"sqlite:///{self.db}",
                              tables=",".join(TABLES), buffer_path=self.tmp / "up.buf",
                              buffer_size=32 << 20)
        if name == "chain":
            conf = write_config(self.tmp / "chain.yaml", {
                "source": {"url": f"databus+{self.url('up')}", "network_timeout": TIMEOUT},
                "buffer": {"path": str(self.tmp / "chain.buf"), "capacity_bytes": 32 << 20},
                "http": {"port": self.ports["chain"]}})
            return relay_args(self.ports["chain"], config=conf)
        return recorder_args(self.url("chain"), self.tmp / "recorded.jsonl",
                             self.tmp / "rec.ckpt")

    def ready_url(self, name: str) -> str | None:
        return None if name == "recorder" else f"{self.url(name)}/admin"

    def capture(self) -> dict[str, Any]:
        return dict(httpx.get(f"{self.url('chain')}/admin", timeout=10).json()["capture"])

    def body(self, name: str) -> bytes:
        return httpx.get(f"{self.url(name)}/stream", params={"size": str(64 << 20),
                                                             "timeout": "0"}, timeout=30).content


def test_a_chain_relay_cut_off_from_its_upstream_notices_and_continues(
        tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    create_shop(db)
    with Writer(db, seed=53) as w, Chain(tmp_path, db) as c:
        for name in ("up", "chain", "recorder"):
            c.start(name)
        with Repeating(w.transaction, 0.01):
            c.wait("the chain relay to hold windows",
                   lambda: relay_max_scn(c.url("chain")) > 0, 60)
            with faults.cut(c.ports["up"]):
                t0 = time.monotonic()
                capture = c.wait("the chain relay to notice the silent cut",
                                 lambda: (cap := c.capture())["state"] == "retrying"
                                 and cap["error"] and cap, NOTICE, interval=0.1)
                noticed = time.monotonic() - t0
                assert relay_max_scn(c.url("chain")) > 0  # serving what it holds
                time.sleep(max(0.0, CUT - (time.monotonic() - t0)))
            t_heal = time.monotonic()
            c.wait("the chain relay to capture again after the heal",
                   lambda: c.capture()["state"] == "running", 60, interval=0.2)
            resumed = time.monotonic() - t_heal
            time.sleep(1.0)
        want = txlog_max(w.path)

        def caught_up() -> bool:
            top = relay_max_scn(c.url("up"))
            recorded = read_windows(tmp_path / "recorded.jsonl")
            return (top >= want and relay_max_scn(c.url("chain")) == top
                    and bool(recorded) and recorded[-1][0] == top)

        c.wait("the chain relay and its consumer to hold the last window", caught_up, 120,
               interval=0.5)
        assert c.body("chain") == c.body("up")  # byte for byte
        stats = check_delivery(read_windows(tmp_path / "recorded.jsonl"), w.committed,
                               w.rolled_back)
        assert stats["repeated_windows"] == 0, stats
        print(f"chain relay noticed a silent cut in {noticed:.1f}s ({capture['error']});"
              f" capture ran again {resumed:.1f}s after the heal; {stats}")
