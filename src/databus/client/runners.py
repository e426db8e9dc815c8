"""The ready-to-run consumers behind ``databus tail`` and ``databus replicate``.

The CLI only parses options, calls these and maps errors to exit codes; programs
and tests call them the same way. Both block until ``stop`` is set (the CLI sets
it on SIGTERM), ``max_windows`` windows were delivered, or a terminal error is
raised, and return the client (its ``stats`` and ``persisted`` position).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from databus.client.checkpoints import FileCheckpointStore, MemoryCheckpointStore
from databus.client.client import DatabusClient
from databus.client.config import ClientConfig
from databus.client.sinks import JsonLinesSink, ReplicateSink


def tail(relay_url: str, out: TextIO, *, sources: Sequence[str | int] | None = None,
         checkpoint: Path | None = None, from_start: bool = True,
         bootstrap_url: str | None = None, poll_timeout: float = 5.0,
         relay_max_retries: int | None = None, max_windows: int | None = None,
         stop: threading.Event | None = None, partitions: str | None = None,
         member: int | None = None) -> DatabusClient:
    """Print every data event as a JSON envelope line to ``out``.

    Without ``checkpoint`` the position lives in memory: each run starts at the
    relay's oldest window (``from_start``) or at its newest. With ``bootstrap_url``
    a new consumer prints the snapshot first (rows with ``op`` ``r``).
    ``relay_max_retries``: give up on an unreachable relay after that many tries
    (None: never).
    """
    cfg = ClientConfig(relay_url=relay_url, sources=list(sources or []),
                       from_start=from_start, poll_timeout=poll_timeout,
                       relay_max_retries=relay_max_retries, bootstrap_url=bootstrap_url,
                       partitions=partitions, member=member)
    store = FileCheckpointStore(checkpoint) if checkpoint else MemoryCheckpointStore()
    client = DatabusClient(cfg, JsonLinesSink(out), store)
    client.run(stop=stop, max_windows=max_windows)
    return client


def replicate(relay_url: str, target_url: str, *, sources: Sequence[str | int] | None = None,
              name: str = "replicate", bootstrap_url: str | None = None,
              bootstrap_batch_size: int = 10_000, poll_timeout: float = 2.0,
              max_retries: int = 100, max_windows: int | None = None,
              stop: threading.Event | None = None, partitions: str | None = None,
              member: int | None = None) -> DatabusClient:
    """Apply the relay's stream to same-named tables of ``target_url`` (see
    :mod:`databus.client.sinks.replicate`), from the relay's oldest window.

    The position is kept in the target's ``databus_checkpoint`` table (row
    ``name``), committed with each window. With ``bootstrap_url`` a new replica
    starts from the snapshot, and one the relay no longer holds catches up from
    it. A target that stays unreachable is retried ``max_retries`` times per
    window with backoff up to 30 s (about 35 minutes by default). Short long
    polls (``poll_timeout``) let a stop request end the run within seconds.
    ``partitions``/``member``: one member of a static client cluster (its checkpoint
    row is ``replicate-modN-I``).
    """
    cfg = ClientConfig(relay_url=relay_url, sources=list(sources or []), from_start=True,
                       poll_timeout=poll_timeout, max_retries=max_retries, backoff_max=30.0,
                       bootstrap_url=bootstrap_url, bootstrap_batch_size=bootstrap_batch_size,
                       partitions=partitions, member=member)
    if partitions is not None and name == "replicate":
        # each member of a static cluster keeps its own position in the target
        name = f"replicate-{partitions.replace(':', '').lower()}-{member}"
    with ReplicateSink(target_url, name=name) as sink:
        client = DatabusClient(cfg, sink, sink.checkpoint_store)
        client.run(stop=stop, max_windows=max_windows)
    return client


def replicate_group(relay_url: str, target_url: str, group: str, *,
                    sources: Sequence[str | int], partitions: int = 8,
                    member_id: str | None = None, poll_timeout: float = 2.0,
                    max_retries: int = 100, stop: threading.Event | None = None) -> None:
    """One member of a dynamic replicate group (:mod:`databus.client.membership`):
    the group's members share ``partitions`` MOD buckets of ``sources`` and apply
    them to ``target_url``, each partition's position in its own checkpoint row
    ``replicate-GROUP-p<p>``, committed with each window."""
    from databus.client._sql import make_engine
    from databus.client.membership import DynamicGroup, Ownership

    cfg = ClientConfig(relay_url=relay_url, sources=list(sources), from_start=True,
                       poll_timeout=poll_timeout, max_retries=max_retries, backoff_max=30.0)
    name = group.rstrip("/").rsplit("/", 1)[-1]
    engine = make_engine(target_url)
    sinks: dict[int, ReplicateSink] = {}

    def sink_for(owner: Ownership) -> ReplicateSink:
        sinks[owner.partition] = ReplicateSink(engine, name=f"replicate-{name}-p{owner.partition}")
        return sinks[owner.partition]

    try:
        DynamicGroup(group, cfg, partitions=partitions, consumer_factory=sink_for,
                     store_factory=lambda p: sinks[p], member_id=member_id).run(
                         stop if stop is not None else threading.Event())
    finally:
        engine.dispose()
