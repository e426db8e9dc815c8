"""The counters of one client, shared by its pull loop and its bootstrap."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ClientStats:
    """Counters of one client (read them from any thread; updated by the run thread)."""

    windows: int = 0  # windows dispatched successfully (replays included)
    events: int = 0  # data events dispatched successfully (bootstrap rows included)
    rollbacks: int = 0
    relay_errors: int = 0  # transient relay errors (and store errors while starting)
    checkpoints: int = 0  # checkpoints persisted
    last_scn: int = -1  # SCN of the last window dispatched successfully
