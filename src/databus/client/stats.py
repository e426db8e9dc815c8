"""The counters of one client, shared by its pull loop and its bootstrap."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class ClientStats:
    """Counters of one client (read them from any thread; updated by the run thread)."""

    windows: int = 0  # windows dispatched successfully (replays included)
    events: int = 0  # data events dispatched successfully (bootstrap rows included)
    rollbacks: int = 0
    relay_errors: int = 0  # transient relay errors (and store errors while starting)
    checkpoints: int = 0  # checkpoints persisted
    last_scn: int = -1  # SCN of the last window dispatched successfully
    replays: int = 0  # windows (bootstrap batches) replayed after a consumer failure
    state: str = "starting"  # databus.client.metrics.STATES
    last_error: str | None = None  # the last error's code and message
    started_at: float = field(default_factory=time.time)
    checkpoint_at: float | None = None  # wall clock of the last checkpoint persisted
