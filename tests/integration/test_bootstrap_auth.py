"""The bootstrap server applies the same tokens as the relay: 401 without one, a
token sees only its tables (403 for another), /admin needs the admin flag, and the
bootstrap client reads with a token given in its config; its producer verifies a TLS
relay against ``relay.ca_file``."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from databus.auth import add_token
from databus.bootstrap.config import parse_config as parse_bootstrap
from databus.bootstrap.service import BootstrapService
from databus.client import ClientConfig, DatabusClient
from databus.client.consumer import Consumer, DataEvent
from databus.relay.config import parse_config
from databus.relay.relay import Relay
from tests.support.bootstrap import bootstrap_config, make_bootstrap
from tests.support.relays import make_relay
from tests.support.shop import TABLES, create_shop
from tests.support.tls import make_certs
from tests.support.wait import wait_until


def test_bootstrap_tokens(tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    create_shop(db)
    with sqlite3.connect(db) as con:
        for i in range(20):
            con.execute("INSERT INTO customers VALUES (?, ?, 0, 0)", (i, f"c{i}"))
            con.execute("INSERT INTO orders (id, customer_id, tx) VALUES (?, ?, 0)", (i, i))
    tokens = tmp_path / "tokens.jsonl"
    admin = add_token(tokens, "admin", [".*"], admin=True)
    orders = add_token(tokens, "orders", [r"main\.orders"])
    producer = tmp_path / "producer.token"
    producer.write_text(add_token(tokens, "producer", [".*"]))
    relay = Relay(parse_config({
        "source": {"url": f"sqlite:///{db}", "tables": TABLES, "poll_interval": 0.01},
        "http": {"port": 0, "token_file": str(tokens)}}))
    with relay, make_bootstrap(db, tmp_path, relay, token_file=tokens,
                               relay_token_file=producer) as bs:
        def get(path: str, token: str | None = None, **params: str) -> httpx.Response:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            return httpx.get(f"{bs.url}{path}", params=params, headers=headers, timeout=30)

        # /targetSCN answers once the initial load is in, /sources once the producer
        # has copied the relay's sources: a moment later
        wait_until(lambda: get("/sources", admin).status_code == 200, 60, "the store")
        ids = {s["name"]: s["id"] for s in get("/sources", admin).json()}
        assert get("/sources").status_code == 401
        assert [s["name"] for s in get("/sources", orders).json()] == ["main.orders"]
        for path in ("/register", "/startSCN", "/bootstrap"):
            r = get(path, orders, sources=str(ids["main.customers"]))
            assert r.status_code == 403, (path, r.text)
        assert get("/admin", orders).status_code == 403
        assert get("/admin", admin).status_code == 200
        # the client library bootstraps with its token: only the orders rows arrive
        seen: list[str] = []

        class Record(Consumer):
            def on_bootstrap_event(self, event: DataEvent) -> None:
                seen.append(event.source)

            def on_data_event(self, event: DataEvent) -> None:
                seen.append(event.source)

        token_file = tmp_path / "orders.token"
        token_file.write_text(orders)
        stop = threading.Event()
        client = DatabusClient(ClientConfig(relay={"url": relay.url, "token_file": token_file},
                                            bootstrap_url=bs.url), Record())
        worker = threading.Thread(target=client.run, kwargs={"stop": stop}, daemon=True)
        worker.start()
        try:
            wait_until(lambda: len(seen) >= 20, 60, "the orders snapshot")
        finally:
            stop.set()
            worker.join(30)
        assert set(seen) == {"main.orders"}


def test_relay_ca_file_lets_the_producer_verify_a_tls_relay(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DATABUS_CA_FILE", raising=False)
    certs = make_certs(tmp_path / "certs")
    db = tmp_path / "shop.db"
    create_shop(db)
    with sqlite3.connect(db) as con:
        con.executemany("INSERT INTO orders (id, customer_id, tx) VALUES (?, 1, 0)",
                        [(i,) for i in range(10)])
    tls = {"cert_file": str(certs.server_cert), "key_file": str(certs.server_key)}
    with make_relay(db, tmp_path, snapshot_mode="initial", http={"tls": tls}) as relay:
        assert relay.url.startswith("https://")
        wait_until(lambda: relay.buffer.max_scn >= 0, 30, "the relay's snapshot")
        for name, ca in (("untrusted", None), ("trusted", certs.ca)):
            (tmp_path / name).mkdir()
            raw = {**bootstrap_config(db, tmp_path / name, relay, initial=False),
                   "relay": {"url": relay.url, "ca_file": str(ca) if ca else None}}
            with BootstrapService(parse_bootstrap(raw)) as bs:
                def status() -> dict[str, Any]:
                    return httpx.get(f"{bs.url}/admin", timeout=10).json()

                if ca is None:  # the system's CAs do not know the test CA: refused, said
                    wait_until(lambda: "CERTIFICATE_VERIFY_FAILED" in str(
                        status()["producer"]["error"]), 30, "the producer's refusal")
                    assert status()["producer"]["windows"] == 0
                else:
                    wait_until(lambda: status()["applier"]["applied_scn"]
                               >= relay.buffer.max_scn, 60, "the relay's windows applied")
                    assert status()["producer"]["error"] is None
