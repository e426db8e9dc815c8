"""The bootstrap server's HTTP API: phases, filters, and typed 4xx errors.

A real relay on the SQLite source feeds a real bootstrap service; requests are
plain HTTP. After every bad request the server must still answer good ones.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from databus.bootstrap.service import BootstrapService
from databus.client.bootstrap import parse_batch
from databus.core import event as ev
from databus.core.checkpoint import Checkpoint, ConsumptionMode
from databus.core.filters import ServerFilter
from databus.relay.relay import Relay
from tests.support.bootstrap import make_bootstrap, preload
from tests.support.bulk import BulkWriter
from tests.support.wait import wait_until


@pytest.fixture
def served(shop_db: Path, tmp_path: Path, relay: Relay) -> Iterator[tuple[BootstrapService, int]]:
    preload(shop_db, 400)
    bs = make_bootstrap(shop_db, tmp_path, relay)
    bs.start()
    wait_until(lambda: httpx.get(f"{bs.url}/admin").json()["log_start_scn"] >= 0, 30, "the initial load",
               interval=0.05)
    w = BulkWriter(shop_db, seed=9, per_tx=20)
    w.run_until(1500)
    w.close()
    try:
        wait_until(lambda: httpx.get(f"{bs.url}/admin").json()["applied_scn"] >= w.changes, 30,
                   "the bootstrap applier to fold every change",
                   interval=0.05)
        yield bs, w.changes
    finally:
        bs.stop()


def get(bs: BootstrapService, path: str, **params: Any) -> httpx.Response:
    return httpx.get(f"{bs.url}{path}", params=params, timeout=10)


def start_cp(bs: BootstrapService, **params: Any) -> Checkpoint:
    r = get(bs, "/startSCN", **params)
    assert r.status_code == 200, r.text
    return Checkpoint.from_dict(r.json()["checkpoint"])


def drain(bs: BootstrapService, cp: Checkpoint, **params: Any
          ) -> tuple[list[ev.Event], list[ev.Event], Checkpoint, int]:
    """Run a whole bootstrap over HTTP: (snapshot rows, catch-up events, final cp, requests)."""
    snap: list[ev.Event] = []
    catch: list[ev.Event] = []
    n = 0
    while cp.consumption_mode != ConsumptionMode.ONLINE_CONSUMPTION:
        r = get(bs, "/bootstrap", checkPoint=cp.to_json(), **params)
        assert r.status_code == 200, r.text
        batch = parse_batch(r.content, cp)
        for _scn, events in batch.sequences:
            (snap if cp.consumption_mode == ConsumptionMode.BOOTSTRAP_SNAPSHOT
             else catch).extend(events)
        assert batch.checkpoint is not None
        cp = batch.checkpoint
        n += 1
    return snap, catch, cp, n


def test_snapshot_then_catchup_in_batches(served: tuple[BootstrapService, int]) -> None:
    bs, top = served
    cp = start_cp(bs)
    assert cp.consumption_mode == ConsumptionMode.BOOTSTRAP_SNAPSHOT
    start = cp.bootstrap_start_scn
    snap, catch, final, n = drain(bs, cp, batchSize=100)
    assert n > 10
    assert snap and all(e.scn < start and e.op == ev.Op.READ and e.is_snapshot for e in snap)
    keys = [(e.src_id, e.key) for e in snap]
    assert len(keys) == len(set(keys))  # latest image per key, once
    assert all(start <= e.scn <= final.window_scn for e in catch)
    assert final.window_scn == top  # nothing was written after the fixture: target = top


def test_catchup_only_for_a_checkpoint_in_the_log(served: tuple[BootstrapService, int]) -> None:
    bs, top = served
    log_start = get(bs, "/admin").json()["log_start_scn"]
    assert log_start < top - 100
    since = (log_start + top) // 2
    cp = start_cp(bs, checkPoint=Checkpoint.after(since).to_json())
    assert cp.consumption_mode == ConsumptionMode.BOOTSTRAP_CATCHUP
    assert cp.bootstrap_start_scn == since + 1
    snap, catch, final, _ = drain(bs, cp, batchSize=50)
    assert not snap and catch and min(e.scn for e in catch) > since
    assert final == Checkpoint.after(top).model_copy(update={"ts_nsecs": final.ts_nsecs})


def test_mod_filter_splits_the_snapshot(served: tuple[BootstrapService, int]) -> None:
    bs, _ = served
    whole, _, _, _ = drain(bs, start_cp(bs, sources="1"), sources="1")
    parts: list[ev.Event] = []
    for bucket in range(3):
        f = ServerFilter.mod([1], 3, bucket, bucket + 1).to_json()
        got, _, _, _ = drain(bs, start_cp(bs, sources="1"), sources="1", filters=f)
        assert all(isinstance(e.key, int) and abs(e.key) % 3 == bucket for e in got)
        parts += got
    assert sorted(e.key for e in parts) == sorted(e.key for e in whole)  # type: ignore[type-var]


def test_snapshot_id_ranges_cover_the_snapshot_once(served: tuple[BootstrapService, int]) -> None:
    """``idSpan`` and ``snapshotEnd``: three id ranges read apart give every row of the
    whole snapshot exactly once (what a partitioned reader does)."""
    bs, _ = served
    assert "snapshotIdSpan" not in get(bs, "/startSCN", sources="1").json()
    lo, hi = get(bs, "/startSCN", sources="1", idSpan="true").json()["snapshotIdSpan"]
    whole, _, _, _ = drain(bs, start_cp(bs, sources="1"), sources="1", batchSize=77)
    assert hi - lo + 1 >= len(whole) > 300
    width = hi - lo + 1
    cuts = [lo - 1 + width * i // 3 for i in range(4)]
    parts: list[ev.Event] = []
    for after, last in itertools.pairwise(cuts):
        cp = start_cp(bs, sources="1").model_copy(update={"snapshot_offset": after})
        got, _, _, _ = drain(bs, cp, sources="1", batchSize=77, snapshotEnd=last)
        assert got  # every third of the span holds rows
        parts += got
    assert sorted((e.key, e.scn) for e in parts) == sorted((e.key, e.scn) for e in whole)
    cp = start_cp(bs, sources="1").model_copy(update={"snapshot_offset": hi})
    assert not drain(bs, cp, sources="1", snapshotEnd=hi)[0]  # an empty range


BAD = [
    ("/startSCN", {"checkPoint": "{not json"}, 400, "InvalidCheckpoint"),
    ("/startSCN", {"checkPoint": json.dumps({"windowScn": "x"})}, 400, "InvalidCheckpoint"),
    ("/startSCN", {"sources": "99"}, 404, "UnknownSource"),
    ("/startSCN", {"sources": "a,b"}, 400, "InvalidRequest"),
    ("/startSCN", {"checkPoint": Checkpoint.after(10**12).to_json()}, 409, "BootstrapTooOld"),
    ("/bootstrap", {}, 400, "InvalidCheckpoint"),
    ("/bootstrap", {"checkPoint": Checkpoint.after(5).to_json()}, 400, "InvalidCheckpoint"),
    ("/bootstrap", {"checkPoint": Checkpoint(
        consumption_mode=ConsumptionMode.BOOTSTRAP_CATCHUP, bootstrap_start_scn=3,
        bootstrap_target_scn=50).to_json()}, 410, "BootstrapTooYoung"),
    ("/bootstrap", {"checkPoint": Checkpoint(
        consumption_mode=ConsumptionMode.BOOTSTRAP_CATCHUP, bootstrap_start_scn=1000,
        bootstrap_target_scn=10**12).to_json()}, 409, "BootstrapTooOld"),
    ("/bootstrap", {"checkPoint": Checkpoint(
        consumption_mode=ConsumptionMode.BOOTSTRAP_SNAPSHOT, bootstrap_start_scn=1000,
        snapshot_source="main.nope").to_json()}, 404, "UnknownSource"),
    ("/bootstrap", {"checkPoint": Checkpoint(
        consumption_mode=ConsumptionMode.BOOTSTRAP_SNAPSHOT, bootstrap_start_scn=1000,
        snapshot_source="main.customers").to_json(), "batchSize": "0"}, 400, "InvalidRequest"),
    ("/bootstrap", {"checkPoint": Checkpoint(
        consumption_mode=ConsumptionMode.BOOTSTRAP_SNAPSHOT, bootstrap_start_scn=1000,
        snapshot_source="main.customers").to_json(), "filters": "{\"1\": 5}"}, 400,
     "InvalidFilter"),
    ("/bootstrap", {"checkPoint": Checkpoint(
        consumption_mode=ConsumptionMode.BOOTSTRAP_SNAPSHOT, bootstrap_start_scn=1000,
        snapshot_source="main.customers").to_json(), "snapshotEnd": "x"}, 400, "InvalidRequest"),
    ("/bootstrap", {"checkPoint": Checkpoint(
        consumption_mode=ConsumptionMode.BOOTSTRAP_SNAPSHOT, bootstrap_start_scn=1000,
        snapshot_source="main.customers").to_json(), "snapshotEnd": "5",
        "filters": ServerFilter.mod([1], 3, 0, 1).to_json()}, 400, "InvalidRequest"),
    ("/startSCN", {"idSpan": "maybe"}, 400, "InvalidRequest"),
    ("/nothing", {}, 404, "NotFound"),
]


def test_bad_requests_get_typed_4xx_and_the_server_keeps_serving(
        served: tuple[BootstrapService, int]) -> None:
    bs, _ = served
    for path, params, status, code in BAD:
        r = get(bs, path, **params)
        assert r.status_code == status, (path, params, r.text)
        assert r.json()["error"] == code, (path, params, r.text)
        # and a good request still works right after
        assert get(bs, "/targetSCN").status_code == 200
    assert httpx.post(f"{bs.url}/bootstrap").status_code == 405
    snap, _, _, _ = drain(bs, start_cp(bs), batchSize=1000)
    assert snap


def test_a_store_without_the_relay_yet_answers_too_old(tmp_path: Path) -> None:
    """Before the producer reached the relay nothing is served (a snapshot over no
    sources would skip every row): 409 BootstrapTooOld, and the server stays up."""
    from databus.bootstrap.config import parse_config
    from tests.support.procs import free_port

    bs = BootstrapService(parse_config({
        "relay": f"http://127.0.0.1:{free_port()}",  # nobody listens there
        "store": {"url": f"sqlite:///{tmp_path / 'bs.db'}"}, "http": {"port": 0}}))
    with bs:
        for path in ("/startSCN", "/sources", "/register", "/targetSCN"):
            r = get(bs, path)
            assert r.status_code == 409 and r.json()["error"] == "BootstrapTooOld", r.text
        # a source listed without its schemas (a store an older producer wrote between
        # its two writes) is "not yet" too, not an unknown source a client gives up on
        bs.store.put("sources", json.dumps([{"id": 1, "name": "shop.orders"}]))
        r = get(bs, "/register")
        assert r.status_code == 409 and r.json()["error"] == "BootstrapTooOld", r.text
        assert "no schemas of source ids [1]" in r.json()["message"], r.text
        wait_until(lambda: get(bs, "/admin").json()["producer"]["error"], 10,
                   "the producer to report its error",
                   interval=0.05)
        assert "unreachable" in get(bs, "/admin").json()["producer"]["error"]
