"""SQLite -> relay -> bootstrap service -> replicate sink, each its own process.

The relay's buffer is small, so the history falls off it; the replica must
end equal to the source, with writes going on during the bootstrap and with
kill -9 of the consumer and of the bootstrap service at chosen phases.
Tables hold rows from before capture started (initial load).
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import yaml

from tests.support.bootstrap import preload, replica_equal
from tests.support.bulk import BulkWriter
from tests.support.pipeline import (
    BootstrapPipeline,
    http_url,
    relay_args,
    replicate_args,
    write_config,
)
from tests.support.procs import DATABUS, free_port, kill9
from tests.support.shop import TABLES, create_shop
from tests.support.wait import wait_until


@dataclass
class Pipeline(BootstrapPipeline):
    tmp: Path
    db: Path
    relay_port: int = field(default_factory=free_port)
    bs_port: int = field(default_factory=free_port)
    batch: int = 10_000

    def args(self, name: str) -> list[str]:
        if name == "relay":
            return relay_args(self.relay_port, config=self.tmp / "relay.yaml")
        if name == "bootstrap":
            return [*DATABUS, "bootstrap", "--config", str(self.tmp / "bootstrap.yaml")]
        return replicate_args(http_url(self.relay_port), f"sqlite:///{self.replica}",
                              "--bootstrap", http_url(self.bs_port),
                              "--bootstrap-batch", str(self.batch))

    def relay_buffer(self, capacity: int) -> None:
        """Give the relay (not started yet) a buffer of ``capacity`` bytes."""
        conf = self.tmp / "relay.yaml"
        raw = yaml.safe_load(conf.read_text())
        raw["buffer"]["capacity_bytes"] = capacity
        write_config(conf, raw)

    def relay_min_scn(self) -> int:
        return int(httpx.get(f"http://127.0.0.1:{self.relay_port}/containerStats/buffer/min_scn",
                             timeout=10).json())

    def bs_admin(self) -> dict[str, object]:
        return dict(httpx.get(f"http://127.0.0.1:{self.bs_port}/admin", timeout=10).json())

    def wait_for(self, what: str, pred: Callable[[dict[str, object]], bool],
                 timeout: float = 120) -> dict[str, object]:
        """The consumer's committed checkpoint once ``pred`` holds for it."""
        def reached() -> dict[str, object] | None:
            cp = self.replica_checkpoint()
            return cp if cp is not None and pred(cp) else None

        found: dict[str, object] = self.wait(f"the consumer to reach {what}", reached, timeout,
                                             interval=0.02)
        return found

    def log_max_scn(self) -> int:
        return int(str(self.bs_admin()["log_max_scn"]))

    def wait_produced(self, timeout: float = 120) -> None:
        """Until the bootstrap service's log takes in a window newer than it holds now."""
        now = self.log_max_scn()
        self.wait("the bootstrap service to log a newer window",
                  lambda: self.log_max_scn() > now, timeout)

    def wait_equal(self, timeout: float = 240) -> None:
        self.wait("the replica to equal the source", lambda: replica_equal(self.db, self.replica),
                  timeout, interval=0.5)


@pytest.fixture
def pipeline(tmp_path: Path) -> Iterator[Pipeline]:
    db = tmp_path / "shop.db"
    create_shop(db)
    preload(db, 5000)  # rows that exist before capture starts
    p = Pipeline(tmp_path, db)
    write_config(tmp_path / "relay.yaml", {
        "name": "e2e", "source": {"url": f"sqlite:///{db}", "tables": TABLES,
                                  "poll_interval": 0.01,
                                  # pre-existing rows come from the bootstrap's initial load
                                  "snapshot_mode": "no_data"},
        "buffer": {"capacity_bytes": 2 * 1024 * 1024, "path": str(tmp_path / "relay.buf"),
                   "flush_interval": 0.2},
        "http": {"port": p.relay_port}})
    write_config(tmp_path / "bootstrap.yaml", {
        "relay": f"http://127.0.0.1:{p.relay_port}",
        "store": {"url": f"sqlite:///{tmp_path / 'bs.db'}"},
        "initial_load": {"url": f"sqlite:///{db}", "tables": TABLES},
        "http": {"port": p.bs_port}, "poll_timeout": 0.5, "apply_interval": 0.05})
    try:
        yield p
    finally:
        p.close()


