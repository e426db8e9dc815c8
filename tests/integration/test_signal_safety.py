"""``POST /signal`` is safe without authentication (issue 13, item 3): a snapshot filter
holding a subquery on ``mysql.user`` is refused (it was accepted and its result served
to every consumer), a text/plain or cross-origin post is refused, a valid filter is
re-emitted from its parse tree and works, and deeply nested JSON is a 400."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from databus.relay.config import parse_config
from databus.relay.relay import Relay
from tests.support.mariadb import MariaDB
from tests.support.procs import free_port
from tests.support.wait import wait_until

LEAK = ("id = 1 OR (SELECT authentication_string FROM mysql.user"
        " WHERE user = 'root' LIMIT 1) IS NOT NULL")


@pytest.fixture
def relay(mariadb: MariaDB) -> Iterator[tuple[str, str]]:
    db = f"sig_{uuid.uuid4().hex[:8]}"
    mariadb.execute(f"CREATE DATABASE {db}",
                    f"CREATE TABLE {db}.t (id INT PRIMARY KEY, v VARCHAR(20))",
                    f"INSERT INTO {db}.t SELECT seq, CONCAT('v', seq) FROM {db}.seq_1_to_20")
    port = free_port()
    r = Relay(parse_config({
        "source": {"url": mariadb.url, "tables": [rf"{db}\..*"], "snapshot_mode": "initial",
                   "signal_table": f"{db}.signals"},
        "http": {"port": port}}))
    r.start()
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: len(_reads(base)) == 20, 60, "the initial snapshot of 20 rows")
        yield base, db
    finally:
        r.stop()
        mariadb.execute(f"DROP DATABASE {db}")


def _signal(base: str, data: dict[str, Any], **headers: str) -> httpx.Response:
    body = json.dumps({"type": "execute-snapshot", "data": data})
    return httpx.post(f"{base}/signal", content=body,
                      headers={"Content-Type": "application/json", **headers}, timeout=30)


def _reads(base: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{base}/stream", params={"output": "json", "size": "10000000",
                                            "timeout": "0"}, timeout=30)
    return [x for x in map(json.loads, r.text.splitlines()) if x.get("op") == "r"]


def test_the_attack_as_reported_is_refused(relay: tuple[str, str]) -> None:
    base, db = relay
    data = {"data-collections": [rf"{db}\.t"],
            "additional-conditions": [{"data-collection": f"{db}.t", "filter": LEAK}]}
    # without credentials, text/plain, a foreign Origin: what a web page can send
    r = httpx.post(f"{base}/signal", content=json.dumps({"type": "execute-snapshot",
                                                         "data": data}),
                   headers={"Content-Type": "text/plain", "Origin": "http://evil.example"})
    assert r.status_code == 415
    assert _signal(base, data, Origin="http://evil.example").status_code == 403
    assert _signal(base, data, Host="evil.example").status_code == 403
    r = _signal(base, data)  # well-formed request, the filter itself is refused
    assert r.status_code == 400 and "Subquery" in r.json()["message"]
    httpx.post(f"{base}/signal", json={"type": "execute-snapshot", "data": {
        "data-collections": [rf"{db}\.t"], "additional-conditions": [
            {"data-collection": f"{db}.t", "filter": "id = 20"}]}}, timeout=30)
    # the one accepted signal (id = 20) is the only snapshot after the initial one
    got = wait_until(lambda: len(x := _reads(base)) >= 21 and x, 60, "the id = 20 snapshot")
    assert len(got) == 21 and got[-1]["after"] == {"id": 20, "v": "v20"}


def test_a_valid_filter_is_re_emitted_and_applied(relay: tuple[str, str]) -> None:
    base, db = relay
    data = {"data-collections": [rf"{db}\.t"],
            "additional-conditions": [{"data-collection": f"{db}.t",
                                       "filter": "id <= 5 and v like 'v%'"}]}
    assert _signal(base, data).status_code == 202
    rows = wait_until(lambda: len(got := _reads(base)) >= 25 and got, 60, "the filtered snapshot")
    assert sorted(x["after"]["id"] for x in rows[20:]) == [1, 2, 3, 4, 5]
    bad = _signal(base, {"data-collections": [rf"{db}\.t"], "additional-conditions": [
        {"data-collection": f"{db}.t", "filter": "nope = 1"}]})
    assert bad.status_code == 400 and "not a column" in bad.json()["message"]


def test_deeply_nested_json_is_a_400(relay: tuple[str, str]) -> None:
    base, _ = relay
    for depth in (40, 100_000):
        r = httpx.post(f"{base}/signal", content="[" * depth + "]" * depth,
                       headers={"Content-Type": "application/json"}, timeout=30)
        assert r.status_code == 400 and "nested deeper" in r.json()["message"], r.text
    cp = "[" * 1_000 + "]" * 1_000  # a checkpoint query parameter (6 kB URL-encoded)
    r = httpx.get(f"{base}/stream", params={"checkPoint": cp}, timeout=30)
    assert r.status_code == 400, r.text
    cp = "[" * 3_000 + "]" * 3_000  # 18 kB: over the request line and header limit
    r = httpx.get(f"{base}/stream", params={"checkPoint": cp}, timeout=30)
    assert r.status_code == 431 and r.json()["error"] == "HeadersTooLarge", r.text
    assert httpx.get(f"{base}/admin", timeout=10).status_code == 200
