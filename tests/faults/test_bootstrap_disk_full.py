"""The file system of a bootstrap service's SQLite store fills up while its producer
copies a relay's windows (a size-limited tmpfs, filled to its last byte).

A writer commits into a SQLite shop captured by a ``databus relay``; a ``databus
bootstrap`` service (no initial load: the relay holds the whole history) stores the
log and the snapshot on the small disk. Once it is full, the producer's transaction
fails whole (SQLite rolls it back: nothing half-written is stored or served, the
producer's checkpoint stays with the windows it covers) and the service says so
(``/admin`` names the error, ``/health/ready`` 503). When space returns, it should go
on by itself from its stored checkpoint, its log ending at the relay's newest window.

A full disk is ``StorageFull`` (``databus.client.sql``: SQLite's ``SQLITE_FULL``),
transient: the producer and applier retry until space returns.
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
    relay_args,
    relay_max_scn,
    write_config,
)
from tests.support.procs import DATABUS, free_port
from tests.support.shop import TABLES, Writer, create_shop, txlog_max
from tests.support.writers import Repeating

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("mount")]

# the store's tmpfs, filled to the last byte by the test; 2 MiB also filled up by itself
# in a slow clean-clone CI run (the writer goes on at 100 transactions/s throughout)
DISK = 8 << 20
NOTICE = 30.0  # seconds for the producer to meet the full disk and say so



@dataclass
class Pipeline(ProcessPipeline):
    tmp: Path
    db: Path
    store: Path
    ports: dict[str, int] = field(default_factory=lambda: {"relay": free_port(),
                                                           "bootstrap": free_port()})

    def url(self, name: str) -> str:
        return http_url(self.ports[name])

    def args(self, name: str) -> list[str]:
        if name == "relay":
            return relay_args(self.ports["relay"], source=f"sqlite:///{self.db}",
                              tables=",".join(TABLES), buffer_path=self.tmp / "relay.buf",
                              buffer_size=32 << 20)
        conf = write_config(self.tmp / "bootstrap.yaml", {
            "relay": self.url("relay"), "store": {"url": f"sqlite:///{self.store}"},
            "http": {"port": self.ports["bootstrap"]}, "poll_timeout": 0.5,
            "apply_interval": 0.05})
        return [*DATABUS, "bootstrap", "--config", str(conf)]

    def ready_url(self, name: str) -> str | None:
        return f"{self.url(name)}/health/live"

    def admin(self) -> dict[str, Any]:
        return dict(httpx.get(f"{self.url('bootstrap')}/admin", timeout=10).json())

    def target_scn(self) -> int:
        r = httpx.get(f"{self.url('bootstrap')}/targetSCN", timeout=10)
        return int(r.json()["targetScn"]) if r.status_code == 200 else -1

    def ready(self) -> int:
        return httpx.get(f"{self.url('bootstrap')}/health/ready", timeout=10).status_code


def test_a_full_bootstrap_store_refuses_loudly_and_recovers_when_space_returns(
        tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    create_shop(db)
    with faults.small_disk(DISK) as disk, Writer(db, seed=97) as w, \
            Pipeline(tmp_path, db, disk / "bs.db") as p:
        p.start("relay")
        p.start("bootstrap")
        with Repeating(w.transaction, 0.01):
            p.wait("the store to hold windows", lambda: p.target_scn() > 0, 60)
            with faults.filled(disk, leave=0):
                t0 = time.monotonic()
                admin = p.wait("the producer to say the store is full",
                               lambda: (a := p.admin())["producer"]["error"] and a,
                               NOTICE, interval=0.2)
                noticed = time.monotonic() - t0
                assert p.ready() == 503
                stuck = p.target_scn()
                time.sleep(3.0)
                assert p.target_scn() == stuck  # nothing more stored while it is full
                assert relay_max_scn(p.url("relay")) > stuck  # the relay went on
            t_free = time.monotonic()
            p.wait("the producer to store again once space returned",
                   lambda: p.target_scn() > stuck and not p.admin()["producer"]["error"],
                   20, interval=0.2)
            recovered = time.monotonic() - t_free
        want = txlog_max(w.path)
        p.wait("the store to hold every window the relay serves",
               lambda: (top := relay_max_scn(p.url("relay"))) >= want
               and p.target_scn() == top, 120, interval=0.5)
        # ready again once the applier, in its back-off (at most 10 s) while the disk was
        # full, has applied again: a clean-clone CI run found it still waiting here
        p.wait("the bootstrap server to be ready again", lambda: p.ready() == 200, 30,
               interval=0.5)
    print(f"full store noticed in {noticed:.1f}s ({admin['producer']['error']}); stored"
          f" again {recovered:.1f}s after space returned")
