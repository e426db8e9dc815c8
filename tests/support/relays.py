"""In-process relays for tests (make_relay), reading a relay's /stream like a client
(drain), and what a relay has made durable (``persisted_scn``, ``wait_persisted``).
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from databus.core import event as ev
from databus.core.checkpoint import Checkpoint
from databus.relay.config import parse_config
from databus.relay.relay import Relay
from tests.support.shop import TABLES
from tests.support.wait import wait_until


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


def persisted_scn(state_dir: Path, name: str = "relay") -> int:
    """The newest SCN a relay's state file records, -1 before its first flush. The relay
    flushes its buffer file before it writes the state (every ``flush_interval``), so
    what this says is held survives a ``kill -9``."""
    try:
        return int(json.loads((state_dir / f"{name}.state.json").read_text())["max_scn"])
    except FileNotFoundError:
        return -1


def wait_persisted(state_dir: Path, scn: int, timeout: float = 30.0,
                   name: str = "relay") -> None:
    """Until the relay named ``name`` (state in ``state_dir``; beside its buffer file by
    default) has flushed everything up to ``scn``: instead of sleeping a flush interval."""
    wait_until(lambda: persisted_scn(state_dir, name) >= scn, timeout,
               f"the relay's state in {state_dir} to record scn {scn}", interval=0.05)
