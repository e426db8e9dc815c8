"""A small but real relay HTTP server holding windows in memory, for client tests.

It implements the ``/sources``, ``/register`` and ``/stream`` contract the client
consumes (whole windows while they fit in ``size``, a prefix of a window that
does not, ``checkPoint`` with ``windowOffset``, sources and server-side filters,
long polls, 410 ``ScnNotFound``), served by uvicorn on a thread. Tests at the
bottom pin that contract so the client tests rest on it.
"""

from __future__ import annotations

import time

import httpx

from databus.core import event as ev
from databus.core.checkpoint import Checkpoint
from databus.core.schema import SchemaRegistry
from tests.support.memrelay import CUSTOMERS, MemoryRelay, customer, item

# -- schemas and events used across the client tests -------------------------------


# -- the server --------------------------------------------------------------------


# -- the contract the client tests rely on -------------------------------------------


def test_memrelay_serves_whole_windows_then_prefixes(memrelay: MemoryRelay) -> None:
    memrelay.add_window(10, [customer(10, 1), item(10, 1, 1)])
    memrelay.add_window(20, [customer(20, i) for i in range(50)])
    with httpx.Client(base_url=memrelay.url) as http:
        assert http.get("/sources").json() == [{"id": 1, "name": "shop.customers"},
                                               {"id": 2, "name": "shop.items"}]
        reg = SchemaRegistry.from_json(http.get("/register", params={"sources": "1,2"}).content)
        assert reg.get(CUSTOMERS.id).name == "shop.customers"
        body = http.get("/stream", params={"size": "2000"}).content
        events = list(ev.iter_events(body))
        assert [e.src_id for e in events] == [1, 2, ev.SRC_EOP]  # window 20 does not fit
        cp = Checkpoint.after(10)
        body = http.get("/stream", params={"size": "2000", "checkPoint": cp.to_json()}).content
        part = list(ev.iter_events(body))
        assert part and all(e.scn == 20 and not e.is_eop for e in part)
        cp = cp.within(20, len(part))
        rest = list(ev.iter_events(http.get(
            "/stream", params={"size": "100000", "checkPoint": cp.to_json()}).content))
        assert len(part) + len(rest) == 51 and rest[-1].is_eop
        memrelay.trim(10)
        r = http.get("/stream", params={"checkPoint": Checkpoint.after(5).to_json()})
        assert r.status_code == 410 and r.json()["error"] == "ScnNotFound"
        t0 = time.monotonic()
        r = http.get("/stream", params={"checkPoint": Checkpoint.after(20).to_json(),
                                        "timeout": "0.3"})
        assert r.content == b"" and time.monotonic() - t0 >= 0.29
