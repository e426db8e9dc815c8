"""An error's context crosses the wire: the client rebuilds the relay's ``ScnAhead`` with
both positions, not only its message."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from databus.client.relay import RelayConnection
from databus.core.checkpoint import Checkpoint
from databus.core.errors import ScnAheadError, error_body, error_from_code
from tests.support.relays import make_relay
from tests.support.shop import create_shop
from tests.support.wait import wait_until


def test_scn_ahead_reaches_the_client_with_both_positions(tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    create_shop(db)
    with make_relay(db, tmp_path) as relay:
        with sqlite3.connect(db) as con:
            con.execute("INSERT INTO orders (id, customer_id, tx) VALUES (1, 1, 0)")
        wait_until(lambda: relay.buffer.max_scn >= 0, 30, "a window")
        ahead = relay.buffer.max_scn + 1000
        with RelayConnection(relay.url) as conn, pytest.raises(ScnAheadError) as caught:
            conn.stream(Checkpoint.flexible().window_done(ahead), timeout=0)
        assert caught.value.checkpoint_scn == ahead
        assert caught.value.relay_scn == relay.buffer.max_scn


def test_fields_of_the_wrong_type_or_unknown_are_left_out() -> None:
    body = error_body(ScnAheadError("x", checkpoint_scn=5, relay_scn=3))
    assert body == {"error": "ScnAhead", "message": "x",
                    "fields": {"checkpoint_scn": 5, "relay_scn": 3}}
    err = error_from_code("ScnAhead", "x", {"checkpoint_scn": [1], "evil": 1, "relay_scn": 2})
    assert isinstance(err, ScnAheadError) and err.relay_scn == 2
    assert err.checkpoint_scn == -1 and not hasattr(err, "evil")
