"""The client library's ``/stream`` request (``RelayConnection.stream``): the query it
builds is the one httpx would build from the same parameters (the checkpoint in its
compact form), a real relay answers it as it answers the full checkpoint, and the
position headers come back as fields."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from urllib.parse import quote_plus

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from databus.client import RelayConnection
from databus.client.relay import quote_value, stream_query
from databus.core import event as ev
from databus.core.checkpoint import Checkpoint
from databus.relay.relay import Relay
from tests.support.relays import make_relay
from tests.support.shop import create_shop
from tests.support.wait import wait_until


@settings(max_examples=1000)
@given(st.text(max_size=60))
def test_quote_value_is_urllib_quote_plus_and_httpx_params(text: str) -> None:
    assert quote_value(text) == quote_plus(text, safe="")
    if text:
        assert str(httpx.QueryParams({"k": text})) == "k=" + quote_value(text)


@pytest.mark.parametrize("cp", [None, Checkpoint.flexible(), Checkpoint.after(12, 9),
                                Checkpoint.after(12, 9).within(13, 4)])
@pytest.mark.parametrize("extra", [
    {}, {"source_ids": [1, 2]}, {"filter_json": '{"1": {"partitionType": "MOD"}}'},
    {"from_latest": True, "timeout": 0}, {"size": 77, "timeout": 2.5}])
def test_the_query_is_what_httpx_builds_from_the_same_params(
        cp: Checkpoint | None, extra: dict[str, object]) -> None:
    params: dict[str, str] = {"size": str(extra.get("size", 4 * 1024 * 1024)),
                              "output": "binary",
                              "timeout": repr(float(extra.get("timeout", 10.0)))}  # type: ignore[arg-type]
    if extra.get("source_ids"):
        params["sources"] = ",".join(map(str, extra["source_ids"]))  # type: ignore[call-overload]
    if cp is not None and not cp.is_flexible:
        params["checkPoint"] = cp.to_compact_json()
    if extra.get("filter_json"):
        params["filters"] = str(extra["filter_json"])
    if extra.get("from_latest"):
        params["streamFromLatestScn"] = "true"
    assert stream_query(cp, **extra) == str(httpx.QueryParams(params))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def relay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Relay]:
    tmp = tmp_path_factory.mktemp("streamreq")
    db = tmp / "shop.db"
    create_shop(db)
    relay = make_relay(db, tmp)
    with relay:
        with sqlite3.connect(db) as con:
            for i in range(12):
                con.execute("INSERT INTO customers VALUES (?, ?, 0, 0)", (i, f"c{i}"))
                con.commit()
                time.sleep(0.05)  # a window each
        wait_until(lambda: relay.buffer.stats()["windows"] >= 6, 30, "6 windows")
        yield relay


def test_position_fields_follow_the_relay_and_the_compact_checkpoint_reads_the_same(
        relay: Relay) -> None:
    with RelayConnection(relay.url) as conn, httpx.Client(base_url=relay.url) as raw:
        whole = conn.stream(None, size=1 << 20, timeout=0)
        scns = [e.scn for e in ev.iter_events(whole.data) if e.src_id == ev.SRC_EOP]
        assert whole.max_scn == relay.buffer.max_scn and whole.min_scn == relay.buffer.min_scn
        assert whole.last_window_scn == scns[-1] and whole.partial_scn == -1
        assert whole.partial_count == -1 and whole.cluster_hw is None
        for cp in [Checkpoint.after(scns[1], scns[0]),
                   Checkpoint.after(scns[0]).within(scns[1], 0)]:
            full = raw.get("/stream", params={"checkPoint": cp.to_json(), "size": "1048576",
                                              "timeout": "0"})
            ours = conn.stream(cp, size=1048576, timeout=0)
            assert full.status_code == 200 and ours.data == full.content
            assert ours.last_window_scn == int(full.headers["x-databus-last-window-scn"])
