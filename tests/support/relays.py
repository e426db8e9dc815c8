"""In-process relays for tests (make_relay) and reading a relay's /stream like a client
(drain).
"""

from __future__ import annotations

from pathlib import Path

import httpx

from databus.core import event as ev
from databus.core.checkpoint import Checkpoint
from databus.relay.config import parse_config
from databus.relay.relay import Relay
from tests.support.shop import TABLES


def drain(client: httpx.Client, params: dict[str, str], until_scn: int) -> list[ev.Event]:
    """Pull every event up to ``until_scn`` with checkpoints advanced like a client."""
    cp = Checkpoint.flexible()
    events: list[ev.Event] = []
    while cp.window_scn < until_scn:
        r = client.get("/stream", params={**params, "checkPoint": cp.to_json(), "timeout": "1"})
        assert r.status_code == 200, r.text
        batch = list(ev.iter_events(r.content))
        assert batch, "relay returned nothing although windows are pending"
        in_window = cp.window_offset if cp.in_window else 0
        for e in batch:
            events.append(e)
            if e.is_eop:
                cp = cp.window_done(e.scn)
                in_window = 0
            else:
                in_window += 1
                cp = cp.within(e.scn, in_window)
    return events


def make_relay(db: Path, tmp: Path, *, tables: list[str] | None = None,
               snapshot_mode: str = "no_data", state: str = "state",
               http: dict[str, object] | None = None, **buffer: object) -> Relay:
    """A relay (not started) on the SQLite ``db`` (the shop's tables unless ``tables``),
    on a free port, its state in ``tmp/state``; stream-only unless ``snapshot_mode``
    says otherwise (the tests using it check the exact delivery of each committed
    transaction). ``buffer``: fields of the buffer section (4 MiB in memory by default);
    ``http``: more fields of the http section (tokens, TLS, limits)."""
    cfg = parse_config({
        "source": {"url": f"sqlite:///{db}", "tables": tables or TABLES, "poll_interval": 0.01,
                   "snapshot_mode": snapshot_mode},
        "buffer": {"capacity_bytes": 4 * 1024 * 1024, "flush_interval": 0.2, **buffer},
        "http": {"port": 0, **(http or {})},
        "state_dir": str(tmp / state),
        "stream": {"default_timeout": 0.5},
    })
    return Relay(cfg)
