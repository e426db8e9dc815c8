"""The relay's HTTP API against a real relay capturing a real SQLite file."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from databus.buffer import select
from databus.core import event as ev
from databus.core.checkpoint import Checkpoint
from databus.core.filters import ServerFilter
from databus.relay.relay import Relay
from tests.support.relays import drain, make_relay
from tests.support.shop import Writer
from tests.support.wait import wait_until


def _write(db: Path, n: int, seed: int = 1) -> Writer:
    w = Writer(db, seed=seed)
    for _ in range(n):
        w.transaction()
    w.close()
    return w


def _wait_scn(relay: Relay, predicate: float = 10.0) -> int:
    """Wait until the relay has captured everything committed so far."""
    seen = [-2]

    def settled() -> int:  # the same newest window twice in a row
        cur = relay.buffer.max_scn
        same = cur == seen[0] and cur > 0
        seen[0] = cur
        return cur if same else 0

    return wait_until(settled, predicate, "the relay to settle", interval=0.3)


def test_sources_register_and_stream(relay: Relay, shop_db: Path) -> None:
    w = _write(shop_db, 50)
    top = _wait_scn(relay)
    with httpx.Client(base_url=relay.url, timeout=10) as c:
        sources = c.get("/sources").json()
        assert sorted(s["name"] for s in sources) == ["main.customers", "main.items", "main.orders"]
        reg = c.get("/register", params={"sources": ",".join(str(s["id"]) for s in sources)})
        assert reg.status_code == 200 and len(reg.json()) == 3
        events = drain(c, {}, top)
    data = [e for e in events if not e.is_control]
    assert len(data) == sum(len(t) for t in w.committed)
    scns = [e.scn for e in events if e.is_eop]
    assert scns == sorted(set(scns))


def test_json_output_is_an_envelope_per_line(relay: Relay, shop_db: Path) -> None:
    _write(shop_db, 5)
    _wait_scn(relay)
    with httpx.Client(base_url=relay.url, timeout=10) as c:
        r = c.get("/stream", params={"output": "json", "size": "10000000"})
    lines = [json.loads(x) for x in r.text.splitlines()]
    data = [x for x in lines if "op" in x]
    assert data and lines[-1]["type"] == "eop"
    assert {"before", "after", "source", "op", "ts_ms", "transaction"} <= set(data[0])
    assert data[0]["source"]["db"] == "main"


def test_long_poll_returns_when_data_arrives(relay: Relay, shop_db: Path) -> None:
    with httpx.Client(base_url=relay.url, timeout=10) as c:
        t0 = time.monotonic()
        r = c.get("/stream", params={"timeout": "0.3", "streamFromLatestScn": "true"})
        assert r.status_code == 200 and r.content == b""
        assert 0.25 < time.monotonic() - t0 < 3
        cp = Checkpoint.after(relay.buffer.max_scn).to_json()
        timer = threading.Timer(0.5, lambda: _write(shop_db, 1))
        timer.start()
        t0 = time.monotonic()
        r = c.get("/stream", params={"timeout": "20", "checkPoint": cp})
        timer.join()
        assert r.content and time.monotonic() - t0 < 10


@pytest.mark.parametrize(("params", "status", "code"), [
    ({"checkPoint": "{bad"}, 400, "InvalidCheckpoint"),
    ({"checkPoint": '{"windowScn": "x"}'}, 400, "InvalidCheckpoint"),
    ({"checkPoint": '{"consumption_mode": "BOOTSTRAP_SNAPSHOT"}'}, 400, "InvalidCheckpoint"),
    ({"sources": "999"}, 404, "UnknownSource"),
    ({"sources": "a,b"}, 400, "InvalidRequest"),
    ({"size": "-1"}, 400, "InvalidRequest"),
    ({"size": "1e9"}, 400, "InvalidRequest"),
    ({"timeout": "nan"}, 400, "InvalidRequest"),
    ({"output": "xml"}, 400, "InvalidRequest"),
    ({"filters": "[1]"}, 400, "InvalidFilter"),
    ({"filters": '{"999": {"partitionType": "MOD", "filters": '
                 '[{"numBuckets": 2, "bktRange": {"start": 0, "end": 1}}]}}'}, 404, "UnknownSource"),
    ({"streamFromLatestScn": "maybe"}, 400, "InvalidRequest"),
    ({"newest": "true"}, 400, "InvalidRequest"),  # no uptoScn
    ({"uptoScn": "x"}, 400, "InvalidRequest"),
])
def test_bad_requests_get_typed_4xx(relay: Relay, params: dict[str, str], status: int,
                                    code: str) -> None:
    with httpx.Client(base_url=relay.url, timeout=10) as c:
        r = c.get("/stream", params={"timeout": "0", **params})
        assert r.status_code == status, r.text
        assert r.json()["error"] == code and r.json()["message"]
        assert c.get("/nope").status_code == 404
        assert c.post("/stream").status_code == 405
        assert c.get("/register", params={"sources": "12345"}).status_code == 404


def test_checkpoint_older_than_buffer_is_scn_not_found(shop_db: Path, tmp_path: Path) -> None:
    relay = make_relay(shop_db, tmp_path, capacity_bytes=64 * 1024)
    with relay:
        _write(shop_db, 600)
        _wait_scn(relay)
        assert relay.buffer.prev_scn > 0, "the buffer should have evicted windows"
        with httpx.Client(base_url=relay.url, timeout=10) as c:
            r = c.get("/stream", params={"checkPoint": Checkpoint.after(0).to_json()})
        assert r.status_code == 410
        assert r.json()["error"] == "ScnNotFound"


@pytest.mark.parametrize("kind", ["MOD", "RANGE"])
def test_filtered_consumers_together_get_every_event_once(relay: Relay, shop_db: Path,
                                                          kind: str) -> None:
    _write(shop_db, 200)
    top = _wait_scn(relay)
    with httpx.Client(base_url=relay.url, timeout=10) as c:
        ids = [s["id"] for s in c.get("/sources").json()]

        def ident(e: ev.Event) -> tuple[object, ...]:
            return (e.scn, e.src_id, e.key, e.attributes, e.payload, e.metadata)

        everything = Counter(ident(e) for e in drain(c, {}, top) if not e.is_control)
        parts: list[Counter[tuple[object, ...]]] = []
        n = 4
        for i in range(n):
            if kind == "MOD":
                filt = ServerFilter.mod(ids, n, i, i + 1)
            else:  # int keys below 10_000 and CRC32 hashes of composite keys, in 4 ranges
                bounds = [-(1 << 62), 300, 1 << 20, 1 << 31, 1 << 62]
                filt = ServerFilter.parse(json.dumps({str(s): {"partitionType": "RANGE", "filters": [
                    {"keyRange": {"start": bounds[i], "end": bounds[i + 1]}}]} for s in ids}))
            got = [e for e in drain(c, {"filters": filt.to_json()}, top) if not e.is_control]
            for e in got:
                assert filt.matches(e.src_id, e.key)
            parts.append(Counter(ident(e) for e in got))
    assert sum(parts, Counter()) == everything
    assert all(parts), "each consumer should get some events"


def test_health_metrics_and_stats(relay: Relay, shop_db: Path) -> None:
    _write(shop_db, 3)
    _wait_scn(relay)
    with httpx.Client(base_url=relay.url, timeout=10) as c:
        assert c.get("/admin").json()["status"] == "ok"
        assert "databus_relay_windows_appended_total" in c.get("/metrics").text
        stats = c.get("/containerStats").json()
        assert stats["buffer"]["max_scn"] == relay.buffer.max_scn
        assert c.get("/containerStats/buffer/max_scn").json() == relay.buffer.max_scn
        assert c.get("/containerStats/nope").status_code == 400


def test_requests_are_counted_per_endpoint_and_status(relay: Relay) -> None:
    with httpx.Client(base_url=relay.url, timeout=10) as c:
        assert c.get("/sources").status_code == 200
        assert c.get("/stream", params={"size": "-1"}).status_code == 400
        assert c.get("/containerStats/nope").status_code == 400
        assert c.get("/nope").status_code == 404  # matched no route: not counted
        text = c.get("/metrics").text
    assert 'databus_relay_requests_total{endpoint="sources",status="200"} 1.0' in text
    assert 'databus_relay_requests_total{endpoint="stream",status="400"} 1.0' in text
    assert 'databus_relay_requests_total{endpoint="containerStats",status="400"} 1.0' in text
    assert 'status="404"' not in text


def test_an_unexpected_error_in_stream_answers_500_and_is_counted(
        relay: Relay, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_a: object, **_k: object) -> None:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(relay.buffer, "read", broken)
    monkeypatch.setattr(relay.buffer, "read_pinned", broken)  # the direct route's read
    with httpx.Client(base_url=relay.url, timeout=10) as c:
        r = c.get("/stream", params={"timeout": "0"})
    assert r.status_code == 500
    assert r.json() == {"error": "InternalError", "message": "RuntimeError: disk on fire"}
    monkeypatch.undo()
    # the server closes that connection (it logs the traceback) and goes on serving
    with httpx.Client(base_url=relay.url, timeout=10) as c:
        assert c.get("/stream", params={"timeout": "0"}).status_code == 200
        assert c.head("/stream").status_code == 200
        assert c.post("/stream").status_code == 405
        text = c.get("/metrics").text
    assert 'databus_relay_requests_total{endpoint="stream",status="500"} 1.0' in text
    assert 'databus_relay_requests_total{endpoint="stream",status="200"} 2.0' in text
    assert 'databus_relay_requests_total{endpoint="stream",status="405"} 1.0' in text


def test_json_encoding_does_not_hold_up_other_requests(shop_db: Path, tmp_path: Path) -> None:
    """/stream?output=json encodes in the thread pool: /admin answers meanwhile. On the
    event loop, one /admin request would wait about as long as the whole encoding."""
    relay = make_relay(shop_db, tmp_path, capacity_bytes=32 * 1024 * 1024)
    with relay:
        _write(shop_db, 2000)
        _wait_scn(relay)
        latencies: list[float] = []
        done = threading.Event()

        def ask_admin() -> None:
            with httpx.Client(base_url=relay.url, timeout=30) as c:
                while not done.is_set():
                    t0 = time.monotonic()
                    assert c.get("/admin").status_code == 200
                    latencies.append(time.monotonic() - t0)

        asker = threading.Thread(target=ask_admin)
        asker.start()
        try:
            with httpx.Client(base_url=relay.url, timeout=60) as c:
                t0 = time.monotonic()
                r = c.get("/stream", params={"output": "json", "timeout": "0",
                                             "size": str(32 * 1024 * 1024)})
                took = time.monotonic() - t0
        finally:
            done.set()
            asker.join(30)
        assert r.status_code == 200 and r.content.count(b"\n") > 10_000
        assert took > 0.2, f"the encoding ({took:.2f} s) is too short to tell"
        assert len(latencies) > 3 and max(latencies) < took / 2, (max(latencies), took)


def test_a_newest_read_keeps_each_keys_last_event_up_to_its_end(relay: Relay,
                                                                  shop_db: Path) -> None:
    """``newest=true&uptoScn=n``: no window past n, each answer reduced as
    ``select.newest`` reduces the same answer read whole, and a key's change past n does
    not hide its change before n."""
    _write(shop_db, 300)
    top = _wait_scn(relay)
    with httpx.Client(base_url=relay.url, timeout=10) as c:
        whole = c.get("/stream", params={"timeout": "0", "size": str(64 << 20)})
        end = max(e.scn for e in ev.iter_events(whole.content) if e.is_eop) // 2
        upto = c.get("/stream", params={"timeout": "0", "size": str(64 << 20),
                                        "uptoScn": str(end)})
        reduced = c.get("/stream", params={"timeout": "0", "size": str(64 << 20),
                                           "uptoScn": str(end), "newest": "true"})
    assert whole.status_code == upto.status_code == reduced.status_code == 200
    assert max(e.scn for e in ev.iter_events(upto.content)) <= end < top
    assert reduced.content == select.newest_python(upto.content)[0]
    assert len(reduced.content) < len(upto.content)  # the shop changes keys again
    kept = {(e.src_id, e.key): e for e in ev.iter_events(reduced.content) if e.src_id >= 0}
    last = {(e.src_id, e.key): e for e in ev.iter_events(upto.content) if e.src_id >= 0}
    assert kept == last
