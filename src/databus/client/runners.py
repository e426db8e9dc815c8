"""Ready-to-run consumers behind ``databus tail`` and ``databus replicate``.

Both block until ``stop`` is set (e.g. from a signal handler) or a terminal
error is raised; the CLI only parses options and maps errors to exit codes.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TextIO

from databus.client.checkpoints import FileCheckpointStore, MemoryCheckpointStore
from databus.client.client import DatabusClient
from databus.client.config import ClientConfig
from databus.client.sinks import JsonLinesSink, ReplicateSink


def tail(relay_url: str, out: TextIO, *, sources: list[str | int] | None = None,
         checkpoint: Path | None = None, from_start: bool = True, poll_timeout: float = 5.0,
         max_windows: int | None = None, stop: threading.Event | None = None) -> DatabusClient:
    """Print every data event as a JSON envelope line to ``out``.

    Without ``checkpoint`` the position lives in memory: each run starts at
    the relay's oldest window (``from_start``) or at its newest.
    """
    cfg = ClientConfig(relay_url=relay_url, sources=list(sources or []),
                       from_start=from_start, poll_timeout=poll_timeout)
    store = FileCheckpointStore(checkpoint) if checkpoint else MemoryCheckpointStore()
    client = DatabusClient(cfg, JsonLinesSink(out), store)
    client.run(stop=stop, max_windows=max_windows)
    return client


def replicate(relay_url: str, target_url: str, *, sources: list[str] | None = None,
              name: str = "replicate", poll_timeout: float = 5.0, max_retries: int = 100,
              max_windows: int | None = None,
              stop: threading.Event | None = None) -> DatabusClient:
    """Apply the relay's stream to ``target_url`` (see :mod:`databus.client.sinks.replicate`).

    The position is kept in the target's ``databus_checkpoint`` table (row
    ``name``). A target that stays unreachable is retried ``max_retries``
    times per window with backoff up to 30 s (about 50 minutes by default).
    """
    cfg = ClientConfig(relay_url=relay_url, sources=list(sources or []),
                       poll_timeout=poll_timeout, max_retries=max_retries, backoff_max=30.0)
    with ReplicateSink(target_url, sources, name=name) as sink:
        client = DatabusClient(cfg, sink)
        client.run(stop=stop, max_windows=max_windows)
    return client
