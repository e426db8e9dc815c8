"""The bootstrap server applies the same tokens as the relay: 401 without one, a
token sees only its tables (403 for another), /admin needs the admin flag, and the
bootstrap client reads with a token given in its config."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import httpx

from databus.auth import add_token
from databus.client import ClientConfig, DatabusClient
from databus.client.consumer import Consumer, DataEvent
from databus.relay.config import parse_config
from databus.relay.relay import Relay
from tests.support.bootstrap import make_bootstrap
from tests.support.shop import TABLES, create_shop
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

        wait_until(lambda: get("/targetSCN", admin).status_code == 200, 60, "the store")
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
        client = DatabusClient(ClientConfig(relay_url=relay.url, bootstrap_url=bs.url,
                                            token_file=token_file), Record())
        worker = threading.Thread(target=client.run, kwargs={"stop": stop}, daemon=True)
        worker.start()
        try:
            wait_until(lambda: len(seen) >= 20, 60, "the orders snapshot")
        finally:
            stop.set()
            worker.join(30)
        assert set(seen) == {"main.orders"}
