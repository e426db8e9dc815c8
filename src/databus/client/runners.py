"""The ready-to-run consumers behind ``databus tail`` and ``databus replicate``.

The CLI only parses options, calls these and maps errors to exit codes; programs
and tests call them the same way. Both block until ``stop`` is set (the CLI sets
it on SIGTERM), ``max_windows`` windows were delivered, or a terminal error is
raised, and return the client (its ``stats`` and ``persisted`` position).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TextIO

from databus.client.checkpoints import FileCheckpointStore, MemoryCheckpointStore
from databus.client.client import DatabusClient
from databus.client.config import ClientConfig, ReplicateConfig
from databus.client.sinks import JsonLinesSink, ReplicateSink

TAIL_DEFAULTS: dict[str, Any] = {"from_start": False, "poll_timeout": 5.0,
                                 "relay_max_retries": 5}
"""``databus tail``'s settings where they differ from :class:`ClientConfig`'s: it starts
at the newest window, and, being interactive, gives up on an unreachable relay after a
few tries."""

REPLICATE_DEFAULTS: dict[str, Any] = {"from_start": True, "poll_timeout": 2.0,
                                      "max_retries": 100, "backoff_max": 30.0,
                                      "linger": 0.02}
"""``databus replicate``'s: from the relay's oldest window; a target that stays
unreachable is retried 100 times per window with backoff up to 30 s (about 35 minutes);
short long polls let a stop request end the run within seconds; while windows stream in,
a request waits 20 ms after an answer of several windows (fewer, larger answers: the
batches it fills wait up to ``batch.linger`` anyway)."""


Watch = Callable[[DatabusClient], None]
"""Told each client a runner makes, before it runs (the commands' ``--metrics-port``
reads its :meth:`~DatabusClient.metrics`)."""


def tail(config: ClientConfig, out: TextIO, *, max_windows: int | None = None,
         stop: threading.Event | None = None, watch: Watch | None = None) -> DatabusClient:
    """Print every data event as a JSON envelope line to ``out``.

    The position is kept in ``config.checkpoint_path``; without one it lives in
    memory: each run starts at the
    relay's oldest window (``config.from_start``) or at its newest. With a
    ``config.bootstrap_url`` a new consumer prints the snapshot first (rows with
    ``op`` ``r``).
    """
    path = config.checkpoint_path
    store = FileCheckpointStore(path) if path is not None else MemoryCheckpointStore()
    client = DatabusClient(config, JsonLinesSink(out), store)
    if watch is not None:
        watch(client)
    client.run(stop=stop, max_windows=max_windows)
    return client


def replicate(config: ClientConfig, target_url: str, *, name: str = "replicate",
              max_windows: int | None = None, stop: threading.Event | None = None,
              watch: Watch | None = None) -> DatabusClient:
    """Apply the relay's stream to same-named tables of ``target_url`` (see
    :mod:`databus.client.sinks.replicate`).

    The position is kept in the target's ``databus_checkpoint`` table (row
    ``name``), committed with each batch of windows (``config.batch`` when ``config``
    is a :class:`ReplicateConfig`, else its defaults). With ``config.bootstrap_url`` a new
    replica starts from the snapshot, and one the relay no longer holds catches up from
    it. ``config.partitions``/``member``: one member of a static client cluster (its
    checkpoint row is ``replicate-modN-I``).
    """
    cfg = _replicate_config(config)
    if cfg.partitions is not None and name == "replicate":
        # each member of a static cluster keeps its own position in the target
        name = f"replicate-{cfg.partitions.replace(':', '').lower()}-{cfg.member}"
    with ReplicateSink(target_url, name=name, batch=cfg.batch) as sink:
        client = DatabusClient(cfg.client_config(), sink, sink.checkpoint_store)
        if watch is not None:
            watch(client)
        client.run(stop=stop, max_windows=max_windows)
    return client


def _replicate_config(config: ClientConfig) -> ReplicateConfig:
    if isinstance(config, ReplicateConfig):
        return config
    return ReplicateConfig.model_validate(config.model_dump(exclude_unset=True))


def replicate_group(config: ClientConfig, target_url: str, group: str, *,
                    partitions: int = 8, member_id: str | None = None,
                    stop: threading.Event | None = None,
                    watch: Callable[[Any], None] | None = None) -> None:
    """One member of a dynamic replicate group (:mod:`databus.client.membership`):
    the group's members share ``partitions`` MOD buckets of ``config.sources`` and apply
    them to ``target_url``, each partition's position in its own checkpoint row
    ``replicate-GROUP-p<p>``, committed with each window."""
    from databus.client.membership import DynamicGroup, Ownership
    from databus.client.sql import make_engine

    name = group.rstrip("/").rsplit("/", 1)[-1]
    cfg = _replicate_config(config)
    engine = make_engine(target_url)
    sinks: dict[int, ReplicateSink] = {}

    def sink_for(owner: Ownership) -> ReplicateSink:
        sinks[owner.partition] = ReplicateSink(
            engine, name=f"replicate-{name}-p{owner.partition}", batch=cfg.batch)
        return sinks[owner.partition]

    try:
        member = DynamicGroup(group, cfg.client_config(), partitions=partitions,
                              consumer_factory=sink_for, store_factory=lambda p: sinks[p],
                              member_id=member_id)
        if watch is not None:  # told the group: its running partitions' clients
            watch(member)
        member.run(stop if stop is not None else threading.Event())
    finally:
        for sink in sinks.values():
            sink.close()
        engine.dispose()