def _mode(cp: dict[str, object]) -> object:
    return cp["consumption_mode"]


def _write_in_background(w: BulkWriter, upto: int, pause: float
                         ) -> tuple[threading.Thread, threading.Event]:
    done = threading.Event()
    t = threading.Thread(target=w.run_until, args=(upto, done, pause))
    t.start()
    return t, done


@pytest.mark.slow
def test_consumer_started_after_100k_changes(pipeline: Pipeline) -> None:
    p = pipeline
    # a SQLite window holds every transaction committed since the relay's last read: a
    # relay starved of CPU for a second folds ~100 of these into one window, which must
    # fit the buffer (2 MiB did not once); 6 MiB still lets 3/4 of the history fall off
    p.relay_buffer(6 * 1024 * 1024)
    p.start("relay")
    p.start("bootstrap")
    w = BulkWriter(p.db, seed=21, per_tx=100)
    try:
        w.run_until(100_000, threading.Event(), 0.002)
        # the relay may still be reading the last writes: the history falls off as it does
        wait_until(lambda: p.relay_min_scn() > 50_000, 60, "the history to fall off the relay")
        # writes continue during the whole bootstrap (however long a loaded machine makes
        # it): the consumer reaches the relay while the writer is still going, which goes
        # on after the switch, to 130,000 changes at least
        writer, done = _write_in_background(w, 10**9, 0.05)
        p.start("replicate")
        p.wait_for("the relay", lambda cp: _mode(cp) == "ONLINE_CONSUMPTION")
        assert writer.is_alive(), "the writer finished before the bootstrap ended"
        more = max(130_000, w.changes + 3_000)
        p.wait("more writes after the switch", lambda: w.changes >= more, 300)
        done.set()
        writer.join(300)
        assert not writer.is_alive()
    finally:
        done.set() if "done" in locals() else None
        w.close()
    p.wait_equal()
    admin = p.bs_admin()
    assert admin["log_start_scn"] == 0  # the initial load read the pre-existing rows at SCN 0


