"""RelayConnection against a real HTTP server: error bodies become typed errors."""

from __future__ import annotations

import json

import pytest

from databus.client import RelayConnection
from databus.core.checkpoint import Checkpoint
from databus.core.errors import (
    InvalidCheckpointError,
    RelayUnavailableError,
    ScnNotFoundError,
    TerminalError,
    UnknownSourceError,
)
from tests.support.memrelay import CUSTOMERS, MemoryRelay, customer


def _body(code: str, message: str) -> bytes:
    return json.dumps({"error": code, "message": message}).encode()


@pytest.mark.parametrize(("status", "body", "error", "text"), [
    (410, _body("ScnNotFound", "too old"), ScnNotFoundError, "too old"),
    (404, _body("UnknownSource", "no source 9"), UnknownSourceError, "no source 9"),
    (400, _body("InvalidCheckpoint", "bad"), InvalidCheckpointError, "bad"),
    (400, b"plain text", TerminalError, "plain text"),
    (500, _body("InternalError", "x"), RelayUnavailableError, "500"),
    (503, b"<html>busy</html>", RelayUnavailableError, "503"),
])
def test_http_errors_are_typed(memrelay: MemoryRelay, status: int, body: bytes,
                               error: type[Exception], text: str) -> None:
    memrelay.inject.append((status, body))
    with RelayConnection(memrelay.url) as conn, pytest.raises(error, match=text):
        conn.stream(Checkpoint.after(1), [1], timeout=0)


def test_calls(memrelay: MemoryRelay) -> None:
    memrelay.add_window(3, [customer(3, 1)])
    with RelayConnection(memrelay.url) as conn:
        assert conn.sources() == [(1, "shop.customers"), (2, "shop.items")]
        assert conn.register([1]).latest(1).id == CUSTOMERS.id
        resp = conn.stream(None, [1, 2], size=1024, timeout=0)
        assert resp.max_scn == 3 and len(resp.data) > 45
        assert conn.stream(Checkpoint.after(3), timeout=0).data == b""
        q = memrelay.stream_requests[0]
        assert "checkPoint" not in q and q["sources"] == "1,2" and q["output"] == "binary"
