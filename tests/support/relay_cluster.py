"""A relay cluster of ``databus relay --cluster zk://...`` processes for e2e tests
(members, a recorder on ``zk://``, and the clients the leader-kill tests run).

A subclass changes its members' relay config in ``configure`` (called before each
member's config file is written). ``settled`` waits for every member and recorder to
hold a SQLite shop's newest change; ``wait_agreement`` is the same for a binlog source
(which moves on its own); ``writing`` runs a MariaDB workload meanwhile."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.support.mysql_workload import Workload
from tests.support.pipeline import (
    ProcessPipeline,
    recorder_args,
    relay_args,
    relay_max_scn,
    replicate_args,
    write_config,
)
from tests.support.procs import DATABUS, free_port
from tests.support.shop import TABLES, Writer, txlog_max
from tests.support.verify import read_windows
from tests.support.writers import Repeating
from tests.support.zookeeper import ZooKeeper

SESSION = 4.0  # ZooKeeper session timeout of the members: it bounds each failover


@dataclass
class Cluster(ProcessPipeline):
    tmp: Path
    db: Path
    zk: ZooKeeper
    name: str
    ports: dict[str, int] = field(default_factory=dict)
    source: dict[str, object] | None = None  # default: the SQLite shop
    leaders: int = 1

    @property
    def address(self) -> str:
        return f"zk://{self.zk.hosts}/{self.name}"

    def url(self, member: str) -> str:
        return f"http://127.0.0.1:{self.ports[member]}"

    def args(self, name: str) -> list[str]:
        if name == "recorder":
            return recorder_args(self.address, self.record, self.tmp / "rec.ckpt")
        if name == "replicate":  # the CLI on a list of member URLs instead of zk://
            urls = ",".join(self.url(m) for m in ("m1", "m2", "m3"))
            return replicate_args(urls, f"sqlite:///{self.tmp / 'replica.db'}")
        if name == "bootstrap":  # a bootstrap service whose producer reads zk://
            port = self.ports.setdefault(name, free_port())
            conf = write_config(self.tmp / "bootstrap.yaml", {
                "relay": self.address, "store": {"url": f"sqlite:///{self.tmp / 'bs.db'}"},
                "http": {"port": port}, "poll_timeout": 0.5, "apply_interval": 0.05})
            return [*DATABUS, "bootstrap", "--config", str(conf)]
        if name == "chain":  # not a member: a chain relay reading whichever member serves
            port = self.ports.setdefault(name, free_port())
            return relay_args(port, source=f"databus+{self.address}", snapshot_mode=None,
                              buffer_path=self.tmp / "chain.buf")
        port = self.ports.setdefault(name, free_port())
        config: dict[str, Any] = {
            "name": "shop",
            "source": self.source or {"url": f"sqlite:///{self.db}", "tables": TABLES,
                                      "snapshot_mode": "no_data", "poll_interval": 0.01},
            "buffer": {"path": str(self.tmp / name / "relay.buf"), "capacity_bytes": 64 << 20},
            "http": {"port": port},
            "cluster": {"address": self.address, "member_id": name,
                        "session_timeout": SESSION, "leaders": self.leaders}}
        self.configure(name, config)
        conf = write_config(self.tmp / f"{name}.yaml", config)
        (self.tmp / name).mkdir(exist_ok=True)
        return relay_args(port, config=conf)

    def configure(self, member: str, config: dict[str, Any]) -> None:
        """Change ``member``'s relay config before it is written: a subclass's hook (a
        smaller buffer, another ZooKeeper address...); by default nothing."""

    def ready_url(self, name: str) -> str | None:
        return None if name in ("recorder", "replicate") else f"{self.url(name)}/health"

    def target_scn(self) -> int:
        """The newest SCN the bootstrap service's log holds."""
        r = httpx.get(f"{self.url('bootstrap')}/targetSCN", timeout=10)
        return int(r.json()["targetScn"]) if r.status_code == 200 else -1


    @property
    def record(self) -> Path:
        return self.tmp / "recorded.jsonl"

    def members(self) -> list[str]:
        return [n for n in self.procs if n not in ("recorder", "chain", "replicate",
                                                   "bootstrap")]

    def admin(self, member: str) -> dict[str, object]:
        r = httpx.get(f"{self.url(member)}/admin", timeout=10)
        return dict(r.json())

    def contenders(self) -> set[str]:
        """The member ids in the cluster's election, read from ZooKeeper."""
        from kazoo.client import KazooClient

        zk = KazooClient(hosts=self.zk.hosts, timeout=10)
        zk.start(timeout=10)
        try:
            return {str(c) for c in
                    zk.Election(f"/databus/clusters/{self.name}/election").contenders()}
        finally:
            zk.stop()
            zk.close()

    def leader(self) -> str | None:
        """The member whose ``/admin`` says it leads (None while none does)."""
        return self.leader_among(but=None)

    def leader_among(self, but: str | None) -> str | None:
        """The leader among the members other than ``but``."""
        for m in self.members():
            if m == but:
                continue
            try:
                if self.admin(m)["cluster"]["role"] == "leader":  # type: ignore[index]
                    return m
            except httpx.HTTPError:
                continue
        return None

    def max_scn(self, member: str) -> int:
        return relay_max_scn(self.url(member))

    def body(self, member: str) -> bytes:
        return httpx.get(f"{self.url(member)}/stream", params={"size": str(64 << 20),
                                                              "timeout": "0"}, timeout=30).content