@pytest.mark.slow
def test_kill9_consumer_and_bootstrap_service_at_each_phase(pipeline: Pipeline) -> None:
    p = pipeline
    p.batch = 100  # many small batches, so each phase lasts long enough to be hit
    p.start("relay")
    p.start("bootstrap")
    w = BulkWriter(p.db, seed=22, per_tx=50)
    killed: list[str] = []
    done = threading.Event()
    try:
        w.run_until(30_000, done, 0.002)
        wait_until(lambda: p.relay_min_scn() > 5_000, 60, "the history to fall off the relay")
        writer = threading.Thread(target=w.run_until, args=(10**9, done, 0.05))
        writer.start()
        p.start("replicate")
        # 1. the consumer, in the middle of the snapshot
        p.wait_for("the snapshot", lambda cp: _mode(cp) == "BOOTSTRAP_SNAPSHOT"
                   and int(str(cp["snapshot_offset"])) > 0)
        p.kill("replicate")
        killed.append(f"consumer in {_mode(p.replica_checkpoint() or {})}")
        p.start("replicate")
        # 2. the bootstrap service (producer, applier, server), snapshot still going
        first = p.replica_checkpoint() or {}
        p.wait_for("more snapshot", lambda cp: cp != first)
        p.kill("bootstrap")
        killed.append(f"bootstrap service while the consumer is in "
                      f"{_mode(p.replica_checkpoint() or {})}")
        p.start("bootstrap")
        # 3. the consumer, in the catch-up
        p.wait_for("the catch-up", lambda cp: _mode(cp) == "BOOTSTRAP_CATCHUP")
        p.kill("replicate")
        killed.append(f"consumer in {_mode(p.replica_checkpoint() or {})}")
        p.start("replicate")
        # 4. the consumer, right after the switch to the relay
        p.wait_for("the relay", lambda cp: _mode(cp) == "ONLINE_CONSUMPTION")
        p.kill("replicate")
        killed.append(f"consumer in {_mode(p.replica_checkpoint() or {})}")
        p.start("replicate")
        # 5. the bootstrap service again, while it follows the relay
        online = p.replica_checkpoint() or {}
        p.wait_for("more of the relay", lambda cp: cp != online)
        p.wait_produced()
        p.kill("bootstrap")
        killed.append("bootstrap service while producing")
        p.start("bootstrap")
        p.wait_produced()  # the restarted service follows the relay again
    finally:
        done.set()
        if "writer" in locals():
            writer.join(60)
        w.close()
    p.wait_equal()
    assert killed == ["consumer in BOOTSTRAP_SNAPSHOT",
                      "bootstrap service while the consumer is in BOOTSTRAP_SNAPSHOT",
                      "consumer in BOOTSTRAP_CATCHUP", "consumer in ONLINE_CONSUMPTION",
                      "bootstrap service while producing"], killed
    # the restarted bootstrap service serves a new consumer a full, equal copy
    p.kill("replicate")
    p.replica.unlink()
    p.start("replicate")
    p.wait_equal()


def test_bootstrap_command_config_errors_are_one_line(tmp_path: Path) -> None:
    from tests.support.procs import ROOT

    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"relay": "ftp://x", "store": {"url": "sqlite:///x.db"},
                                   "nonsense": 1}))
    for cfg in (bad, tmp_path / "missing.yaml"):
        out = subprocess.run([*DATABUS, "bootstrap", "--config", str(cfg)], capture_output=True,
                             text=True, timeout=60, cwd=ROOT, check=False)
        assert out.returncode == 2, out.stderr
        assert "databus: ConfigError:" in out.stderr and "Traceback" not in out.stderr


def test_tail_with_bootstrap_prints_the_snapshot(pipeline: Pipeline) -> None:
    """`databus tail --bootstrap`: a new consumer sees the rows that existed before
    capture (snapshot, op r), then the relay's changes."""
    from tests.support.procs import ROOT

    p = pipeline
    p.start("relay")
    p.start("bootstrap")
    out_path = p.tmp / "tail.jsonl"
    with out_path.open("w") as out:
        tail = subprocess.Popen(
            [*DATABUS, "tail", "--relay", f"http://127.0.0.1:{p.relay_port}", "--bootstrap",
             f"http://127.0.0.1:{p.bs_port}", "--max-windows", "1"],
            stdout=out, stderr=subprocess.DEVNULL, cwd=ROOT)
    try:
        def printed_snapshot() -> bool:  # the preloaded customers
            assert tail.poll() is None, "tail exited before printing the snapshot"
            return out_path.read_text().count("\n") >= 5000

        wait_until(printed_snapshot, 60, "tail to print the 5000 snapshot rows", interval=0.1)
        time.sleep(0.5)
        con = sqlite3.connect(p.db)
        con.execute("INSERT INTO customers VALUES (900001, 'after', 1.0, 1)")
        con.commit()
        con.close()
        assert tail.wait(60) == 0
    finally:
        if tail.poll() is None:
            kill9(tail)
    lines = [json.loads(x) for x in out_path.read_text().splitlines()]
    snap = [x for x in lines if x["op"] == "r"]
    assert all(x["source"]["snapshot"] for x in snap)
    assert len([x for x in snap if x["source"]["table"] == "customers"]) == 5000
    assert lines[-1]["op"] == "c" and lines[-1]["after"]["id"] == 900001
