"""The file system of a relay's persistent buffer fills up while it captures a MariaDB
workload (a size-limited tmpfs, filled to its last byte).

* Under the buffer only (state directory elsewhere): the buffer's blocks were all
  reserved when it was opened, so the relay captures on as if nothing happened, and a
  consumer ends with exactly the committed transactions. (Before, the first store into
  a page never written killed the relay with SIGBUS, without a word in its log.)
* A buffer file that does not fit on its file system is refused at start, with the
  sizes named, and no file is left behind.
* Under the state directory too: the relay should refuse loudly (``/admin``, its log),
  acknowledge nothing upstream past what it stored, and continue by itself when space
  returns (the state write's ``ENOSPC`` is a transient ``StorageFull``: capture shows
  ``retrying`` naming it, and retries).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from databus.buffer import EventBuffer
from databus.core.errors import ConfigError
from tests.support import faults
from tests.support.mariadb import MariaDB
from tests.support.mysql_workload import SCHEMA, Workload, connect_writer
from tests.support.pipeline import RelayPipeline, recorder_args, relay_args
from tests.support.procs import free_port
from tests.support.relay_cluster import writing
from tests.support.verify import check_delivery, read_windows

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("mount")]

DISK, BUFFER = 48 << 20, 16 << 20  # the tmpfs, the buffer file on it



@dataclass
class Pipeline(RelayPipeline):
    tmp: Path
    disk: Path
    server: MariaDB
    port: int
    state_on_disk: bool = False

    def args(self, name: str) -> list[str]:
        if name == "recorder":
            return recorder_args(self.url, self.record, self.tmp / "rec.ckpt")
        # by default the state directory is the buffer file's
        more = () if self.state_on_disk else ("--state-dir", str(self.tmp / "state"))
        return relay_args(self.port, source=self.server.url, tables=r"shop\..*",
                          buffer_path=self.disk / "relay.buf", buffer_size=BUFFER, more=more)


def _delivered(p: Pipeline, w: Workload) -> dict[str, int]:
    total = sum(len(t) for t in w.committed)

    def whole() -> bool:
        return sum(len(ev) for ev in dict(read_windows(p.record)).values()) >= total

    p.wait("the recorder to hold every committed change", whole, 120, interval=0.5)
    return check_delivery(read_windows(p.record), w.committed, w.rolled_back)


def _admin(url: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/admin", timeout=10).json())


@contextmanager
def _capturing(tmp_path: Path, seed: int, *, state_on_disk: bool = False
               ) -> Iterator[tuple[Pipeline, Workload]]:
    """A relay (its buffer on a small tmpfs, ``p.disk``) capturing a private MariaDB
    with the workload's schema, a recorder reading it, and the workload (``seed``) to
    run; all stopped after the block."""
    server = MariaDB(tmp_path / "db")
    with server, faults.small_disk(DISK) as disk, \
            Pipeline(tmp_path, disk, server, free_port(), state_on_disk=state_on_disk) as p:
        server.execute(*SCHEMA)
        p.start("relay")
        p.wait_dump(server)
        p.start("recorder")
        yield p, Workload(connect_writer(server.port), seed=seed)


def test_a_full_disk_under_the_buffer_costs_it_nothing(tmp_path: Path) -> None:
    with _capturing(tmp_path, 89) as (p, w):
        with writing(w):
            time.sleep(1.0)
            with faults.filled(p.disk, leave=0):
                assert faults.free_bytes(p.disk) == 0
                held = p.max_scn()
                # the ring moves on through pages it never wrote before (every binlog
                # byte is about one buffer byte): their blocks were reserved at start
                p.wait("the relay to store windows on a full disk",
                       lambda: p.max_scn() - held >= 512 << 10, 60, interval=0.2)
                time.sleep(2.0)
                assert _admin(p.url)["capture"]["state"] == "running"
        stats = _delivered(p, w)
        assert stats["repeated_windows"] == 0, stats
        print(f"captured on through a full disk; {stats}")


def test_a_buffer_that_does_not_fit_is_refused_at_start() -> None:
    with faults.small_disk(8 << 20) as disk:
        with pytest.raises(ConfigError, match=r"needs 16781312 bytes .* free"):
            EventBuffer(16 << 20, path=disk / "relay.buf")
        assert not (disk / "relay.buf").exists()  # made by the refused start: removed
        with EventBuffer(4 << 20, path=disk / "relay.buf") as buf:  # one that fits
            assert buf.capacity == 4 << 20


def test_a_full_state_directory_is_refused_loudly_and_recovered_from(tmp_path: Path) -> None:
    with _capturing(tmp_path, 97, state_on_disk=True) as (p, w):
        with writing(w):
            time.sleep(1.0)
            with faults.filled(p.disk, leave=0):
                t0 = time.monotonic()
                admin = p.wait("the relay to say its disk is full",
                               lambda: (a := _admin(p.url))["capture"]["state"] == "retrying"
                               and "space" in str(a["capture"]["error"]) and a, 8,
                               interval=0.1)
                noticed = time.monotonic() - t0
                held = p.max_scn()
                time.sleep(3.0)  # the workload commits on; the relay stores nothing
                assert p.max_scn() == held, "a window was served that was not stored"
                assert _admin(p.url)["capture"]["state"] == "retrying"
            t_free = time.monotonic()
            p.wait("capture to run again once space returned",
                   lambda: _admin(p.url)["capture"]["state"] == "running", 60)
            resumed = time.monotonic() - t_free
            time.sleep(1.0)
        stats = _delivered(p, w)
        assert stats["repeated_windows"] == 0, stats
        log = " ".join(p.log("relay").read_text().split())
        assert "No space left on device" in log or "space" in log, log[-2000:]
        print(f"full disk noticed in {noticed:.1f}s ({admin['capture']['error']}); capture"
              f" ran again {resumed:.1f}s after space returned; {stats}")
