"""Chain relays as separate processes: ``databus relay --source databus+http://...``
reading a relay that captures SQLite or MariaDB, killed -9 mid-stream and restarted,
ends holding every upstream window byte for byte (same SCNs, same boundaries, same
event bytes, schema changes included), serves the same sources and schemas, applies
server-side filters and partitions as the upstream does, retries a lost upstream
without limit (visible in /admin and metrics) and stops, saying why, when the upstream
no longer holds its position: a chain relay never bootstraps.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.support.mariadb import BINLOG_SETTINGS, MariaDB
from tests.support.mysql_workload import SCHEMA, Workload, connect_writer
from tests.support.pipeline import ProcessPipeline, http_url, relay_args
from tests.support.procs import free_port
from tests.support.shop import TABLES, Writer, create_shop, txlog_max
from tests.support.writers import Repeating


@dataclass
class Chain(ProcessPipeline):
    """``up``: a relay capturing ``source``; ``chain``: a relay reading ``up``."""

    tmp: Path
    source: str  # the upstream relay's source URL
    tables: str  # and its --tables
    chain_tables: str | None = None
    up_port: int = field(default_factory=free_port)
    chain_port: int = field(default_factory=free_port)
    up_size: int = 64 << 20

    def url(self, name: str) -> str:
        return http_url(self.up_port if name == "up" else self.chain_port)

    def args(self, name: str) -> list[str]:
        if name == "up":
            return relay_args(self.up_port, source=self.source, tables=self.tables,
                              buffer_path=self.tmp / "up.buf", buffer_size=self.up_size)
        return relay_args(self.chain_port, source=f"databus+{self.url('up')}",
                          tables=self.chain_tables, snapshot_mode=None,
                          buffer_path=self.tmp / "chain.buf", buffer_size=64 << 20)

    def down(self, name: str) -> None:
        """kill -9, on purpose: the waits that follow check only the others."""
        self.kill(name)
        del self.procs[name]

    def ready_url(self, name: str) -> str:
        return f"{self.url(name)}/admin"

    def get(self, name: str, path: str, **params: str) -> httpx.Response:
        r = httpx.get(f"{self.url(name)}{path}", params=params, timeout=30)
        assert r.status_code == 200, (name, path, r.text)
        return r

    def body(self, name: str, **params: str) -> bytes:
        """Every window the relay holds (one answer: what the tests write is far below the
        64 MiB an answer may hold)."""
        return self.get(name, "/stream", size=str(64 << 20), timeout="0", **params).content

    def max_scn(self, name: str) -> int:
        return int(self.get(name, "/containerStats/buffer/max_scn").json())

    def wait_same_top(self, timeout: float = 120.0, *, at_least: int = 0) -> int:
        """The newest SCN once the upstream holds ``at_least`` and the chain holds the same.

        The two can agree while the upstream is still capturing the last commits (a loaded
        machine): ``at_least`` (the source's newest SCN) makes the wait end only after them.
        """
        def same() -> int | None:
            top = self.max_scn("up")
            return top if top >= max(at_least, 0) and self.max_scn("chain") == top else None

        return self.wait("the chain relay to hold the upstream's newest window", same, timeout)

    def source_ids(self, name: str, pattern: str = "") -> list[int]:
        return [s["id"] for s in self.get(name, "/sources").json() if pattern in s["name"]]


def _kill_chain_while_writing(p: Chain, step: Callable[[], object], kills: int,
                              seed: int) -> None:
    rng = random.Random(seed)
    with Repeating(step, 0.003):
        for _ in range(kills):
            time.sleep(rng.uniform(0.5, 2.0))
            p.kill("chain")  # mid-stream: the writer goes on
            time.sleep(rng.uniform(0.1, 0.5))
            p.start("chain")
        time.sleep(1.0)


@pytest.fixture(params=[64 << 20])
def sqlite_chain(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[Chain, Writer]]:
    """A chain of a relay on a SQLite shop; ``param``: the upstream's buffer size."""
    db = tmp_path / "shop.db"
    create_shop(db)
    with Writer(db, seed=23) as w, Chain(tmp_path, f"sqlite:///{db}", ",".join(TABLES),
                                         up_size=request.param) as p:
        p.start("up")
        p.start("chain")
        yield p, w


@pytest.mark.slow
def test_sqlite_chain_killed_mid_stream_holds_every_upstream_window(
        sqlite_chain: tuple[Chain, Writer]) -> None:
    p, w = sqlite_chain
    _kill_chain_while_writing(p, w.transaction, kills=3, seed=5)
    newest = txlog_max(w.path)  # the writer has stopped: nothing commits after this
    top = p.wait_same_top(at_least=newest)
    assert top >= newest
    up, chain = p.body("up"), p.body("chain")
    assert len(up) > 100_000 and chain == up  # every window, byte for byte
    assert p.get("chain", "/sources").json() == p.get("up", "/sources").json()
    assert p.get("chain", "/register").json() == p.get("up", "/register").json()
    # server-side filters and partitions: the same answers as the upstream's
    customers = ",".join(map(str, p.source_ids("up", "customers")))
    partition = json.dumps({customers: {"partitionType": "MOD", "filters": [
        {"numBuckets": 3, "bktRange": {"start": 0, "end": 2}}]}})
    for params in ({"sources": customers}, {"filters": partition}):
        filtered = p.body("up", **params)
        assert 0 < len(filtered) < len(up) and p.body("chain", **params) == filtered, params
    # the chain relay's windows all arrived through a restart: its log says where it resumed
    admin = p.get("chain", "/admin").json()
    assert admin["fetcher"]["state"] == "running", admin


@pytest.mark.slow
def test_a_chain_of_a_mariadb_relay_with_ddl_and_a_table_subset(tmp_path: Path) -> None:
    server = MariaDB(tmp_path / "db", settings={**BINLOG_SETTINGS,
                                                  "innodb-flush-log-at-trx-commit": "2"})
    with server:
        server.execute(*SCHEMA)
        with Chain(tmp_path, server.url, r"shop\..*",
                   chain_tables=r"shop\.(accounts|orders)") as p:
            p.start("up")
            p.wait_dump(server)
            p.start("chain")
            w = Workload(connect_writer(server.port), seed=17)
            progress = [0.0]

            def step() -> None:
                w.maybe_ddl(progress[0])
                w.transaction()
                progress[0] = min(1.0, progress[0] + 0.002)

            _kill_chain_while_writing(p, step, kills=3, seed=9)
            w.con.close()
            p.wait_same_top()
            assert w.ddl_done, "the workload ran its schema changes"
            ids = p.source_ids("up", "shop.accounts") + p.source_ids("up", "shop.orders")
            assert sorted(p.source_ids("chain")) == sorted(ids)
            # the upstream's answer for those two tables is the chain relay's whole buffer
            want = p.body("up", sources=",".join(map(str, ids)))
            assert len(want) > 50_000 and p.body("chain") == want
            up_reg = [s for s in p.get("up", "/register").json() if s["id"] in ids]
            assert p.get("chain", "/register").json() == up_reg
            assert any(s["version"] > 1 for s in up_reg), "a schema change reached the chain"


@pytest.mark.slow
@pytest.mark.parametrize("sqlite_chain", [1 << 20], indirect=True)
def test_upstream_loss_is_retried_and_a_lost_position_stops_the_chain(
        sqlite_chain: tuple[Chain, Writer]) -> None:
    p, w = sqlite_chain
    for _ in range(50):
        w.transaction()
    p.wait_same_top()
    p.down("up")
    # the chain relay serves what it holds and says it is retrying
    p.wait("the chain relay to report the lost upstream", lambda: p.get(
        "chain", "/admin").json()["fetcher"]["state"] == "retrying", 30)
    assert len(p.body("chain")) > 0
    metrics = p.get("chain", "/metrics").text
    assert 'databus_relay_source_errors_total{kind="transient"}' in metrics
    for _ in range(50):
        w.transaction()
    p.start("up")  # same buffer file: it resumes, and so does the chain
    p.wait_same_top()
    assert p.body("chain") == p.body("up")
    assert p.get("chain", "/admin").json()["fetcher"]["state"] == "running"
    # a chain relay down while its upstream's buffer wrapped past its position: it
    # stops capture and says why (it never bootstraps), and serves what it holds
    p.down("chain")
    for _ in range(1500):  # about 3 MiB of windows through a 1 MiB buffer
        w.transaction()
    p.wait("the upstream to capture them", lambda: p.max_scn("up") >= txlog_max(w.path), 60)
    p.start("chain")

    def failed() -> dict[str, object] | None:
        r = httpx.get(f"{p.url('chain')}/admin", timeout=10)
        f: dict[str, object] = r.json()["fetcher"]
        # a relay whose capture stopped says so with its status too
        return f if f["state"] == "failed" and r.status_code == 503 else None

    f = p.wait("the chain relay to stop on the lost position", failed, 60)
    assert "SourcePositionLost" in str(f["last_error"]) and "never bootstraps" in str(
        f["last_error"]), f
    assert len(p.body("chain")) > 0
