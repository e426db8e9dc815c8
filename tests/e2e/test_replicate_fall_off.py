"""A ``databus replicate`` that falls off the relay's buffer: with ``--bootstrap`` it
catches up from the bootstrap server and ends equal to the source; without, it stops
with an error that names what would have kept it on the relay, after warnings that it
was about to fall off.

SQLite source (rows from before capture, loaded by the bootstrap service) -> ``databus
relay`` with a 1 MiB buffer -> ``databus replicate`` into a SQLite replica, each its own
process. The consumer falls off while it is stopped (SIGSTOP) and the writer goes on.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import yaml

from tests.support.bootstrap import preload, replica_equal
from tests.support.bulk import BulkWriter
from tests.support.pipeline import BootstrapPipeline
from tests.support.procs import DATABUS, free_port
from tests.support.shop import TABLES, create_shop


@dataclass
class Pipeline(BootstrapPipeline):
    tmp: Path
    db: Path
    relay_port: int = field(default_factory=free_port)
    bs_port: int = field(default_factory=free_port)
    bootstrap: bool = True

    def args(self, name: str) -> list[str]:
        if name in ("relay", "bootstrap"):
            return [*DATABUS, name, "--config", str(self.tmp / f"{name}.yaml")]
        boot = ["--bootstrap", f"http://127.0.0.1:{self.bs_port}"] if self.bootstrap else []
        return [*DATABUS, "replicate", "--relay", f"http://127.0.0.1:{self.relay_port}",
                "--target", f"sqlite:///{self.replica}", *boot]

    def checkpoint(self) -> dict[str, object]:
        """The replica's committed checkpoint ({} before there is one)."""
        return self.replica_checkpoint() or {}

    def online(self) -> bool:
        cp = self.checkpoint()
        return cp.get("consumption_mode") == "ONLINE_CONSUMPTION" and int(
            str(cp.get("windowScn", -1))) > 0

    def relay_scn(self, which: str) -> int:
        return int(httpx.get(f"http://127.0.0.1:{self.relay_port}/containerStats/buffer/"
                             f"{which}", timeout=10).json())

    def fall_off(self, writer: BulkWriter) -> int:
        """Stop the consumer, write until the relay no longer holds any window it could
        have read, let it go on; the relay's newest window when it stopped."""
        proc = self.procs["replicate"]
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            # a long poll it had sent is answered with the first windows written now:
            # what it may have read is what the relay held a moment later
            for _ in range(10):
                writer.transaction()
            time.sleep(0.5)
            held = self.relay_scn("max_scn")
            while self.relay_scn("prev_scn") <= held:  # only what follows is servable
                writer.transaction()
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        return held


@pytest.fixture
def pipeline(tmp_path: Path) -> Iterator[Pipeline]:
    db = tmp_path / "shop.db"
    create_shop(db)
    preload(db, 2000)
    p = Pipeline(tmp_path, db)
    (tmp_path / "relay.yaml").write_text(yaml.safe_dump({
        "name": "falloff", "source": {"url": f"sqlite:///{db}", "tables": TABLES,
                                      "poll_interval": 0.01, "snapshot_mode": "no_data"},
        "buffer": {"capacity_bytes": 1024 * 1024, "path": str(tmp_path / "relay.buf"),
                   "flush_interval": 0.2},
        "http": {"port": p.relay_port}}))
    (tmp_path / "bootstrap.yaml").write_text(yaml.safe_dump({
        "relay": f"http://127.0.0.1:{p.relay_port}",
        "store": {"url": f"sqlite:///{tmp_path / 'bs.db'}"},
        "initial_load": {"url": f"sqlite:///{db}", "tables": TABLES},
        "http": {"port": p.bs_port}, "poll_timeout": 0.5, "apply_interval": 0.05}))
    try:
        yield p
    finally:
        p.close()


def _writing(writer: BulkWriter) -> tuple[threading.Thread, threading.Event]:
    done = threading.Event()
    thread = threading.Thread(target=writer.run_until, args=(10**9, done, 0.02))
    thread.start()
    return thread, done


def test_with_bootstrap_it_catches_up_from_the_snapshot_and_ends_equal(
        pipeline: Pipeline) -> None:
    p = pipeline
    p.start("relay")
    p.start("bootstrap")
    writer = BulkWriter(p.db, seed=41, per_tx=20)
    try:
        thread, done = _writing(writer)
        try:
            p.start("replicate")  # a new replica: it bootstraps, then follows the relay
            p.wait("the replica online", p.online, 120, interval=0.1)
        finally:
            done.set()
            thread.join()
        held = p.fall_off(writer)
        p.wait("the replica past where it fell off", lambda: p.online() and int(
            str(p.checkpoint()["windowScn"])) > held, 120, interval=0.1)
        thread, done = _writing(writer)  # it follows the relay again, writes going on
        done.wait(2.0)
        done.set()
        thread.join()
    finally:
        writer.close()
    p.wait("the replica to equal the source", lambda: replica_equal(p.db, p.replica), 120,
           interval=0.5)
    log = p.log("replicate").read_text()
    assert "no longer holds checkpoint" in log and "switching to the bootstrap server" in log
    assert "a new consumer starts at the relay's oldest window" not in log  # it bootstrapped


def test_without_bootstrap_the_error_names_the_remedy(pipeline: Pipeline) -> None:
    p = pipeline
    p.bootstrap = False
    p.start("relay")
    writer = BulkWriter(p.db, seed=42, per_tx=20)
    try:
        while p.relay_scn("prev_scn") < 0:  # a full buffer: it evicts from now on
            writer.transaction()
        thread, done = _writing(writer)
        try:
            p.start("replicate")
            p.wait("the replica to follow the relay", p.online, 60, interval=0.1)
            done.wait(3.0)  # it keeps up, and is warned: 1 MiB holds seconds of this
        finally:
            done.set()
            thread.join()
        p.fall_off(writer)
    finally:
        writer.close()
    proc = p.procs["replicate"]
    assert proc.wait(60) == 2
    log = p.log("replicate").read_text()
    assert "fell off the relay's buffer" in log
    error = next(line for line in log.splitlines() if line.startswith("databus: ScnNotFound"))
    for remedy in ("--bootstrap URL", "--buffer-size", "--buffer-path"):
        assert remedy in error
    warning = log.index("of source time ahead of the oldest window relay")
    assert warning < log.index("databus: ScnNotFound")
    # it started on a buffer that had dropped windows already: said once, at its start
    assert log.count("a new consumer starts at the relay's oldest window, and the relay no"
                     " longer holds the windows up to scn") == 1