def settled(c: Cluster, w: Writer, records: list[Path] | None = None) -> None:
    """Wait until every member holds the shop's newest change (``w``'s txlog) and every
    recorder (by default ``c.record``) has that window last."""
    want = txlog_max(w.path)
    recorders = [c.record] if records is None else records

    def done() -> bool:
        tops = {c.max_scn(m) for m in c.members()}
        recorded = [read_windows(r) for r in recorders]
        return tops == {max(tops)} and max(tops) >= want and all(
            r and r[-1][0] == max(tops) for r in recorded)

    c.wait("every member and the recorders to hold the last change", done, 120,
           interval=0.5)


def same_windows(c: Cluster) -> bytes:
    """Every member serves the same windows (each learns the high-water mark from its
    leader's next answer: wait for that)."""
    def same() -> bytes | None:
        bodies = {c.body(m) for m in c.members()}
        return bodies.pop() if len(bodies) == 1 else None

    return c.wait("every member to serve the same windows", same, 30)


@contextmanager
def writing(w: Workload) -> Iterator[None]:
    """Run ``w``'s transactions in a thread while the body runs, its schema changes
    spread over the first ~2 s; then stop it, close its connection and re-raise what
    it raised. The workload must have run its DDL."""
    progress = [0.0]

    def step() -> None:
        w.maybe_ddl(progress[0])
        w.transaction()
        progress[0] = min(1.0, progress[0] + 0.0015)

    with Repeating(step, 0.003):
        yield
    w.con.close()
    assert w.ddl_done, "the workload ran its schema changes"


def wait_agreement(c: Cluster, records: list[Path]) -> None:
    """Wait until every member has the same newest window and every recorder has it,
    twice 2 s apart (a binlog moves on its own: heartbeats, progress windows); then
    every member serves the same bytes and the same schema versions."""
    def caught_up() -> bool:
        tops = {c.max_scn(m) for m in c.members()}
        recs = [read_windows(r) for r in records]
        return len(tops) == 1 and all(r and r[-1][0] == max(tops) for r in recs)

    c.wait("every member and the recorders to agree", caught_up, 120, interval=1.0)
    time.sleep(2.0)
    c.wait("every member and the recorders to agree", caught_up, 60, interval=1.0)
    same_windows(c)
    regs = {json.dumps(httpx.get(f"{c.url(m)}/register", timeout=10).json(), sort_keys=True)
            for m in c.members()}
    assert len(regs) == 1, "members disagree on schema versions"
