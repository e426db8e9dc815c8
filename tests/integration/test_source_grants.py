"""A token not allowed a table is told so (403 ``Forbidden``), never that the relay does
not serve it: on the relay's ``/sources?names=`` and in the client library."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from databus.auth import add_token
from databus.client import ClientConfig, DatabusClient
from databus.client.consumer import Consumer
from databus.core.errors import ForbiddenError, UnknownSourceError
from databus.relay.config import parse_config
from databus.relay.relay import Relay
from tests.support.shop import TABLES, create_shop


def test_a_table_outside_the_grant_is_forbidden_not_unknown(tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    create_shop(db)
    tokens = tmp_path / "tokens.jsonl"
    orders = add_token(tokens, "orders", [r"main\.orders"])
    wide = add_token(tokens, "wide", [r"main\..*"])
    token_file = tmp_path / "orders.token"
    token_file.write_text(orders)
    relay = Relay(parse_config({
        "source": {"url": f"sqlite:///{db}", "tables": TABLES, "poll_interval": 0.01},
        "http": {"port": 0, "token_file": str(tokens)}}))
    with relay:
        def get(names: str) -> httpx.Response:
            return httpx.get(f"{relay.url}/sources", params={"names": names}, timeout=30,
                             headers={"Authorization": f"Bearer {orders}"})

        assert get("main.orders").json() == [
            {"id": next(s.id for s in relay.source.sources() if s.name == "main.orders"),
             "name": "main.orders"}]
        for names in ("main.customers", "main.orders,main.customers",
                      "main.nosuch"):  # outside the grant: 403 whether served or not
            r = get(names)
            assert r.status_code == 403 and r.json()["error"] == "Forbidden", r.text
        # granted by the token's regex, not served by the relay: 404
        r = httpx.get(f"{relay.url}/sources", params={"names": "main.nosuch"}, timeout=30,
                      headers={"Authorization": f"Bearer {wide}"})
        assert r.status_code == 404 and r.json()["error"] == "UnknownSource", r.text

        def run(sources: list[str | int]) -> None:
            cfg = ClientConfig(relay={"url": relay.url, "token_file": token_file},
                               sources=sources, relay_max_retries=0)
            DatabusClient(cfg, Consumer()).run(max_windows=1)

        with pytest.raises(ForbiddenError, match=r"may not read main\.customers"):
            run(["main.customers"])
        customers = next(s.id for s in relay.source.sources() if s.name == "main.customers")
        with pytest.raises(ForbiddenError, match=r"may not read main\.customers"):
            run([customers])
        with pytest.raises(UnknownSourceError):
            run([10**9])
