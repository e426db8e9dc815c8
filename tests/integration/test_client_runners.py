"""The tail and replicate runners (what the CLI calls) against a real HTTP server."""

from __future__ import annotations

import io
import json
import sqlite3
from pathlib import Path

from databus.client.config import ClientConfig
from databus.client.runners import replicate, tail
from databus.core.event import Op
from tests.support.memrelay import MemoryRelay, customer, item


def test_tail_prints_envelopes(memrelay: MemoryRelay, tmp_path: Path) -> None:
    memrelay.add_window(10, [customer(10, 1, name="Ada"), item(10, 4, 2)])
    memrelay.add_window(20, [customer(20, 1, op=Op.DELETE)])
    out = io.StringIO()
    ckpt = tmp_path / "tail.ckpt"
    tail(ClientConfig(relay=memrelay.url, checkpoint_path=ckpt, poll_timeout=0.1), out,
         max_windows=2)
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    assert [(x["op"], x["source"]["table"], x["source"]["scn"]) for x in lines] == [
        ("c", "customers", 10), ("c", "items", 10), ("d", "customers", 20)]
    assert lines[0]["after"] == {"id": 1, "name": "Ada", "balance": 1.5}
    assert lines[1]["transaction"] == {"id": "tx10", "total_order": 2,
                                       "data_collection_order": 1}
    assert lines[2]["before"]["id"] == 1 and lines[2]["after"] is None
    assert '"windowScn":20' in ckpt.read_text()


def test_replicate_runner(memrelay: MemoryRelay, tmp_path: Path) -> None:
    memrelay.add_window(10, [customer(10, 1, name="Ada"), item(10, 4, 2)])
    memrelay.add_window(20, [customer(20, 1, name="Bob", op=Op.UPDATE)])
    db = tmp_path / "r.db"
    client = replicate(ClientConfig(relay=memrelay.url, sources=["shop.customers"],
                                    poll_timeout=0.1), f"sqlite:///{db}", max_windows=2)
    assert client.stats.last_scn == 20
    con = sqlite3.connect(db)
    try:
        assert con.execute("SELECT id, name FROM customers").fetchall() == [(1, "Bob")]
        assert con.execute("SELECT name FROM sqlite_master WHERE name='items'").fetchall() == []
    finally:
        con.close()
