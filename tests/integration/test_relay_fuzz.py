"""1,000+ generated /stream requests, valid and hostile: never a 5xx, relay keeps serving."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from databus.relay.relay import Relay
from tests.support.relays import make_relay
from tests.support.shop import Writer, create_shop

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(1 << 70), 1 << 70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=10), inner, max_size=4)),
    max_leaves=12,
)
cp_fields = st.sampled_from(["windowScn", "windowOffset", "prevScn", "consumption_mode",
                             "bootstrap_start_scn", "snapshot_source", "tsNsecs", "x"])
checkpoints = st.one_of(
    st.text(max_size=60),
    st.dictionaries(cp_fields, json_values, max_size=5).map(json.dumps),
    st.builds(lambda s, o: json.dumps({"windowScn": s, "windowOffset": o}),
              st.integers(-3, 1 << 64), st.integers(-3, 1 << 64)),
)
filter_items = st.one_of(
    json_values,
    st.builds(lambda n, a, b: {"numBuckets": n, "bktRange": {"start": a, "end": b}},
              st.integers(-2, 10), st.integers(-2, 10), st.integers(-2, 12)),
    st.builds(lambda a, b: {"keyRange": {"start": a, "end": b}},
              st.integers(-(1 << 64), 1 << 64), st.integers(-(1 << 64), 1 << 64)),
)
filters = st.one_of(
    st.text(max_size=40),
    st.dictionaries(st.sampled_from(["1", "2", "3", "99", "x", "-1"]),
                    st.fixed_dictionaries({"partitionType": st.sampled_from(["MOD", "RANGE", 1]),
                                           "filters": st.lists(filter_items, max_size=3)}),
                    max_size=3).map(json.dumps),
)
params = st.fixed_dictionaries({}, optional={
    "sources": st.one_of(st.text(max_size=15), st.sampled_from(["1", "1,2,3", "2,99", ",", ""])),
    "checkPoint": checkpoints,
    "size": st.one_of(st.text(max_size=8), st.integers(-5, 1 << 40).map(str)),
    "output": st.sampled_from(["binary", "json", "xml", ""]),
    "filters": filters,
    "timeout": st.sampled_from(["0", "0.01", "-1", "nan", "inf", "abc"]),
    "streamFromLatestScn": st.sampled_from(["true", "false", "yes"]),
})


def test_generated_requests_never_5xx(tmp_path_factory: Any) -> None:
    tmp: Path = tmp_path_factory.mktemp("fuzz")
    db = tmp / "shop.db"
    create_shop(db)
    relay: Relay = make_relay(db, tmp)
    relay.start()
    w = Writer(db, seed=3)  # after the relay installed capture
    for _ in range(30):
        w.transaction()
    w.close()
    assert relay.buffer.wait_for(-1, 10)
    seen: dict[int, int] = {}
    try:
        with httpx.Client(base_url=relay.url, timeout=30) as client:

            @settings(max_examples=1000, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck))
            @given(p=params)
            def check(p: dict[str, str]) -> None:
                r = client.get("/stream", params={"timeout": "0", **p})
                seen[r.status_code] = seen.get(r.status_code, 0) + 1
                assert r.status_code < 500, (p, r.text)
                if r.status_code >= 400:
                    body = r.json()
                    assert body["error"] and body["message"]

            check()
            assert client.get("/admin").json()["status"] == "ok"
            ok = client.get("/stream", params={"timeout": "0", "size": "60000000"})
            assert ok.status_code == 200 and ok.content
    finally:
        relay.stop()
    assert sum(seen.values()) >= 1000
    assert seen.get(200, 0) > 0 and sum(v for k, v in seen.items() if k >= 400) > 0
