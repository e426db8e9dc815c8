"""A relay cluster that runs closed: two ``databus relay --cluster`` processes with a
token file and mutual TLS on a real ZooKeeper. The follower reads its leader with
the admin token and client certificate of its ``cluster:`` section; a consumer's
data token may neither act as a member (its ``X-Databus-Member`` read is 403) nor
see another table's name in ``/containerStats``; after the leader is killed -9 the
follower leads and serves the consumer over TLS with its token."""

from __future__ import annotations

import json
import sqlite3
import ssl
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.support.pipeline import ProcessPipeline, relay_args, write_config
from tests.support.procs import free_port
from tests.support.shop import create_shop
from tests.support.tls import Certs, add_token, make_certs
from tests.support.zookeeper import ZooKeeper


@dataclass
class ClosedCluster(ProcessPipeline):
    tmp: Path
    db: Path
    zk: ZooKeeper
    certs: Certs
    tokens: dict[str, str] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)

    def url(self, member: str) -> str:
        return f"https://127.0.0.1:{self.ports[member]}"

    def args(self, name: str) -> list[str]:
        port = self.ports.setdefault(name, free_port())
        member_token = self.tmp / "member.token"
        member_token.write_text(self.tokens["member"] + "\n")
        member_token.chmod(0o600)
        conf = write_config(self.tmp / f"{name}.yaml", {
            # no name: the members' buffers share a directory, and one name there would
            # be one state file (refused); each derives its own from its buffer file
            "source": {"url": f"sqlite:///{self.db}", "tables": ["customers", "orders"],
                       "snapshot_mode": "no_data", "poll_interval": 0.01},
            "buffer": {"path": str(self.tmp / f"{name}.buf"), "capacity_bytes": 16 << 20},
            "http": {"port": port, "token_file": str(self.tmp / "tokens.jsonl"),
                     "tls": {"cert_file": str(self.certs.server_cert),
                             "key_file": str(self.certs.server_key),
                             "client_ca_file": str(self.certs.ca)}},
            "cluster": {"address": f"zk://{self.zk.hosts}/closed", "member_id": name,
                        "session_timeout": 4.0, "token_file": str(member_token),
                        "ca_file": str(self.certs.ca),
                        "cert_file": str(self.certs.client_cert),
                        "key_file": str(self.certs.client_key)}})
        return relay_args(port, config=conf)

    def ready_url(self, name: str) -> str | None:
        return None  # /health is TLS with client certificates: waited for in get()

    def get(self, member: str, path: str, token: str, **kw: object) -> httpx.Response:
        ctx = ssl.create_default_context(cafile=str(self.certs.ca))
        ctx.load_cert_chain(str(self.certs.client_cert), str(self.certs.client_key))
        with httpx.Client(verify=ctx, timeout=30) as client:
            return client.get(f"{self.url(member)}{path}",
                              headers={"Authorization": f"Bearer {token}",
                                       **kw.pop("headers", {})},  # type: ignore[dict-item]
                              params=kw)  # type: ignore[arg-type]

    def role(self, member: str) -> str | None:
        try:
            r = self.get(member, "/admin", self.tokens["member"])
        except httpx.HTTPError:
            return None
        return str(r.json().get("cluster", {}).get("role")) if r.status_code == 200 else None

    def max_scn(self, member: str) -> int:
        r = self.get(member, "/containerStats/buffer/max_scn", self.tokens["member"])
        return int(r.json())


@pytest.fixture
def closed(tmp_path: Path, zookeeper: ZooKeeper) -> Iterator[ClosedCluster]:
    db = tmp_path / "shop.db"
    create_shop(db)
    tokens_file = tmp_path / "tokens.jsonl"
    tokens = {"member": add_token(tokens_file, "member", "--tables", ".*", "--admin"),
              "orders": add_token(tokens_file, "orders", "--tables", r"main\.orders")}
    with ClosedCluster(tmp_path, db, zookeeper, make_certs(tmp_path / "certs"),
                       tokens) as c:
        yield c


def _write(db: Path, start: int, n: int) -> None:
    with sqlite3.connect(db) as con:
        for i in range(start, start + n):
            con.execute("INSERT INTO customers VALUES (?, ?, 0, 0)", (i, f"c{i}"))
            con.execute("INSERT INTO orders (id, customer_id, note, tx) VALUES (?, ?, 'n', 0)",
                        (i, i))


def _orders(c: ClosedCluster, member: str) -> list[int]:
    r = c.get(member, "/stream", c.tokens["orders"], output="json", timeout="0",
              size=str(16 << 20))
    assert r.status_code == 200, r.text
    events = [json.loads(line) for line in r.text.splitlines()]
    assert all(e["source"]["table"] == "orders" for e in events if "op" in e), events[:3]
    return [e["after"]["id"] for e in events if e.get("op") == "c"]


def test_a_closed_cluster_follows_fails_over_and_keeps_members_apart(
        closed: ClosedCluster) -> None:
    c = closed
    c.start("a")
    c.wait("a leading", lambda: c.role("a") == "leader", 60)
    c.start("b")
    c.wait("b following", lambda: c.role("b") == "follower", 60)
    _write(c.db, 0, 20)
    # the follower reads its leader with the member token and client certificate
    c.wait("the follower holding every window of the leader",
           lambda: c.max_scn("a") > 0 and c.max_scn("b") == c.max_scn("a"), 60)
    c.wait("orders on the follower", lambda: _orders(c, "b") == list(range(20)), 30)
    # a consumer's token may not read as a member: its positions would move the
    # high-water mark every consumer is served up to
    r = c.get("a", "/stream", c.tokens["orders"], headers={"X-Databus-Member": "b"},
              timeout="0")
    assert r.status_code == 403 and "admin" in r.json()["message"], r.text
    # nor see the names of tables it was not given
    stats = c.get("a", "/containerStats", c.tokens["orders"]).json()
    assert [s["name"] for s in stats["sources"]] == ["main.orders"]
    assert len(c.get("a", "/containerStats/sources", c.tokens["member"]).json()) == 2
    # the leader dies: the follower leads, captures on, and serves the consumer
    c.kill("a")
    c.procs.pop("a")
    c.wait("b leading after a was killed", lambda: c.role("b") == "leader", 60)
    _write(c.db, 20, 10)
    c.wait("every order, once, from the new leader",
           lambda: _orders(c, "b") == list(range(30)), 60)
