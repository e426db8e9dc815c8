"""databus.client: consume a relay's change stream.

Quick start::

    from databus.client import ClientConfig, Consumer, DatabusClient, FileCheckpointStore

    class Printer(Consumer):
        def on_data_event(self, event):
            print(event.source, event.op.letter, event.after)

    DatabusClient(ClientConfig(relay_url="http://127.0.0.1:11115", sources=["main.orders"]),
                  Printer(), FileCheckpointStore("orders.ckpt")).run()

Modules: :mod:`~databus.client.consumer` (callbacks, results, DataEvent),
:mod:`~databus.client.client` (pull loop, delivery guarantees),
:mod:`~databus.client.checkpoints` (stores), :mod:`~databus.client.group`
(N threads), :mod:`~databus.client.relay` (HTTP), :mod:`~databus.client.sinks`.

The names are imported on first use (PEP 562), so that importing one module
(e.g. :mod:`databus.client.relay` in a Spark worker) does not load SQLAlchemy
and the sinks.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from databus.client.checkpoints import (
        CheckpointStore,
        FileCheckpointStore,
        MemoryCheckpointStore,
        SqlCheckpointStore,
    )
    from databus.client.client import DatabusClient
    from databus.client.config import ClientConfig
    from databus.client.consumer import Consumer, ConsumerResult, DataBatch, DataEvent
    from databus.client.group import ConsumerGroup
    from databus.client.relay import RelayConnection
    from databus.client.sinks import JsonLinesSink, ReplicateSink
    from databus.client.stats import ClientStats
    from databus.core.errors import CheckpointStoreError, RelayProtocolError, SinkUnavailableError

_WHERE = {
    "CheckpointStore": "databus.client.checkpoints",
    "FileCheckpointStore": "databus.client.checkpoints",
    "MemoryCheckpointStore": "databus.client.checkpoints",
    "SqlCheckpointStore": "databus.client.checkpoints",
    "ClientStats": "databus.client.stats",
    "DatabusClient": "databus.client.client",
    "ClientConfig": "databus.client.config",
    "Consumer": "databus.client.consumer",
    "ConsumerResult": "databus.client.consumer",
    "DataBatch": "databus.client.consumer",
    "DataEvent": "databus.client.consumer",
    "ConsumerGroup": "databus.client.group",
    "RelayConnection": "databus.client.relay",
    "JsonLinesSink": "databus.client.sinks",
    "ReplicateSink": "databus.client.sinks",
    "CheckpointStoreError": "databus.core.errors",
    "RelayProtocolError": "databus.core.errors",
    "SinkUnavailableError": "databus.core.errors",
}

__all__ = [
    "CheckpointStore",
    "CheckpointStoreError",
    "ClientConfig",
    "ClientStats",
    "Consumer",
    "ConsumerGroup",
    "ConsumerResult",
    "DataBatch",
    "DataEvent",
    "DatabusClient",
    "FileCheckpointStore",
    "JsonLinesSink",
    "MemoryCheckpointStore",
    "RelayConnection",
    "RelayProtocolError",
    "ReplicateSink",
    "SinkUnavailableError",
    "SqlCheckpointStore",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'databus.client' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
