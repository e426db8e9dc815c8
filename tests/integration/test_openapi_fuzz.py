"""Hostile clients, generated: schemathesis reads each server's ``/openapi.json`` and
sends at least 1,000 generated requests per server (a relay and a bootstrap server,
real uvicorn, tokens on). No answer may be a 5xx, and none may hang (every request
has a deadline well under the servers' limits)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings

from databus.auth import add_token
from databus.relay.config import parse_config
from databus.relay.relay import Relay
from tests.support.bootstrap import make_bootstrap
from tests.support.shop import TABLES, create_shop
from tests.support.wait import wait_until

PER_SERVER = 1000


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Relay, str, str]]:
    tmp = tmp_path_factory.mktemp("fuzz")
    db = tmp / "shop.db"
    create_shop(db)
    with sqlite3.connect(db) as con:
        for i in range(50):
            con.execute("INSERT INTO customers VALUES (?, ?, 1.5, 0)", (i, f"c{i}"))
    tokens = tmp / "tokens.jsonl"
    admin = add_token(tokens, "fuzz", [".*"], admin=True)
    producer_token = tmp / "producer.token"
    producer_token.write_text(add_token(tokens, "producer", [".*"]) + "\n")
    relay = Relay(parse_config({
        "source": {"url": f"sqlite:///{db}", "tables": TABLES, "poll_interval": 0.01},
        "http": {"port": 0, "token_file": str(tokens)},
        "stream": {"default_timeout": 0.2, "max_timeout": 0.3}}))
    with relay, make_bootstrap(db, tmp, relay, token_file=tokens,
                               relay_token_file=producer_token) as bootstrap:
        wait_until(lambda: httpx.get(f"{bootstrap.url}/targetSCN", timeout=5, headers={
            "Authorization": f"Bearer {admin}"}).status_code == 200, 60,
            "the bootstrap server to serve")
        yield relay, bootstrap.url, admin


def _fuzz(base_url: str, token: str) -> tuple[int, dict[int, int]]:
    """Sends generated requests to every operation; returns how many and their statuses."""
    document = httpx.get(f"{base_url}/openapi.json", timeout=10).json()
    schema = schemathesis.openapi.from_dict(document)
    operations = [op.ok() for op in schema.get_all_operations()]
    per_op = PER_SERVER // len(operations) + 1
    sent = 0
    statuses: dict[int, int] = {}
    with httpx.Client(base_url=base_url, timeout=10) as client:
        # operations with few distinct inputs end early: go round until enough were sent
        rounds = [op for _ in range(20) for op in operations]
        for op in rounds:
            if sent >= PER_SERVER:
                break

            @settings(max_examples=per_op, deadline=None, database=None,
                      phases=[Phase.generate], suppress_health_check=list(HealthCheck))
            @given(case=op.as_strategy())
            def one(case: schemathesis.Case) -> None:
                nonlocal sent
                kwargs = case.as_transport_kwargs(base_url=base_url)
                headers = {k: v for k, v in (kwargs.get("headers") or {}).items()
                           if k.lower() != "authorization"}
                if sent % 5:  # most with the token, the rest without
                    headers["Authorization"] = f"Bearer {token}"
                try:
                    r = client.request(kwargs["method"], kwargs["url"],
                                       params=kwargs.get("params"), headers=headers,
                                       content=_content(kwargs))
                except httpx.LocalProtocolError:
                    return  # not sendable (an illegal header): never reaches the server
                sent += 1
                statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
                # /admin's 503 is its documented "degraded" answer, /health/ready's its
                # "not ready" (docs/operations.md): not failures
                degraded = r.status_code == 503 and case.path in ("/admin", "/health/ready")
                assert r.status_code < 500 or degraded, (
                    f"{case.method} {case.formatted_path} {kwargs.get('params')}:"
                    f" {r.status_code} {r.text[:300]}")

            one()
    return sent, statuses


def _content(kwargs: dict[str, object]) -> bytes | None:
    if kwargs.get("json") is not None:
        import json
        return json.dumps(kwargs["json"]).encode()
    data = kwargs.get("data") or kwargs.get("content")
    if isinstance(data, str):
        return data.encode()
    return data if isinstance(data, bytes) else None


@pytest.mark.slow
def test_the_relay_survives_generated_requests(servers: tuple[Relay, str, str]) -> None:
    relay, _, token = servers
    sent, statuses = _fuzz(relay.url, token)
    print(f"relay: {sent} generated requests, statuses {sorted(statuses.items())}")
    assert sent >= PER_SERVER
    assert httpx.get(f"{relay.url}/health", timeout=5).status_code == 200


@pytest.mark.slow
def test_the_bootstrap_server_survives_generated_requests(
        servers: tuple[Relay, str, str]) -> None:
    _, url, token = servers
    sent, statuses = _fuzz(url, token)
    print(f"bootstrap: {sent} generated requests, statuses {sorted(statuses.items())}")
    assert sent >= PER_SERVER
    assert httpx.get(f"{url}/health", timeout=5).status_code == 200
